"""A Llama and its tokenizer as an image for the browser's model cache (io/modelcache.py), as
gpt2_cache.py is GPT-2's: the chat page keeps its models (the demo model, a picked folder, a
fine-tuned one) with it and loads them back without download or parse.

    item = Chat(model, tokenizer_json_bytes, tokenizer_config_dict)
    item = Chat(model, b"", {}, gguf=file_bytes)                  # a model loaded from GGUF
    info = await store_async(item, name=..., kind="llama")        # in the worker
    item, info = await load_key_async(key, backend="webgpu")      # a listed entry
    meta, parts = await image_async(item); item = restore(meta, data, backend)   # any Python

The image: every parameter in transformers' names as f32 (a split token table joined, as
Llama.state_dict_async gives it), then the tokenizer.json's bytes as one more part (dtype
"bytes": meta stays small, the cache lists entries without reading it); meta holds the
LlamaConfig and tokenizer_config.json.

A model loaded from a GGUF file (quantized or not) is kept as the file itself: one part,
"model.gguf" (dtype "bytes"), meta["source"] = "gguf". Its blocks go to the GPU as they are
(Llama.from_gguf keeps them quantized) and its tokenizer is read from the same metadata, so
a hit costs a read and a parse of the header, no download. Other models holding quantized
weights are not imaged: store_async refuses them, saying so.
"""
from __future__ import annotations

from dataclasses import asdict
from math import prod
from typing import NamedTuple

from ..arrays import HostArray
from ..io import modelcache
from ..io.modelcache import ImageFormat, ModelCacheError
from .llama import Llama, param_shapes
from .llama_config import LlamaConfig
from .tokenizer import Tokenizer

FORMAT = 1


class Chat(NamedTuple):
    model: Llama
    tokenizer_json: bytes
    tokenizer_config: dict
    gguf: bytes | None = None     # the GGUF file the model was loaded from (kept as it is)

    def tokenizer(self) -> Tokenizer:
        if self.gguf is not None:
            return Tokenizer.from_gguf(self.gguf)
        from .tokenizer_extras import apply_config
        tok = Tokenizer.from_file(self.tokenizer_json)
        apply_config(tok, self.tokenizer_config, "tokenizer_config.json")
        return tok


def _config_dict(cfg: LlamaConfig) -> dict:
    d = asdict(cfg)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def _gguf_image(item: Chat) -> tuple[dict, list]:
    data = memoryview(item.gguf).cast("B")
    tensors = [{"name": "model.gguf", "dtype": "bytes", "shape": [data.nbytes], "offset": 0,
                "nbytes": data.nbytes}]
    return {"format": FORMAT, "model": "llama", "source": "gguf", "config": _config_dict(item.model.cfg),
            "tensors": tensors, "nbytes": data.nbytes}, [data]


async def image_async(item: Chat) -> tuple[dict, list]:
    m = item.model
    if item.gguf is not None:
        return _gguf_image(item)
    if m.quant_full:
        raise ValueError("this model holds quantized weights, which the model cache does not "
                         "keep for Llama models yet; it is used all the same")
    sd = await m.state_dict_async()
    tensors, parts, at = [], [], 0
    for name, shape in param_shapes(m.cfg).items():
        view = memoryview(sd[name]).cast("B")
        tensors.append({"name": name, "dtype": "f32", "shape": list(shape), "offset": at,
                        "nbytes": view.nbytes})
        parts.append(view)
        at += view.nbytes
    tj = bytes(item.tokenizer_json)
    tensors.append({"name": "tokenizer.json", "dtype": "bytes", "shape": [len(tj)],
                    "offset": at, "nbytes": len(tj)})
    parts.append(tj)
    meta = {"format": FORMAT, "model": "llama", "config": _config_dict(m.cfg),
            "tokenizer_config": item.tokenizer_config, "tensors": tensors, "nbytes": at + len(tj)}
    return meta, parts


