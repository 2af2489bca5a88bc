"""The process's WebGPU device for NativeHost (backends/webgpu_native.py): which wgpu-py
implementation, the adapter and device with their features and limits, Dawn's toggles, and the
compiled pipelines, created on a pool of threads.

Which implementation: $WEBGRAD_WGPU_LIB names the module to import ("wgpudawn" for Dawn,
Chrome's WebGPU; "wgpu" for wgpu-py on wgpu-native); unset, wgpudawn is used where it is
installed, else wgpu. Both expose the same API (`import wgpudawn as wgpu`). On a machine
without a GPU, wgpu-native finds Mesa's lavapipe (Vulkan on the CPU); set
XDG_RUNTIME_DIR (we default it to /tmp) to keep the Vulkan loader quiet.

One device per process (shared_device): every NativeHost() shares it, and with it the pipeline
cache (keyed by WGSL text), because creating a device and compiling pipelines is the slow
part. NativeHost(private=True) makes a Device of its own (tests destroy it to simulate a lost
device).

Pipelines are created on a pool of Python threads (PIPELINE_THREADS), each calling the
synchronous create_compute_pipeline, which runs with the GIL released: Dawn's own
createComputePipelineAsync compiles on a pool of two threads (dawn/platform/WorkerThread.h,
kDefaultTaskHandlingJobCount), and a cold NVIDIA driver takes 0.2-0.7 s per large matmul
pipeline. Lowering hands each new kernel text over as it is emitted (NativeHost.prefetch), so
the driver compiles while Python lowers the rest; bench/README.md ("Compile + init") has the
figures.

Dawn's toggles (wgpudawn only): CAPABILITY_TOGGLES, then $WEBGRAD_DAWN_TOGGLES
(comma-separated names to enable and -names to disable; else DAWN_TOGGLES), go to the
process's Dawn instance before its first adapter (bench/gpt2_train.py --exact-timestamps turns
timestamp quantisation off so; "-allow_unsafe_apis" drops a capability toggle). Device toggles:
DEVICE_TOGGLES (disable_robustness by default), then $WEBGRAD_DAWN_DEVICE_TOGGLES, the same way.

Capabilities: the device is requested with every feature of _WANTED_FEATURES that the adapter
offers (`Device.features`, copied to `NativeHost.features`), and, where it offers subgroup
matrices, the adapter's configurations are read (`subgroup_matrix_configs`: dicts of
component_type, result_component_type, m, n, k, min/max_subgroup_size); WebGPUBackend copies
both onto its codegen Limits.
"""
from __future__ import annotations

import importlib
import os
import sys
from concurrent.futures import ThreadPoolExecutor, wait

# the limits a plan may need beyond WebGPU's defaults (requested up to the adapter's maximum)
_WANTED_LIMITS = ("max-storage-buffer-binding-size", "max-buffer-size",
                  "max-storage-buffers-per-shader-stage", "max-compute-workgroup-storage-size",
                  "max-compute-invocations-per-workgroup", "max-compute-workgroup-size-x",
                  "max-compute-workgroups-per-dimension")
# requested where the adapter has them: timestamps for the profiler (profile.py), subgroups
# for codegen's workgroup reductions (wgsl.workgroup_reduce; Dawn names it, wgpu-native's
# lavapipe offers naga's 'subgroup' instead and so keeps the shared-memory trees)
# shader-f16 (f16 in WGSL) and subgroup matrices (tensor cores; codegen/matmul_mma.py) where
# offered: Dawn offers them on NVIDIA's Vulkan driver only with CAPABILITY_TOGGLES
_WANTED_FEATURES = ("timestamp-query", "subgroups", "shader-f16",
                    "chromium-experimental-subgroup-matrix")
# The settings below are the device's part of the host's runtime (webgpu_native.py has the
# rest): how a plan is compiled. None of them changes the generated WGSL or the plan (those
# are codegen.KernelOptions, carried by the compile), so they stay module settings that the
# benches set (on this module: webgpu_device.PIPELINE_THREADS).
DAWN_TOGGLES: tuple[str, ...] = ()
# Always asked of Dawn's instance (native code is trusted): experimental features such as
# subgroup matrices need allow_unsafe_apis, and Dawn turns f16 off on NVIDIA's Vulkan driver
# unless vulkan_enable_f16_on_nvidia (H200, 2026-12-01: neither feature offered without them)
CAPABILITY_TOGGLES: tuple[str, ...] = ("allow_unsafe_apis", "vulkan_enable_f16_on_nvidia")
# Device toggles. "disable_robustness" drops the bounds clamping Dawn wraps around each
# storage access: webgrad's kernels index inside their bindings by construction (every
# flat-index kernel guards its last workgroup, gathers clamp the row they read, the tiled and
# subgroup-matrix products take only shapes their tiles divide: MmaTiling.check) and native
# code is trusted, so the native device drops it. Measured on the H200 (bench/README.md,
# 2026-12-02): the mixed GPT-2 124M step 57.0 -> 44.4 ms, f32 89.0 -> 85.1, the f16 matmul
# at 4096 172 -> 233 TFLOP/s. A browser cannot set it (its kernels are measured with the
# clamping). Opt out: WEBGRAD_DAWN_DEVICE_TOGGLES=-disable_robustness. wgpu-native ignores it.
DEVICE_TOGGLES: tuple[str, ...] = ("disable_robustness",)
# Threads creating pipelines at once (None: one per CPU core, at most 16); 0 or 1 issues them
# all with create_compute_pipeline_async instead and waits (Dawn's two worker threads).
PIPELINE_THREADS: int | None = None


