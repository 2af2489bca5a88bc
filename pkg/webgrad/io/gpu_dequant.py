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

F16 and BF16 tensors take the same road (two values a word; safetensors files' too, through
`write_raw_async`: Llama.from_pretrained sends a bf16 file's bytes up as they are, half the
f32 bytes and no host pass over them): BF16 is the top half of an f32, so its kernel shifts
the bits into place and stores them as u32, exact whatever the value (subnormals, NaN
payloads). Values are bit-equal to gguf.quants.dequantize (tests/test_gguf_gpu.py) and to
torch's bf16 -> f32 (tests/test_llama.py): each quant kernel does the host formulas in f32, where every product is exact (f16 scale times a small integer) and
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
from ..arrays import align      # the parameter's buffer sized as compiled programs size it
from ..quants import FORMATS, f16_wgsl, transcode

SUPPORTED = ("F16", "BF16") + tuple(FORMATS)

_WG = 64


def _bf16_wgsl(w: str, n: int) -> str:
    # element e of bf16 values, two a word of `w`, as the bits of its f32 (the low half zero)
    return f"""
  let word = {w}[e >> 1u];
  return select(word << 16u, word & 0xffff0000u, (e & 1u) == 1u);"""


def _wgsl(type_name: str, n: int, rows: int, cols: int, transpose: bool, nx: int) -> str:
    # transposed: element (r, c) of the [rows, cols] source lands at (c, r) of [cols, rows]
    dst = "(e % COLS) * ROWS + e / COLS" if transpose else "e"
    if type_name == "BF16":
        body, out = _bf16_wgsl("raw", n), "u32"      # bits moved, never rounded or flushed
    else:
        body, out = (f16_wgsl if type_name == "F16" else FORMATS[type_name].wgsl)("raw", n), "f32"
    return f"""
const N: u32 = {n}u;
const ROWS: u32 = {rows}u;
const COLS: u32 = {cols}u;
@group(0) @binding(0) var<storage, read> raw: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<{out}>;

fn value(e: u32) -> {out} {{{body}
}}

@compute @workgroup_size({_WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let e = (wg.y * {nx}u + wg.x) * {_WG}u + li;
    if (e < N) {{
        out[{dst}] = value(e);
    }}
}}
"""


def on_gpu(backend, name: str, type_name: str) -> bool:
    """Whether write_raw_async can decode `type_name` into parameter `name` of `backend` (a
    WebGPU backend whose buffer is f32); otherwise the caller decodes on the host."""
    slot = backend.store.get(name)
    return (backend.runs_plans and type_name in SUPPORTED and slot is not None
            and not getattr(slot, "half", False))   # f16 buffers: the decoders write f32


def _widen_wgsl(type_name: str, n8: int, nx: int) -> str:
    # 8 halves (one vec4 of words) in, 8 f32 out a thread: an eighth of the invocations of
    # the one-value kernel, which counts on a CPU adapter (lavapipe: 12 M values/s against
    # what a memcpy does)
    if type_name == "BF16":
        out, pair = "u32", ("vec4<u32>(a << 16u, a & 0xffff0000u, b << 16u, b & 0xffff0000u)")
    else:
        out, pair = "f32", "vec4<f32>(unpack2x16float(a), unpack2x16float(b))"
    return f"""
const N8: u32 = {n8}u;
@group(0) @binding(0) var<storage, read> raw: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<{out}>>;

fn pair(a: u32, b: u32) -> vec4<{out}> {{
    return {pair};
}}

@compute @workgroup_size({_WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let i = (wg.y * {nx}u + wg.x) * {_WG}u + li;
    if (i < N8) {{
        let w = raw[i];
        out[2u * i] = pair(w.x, w.y);
        out[2u * i + 1u] = pair(w.z, w.w);
    }}
}}
"""