def restore(meta: dict, data, backend="auto", *, progress=None, what: str = "<image>") -> Chat:
    def fail(field, msg):
        raise ModelCacheError(f"model cache entry {what}: {field}: {msg}")

    if not isinstance(meta, dict) or meta.get("model") != "llama":
        fail("model", f"{meta.get('model') if isinstance(meta, dict) else meta!r}; expected 'llama'")
    if meta.get("format") != FORMAT:
        fail("format", f"{meta.get('format')!r}; this webgrad reads format {FORMAT}")
    try:
        cfg = LlamaConfig(**{k: tuple(v) if k in ("rope_freq_factors",) and v is not None else v
                             for k, v in meta.get("config", {}).items()})
    except (TypeError, ValueError) as e:
        fail("config", str(e))
    if hasattr(data, "subarray"):     # a JS typed array (JsProxy)
        size = int(data.length)

        def piece(off, n):
            return data.subarray(off, off + n).to_bytes()
    else:
        data = memoryview(data).cast("B")
        size = data.nbytes

        def piece(off, n):
            return bytes(data[off:off + n])
    if meta.get("source") == "gguf":
        return _restore_gguf(meta, cfg, piece, size, backend, progress, fail)
    got = {t.get("name"): t for t in meta.get("tensors") or [] if isinstance(t, dict)}
    want = param_shapes(cfg)
    missing = sorted((set(want) | {"tokenizer.json"}) - set(got))
    if missing:
        fail("tensors", f"missing {missing[:5]}")
    sd = {}
    for name, shape in want.items():
        t = got[name]
        off, n = t.get("offset"), t.get("nbytes")
        if t.get("dtype") != "f32" or list(t.get("shape") or ()) != list(shape):
            fail(f"tensors[{name!r}]", f"{t.get('dtype')}{t.get('shape')}; {cfg.model_type} "
                                        f"needs f32{list(shape)}")
        if not (isinstance(off, int) and n == 4 * prod(shape) and 0 <= off and off + n <= size):
            fail(f"tensors[{name!r}].offset", f"{off!r} (+{n!r} bytes) is not inside the "
                                               f"{size} bytes of data")
        h = HostArray("f32", shape=shape)
        h.frombytes(piece(off, n))
        sd[name] = h
    t = got["tokenizer.json"]
    tj = piece(t["offset"], t["nbytes"])
    model = Llama.from_hf_state_dict(cfg, sd, backend=backend)
    if progress is not None:
        progress(size, size)
    return Chat(model, tj, dict(meta.get("tokenizer_config") or {}))


def _restore_gguf(meta, cfg, piece, size, backend, progress, fail) -> Chat:
    t = next((t for t in meta.get("tensors") or [] if isinstance(t, dict)
              and t.get("name") == "model.gguf"), None)
    if t is None or t.get("dtype") != "bytes":
        fail("tensors", "a GGUF entry holds one 'model.gguf' part of dtype 'bytes'")
    off, n = t.get("offset"), t.get("nbytes")
    if not (isinstance(off, int) and isinstance(n, int) and 0 <= off and off + n <= size):
        fail("tensors['model.gguf'].offset", f"{off!r} (+{n!r} bytes) is not inside the {size} "
                                             "bytes of data")
    blob = piece(off, n)
    model = Llama.from_gguf(blob, backend=backend)
    if model.cfg != cfg:
        fail("config", "differs from the one the kept GGUF file gives")
    if progress is not None:
        progress(size, size)
    return Chat(model, b"", {}, gguf=blob)


async def _parse_async(data, backend="auto", *, progress=None):
    raise ValueError("a Llama is kept in the model cache from the chat page (store_async), "
                     "not loaded through it from one file")


def nbytes(item: Chat) -> int:
    if item.gguf is not None:
        return memoryview(item.gguf).nbytes
    return 4 * sum(prod(s) for s in param_shapes(item.model.cfg).values()) + len(item.tokenizer_json)


LLAMA_IMAGES = ImageFormat(image_async=image_async, restore=restore, parse_async=_parse_async,
                           nbytes=nbytes)


async def store_async(item: Chat, *, name: str, kind: str = "llama", progress=None) -> dict:
    return await modelcache.store_async(item, LLAMA_IMAGES, name=name, kind=kind, progress=progress)


async def load_key_async(key: str, *, backend="webgpu", progress=None):
    return await modelcache.load_key_async(key, LLAMA_IMAGES, backend=backend, progress=progress)


__all__ = ["Chat", "FORMAT", "LLAMA_IMAGES", "image_async", "restore", "nbytes", "store_async",
           "load_key_async"]
