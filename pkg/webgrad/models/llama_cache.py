"""A Llama and its tokenizer as an image for the browser's model cache (io/modelcache.py), as
gpt2_cache.py is GPT-2's: the chat page keeps its models (the demo model, a picked folder or
GGUF file, a fine-tuned one) with it and loads them back without download, parse or
transcode.

    item = Chat(model, tokenizer_json_bytes, tokenizer_config_dict)
    item = Chat(model, b"", {}, gguf=file_bytes)                  # a model loaded from GGUF
    info = await store_async(item, name=..., kind="llama")        # in the worker
    item, info = await load_key_async(key, backend="auto")        # a listed entry
    meta, parts = await image_async(item); item = restore(meta, data, backend)   # any Python

The image (format 2) is what the GPU holds after a load (models/cache_image.py): every
parameter in transformers' names, whole, as f32 values or, held quantized (a GGUF file's
blocks), as its GPU words with its QuantSpec; the q/k rows already in transformers' order.
Then the tokenizer as one more part (dtype "bytes": meta stays small, the cache lists
entries without reading it): "tokenizer.json" with meta's tokenizer_config, or for a model
from GGUF (meta["source"] = "gguf") "tokenizer.gguf", the file's metadata as a GGUF file of
no tensors (io/gguf.metadata_only), which Chat.tokenizer() reads when asked. Meta holds the
LlamaConfig. Restoring uploads the bytes as they are: on WebGPU one plan of buffers, no
kernel, no host pass over the weights.

Format 1 kept a GGUF model as its whole file, re-parsed and laid out again on every restore
(seconds in the worker); such an entry is refused (ModelCacheError: load the file again). A
format-1 entry of f32 weights has the layout format 2 gives it, and is read as it is.
"""
from __future__ import annotations

from dataclasses import asdict
from math import prod
from typing import NamedTuple

from ..io import gguf as gguf_io
from ..io import modelcache
from ..io.modelcache import ImageFormat, ModelCacheError
from . import cache_image
from .llama import Llama, param_shapes
from .llama_config import LlamaConfig
from .tokenizer import Tokenizer

FORMAT = 2     # 2: the GPU's words and f32 values (1 kept a GGUF model as its file)


class Chat(NamedTuple):
    model: Llama
    tokenizer_json: bytes
    tokenizer_config: dict
    gguf: bytes | None = None     # the GGUF file the model came from, or its metadata alone
                                  # (a restored entry): where its tokenizer is read from

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


def _tokenizer_part(item: Chat) -> tuple[str, bytes]:
    if item.gguf is not None:
        return "tokenizer.gguf", gguf_io.metadata_only(item.gguf)
    return "tokenizer.json", bytes(item.tokenizer_json)


async def image_async(item: Chat) -> tuple[dict, list]:
    """(meta, parts) of a Chat on any backend: its weights read back as the GPU holds them,
    then its tokenizer's bytes."""
    m = item.model
    entries, parts = await cache_image.tensors_async(m, param_shapes(m.cfg), m.table_chunks)
    name, tok = _tokenizer_part(item)
    entries.append({"name": name, "dtype": "bytes", "shape": [len(tok)], "nbytes": len(tok)})
    parts.append(tok)
    at = 0
    for e in entries:
        e["offset"] = at
        at += e["nbytes"]
    meta = {"format": FORMAT, "model": "llama", "config": _config_dict(m.cfg),
            "tensors": entries, "nbytes": at}
    if item.gguf is not None:
        meta["source"] = "gguf"
    else:
        meta["tokenizer_config"] = item.tokenizer_config
    return meta, parts


def restore(meta: dict, data, backend="auto", *, progress=None, what: str = "<image>") -> Chat:
    """A Chat on `backend` from an image (meta as image_async wrote it, data the parts back
    to back: a bytes-like, or in the worker the JS Uint8Array itself, whose views go to the
    GPU as they are). progress(done, total) hears the weight bytes written. Raises
    ModelCacheError naming `what` and the field at fault; nothing is built before every field
    has been checked."""
    def fail(field, msg):
        raise ModelCacheError(f"model cache entry {what}: {field}: {msg}")

    if not isinstance(meta, dict) or meta.get("model") != "llama":
        fail("model", f"{meta.get('model') if isinstance(meta, dict) else meta!r}; expected 'llama'")
    gguf = meta.get("source") == "gguf"
    if meta.get("format") == 1 and gguf:
        fail("format", "1: kept as its GGUF file by an older webgrad, which this one no longer "
                       "reads; load the .gguf file again (it is kept in the new format)")
    if meta.get("format") not in (1, FORMAT):
        fail("format", f"{meta.get('format')!r}; this webgrad reads format {FORMAT}")
    try:
        cfg = LlamaConfig(**{k: tuple(v) if k in ("rope_freq_factors",) and v is not None else v
                             for k, v in meta.get("config", {}).items()})
    except (TypeError, ValueError) as e:
        fail("config", str(e))
    want = param_shapes(cfg)
    tok_name = "tokenizer.gguf" if gguf else "tokenizer.json"
    size, piece = cache_image.pieces(data)
    got, quant = cache_image.check(meta.get("tensors"), want, size, fail, extra=(tok_name,))
    t = got[tok_name]
    tok = bytes(cache_image.as_bytes(piece(t["offset"], t["nbytes"])))
    model = Llama(cfg, backend, quant=quant)
    cache_image.write(model, want, got, quant, piece, write_f32=model.write_weight,
                      progress=progress)
    if gguf:
        return Chat(model, b"", {}, gguf=tok)
    return Chat(model, tok, dict(meta.get("tokenizer_config") or {}))


async def _parse_async(data, backend="auto", *, progress=None):
    raise ValueError("a Llama is kept in the model cache from the chat page (store_async), "
                     "not loaded through it from one file")


def nbytes(item: Chat) -> int:
    """The image's size: the weights as the GPU holds them, and the tokenizer's bytes."""
    q = item.model.quant_full
    weights = 4 * sum(q[n].words if n in q else prod(s)
                      for n, s in param_shapes(item.model.cfg).items())
    return weights + len(_tokenizer_part(item)[1])


LLAMA_IMAGES = ImageFormat(image_async=image_async, restore=restore, parse_async=_parse_async,
                           nbytes=nbytes)


async def store_async(item: Chat, *, name: str, kind: str = "llama", progress=None) -> dict:
    return await modelcache.store_async(item, LLAMA_IMAGES, name=name, kind=kind, progress=progress)


async def load_key_async(key: str, *, backend="auto", progress=None):
    return await modelcache.load_key_async(key, LLAMA_IMAGES, backend=backend, progress=progress)


__all__ = ["Chat", "FORMAT", "LLAMA_IMAGES", "image_async", "restore", "nbytes", "store_async",
           "load_key_async"]
