"""Llama-family models from GGUF files as llama.cpp writes them (architectures llama, qwen2,
qwen3): the config from the metadata, the tensors by llama.cpp's names mapped to
transformers' (llama.py's parameter names), and the rows of the llama architecture's
attn_q / attn_k put back in transformers' order. Llama.from_gguf is built on it.

Config, from the "{arch}." metadata: block_count, context_length (max_position_embeddings),
embedding_length, feed_forward_length, attention.head_count, attention.head_count_kv,
attention.layer_norm_rms_epsilon, attention.key_length (head_dim), rope.freq_base; rope
scaling as llama.cpp holds it: the `rope_freqs.weight` tensor (how its converter writes
Llama 3.1's llama3 scaling: a divisor per frequency) or rope.scaling.type "linear" with
rope.scaling.factor (one divisor for all), both LlamaConfig.rope_freq_factors; vocab_size
from token_embd.weight's rows; tied embeddings when output.weight is absent; biases and
Qwen3's q/k norms where their tensors are.

Names: token_embd -> model.embed_tokens, output_norm -> model.norm, output -> lm_head, and
per block N (blk.N. -> model.layers.N.): attn_norm -> input_layernorm, attn_q/k/v/output ->
self_attn.q_proj/k_proj/v_proj/o_proj, attn_q_norm/attn_k_norm -> self_attn.q_norm/k_norm,
ffn_norm -> post_attention_layernorm, ffn_gate/up/down -> mlp.gate_proj/up_proj/down_proj.
A GGUF matrix's dims are [in, out] in ggml's order, so its numpy shape (io/gguf.py reverses
the dims) is transformers' [out, in]: no transpose.

The rope permutation: transformers rotates the two halves of each head (rotate-half);
llama.cpp's llama architecture rotates adjacent pairs, so its converter
(convert_hf_to_gguf.py, LlamaModel.permute) reorders the rows of q_proj and k_proj (weight
and bias) within each head: GGUF row h*Dh + 2j + s holds transformers' row h*Dh + s*Dh/2 + j
(s in {0, 1}, j < Dh/2). Reading undoes it. Rows are whole quant blocks, so the file's
rows are moved as bytes, for every type, and quantized weights stay bit-identical. qwen2
and qwen3 use the rotate-half form in llama.cpp too, and are stored unpermuted.
"""
from __future__ import annotations

from ..io.gguf import GGUFError, GGUFTensor
from ..quants import DEQUANTIZABLE
from .llama_config import DEFAULT_N_CTX, LlamaConfig
from .llama_weights import misfit

ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}   # GGUF -> model_type
PERMUTED = ("llama",)          # architectures whose attn_q / attn_k rows llama.cpp reorders

_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_BLOCK = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
          "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
          "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_HF_BLOCK = {v: k for k, v in _BLOCK.items()}
ROPE_FREQS = "rope_freqs.weight"


def gguf_name(hf: str) -> str:
    """llama.cpp's name of a transformers parameter name (llama.py's)."""
    for g, h in _GLOBAL.items():
        if h == hf:
            return g
    _, _, i, *rest = hf.split(".")            # model.layers.N.<module path>.<weight|bias>
    return f"blk.{i}.{_HF_BLOCK['.'.join(rest[:-1])]}.{rest[-1]}"


def _fail(f, msg: str):
    raise GGUFError(f"GGUF file {f.name}: {msg}")


