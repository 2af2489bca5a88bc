"""BrowserHost: runs WebGPU program plans on ``navigator.gpu`` from Pyodide (the browser worker).

The per-step loop lives in JavaScript (worker/replay.mjs), because encoding a few hundred
dispatches through the Python<->JS FFI costs milliseconds where the same loop in JS costs a tenth
of one. Python crosses over a few times per step: one call with the step's writes packed into
one Uint8Array, one awaited Promise for the read-back (one ArrayBuffer), and nothing per command.
The plan itself crosses ONCE, as a JSON string, when it is loaded.

Waiting: WebGPU read-backs are Promises, so ``run`` and ``read`` are coroutines that await them
(Pyodide lets Python coroutines await JS Promises). ``load`` and the constructor are synchronous;
they block on their Promises with ``pyodide.ffi.run_sync`` when JSPI allows it (code started by
``runPythonAsync``, as the worker does). Where it does not, call ``await request_device()`` once
first, and compile errors then surface on the first ``run`` instead of in ``load``.

No PyProxy is ever handed to JavaScript (conversions use ``create_pyproxies=False``), so nothing
leaks on the JS side; the JsProxies this module holds (the replay object) are dropped on
``close``/``unload``.
"""
from __future__ import annotations

import itertools
import json
import re
import sys

from .gpu_host import DeviceLostError, GPUHost, check_features

REPLAY_URL_GLOBAL = "webgradReplayURL"  # set globalThis[this] to load replay.mjs from elsewhere


class WGSLError(RuntimeError):
    """A WGSL text of the plan did not compile, or its pipeline failed validation."""


class GPUError(RuntimeError):
    """WebGPU refused something else (validation, out of memory) while loading or running."""


def _require_pyodide(what: str) -> None:
    if sys.platform != "emscripten":
        raise RuntimeError(f"{what} runs only inside Pyodide (the browser worker); in CPython "
                           "use NativeHost (webgrad.backends.webgpu_native)")


def block(awaitable, what: str):
    """Wait for a JS Promise / coroutine from synchronous code (JSPI), or say how to avoid it."""
    from pyodide.ffi import can_run_sync, run_sync
    if not can_run_sync():
        if hasattr(awaitable, "close"):
            awaitable.close()
        raise RuntimeError(
            f"{what} has to wait for the GPU, and this Python stack cannot block on a Promise "
            "(no JSPI here). Run the code through runPythonAsync (the webgrad worker does), or "
            "first `await webgrad.backends.webgpu_browser.request_device()` and use the *_async "
            "methods.")
    return run_sync(awaitable)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# One device per worker, shared by every BrowserHost (like wgpu-py's default device): compiled
# modules then share pipelines, and a second compile costs no adapter round trip.
_replay_module = None
_shared = None  # the JS Replay of the shared device
_scopes = itertools.count(1)  # each host's namespace of persistent buffers on a shared device


def _replay_url() -> str:
    import js
    url = getattr(js.globalThis, REPLAY_URL_GLOBAL, None)
    if url:
        return str(url)
    # In the worker, location is .../worker/worker.mjs: replay.mjs sits next to it.
    return str(js.URL.new("replay.mjs", js.location.href).href)


async def _module():
    global _replay_module
    if _replay_module is None:
        from pyodide.code import run_js
        url = _replay_url()
        try:
            _replay_module = await run_js("(url) => import(url)")(url)
        except Exception as e:
            raise RuntimeError(f"cannot import the WebGPU replay loop from {url} ({e}); serve "
                               "worker/replay.mjs next to worker.mjs (serve.py does)") from None
    return _replay_module


def _translate(e: BaseException, what: str) -> BaseException:
    """A JS error thrown by replay.mjs -> the matching Python exception."""
    name = str(getattr(e, "name", "") or "")
    message = str(getattr(e, "message", "") or e)
    if name == "DeviceLostError":
        return DeviceLostError(f"{what}: {message}. Compile the module again to get a new device.")
    if name == "WGSLError":
        return WGSLError(f"{what}: {message}")
    if name in ("GPUValidationError", "GPUOutOfMemoryError", "PlanError"):
        return GPUError(f"{what}: {message}")
    if name == "WebGPUUnavailable":
        return RuntimeError(message)
    return e


