"""The random primitive rand_uniform and its generator's specification.

lowbias32, rand_key and rand_bits are the counter-based hash every executor reproduces bit
for bit: the torch backend and init.py call them, onnx/lower.py and codegen/random.py write
the same hash in their own languages, and tests compare each against rand_bits.
"""
from __future__ import annotations

from math import prod

from .registry import Cost, ShapeError, defprim, per_element


M32 = 0xFFFFFFFF


def lowbias32(np, x):
    """rand_bits' 32-bit integer hash (two multiply-xorshift rounds) of a Python int
    (np=None) or an int64 array of numpy or torch; the torch executor and init.py use it."""
    # int64 lanes keep the low 32 bits exact on every executor, WGSL does the same in u32
    x = x & M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def rand_key(counter: int, seed: int) -> int:
    """H(seed + H(counter)), the per-step key of rand_bits, in Python ints: exact, where an
    int64 scalar product overflows (and warns). Every executor derives its key here."""
    return lowbias32(None, (seed + lowbias32(None, int(counter) & M32)) & M32)


def rand_bits(np, counter: int, seed: int, n: int):
    """The uniform generator's spec: u = (h >> 8) / 2^24 with h = H(i + H(seed + H(counter)))."""
    return lowbias32(np, np.arange(n, dtype=np.int64) + rand_key(counter, seed))


def _rand_ref(np, a, counter):
    n = prod(a["shape"])
    h = rand_bits(np, int(counter.reshape(-1)[0]), a["seed"], n)
    return ((h >> 8).astype(np.float32) * np.float32(2.0 ** -24)).reshape(a["shape"])


def _rand_shape(ins, attrs):
    if ins[0].shape not in ((), (1,)):
        raise ShapeError("the counter must be a scalar")
    return tuple(attrs["shape"]), "f32"


# recompute 6: two multiply-xorshift rounds of the hash per number
defprim("rand_uniform", "random", shape=_rand_shape, ref=_rand_ref, grad=None,
        cost=Cost(per_element, recompute=6),
        doc="counter-based uniform [0, 1) numbers: same bits on every executor; the "
            "counter is the step number, so dropout masks change every step")