def config(f, *, n_ctx: int | None = None) -> LlamaConfig:
    """The LlamaConfig of a parsed GGUF file (io.gguf.GGUFFile) of llama.cpp's llama, qwen2 or
    qwen3 architecture."""
    md, tensors = f.metadata, f.tensors
    arch = md.get("general.architecture")
    if arch not in ARCHITECTURES:
        _fail(f, f"metadata 'general.architecture' is {arch!r}; Llama.from_gguf supports "
              f"{', '.join(map(repr, ARCHITECTURES))} (GPT-2 files: webgrad.models.gpt2.GPT2.from_gguf)")

    def key(k, default=None, kind=int):
        v = md.get(f"{arch}.{k}", default)
        if v is None:
            _fail(f, f"metadata '{arch}.{k}' is missing (llama.cpp's converter writes it)")
        if kind is int and (type(v) is not int or v <= 0):
            _fail(f, f"metadata '{arch}.{k}' is {v!r}; a positive integer is required")
        if kind is float and not isinstance(v, (int, float)):
            _fail(f, f"metadata '{arch}.{k}' is {v!r}; a number is required")
        return v

    D, H = key("embedding_length"), key("attention.head_count")
    kv = key("attention.head_count_kv", H)
    head_dim = key("attention.key_length", D // H)
    if key("attention.value_length", head_dim) != head_dim:
        _fail(f, f"metadata '{arch}.attention.value_length' is {md[f'{arch}.attention.value_length']}, "
              f"key_length {head_dim}; only equal ones are supported")
    if key("rope.dimension_count", head_dim) != head_dim:
        _fail(f, f"metadata '{arch}.rope.dimension_count' is {md[f'{arch}.rope.dimension_count']}, "
              f"head_dim {head_dim}; only rotating the whole head is supported")
    emb = tensors.get("token_embd.weight")
    if emb is None:
        _fail(f, "tensor 'token_embd.weight' is missing")
    if len(emb.shape) != 2 or emb.shape[1] != D:
        _fail(f, f"tensor 'token_embd.weight' has shape {list(emb.shape)}; "
              f"[vocab, {D}] expected ('{arch}.embedding_length' is {D})")
    max_pos, ffn, layers = key("context_length"), key("feed_forward_length"), key("block_count")
    eps = float(key("attention.layer_norm_rms_epsilon", kind=float))
    theta = float(key("rope.freq_base", 10000.0, float))
    factors = _freq_factors(f, arch, head_dim)
    try:
        return LlamaConfig(
            model_type=ARCHITECTURES[arch], vocab_size=emb.shape[0], hidden_size=D,
            intermediate_size=ffn, num_hidden_layers=layers,
            num_attention_heads=H, num_key_value_heads=kv, head_dim=head_dim,
            rms_norm_eps=eps, rope_theta=theta, rope_freq_factors=factors,
            max_position_embeddings=max_pos, n_ctx=int(n_ctx or min(max_pos, DEFAULT_N_CTX)),
            tie_word_embeddings="output.weight" not in tensors,
            qkv_bias="blk.0.attn_q.bias" in tensors, o_bias="blk.0.attn_output.bias" in tensors,
            mlp_bias="blk.0.ffn_up.bias" in tensors,
            qk_norm=arch == "qwen3" or "blk.0.attn_q_norm.weight" in tensors,
            bos_token_id=md.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=md.get("tokenizer.ggml.eos_token_id"))
    except ValueError as e:
        _fail(f, f"the metadata gives no valid config: {e}")


def _freq_factors(f, arch: str, head_dim: int):
    """Per-frequency rope divisors: the rope_freqs tensor, or linear scaling's factor."""
    md = f.metadata
    kind = md.get(f"{arch}.rope.scaling.type", "none")
    t = f.tensors.get(ROPE_FREQS)
    if t is not None:
        if kind != "none":
            _fail(f, f"tensor {ROPE_FREQS!r} and metadata '{arch}.rope.scaling.type' {kind!r} "
                  "together are not supported")
        if t.shape != (head_dim // 2,):
            _fail(f, f"tensor {ROPE_FREQS!r} has shape {list(t.shape)}; [{head_dim // 2}] "
                  f"(head_dim / 2) expected")
        return tuple(t.dequantize())
    if kind == "none":
        return None
    if kind != "linear":
        _fail(f, f"metadata '{arch}.rope.scaling.type' is {kind!r}; supported: 'none', 'linear' "
              f"(and llama3 scaling as the {ROPE_FREQS!r} tensor)")
    factor = md.get(f"{arch}.rope.scaling.factor")
    if not isinstance(factor, (int, float)) or factor <= 0:
        _fail(f, f"metadata '{arch}.rope.scaling.factor' is {factor!r}; linear scaling needs a "
              "positive factor")
    return None if factor == 1 else (float(factor),) * (head_dim // 2)


def tensors(f, cfg: LlamaConfig, shapes: dict) -> dict:
    """{transformers name: io.gguf.GGUFTensor} for the parameters `shapes` (llama.py's
    param_shapes(cfg)), checked whole: every missing, unexpected and mis-shaped tensor is
    listed, in llama.cpp's names. q/k rows of the llama architecture come back unpermuted."""
    arch = f.metadata.get("general.architecture")
    want = {gguf_name(hf): hf for hf in shapes}
    have = set(f.tensors) - {ROPE_FREQS}
    missing = sorted(set(want) - have)
    unexpected = sorted(have - set(want))
    misshaped = [f"{g} is {list(f.tensors[g].shape)}, expected {list(shapes[hf])}"
                 for g, hf in want.items() if g in f.tensors and f.tensors[g].shape != shapes[hf]]
    untyped = [f"{g} ({f.tensors[g].type_name})" for g in want
               if g in f.tensors and f.tensors[g].type_name not in DEQUANTIZABLE]
    if untyped:
        _fail(f, f"tensors {', '.join(untyped[:8])} are of a type webgrad cannot decode; supported: "
              f"{', '.join(DEQUANTIZABLE)} (re-quantize the file with llama-quantize, e.g. to Q4_K_M)")
    if missing or unexpected or misshaped:
        _fail(f, f"the tensors do not fit llama.cpp's {arch} layout for {cfg.num_hidden_layers} "
              f"blocks, hidden size {cfg.hidden_size}, {cfg.num_attention_heads} heads "
              f"({cfg.num_key_value_heads} K/V) of {cfg.head_dim}; " + misfit(missing, unexpected, misshaped))
    out = {}
    for g, hf in want.items():
        t = f.tensors[g]
        if arch in PERMUTED and hf.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")):
            heads = cfg.num_attention_heads if ".q_proj." in hf else cfg.num_key_value_heads
            t = unpermute(t, heads, what=f"GGUF file {f.name}: tensor {g!r}")
        out[hf] = t
    return out


def unpermute(t: GGUFTensor, n_head: int, *, what: str = "unpermute") -> GGUFTensor:
    """A GGUFTensor with the rows of llama.cpp's rope permutation put back in transformers'
    order (the module header), moved as bytes: any type, quantized blocks unchanged."""
    rows = t.shape[0]
    if rows % (2 * n_head):
        raise GGUFError(f"{what}: {rows} rows are not {n_head} heads of an even size")
    raw = memoryview(t.data).cast("B")
    size = raw.nbytes // rows
    dh = rows // n_head
    order = [h * dh + 2 * j + s for h in range(n_head) for s in (0, 1) for j in range(dh // 2)]
    data = memoryview(b"".join(raw[r * size:(r + 1) * size] for r in order))
    return GGUFTensor(t.name, t.ggml_type, t.dims, t.offset, data)


async def write_async(model, tensors: dict, *, progress=None) -> None:
    """Write tensors (from `tensors`) into a Llama built from their config: those it holds
    quantized as their blocks (write_blocks_async: on WebGPU laid out by a kernel); others on WebGPU uploaded as they are and
    dequantized by a kernel (io/gpu_dequant.py), a table in row blocks and other backends
    through the host. progress(done, total) hears the tensor bytes written so far."""
    from ..io import gpu_dequant
    done, total = 0, sum(t.data.nbytes for t in tensors.values())
    for hf, t in tensors.items():
        if hf in model.quant_full:
            await model.write_blocks_async(hf, t.data)
        elif hf in model.shapes:
            await gpu_dequant.write_async(model.backend, hf, t)
        else:                                               # a table split in row blocks
            model.write_weight(hf, t.dequantize())
        done += t.data.nbytes
        if progress is not None:
            progress(done, total)


__all__ = ["ARCHITECTURES", "config", "tensors", "unpermute", "write_async",
           "gguf_name"]
