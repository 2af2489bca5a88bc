"""Quantized weights that stay quantized: the blocks as u32 words every executor reads, and
the specification of the `dequantize` primitive.

A quantized weight is a persistent i32 buffer of words (the blocks' bytes, little-endian),
read by `ops.dequantize(words, qtype=, shape=)`: the f32 tensor of `shape` (row-major,
blocks along the last axis) that the blocks encode. The reference and torch executors
dequantize (dequantize_numpy, the spec); on WebGPU `dequantize` is an expression
(codegen/quant.py): a matmul reading W^T through it decodes each element in registers as it
loads it, and an embedding decodes only the rows it gathers, so the f32 weights are never
stored.

Blocks whose size is a multiple of 4 bytes (Q4_K, Q5_K) are words as they are. Others
(Q8_0 and Q4_0 of 34 and 18 bytes, Q6_K of 210) are *transcoded* at load: each block
without its one f16 scale (at byte `f16_at` of the block, format.py) is whole words, so the
words hold those bodies of all blocks first, then the f16 scales, two per word:

    words [k b, k b + k)          block b without its scale (k = (bytes - 2) / 4)
    word  k nb + b / 2            block b's f16 scale, in half b % 2

The layout is a permutation of the file's bytes (the same bytes on the GPU as in the file,
plus at most 2 bytes of padding), and `raw_blocks` inverts it, so dequantization is the
formats' own decoders over the original blocks. Consumers: primitives/matmul.py (`dequantize`),
codegen/quant.py, module.py (a quantized ParamSpec), models/gpt2.py (GPT2.from_gguf keeps
quantized weights quantized), io/gpu_dequant.py, models/gpt2_cache.py.
"""
from __future__ import annotations

import array

from dataclasses import dataclass
from math import prod

from ..arrays import numpy_or_none
from .decode import dequantize
from .registry import FORMATS


@dataclass(frozen=True)
class QuantSpec:
    """A parameter held quantized: its ggml type and its stored shape (numpy order, blocks
    along the last axis). transposed: the parameter as declared is the stored tensor's
    transpose (a GGUF [out, in] matrix serving a transformers Conv1D [in, out] weight)."""
    qtype: str
    shape: tuple[int, ...]
    transposed: bool = False

    def __post_init__(self):
        check(self.qtype, self.shape, "QuantSpec")

    @property
    def words(self) -> int:
        return n_words(self.qtype, prod(self.shape))

    @property
    def declared_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape)) if self.transposed else tuple(self.shape)


def check(qtype: str, shape, what: str) -> None:
    if qtype not in FORMATS:
        raise ValueError(f"{what}: quantized type {qtype!r} is not kept quantized (supported: "
                         f"{', '.join(FORMATS)})")
    block = FORMATS[qtype].block
    if not shape or shape[-1] % block:
        raise ValueError(f"{what}: a {qtype} tensor's rows must be whole blocks of {block} "
                         f"values; shape {list(shape)} is not")


def n_words(qtype: str, n: int) -> int:
    """u32 words of the GPU layout of n values."""
    fmt = FORMATS[qtype]
    nb = n // fmt.block
    if fmt.f16_at is None:
        return nb * fmt.nbytes // 4
    return nb * (fmt.nbytes - 2) // 4 + (nb + 1) // 2


def _body_bytes(fmt) -> list[int]:
    """Offsets in a block of the bytes that stay in its body (all but the moved f16)."""
    return [j for j in range(fmt.nbytes) if j not in (fmt.f16_at, fmt.f16_at + 1)]


def transcode(qtype: str, raw, *, use_numpy: bool | None = None) -> bytes:
    """GGUF blocks -> the GPU layout (bytes of little-endian words). With numpy (None: when
    it is there), one gather of the body bytes; without, strided slices of bytes objects: C
    loops, fast enough in the browser worker. The same bytes either way."""
    fmt = FORMATS[qtype]
    size = fmt.nbytes
    n_raw = memoryview(raw).nbytes
    if n_raw % size:
        raise ValueError(f"transcode: {n_raw} bytes is not a whole number of {qtype} blocks "
                         f"({size} bytes each)")
    if fmt.f16_at is None:
        return bytes(raw)
    nb = n_raw // size
    np = numpy_or_none() if use_numpy is not False else None
    if np is not None:
        blocks = np.frombuffer(raw, np.uint8).reshape(nb, size)
        out = np.zeros(nb * (size - 2) + 4 * ((nb + 1) // 2), np.uint8)
        body, f = out[:nb * (size - 2)].reshape(nb, size - 2), fmt.f16_at
        body[:, :f] = blocks[:, :f]
        body[:, f:] = blocks[:, f + 2:]
        out[nb * (size - 2):][:2 * nb].reshape(nb, 2)[:] = blocks[:, fmt.f16_at:fmt.f16_at + 2]
        return out.tobytes()
    # blocks and the scale's offset are even: move 2-byte units, half the strided passes
    # (and elements) of a byte-wise copy; large blocks (Q6_K's 210 bytes) one join of each
    # block's body bytes instead of a pass per unit
    half, body = array.array("H"), (size - 2) // 2
    half.frombytes(raw)
    out = array.array("H", bytes(2 * (body * nb + 2 * ((nb + 1) // 2))))
    f = fmt.f16_at // 2
    if body > 32:
        mv, a = memoryview(raw).cast("B"), fmt.f16_at
        out[:body * nb] = array.array("H", b"".join(
            x for o in range(0, n_raw, size) for x in (mv[o:o + a], mv[o + a + 2:o + size])))
    else:
        for i, j in enumerate(k for k in range(size // 2) if k != f):
            out[i:body * nb:body] = half[j::size // 2]
    out[body * nb:body * nb + nb] = half[f::size // 2]
    return out.tobytes()


def raw_blocks(qtype: str, data, n: int) -> bytes:
    """The GPU layout of n values (bytes or a buffer of words) -> GGUF's blocks."""
    fmt = FORMATS[qtype]
    size = fmt.nbytes
    data = bytes(memoryview(data).cast("B"))
    nb = n // fmt.block
    if fmt.f16_at is None:
        return data[:nb * size]
    body = size - 2
    out = bytearray(size * nb)
    for i, j in enumerate(_body_bytes(fmt)):
        out[j::size] = data[i:body * nb:body]
    out[fmt.f16_at::size] = data[body * nb:body * nb + 2 * nb:2]
    out[fmt.f16_at + 1::size] = data[body * nb + 1:body * nb + 2 * nb:2]
    return bytes(out)


def dequantize_words(qtype: str, data, shape, *, use_numpy: bool = True):
    """array('f') of the values the words encode (row-major over shape)."""
    n = prod(shape)
    return dequantize(qtype, raw_blocks(qtype, data, n), n, what=f"{qtype} words",
                      use_numpy=use_numpy)


def dequantize_numpy(np, qtype: str, words, shape):
    """The `dequantize` primitive's reference: a float32 array of `shape`."""
    w = np.ascontiguousarray(words, dtype="<i4")
    out = np.frombuffer(dequantize_words(qtype, w.tobytes(), shape), dtype=np.float32)
    return out.reshape(tuple(shape)).copy()


__all__ = ["QuantSpec", "check", "n_words", "transcode", "raw_blocks", "dequantize_words",
           "dequantize_numpy"]