async def request_device(*, new: bool = False, features: list[str] | None = None):
    """The worker's shared device (a JS Replay), requested with the adapter's maximum limits
    and 'timestamp-query' (the profiler's GPU times) and 'subgroups' (codegen's workgroup
    reductions) where the adapter has them.

    A lost shared device is replaced by a fresh one. ``new=True`` returns a device of its own
    that nothing else shares (for tests that destroy it); ``features`` (with ``new=True``)
    lists the optional features to request instead, e.g. [] for a device without timestamps.
    """
    global _shared
    _require_pyodide("request_device()")
    if features is not None and not new:
        raise ValueError("request_device(features=...) needs new=True (the shared device "
                         "has the default features)")
    if new or _shared is None or _shared.lost:
        module = await _module()
        try:
            if not new and hasattr(module, "sharedDevice"):
                # the worker's device, perhaps requested while Pyodide booted (worker.mjs)
                replay = await module.sharedDevice()
            elif features is None:
                replay = await module.requestDevice()
            else:
                from pyodide.ffi import to_js
                from js import Object
                replay = await module.requestDevice(
                    to_js({"features": list(features)}, dict_converter=Object.fromEntries,
                          create_pyproxies=False))
        except Exception as e:
            raise _translate(e, "requesting a WebGPU device") from None
        if new:
            return replay
        _shared = replay
    return _shared


