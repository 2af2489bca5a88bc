"""GGUF blocks dequantized on the GPU, straight into a parameter buffer of a WebGPU backend.

Pure-Python dequantization costs about one Python float operation per value (a minute or
more for GPT-2 124M in the browser worker; bench/gguf_dequant.py). On backend="webgpu" the
raw blocks can instead be uploaded as they are (a Q4_K weight is 1/7 of its f32 bytes) and a
one-dispatch WGSL kernel writes the f32 values into the parameter's persistent buffer: a plan
in the format every compiled program uses (backends/gpu_host.py), which the backend runs into
that buffer (WebGPUBackend.run_into_async; backends without `runs_plans` take the host path).

    from webgrad.io import gguf, gpu_dequant
    f = gguf.load(path)
    gpu_dequant.write(c.backend, "h.0.mlp.c_fc.weight", f.tensors["blk.0.ffn_up.weight"],
                      transpose=True)     # GGUF [out, in] -> transformers' Conv1D [in, out]

Values are bit-equal to gguf.quants.dequantize (tests/test_gguf_gpu.py): each kernel does the
host formulas in f32, where every product is exact (f16 scale times a small integer) and
Q4_K's one subtraction rounds once, as WGSL's f32 arithmetic is correctly rounded. Other
backends get the host path (GGUFTensor.dequantize), so callers need not care which ran.
Consumed by GPT-2 loading on WebGPU with keep_quantized=False (f32 weights on the GPU) and
the tests; by default GPT2.from_gguf keeps the blocks instead and its matmuls decode them in
registers (webgrad/quant.py, codegen/quant.py).
"""
from __future__ import annotations

from math import prod

from ..blocking import run_blocking

# per-type WGSL: element e of the tensor (row-major over its numpy shape) from the blocks
_BODY = {
    "F16": """
    return f16_at(2u * e);""",
    "Q8_0": """
    let b = e / 32u;
    let j = e % 32u;
    let q = i32(byte_at(34u * b + 2u + j) << 24u) >> 24u;   // sign-extend the int8
    return f16_at(34u * b) * f32(q);""",
    "Q4_0": """
    let b = e / 32u;
    let j = e % 32u;
    let packed = byte_at(18u * b + 2u + (j % 16u));
    let n = select(packed & 15u, packed >> 4u, j >= 16u);
    return f16_at(18u * b) * f32(i32(n) - 8);""",
    "Q4_K": """
    let b = e / 256u;
    let w = e % 256u;
    let g = w / 64u;                       // 4 groups of 64: low nibbles, then high nibbles
    let hi = (w % 64u) >= 32u;
    let sub = 2u * g + select(0u, 1u, hi);
    let base = 144u * b;
    let packed = byte_at(base + 16u + 32u * g + (w % 32u));
    let q = select(packed & 15u, packed >> 4u, hi);
    var sc: u32;
    var mn: u32;
    if (sub < 4u) {
        sc = byte_at(base + 4u + sub) & 63u;
        mn = byte_at(base + 8u + sub) & 63u;
    } else {
        sc = (byte_at(base + 8u + sub) & 15u) | ((byte_at(base + sub) >> 6u) << 4u);
        mn = (byte_at(base + 8u + sub) >> 4u) | ((byte_at(base + 4u + sub) >> 6u) << 4u);
    }
    let d = f16_at(base) * f32(sc);
    let m = f16_at(base + 2u) * f32(mn);
    return d * f32(q) - m;""",
}
SUPPORTED = tuple(_BODY)

_WG = 64


def _wgsl(type_name: str, n: int, rows: int, cols: int, transpose: bool, nx: int) -> str:
    # transposed: element (r, c) of the [rows, cols] source lands at (c, r) of [cols, rows]
    dst = "(e % COLS) * ROWS + e / COLS" if transpose else "e"
    return f"""
const N: u32 = {n}u;
const ROWS: u32 = {rows}u;
const COLS: u32 = {cols}u;
@group(0) @binding(0) var<storage, read> raw: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

fn byte_at(k: u32) -> u32 {{
    return (raw[k >> 2u] >> ((k & 3u) * 8u)) & 255u;
}}

fn f16_at(k: u32) -> f32 {{
    return unpack2x16float(byte_at(k) | (byte_at(k + 1u) << 8u)).x;
}}

fn value(e: u32) -> f32 {{{_BODY[type_name]}
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
    from ..arrays import HostArray
    shape = tuple(tensor.shape)
    if transpose and len(shape) != 2:
        raise ValueError(f"gpu_dequant.write: transpose needs a 2-D tensor; {tensor.name!r} "
                         f"has shape {list(shape)}")
    want = tuple(reversed(shape)) if transpose else shape
    slot = backend.store.get(name)
    if slot is None:
        raise KeyError(f"gpu_dequant.write: the backend has no parameter {name!r}")
    have = tuple(slot.shape)
    if have != want:
        raise ValueError(f"gpu_dequant.write: {tensor.name!r} {tensor.type_name}{list(shape)}"
                         f"{' transposed' if transpose else ''} does not fit parameter {name!r} "
                         f"{list(have)}")
    if not backend.runs_plans or tensor.type_name not in SUPPORTED:
        h = tensor.dequantize()
        if transpose:
            from .gguf import _transpose
            h = _transpose(h)
        backend.write(name, HostArray("f32", h, shape=want))
        return
    n = prod(shape)
    rows, cols = shape if len(shape) == 2 else (1, n)
    raw = bytes(tensor.data) + bytes(-tensor.data.nbytes % 4)
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
