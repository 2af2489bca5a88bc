"""GPT-2's image for the browser's model cache: what a loaded GPT2's GPU holds, and back.

Loading GPT-2 weights in the browser costs a download, a parse (safetensors' F16 widened,
GGUF's blocks transcoded or dequantized) and an upload. The *image* of a loaded model is what the GPU holds
after all that: one tensor per parameter, in GPT2's names and layouts (one full "wte.weight":
a device that splits the token table into row blocks does so on upload, so an image serves
every device). A weight held as f32 is its f32 values; a weight held quantized (a GGUF's
blocks of a type in webgrad.quants.FORMATS, GPT2.quant_full) is its GPU words
(quants/words.py's layout, the file's size), so a Q4_K model takes 1/7 of its f32 bytes in
IndexedDB as on the GPU, and restoring it
writes the words as they are: no parse, no transcoding. Cached, an image turns the next load
of the same file into an upload. The cache itself (IndexedDB records, lookups by URL, file or
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

    model, info = await load_gpt2_async(source, backend="webgpu", progress=fn)
        source: a URL, a JS File or Blob, or bytes (with name=...); safetensors or GGUF, told
        apart by the magic bytes
    model, info = await load_key_async(key, backend="webgpu", progress=fn)   # a listed entry
    info = await store_async(model, name=..., kind="trained")   # any GPT2, e.g. one trained here

Consumers: the surprisal page (web/surprisal.mjs) and tests/browser/test_modelcache_page.py.
"""
from __future__ import annotations

from dataclasses import asdict
from math import prod

from ..arrays import HostArray
from ..io import modelcache
from ..io.modelcache import ImageFormat, ModelCacheError
from ..quants import FORMATS, QuantSpec, raw_blocks, transcode
from .gpt2 import GPT2, GPT2Config, param_shapes

FORMAT = 2     # 2: quantized weights as their GPU words (1 held every weight as f32)


async def image_async(model) -> tuple[dict, list]:
    """(meta, parts) of a GPT2 on any backend: f32 parameters read back as f32 bytes, quantized
    ones as their GPU words (whole tensors: a split token table is joined)."""
    tensors, parts, at = [], [], 0
    for name, shape in param_shapes(model.cfg).items():
        q = model.quant_full.get(name)
        if q is None:
            view = memoryview(await _f32(model, name)).cast("B")
            entry = {"name": name, "dtype": "f32", "shape": list(shape)}
        else:
            view = memoryview(await _words(model, name, q)).cast("B")
            entry = {"name": name, "dtype": "words", "shape": list(shape),
                     "quant": {"qtype": q.qtype, "shape": list(q.shape),
                               "transposed": bool(q.transposed)}}
        tensors.append({**entry, "offset": at, "nbytes": view.nbytes})
        parts.append(view)
        at += view.nbytes
    meta = {"format": FORMAT, "model": "gpt2", "config": asdict(model.cfg), "tensors": tensors,
            "nbytes": at}
    return meta, parts


async def _f32(model, name):
    """The f32 values of parameter `name` (a split token table joined), as a HostArray."""
    if name in model.shapes:
        return await model.backend.read(name)
    table = HostArray("f32")
    for k in range(model.wte_chunks):    # blocks of rows: one after the other
        table.extend(await model.backend.read(f"wte.{k}.weight"))
    return table


async def _words(model, name, q) -> bytes:
    """The GPU words of the whole quantized tensor `name`. A token table split into row blocks
    holds each block in its own layout (Q8_0/Q4_0/Q6_K put the blocks' scales after all their quants), so
    the blocks go back to GGUF's blocks, are joined and transcoded as one table."""
    if name in model.quant:
        return (await model.backend.read(name)).tobytes()
    raw = b""
    for k in range(model.wte_chunks):
        n = f"wte.{k}.weight"
        raw += raw_blocks(q.qtype, (await model.backend.read(n)).tobytes(),
                          prod(model.quant[n].shape))
    return transcode(q.qtype, raw)


