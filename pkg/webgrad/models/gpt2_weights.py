"""GPT-2 weights in and out: state dicts checked against the config, model.safetensors read
(the config from its metadata or its shapes) and written back, a GGUF file's shapes checked
before a model is built from it.

Names and layouts are transformers' GPT2LMHeadModel ones (see gpt2.py), with or without the
"transformer." prefix. Accepted as ignorable: "lm_head.weight" (tied to wte) and the
attention mask buffers older transformers versions saved (".attn.bias", ".attn.masked_bias").
Every check runs before anything is written, so a refused file or state dict changes nothing.

gpt2.py's GPT2 calls these; they take the parameter shapes (gpt2.param_shapes) and, where a
config is made from a file, the config's type (gpt2.GPT2Config) as arguments, since gpt2.py
imports this module. Tensors may be F32, F16 or BF16 in files (io/safetensors.py widens them
to f32), and numpy arrays, torch tensors, array.array or memoryviews in state dicts.
"""
from __future__ import annotations

import json
from dataclasses import asdict, fields

from ..arrays import to_host
from .decoding import as_f32_array

META_KEY = "webgrad.gpt2_config"  # safetensors metadata: the config, as JSON
_MASKS = (".attn.bias", ".attn.masked_bias")   # buffers, not weights


def strip(name: str) -> str:
    """A transformers name without GPT2LMHeadModel's "transformer." prefix."""
    return name[len("transformer."):] if name.startswith("transformer.") else name


def check_state_dict(cfg, shapes: dict, state_dict) -> dict:
    """{name without the prefix: value} of a state dict that has every name of `shapes` and
    no other (lm_head.weight and mask buffers ignored); ValueError listing the misfits."""
    sd = {strip(k): v for k, v in state_dict.items()}
    ignored = {k for k in sd if k == "lm_head.weight" or k.endswith(_MASKS)}
    unknown = sorted(set(sd) - set(shapes) - ignored)
    missing = sorted(set(shapes) - set(sd))
    if unknown or missing:
        raise ValueError(f"GPT2.from_hf_state_dict: unknown {unknown[:5]} / missing {missing[:5]} "
                         f"for {cfg}")
    return sd


def to_f32(sd: dict, shapes: dict) -> dict:
    """Each weight of `shapes` as an f32 HostArray of its shape (ValueError naming the weight
    whose values do not fit)."""
    return {n: to_host(as_f32_array(sd[n]), shape=s, dtype="f32", what=f"GPT-2 weight '{n}'")
            for n, s in shapes.items()}