class BrowserHost(GPUHost):
    """A GPUHost on ``navigator.gpu``; the per-step loop is worker/replay.mjs."""

    def __init__(self, replay=None):
        _require_pyodide("BrowserHost")
        if replay is None:
            replay = _shared if _shared is not None and not _shared.lost else None
        if replay is None:
            replay = block(request_device(), "BrowserHost() (requesting the WebGPU device)")
        self._gpu = replay
        limits = replay.limits.to_py()
        self.limits = {_snake(k): v for k, v in limits.items()}
        self.info = str(replay.info)
        self.fallback = bool(getattr(replay, "fallback", False))  # isFallbackAdapter
        self.features = frozenset(str(f) for f in replay.features)  # the device's features
        self.wgsl_features = frozenset(str(f) for f in getattr(replay, "wgslFeatures", ()) or ())
        self._scope = f"host{next(_scopes)}"  # plans of this host share persistent buffers
        self._sizes: dict[int, list[int]] = {}    # program -> buffer sizes
        self._labels: dict[int, list[str]] = {}

    @classmethod
    async def create(cls) -> "BrowserHost":
        """A BrowserHost obtained without blocking (works without JSPI)."""
        return cls(await request_device())

    @property
    def device(self):
        """The GPUDevice (a JsProxy), e.g. for ``host.device.destroy()`` in tests."""
        return self._gpu.device

    # -- helpers
    def _check(self, program: int) -> list[int]:
        if self._gpu is None:
            raise RuntimeError("this BrowserHost is closed")
        if self._gpu.lost:
            raise _translate(self._gpu.lostError(), f"program {program}")
        sizes = self._sizes.get(program)
        if sizes is None:
            raise GPUError(f"program {program} is not loaded on this host (unloaded already?)")
        return sizes

    def _buffer(self, program: int, buffer: int, sizes: list[int]) -> int:
        if not isinstance(buffer, int) or not 0 <= buffer < len(sizes):
            raise GPUError(f"program {program} has buffers 0..{len(sizes) - 1}, not {buffer!r}")
        return sizes[buffer]

    def _pack(self, program: int, sizes: list[int], writes: dict[int, object]):
        """Every write of a step in one blob: [buffer, blob offset, size, buffer offset]*."""
        import js
        meta, parts, at = [], [], 0
        for buffer, data in writes.items():
            view = memoryview(data).cast("B")
            size = self._buffer(program, buffer, sizes)
            if view.nbytes > size or view.nbytes % 4:
                raise GPUError(
                    f"write of {view.nbytes} bytes into buffer {buffer} "
                    f"({self._labels[program][buffer]!r}, {size} bytes) of program {program}: "
                    "writes must fit the buffer and be a multiple of 4 bytes")
            meta += [buffer, at, view.nbytes, 0]
            parts.append(view)
            at += view.nbytes
        if not meta:
            return [], None
        blob = js.Uint8Array.new(at)
        blob.assign(b"".join(parts) if len(parts) > 1 else parts[0])
        return meta, blob

    # -- GPUHost
    def prefetch(self, wgsl: str) -> None:
        """Start creating a kernel's pipeline now (lowering calls this for each new WGSL
        text, as it does NativeHost's): the browser compiles it while the rest is lowered,
        and the playground counts the kernels as they come (replay.mjs onPipeline)."""
        if self._gpu is not None and not self._gpu.lost:
            try:
                self._gpu.pipeline(wgsl, "prefetched")
            except Exception:
                pass  # load() asks again and reports what is wrong

    def load(self, plan: dict) -> int:
        """Create the plan's buffers, pipelines and bind groups; returns the program handle.

        With JSPI, waits for WGSL compilation and raises WGSLError here; without, the first
        ``run`` raises it.
        """
        if self._gpu is None:
            raise RuntimeError("this BrowserHost is closed")
        if self._gpu.lost:
            raise _translate(self._gpu.lostError(), "loading a plan")
        check_features([q["wgsl"] for q in plan["pipelines"]], self.features, self.info,
                       self.wgsl_features)
        text = json.dumps(plan, separators=(",", ":"))
        try:
            program = int(self._gpu.load(text, self._scope))
        except Exception as e:
            raise _translate(e, "loading a plan") from None
        # reads return the plan's sizes (rounded up to 4 bytes, as copies need)
        self._sizes[program] = [-(-int(b["size"]) // 4) * 4 for b in plan["buffers"]]
        self._labels[program] = [str(b.get("label", f"buffer {i}"))
                                 for i, b in enumerate(plan["buffers"])]
        from pyodide.ffi import can_run_sync
        if can_run_sync():
            try:
                block(self._gpu.ready(program), "loading a plan")
            except Exception as e:
                self.unload(program)
                raise _translate(e, "loading a plan") from None
        return program

    def write(self, program: int, buffer: int, data, offset: int = 0) -> None:
        """data: a bytes-like, or a JS typed array (a JsProxy, e.g. a view of a model cache
        entry's bytes), written as it is without a copy through Python."""
        sizes = self._check(program)
        size = self._buffer(program, buffer, sizes)
        js_data = hasattr(data, "byteLength")
        nbytes = int(data.byteLength) if js_data else memoryview(data).nbytes
        if offset < 0 or offset % 4 or nbytes % 4 or offset + nbytes > size:
            raise GPUError(f"write of {nbytes} bytes at offset {offset} into buffer {buffer} "
                           f"({self._labels[program][buffer]!r}, {size} bytes) of program "
                           f"{program}: offset and size must be multiples of 4 and fit")
        if js_data:
            blob = data
        else:
            import js
            blob = js.Uint8Array.new(nbytes)
            blob.assign(memoryview(data).cast("B"))
        try:
            self._gpu.write(program, buffer, blob, offset)
        except Exception as e:
            raise _translate(e, f"writing buffer {buffer} of program {program}") from None

    async def run(self, program: int, writes: dict[int, bytes], reads: list[int]) -> list[bytes]:
        return await self._run(program, writes, reads, True)

    async def read(self, program: int, buffer: int) -> bytes:
        return (await self._run(program, {}, [buffer], False))[0]

    async def profile(self, program: int, writes: dict[int, bytes]):
        """Run the program once with every dispatch timed (worker/replay.mjs `profile`):
        ([seconds per command, None for copies], "timestamp") from GPU timestamps where the
        device has 'timestamp-query', else "wall" times of each command submitted alone."""
        from pyodide.ffi import to_js
        sizes = self._check(program)
        meta, blob = self._pack(program, sizes, writes)
        try:
            out = await self._gpu.profile(program, to_js(meta), blob)
        except Exception as e:
            raise _translate(e, f"profiling program {program}") from None
        # a copy's entry is JS null (pyodide's JsNull, not None)
        seconds = [float(t) if isinstance(t, (int, float)) else None
                   for t in out.seconds.to_py()]
        return seconds, str(out.timing)

    async def _run(self, program, writes, reads, commands):
        from pyodide.ffi import to_js
        sizes = self._check(program)
        reads = list(reads)
        total = sum(self._buffer(program, b, sizes) for b in reads)
        meta, blob = self._pack(program, sizes, writes)
        what = f"running program {program}" if commands else f"reading program {program}"
        try:
            data = await self._gpu.run(program, to_js(meta), blob, to_js(reads), commands)
        except Exception as e:
            raise _translate(e, what) from None
        if not reads:  # replay.mjs resolved to null
            return []
        raw = data.to_bytes()
        del data
        if len(raw) != total:  # replay.mjs returns the reads back to back, whole buffers
            raise GPUError(f"{what}: read back {len(raw)} bytes, expected {total}")
        out, at = [], 0
        for b in reads:
            out.append(raw[at:at + sizes[b]])
            at += sizes[b]
        return out

    def unload(self, program: int) -> None:
        self._sizes.pop(program, None)
        self._labels.pop(program, None)
        if self._gpu is not None:
            self._gpu.unload(program)

    def close(self) -> None:
        """Unload every program of this host (the shared device stays for other hosts)."""
        for program in list(self._sizes):
            self.unload(program)
        self._gpu = None
