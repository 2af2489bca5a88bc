"""A loaded model's GPU image, and the browser cache that keeps it (IndexedDB).

Loading GPT-2 weights in the browser costs a download, a parse (safetensors' F16 widened,
GGUF's blocks transcoded or dequantized) and an upload. The *image* of a loaded model is what the GPU holds
after all that: one tensor per parameter, in GPT2's names and layouts (one full "wte.weight":
a device that splits the token table into row blocks does so on upload, so an image serves
every device). A weight held as f32 is its f32 values; a weight held quantized (a GGUF's
blocks of a type in webgrad.quants.FORMATS, GPT2.quant_full) is its GPU words
(quants/words.py's layout, the file's size), so a Q4_K model takes 1/7 of its f32 bytes in IndexedDB as on the GPU, and restoring it
writes the words as they are: no parse, no transcoding. Cached, an image turns the next load
of the same file into an upload.

Pure Python, any backend (CPython too; the tests check the round trip here):

    meta, parts = await image_async(model)   # meta: {format, model, config, tensors, nbytes},
                                             # tensors: [{name, dtype, shape, offset, nbytes}]
                                             # (dtype "f32", or "words" with quant: {qtype,
                                             # shape, transposed}, the QuantSpec; shape is
                                             # always the parameter's declared shape);
                                             # parts: one bytes-like per tensor, in that order
    model = restore(meta, data, backend=...) # data: the parts back to back; every field is
                                             # checked before anything is written

In the browser worker (the IndexedDB half, with the record format and the cache key, is
web/modelcache.mjs; the worker exposes it as `webgradModelCache`):

    model, info = await load_gpt2_async(source, backend="webgpu", progress=fn)
        source: a URL (str: a HEAD request's ETag keys the cache, so a hit downloads nothing),
        a JS File or Blob (picked from disk: its SHA-256 keys it), or bytes (with name=...).
        A hit reads the image and uploads it; a miss downloads, parses (safetensors or GGUF,
        told apart by the magic bytes), and stores the image. A cached entry that no longer
        restores (written by another version) is dropped and the file loaded afresh.
        info: {key, name, kind, cached, seconds, phases: {phase: seconds}}, and not_kept
        (why) when the image could not be stored (a full disk, no IndexedDB): the model is
        loaded all the same;
        progress(dict) hears {phase, done, total} (bytes) for the phases "lookup", then
        "hash" / "download" / "parse" / "store" (a miss) or "read" / "upload" (a hit).
    model, info = await load_key_async(key, backend="webgpu", progress=fn)   # a listed entry
    info = await store_async(model, name=..., kind="trained")   # any GPT2, e.g. one trained here
    entries = await list_async();  await remove_async(key);  await clear_async()

Consumers: the surprisal page (web/surprisal.mjs) and tests/browser/test_modelcache_page.py.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import asdict
from math import prod

FORMAT = 2     # 2: quantized weights as their GPU words (1 held every weight as f32)


class ModelCacheError(ValueError):
    """A cache entry that cannot be restored; says which entry and which field."""


# ---------------------------------------------------------------- the image (pure Python)

async def image_async(model) -> tuple[dict, list]:
    """(meta, parts) of a GPT2 on any backend: f32 parameters read back as f32 bytes, quantized
    ones as their GPU words (whole tensors: a split token table is joined)."""
    from ..models.gpt2 import param_shapes
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
    from ..arrays import HostArray
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
    from ..quants import raw_blocks, transcode
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
    from ..arrays import HostArray
    from ..models.gpt2 import GPT2, GPT2Config, param_shapes
    from ..quants import raw_blocks

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
            model._write({name: h})
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
    from ..quants import FORMATS, QuantSpec
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
    from ..models.gpt2 import GPT2
    if bytes(data[:4]) == b"GGUF":
        return await GPT2.from_gguf_async(data, backend, progress=progress), "gguf"
    return GPT2.from_safetensors(data, backend=backend, progress=progress), "safetensors"


# ---------------------------------------------------------------- the cache (browser worker)

def _js_value(v):
    """None for JS null/undefined, else v."""
    try:
        from pyodide.ffi import jsnull
    except ImportError:  # older Pyodide: null arrives as None
        jsnull = None
    return None if v is None or v is jsnull else v


async def _cache():
    """web/modelcache.mjs, imported by the worker on first use."""
    try:
        import js
        get = js.webgradModelCache
    except (ImportError, AttributeError):
        raise RuntimeError("webgrad.io.modelcache: the model cache lives in the browser's "
                           "IndexedDB; use it inside webgrad's Pyodide worker") from None
    return await get()


def _to_js(value):
    import js
    from pyodide.ffi import to_js
    return to_js(value, dict_converter=js.Object.fromEntries, create_pyproxies=False)


def _uint8(view):
    """A JS Uint8Array copy of a bytes-like."""
    import js
    out = js.Uint8Array.new(memoryview(view).nbytes)
    out.assign(view)
    return out


class _Clock:
    """Times each phase (from its first event to the next phase's, or to the end) and forwards
    {phase, done, total} to the caller's progress."""

    def __init__(self, progress):
        self.progress, self.t0, self.phases = progress, time.perf_counter(), {}
        self.current, self.since = None, self.t0

    def _close(self, now):
        if self.current is not None:
            self.phases[self.current] = self.phases.get(self.current, 0.0) + now - self.since
        self.since = now

    def __call__(self, phase, done, total):
        if phase != self.current:
            self._close(time.perf_counter())
            self.current = phase
        if self.progress is not None:
            self.progress({"phase": phase, "done": int(done), "total": int(total)})

    def seconds(self):
        now = time.perf_counter()
        self._close(now)
        return now - self.t0


def _nbytes(model) -> int:
    """The image's size (quantized weights as their words)."""
    from ..models.gpt2 import param_shapes
    q = model.quant_full
    return 4 * sum(q[n].words if n in q else prod(s) for n, s in param_shapes(model.cfg).items())


async def _store(cache, meta, parts, record, clock) -> None:
    js_parts = []
    while parts:     # each tensor's Python copy goes as soon as JS holds its own
        js_parts.append(_uint8(parts.pop(0)))
    await cache.put(_to_js({**record, "meta": meta}), _to_js(js_parts))
    clock("store", meta["nbytes"], meta["nbytes"])


async def _restore_entry(cache, record, backend, clock, on_js):
    key = str(record.key)
    data = await cache.readData(key, on_js)
    model = restore(record.meta.to_py(), data, backend, what=repr(key),
                    progress=lambda d, t: clock("upload", d, t))
    return model, {"key": key, "name": str(record.name), "kind": str(record.kind), "cached": True,
                   "seconds": clock.seconds(), "phases": clock.phases}


async def load_key_async(key: str, *, backend="webgpu", progress=None):
    """(GPT2, info) of the cached entry `key` (one of list_async()'s)."""
    from pyodide.ffi import create_proxy
    cache = await _cache()
    record = _js_value(await cache.entry(key))
    if record is None:
        raise KeyError(f"model cache: no entry {key!r} (list_async() shows what is kept)")
    clock = _Clock(progress)
    on_js = create_proxy(lambda p: clock(str(p.phase), p.done, p.total))
    try:
        return await _restore_entry(cache, record, backend, clock, on_js)
    finally:
        on_js.destroy()


async def load_gpt2_async(source, *, backend="webgpu", name: str | None = None, progress=None):
    """(GPT2, info) from a URL, a JS File/Blob or bytes, through the cache (module header)."""
    from pyodide.ffi import JsException, create_proxy
    cache = await _cache()
    clock = _Clock(progress)
    if isinstance(source, str):
        src = {"url": source}
    elif isinstance(source, (bytes, bytearray, memoryview)):
        src = {"bytes": _uint8(source), "name": name or "model"}
    else:   # a JsProxy of a File or Blob
        src = {"file": source, "name": name or str(getattr(source, "name", "") or "model")}
    on_js = create_proxy(lambda p: clock(str(p.phase), p.done, p.total))
    try:
        clock("lookup", 0, 0)
        found = await cache.lookup(_to_js(src), on_js)
        key, hit = str(found.key), _js_value(found.hit)
        info = {"key": key, "name": str(found.name)}
        if hit is not None:
            try:
                return await _restore_entry(cache, hit, backend, clock, on_js)
            except (ModelCacheError, JsException):   # stale or unreadable: load afresh below
                await cache.remove(key)
        data = _js_value(found.bytes)
        if data is None:
            data = await cache.download(found.url, on_js)
        raw = data.to_bytes()
        del data
        clock("parse", 0, len(raw))
        model, kind = await parse_async(raw, backend, progress=lambda d, t: clock("parse", d, t))
        del raw
        record = {"key": key, "name": info["name"], "size": int(found.size),
                  "version": str(found.version), "source": str(found.source), "kind": kind}
        info.update(kind=kind, cached=False)
        try:     # a full disk or a missing database costs the next load, not this one
            clock("store", 0, _nbytes(model))
            meta, parts = await image_async(model)
            await _store(cache, meta, parts, record, clock)
        except Exception as e:
            info["not_kept"] = str(e)
        if _js_value(found.unavailable) is not None:
            info["not_kept"] = str(found.unavailable)
        return model, {**info, "seconds": clock.seconds(), "phases": clock.phases}
    finally:
        on_js.destroy()


async def store_async(model, *, name: str, kind: str = "trained", progress=None) -> dict:
    """Keep `model` (e.g. one trained in the worker) in the cache: listed, reloadable by key.
    Its key is name, image size and the image's SHA-256."""
    cache = await _cache()
    clock = _Clock(progress)
    clock("store", 0, _nbytes(model))
    meta, parts = await image_async(model)
    digest = hashlib.sha256()
    for p in parts:
        digest.update(p)
    version = "sha256:" + digest.hexdigest()
    key = str(cache.keyFor(name, meta["nbytes"], version))
    record = {"key": key, "name": name, "size": meta["nbytes"], "version": version,
              "source": f"{kind}:{key}", "kind": kind}
    await _store(cache, meta, parts, record, clock)
    return {"key": key, "name": name, "kind": kind, "cached": False, "seconds": clock.seconds(),
            "phases": clock.phases}


async def list_async() -> list[dict]:
    """The cached models, newest first: {key, name, size, kind, source, created, nbytes, config}."""
    return (await (await _cache()).list()).to_py()


async def remove_async(key: str) -> None:
    await (await _cache()).remove(key)


async def clear_async() -> None:
    await (await _cache()).clear()


__all__ = ["FORMAT", "ModelCacheError", "image_async", "restore", "parse_async",
           "load_gpt2_async", "load_key_async", "store_async", "list_async", "remove_async", "clear_async"]