def read_safetensors(path_or_bytes, cfg, config_type, param_shapes, progress=None
                     ) -> tuple[object, dict]:
    """(config, {name: f32 HostArray}) of a GPT-2 model.safetensors. Without cfg: the config
    recorded in the metadata (write_safetensors), else one made from the shapes (vocab,
    n_ctx, n_embd, n_layer; n_head = n_embd / 64, as in every released GPT-2 size).
    config_type(**fields) makes a config, param_shapes(cfg) gives its parameters' shapes;
    progress(done, total) hears the tensor bytes read so far."""
    from ..io import safetensors as st
    tensors = st.load(path_or_bytes)
    sd = {strip(name): t for name, t in tensors.items() if not strip(name).endswith(_MASKS)}
    recorded = getattr(tensors, "metadata", {}).get(META_KEY)
    if cfg is None and recorded:
        cfg = recorded_config(recorded, tensors.name, config_type)
    if cfg is None:
        V, D = shape_of(tensors, "wte.weight")
        n_ctx = shape_of(tensors, "wpe.weight")[0]
        layers = {int(k.split(".")[1]) for k in sd if k.startswith("h.") and
                  k.split(".")[1].isdigit()}
        cfg = config_type(n_layer=len(layers), n_head=max(1, D // 64), n_embd=D, n_ctx=n_ctx,
                          vocab_size=V)
    # the config against the tensors in the file, before anything is built from it (the
    # layer count first: param_shapes walks every layer)
    layers = {k.split(".")[1] for k in sd if k.startswith("h.")}
    if len(layers) != cfg.n_layer or layers != {str(i) for i in range(cfg.n_layer)}:
        raise st.SafetensorsError(
            f"safetensors file {tensors.name}: the config says n_layer={cfg.n_layer} but "
            f"the file holds {len(layers)} layers (h.0 ...); pass the right cfg= or fix "
            f"metadata {META_KEY!r}")
    shapes = param_shapes(cfg)
    bad = sorted(n for n in shapes if n in sd and tuple(sd[n].shape) != shapes[n])
    missing = sorted(set(shapes) - set(sd))
    if bad or missing:
        n = (bad or missing)[0]
        got = f"shape {list(sd[n].shape)}" if n in sd else "no such tensor"
        raise st.SafetensorsError(
            f"safetensors file {tensors.name}: the config {cfg} needs {n!r} of shape "
            f"{list(shapes[n])}, the file has {got} ({len(bad)} wrong shapes, "
            f"{len(missing)} missing); pass the right cfg= or fix metadata {META_KEY!r}")
    done, total = 0, sum(t.nbytes for t in sd.values())
    for n, t in sd.items():
        sd[n] = t.to_host()   # f32 HostArrays (F16/BF16 widened); checked by check_state_dict
        done += t.nbytes
        if progress is not None:
            progress(done, total)
    return cfg, sd


def write_safetensors(cfg, sd: dict, dst, metadata: dict | None):
    """sd (transformers' names) as a model.safetensors recording cfg in its metadata, written
    to `dst` (a path or binary file), or its bytes when dst is None."""
    from ..io import safetensors as st
    meta = {"format": "pt", META_KEY: json.dumps(asdict(cfg)), **(metadata or {})}
    if dst is None:
        return st.dumps(sd, metadata=meta)
    st.save(sd, dst, metadata=meta)


def check_gguf_shapes(f, cfg, shapes: dict) -> None:
    """Every tensor of a gpt2 GGUF has the shape cfg gives it (`shapes`; GGUFError naming the
    tensor), and none is missing, before a model is built from the file."""
    from ..io import gguf
    from .gpt2_gguf import tensors as gguf_tensors
    tensors = gguf_tensors(f)
    for hf, (t, transposed) in tensors.items():
        want = shapes["wte.weight" if hf == "lm_head.weight" else hf]
        got = tuple(reversed(t.shape)) if transposed else tuple(t.shape)
        if got != tuple(want):
            raise gguf.GGUFError(f"GGUF file {f.name}: tensor {t.name!r} has shape "
                                 f"{list(t.shape)}; the metadata's config ({cfg}) needs "
                                 f"{list(reversed(want)) if transposed else list(want)}")
    missing = sorted(set(shapes) - set(tensors))
    if missing:
        raise gguf.GGUFError(f"GGUF file {f.name}: missing {', '.join(missing[:5])} for {cfg}")


def recorded_config(recorded: str, file: str, config_type):
    """The config write_safetensors wrote into a file's metadata, checked (SafetensorsError
    naming the file and the key)."""
    from ..io.safetensors import SafetensorsError
    where = f"safetensors file {file}: metadata {META_KEY!r}"
    try:
        values = json.loads(recorded)
    except ValueError as e:
        raise SafetensorsError(f"{where}: not JSON ({e}); pass cfg= or rewrite the file with "
                               "GPT2.save_safetensors") from None
    known = {f.name for f in fields(config_type)}
    if not isinstance(values, dict) or set(values) - known:
        extra = sorted(set(values) - known) if isinstance(values, dict) else type(values).__name__
        raise SafetensorsError(f"{where}: must be an object of {config_type.__name__}'s fields "
                               f"({', '.join(sorted(known))}), got {extra}; pass cfg=")
    try:
        return config_type(**values)
    except ValueError as e:
        raise SafetensorsError(f"{where}: {e}; pass cfg=") from None


def shape_of(tensors, name):
    """The 2-D shape of tensor `name` of a safetensors file (SafetensorsError otherwise)."""
    from ..io.safetensors import SafetensorsError
    for k, t in tensors.items():
        if strip(k) == name:
            if len(t.shape) != 2:
                raise SafetensorsError(f"safetensors file {tensors.name}: tensor {k!r} has shape "
                                       f"{list(t.shape)}; a GPT-2 {name} is 2-D")
            return tuple(t.shape)
    raise SafetensorsError(f"safetensors file {tensors.name}: no tensor {name!r}: not a GPT-2 "
                           "checkpoint")


__all__ = ["META_KEY", "strip", "check_state_dict", "to_f32", "read_safetensors",
           "write_safetensors", "check_gguf_shapes", "recorded_config", "shape_of"]