async def write_async(backend, name: str, tensor, *, transpose: bool = False) -> None:
    """Write `tensor` (a GGUFTensor) dequantized into parameter `name` of `backend`; on
    WebGPU the blocks are dequantized by a kernel, elsewhere on the host. transpose=True
    writes a 2-D tensor transposed (GGUF's [out, in] into an [in, out] parameter)."""
    from ..arrays import HostArray, transpose2d
    shape = tuple(tensor.shape)
    _check(backend, name, tensor.name, tensor.type_name, shape, transpose)
    if not on_gpu(backend, name, tensor.type_name):
        h = tensor.dequantize()
        if transpose:
            h = transpose2d(h)
        want = tuple(reversed(shape)) if transpose else shape
        backend.write(name, HostArray("f32", h, shape=want))
        return
    await write_raw_async(backend, name, tensor.type_name, shape, tensor.data,
                          transpose=transpose, label=tensor.name)


def _check(backend, name, label, type_name, shape, transpose) -> None:
    if transpose and len(shape) != 2:
        raise ValueError(f"gpu_dequant.write: transpose needs a 2-D tensor; {label!r} "
                         f"has shape {list(shape)}")
    want = tuple(reversed(shape)) if transpose else shape
    have = backend.shape_of(name)
    if have is None:
        raise KeyError(f"gpu_dequant.write: the backend has no parameter {name!r}")
    slot = backend.store[name]
    if have != want:
        raise ValueError(f"gpu_dequant.write: {label!r} {type_name}{list(shape)}"
                         f"{' transposed' if transpose else ''} does not fit parameter {name!r} "
                         f"{list(have)}")


