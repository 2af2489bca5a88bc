"""Llama-family weights in and out: state dicts checked against the config, transformers'
save_pretrained folders read (config.json with model.safetensors, or the index and its
shards), and model.safetensors / folders written back.

Names and layouts are transformers' *ForCausalLM ones (see llama.py). A state dict is
checked whole before anything is written: the error lists every missing, unexpected and
mis-shaped name with what the config expects, so one fix covers all. Accepted as ignorable:
"lm_head.weight" when the embeddings are tied (transformers' state_dict() lists both names)
and rotary "inv_freq" buffers older transformers versions saved. Names without the "model."
prefix (transformers' bare LlamaModel) are taken as the body's.

Tensors may be F32, F16 or BF16 in files (io/safetensors.py widens them to f32), and numpy
arrays, torch tensors (any dtype), array.array or memoryviews in state dicts.
"""
from __future__ import annotations

import json
import os
from math import prod

from ..arrays import to_host
from .decoding import as_f32_array
from .llama_config import LlamaConfig

META_KEY = "webgrad.llama_config"   # safetensors metadata: config.json's fields + n_ctx, as JSON
_INDEX, _SINGLE = "model.safetensors.index.json", "model.safetensors"


def _normal(name: str) -> str:
    return name if name.startswith(("model.", "lm_head.")) else "model." + name


