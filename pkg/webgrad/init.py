"""Parameter initialisers, as plain data (they cross the worker boundary like schedules).

`Module.param(shape, init=...)` takes one of these, or the strings "randn", "zeros",
"ones". Values come from a counter-based generator keyed by the compile seed and the
parameter's name, so a given seed always gives the same model, `reset()` restores it
exactly, and every executor computes the SAME bits:

  key      = H(seed * 0x9E3779B9 + fnv1a(name))          H: the lowbias32 hash of rand_bits
  uniform  h = H(key + i);  x = (int(h >> 8) - 2^23) * f32(bound / 2^23)      in [-b, b)
  randn    a = H(key + 2i), b = H(key + 2i + 1);  s = the sum of the four 16-bit halves of
           a and b (Irwin-Hall of 4 uniforms: mean 2 * 65535, std sqrt((2^32 - 1) / 3));
           x = (s - 131070) * f32(std / sqrt((2^32 - 1) / 3))

All integer arithmetic is exact in u32 and the one float operation is a single f32 product
of an exactly representable integer, which IEEE (and Vulkan/WGSL) rounds the same way
everywhere: the WebGPU backend computes these on the device (codegen/initparams.py, no
host loop, no upload), the CPU executors with numpy (`values_numpy`), and a host without
numpy with plain Python (`generate`), all bit-identical. "randn" is thus a normal
approximation bounded at +-3.46 std (kurtosis 2.6 instead of 3): for initial weights the
tails do not matter, and exact agreement between backends does.
"""
from __future__ import annotations

import array
import math
import struct
from dataclasses import dataclass
from math import prod

from .arrays import flat_list


@dataclass(frozen=True)
class Init:
    kind: str                  # randn | kaiming | zeros | ones | literal | uniform
    scale: float = 0.02        # randn std, or kaiming gain, or uniform bound
    data: tuple | None = None  # literal values, flat
    zero_rows: tuple[int, ...] = ()  # rows (along axis 0) set to zero after drawing

    @property
    def decays(self) -> bool:
        """tensorgrad's rule: weight decay applies to randn/kaiming/literal params only."""
        return self.kind not in ("zeros", "ones")


def randn(scale: float = 0.02) -> Init: return Init("randn", float(scale))
def kaiming(gain: float = math.sqrt(2.0)) -> Init: return Init("kaiming", float(gain))
def uniform(bound: float) -> Init: return Init("uniform", float(bound))
def zeros() -> Init: return Init("zeros")
def ones() -> Init: return Init("ones")


def literal(values) -> Init:
    """Exact initial values: a flat or nested list, array.array, numpy array, memoryview."""
    if hasattr(values, "tolist"):  # numpy, array.array, memoryview
        values = values.tolist()
    flat: list = []
    flat_list(values, flat)
    return Init("literal", data=tuple(float(v) for v in flat))


def with_zero_rows(spec, rows) -> Init:
    """`spec` with the given rows (axis 0) zeroed: an embedding's padding row, as torch's
    nn.Embedding(padding_idx=) starts it."""
    import dataclasses
    return dataclasses.replace(as_init(spec), zero_rows=tuple(int(r) for r in rows))


def as_init(spec) -> Init:
    if isinstance(spec, Init):
        return spec
    if spec in ("randn", None):
        return randn()
    if spec in ("zeros", "ones", "kaiming"):
        return {"zeros": zeros, "ones": ones, "kaiming": kaiming}[spec]()
    raise ValueError(f"unknown init {spec!r}: use 'randn', 'zeros', 'ones' or an init.* "
                     "constructor (init.kaiming(), init.randn(scale=...), init.literal(values))")


def fan_in(shape) -> int:
    """[d_in, d_out] weights (x @ W) have fan-in d_in; conv weights [O, C, kh, kw] C*kh*kw."""
    if len(shape) <= 1:
        return max(prod(shape), 1)
    # a zero-size weight ([0, n], [O, 0, k, k]) has no values to draw: any std will do
    return max(shape[0] if len(shape) == 2 else prod(shape[1:]), 1)


def check_seed(seed, where: str) -> int:
    """A seed is a whole number (a Python or numpy integer, not a bool, float or str): 1.9
    would otherwise be taken as 1 and "abc" fail deep inside the generator."""
    if isinstance(seed, bool) or not hasattr(seed, "__index__"):
        raise TypeError(f"{where}: seed must be an int (e.g. seed=0), got {type(seed).__name__} "
                        f"{seed!r}")
    return seed.__index__()


M32 = 0xFFFFFFFF
IRWIN_HALL_MEAN = 2 * 0xFFFF                      # the mean of four uniform 16-bit integers
IRWIN_HALL_STD = math.sqrt((2.0 ** 32 - 1) / 3)   # ... and their std