def restore(meta: dict, data, backend="auto", *, progress=None, what: str = "<image>"):
    """A GPT2 on `backend` from an image (meta as image_async wrote it, data the tensors back
    to back: a bytes-like, or in the worker the JS Uint8Array itself, then copied into Python
    one tensor at a time). progress(done, total) hears the bytes written. Raises
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
    tensors = meta.get("tensors")
    if not isinstance(tensors, list) or not all(isinstance(t, dict) for t in tensors):
        fail("tensors", "expected a list of {name, dtype, shape, offset, nbytes}")
    got = {t.get("name"): t for t in tensors}
    missing, unknown = sorted(set(want) - set(got)), sorted(set(got) - set(want), key=str)
    if missing or unknown or len(got) != len(tensors):
        fail("tensors", f"missing {missing[:5]}, unknown {unknown[:5]}, "
                        f"{len(tensors) - len(got)} duplicated, for {cfg}")
    if hasattr(data, "subarray"):     # a JS typed array (JsProxy)
        size = int(data.length)

        def piece(off, n):
            return data.subarray(off, off + n).to_bytes()   # the JsProxy goes with its refcount
    else:
        data = memoryview(data).cast("B")
        size = data.nbytes

        def piece(off, n):
            return data[off:off + n]
    quant = {}
    for name, shape in want.items():
        t = got[name]
        field = f"tensors[{name!r}]"
        if t.get("dtype") not in ("f32", "words"):
            fail(f"{field}.dtype", f"{t.get('dtype')!r}; expected 'f32' or 'words'")
        if list(t.get("shape") or ()) != list(shape):
            fail(f"{field}.shape", f"{t.get('shape')}; {cfg} needs {list(shape)}")
        off, n = t.get("offset"), t.get("nbytes")
        if t["dtype"] == "words":
            q = quant[name] = _quant_spec(t.get("quant"), shape, f"{field}.quant", fail)
            need, what_ = 4 * q.words, f"{q.qtype}{list(q.shape)}'s words"
        else:
            need, what_ = 4 * prod(shape), f"f32{list(shape)}"
        if not (isinstance(off, int) and isinstance(n, int)) or n != need:
            fail(f"{field}.nbytes", f"{n!r}; {what_} need {need}")
        if off < 0 or off % 4 or off + n > size:
            fail(f"{field}.offset", f"{off!r} (+{n} bytes) is not a 4-aligned range "
                                    f"inside the {size} bytes of data")
    model = GPT2(cfg, backend, quant=quant)
    done, total = 0, sum(got[n]["nbytes"] for n in want)
    if progress is not None:
        progress(0, total)
    for name, shape in want.items():
        t, q = got[name], quant.get(name)
        if q is None:
            h = HostArray("f32", shape=shape)
            h.frombytes(piece(t["offset"], t["nbytes"]))
            model.write_weights({name: h})
        elif name in model.quant:     # the words as the GPU takes them: written as they are
            h = HostArray("i32", shape=(q.words,))
            h.frombytes(piece(t["offset"], t["nbytes"]))
            model.backend.write(name, h)
        else:                         # a token table this device splits: each block its layout
            model.write_blocks(name, raw_blocks(q.qtype, piece(t["offset"], t["nbytes"]),
                                                prod(q.shape)))
        done += t["nbytes"]
        if progress is not None:
            progress(done, total)
    return model


def _quant_spec(q, shape, field, fail):
    """The QuantSpec a tensor's meta describes, each field checked (fail names it)."""
    if not isinstance(q, dict):
        fail(field, f"expected {{qtype, shape, transposed}} for dtype 'words', got {q!r}")
    qtype, qshape, transposed = q.get("qtype"), q.get("shape"), q.get("transposed")
    if qtype not in FORMATS:
        fail(f"{field}.qtype", f"{qtype!r}; kept quantized are {', '.join(FORMATS)}")
    if not isinstance(transposed, bool):
        fail(f"{field}.transposed", f"{transposed!r}; expected true or false")
    if not (isinstance(qshape, list) and qshape
            and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in qshape)):
        fail(f"{field}.shape", f"{qshape!r}; expected a list of positive sizes")
    try:
        spec = QuantSpec(qtype, tuple(qshape), transposed)
    except ValueError as e:
        fail(f"{field}.shape", str(e))
    if spec.declared_shape != tuple(shape):
        # the stored shape fits the other way round: it is `transposed` that is wrong
        flipped = tuple(qshape) if transposed else tuple(reversed(qshape))
        which = "transposed" if flipped == tuple(shape) else "shape"
        fail(f"{field}.{which}", f"{qshape}{' transposed' if transposed else ''} is not the "
                                 f"parameter's {list(shape)}")
    return spec


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


async def load_gpt2_async(source, *, backend="webgpu", name: str | None = None, progress=None):
    """(GPT2, info) from a URL, a JS File/Blob or bytes, through the cache (module header)."""
    return await modelcache.load_async(source, GPT2_IMAGES, backend=backend, name=name,
                                       progress=progress)


async def load_key_async(key: str, *, backend="webgpu", progress=None):
    """(GPT2, info) of the cached entry `key` (one of modelcache.list_async()'s)."""
    return await modelcache.load_key_async(key, GPT2_IMAGES, backend=backend, progress=progress)


async def store_async(model, *, name: str, kind: str = "trained", progress=None) -> dict:
    """Keep `model` (e.g. one trained in the worker) in the cache: listed, reloadable by key."""
    return await modelcache.store_async(model, GPT2_IMAGES, name=name, kind=kind,
                                        progress=progress)


__all__ = ["FORMAT", "GPT2_IMAGES", "ModelCacheError", "image_async", "restore", "parse_async",
           "nbytes", "load_gpt2_async", "load_key_async", "store_async"]
