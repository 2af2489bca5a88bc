"""GGUF blocks dequantized on the GPU, straight into a parameter buffer of a WebGPU backend.

Pure-Python dequantization costs about one Python float operation per value (a minute or
more for GPT-2 124M in the browser worker; bench/gguf_dequant.py). On backend="webgpu" the
raw blocks can instead be uploaded (a Q4_K weight is 1/7 of its f32 bytes), in the word
layout of webgrad.quants (the file's bytes, permuted), and a one-dispatch WGSL kernel,
wrapped around the format's own decoder (the one the quantized matmuls use), writes the f32
values into the parameter's persistent buffer: a plan in the format every compiled program
uses (backends/gpu_host.py), which the backend runs into that buffer
(WebGPUBackend.run_into_async; backends without `runs_plans` take the host path).

    from webgrad.io import gguf, gpu_dequant
    f = gguf.load(path)
    gpu_dequant.write(c.backend, "h.0.mlp.c_fc.weight", f.tensors["blk.0.ffn_up.weight"],
                      transpose=True)     # GGUF [out, in] -> transformers' Conv1D [in, out]

Values are bit-equal to gguf.quants.dequantize (tests/test_gguf_gpu.py): each kernel does the
host formulas in f32, where every product is exact (f16 scale times a small integer) and
a min's one subtraction (Q4_K, Q5_K) rounds once, as WGSL's f32 arithmetic is correctly
rounded. Other
backends get the host path (GGUFTensor.dequantize), so callers need not care which ran.
Consumed by GPT-2 loading on WebGPU with keep_quantized=False (f32 weights on the GPU) and
the tests; by default GPT2.from_gguf keeps the blocks instead and its matmuls decode them in
registers (webgrad/quants, codegen/quant.py).
"""
from __future__ import annotations

from math import prod

from ..blocking import run_blocking
from ..quants import FORMATS, f16_wgsl, transcode

SUPPORTED = ("F16",) + tuple(FORMATS)

_WG = 64


def _wgsl(type_name: str, n: int, rows: int, cols: int, transpose: bool, nx: int) -> str:
    # transposed: element (r, c) of the [rows, cols] source lands at (c, r) of [cols, rows]
    dst = "(e % COLS) * ROWS + e / COLS" if transpose else "e"
    body = (f16_wgsl if type_name == "F16" else FORMATS[type_name].wgsl)("raw", n)
    return f"""
const N: u32 = {n}u;
const ROWS: u32 = {rows}u;
const COLS: u32 = {cols}u;
@group(0) @binding(0) var<storage, read> raw: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

fn value(e: u32) -> f32 {{{body}
}}

@compute @workgroup_size({_WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let e = (wg.y * {nx}u + wg.x) * {_WG}u + li;
    if (e < N) {{
        out[{dst}] = value(e);
    }}
}}
"""


async def write_async(backend, name: str, tensor, *, transpose: bool = False) -> None:
    """Write `tensor` (a GGUFTensor) dequantized into parameter `name` of `backend`; on
    WebGPU the blocks are dequantized by a kernel, elsewhere on the host. transpose=True
    writes a 2-D tensor transposed (GGUF's [out, in] into an [in, out] parameter)."""
    from ..arrays import HostArray, transpose2d
    shape = tuple(tensor.shape)
    if transpose and len(shape) != 2:
        raise ValueError(f"gpu_dequant.write: transpose needs a 2-D tensor; {tensor.name!r} "
                         f"has shape {list(shape)}")
    want = tuple(reversed(shape)) if transpose else shape
    have = backend.shape_of(name)
    if have is None:
        raise KeyError(f"gpu_dequant.write: the backend has no parameter {name!r}")
    slot = backend.store[name]
    if have != want:
        raise ValueError(f"gpu_dequant.write: {tensor.name!r} {tensor.type_name}{list(shape)}"
                         f"{' transposed' if transpose else ''} does not fit parameter {name!r} "
                         f"{list(have)}")
    if not backend.runs_plans or tensor.type_name not in SUPPORTED or getattr(slot, "half", False):
        # (an f16 buffer: the decoders write f32, so the host decodes and write() rounds)
        h = tensor.dequantize()
        if transpose:
            h = transpose2d(h)
        backend.write(name, HostArray("f32", h, shape=want))
        return
    n = prod(shape)
    rows, cols = shape if len(shape) == 2 else (1, n)
    raw = bytes(tensor.data) if tensor.type_name == "F16" else transcode(tensor.type_name, tensor.data)
    raw += bytes(-len(raw) % 4)
    groups = -(-n // _WG)
    nx = min(groups, backend.limits.max_compute_workgroups_per_dimension)
    ny = -(-groups // nx)
    plan = {
        "buffers": [{"size": max(len(raw), 4), "label": f"gguf blocks of {tensor.name}"},
                    {"size": 4 * n, "label": name}],
        "pipelines": [{"wgsl": _wgsl(tensor.type_name, n, rows, cols, transpose, nx)}],
        "commands": [{"op": "dispatch", "pipeline": 0, "bindings": [0, 1],
                      "workgroups": [nx, ny, 1]}],
    }
    await backend.run_into_async(name, plan, buffer=1, writes={0: raw})


def write(backend, name: str, tensor, *, transpose: bool = False) -> None:
    return run_blocking(write_async(backend, name, tensor, transpose=transpose))