def _pipeline_threads() -> int:
    if sys.platform == "emscripten":  # wgpudawn under Pyodide: no threads to start
        return 0
    if PIPELINE_THREADS is not None:
        return PIPELINE_THREADS
    return min(16, os.cpu_count() or 1)


def _toggle_lists(base, env: str, default) -> tuple[list[str], list[str]]:
    """(enable, disable) from `base` and $env (else `default`): names enable, -names disable
    (also one of base's)."""
    spec = os.environ.get(env)
    names = [t.strip() for t in spec.split(",") if t.strip()] if spec is not None else list(default)
    off = [t[1:] for t in names if t[0] == "-"]
    on = [t for t in (*base, *names) if t[0] != "-" and t not in off]
    return list(dict.fromkeys(on)), off


def _set_dawn_toggles(lib) -> None:
    if lib.__name__ != "wgpudawn":
        return
    on, off = _toggle_lists(CAPABILITY_TOGGLES, "WEBGRAD_DAWN_TOGGLES", DAWN_TOGGLES)
    if not on and not off:
        return
    try:
        extras = importlib.import_module("wgpudawn.backends.dawn.extras")
    except ImportError:  # a build without Dawn's extras (Pyodide): the defaults stand
        return
    try:
        extras.set_instance_extras(enable_toggles=on, disable_toggles=off)
    except RuntimeError:  # the instance exists already (an earlier device): its toggles stand
        pass


def _subgroup_matrix_configs(lib, adapter) -> tuple:
    """The adapter's subgroup-matrix configurations (wgpudawn), as dicts; () elsewhere."""
    if lib.__name__ != "wgpudawn" or "chromium-experimental-subgroup-matrix" not in adapter.features:
        return ()
    try:
        extras = importlib.import_module("wgpudawn.backends.dawn.extras")
        props = extras.get_adapter_properties(adapter)
    except Exception:  # an older wgpudawn without the call: no configurations known
        return ()
    return tuple(dict(c) for c in props.get("subgroup_matrix_configs", ()))


def wgpu_module():
    """The wgpu-py API module this process uses (see the module docstring)."""
    name = os.environ.get("WEBGRAD_WGPU_LIB")
    if name:
        return importlib.import_module(name)
    try:
        return importlib.import_module("wgpudawn")
    except ImportError:
        return importlib.import_module("wgpu")


