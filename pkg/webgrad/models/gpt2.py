"""GPT-2: train it with compile_module, decode it with a KV cache on the device, score text.

Two faces of one model, sharing parameter names (those of transformers' GPT2LMHeadModel
without the "transformer." prefix: "wte.weight", "h.0.attn.c_attn.weight", ...):

  GPT2Module + lm_loss   the ordinary training path: a webgrad Module and a loss for
                         wg.compile_module (inputs tokens/targets, [B, T] i32). Attention is
                         written with plain ops (q @ k^T * scale, causal mask, softmax, @ v),
                         which the compiler's attention fusion recognises.
  GPT2                   inference: forward(ids) -> [len, vocab] logits; new_cache() and
                         logits_step(ids, cache) decode with the key/value cache living in
                         persistent device buffers written in place (webgrad/stateful.py);
                         generate / generate_stream sample (sampling.py); surprisal scores
                         text in bits. Every method has an awaitable *_async twin. The
                         programs and the decode loop are decoding.py's (shared with
                         llama.py); this module gives them GPT-2's network. Weights in
                         and out (state dicts, safetensors, the shapes of a GGUF file)
                         are checked and converted by gpt2_weights.py; gpt2_gguf.py maps
                         GGUF names, gpt2_cache.py writes the browser's model cache image.

Layout (transformers' Conv1D): a linear layer's weight is [in, out] and y = x @ W + b; the
LM head is tied to wte (logits = h @ wte^T). GELU is the tanh form ("gelu_new").

The cache: per layer, K and V are state buffers [n_ctx, n_embd] ("kv.{layer}.k"/".v"); a
step program for T new tokens takes ids [T] and pos [1] (i32), writes the T new rows with
ops.write_rows at pos, and attends over all n_ctx rows with the mask key <= pos + query, so
one program serves every position (static shapes). A decode step uploads 8 bytes and reads
back only what is asked: the last position's logits, or (greedy) just the argmax token.
One cache is live per model: new_cache() retires the previous one (its use then raises).
Rows the mask hides are never NaN (they hold earlier finite values or zeros), so hidden
rows contribute exactly 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from math import prod

from .. import init, lora, ops
from ..arrays import HostArray
from ..blocking import run_blocking
from ..module import Module
from ..stateful import assign, state
from . import gpt2_weights as _weights
from .decoding import (Cache, CausalLM, Network, Surprisal, SurprisalTracker, as_f32_array,  # noqa: F401
                       cat_rows as _cat_rows, chunks_for, embed_rows, head_blocks, head_stats,
                       next_token_loss, quant_params, read_f32, row_split, table_parts,
                       write_quant_blocks)

try:  # the byte-level BPE tokenizer (bpe.py) may land after this module
    from .bpe import Tokenizer
except ImportError:  # pragma: no cover
    Tokenizer = None


@dataclass(frozen=True)
class GPT2Config:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_ctx: int = 1024
    vocab_size: int = 50257
    layer_norm_epsilon: float = 1e-5
    eos_token_id: int | None = None

    @classmethod
    def small(cls) -> "GPT2Config":
        """The 124M GPT-2 (gpt2 on the Hugging Face hub)."""
        return cls(12, 12, 768, 1024, 50257, 1e-5, 50256)

    def __post_init__(self):
        for k in ("n_layer", "n_head", "n_embd", "n_ctx", "vocab_size"):
            v = getattr(self, k)
            if type(v) is not int or v < 1:
                raise ValueError(f"GPT2Config: {k} must be a whole number >= 1, got {v!r}")
        eps = self.layer_norm_epsilon
        if type(eps) not in (int, float) or not 0 < eps < 1:
            raise ValueError(f"GPT2Config: layer_norm_epsilon must be a number in (0, 1), "
                             f"got {eps!r}")
        eos = self.eos_token_id
        if eos is not None and (type(eos) is not int or not 0 <= eos < self.vocab_size):
            raise ValueError(f"GPT2Config: eos_token_id must be None or a token id in "
                             f"[0, {self.vocab_size}), got {eos!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPT2Config: n_embd {self.n_embd} is not divisible by n_head {self.n_head}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def eos_ids(self) -> frozenset:
        return frozenset(() if self.eos_token_id is None else (self.eos_token_id,))


# ---------------------------------------------------------------- the Module (parameters)

class _Linear(Module):   # transformers' Conv1D: weight [in, out]
    fan_in_fan_out = True   # the layout, as PEFT names it (webgrad.lora reads it)

    def __init__(self, d_in, d_out, std=0.02):
        super().__init__()
        self.weight = self.param([d_in, d_out], init=init.randn(std))
        self.bias = self.param([d_out], init="zeros")


class _LayerNorm(Module):
    def __init__(self, d):
        super().__init__()
        self.weight = self.param([d], init="ones")
        self.bias = self.param([d], init="zeros")


class _Table(Module):
    def __init__(self, n, d, std):
        super().__init__()
        self.weight = self.param([n, d], init=init.randn(std))


class _Attention(Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_attn = _Linear(cfg.n_embd, 3 * cfg.n_embd)
        # GPT-2 scales the residual projections by 1/sqrt(2 n_layer) at init
        self.c_proj = _Linear(cfg.n_embd, cfg.n_embd, 0.02 / math.sqrt(2 * cfg.n_layer))


class _MLP(Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = _Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = _Linear(4 * cfg.n_embd, cfg.n_embd, 0.02 / math.sqrt(2 * cfg.n_layer))


class _Block(Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = _LayerNorm(cfg.n_embd)
        self.attn = _Attention(cfg)
        self.ln_2 = _LayerNorm(cfg.n_embd)
        self.mlp = _MLP(cfg)


class GPT2Module(Module):
    """GPT-2's parameters, named as transformers' GPT2Model's state_dict.
    wte_chunks > 1 splits the token table into row blocks "wte.{k}.weight" (see wte_split):
    WebGPU binds at most maxStorageBufferBindingSize (128 MiB by default) per tensor, less
    than the 124M model's 154 MB table."""

    def __init__(self, cfg: GPT2Config, wte_chunks: int = 1, quant: dict | None = None):
        super().__init__()
        self.cfg = cfg
        self.hf_prefix = "transformer."   # GPT2LMHeadModel's names (webgrad.lora's files)
        if wte_chunks == 1:
            self.wte = _Table(cfg.vocab_size, cfg.n_embd, 0.02)
        else:
            self.wte = [_Table(b - a, cfg.n_embd, 0.02) for a, b in wte_split(cfg, wte_chunks)]
        self.wpe = _Table(cfg.n_ctx, cfg.n_embd, 0.01)
        self.h = [_Block(cfg) for _ in range(cfg.n_layer)]
        self.ln_f = _LayerNorm(cfg.n_embd)
        # quant: parameter name -> quants.QuantSpec: those weights are held as blocks and read
        # through ops.dequantize (module.py); the forward code is the same
        for name, spec in self.named_specs():
            if quant and name in quant:
                spec.quant = quant[name]