def _hash(x: int) -> int:
    """lowbias32 (primitives.lowbias32, rand_bits' hash) on a Python int, inlined: the
    no-numpy path calls it twice per value."""
    x &= M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def param_key(seed: int, name: str) -> int:
    """The u32 stream key of parameter `name` under compile seed `seed`."""
    h = 0x811C9DC5  # FNV-1a over the name's UTF-8 bytes
    for byte in name.encode():
        h = ((h ^ byte) * 0x01000193) & M32
    return _hash(int(seed) * 0x9E3779B9 + h)


def _f32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def recipe(spec: Init, shape, *, seed: int, name: str) -> tuple[str, int, float]:
    """(kind, key, multiplier) for the generator above: kind is "zeros", "ones", "literal",
    "uniform" or "randn" (kaiming is randn with std gain / sqrt(fan_in)); the multiplier is
    already rounded to f32."""
    if spec.kind in ("zeros", "ones", "literal"):
        return spec.kind, 0, 0.0
    key = param_key(seed, name)
    if spec.kind == "uniform":
        return "uniform", key, _f32(spec.scale / 2.0 ** 23)
    std = spec.scale if spec.kind == "randn" else spec.scale / math.sqrt(fan_in(shape))
    return "randn", key, _f32(std / IRWIN_HALL_STD)


def generate(spec: Init, shape, *, seed: int, name: str) -> list[float]:
    """The initial values as a flat list, in plain Python (the no-numpy path)."""
    vals = _draw(spec, shape, seed=seed, name=name)
    for r in _zero_rows(spec, shape):
        width = prod(shape[1:])
        vals[r * width:(r + 1) * width] = [0.0] * width
    return vals


def _zero_rows(spec: Init, shape) -> list[int]:
    """Rows set to zero after drawing (embedding padding_idx), negative ones from the end."""
    return [r % shape[0] for r in spec.zero_rows] if spec.zero_rows and shape else []


def _draw(spec: Init, shape, *, seed: int, name: str) -> list[float]:
    n = prod(shape)
    kind, key, mul = recipe(spec, shape, seed=seed, name=name)
    if kind in ("zeros", "ones"):
        return [0.0 if kind == "zeros" else 1.0] * n
    if kind == "literal":
        if len(spec.data) != n:
            raise ValueError(f"param {name!r}: init.literal has {len(spec.data)} values, "
                             f"shape {list(shape)} needs {n}")
        return list(spec.data)
    out = array.array("f", bytes(4 * n))
    if kind == "uniform":
        for i in range(n):
            out[i] = ((_hash(key + i) >> 8) - (1 << 23)) * mul
    else:
        for i in range(n):
            a, b = _hash(key + 2 * i), _hash(key + 2 * i + 1)
            out[i] = ((a & 0xFFFF) + (a >> 16) + (b & 0xFFFF) + (b >> 16) - IRWIN_HALL_MEAN) * mul
    return out.tolist()  # stored through f32: the one rounding of the product


def values_numpy(np, spec: Init, shape, *, seed: int, name: str, chunk: int = 1 << 14):
    """The same values as `generate`, as a float32 numpy array of `shape`, vectorised in
    cache-sized chunks (GPT-2's 124M values take about a second on one core)."""
    n = prod(shape)
    kind, key, mul = recipe(spec, shape, seed=seed, name=name)
    if kind in ("zeros", "ones", "literal"):
        return np.asarray(generate(spec, shape, seed=seed, name=name), np.float32).reshape(shape)
    out = np.empty(n, np.float32)
    per = 2 if kind == "randn" else 1
    ramp = np.arange(chunk, dtype=np.uint32) * np.uint32(per)
    x, y, t = (np.empty(chunk, np.uint32) for _ in range(3))
    c1, c2, lo16 = np.uint32(0x7FEB352D), np.uint32(0x846CA68B), np.uint32(0xFFFF)

    def hash_(x, t):  # lowbias32 in place, in u32 lanes (wrapping products)
        np.right_shift(x, 16, out=t); x ^= t; x *= c1
        np.right_shift(x, 15, out=t); x ^= t; x *= c2
        np.right_shift(x, 16, out=t); x ^= t

    for s in range(0, n, chunk):
        k = min(chunk, n - s)
        xs, ys, ts = x[:k], y[:k], t[:k]
        np.add(ramp[:k], np.uint32((key + per * s) & M32), out=xs)
        if kind == "uniform":
            hash_(xs, ts)
            xs >>= 8
            v = xs.view(np.int32)
            v -= 1 << 23
        else:
            np.add(xs, np.uint32(1), out=ys)
            hash_(xs, ts)
            hash_(ys, ts)
            np.bitwise_and(xs, lo16, out=ts); xs >>= 16; xs += ts
            np.bitwise_and(ys, lo16, out=ts); ys >>= 16; xs += ys; xs += ts
            v = xs.view(np.int32)
            v -= IRWIN_HALL_MEAN
        # int -> f32 is exact (|v| < 2^24), then ONE f32 product, as on the device
        np.multiply(v, np.float32(mul), out=out[s:s + k], dtype=np.float32, casting="unsafe")
    out = out.reshape(shape)
    for r in _zero_rows(spec, shape):
        out[r] = 0.0
    return out
