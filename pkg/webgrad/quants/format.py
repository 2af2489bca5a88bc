"""What one quant format is (QuantFormat), and the table of every type ggml names.

A QuantFormat holds every piece webgrad needs of one GGUF block type: its block geometry
(from GGML_TYPES), how its blocks become aligned u32 words on the GPU (`f16_at`), and its
decoders: pure Python (the executable spec), numpy (the same formulas vectorized in f32),
and three WGSL decoders over the words (one element; a group of values sharing a scale;
the chunks of one aligned load each that the GPU matrix-vector kernel reads, Chunk). Each
type's module (q8_0.py, q4_k.py, ...) builds one; registry.py lists them. Imports nothing of
webgrad's: the file parser (io/gguf.py), the codegen and the executors all sit above it.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable

# ggml type id -> (name, elements per block, bytes per block): every type a GGUF file may
# name, decodable or not (the parser checks sizes of all of them)
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}
TYPE_IDS = {name: i for i, (name, _, _) in GGML_TYPES.items()}


# high byte of an f16 -> 1 where its exponent bits are all ones (NaN or inf), else 0
_F16_HIGH_NONFINITE = bytes(int(b & 0x7C == 0x7C) for b in range(256))


def f16(raw) -> float:
    """The value of 2 little-endian bytes of an f16."""
    return struct.unpack("<e", raw)[0]


def bytes_f32(v: str, bias: int = 0) -> str:
    """WGSL: the vec4<f32> of the four bytes of u32 `v` (byte 0 first), each minus `bias`.
    A byte ORed into the mantissa of 2^23 is the float 2^23 + byte, and subtracting 2^23 +
    bias is exact: two ALU operations a value where GPUs convert integers to floats at a
    quarter rate or less, which would bound a quantized product below memory bandwidth."""
    return (f"(bitcast<vec4<f32>>(((vec4<u32>({v}) >> vec4<u32>(0u, 8u, 16u, 24u)) & "
            f"vec4<u32>(255u)) | vec4<u32>(0x4b000000u)) - vec4<f32>({float(2 ** 23 + bias)}f))")


@dataclass(frozen=True)
class Chunk:
    """How the GPU matrix-vector kernel (codegen/matmul_gemv.py) reads a format's blocks:
    consecutive lanes take consecutive chunks, each one aligned load of `unit` words of quant
    bytes (plus the block's scales and any bytes the chunk's values share with others, read
    again from the cache), so a warp's load instruction covers one contiguous span and every
    quant byte comes from memory once. A chunk holds `runs` runs of `run` consecutive values,
    each run one (scale, min).

    per_block  chunks per block (a power of two); chunk c < per_block of block blk
    unit       words per aligned load, 4, 2 or 1: the kernel binds the words as vec4<u32>,
               vec2<u32> or u32 (every block start and load offset is a multiple of it)
    runs, run  runs per chunk, values per run (a multiple of 4)
    at         (r, c) -> WGSL u32: the index within its block of run r's first value
    load       (word, vec, blk, c, p) -> WGSL statements: lets named p..., among them
               `{p}s{r}`, run r's vec2<f32> (scale, min) as in wgsl_group; word(at) and
               vec(at) give the WGSL of word `at` (a u32) and of words at..at+3 (a
               vec4<u32>, `at` a multiple of unit) of the words
    quant      (p, r, i) -> WGSL vec4<f32>: the integers of run r's values 4 i .. 4 i + 3
               (value = scale * q - min, the quants wgsl_group gives)
    packed     (p, r, i) -> WGSL u32: the same four integers as signed bytes (byte 0
               first), for dot4I8Packed (KernelOptions.gemv_q8_dot: the products with A
               quantized to 8 bits); None: the format's integers do not fit, or it has no
               such form yet
    """
    per_block: int
    unit: int
    runs: int
    run: int
    at: Callable[[int, str], str]
    load: Callable[..., str]
    quant: Callable[[str, int, int], str]
    packed: Callable[[str, int, int], str] | None = None

    def __post_init__(self):
        if self.per_block & (self.per_block - 1) or self.unit not in (1, 2, 4) or self.run % 4:
            raise ValueError(f"Chunk: per_block {self.per_block} must be a power of two, unit "
                             f"{self.unit} 1, 2 or 4, run {self.run} a multiple of 4")


@dataclass(frozen=True)
class QuantFormat:
    """One GGUF block type, every piece of it (the package docstring's checklist).

    name      ggml's name; block and nbytes come from GGML_TYPES
    f16_at    None: the blocks are a whole number of words and the GPU reads them as they
              are. Otherwise the byte offset of the one f16 scale that the word layout moves
              out of each block: all blocks' other bytes first (a whole number of words
              each), then the scales, two per word (words.py)
    python    (raw: memoryview, nblocks, out: array('f')) -> None: appends the values,
              computed in Python floats and rounded once to f32 (the spec)
    numpy     (np, blocks: uint8 [nblocks, nbytes]) -> float32 [nblocks, block]
    wgsl      (words name, n values) -> the body of `fn(e: u32) -> f32`: element e
    wgsl_group (words name, n values) -> (scale body, quant body): `fn(gi: u32) ->
              vec2<f32>` the (scale, min) of group gi of `group` values, and `fn(e: u32) ->
              vec4<f32>` the integers of elements e..e+3 (e a multiple of 4); a value is
              scale * q - min, the same f32 operations as `wgsl`'s
    wgsl_chunk (n values) -> Chunk: how the GPU matrix-vector kernel reads the blocks
    scales_at the byte offsets in a file block of its f16 fields (the scales, and the mins
              where there are): with these finite every value of the block is, so
              `first_nonfinite_block` checks a file's blocks without decoding them
    group     values that share one scale (and min) in wgsl_group
    has_min   whether wgsl_group's min is used (value = scale * q - min)
    """
    name: str
    f16_at: int | None
    python: Callable
    numpy: Callable
    wgsl: Callable[[str, int], str]
    wgsl_group: Callable[[str, int], tuple[str, str]]
    wgsl_chunk: Callable[[int], "Chunk"]
    scales_at: tuple[int, ...]
    group: int = 32
    has_min: bool = False

    def __post_init__(self):
        if self.name not in TYPE_IDS:
            raise ValueError(f"QuantFormat {self.name!r}: not a ggml type name (GGML_TYPES)")
        if (self.nbytes % 4 == 0) != (self.f16_at is None):
            raise ValueError(f"QuantFormat {self.name}: blocks of {self.nbytes} bytes need "
                             f"f16_at={'None' if self.nbytes % 4 == 0 else 'the f16 offset'}")
        if self.f16_at is not None and (self.nbytes - 2) % 4:
            raise ValueError(f"QuantFormat {self.name}: without its f16 a block is not whole "
                             "words; the word layout (words.py) needs another rule")
        if self.block % self.group or self.group % 4:
            raise ValueError(f"QuantFormat {self.name}: group {self.group} must divide the "
                             f"block ({self.block}) and be a multiple of 4")

    def first_nonfinite_block(self, raw) -> int | None:
        """The index of the first block of `raw` (whole blocks of this format) with a NaN or
        inf f16 field, or None. An f16 is NaN or inf when its five exponent bits are all
        ones: bits 2-6 of its high (second, little-endian) byte. One C-speed pass per field
        (a strided slice, a byte table), so it serves where numpy does not import."""
        data = memoryview(raw).cast("B")
        first = None
        for at in self.scales_at:
            i = bytes(data[at + 1::self.nbytes]).translate(_F16_HIGH_NONFINITE).find(1)
            if i >= 0 and (first is None or i < first):
                first = i
        return first

    @property
    def block(self) -> int:
        return GGML_TYPES[TYPE_IDS[self.name]][1]

    @property
    def nbytes(self) -> int:
        return GGML_TYPES[TYPE_IDS[self.name]][2]


__all__ = ["GGML_TYPES", "TYPE_IDS", "Chunk", "QuantFormat", "bytes_f32", "f16"]
