"""Llama-family decoders (Llama 2/3, Mistral, Qwen2, Qwen3): training through the ordinary
path (LlamaModule + lm_loss in compile_module; LoRA adapters by webgrad.lora) and inference
with a KV cache on the device, through the same programs and decode loop as GPT-2
(decoding.py).

    from webgrad.models import llama
    cfg = llama.LlamaConfig.from_hf(json.load(open("config.json")))
    m = llama.Llama.from_hf_state_dict(cfg, state_dict)    # or Llama.from_pretrained(folder)
    m = llama.Llama.from_gguf("model-Q4_K_M.gguf")        # llama.cpp's llama/qwen2/qwen3 files
    m.forward(ids); m.generate(ids, max_new_tokens=20, temperature=0)
    c = wg.compile_module(lambda: llama.LlamaModule(cfg), llama.lm_loss,
                          inputs={"tokens": ([B, T], "i32"), "targets": ([B, T], "i32")})
    tok = llama.Tokenizer.from_pretrained(folder)           # tokenizer.json (tokenizer.py)

Parameters carry transformers' names and layouts ("model.layers.0.self_attn.q_proj.weight",
linear weights [out, in], y = x @ W^T + b; "lm_head.weight" unless tie_word_embeddings),
so a state dict moves in and out unchanged (llama_weights.py loads and saves them;
llama_gguf.py maps llama.cpp's names, and a GGUF file's quantized matrices stay quantized:
quants.QuantSpec on the parameter, read through ops.dequantize, module.py). Where
WebGPU's binding limit needs it, the token table and the head are held in row blocks
(table_chunks; decoding.py), joined again in state_dict().

A block, in ops (what llama_config.py's switches change, in brackets):
  h = x + o_proj(attn(rope(q_proj(n1)) [q_norm], rope(k_proj(n1)) [k_norm], v_proj(n1)))
  out = h + down_proj(silu(gate_proj(n2)) * up_proj(n2))       n1, n2 = RMSNorm of x, h
  RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * weight (over hidden_size, or head_dim for q/k)
  rope: rotate-half over head_dim, angle = position * inv_freq in f32 as transformers
        computes it (inv_freq from rope_theta, llama3-scaled when configured)
  attn: GQA, each of num_key_value_heads K/V heads serves num_attention_heads / n_kv query
        heads; scores scaled by 1/sqrt(head_dim), causal [and a sliding window]. Queries
        are [Hkv, rep, T, Dh] against K/V [Hkv, 1, S, Dh] (broadcast, never copied), a form
        WebGPU's attention pass fuses (a sliding window shorter than n_ctx stays unfused)
  [qkv bias] Qwen2; [all four biases, mlp biases] llama's attention_bias / mlp_bias.

The cache: per layer, K (after rope) and V are state buffers [n_ctx, n_kv * head_dim]
("kv.{layer}.k"/".v"), written in place by ops.write_rows at the run-time position; a step
attends over all n_ctx rows with the mask key <= position (static shapes, as gpt2.py).
"""
from __future__ import annotations

import math
from math import prod

from .. import init, lora, ops
from ..arrays import HostArray
from ..blocking import run_blocking
from ..module import Module
from ..stateful import assign, state
from .decoding import (Cache, CausalLM, Network, Surprisal, SurprisalTracker,  # noqa: F401
                       block_names, chunks_for, embed_rows, head_blocks, next_token_loss,
                       quant_params, read_f32, row_split, table_parts, write_quant_blocks,
                       write_quant_blocks_async)
from .llama_config import LlamaConfig
from .tokenizer import Tokenizer  # noqa: F401  (tokenizer.json / GGUF tokenizers)
from . import llama_weights as _weights


# ---------------------------------------------------------------- the Module (parameters)

class _Linear(Module):   # torch's nn.Linear: weight [out, in]
    fan_in_fan_out = False   # the layout, as PEFT names it (webgrad.lora reads it)

    def __init__(self, d_in, d_out, bias: bool):
        super().__init__()
        self.weight = self.param([d_out, d_in], init=init.randn(0.02))
        if bias:
            self.bias = self.param([d_out], init="zeros")


