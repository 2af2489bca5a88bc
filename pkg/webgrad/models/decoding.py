"""Decoding shared by webgrad's causal language models (gpt2.py, llama.py).

Every model here is served the same way: a full forward program, a cached step program that
writes T new key/value rows into persistent device state at a run-time position and attends
over the whole cache (static shapes: one program per T, for every position), and surprisal
programs that reduce the head to three numbers per token on the device. Only the maths of
the network differs, so a model subclasses CausalLM and provides:

  cfg                       with vocab_size, n_ctx (the cache length) and eos_ids
  _module()                 a fresh parameter Module (the programs' factory)
  _network                  a Network of the model module's three functions:
      hidden(m, ids, cfg)            ids [T] i32 -> final hidden states [T, D], causal
      cached_hidden(m, ids, pos, cfg)  the same through the cache (pos [1] i32), writing K/V
      head(m, h)                     [(logits block [T, rows_k], first row)]: the LM head in
                                     vocab blocks (GPT-2 splits a table too large for one
                                     WebGPU binding)
  _head_blocks              how many blocks head returns
  _text_hint                how to turn text into ids (for the error when text is passed)

CausalLM then gives forward, new_cache, logits_step, logits_all_step, generate (greedy
on the device: one i32 read back per token; else sampling.py on the last logits),
generate_stream, surprisal and surprisal_tracker, each with an *_async twin. One cache is
live per model: new_cache() retires the previous one (its use then raises).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable, NamedTuple
from math import prod

from .. import ops
from ..arrays import HostArray
from ..blocking import run_blocking
from ..stateful import compile_program
from . import sampling


class Network(NamedTuple):
    hidden: Callable
    cached_hidden: Callable
    head: Callable


@dataclass
class Cache:
    """A position in the model's device-resident KV cache."""
    model: object
    generation: int
    pos: int = 0

    def __len__(self):
        return self.pos


@dataclass
class Surprisal:
    bits: list      # bits[i] = -log2 p(ids[i] | ids[:i]); bits[0] = 0
    top: list       # top[i] = the model's argmax having seen ids[:i] (top[0] = -1)
    top_p: list     # its probability (top_p[0] = 0)


def head_stats(blocks, targets=None):
    """From the head's blocks, without forming [..., vocab]: log-sum-exp, the max logit and its
    token (first on ties), and the logit of `targets` when given."""
    mx = top = None
    for l, a in blocks:
        v, i = ops.max_last(l), ops.argmax_last(l) + a
        if mx is None:
            mx, top = v, i
        else:
            better = ops.greater(v, mx)
            mx, top = ops.maximum(mx, v), ops.where(better, i, top)
    z = None
    for l, a in blocks:
        e = ops.sum_last(ops.exp(l - ops.unsqueeze(mx, -1)))
        z = e if z is None else z + e
    lse = mx + ops.log(z)
    picked = None
    if targets is not None:
        for l, a in blocks:
            n = l.shape[-1]
            local = targets - a
            inside = ops.greater_equal(local, 0) * ops.less(local, n)
            p = ops.take_along_last(l, ops.unsqueeze(ops.minimum(ops.maximum(local, 0), n - 1), -1))
            p = ops.reshape(p, inside.shape) * inside
            picked = p if picked is None else picked + p
    return lse, mx, top, picked


def cat_rows(blocks) -> HostArray:
    """HostArrays [..., n_k] side by side along the last axis (no numpy needed)."""
    if len(blocks) == 1:
        return blocks[0]
    lead = blocks[0].shape[:-1]
    rows = prod(lead)
    widths = [b.shape[-1] for b in blocks]
    out = HostArray("f32", shape=lead + (sum(widths),))
    for r in range(rows):
        for b, w in zip(blocks, widths):
            out.extend(b[r * w:(r + 1) * w])
    return out


# ---------------------------------------------------------------- tables in row blocks
# WebGPU binds at most maxStorageBufferBindingSize (128 MiB by default) per tensor, less than
# many token tables (GPT-2 124M: 154 MB; Qwen2.5-0.5B: 545 MB), so a model may hold a table
# as row blocks, parameters "<name>.{k}.weight", and gather / project through every block.

