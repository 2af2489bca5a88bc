"""The WebGPU executor: WGSL kernels and a buffer plan, on any GPUHost.

`WebGPUBackend.prepare(graph)` lowers the graph (codegen/: fusion, buffer plan, one WGSL
kernel per group, a dispatch list) into a Plan, loads it on the host once, and returns a
`WebGPUProgram` whose `run` makes one queue submission per step and reads back only what
was asked for (the loss, plus captures when requested).

The persistent store (params, optimizer state, kept gradients, the step counter) lives in
host buffers shared by every program of this backend (the plan's "persistent" buffers): a
training step and the forward programs compiled beside it read the same parameters. Until
a program that uses a persistent buffer is loaded, its value waits here, on the CPU.
The same code runs on NativeHost (wgpu-py, Dawn) and BrowserHost (navigator.gpu): the
host is the only thing that differs (hosts.default_host()).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from math import prod

from ..arrays import HostArray, device_result
from ..blocking import run_blocking
from ..buffers import align
from ..codegen import LOWERED_OPS, Limits, lower
from ..codegen.options import DEFAULT as DEFAULT_OPTIONS
from ..precision import (f16_bytes, f16_in_f32, f32_from_f16_bytes, half_feature_error,
                         round_f16_bytes)
from .base import Backend
from .gpu_host import PACKED_DOT

__all__ = ["WebGPUBackend", "WebGPUProgram", "LOWERED_OPS"]

_uids = itertools.count(1)

# words in an adapter description (wgpu-py's summary, the browser's GPUAdapterInfo) that
# mean its "GPU" is emulated on the CPU, where codegen prefers barrier-free kernels
_CPU_ADAPTER_WORDS = ("(cpu)", "swiftshader", "llvmpipe", "lavapipe", "software", "basic render")


def is_cpu_adapter(info: str) -> bool:
    """Whether the adapter described by `info` is a CPU rasterizer."""
    text = info.lower()
    return any(w in text for w in _CPU_ADAPTER_WORDS)


@dataclass
class _Slot:
    shape: tuple
    dtype: str
    shadow: bytes | None = None        # value not yet on the GPU (None: zeros)
    home: tuple[int, int] | None = None  # (program, buffer id) once a program holds it
    half: bool = False  # an f16 value held in an f16 buffer (2 bytes an element), else in f32


def _emulated(limits):
    """limits with the 16x16x16 f16 -> f32 subgroup-matrix configuration (subgroup size 32)
    where KernelOptions.mma_emulate asks for it and the adapter has shader-f16 but no
    subgroup matrices (tests: the kernels then run in plain WGSL, codegen/mma_emulate.py)."""
    if limits.options.mma_emulate and limits.shader_f16 and not limits.subgroup_matrix:
        return replace(limits, subgroup_matrix=(("f16", "f32", 16, 16, 16, 32, 32),))
    return limits


def _f16_program(graph, features, adapter: str, emulate: bool):
    """A program holding f16 values (precision="mixed"/"f16") needs the adapter's shader-f16
    (refused without it, unless KernelOptions.f16_emulation asks for the integer rounding).
    Its f16 nodes become f32 ones (precision.f16_in_f32) whose casts round where the program
    says; with shader-f16 (and no emulation) the casts' stored values and the f16
    parameters live in f16 buffers (codegen/program.py's half_storage), else in f32 ones."""
    err = None if emulate else half_feature_error(graph, features, adapter or "(unnamed)")
    if err:
        raise RuntimeError(err)
    return f16_in_f32(graph)


class WebGPUBackend(Backend):
    name = "webgpu"
    runs_plans = True

    def __init__(self, host=None, *, options=None):
        """options: the codegen.KernelOptions every program of this backend is lowered with
        (None: the defaults); a compile can pass its own (compile_module's kernel_options)."""
        if host is None:
            from .hosts import default_host
            host = default_host()  # raises when there is no adapter: backend="auto" falls back
        self.host = host
        self.limits = Limits.from_host(getattr(host, "limits", None))
        self.limits.cpu = is_cpu_adapter(str(getattr(host, "info", "")))
        self.limits.adapter = str(getattr(host, "info", ""))
        features = getattr(host, "features", None) or ()
        self.limits.subgroups = "subgroups" in features
        self.limits.shader_f16 = "shader-f16" in features
        self.limits.packed_dot = PACKED_DOT in getattr(host, "wgsl_features", ())
        self.limits.subgroup_matrix = tuple(
            (c["component_type"], c["result_component_type"], c["m"], c["n"], c["k"],
             c["min_subgroup_size"], c["max_subgroup_size"])
            for c in getattr(host, "subgroup_matrix_configs", ()) or ()
        ) if "chromium-experimental-subgroup-matrix" in features else ()
        self.limits.options = options or DEFAULT_OPTIONS
        self.limits = _emulated(self.limits)
        # f16 parameters in f16 buffers (half the bytes) where kernels may read f16: one
        # choice for the backend, since its programs share the persistent buffers
        self.half_params = self.limits.shader_f16 and not self.limits.options.f16_emulation
        self.uid = next(_uids)
        self.store: dict[str, _Slot] = {}
        self.programs: list[int] = []

    def transposed_views(self, options=None) -> bool | str:
        from ..codegen.matmul_mma import transposed_views_for
        lim = self.limits if options is None else _emulated(replace(self.limits, options=options))
        return transposed_views_for(lim)

    def _key(self, name: str) -> str:
        return f"webgrad{self.uid}:{name}"

    def ensure(self, name, shape, dtype):
        if name in self.store:
            return False
        self.store[name] = _Slot(tuple(shape), dtype, half=dtype == "f16" and self.half_params)
        return True

    def write(self, name, host):
        slot = self.store[name]
        data = host.tobytes() if hasattr(host, "tobytes") else bytes(host)
        if len(data) != 4 * prod(slot.shape):
            raise ValueError(f"write of {len(data)} bytes into '{name}' {slot.dtype}{list(slot.shape)}")
        if not data:  # zero-size: never on the GPU (codegen/empty.py)
            return
        if slot.half:  # an f16 buffer: the values rounded to f16 bytes
            data = f16_bytes(data)
            data += bytes(-len(data) % 4)  # queue writes come in whole words (odd counts)
        elif slot.dtype == "f16":  # held in an f32 buffer (precision.f16_in_f32), rounded
            data = round_f16_bytes(data)
        if slot.home is not None:
            self.host.write(slot.home[0], slot.home[1], data)
        else:
            slot.shadow = data

    def upload(self, values: dict) -> None:
        """Put parameters' bytes on the device now (write() leaves a value on the host until
        a program holding it is loaded): values maps a name to the buffer's bytes as they are
        (f32 values, a quantized weight's i32 words), a bytes-like or, in the browser worker,
        a JS typed array, which goes to the GPU without a copy through Python. Parameters no
        program holds yet get their buffers from one plan without kernels. The model cache
        restores its images through it (models/cache_image.py)."""
        sizes = {}
        for name, data in values.items():
            slot = self.store.get(name)
            if slot is None:
                raise KeyError(f"upload: the backend has no parameter {name!r}")
            n = int(data.byteLength) if hasattr(data, "byteLength") else memoryview(data).nbytes
            if slot.half or slot.dtype == "f16" or n != 4 * prod(slot.shape):
                raise ValueError(f"upload of {n} bytes into '{name}' {slot.dtype}"
                                 f"{list(slot.shape)}{' (an f16 buffer)' if slot.half else ''}: "
                                 "upload takes whole f32/i32 buffers; write() converts")
            if n:       # zero-size: never on the GPU (codegen/empty.py)
                sizes[name] = n
        fresh = [n for n in sizes if self.store[n].home is None]
        if fresh:
            # sized as codegen sizes them (buffers.align), so compiled programs share them
            plan = {"buffers": [{"size": align(sizes[n]), "label": n, "persistent": self._key(n)}
                                for n in fresh], "pipelines": [], "commands": []}
            program = self.host.load(plan)
            self.programs.append(program)
            for i, n in enumerate(fresh):
                self.store[n].home, self.store[n].shadow = (program, i), None
        for name in sizes:
            self.host.write(*self.store[name].home, values[name])

    async def read(self, name):
        slot = self.store[name]
        n = 4 * prod(slot.shape)
        if slot.home is not None:
            data = await self.host.read(*slot.home)
        else:
            data = slot.shadow if slot.shadow is not None else bytes(n)
        if slot.half:  # f16 bytes (the buffer padded to 16 bytes) widened to f32
            data = f32_from_f16_bytes(bytes(memoryview(data)[:2 * prod(slot.shape)]))
        dtype = "f32" if slot.dtype == "f16" else slot.dtype  # held in f32 (f16_in_f32)
        return device_result(data, 0, n, dtype, slot.shape)

    def init_params(self, items, *, seed: int) -> None:
        """Parameters that a loaded program holds are filled on the device by one small
        program (codegen/initparams.py); the rest (literals, not yet loaded) on the host."""
        from ..codegen.initparams import init_plan
        from ..init import recipe
        on_device, on_host = [], []
        for name, spec, shape in items:
            r = recipe(spec, shape, seed=seed, name=name)
            slot = self.store[name]
            # literals and zeroed rows (padding_idx) are written from the host
            device = (r[0] != "literal" and not spec.zero_rows and slot.home is not None
                      and slot.dtype != "f16")  # f16 ones: rounded as write() rounds
            (on_device if device else on_host).append(
                (name, spec, shape, r))
        if on_device:
            plan, writes = init_plan([(n, shape, r) for n, _, shape, r in on_device],
                                     self.limits, self._key)
            program = self.host.load(plan)
            try:
                for buf, data in writes:
                    self.host.write(program, buf, data)
                # one submission, not waited for: the next step is queued behind it, and
                # WebGPU frees the argument buffers only once the work that uses them is done
                run_blocking(self.host.run(program, {}, []))
            except RuntimeError as e:  # a browser without JSPI cannot block: on the host
                if "JSPI" not in str(e):
                    raise
                on_host = on_device + on_host
            finally:
                self.host.unload(program)
        if on_host:
            super().init_params([(n, spec, shape) for n, spec, shape, _ in on_host], seed=seed)

    async def run_into_async(self, name: str, plan: dict, *, buffer: int, writes: dict) -> None:
        """Write `writes` ({buffer: bytes}) and run a one-off `plan` (gpu_host.py's format)
        whose buffer number `buffer` is persistent buffer `name`: a program that fills a
        parameter on the device (io/gpu_dequant.py's decoders). The program stays loaded until
        destroy(), which keeps the buffer alive until a compiled program holds it too."""
        slot = self.store.get(name)
        if slot is None:
            raise KeyError(f"run_into_async: the backend has no persistent buffer {name!r}; "
                           "compile a program that declares it first")
        buffers = [dict(b) for b in plan["buffers"]]
        buffers[buffer]["persistent"] = self._key(name)
        program = self.host.load({**plan, "buffers": buffers})
        self.programs.append(program)
        if slot.home is None:
            slot.home, slot.shadow = (program, buffer), None
        await self.host.run(program, writes, [])

    def prepare(self, graph, options=None):
        limits = self.limits if options is None else _emulated(replace(self.limits, options=options))
        graph = _f16_program(graph, getattr(self.host, "features", None), self.limits.adapter,
                             limits.options.f16_emulation)
        # a host that can start compiling kernels while the rest is lowered gets each new one
        half = [name for name, slot in self.store.items() if slot.half]
        lowered, names = lower(graph, limits, self._key,
                               on_pipeline=getattr(self.host, "prefetch", None), half_names=half)
        program = self.host.load(lowered.plan)
        self.programs.append(program)
        for name, buf in lowered.persistent.items():
            slot = self.store.get(name)
            if slot is None:  # a writeback target nobody ensured: zeros
                node = graph[graph.writebacks[name]]
                slot = self.store[name] = _Slot(node.shape, node.dtype)
            if slot.home is None:
                slot.home = (program, buf)
                if slot.shadow is not None:
                    self.host.write(program, buf, slot.shadow)
                    slot.shadow = None
        for buf, data in lowered.const_data.items():
            self.host.write(program, buf, data)
        return WebGPUProgram(self, lowered, names, program)

    def renewed(self) -> "WebGPUBackend":
        # the default host of this process: a lost shared device is replaced by a new one
        return WebGPUBackend()

    def destroy(self) -> None:
        for p in self.programs:
            self.host.unload(p)
        self.programs = []
        for slot in self.store.values():
            slot.home = None


class WebGPUProgram:
    """One graph loaded on a host: `run(feeds, fetch)` per step."""

    def __init__(self, backend: WebGPUBackend, lowered, names, program: int):
        self.backend, self.lowered, self.program = backend, lowered, program
        self.kernel_names = names

    @property
    def kernel_count(self) -> int:
        return self.lowered.kernel_count

    @property
    def plan(self) -> dict:
        return self.lowered.plan

    def memory_report(self) -> dict:
        """planned_bytes (all buffers of the plan) vs naive_bytes (every tensor of the graph
        in its own buffer), persistent/input/const/pool bytes, counts."""
        return dict(self.lowered.report)

    async def profile(self, feeds: dict):
        """One step with per-kernel timing: a profile.Profile."""
        from ..profile import profile_program
        return await profile_program(self, feeds)

    async def run(self, feeds: dict, fetch: list[str]) -> dict:
        low = self.lowered
        writes = {low.feeds[k]: v.tobytes() for k, v in feeds.items() if k in low.feeds}
        reads = list(dict.fromkeys(low.outputs[k][0] for k in fetch if k in low.outputs))
        data = dict(zip(reads, await self.backend.host.run(self.program, writes, reads)))
        out = {}
        for k in fetch:
            if k in low.empty_outputs:
                out[k] = HostArray(low.empty_outputs[k][1], shape=low.empty_outputs[k][0])
                continue
            buf, off, nbytes, shape, dtype = low.outputs[k]
            out[k] = device_result(data[buf], off, nbytes, dtype, shape)
        return out
