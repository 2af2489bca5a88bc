"""GPT-2's image for the browser's model cache: what a loaded GPT2's GPU holds, and back.

Loading GPT-2 weights in the browser costs a download, a parse (safetensors' F16 widened,
GGUF's blocks transcoded or dequantized) and an upload. The *image* of a loaded model is what the GPU holds
after all that: one tensor per parameter, in GPT2's names and layouts (one full "wte.weight":
a device that splits the token table into row blocks does so on upload, so an image serves
every device). A weight held as f32 is its f32 values; a weight held quantized (a GGUF's
blocks of a type in webgrad.quants.FORMATS, GPT2.quant_full) is its GPU words
(quants/words.py's layout, the file's size), so a Q4_K model takes 1/7 of its f32 bytes in
IndexedDB as on the GPU, and restoring it
writes the words as they are: no parse, no transcoding (on WebGPU one upload of the cache's
JS bytes; the tensors' format and its checks are models/cache_image.py's, which
llama_cache.py shares). Cached, an image turns the next load of the same file into an
upload. The cache itself (IndexedDB records, lookups by URL, file or
bytes, the phases' progress) is io/modelcache.py, which knows no model: GPT2_IMAGES tells it
how GPT-2's images are made, restored and parsed.

Pure Python, any backend (CPython too; the tests check the round trip here):

    meta, parts = await image_async(model)   # meta: {format, model, config, tensors, nbytes},
                                             # tensors: [{name, dtype, shape, offset, nbytes}]
                                             # (dtype "f32", or "words" with quant: {qtype,
                                             # shape, transposed}, the QuantSpec; shape is
                                             # always the parameter's declared shape);
                                             # parts: one bytes-like per tensor, in that order
    model = restore(meta, data, backend=...) # data: the parts back to back; every field is
                                             # checked before anything is written

In the browser worker, through the cache (io/modelcache.py says what info and progress hold):

    model, info = await load_gpt2_async(source, backend="auto", progress=fn)
        source: a URL, a JS File or Blob, or bytes (with name=...); safetensors or GGUF, told
        apart by the magic bytes
    model, info = await load_key_async(key, backend="auto", progress=fn)     # a listed entry
    info = await store_async(model, name=..., kind="trained")   # any GPT2, e.g. one trained here

Consumers: the surprisal page (web/surprisal.mjs) and tests/browser/test_modelcache_page.py.
"""
from __future__ import annotations

from dataclasses import asdict
from math import prod

from ..io import modelcache
from ..io.modelcache import ImageFormat, ModelCacheError
from . import cache_image
from .gpt2 import GPT2, GPT2Config, param_shapes

FORMAT = 2     # 2: quantized weights as their GPU words (1 held every weight as f32)


async def image_async(model) -> tuple[dict, list]:
    """(meta, parts) of a GPT2 on any backend: f32 parameters read back as f32 bytes, quantized
    ones as their GPU words (whole tensors: a split token table is joined)."""
    entries, parts = await cache_image.tensors_async(model, param_shapes(model.cfg),
                                                     model.wte_chunks)
    at = 0
    for e in entries:
        e["offset"] = at
        at += e["nbytes"]
    meta = {"format": FORMAT, "model": "gpt2", "config": asdict(model.cfg), "tensors": entries,
            "nbytes": at}
    return meta, parts


def restore(meta: dict, data, backend="auto", *, progress=None, what: str = "<image>"):
    """A GPT2 on `backend` from an image (meta as image_async wrote it, data the tensors back
    to back: a bytes-like, or in the worker the JS Uint8Array itself, whose views go to the
    GPU as they are). progress(done, total) hears the bytes written. Raises
    ModelCacheError naming `what` and the field at fault; nothing is built before every field
    has been checked."""

    def fail(field, msg):
        raise ModelCacheError(f"model cache entry {what}: {field}: {msg}")

    if not isinstance(meta, dict):
        fail("meta", f"expected a dict, got {type(meta).__name__}")
    if meta.get("format") != FORMAT:
        fail("format", f"{meta.get('format')!r}; this webgrad reads format {FORMAT}")
    if meta.get("model") != "gpt2":
        fail("model", f"{meta.get('model')!r}; only 'gpt2' images exist")
    try:
        cfg = GPT2Config(**meta.get("config", {}))
    except (TypeError, ValueError) as e:
        fail("config", str(e))
    want = param_shapes(cfg)
    size, piece = cache_image.pieces(data)
    got, quant = cache_image.check(meta.get("tensors"), want, size, fail)
    model = GPT2(cfg, backend, quant=quant)
    cache_image.write(model, want, got, quant, piece,
                      write_f32=lambda n, h: model.write_weights({n: h}), progress=progress)
    return model


async def parse_async(data: bytes, backend="auto", *, progress=None):
    """A GPT2 from a file's bytes: GGUF when they start with its magic, else safetensors."""
    if bytes(data[:4]) == b"GGUF":
        return await GPT2.from_gguf_async(data, backend, progress=progress), "gguf"
    return GPT2.from_safetensors(data, backend=backend, progress=progress), "safetensors"


def nbytes(model) -> int:
    """The image's size (quantized weights as their words)."""
    q = model.quant_full
    return 4 * sum(q[n].words if n in q else prod(s) for n, s in param_shapes(model.cfg).items())


GPT2_IMAGES = ImageFormat(image_async=image_async, restore=restore, parse_async=parse_async,
                          nbytes=nbytes)


async def load_gpt2_async(source, *, backend="auto", name: str | None = None, progress=None):
    """(GPT2, info) from a URL, a JS File/Blob or bytes, through the cache (module header)."""
    return await modelcache.load_async(source, GPT2_IMAGES, backend=backend, name=name,
                                       progress=progress)


async def load_key_async(key: str, *, backend="auto", progress=None):
    """(GPT2, info) of the cached entry `key` (one of modelcache.list_async()'s)."""
    return await modelcache.load_key_async(key, GPT2_IMAGES, backend=backend, progress=progress)


async def store_async(model, *, name: str, kind: str = "trained", progress=None) -> dict:
    """Keep `model` (e.g. one trained in the worker) in the cache: listed, reloadable by key."""
    return await modelcache.store_async(model, GPT2_IMAGES, name=name, kind=kind,
                                        progress=progress)


__all__ = ["FORMAT", "GPT2_IMAGES", "ModelCacheError", "image_async", "restore", "parse_async",
           "nbytes", "load_gpt2_async", "load_key_async", "store_async"]
