"""The browser's model cache (IndexedDB): a loaded model's GPU image, kept between page loads.

Loading a model in the browser costs a download, a parse and an upload; the *image* of a
loaded model is what the GPU holds after all that, and a cached image turns the next load of
the same file into an upload. This module is the cache and knows no model: an ImageFormat
(models/gpt2_cache.py's GPT2_IMAGES for GPT-2, llama_cache.py's LLAMA_IMAGES; both build
on models/cache_image.py) says how a model family's images are made
(image_async: (meta, parts), parts one bytes-like per tensor), restored (restore) and parsed
from a file (parse_async). The IndexedDB half, with the record format and the cache key, is
web/modelcache.mjs; the worker exposes it as `webgradModelCache`.

    model, info = await load_async(source, fmt, backend="auto", progress=fn)
        backend: where the model goes ("auto", the default: WebGPU, or in a browser without
        it the CPU backend "wasm", whose restore writes the image through the host);
        source: a URL (str: a HEAD request's ETag keys the cache, so a hit downloads nothing),
        a JS File or Blob (picked from disk: its SHA-256 keys it), or bytes (with name=...).
        A hit reads the image and uploads it; a miss downloads, parses, and stores the image.
        A cached entry that no longer restores (fmt.restore raises ModelCacheError: written by
        another version) is dropped and the file loaded afresh.
        info: {key, name, kind, cached, seconds, phases: {phase: seconds}}, and not_kept
        (why) when the image could not be stored (a full disk, no IndexedDB): the model is
        loaded all the same;
        progress(dict) hears {phase, done, total} (bytes) for the phases "lookup", then
        "hash" / "download" / "parse" / "store" (a miss) or "read" / "upload" (a hit).
    model, info = await load_key_async(key, fmt, backend="auto", progress=fn)   # a listed entry
        (one that no longer restores is dropped, and its ModelCacheError raised)
    info = await store_async(model, fmt, name=..., kind="trained")   # e.g. one trained here
    entries = await list_async();  await remove_async(key);  await clear_async()

Consumers: models/gpt2_cache.py and models/llama_cache.py, and through them the surprisal
and chat pages (web/surprisal.mjs, web/chat.mjs).
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Callable


class ModelCacheError(ValueError):
    """A cache entry that cannot be restored; says which entry and which field."""


@dataclass(frozen=True)
class ImageFormat:
    """A model family's images, for the cache (models/gpt2_cache.py's GPT2_IMAGES)."""
    image_async: Callable   # async (model) -> (meta dict, [bytes-like per tensor]); meta has nbytes
    restore: Callable       # (meta, data, backend, *, progress, what) -> model; ModelCacheError
    parse_async: Callable   # async (file bytes, backend, *, progress) -> (model, kind)
    nbytes: Callable        # (model) -> the image's size in bytes


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


def _js_parts(parts) -> list:
    js_parts = []
    while parts:     # each tensor's Python copy goes as soon as JS holds its own
        js_parts.append(_uint8(parts.pop(0)))
    return js_parts


async def _store(cache, meta, js_parts, record, clock) -> None:
    await cache.put(_to_js({**record, "meta": meta}), _to_js(js_parts))
    clock("store", meta["nbytes"], meta["nbytes"])


async def _restore_entry(cache, record, fmt, backend, clock, on_js):
    key = str(record.key)
    data = await cache.readData(key, on_js)
    model = fmt.restore(record.meta.to_py(), data, backend, what=repr(key),
                        progress=lambda d, t: clock("upload", d, t))
    return model, {"key": key, "name": str(record.name), "kind": str(record.kind), "cached": True,
                   "seconds": clock.seconds(), "phases": clock.phases}


async def load_key_async(key: str, fmt: ImageFormat, *, backend="auto", progress=None):
    """(model, info) of the cached entry `key` (one of list_async()'s), restored by `fmt`."""
    from pyodide.ffi import create_proxy
    cache = await _cache()
    record = _js_value(await cache.entry(key))
    if record is None:
        raise KeyError(f"model cache: no entry {key!r} (list_async() shows what is kept)")
    clock = _Clock(progress)
    on_js = create_proxy(lambda p: clock(str(p.phase), p.done, p.total))
    try:
        return await _restore_entry(cache, record, fmt, backend, clock, on_js)
    except ModelCacheError as e:   # written by another version: no use to keep listing it
        await cache.remove(key)
        raise ModelCacheError(f"{e} (the entry is dropped from the cache)") from None
    finally:
        on_js.destroy()


async def load_async(source, fmt: ImageFormat, *, backend="auto", name: str | None = None,
                     progress=None):
    """(model, info) from a URL, a JS File/Blob or bytes, through the cache (module header):
    a hit restored by `fmt`, a miss parsed by it and its image stored."""
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
                return await _restore_entry(cache, hit, fmt, backend, clock, on_js)
            except (ModelCacheError, JsException):   # stale or unreadable: load afresh below
                await cache.remove(key)
        data = _js_value(found.bytes)
        if data is None:
            data = await cache.download(found.url, on_js)
        raw = data.to_bytes()
        del data
        clock("parse", 0, len(raw))
        model, kind = await fmt.parse_async(raw, backend, progress=lambda d, t: clock("parse", d, t))
        del raw
        record = {"key": key, "name": info["name"], "size": int(found.size),
                  "version": str(found.version), "source": str(found.source), "kind": kind}
        info.update(kind=kind, cached=False)
        try:     # a full disk or a missing database costs the next load, not this one
            clock("store", 0, fmt.nbytes(model))
            meta, parts = await fmt.image_async(model)
            await _store(cache, meta, _js_parts(parts), record, clock)
        except Exception as e:
            info["not_kept"] = str(e)
        if _js_value(found.unavailable) is not None:
            info["not_kept"] = str(found.unavailable)
        return model, {**info, "seconds": clock.seconds(), "phases": clock.phases}
    finally:
        on_js.destroy()


async def store_async(model, fmt: ImageFormat, *, name: str, kind: str = "trained",
                      progress=None) -> dict:
    """Keep `model` (e.g. one trained in the worker) in the cache as `fmt`'s image: listed,
    reloadable by key. Its key is name, image size and the image's SHA-256."""
    cache = await _cache()
    clock = _Clock(progress)
    clock("store", 0, fmt.nbytes(model))
    meta, parts = await fmt.image_async(model)
    digest = hashlib.sha256()
    for p in parts:
        digest.update(p)
    version = "sha256:" + digest.hexdigest()
    js_parts = _js_parts(parts)
    key = str(cache.keyFor(name, meta["nbytes"], version))
    record = {"key": key, "name": name, "size": meta["nbytes"], "version": version,
              "source": f"{kind}:{key}", "kind": kind}
    await _store(cache, meta, js_parts, record, clock)
    return {"key": key, "name": name, "kind": kind, "cached": False, "seconds": clock.seconds(),
            "phases": clock.phases}


async def list_async() -> list[dict]:
    """The cached models, newest first: {key, name, size, kind, source, created, nbytes, config}."""
    return (await (await _cache()).list()).to_py()


async def remove_async(key: str) -> None:
    await (await _cache()).remove(key)


async def clear_async() -> None:
    await (await _cache()).clear()


__all__ = ["ImageFormat", "ModelCacheError", "load_async", "load_key_async", "store_async",
           "list_async", "remove_async", "clear_async"]
