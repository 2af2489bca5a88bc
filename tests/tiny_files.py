"""Tiny valid model files for the reliability tests and the fuzzers: a GPT-2 as GGUF (the
`gguf` package's writer, llama.cpp's names, metadata written key by key so a test can give
any key any type) and as safetensors (transformers' names), and a checkpoint of a small
compiled module. Each is small enough to mutate hundreds of times in a few seconds.
"""
from __future__ import annotations

import numpy as np

from webgrad.io import safetensors as st
from webgrad.models import gpt2

CFG = gpt2.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_ctx=8, vocab_size=16)
_BLOCK = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
          "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
_GLOBAL = {"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
           "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias"}


def gpt2_state_dict(cfg=CFG, seed=0) -> dict[str, np.ndarray]:
    """transformers' names and shapes (Conv1D weights [in, out]), small random values."""
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal(s) * 0.1).astype(np.float32)
            for n, s in gpt2.param_shapes(cfg).items()}


def gguf_name(hf: str) -> str:
    if hf in _GLOBAL:
        return _GLOBAL[hf]
    _, i, rest = hf.split(".", 2)
    base, _, suffix = rest.rpartition(".")
    return f"blk.{i}.{_BLOCK[base]}.{suffix}"


def gpt2_metadata(cfg=CFG) -> dict:
    """key -> (GGUFValueType name, value) of a llama.cpp gpt2 file."""
    return {"gpt2.context_length": ("UINT32", cfg.n_ctx),
            "gpt2.embedding_length": ("UINT32", cfg.n_embd),
            "gpt2.feed_forward_length": ("UINT32", 4 * cfg.n_embd),
            "gpt2.block_count": ("UINT32", cfg.n_layer),
            "gpt2.attention.head_count": ("UINT32", cfg.n_head),
            "gpt2.attention.layer_norm_epsilon": ("FLOAT32", cfg.layer_norm_epsilon)}


def gpt2_gguf(path, *, metadata=None, sd=None, q8=False) -> bytes:
    """A gpt2 GGUF at `path` (returned as bytes too): metadata overrides gpt2_metadata (a
    value of None drops the key), sd the state dict; q8 stores the 2-D weights but the
    embeddings as Q8_0."""
    import gguf
    meta = {**gpt2_metadata(), **(metadata or {})}
    sd = gpt2_state_dict() if sd is None else sd
    w = gguf.GGUFWriter(str(path), "gpt2")
    for k, typed in meta.items():
        if typed is not None:
            w.add_key_value(k, typed[1], gguf.GGUFValueType[typed[0]])
    for hf, v in sd.items():
        name = gguf_name(hf)
        if hf.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            v = np.ascontiguousarray(v.T)        # GGUF keeps Conv1D weights [out, in]
        if q8 and v.ndim == 2 and "embd" not in name:
            q = gguf.quants.quantize(v, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(path, "rb") as f:
        return f.read()


def gpt2_safetensors(*, config_json: str | None = None, sd=None) -> bytes:
    """A GPT-2 model.safetensors; config_json, if given, as the recorded config."""
    meta = {"format": "pt"}
    if config_json is not None:
        meta["webgrad.gpt2_config"] = config_json      # GPT2.save_safetensors's key
    return st.dumps(gpt2_state_dict() if sd is None else sd, meta)
