"""Quantized weights that stay quantized: GGUF's Q8_0, Q4_0 and Q4_K blocks in a word layout
every executor reads, and the specification of the `dequantize` primitive.

A quantized weight is a persistent i32 buffer of words (the blocks' bytes, little-endian),
read by `ops.dequantize(words, qtype=, shape=)`: the f32 tensor of `shape` (row-major,
blocks along the last axis) that the blocks encode. The reference and torch executors
dequantize (the spec); on WebGPU `dequantize` is an expression (codegen/quant.py): a matmul
reading W^T through it decodes each element in registers as it loads it, and an embedding
decodes only the rows it gathers, so the f32 weights are never stored.

GGUF's Q8_0 (34-byte blocks) and Q4_0 (18-byte blocks) blocks are not 4-byte aligned, so
they are *transcoded* at load into an aligned layout: the quants of all blocks first, then
the f16 scales, two per word. Q4_K's 144-byte super-blocks are aligned and stay as they are:

  Q8_0  words [8 b, 8 b + 8)     the 32 int8 quants of block b (4 a word)
        word  8 nb + b / 2       block b's f16 scale d, in half b % 2      x = d * q
  Q4_0  words [4 b, 4 b + 4)     block b's 16 bytes: element j < 16 is the low nibble of
                                 byte j, element 16 + j its high nibble
        word  4 nb + b / 2       block b's f16 scale d                    x = d * (q - 8)
  Q4_K  words [36 b, 36 b + 36)  super-block b as in GGUF: d, dmin (f16), 12 bytes of 6-bit
                                 scales and mins, 128 bytes of nibbles (io/gguf.py)

The layout is a permutation of the file's bytes (the same bytes on the GPU as in the file,
plus at most 2 bytes of padding), and `raw_blocks` inverts it, so dequantization is GGUF's
formulas over the original blocks (io/gguf.py, bit-equal to the gguf package). Consumers:
primitives.py (`dequantize`), codegen/quant.py, module.py (a quantized ParamSpec),
models/gpt2.py (GPT2.from_gguf keeps quantized weights quantized).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

# ggml name -> (elements per block, bytes per block in GGUF)
QTYPES = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_K": (256, 144)}


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
    if qtype not in QTYPES:
        raise ValueError(f"{what}: quantized type {qtype!r} is not kept quantized (supported: "
                         f"{', '.join(QTYPES)})")
    block = QTYPES[qtype][0]
    if not shape or shape[-1] % block:
        raise ValueError(f"{what}: a {qtype} tensor's rows must be whole blocks of {block} "
                         f"values; shape {list(shape)} is not")


def n_words(qtype: str, n: int) -> int:
    """u32 words of the GPU layout of n values."""
    block, size = QTYPES[qtype]
    nb = n // block
    if qtype == "Q4_K":
        return nb * size // 4
    return nb * (size - 2) // 4 + (nb + 1) // 2


def transcode(qtype: str, raw) -> bytes:
    """GGUF blocks -> the GPU layout (bytes of little-endian words). Strided slices of
    bytes objects: C loops, fast enough in the browser worker, numpy not needed."""
    block, size = QTYPES[qtype]
    raw = bytes(raw)
    if len(raw) % size:
        raise ValueError(f"transcode: {len(raw)} bytes is not a whole number of {qtype} blocks")
    if qtype == "Q4_K":
        return raw
    nb = len(raw) // size
    body = size - 2
    qs = bytearray(body * nb)
    for j in range(body):
        qs[j::body] = raw[2 + j::size]
    scales = bytearray(4 * ((nb + 1) // 2))
    scales[0:2 * nb:2] = raw[0::size]
    scales[1:2 * nb:2] = raw[1::size]
    return bytes(qs) + bytes(scales)


def raw_blocks(qtype: str, data, n: int) -> bytes:
    """The GPU layout of n values (bytes or a buffer of words) -> GGUF's blocks."""
    block, size = QTYPES[qtype]
    data = bytes(memoryview(data).cast("B"))
    nb = n // block
    if qtype == "Q4_K":
        return data[:nb * size]
    body = size - 2
    out = bytearray(size * nb)
    for j in range(body):
        out[2 + j::size] = data[j:body * nb:body]
    out[0::size] = data[body * nb:body * nb + 2 * nb:2]
    out[1::size] = data[body * nb + 1:body * nb + 2 * nb:2]
    return bytes(out)


def dequantize_host(qtype: str, data, shape, *, use_numpy: bool = True):
    """array('f') of the values the words encode (row-major over shape)."""
    from .io.gguf import dequantize
    n = prod(shape)
    return dequantize(qtype, raw_blocks(qtype, data, n), n, what=f"{qtype} words",
                      use_numpy=use_numpy)


def dequantize_numpy(np, qtype: str, words, shape):
    """The `dequantize` primitive's reference: a float32 array of `shape`."""
    w = np.ascontiguousarray(words, dtype="<i4")
    out = np.frombuffer(dequantize_host(qtype, w.tobytes(), shape), dtype=np.float32)
    return out.reshape(tuple(shape)).copy()


__all__ = ["QTYPES", "QuantSpec", "n_words", "transcode", "raw_blocks", "dequantize_host",
           "dequantize_numpy", "check"]