def _value_shape(v):
    if isinstance(v, memoryview) and v.format in ("B", "b", "c") and v.ndim <= 1:
        return (v.nbytes // 4,)            # raw f32 bytes
    if hasattr(v, "shape"):
        return tuple(int(s) for s in v.shape)
    return (len(v),)


def check_state_dict(cfg: LlamaConfig, shapes: dict, state_dict) -> dict:
    """{parameter name: value} of a state dict whose names and shapes fit `shapes` (values
    not yet converted: to_f32), or a ValueError listing what does not."""
    sd = {}
    for k, v in state_dict.items():
        sd[_normal(k)] = v
    ignored = {k for k in sd if k.endswith("rotary_emb.inv_freq")
               or (k == "lm_head.weight" and cfg.tie_word_embeddings)}
    missing = sorted(set(shapes) - set(sd))
    unexpected = sorted(set(sd) - set(shapes) - ignored)
    misshaped = []
    for n, s in shapes.items():
        if n in sd:
            got = _value_shape(sd[n])
            if got != s and not (len(got) <= 1 and prod(got) == prod(s)):
                misshaped.append(f"{n} is {list(got)}, expected {list(s)}")
    if missing or unexpected or misshaped:
        hint = ""
        if "lm_head.weight" in missing:
            hint = " (no lm_head.weight: is tie_word_embeddings true in config.json?)"
        elif "lm_head.weight" in unexpected:
            hint = " (lm_head.weight given but the config ties it to model.embed_tokens.weight)"
        raise ValueError(f"Llama.from_hf_state_dict: the state dict does not fit the "
                         f"{cfg.model_type} config{hint}; " + misfit(missing, unexpected, misshaped))
    return {n: sd[n] for n in shapes}


def misfit(missing: list, unexpected: list, misshaped: list) -> str:
    """"missing: a, b; unexpected: c; mis-shaped: d is [..], expected [..]" (the first 8 of
    each), for the loaders' errors."""
    def few(xs):
        return ", ".join(xs[:8]) + (f" and {len(xs) - 8} more" if len(xs) > 8 else "")
    parts = [f"missing: {few(missing)}" if missing else "",
             f"unexpected: {few(unexpected)}" if unexpected else "",
             f"mis-shaped: {few(misshaped)}" if misshaped else ""]
    return "; ".join(p for p in parts if p)


def to_f32(name: str, value, shape):
    """One weight as an f32 HostArray (F16/BF16 files and torch dtypes widened)."""
    if not (hasattr(value, "to_host") and hasattr(value, "dtype")):   # a file's tensor: to_host
        value = as_f32_array(value)                                 # reads it, without a copy
    return to_host(value, shape=shape, dtype="f32", what=f"Llama weight {name!r}")


# ---------------------------------------------------------------- files

def _config_of(folder: str, n_ctx) -> LlamaConfig:
    """config.json, with generation_config.json's eos_token_id where it has one (what
    transformers' generate stops at: instruct models list their end-of-turn token there)."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Llama.from_pretrained: no config.json in {folder!r}; pass the "
                                "folder transformers' save_pretrained wrote")
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    gen = os.path.join(folder, "generation_config.json")
    if os.path.isfile(gen):
        with open(gen, encoding="utf-8") as f:
            eos = json.load(f).get("eos_token_id")
        if eos is not None:
            d["eos_token_id"] = eos
    try:
        return LlamaConfig.from_hf(d, n_ctx=n_ctx)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _shard_files(folder: str) -> list[str]:
    index = os.path.join(folder, _INDEX)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            wmap = json.load(f).get("weight_map")
        if not isinstance(wmap, dict) or not wmap:
            raise ValueError(f"{index}: field 'weight_map' is missing or empty")
        files = sorted(set(wmap.values()))
        for name in files:
            if os.path.basename(name) != name or not os.path.isfile(os.path.join(folder, name)):
                raise FileNotFoundError(f"{index}: shard {name!r} is not a file in {folder!r}")
        return [os.path.join(folder, n) for n in files]
    single = os.path.join(folder, _SINGLE)
    if os.path.isfile(single):
        return [single]
    raise FileNotFoundError(f"Llama.from_pretrained: neither {_SINGLE} nor {_INDEX} in {folder!r} "
                            "(a pytorch_model.bin checkpoint: load it in transformers and "
                            "save_pretrained it again, which writes safetensors)")


def read_pretrained(folder, *, n_ctx=None) -> tuple[LlamaConfig, dict]:
    """(config, {name: safetensors StoredTensor}) of a save_pretrained folder (the values
    stay in the files' dtypes until written, so one f32 tensor exists at a time)."""
    from ..io import safetensors as st
    folder = os.fspath(folder)
    cfg = _config_of(folder, n_ctx)
    tensors, origin = {}, {}
    for path in _shard_files(folder):
        for name, t in st.load(path).items():
            if name in origin:
                raise ValueError(f"Llama.from_pretrained: tensor {name!r} is in both "
                                 f"{origin[name]} and {path}")
            tensors[name], origin[name] = t, path
    return cfg, tensors


def read_safetensors(path_or_bytes, cfg: LlamaConfig | None) -> tuple[LlamaConfig, dict]:
    from ..io import safetensors as st
    tensors = st.load(path_or_bytes)
    if cfg is None:
        recorded = tensors.metadata.get(META_KEY)
        if not recorded:
            raise ValueError("Llama.from_safetensors: the file records no config (metadata "
                             f"{META_KEY!r}); pass cfg=LlamaConfig.from_hf(config.json as a dict)")
        d = json.loads(recorded)
        cfg = LlamaConfig.from_hf(d, n_ctx=d.pop("webgrad_n_ctx", None))
    return cfg, dict(tensors)          # StoredTensors: converted by to_f32


def write_safetensors(cfg: LlamaConfig, sd: dict, dst, metadata: dict | None):
    from ..io import safetensors as st
    recorded = json.dumps({**cfg.to_hf(), "webgrad_n_ctx": cfg.n_ctx}, default=str)
    meta = {"format": "pt", META_KEY: recorded, **(metadata or {})}
    if dst is None:
        return st.dumps(sd, metadata=meta)
    st.save(sd, dst, metadata=meta)


def write_pretrained(cfg: LlamaConfig, sd: dict, folder) -> None:
    from ..io import safetensors as st
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        # the weights are f32 here, whatever dtype the source config named (5.x: "dtype")
        json.dump({**cfg.to_hf(), "torch_dtype": "float32", "dtype": "float32"}, f, indent=2,
                  default=str)
    st.save(sd, os.path.join(folder, _SINGLE), metadata={"format": "pt"})