def row_split(rows: int, chunks: int) -> list[tuple[int, int]]:
    """[(first row, end row)] of each block of a table of `rows` rows."""
    step = -(-rows // chunks)
    return [(a, min(a + step, rows)) for a in range(0, rows, step)]


def chunks_for(rows: int, cols: int, backend, qtype: str | None = None) -> int:
    """How many row blocks a [rows, cols] table needs on `backend` (1 unless a binding limit
    bites); qtype: the table is held quantized (its blocks are what a binding holds)."""
    from ..quants import n_words
    lim = getattr(getattr(backend, "limits", None), "max_storage_buffer_binding_size", None)
    if not lim:
        return 1

    def nbytes(n):
        return 4 * (n_words(qtype, n * cols) if qtype else n * cols)
    k = 1
    while nbytes(-(-rows // k)) > lim:
        k += 1
    return k


def table_parts(table) -> list:
    """[(weight Tensor, first row)] of a table Module, or of a list of row-block Modules."""
    if not isinstance(table, list):
        return [(table.weight, 0)]
    out, a = [], 0
    for t in table:
        out.append((t.weight, a))
        a += t.weight.shape[0]
    return out


def embed_rows(parts, ids):
    """Rows of ids across a table's blocks (a block adds its rows where ids fall in it)."""
    if len(parts) == 1:
        return ops.embedding(parts[0][0], ids)
    x = None
    for w, a in parts:
        n = w.shape[0]
        local = ids - a
        inside = ops.greater_equal(local, 0) * ops.less(local, n)
        rows = ops.embedding(w, ops.minimum(ops.maximum(local, 0), n - 1)) * ops.unsqueeze(inside, -1)
        x = rows if x is None else x + rows
    return x


def head_blocks(parts, h):
    """[(logits block [..., rows_k], first row)]: h @ W_k^T for each block W_k of the head."""
    return [(ops.matmul(h, ops.swap_axes(w, 0, 1)), a) for w, a in parts]


def next_token_loss(blocks, targets):
    """Mean cross entropy (nats) of the head's blocks [..., T, rows_k] against targets
    [..., T] i32: the training loss of every model here (lm_loss)."""
    logits = blocks[0][0] if len(blocks) == 1 else ops.concat([b for b, _ in blocks], -1)
    logp = ops.log_softmax_last(logits)
    return -ops.mean_all(ops.take_along_last(logp, ops.unsqueeze(targets, -1)))


# ---------------------------------------------------------------- weights held quantized
# A model built from a GGUF file may hold matrices as their quant blocks (quants.QuantSpec on
# the parameter; module.py reads them through ops.dequantize). Loaders name them by the whole
# tensor ({full name: QuantSpec}); a table in row blocks holds one spec per block.

def block_names(name: str, chunks: int) -> list[str]:
    """Parameter names of a table's row blocks: "x.weight" -> ["x.0.weight", ...]."""
    return [f"{name.removesuffix('.weight')}.{k}.weight" for k in range(chunks)]


def quant_params(full: dict, tables, rows: int, chunks: int) -> dict:
    """{parameter name: QuantSpec} of {full tensor name: QuantSpec}: the tables (names in
    `tables`, `rows` rows each) split into `chunks` row blocks of whole block rows."""
    from ..quants import QuantSpec
    out = {}
    for n, q in full.items():
        if n in tables and chunks > 1:
            for pn, (a, b) in zip(block_names(n, chunks), row_split(rows, chunks)):
                out[pn] = QuantSpec(q.qtype, (b - a, q.shape[-1]))
        else:
            out[n] = q
    return out


def write_quant_blocks(model, name: str, raw, split) -> None:
    """Write GGUF blocks (bytes) of the whole tensor `name` (in model.quant_full), transcoded
    to the GPU's word layout (model.quant: the parameters' specs); a table held in row blocks
    block by block, split: their row ranges (row_split)."""
    from ..quants import transcode
    qtype, parts = _quant_parts(model, name, raw, split)
    for n, r in parts:
        words = HostArray("i32", shape=(model.quant[n].words,))
        words.frombytes(transcode(qtype, r))   # little-endian words, as the GPU reads
        model.backend.write(n, words)


async def write_quant_blocks_async(model, name: str, raw, split) -> None:
    """write_quant_blocks, on WebGPU with the blocks sent as they are and transcoded by a
    kernel (io/gpu_dequant.write_blocks_async); elsewhere on the host."""
    if not model.backend.runs_plans:
        return write_quant_blocks(model, name, raw, split)
    from ..io import gpu_dequant
    qtype, parts = _quant_parts(model, name, raw, split)
    for n, r in parts:
        await gpu_dequant.write_blocks_async(model.backend, n, qtype, r)


def _quant_parts(model, name, raw, split):
    from ..quants import FORMATS
    q = model.quant_full.get(name)
    what = f"{type(model).__name__}.write_blocks"
    if q is None:
        raise ValueError(f"{what}: {name!r} is not held quantized")
    raw = memoryview(raw).cast("B")
    fmt = FORMATS[q.qtype]
    row = q.shape[-1] // fmt.block * fmt.nbytes
    if raw.nbytes != row * prod(q.shape[:-1]):
        raise ValueError(f"{what}: {raw.nbytes} bytes are not {q.qtype}{list(q.shape)} "
                         f"({row * prod(q.shape[:-1])} bytes)")
    if name in model.quant:
        return q.qtype, [(name, raw)]
    return q.qtype, [(pn, raw[a * row:b * row]) for pn, (a, b) in
                     zip(block_names(name, len(split)), split)]


async def read_f32(backend, name: str, q=None) -> HostArray:
    """Parameter `name`'s values as f32 in its declared layout; q: its QuantSpec when held
    quantized (decoded on the host)."""
    h = await backend.read(name)
    if q is None:
        return h
    from ..arrays import transpose2d
    from ..quants import dequantize_words
    x = HostArray("f32", dequantize_words(q.qtype, h.tobytes(), q.shape), shape=q.shape)
    return transpose2d(x) if q.transposed else x


def as_f32_array(v):
    """A weight as the loaders take it: torch tensors -> numpy f32 (any dtype/device); a
    safetensors StoredTensor -> its f32 HostArray; anything else as to_host takes it."""
    if type(v).__module__.startswith("torch"):
        return v.detach().to("cpu").float().numpy()
    if hasattr(v, "to_host") and hasattr(v, "dtype"):
        return v.to_host()
    return v


class CausalLM:
    """The inference API over a subclass's network (see the module header)."""

    _head_blocks = 1
    _text_hint = "encode it with the model's tokenizer first"
    dtype = "f32"  # "f16": the weights held rounded to f16 (set_dtype), the maths in f32
    # where the decode programs round to f16 (precision.py): "f32", "mixed" or "f16"; set it
    # before the first forward/generate (programs are built once, on first use)
    precision = "f32"

    def set_dtype(self, dtype: str) -> None:
        """Choose how the (not quantized) weights are held, before _ensure_weights: "f32",
        or "f16" (half the memory; every value written is rounded to f16, read back as f32,
        and the programs compute in f32: Module.half())."""
        if dtype not in ("f32", "f16"):
            raise ValueError(f"{type(self).__name__}: dtype must be 'f32' or 'f16', got {dtype!r}")
        self.dtype = dtype

    def _held(self, module):
        """The programs' parameter Module, with f16 weights where the model holds them."""
        return module.half() if self.dtype == "f16" else module

    def _ensure_weights(self) -> None:
        """Allocate every parameter of self.shapes on the backend: f32, or the i32 words of
        its blocks where self.quant holds it quantized (which must fit its declared shape)."""
        for n, s in self.shapes.items():
            q = self.quant.get(n)
            if q is not None and q.declared_shape != s:
                raise ValueError(f"{type(self).__name__}: {n!r} is {list(s)}; {q.qtype} blocks of "
                                 f"shape {list(q.shape)}{' transposed' if q.transposed else ''} "
                                 "do not fit")
            self.backend.ensure(n, (q.words,) if q else s, "i32" if q else self.dtype)

    def _init_decoding(self) -> None:
        self._programs: dict = {}
        self._generation = 0
        self._live: Cache | None = None

    def _program(self, kind: str, T: int):
        key = (kind, T)
        p = self._programs.get(key)
        if p is None:
            p = self._programs[key] = _build_program(self, kind, T)
        return p

    def _check_ids(self, ids, what, *, empty_ok=False) -> list[int]:
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
        if isinstance(ids, str):
            raise ValueError(f"{what}: ids is text; pass token ids ({self._text_hint})")
        ids = list(ids)
        if not ids and not empty_ok:
            raise ValueError(f"{what}: ids is empty")
        V = self.cfg.vocab_size
        for k, t in enumerate(ids):
            try:
                ids[k] = t = operator.index(t)   # numpy / torch integers too; not floats
            except TypeError:
                raise ValueError(f"{what}: ids[{k}] = {t!r} is not an integer token id") from None
            if isinstance(t, bool) or not 0 <= t < V:
                raise ValueError(f"{what}: ids[{k}] = {t!r} is not a token id in [0, {V})")
        if len(ids) > self.cfg.n_ctx:
            raise ValueError(f"{what}: {len(ids)} ids exceed n_ctx={self.cfg.n_ctx}")
        return ids

    def _names(self, base):
        return [f"{base}.{k}" for k in range(self._head_blocks)]

    def _joined(self, out, base):
        """The vocab blocks of output `base` side by side, as the user's array type."""
        from ..arrays import to_user
        return to_user(cat_rows([out[n] for n in self._names(base)]))

    # -- the API
    async def forward_async(self, ids):
        """[len(ids), vocab] logits (full causal forward, no cache)."""
        ids = self._check_ids(ids, "forward")
        out = await self._program("full", len(ids)).run_raw_async({"ids": ids}, self._names("logits"))
        return self._joined(out, "logits")

    def new_cache(self) -> Cache:
        """An empty cache; the previous cache of this model is retired."""
        self._generation += 1
        self._live = Cache(self, self._generation)
        return self._live

    def _check_cache(self, cache, n, what):
        if not isinstance(cache, Cache) or cache.model is not self:
            raise ValueError(f"{what}: pass a cache from this model's new_cache()")
        if cache.generation != self._generation:
            raise ValueError(f"{what}: this cache was retired by a later new_cache() (one cache "
                             "lives on the device per model)")
        if cache.pos + n > self.cfg.n_ctx:
            raise ValueError(f"{what}: the cache holds {cache.pos} positions; {n} more exceed "
                             f"n_ctx={self.cfg.n_ctx}")

    async def _step(self, ids, cache, fetch, what):
        ids = self._check_ids(ids, what)
        self._check_cache(cache, len(ids), what)
        prog = self._program(step_kind(len(ids), fetch), len(ids))
        out = await prog.run_raw_async({"ids": ids, "pos": [cache.pos]}, fetch)
        cache.pos += len(ids)
        return out

    async def logits_step_async(self, ids, cache):
        """Append ids (one or many) to the cache; [vocab] logits of the last position."""
        return self._joined(await self._step(ids, cache, self._names("last"), "logits_step"), "last")

    async def logits_all_step_async(self, ids, cache):
        """As logits_step, but [len(ids), vocab]: the logits at every appended position."""
        return self._joined(await self._step(ids, cache, self._names("logits"), "logits_step"), "logits")

    async def generate_stream_async(self, ids, max_new_tokens=20, temperature=1.0, top_k=None,
                                    top_p=None, seed=0, stop_at_eos=True):
        """Yield new tokens one by one. temperature 0 is greedy (argmax on the device: each step
        reads back one i32); otherwise the step reads the last logits and sampling.py draws
        from a random.Random(seed) stream: the same seed gives the same tokens everywhere."""
        ids = self._check_ids(ids, "generate")
        sampling.check_params(temperature, top_k, top_p)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"generate: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        n = min(max_new_tokens, self.cfg.n_ctx - len(ids))   # the context is the limit
        cache = self.new_cache()
        rng = sampling.rng(seed)
        greedy = temperature == 0
        eos = self.cfg.eos_ids if stop_at_eos else ()
        feed = ids
        for _ in range(n):
            out = await self._step(feed, cache, ["next"] if greedy else self._names("last"), "generate")
            if greedy:
                tok = int(out["next"][0])
            else:
                last = cat_rows([out[n] for n in self._names("last")])
                tok = sampling.sample(last, temperature=temperature, top_k=top_k,
                                      top_p=top_p, rng=rng)
            yield tok
            if tok in eos:
                return
            feed = [tok]

    async def generate_async(self, ids, max_new_tokens=20, temperature=1.0, top_k=None,
                             top_p=None, seed=0, stop_at_eos=True) -> list[int]:
        """ids followed by up to max_new_tokens sampled tokens: fewer where the context
        (cfg.n_ctx) fills up first, or an end-of-text token comes (stop_at_eos)."""
        out = list(self._check_ids(ids, "generate"))
        async for tok in self.generate_stream_async(ids, max_new_tokens, temperature, top_k,
                                                    top_p, seed, stop_at_eos):
            out.append(tok)
        return out

    async def surprisal_async(self, ids) -> Surprisal:
        """Per-token surprisal in bits, the model's top guess and its probability, computed on
        the device (reads back 3 numbers per token, not the logits)."""
        ids = self._check_ids(ids, "surprisal")
        targets = ids[1:] + [0]
        out = await self._program("surprisal", len(ids)).run_raw_async(
            {"ids": ids, "targets": targets}, ["bits", "top", "top_p"])
        bits = [0.0] + [float(b) for b in out["bits"][:-1]]
        top = [-1] + [int(t) for t in out["top"][:-1]]
        top_p = [0.0] + [float(p) for p in out["top_p"][:-1]]
        return Surprisal(bits, top, top_p)

    def surprisal_tracker(self) -> "SurprisalTracker":
        """Surprisal of a text being edited: update(ids) recomputes from the first change only."""
        return SurprisalTracker(self)

    async def export_onnx_async(self, path=None, *, n_tokens: int, program: str = "full"):
        """The model as an ONNX file with its weights embedded (quantized ones decoded):
        program="full" is the causal forward of n_tokens ids (feed `ids`, outputs
        `logits.<k>`: the vocabulary in blocks, side by side); "step" the cached decode of
        n_tokens ids at feed `pos`, the KV cache an input and its new value an output
        (`<name>:new`). docs/onnx.md."""
        if program not in ("full", "step"):
            raise ValueError(f"export_onnx(): program must be 'full' or 'step', got {program!r}")
        if not 1 <= n_tokens <= self.cfg.n_ctx:
            raise ValueError(f"export_onnx(): n_tokens must be in [1, {self.cfg.n_ctx}], got {n_tokens}")
        return await self._program(program, n_tokens).export_onnx_async(path)

    # -- blocking forms
    def export_onnx(self, path=None, *, n_tokens, program="full"): return run_blocking(self.export_onnx_async(path, n_tokens=n_tokens, program=program))
    def forward(self, ids): return run_blocking(self.forward_async(ids))
    def logits_step(self, ids, cache): return run_blocking(self.logits_step_async(ids, cache))
    def logits_all_step(self, ids, cache): return run_blocking(self.logits_all_step_async(ids, cache))
    def surprisal(self, ids): return run_blocking(self.surprisal_async(ids))

    def generate(self, ids, max_new_tokens=20, temperature=1.0, top_k=None, top_p=None, seed=0,
                 stop_at_eos=True) -> list[int]:
        return list(self._check_ids(ids, "generate")) + list(self.generate_stream(
            ids, max_new_tokens, temperature, top_k, top_p, seed, stop_at_eos))

    def generate_stream(self, ids, max_new_tokens=20, temperature=1.0, top_k=None, top_p=None,
                        seed=0, stop_at_eos=True):
        agen = self.generate_stream_async(ids, max_new_tokens, temperature, top_k, top_p, seed,
                                          stop_at_eos)
        while True:
            try:
                yield run_blocking(agen.__anext__())
            except StopAsyncIteration:
                return


class SurprisalTracker:
    """The reactive page's engine: the surprisal of a token list that changes between calls.

    update(ids) keeps what it computed for the longest common prefix with the previous ids and
    recomputes from there through the KV cache: the cache is cut back to the first changed
    position p (minus one: position p's bits come from the logits at p - 1), and the new
    suffix is appended in one cached step that computes the bits, top token and its
    probability on the device. Suffix lengths are padded to a power of two (rows past the
    text land in cache rows that nothing attends to yet), so few programs get compiled.
    `recomputed` says how many positions the last update ran. Uses the model's cache: a
    new_cache() elsewhere makes the next update start over (correctly, from position 0).
    """

    def __init__(self, model: CausalLM):
        self.model, self.ids, self.cache = model, [], None
        self.result = Surprisal([], [], [])
        self.recomputed = 0

    async def update_async(self, ids) -> Surprisal:
        m = self.model
        ids = m._check_ids(ids, "surprisal update", empty_ok=True)
        live = self.cache is not None and self.cache.generation == m._generation
        p = 0
        if live:
            while p < min(len(ids), len(self.ids)) and ids[p] == self.ids[p]:
                p += 1
        else:
            self.cache, self.result = m.new_cache(), Surprisal([], [], [])
        q = max(p - 1, 0)
        keep = Surprisal(self.result.bits[:q + 1], self.result.top[:q + 1], self.result.top_p[:q + 1])
        if p == len(ids):                    # nothing new: a cut at the end, or no change
            n = len(ids)
            self.result = Surprisal(keep.bits[:n], keep.top[:n], keep.top_p[:n])
            self.cache.pos = min(self.cache.pos, n)
            self.ids, self.recomputed = list(ids), 0
            return self.result
        feed = ids[q:]
        T = 1
        while T < len(feed):
            T *= 2
        T = min(T, m.cfg.n_ctx)
        pad = T - len(feed)
        self.cache.pos = q
        out = await m._program("score", T).run_raw_async(
            {"ids": feed + [0] * pad, "pos": [q], "targets": ids[q + 1:] + [0] * (pad + 1)},
            ["bits", "top", "top_p"])
        self.cache.pos = len(ids)
        n_new = len(feed) - 1                # positions q+1 .. len-1, from rows 0 .. n_new-1
        if p == 0:
            keep = Surprisal([0.0], [-1], [0.0])
        self.result = Surprisal(keep.bits[:q + 1] + [float(b) for b in out["bits"][:n_new]],
                                keep.top[:q + 1] + [int(t) for t in out["top"][:n_new]],
                                keep.top_p[:q + 1] + [float(v) for v in out["top_p"][:n_new]])
        self.ids, self.recomputed = list(ids), len(feed)
        return self.result

    def update(self, ids) -> Surprisal:
        return run_blocking(self.update_async(ids))


def step_kind(T: int, fetch) -> str:
    """The cached step's program for T ids that reads back `fetch`: "step" (the logits of
    every position, the last row's and its argmax), or for T > 1 where only the last
    position is read (generate's prompt, logits_step of a chunk) "step_last", whose head
    multiplies the last row alone: a 512-id prompt of a 128256-token Llama head is a fifth
    of its products. One id takes "step" (the same products either way, one program)."""
    if T == 1 or any(n.startswith("logits.") for n in fetch):
        return "step"
    return "step_last"


def _scores(blocks, targets):
    lse, mx, top, picked = head_stats(blocks, targets)
    return {"bits": (lse - picked) * (1.0 / math.log(2.0)), "top": top, "top_p": ops.exp(mx - lse)}


def _build_program(model: CausalLM, kind: str, T: int):
    net, cfg = model._network, model.cfg

    def named(base, blocks):
        return {f"{base}.{k}": b for k, (b, _) in enumerate(blocks)}

    if kind == "full":
        def fn(m, f):
            return named("logits", net.head(m, net.hidden(m, f["ids"], cfg)))
        inputs = {"ids": ([T], "i32")}
    elif kind == "surprisal":
        def fn(m, f):
            return _scores(net.head(m, net.hidden(m, f["ids"], cfg)), f["targets"])
        inputs = {"ids": ([T], "i32"), "targets": ([T], "i32")}
    elif kind == "score":   # surprisal through the cache (SurprisalTracker)
        def fn(m, f):
            return _scores(net.head(m, net.cached_hidden(m, f["ids"], f["pos"], cfg)), f["targets"])
        inputs = {"ids": ([T], "i32"), "pos": ([1], "i32"), "targets": ([T], "i32")}
    elif kind == "step":
        def fn(m, f):
            blocks = net.head(m, net.cached_hidden(m, f["ids"], f["pos"], cfg))
            lasts = [(ops.reshape(ops.slice(b, 0, T - 1, T), (b.shape[-1],)), a) for b, a in blocks]
            top = head_stats(lasts)[2]
            return {**named("logits", blocks), **named("last", lasts), "next": top}
        inputs = {"ids": ([T], "i32"), "pos": ([1], "i32")}
    elif kind == "step_last":   # the cache written for every id, the head on the last row
        def fn(m, f):
            h = net.cached_hidden(m, f["ids"], f["pos"], cfg)
            blocks = net.head(m, ops.slice(h, 0, T - 1, T))
            lasts = [(ops.reshape(b, (b.shape[-1],)), a) for b, a in blocks]
            return {**named("last", lasts), "next": head_stats(lasts)[2]}
        inputs = {"ids": ([T], "i32"), "pos": ([1], "i32")}
    else:
        raise AssertionError(kind)
    return compile_program(model.backend, model._module, fn, inputs=inputs,
                           precision=model.precision)


__all__ = ["CausalLM", "Network", "Cache", "Surprisal", "SurprisalTracker", "head_stats", "cat_rows",
           "step_kind",
           "as_f32_array", "row_split", "chunks_for", "table_parts", "embed_rows", "head_blocks",
           "block_names", "quant_params", "write_quant_blocks", "write_quant_blocks_async",
           "read_f32"]
