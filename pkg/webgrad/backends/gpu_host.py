"""The seam between a WebGPU program plan and the machine that runs it.

Python plans, the host replays. `codegen.lower` (called by backends/webgpu.py) turns a Graph
into a `Plan` — plain, JSON-able data: buffer sizes, WGSL texts, and an ordered list of
commands. A host loads a plan once and then runs it once per step with only the per-step
data crossing over. Two hosts implement this protocol and nothing else differs between them:

  NativeHost  (webgpu_native.py)   wgpu-py in CPython (lavapipe, Vulkan, Dawn via wgpudawn),
                                   on webgpu_device.py's process-wide device
  BrowserHost (webgpu_browser.py)  navigator.gpu in the Pyodide worker; the per-step loop
                                   is worker/replay.mjs, a short JS loop, because encoding
                                   300 dispatches through the FFI costs ~2.5 ms vs 0.14 ms

Plan (all plain data; bytes sizes are multiples of 4):
  buffers:   [{"size": int, "label": str}]                       index = buffer id
  pipelines: [{"wgsl": str}]                                     entry point "main";
             hosts cache compiled pipelines by WGSL text
  commands:  [{"op": "dispatch", "pipeline": int, "bindings": [buffer id, ...],
               "workgroups": [x, y, z]},                          binding k = @binding(k), group 0
              {"op": "copy", "src": int, "dst": int, "size": int,
               "src_offset": int, "dst_offset": int}]
A step = write the per-step buffers, encode all commands into ONE queue submission, read
back the requested buffers. Buffers of a plan persist across runs (params, optimizer state).

Optional fields (hosts must accept them; older plans simply lack them):
  buffers[i]["persistent"]: str   a buffer SHARED by every plan loaded on the same host that
             names the same key: created zero-filled by the first load that names it, kept with
             its contents while any program naming it is loaded (freed with the last unload).
             This is how a training step and the forward programs compiled beside it see one
             set of parameters; `write`/`read` through any of those programs reach the same
             buffer. The sizes named by all such plans agree.
"""
from __future__ import annotations


class DeviceLostError(RuntimeError):
    """The GPU device was lost; the compiled program cannot continue (recompile to recover)."""


class FeatureMissingError(RuntimeError):
    """A kernel needs an optional WebGPU feature that this device was not made with."""


# the WGSL language feature of dot4I8Packed (KernelOptions.gemv_q8_dot's kernels)
PACKED_DOT = "packed_4x8_integer_dot_product"

# WGSL `enable` extensions -> the WebGPU feature a device needs for them
ENABLE_FEATURES = {"f16": "shader-f16", "subgroups": "subgroups",
                   "chromium_experimental_subgroup_matrix": "chromium-experimental-subgroup-matrix"}


def wgsl_features(wgsl: str) -> set[str]:
    """The WebGPU features that the `enable` directives at the head of `wgsl` need."""
    out = set()
    for line in wgsl.splitlines():
        line = line.strip()
        if line.startswith("enable ") and line.endswith(";"):
            for name in line[len("enable "):-1].split(","):
                name = name.strip()
                out.add(ENABLE_FEATURES.get(name, name))
    return out


def check_features(wgsls, have, info: str, language=frozenset({PACKED_DOT})) -> None:
    """Refuse, before anything is created, kernels that need a feature the device lacks
    (a program compiled for one adapter's features, loaded on another's); `language`: the
    WGSL language features the host's compiler has (dot4I8Packed needs PACKED_DOT)."""
    need = set().union(*(wgsl_features(w) for w in wgsls)) if wgsls else set()
    missing = sorted(need - set(have))
    if PACKED_DOT not in language and any("dot4I8Packed(" in w for w in wgsls or ()):
        raise FeatureMissingError(
            f"this program's kernels use WGSL's dot4I8Packed, which this browser's WGSL ({info}) "
            f"lacks (navigator.gpu.wgslLanguageFeatures has no {PACKED_DOT}); compile the "
            "program for this device (codegen then keeps the float form)")
    if missing:
        raise FeatureMissingError(
            f"this program's kernels need the WebGPU feature(s) {', '.join(missing)}, which the "
            f"device ({info}) was not made with (it has: {', '.join(sorted(have)) or 'none'}); "
            "compile the program for this device, or run it on an adapter that offers them")


class GPUHost:
    """What a WebGPU host provides. Every method that waits on the GPU is async."""

    limits: dict  # "max_storage_buffer_binding_size", "max_compute_workgroups_per_dimension",
                  # "max_compute_workgroup_size_x", "max_compute_invocations_per_workgroup", ...
    info: str     # adapter description, for messages
    features: frozenset = frozenset()  # optional WebGPU features the device was requested
                                       # with ("subgroups": codegen's workgroup reductions)
    # WGSL language features the host's shader compiler has (navigator.gpu's
    # wgslLanguageFeatures in a browser; Tint and naga natively have this one)
    wgsl_features: frozenset = frozenset({PACKED_DOT})

    def load(self, plan: dict) -> int:
        """Create the plan's buffers and pipelines; returns a program handle. The plan's
        pipelines not cached yet are created together, so the driver compiles them in
        parallel (NativeHost: on a pool of threads, started while lowering emitted them;
        BrowserHost: createComputePipelineAsync, all issued before any is waited for); one
        that fails raises an error naming its kernel, with its WGSL (BrowserHost: WGSLError)."""
        raise NotImplementedError

    def write(self, program: int, buffer: int, data, offset: int = 0) -> None:
        """Queue a write of bytes-like `data` into a plan buffer (lands before the next run)."""
        raise NotImplementedError

    async def run(self, program: int, writes: dict[int, bytes], reads: list[int]) -> list[bytes]:
        """Write `writes` (buffer id -> bytes), submit every command once, return the bytes of
        each buffer in `reads` (in order). Any bytes-like object will do (NativeHost hands
        back numpy uint8 arrays where numpy imports, which large results then view)."""
        raise NotImplementedError

    async def read(self, program: int, buffer: int) -> bytes:
        raise NotImplementedError

    def unload(self, program: int) -> None:
        raise NotImplementedError