class _RMSNorm(Module):
    def __init__(self, d):
        super().__init__()
        self.weight = self.param([d], init="ones")


class _Table(Module):
    def __init__(self, n, d):
        super().__init__()
        self.weight = self.param([n, d], init=init.randn(0.02))


class _Attention(Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        D, Dh = c.hidden_size, c.head_dim
        self.q_proj = _Linear(D, c.num_attention_heads * Dh, c.qkv_bias)
        self.k_proj = _Linear(D, c.num_key_value_heads * Dh, c.qkv_bias)
        self.v_proj = _Linear(D, c.num_key_value_heads * Dh, c.qkv_bias)
        self.o_proj = _Linear(c.num_attention_heads * Dh, D, c.o_bias)
        if c.qk_norm:
            self.q_norm = _RMSNorm(Dh)
            self.k_norm = _RMSNorm(Dh)


class _MLP(Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        D, F = c.hidden_size, c.intermediate_size
        self.gate_proj = _Linear(D, F, c.mlp_bias)
        self.up_proj = _Linear(D, F, c.mlp_bias)
        self.down_proj = _Linear(F, D, c.mlp_bias)


class _Layer(Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.self_attn = _Attention(c)
        self.mlp = _MLP(c)
        self.input_layernorm = _RMSNorm(c.hidden_size)
        self.post_attention_layernorm = _RMSNorm(c.hidden_size)


def _table(c: LlamaConfig, chunks: int):
    if chunks == 1:
        return _Table(c.vocab_size, c.hidden_size)
    return [_Table(b - a, c.hidden_size) for a, b in row_split(c.vocab_size, chunks)]


class _Body(Module):
    def __init__(self, c: LlamaConfig, chunks: int):
        super().__init__()
        self.embed_tokens = _table(c, chunks)
        self.layers = [_Layer(c) for _ in range(c.num_hidden_layers)]
        self.norm = _RMSNorm(c.hidden_size)


class LlamaModule(Module):
    """The parameters, named as transformers' *ForCausalLM state_dict ("model.", "lm_head.").
    table_chunks > 1 holds the token table and the LM head as row blocks
    ("model.embed_tokens.{k}.weight", "lm_head.{k}.weight"; decoding.py says why)."""

    def __init__(self, cfg: LlamaConfig, table_chunks: int = 1, quant: dict | None = None):
        super().__init__()
        self.cfg = cfg
        self.model = _Body(cfg, table_chunks)
        if not cfg.tie_word_embeddings:
            self.lm_head = _table(cfg, table_chunks)
        # quant: parameter name -> quants.QuantSpec: those weights are held as blocks and read
        # through ops.dequantize (module.py); the forward code is the same
        for name, spec in self.named_specs():
            if quant and name in quant:
                spec.quant = quant[name]


def param_shapes(cfg: LlamaConfig, table_chunks: int = 1) -> dict[str, tuple[int, ...]]:
    return {n: s.shape for n, s in LlamaModule(cfg, table_chunks).named_specs()}


_TABLES = ("model.embed_tokens.weight", "lm_head.weight")   # split when table_chunks > 1


# ---------------------------------------------------------------- the forward, in ops

def _rms(p, x, eps):
    return x * ops.rsqrt(ops.mean_last(x * x, keepdims=True) + eps) * p.weight


def _lin(p, x):
    y = ops.matmul(x, ops.swap_axes(p.weight, 0, 1))
    b = getattr(p, "bias", None)
    return lora.adapted(p, x, y if b is None else y + b)


def _rotary(qpos, cfg: LlamaConfig):
    """(cos, sin) [T, 1, head_dim] for f32 positions qpos [T, 1]."""
    inv = ops.constant(cfg.inv_freq(), shape=(1, cfg.head_dim // 2))
    ang = qpos * inv                                     # [T, Dh/2], f32 as transformers
    ang = ops.unsqueeze(ops.concat([ang, ang], -1), 1)   # [T, 1, Dh]
    return ops.cos(ang), ops.sin(ang)


def _rope(x, cos, sin):
    """x [..., T, H, Dh] rotated (rotate-half: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin))."""
    half = x.shape[-1] // 2
    x1, x2 = ops.slice_last_range(x, 0, half), ops.slice_last_range(x, half, 2 * half)
    return x * cos + ops.concat([-x2, x1], -1) * sin


def _heads_first(x):
    """[..., T, H, Dh] -> [..., H, T, Dh]."""
    return ops.swap_axes(x, -3, -2)


def _qkv(layer, x, rot, cfg: LlamaConfig):
    """x [..., T, D] -> q [..., T, H, Dh], k [..., T, Hkv, Dh] (normed [Qwen3] and rotated),
    v [..., T, Hkv, Dh]."""
    a, lead = layer.self_attn, x.shape[:-1]
    n = _rms(layer.input_layernorm, x, cfg.rms_norm_eps)
    H, Hkv, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = ops.reshape(_lin(a.q_proj, n), (*lead, H, Dh))
    k = ops.reshape(_lin(a.k_proj, n), (*lead, Hkv, Dh))
    v = ops.reshape(_lin(a.v_proj, n), (*lead, Hkv, Dh))
    if cfg.qk_norm:
        q, k = _rms(a.q_norm, q, cfg.rms_norm_eps), _rms(a.k_norm, k, cfg.rms_norm_eps)
    return _rope(q, *rot), _rope(k, *rot), v


def _attend(q, k, v, visible, cfg: LlamaConfig):
    """q [..., T, H, Dh]; k, v [..., Hkv, S, Dh]; visible [T, S] (None: causal, S = T) ->
    [..., T, H * Dh] (the leading axes: a training batch). GQA without copying K/V per query
    head: queries as [..., Hkv, rep, T, Dh] (rep = H / Hkv query heads share K/V head
    h // rep, as transformers' repeat_kv) against K/V as [..., Hkv, 1, S, Dh], broadcast by
    the batched matmuls."""
    *lead, T, H, Dh = q.shape
    Hkv = k.shape[-3]
    rep = H // Hkv
    qh = ops.reshape(_heads_first(q), (*lead, Hkv, rep, T, Dh))
    k, v = ops.unsqueeze(k, -3), ops.unsqueeze(v, -3)
    s = ops.matmul(qh, ops.swap_axes(k, -1, -2)) * (1.0 / math.sqrt(Dh))   # [..., Hkv, rep, T, S]
    s = ops.where_causal(s, -1e30) if visible is None else ops.where(visible, s, -1e30)
    att = ops.reshape(ops.matmul(ops.softmax_last(s), v), (*lead, H, T, Dh))
    return ops.reshape(_heads_first(att), (*lead, T, H * Dh))


def _finish(layer, x, att, cfg: LlamaConfig):
    x = x + _lin(layer.self_attn.o_proj, att)
    n = _rms(layer.post_attention_layernorm, x, cfg.rms_norm_eps)
    m = layer.mlp
    return x + _lin(m.down_proj, ops.silu(_lin(m.gate_proj, n)) * _lin(m.up_proj, n))


def _visible(qpos, S: int, cfg: LlamaConfig):
    """[T, S] mask of the keys each query sees: key <= query [and key > query - window]."""
    kpos = ops.reshape(ops.arange(S, dtype="f32"), (1, S))
    vis = ops.greater_equal(qpos, kpos)
    if cfg.sliding_window is not None and cfg.sliding_window < S:   # else nothing to hide
        vis = vis * ops.greater(kpos, qpos - float(cfg.sliding_window))
    return vis


def hidden(m: LlamaModule, ids, cfg: LlamaConfig):
    """ids [..., T] i32 -> final hidden states [..., T, D] (after the last RMSNorm), causal
    attention."""
    T = ids.shape[-1]
    if T > cfg.n_ctx:
        raise ValueError(f"llama: {T} positions exceed n_ctx={cfg.n_ctx} (LlamaConfig.from_hf(..., n_ctx=))")
    x = embed_rows(table_parts(m.model.embed_tokens), ids)
    qpos = ops.reshape(ops.arange(T, dtype="f32"), (T, 1))
    rot = _rotary(qpos, cfg)
    window = cfg.sliding_window is not None and cfg.sliding_window < T
    visible = _visible(qpos, T, cfg) if window else None
    for layer in m.model.layers:
        q, k, v = _qkv(layer, x, rot, cfg)
        x = _finish(layer, x, _attend(q, _heads_first(k), _heads_first(v), visible, cfg), cfg)
    return _rms(m.model.norm, x, cfg.rms_norm_eps)


def cached_hidden(m: LlamaModule, ids, pos, cfg: LlamaConfig):
    """ids [T] i32 at positions pos.. (pos [1] i32): writes their K/V rows into the cache
    state and attends over the whole cache. -> [T, D] after the last RMSNorm."""
    T, S = ids.shape[0], cfg.n_ctx
    Hkv, Dh = cfg.num_key_value_heads, cfg.head_dim
    x = embed_rows(table_parts(m.model.embed_tokens), ids)
    qpos = ops.reshape(ops.cast(ops.arange(T) + pos, "f32"), (T, 1))
    rot = _rotary(qpos, cfg)
    visible = _visible(qpos, S, cfg)
    for li, layer in enumerate(m.model.layers):
        q, k, v = _qkv(layer, x, rot, cfg)
        kv = []
        for name, new in ((f"kv.{li}.k", k), (f"kv.{li}.v", v)):
            full = ops.write_rows(state(name, (S, Hkv * Dh)), ops.reshape(new, (T, Hkv * Dh)), pos)
            assign(name, full)
            kv.append(_heads_first(ops.reshape(full, (S, Hkv, Dh))))   # [Hkv, S, Dh]
        x = _finish(layer, x, _attend(q, kv[0], kv[1], visible, cfg), cfg)
    return _rms(m.model.norm, x, cfg.rms_norm_eps)


def head(m: LlamaModule, h):
    """[(logits block [T, rows_k], first row)]: h @ W^T with W lm_head or, tied, the token
    table, per row block."""
    return head_blocks(table_parts(m.lm_head if hasattr(m, "lm_head") else m.model.embed_tokens), h)


def lm_loss(m: LlamaModule, inputs):
    """Mean next-token cross entropy (nats); inputs tokens, targets [B, T] i32 (targets[t]
    is the token after tokens[t]: transformers' labels, already shifted)."""
    return next_token_loss(head(m, hidden(m, inputs["tokens"], m.cfg)), inputs["targets"])


# ---------------------------------------------------------------- inference

class Llama(CausalLM):
    """Llama-family inference on any backend: forward, new_cache / logits_step /
    logits_all_step, generate / generate_stream, surprisal (decoding.CausalLM), each with an
    *_async twin; weights in and out in transformers' names (llama_weights.py)."""

    _text_hint = ("encode it with the model's tokenizer first, e.g. tokenizers.Tokenizer."
                  "from_file('tokenizer.json').encode(text).ids")

    def __init__(self, cfg: LlamaConfig, backend="auto", *, table_chunks: int | None = None,
                 quant: dict | None = None, dtype: str = "f32"):
        """Zero weights on `backend` (write them with load_state_dict); dtype "f16" holds the
        weights that are not quantized in f16 (CausalLM.set_dtype); table_chunks
        (default: what the device's binding limit needs) splits the token table and the LM
        head into row blocks. quant: {transformers name: quants.QuantSpec} of weights held
        as quantized blocks (from_gguf fills it; write them with write_blocks)."""
        from ..backends import get_backend
        self.set_dtype(dtype)
        if not isinstance(cfg, LlamaConfig):
            raise TypeError(f"Llama: cfg must be a LlamaConfig (LlamaConfig.from_hf(config_dict)), "
                            f"got {type(cfg).__name__}")
        self.cfg = cfg
        self.backend = get_backend(backend)
        self.hf_shapes = param_shapes(cfg)                    # transformers' names
        full = dict(quant or {})
        unknown = sorted(set(full) - set(self.hf_shapes))
        if unknown:
            raise ValueError(f"Llama: quant names {unknown[:5]} are not parameters of this "
                             f"{cfg.model_type} config")
        qtypes = [full[n].qtype if n in full else None for n in _TABLES if n in self.hf_shapes]
        self.table_chunks = table_chunks or max(
            chunks_for(cfg.vocab_size, cfg.hidden_size, self.backend, q) for q in qtypes)
        self.shapes = param_shapes(cfg, self.table_chunks)    # the backend's
        self.quant_full = full                                # transformers names, whole tensors
        self.quant = quant_params(full, _TABLES, cfg.vocab_size, self.table_chunks)
        self._ensure_weights()
        self._init_decoding()

    # -- construction and weights
    @classmethod
    def init_random(cls, cfg: LlamaConfig, seed: int = 0, backend="auto") -> "Llama":
        """N(0, 0.02) matrices, unit norms, zero biases, from `seed` (for tests and demos)."""
        m = cls(cfg, backend)
        specs = LlamaModule(cfg, m.table_chunks).named_specs()
        m.backend.init_params([(n, spec.init, spec.shape) for n, spec in specs], seed=seed)
        return m

    @classmethod
    def from_hf_state_dict(cls, cfg: LlamaConfig, state_dict, backend="auto", *,
                           dtype: str = "f32") -> "Llama":
        """Weights named and laid out as transformers' LlamaForCausalLM (MistralForCausalLM,
        Qwen2ForCausalLM, Qwen3ForCausalLM).state_dict(); values as numpy arrays, torch
        tensors, array.array or memoryviews. Missing, unexpected or mis-shaped names are
        listed in the error, before anything is written. dtype: "f16" holds them in f16."""
        m = cls(cfg, backend, dtype=dtype)
        m.load_state_dict(state_dict)
        return m

    @classmethod
    def from_pretrained(cls, path, backend="auto", *, n_ctx: int | None = None, progress=None,
                        dtype: str = "f32") -> "Llama":
        """A folder as transformers' save_pretrained writes it: config.json and
        model.safetensors, or model.safetensors.index.json and its shards (F32/F16/BF16).
        n_ctx: the cache length (default min(max_position_embeddings, 2048));
        progress(done, total): tensor bytes written so far. Names and shapes are checked
        before any tensor is converted; then each is written in turn: on WebGPU an F16/BF16
        tensor's bytes go up as they are and are widened there (io/gpu_dequant.py), elsewhere
        each is widened to f32 on the host (dtype "f16": held rounded to f16 again, as an
        F16 file's values are exactly). A NaN or inf weight is refused, naming it."""
        return run_blocking(cls.from_pretrained_async(path, backend, n_ctx=n_ctx,
                                                      progress=progress, dtype=dtype))

    @classmethod
    async def from_pretrained_async(cls, path, backend="auto", *, n_ctx: int | None = None,
                                    progress=None, dtype: str = "f32") -> "Llama":
        cfg, tensors = _weights.read_pretrained(path, n_ctx=n_ctx)
        m = cls(cfg, backend, dtype=dtype)
        values = _weights.check_state_dict(cfg, m.hf_shapes, tensors)
        done, total = 0, sum(v.nbytes for v in values.values())
        for n, v in values.items():
            if not await m._write_on_gpu_async(n, v):
                m.write_weight(n, _weights.to_f32(n, v, m.hf_shapes[n]))
            done += v.nbytes
            if progress is not None:
                progress(done, total)
        return m

    async def _write_on_gpu_async(self, n: str, t) -> bool:
        """Send a file's F16/BF16 tensor `t` (a safetensors StoredTensor) to the GPU as its
        bytes and widen it there, a table row block by row block; False (nothing written)
        where the backend cannot, and the caller widens on the host."""
        from ..io import gpu_dequant
        if self.table_chunks > 1 and n in _TABLES:
            parts = list(zip(block_names(n, self.table_chunks),
                             row_split(self.cfg.vocab_size, self.table_chunks)))
        else:
            parts = [(n, None)]
        if not all(gpu_dequant.on_gpu(self.backend, pn, t.dtype) for pn, _ in parts):
            return False
        if t.first_nonfinite() is not None:
            return False        # the host path refuses it, naming the value and its place
        row = 2 * prod(self.hf_shapes[n][1:])
        for pn, rows in parts:
            shape = self.backend.store[pn].shape
            data = t.data if rows is None else t.data[rows[0] * row:rows[1] * row]
            await gpu_dequant.write_raw_async(self.backend, pn, t.dtype, shape, data,
                                              label=n)
        return True

    @classmethod
    def from_gguf(cls, path_or_bytes, backend="auto", *, keep_quantized: bool = True,
                  n_ctx: int | None = None, progress=None,
                  allow_nonfinite: bool = False) -> "Llama":
        """A GGUF file as llama.cpp writes it, of architecture llama, qwen2 or qwen3
        (llama_gguf.py reads the config from its metadata, maps llama.cpp's tensor names and
        undoes the llama architecture's q/k row permutation). Weights F32/F16/BF16 or of
        webgrad.quants.FORMATS (Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K), so Q4_K_M and Q5_K_M
        files too; no output.weight = the head tied to token_embd.weight.

        keep_quantized (the default): matrices of those quant formats stay quantized on every
        backend (the file's bytes in webgrad.quants' word layout): on WebGPU the matmuls and
        the embedding decode the blocks in registers; the CPU executors dequantize per run.
        The logits equal those of the same weights dequantized to f32. keep_quantized=False
        dequantizes at load into f32 parameters. n_ctx: the cache length (default
        min(context_length, 2048)); progress(done, total): tensor bytes written so far. A NaN
        or inf weight (or quant scale) is refused unless allow_nonfinite=True."""
        return run_blocking(cls.from_gguf_async(path_or_bytes, backend, keep_quantized=keep_quantized,
                                                n_ctx=n_ctx, progress=progress,
                                                allow_nonfinite=allow_nonfinite))

    @classmethod
    async def from_gguf_async(cls, path_or_bytes, backend="auto", *, keep_quantized: bool = True,
                              n_ctx: int | None = None, progress=None,
                              allow_nonfinite: bool = False) -> "Llama":
        from ..io import gguf
        from ..quants import FORMATS, QuantSpec
        from . import llama_gguf
        f = gguf.load(path_or_bytes)
        cfg = llama_gguf.config(f, n_ctx=n_ctx)
        tensors = llama_gguf.tensors(f, cfg, param_shapes(cfg))
        gguf.check_values(f, allow_nonfinite=allow_nonfinite)
        quant = {hf: QuantSpec(t.type_name, t.shape) for hf, t in tensors.items()
                 if keep_quantized and t.type_name in FORMATS and len(t.shape) == 2}
        m = cls(cfg, backend, quant=quant)
        await llama_gguf.write_async(m, tensors, progress=progress)
        return m

    @classmethod
    def from_safetensors(cls, path_or_bytes, cfg: LlamaConfig | None = None, backend="auto") -> "Llama":
        """One .safetensors file; without cfg, the config save_safetensors recorded in it."""
        cfg, sd = _weights.read_safetensors(path_or_bytes, cfg)
        return cls.from_hf_state_dict(cfg, sd, backend)

    def load_state_dict(self, state_dict) -> None:
        """Checks and converts every tensor before writing any (a refused call changes
        nothing)."""
        if self.quant_full:
            raise ValueError(f"Llama.load_state_dict: this model holds {sorted(self.quant_full)[:3]} "
                             "quantized; f32 weights go into a model built without quant "
                             "(Llama.from_hf_state_dict, or from_gguf(..., keep_quantized=False))")
        values = _weights.check_state_dict(self.cfg, self.hf_shapes, state_dict)
        hosts = {n: _weights.to_f32(n, v, self.hf_shapes[n]) for n, v in values.items()}
        for n, h in hosts.items():
            self.write_weight(n, h)

    def write_weight(self, n: str, h: HostArray) -> None:
        """Write one f32 weight in transformers' name and layout, a table into its row
        blocks (loaders write through it; weights held quantized take write_blocks)."""
        if n in self.quant_full:
            raise ValueError(f"Llama: {n!r} is held quantized; write its blocks (write_blocks)")
        if n in _TABLES and self.table_chunks > 1:
            D = self.cfg.hidden_size
            for pn, (a, b) in zip(block_names(n, self.table_chunks),
                                  row_split(self.cfg.vocab_size, self.table_chunks)):
                self.backend.write(pn, HostArray("f32", h[a * D:b * D], shape=(b - a, D)))
        else:
            self.backend.write(n, h)

    def write_blocks(self, name: str, raw) -> None:
        """Write GGUF blocks (bytes) of the whole tensor `name` (a transformers name in
        self.quant_full), transcoded to the GPU layout; a split table row block by row
        block."""
        write_quant_blocks(self, name, raw, row_split(self.cfg.vocab_size, self.table_chunks))

    async def write_blocks_async(self, name: str, raw) -> None:
        """write_blocks; on WebGPU the blocks go up as they are and a kernel lays them out."""
        await write_quant_blocks_async(self, name, raw,
                                       row_split(self.cfg.vocab_size, self.table_chunks))

    async def state_dict_async(self) -> dict:
        """The weights in transformers' names (tables whole), as the user's array type."""
        from ..arrays import to_user
        out = {}
        for n, s in self.hf_shapes.items():
            if n in _TABLES and self.table_chunks > 1:
                h = HostArray("f32", shape=s)
                for pn in block_names(n, self.table_chunks):   # blocks of rows, in order
                    h.extend(await read_f32(self.backend, pn, self.quant.get(pn)))
                out[n] = to_user(h)
            else:
                out[n] = to_user(await read_f32(self.backend, n, self.quant.get(n)))
        return out

    def state_dict(self) -> dict:
        return run_blocking(self.state_dict_async())

    async def save_safetensors_async(self, dst=None, metadata: dict | None = None):
        """Write the weights as a model.safetensors (transformers' names; a tied lm_head not
        stored, as save_pretrained does) to `dst` (a path or binary file), or return the
        file's bytes. The config goes into the metadata, for from_safetensors."""
        return _weights.write_safetensors(self.cfg, await self.state_dict_async(), dst, metadata)

    def save_safetensors(self, dst=None, metadata=None):
        return run_blocking(self.save_safetensors_async(dst, metadata))

    def save_pretrained(self, folder) -> None:
        """config.json and model.safetensors in `folder`: what from_pretrained and
        transformers' from_pretrained read."""
        _weights.write_pretrained(self.cfg, self.state_dict(), folder)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights as held by the backend (quantized ones as their blocks)."""
        return sum(4 * prod(self.backend.shape_of(n)) for n in self.shapes)

    # -- the network, for decoding.CausalLM's programs
    _network = Network(hidden, cached_hidden, head)

    @property
    def _head_blocks(self) -> int:
        return self.table_chunks

    def _module(self) -> LlamaModule:
        return self._held(LlamaModule(self.cfg, self.table_chunks, self.quant))


__all__ = ["LlamaConfig", "LlamaModule", "Llama", "Cache", "Surprisal", "SurprisalTracker",
           "hidden", "cached_hidden", "head", "lm_loss", "param_shapes"]