async def write_raw_async(backend, name: str, type_name: str, shape, data, *,
                          transpose: bool = False, label: str | None = None) -> None:
    """Upload `data` (the bytes of a tensor of `type_name` and `shape`: F16, BF16 or a
    quants format, little-endian as files hold them) as they are and decode them on the GPU
    into parameter `name` (on_gpu(...) must hold)."""
    shape = tuple(shape)
    label = label or name
    _check(backend, name, label, type_name, shape, transpose)
    if not on_gpu(backend, name, type_name):
        raise ValueError(f"gpu_dequant.write_raw_async: {type_name} into {name!r} is not decoded "
                         "on this backend (check on_gpu first and decode on the host)")
    n = prod(shape)
    rows, cols = shape if len(shape) == 2 else (1, n)
    raw = memoryview(data).cast("B")
    if type_name not in ("F16", "BF16"):
        raw = memoryview(transcode(type_name, raw))
    if raw.nbytes % 4:                     # (a file's bytes are sent as they are otherwise)
        raw = memoryview(bytes(raw) + bytes(-raw.nbytes % 4))
    wide = type_name in ("F16", "BF16") and not transpose and n % 8 == 0
    groups = -(-(n // 8 if wide else n) // _WG)
    nx = min(groups, backend.limits.max_compute_workgroups_per_dimension)
    ny = -(-groups // nx)
    wgsl = _widen_wgsl(type_name, n // 8, nx) if wide else _wgsl(type_name, n, rows, cols, transpose, nx)
    plan = {
        "buffers": [{"size": max(len(raw), 4), "label": f"{type_name} bytes of {label}"},
                    {"size": align(4 * n), "label": name}],
        "pipelines": [{"wgsl": wgsl}],
        "commands": [{"op": "dispatch", "pipeline": 0, "bindings": [0, 1],
                      "workgroups": [nx, ny, 1]}],
    }
    await backend.run_into_async(name, plan, buffer=1, writes={0: raw})


def _transcode_wgsl(fmt, nb: int, nx: int) -> str:
    # word w of quants' layout (words.py): the blocks' bytes but the f16 scale, block by
    # block, then the scales two a word. Blocks and the scale's offset are even, so a word
    # of a block whose scale opens or closes it is one or two reads; others go byte by byte
    if fmt.f16_at in (0, fmt.nbytes - 2):
        body = f"\n    return word_at(b * SIZE + j + {2 if fmt.f16_at == 0 else 0}u);"
    else:
        body = ("\n    return body_byte(b, j) | (body_byte(b, j + 1u) << 8u) | (body_byte(b, j + 2u) << 16u)"
                "\n           | (body_byte(b, j + 3u) << 24u);")
    return f"""
const NB: u32 = {nb}u;
const SIZE: u32 = {fmt.nbytes}u;
const AT: u32 = {fmt.f16_at}u;
const BODY: u32 = {(fmt.nbytes - 2) // 4}u;
const WORDS: u32 = {nb * (fmt.nbytes - 2) // 4 + (nb + 1) // 2}u;
@group(0) @binding(0) var<storage, read> raw: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;

fn byte_at(p: u32) -> u32 {{
    return (raw[p >> 2u] >> ((p & 3u) * 8u)) & 0xffu;
}}

fn body_byte(b: u32, j: u32) -> u32 {{
    return byte_at(b * SIZE + select(j + 2u, j, j < AT));
}}

fn word_at(p: u32) -> u32 {{
    // 4 bytes from an even offset: one aligned word or the halves of two
    let i = p >> 2u;
    if ((p & 2u) == 0u) {{
        return raw[i];
    }}
    return (raw[i] >> 16u) | (raw[i + 1u] << 16u);
}}

fn body_word(b: u32, j: u32) -> u32 {{{body}
}}

fn scale(b: u32) -> u32 {{
    let p = b * SIZE + AT;
    return (raw[p >> 2u] >> ((p & 2u) * 8u)) & 0xffffu;
}}

@compute @workgroup_size({_WG})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
    let w = (wg.y * {nx}u + wg.x) * {_WG}u + li;
    if (w >= WORDS) {{
        return;
    }}
    if (w < NB * BODY) {{
        let b = w / BODY;
        let j = (w % BODY) * 4u;
        out[w] = body_word(b, j);
    }} else {{
        let b = 2u * (w - NB * BODY);
        out[w] = scale(b) | select(0u, scale(b + 1u) << 16u, b + 1u < NB);
    }}
}}
"""


async def write_blocks_async(backend, name: str, qtype: str, raw) -> None:
    """Write GGUF blocks of `qtype` (bytes) into parameter `name` (quants' word layout, i32)
    of a WebGPU backend: the file's bytes go up as they are and a kernel moves the f16
    scales out (what quants.transcode does on the host, which costs seconds a model in the
    browser worker without numpy)."""
    fmt = FORMATS[qtype]
    raw = memoryview(raw).cast("B")
    nb = raw.nbytes // fmt.nbytes
    slot = backend.store.get(name)
    words = nb * (fmt.nbytes - 2) // 4 + (nb + 1) // 2 if fmt.f16_at is not None else raw.nbytes // 4
    if slot is None or raw.nbytes % fmt.nbytes or 4 * prod(slot.shape) != 4 * words:
        raise ValueError(f"gpu_dequant.write_blocks_async: {raw.nbytes} bytes of {qtype} blocks "
                         f"do not fit parameter {name!r}")
    if fmt.f16_at is None:                 # whole words already: the layout is the file's
        backend.write(name, _words(raw))
        return
    if raw.nbytes % 4:
        raw = memoryview(bytes(raw) + bytes(-raw.nbytes % 4))
    groups = -(-words // _WG)
    nx = min(groups, backend.limits.max_compute_workgroups_per_dimension)
    ny = -(-groups // nx)
    plan = {
        "buffers": [{"size": max(raw.nbytes, 4), "label": f"{qtype} blocks of {name}"},
                    {"size": align(4 * words), "label": name}],
        "pipelines": [{"wgsl": _transcode_wgsl(fmt, nb, nx)}],
        "commands": [{"op": "dispatch", "pipeline": 0, "bindings": [0, 1],
                      "workgroups": [nx, ny, 1]}],
    }
    await backend.run_into_async(name, plan, buffer=1, writes={0: raw})


def _words(raw):
    from ..arrays import HostArray
    h = HostArray("i32", shape=(raw.nbytes // 4,))
    h.frombytes(raw)
    return h


def write(backend, name: str, tensor, *, transpose: bool = False) -> None:
    return run_blocking(write_async(backend, name, tensor, transpose=transpose))