class Device:
    """An adapter, its device, and compiled pipelines by WGSL text."""

    def __init__(self, lib=None):
        os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
        try:
            self.lib = lib or wgpu_module()
        except ImportError as e:
            raise RuntimeError(f"no WebGPU implementation for Python ({e}); pip install wgpu") from None
        _set_dawn_toggles(self.lib)
        adapter = self.lib.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            raise RuntimeError("wgpu found no WebGPU adapter (no Vulkan/Metal/D3D12 driver?)")
        have = adapter.limits
        self.features = {f for f in _WANTED_FEATURES if f in adapter.features}
        self.subgroup_matrix_configs = _subgroup_matrix_configs(self.lib, adapter)
        if not self.subgroup_matrix_configs:  # a feature with no shape known is no use
            self.features.discard("chromium-experimental-subgroup-matrix")
        request = dict(required_features=sorted(self.features),
                       required_limits={k: have[k] for k in _WANTED_LIMITS if k in have})
        on, off = _toggle_lists((), "WEBGRAD_DAWN_DEVICE_TOGGLES", DEVICE_TOGGLES)
        extras = None
        if (on or off) and self.lib.__name__ == "wgpudawn":
            try:
                extras = importlib.import_module("wgpudawn.backends.dawn.extras")
            except ImportError:  # a build without Dawn's extras (Pyodide): the defaults stand
                pass
        self.device_toggles = tuple(on) if extras else ()
        if extras:
            self.device = extras.request_device_sync(adapter, enable_toggles=on,
                                                     disable_toggles=off, **request)
        else:
            self.device = adapter.request_device_sync(**request)
        self.info = f"{adapter.summary} [{self.lib.__name__}]"
        self.limits = {k.replace("-", "_"): v for k, v in self.device.limits.items()
                       if isinstance(v, int)}
        self.pipelines: dict[str, object] = {}
        self.threads = _pipeline_threads()
        self._pool: ThreadPoolExecutor | None = None
        self._making: dict = {}  # WGSL -> Future of its pipeline (prefetch)
        self._lost = False

    @property
    def lost(self) -> bool:
        """Known lost: by an error we saw, or by the device's lost promise (wgpudawn keeps
        one; wgpu-native raises on every use of a lost device instead)."""
        if not self._lost:
            try:
                promise = self.device._get_lost_async()
            except Exception:  # NotImplementedError on wgpu-native
                promise = None
            if promise is not None and getattr(promise, "_state", "pending") != "pending":
                self._lost = True
        return self._lost

    @lost.setter
    def lost(self, value: bool) -> None:
        self._lost = value

    def pipeline(self, wgsl: str):
        """The pipeline of one WGSL text (cached)."""
        return self.pipelines_for([wgsl])[0]

    def _create(self, wgsl: str):
        """One pipeline, made synchronously (on a pool thread or the caller's)."""
        module = self.device.create_shader_module(code=wgsl)
        return self.device.create_compute_pipeline(
            layout="auto", compute={"module": module, "entry_point": "main"})

    def prefetch(self, wgsl: str) -> None:
        """Start creating the pipeline of `wgsl` on a pool thread, unless it is made or under
        way; pipelines_for collects it. Nothing without the thread pool."""
        if self.threads <= 1 or wgsl in self.pipelines or wgsl in self._making:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="webgrad-pipeline")
        self._making[wgsl] = self._pool.submit(self._create, wgsl)

    def pipelines_for(self, wgsls: list[str]) -> list:
        """The pipeline of each WGSL text, in order. Those not cached yet are created
        together: on the thread pool (prefetch; those lowering started already are waited
        for), else all issued with create_compute_pipeline_async and then all waited for
        (Dawn compiles two at a time; wgpu-native resolves the call at once), else, in an
        API without that call, one by one. A failure raises the error of the first failing
        text in plan order, once the rest were waited for (those that compiled stay cached;
        a failed text is tried afresh by the next call that names it)."""
        if self.threads > 1:
            for wgsl in wgsls:
                self.prefetch(wgsl)
            return self._collect_threads(wgsls)
        create = getattr(self.device, "create_compute_pipeline_async", None)
        pending = {}
        for wgsl in dict.fromkeys(wgsls) if create is not None else ():
            if wgsl not in self.pipelines:
                try:
                    module = self.device.create_shader_module(code=wgsl)
                    pending[wgsl] = create(
                        layout="auto", compute={"module": module, "entry_point": "main"})
                except Exception as e:  # WGSL that does not parse: reported in order below
                    pending[wgsl] = _Failed(e)

        def made(wgsl):
            promise = pending.get(wgsl)
            if isinstance(promise, _Failed):
                raise promise.error
            return self._create(wgsl) if promise is None else promise.sync_wait()
        return self._in_order(wgsls, made)

    def _collect_threads(self, wgsls: list[str]) -> list:
        # Every pipeline under way is waited for, not only this call's: the bindings report
        # a validation error in whichever thread looks first (wgpu-py's error handler keeps
        # one list of pending errors), so a failure anywhere may belong to any of them.
        making, self._making = self._making, {}
        wait(making.values())
        if any(f.exception() is not None for f in making.values()):
            # which text failed is not known: this call's are made again one at a time, in
            # plan order, so the error names the right kernel (the others are dropped)
            return self._in_order(wgsls, self._create)
        self.pipelines.update((w, f.result()) for w, f in making.items())
        return [self.pipelines[w] for w in wgsls]

    def _in_order(self, wgsls: list[str], made) -> list:
        failures = {}
        for i, wgsl in enumerate(wgsls):
            if wgsl in self.pipelines or wgsl in failures:
                continue
            try:
                self.pipelines[wgsl] = made(wgsl)
            except Exception as e:
                failures[wgsl] = (i, e)
        if failures:
            wgsl, (_, e) = min(failures.items(), key=lambda kv: kv[1][0])
            raise _compile_error(wgsl, e)
        return [self.pipelines[w] for w in wgsls]


class _Failed:
    """A pipeline whose creation failed when it was issued."""

    def __init__(self, error: BaseException):
        error.__traceback__ = None
        self.error = error


def _compile_error(wgsl: str, e: BaseException) -> RuntimeError:
    """The error of a kernel that did not compile: its first line (the kernel's name) and
    the whole WGSL text."""
    e.__traceback__ = None
    head = wgsl.splitlines()[0] if wgsl else ""
    return RuntimeError(f"WGSL kernel {head!r} failed to compile: {e}\n--- WGSL ---\n{wgsl}")


_shared: Device | None = None


def shared_device() -> Device:
    global _shared
    if _shared is None or _shared.lost:
        _shared = Device()
    return _shared