def param_shapes(cfg: GPT2Config, wte_chunks: int = 1) -> dict[str, tuple[int, ...]]:
    return {n: s.shape for n, s in GPT2Module(cfg, wte_chunks).named_specs()}


def wte_split(cfg: GPT2Config, chunks: int) -> list[tuple[int, int]]:
    """[(first row, end row)] of each block of the token table."""
    return row_split(cfg.vocab_size, chunks)


def wte_chunks_for(cfg: GPT2Config, backend, qtype: str | None = None) -> int:
    """How many row blocks the token table needs on `backend` (decoding.chunks_for)."""
    return chunks_for(cfg.vocab_size, cfg.n_embd, backend, qtype)


def embed(m, ids):
    """wte rows of ids, across the table's blocks."""
    return embed_rows(table_parts(m.wte), ids)


def head(m, h):
    """[(logits block [..., rows_k], first row)]: the tied LM head, h @ wte^T, per table block."""
    return head_blocks(table_parts(m.wte), h)


# ---------------------------------------------------------------- the forward, in ops

def _ln(p, x, eps):
    return ops.layer_norm_last(x, eps) * p.weight + p.bias


def _lin(p, x):
    return lora.adapted(p, x, ops.matmul(x, p.weight) + p.bias)


def _heads(x, n_head):
    """[..., T, D] -> [..., H, T, D/H]."""
    *lead, T, D = x.shape
    x = ops.reshape(x, (*lead, T, n_head, D // n_head))
    k = len(lead)
    return ops.transpose(x, tuple(range(k)) + (k + 1, k, k + 2))


def _merge(x):
    """[..., H, T, Dh] -> [..., T, H*Dh]."""
    *lead, H, T, Dh = x.shape
    k = len(lead)
    x = ops.transpose(x, tuple(range(k)) + (k + 1, k, k + 2))
    return ops.reshape(x, (*lead, T, H * Dh))


def _qkv(blk, x, cfg):
    qkv = _lin(blk.attn.c_attn, _ln(blk.ln_1, x, cfg.layer_norm_epsilon))
    D = cfg.n_embd
    return (ops.slice_last_range(qkv, 0, D), ops.slice_last_range(qkv, D, 2 * D),
            ops.slice_last_range(qkv, 2 * D, 3 * D))


def _finish_block(blk, x, att, cfg):
    x = x + _lin(blk.attn.c_proj, att)
    h = ops.gelu(_lin(blk.mlp.c_fc, _ln(blk.ln_2, x, cfg.layer_norm_epsilon)))
    return x + _lin(blk.mlp.c_proj, h)


def hidden(m: GPT2Module, tokens, cfg: GPT2Config):
    """tokens [..., T] i32 -> final hidden states [..., T, D] (after ln_f), full causal attention."""
    T = tokens.shape[-1]
    if T > cfg.n_ctx:
        raise ValueError(f"gpt2: {T} positions exceed n_ctx={cfg.n_ctx}")
    x = embed(m, tokens) + ops.slice(m.wpe.weight, 0, 0, T)
    scale = 1.0 / math.sqrt(cfg.head_dim)
    for blk in m.h:
        q, k, v = (_heads(t, cfg.n_head) for t in _qkv(blk, x, cfg))
        s = ops.matmul(q, ops.swap_axes(k, -1, -2)) * scale
        att = ops.matmul(ops.softmax_last(ops.where_causal(s, -1e30)), v)
        x = _finish_block(blk, x, _merge(att), cfg)
    return _ln(m.ln_f, x, cfg.layer_norm_epsilon)


def logits_of(m, h):
    """The tied LM head: h @ wte^T (one table block; see head() for split tables)."""
    blocks = head(m, h)
    return blocks[0][0] if len(blocks) == 1 else ops.concat([b for b, _ in blocks], -1)


def lm_loss(m: GPT2Module, inputs):
    """Mean next-token cross entropy (nats); inputs tokens, targets [B, T] i32."""
    return next_token_loss(head(m, hidden(m, inputs["tokens"], m.cfg)), inputs["targets"])


def cached_hidden(m: GPT2Module, ids, pos, cfg: GPT2Config):
    """ids [T] i32 at positions pos.. (pos [1] i32): writes their K/V rows into the cache
    state and attends over the whole cache with key <= pos + query. -> [T, D] after ln_f."""
    T, S = ids.shape[0], cfg.n_ctx
    at = ops.minimum(ops.arange(T) + pos, S - 1)   # past the end: clamped, rows dropped
    x = embed(m, ids) + ops.gather_rows(m.wpe.weight, at)
    qpos = ops.reshape(ops.cast(ops.arange(T) + pos, "f32"), (T, 1))
    visible = ops.greater_equal(qpos, ops.reshape(ops.arange(S, dtype="f32"), (1, S)))  # [T, S]
    scale = 1.0 / math.sqrt(cfg.head_dim)
    for li, blk in enumerate(m.h):
        q, k, v = _qkv(blk, x, cfg)
        kv = []
        for name, new in ((f"kv.{li}.k", k), (f"kv.{li}.v", v)):
            full = ops.write_rows(state(name, (S, cfg.n_embd)), new, pos)
            assign(name, full)
            kv.append(_heads(full, cfg.n_head))          # [H, S, Dh]
        q = _heads(q, cfg.n_head)                         # [H, T, Dh]
        s = ops.matmul(q, ops.swap_axes(kv[0], -1, -2)) * scale
        att = ops.matmul(ops.softmax_last(ops.where(visible, s, -1e30)), kv[1])
        x = _finish_block(blk, x, _merge(att), cfg)
    return _ln(m.ln_f, x, cfg.layer_norm_epsilon)


# ---------------------------------------------------------------- inference

class GPT2(CausalLM):
    """GPT-2 inference on any backend; see the module header for the cache."""

    def __init__(self, cfg: GPT2Config, backend="auto", *, wte_chunks: int | None = None,
                 quant: dict | None = None, dtype: str = "f32"):
        """Zero weights on `backend`; wte_chunks (default: what the device's binding limit
        needs) splits the token table into row blocks. quant: {transformers name:
        quants.QuantSpec} of weights held as quantized blocks (from_gguf fills it; write them
        with write_blocks). dtype: "f16" holds the other weights in f16 (CausalLM.set_dtype)."""
        from ..backends import get_backend
        self.set_dtype(dtype)
        self.cfg = cfg
        self.backend = get_backend(backend)
        full = dict(quant or {})
        unknown = sorted(set(full) - set(param_shapes(cfg)))
        if unknown:
            raise ValueError(f"GPT2: quant names {unknown[:5]} are not GPT-2 parameters of {cfg}")
        table = full.get("wte.weight")
        self.wte_chunks = wte_chunks or wte_chunks_for(cfg, self.backend, table and table.qtype)
        self.shapes = param_shapes(cfg, self.wte_chunks)
        self.quant_full = full              # transformers names, whole tensors
        self.quant = quant_params(full, ("wte.weight",), cfg.vocab_size, self.wte_chunks)
        self._ensure_weights()
        self._init_decoding()

    # -- construction
    @classmethod
    def init_random(cls, cfg: GPT2Config, seed: int = 0, backend="auto") -> "GPT2":
        """GPT-2's own init (N(0, 0.02), residual projections scaled, norms 1/0), from `seed`."""
        m = cls(cfg, backend)
        m.write_weights({n: HostArray("f32", init.generate(spec.init, spec.shape, seed=seed, name=n),
                               shape=spec.shape)
                  for n, spec in GPT2Module(cfg).named_specs()})
        return m

    @classmethod
    def from_hf_state_dict(cls, cfg: GPT2Config, state_dict, backend="auto", *,
                           dtype: str = "f32") -> "GPT2":
        """Weights named and laid out as transformers' GPT2LMHeadModel.state_dict() (with or
        without "transformer."; lm_head.weight, tied to wte, and attention mask buffers are
        ignored). Values: numpy arrays, torch tensors, array.array or memoryviews. dtype:
        "f16" holds them rounded to f16."""
        m = cls(cfg, backend, dtype=dtype)
        m.load_state_dict(state_dict)
        return m

    @classmethod
    def from_safetensors(cls, path_or_bytes, cfg: GPT2Config | None = None, backend="auto", *,
                         progress=None, dtype: str = "f32") -> "GPT2":
        """A GPT-2 model.safetensors (transformers' names). Without cfg: the config that
        save_safetensors recorded in the file's metadata, else the shapes give vocab, n_ctx,
        n_embd and n_layer, and n_head = n_embd / 64 (every released GPT-2 size).
        progress(done, total), if given, hears the file's tensor bytes read so far."""
        cfg, sd = _weights.read_safetensors(path_or_bytes, cfg, GPT2Config, param_shapes,
                                            progress)
        return cls.from_hf_state_dict(cfg, sd, backend, dtype=dtype)

    @classmethod
    def from_gguf(cls, path_or_bytes, backend="auto", *, keep_quantized: bool = True,
                  progress=None, allow_nonfinite: bool = False) -> "GPT2":
        """A llama.cpp gpt2 GGUF (gpt2_gguf.py maps its names and metadata; F32/F16/BF16
        weights and those of webgrad.quants.FORMATS, Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K, so
        Q4_K_M and Q5_K_M files too; no output.weight = tied to the token table).

        keep_quantized (the default): matrices of those quant formats stay quantized on
        every backend, transcoded to webgrad.quants' aligned word layout (the same bytes as the file): on
        WebGPU the matmuls and the embedding decode the blocks in registers, so the weights
        take their file size on the GPU (Q4_K: 1/7 of f32) and a decode step reads that
        many bytes; the CPU executors dequantize per run (the spec). The logits equal those
        of the same weights dequantized to f32 (the decoded values are exact, and each
        product is summed as in the f32 model). keep_quantized=False dequantizes at load
        (on WebGPU by a kernel, io/gpu_dequant.py) into f32 parameters: 4 bytes a weight,
        and trainable once copied into a compiled module.
        progress(done, total): tensor bytes written so far. A NaN or inf weight (or block
        scale) is refused (GGUFError) unless allow_nonfinite=True."""
        return run_blocking(cls.from_gguf_async(path_or_bytes, backend,
                                                keep_quantized=keep_quantized, progress=progress,
                                                allow_nonfinite=allow_nonfinite))

    @classmethod
    async def from_gguf_async(cls, path_or_bytes, backend="auto", *, keep_quantized: bool = True,
                              progress=None, allow_nonfinite: bool = False) -> "GPT2":
        from ..io import gguf
        from ..quants import FORMATS, QuantSpec
        from . import gpt2_gguf
        f = gguf.load(path_or_bytes)
        cfg = GPT2Config(**gpt2_gguf.config(f))      # checked against the file's tensors
        _weights.check_gguf_shapes(f, cfg, param_shapes(cfg))
        gguf.check_values(f, allow_nonfinite=allow_nonfinite)
        quant = {}
        if keep_quantized:
            for hf, (t, transposed) in gpt2_gguf.tensors(f).items():
                if hf != "lm_head.weight" and t.type_name in FORMATS and len(t.shape) == 2:
                    quant[hf] = QuantSpec(t.type_name, t.shape, transposed)
        m = cls(cfg, backend, quant=quant)
        await gpt2_gguf.write_async(m, f, progress=progress)   # on WebGPU: dequantized there
        return m

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights as held by the backend (quantized ones as their blocks)."""
        return sum(4 * prod(self.backend.shape_of(n)) for n in self.shapes)

    def write_blocks(self, name: str, raw) -> None:
        """Write GGUF blocks (bytes) of the whole tensor `name` (a transformers name in
        self.quant_full), transcoded to the GPU layout; a split token table row block by
        row block."""
        write_quant_blocks(self, name, raw, wte_split(self.cfg, self.wte_chunks))

    @classmethod
    def from_compiled(cls, compiled, cfg: GPT2Config) -> "GPT2":
        """A GPT2 over the parameters of a compiled GPT2Module (compile_module / compile_forward):
        the same backend store, so trained weights decode without leaving the device."""
        owner = getattr(compiled, "owner", compiled)
        names = set(getattr(owner, "param_names", []))
        want = param_shapes(cfg)
        if names != set(want) or any(tuple(owner.param_shapes[n]) != s for n, s in want.items()):
            raise ValueError("GPT2.from_compiled: the compiled module's parameters are not a "
                             f"GPT2Module of {cfg}")
        m = cls(cfg, owner.backend)
        if m.wte_chunks != 1:
            raise ValueError("GPT2.from_compiled: this device needs the token table split; move "
                             "the weights through the host (from_hf_state_dict(download_params()))")
        return m

    def load_state_dict(self, state_dict) -> None:
        """Checks every tensor before writing any (a refused call changes nothing)."""
        shapes = param_shapes(self.cfg)
        sd = _weights.check_state_dict(self.cfg, shapes, state_dict)
        if self.quant_full:
            raise ValueError(f"GPT2.load_state_dict: this model holds {sorted(self.quant_full)[:3]} "
                             "quantized; f32 weights go into a model built without quant "
                             "(GPT2.from_hf_state_dict, or from_gguf(..., keep_quantized=False))")
        self.write_weights(_weights.to_f32(sd, shapes))

    def write_weights(self, hosts: dict) -> None:
        """Write f32 weights in full layout (name -> HostArray of the declared shape, one
        "wte.weight"), splitting the token table into its blocks; quantized ones take
        write_blocks. Loaders (gpt2_cache.restore, GGUF) write through it."""
        held = sorted(set(hosts) & set(self.quant_full))
        if held:
            raise ValueError(f"GPT2: {held[:3]} are held quantized; write their blocks "
                             "(write_blocks)")
        for n, h in hosts.items():
            if n == "wte.weight" and self.wte_chunks > 1:
                D = self.cfg.n_embd
                for k, (a, b) in enumerate(wte_split(self.cfg, self.wte_chunks)):
                    self.backend.write(f"wte.{k}.weight", HostArray("f32", h[a * D:b * D], shape=(b - a, D)))
            else:
                self.backend.write(n, h)

    async def save_safetensors_async(self, dst=None, metadata: dict | None = None):
        """Write the weights as a GPT-2 model.safetensors (transformers' names, lm_head tied so
        not stored) to `dst` (a path or binary file), or return the file's bytes."""
        return _weights.write_safetensors(self.cfg, await self.state_dict_async(), dst, metadata)

    def save_safetensors(self, dst=None, metadata=None):
        return run_blocking(self.save_safetensors_async(dst, metadata))

    async def state_dict_async(self) -> dict:
        """The weights in transformers' names (without "transformer."), one "wte.weight"."""
        from ..arrays import to_user
        out = {}
        for n in param_shapes(self.cfg):
            if n == "wte.weight" and self.wte_chunks > 1:
                table = HostArray("f32", shape=(self.cfg.vocab_size, self.cfg.n_embd))
                for k in range(self.wte_chunks):   # blocks of rows: one after the other
                    table.extend(await self._read_f32(f"wte.{k}.weight"))
                out[n] = to_user(table)
            else:
                out[n] = to_user(await self._read_f32(n))
        return out

    async def _read_f32(self, n: str) -> HostArray:
        """Parameter n's values, f32 in its declared layout (quantized ones decoded on the host)."""
        return await read_f32(self.backend, n, self.quant.get(n))

    def state_dict(self) -> dict:
        return run_blocking(self.state_dict_async())

    # -- the network, for decoding.CausalLM's programs
    _text_hint = ("encode it first: webgrad.models.bpe.Tokenizer.from_files(encoder_json, "
                  "vocab_bpe).encode(text)")

    @property
    def _head_blocks(self) -> int:
        return self.wte_chunks

    _network = Network(hidden, cached_hidden, head)

    def _module(self) -> GPT2Module:
        return self._held(GPT2Module(self.cfg, self.wte_chunks, self.quant))


__all__ = ["GPT2Config", "GPT2Module", "GPT2", "Cache", "Surprisal", "lm_loss", "hidden",
           "logits_of", "cached_hidden", "param_shapes", "Tokenizer"]
