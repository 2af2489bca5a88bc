"""Q8_0: blocks of 32 int8 quants and one f16 scale (34 bytes).

    file block    d (f16), q[32] (i8)                       x = d * q
    GPU words     [8 b, 8 b + 8)   block b's 32 quants, 4 a word
                  8 nb + b / 2     block b's d, in half b % 2      (f16_at = 0)
"""
from __future__ import annotations

import struct

from .format import Chunk, QuantFormat, bytes_f32, f16


def python(raw: memoryview, nblocks: int, out) -> None:
    for b in range(nblocks):
        o = 34 * b
        d = f16(raw[o:o + 2])
        out.extend([d * q for q in struct.unpack("<32b", raw[o + 2:o + 34])])


def numpy(np, blocks):
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)
    return blocks[:, 2:].copy().view(np.int8).astype(np.float32) * d


def wgsl(w: str, n: int) -> str:
    # indices past the end (a tile's edge, read then discarded) stay safe: WebGPU clamps
    # out-of-bounds storage reads
    s = 8 * (n // 32)
    return f"""
  let b = e >> 5u;
  let j = e & 31u;
  let q = bitcast<i32>({w}[(b << 3u) + (j >> 2u)] << (24u - ((j & 3u) << 3u))) >> 24u;
  let s = unpack2x16float({w}[{s}u + (b >> 1u)]);
  return select(s.x, s.y, (b & 1u) == 1u) * f32(q);"""


def group_scale(w: str, s: int) -> str:
    """The scale of block gi, whose f16 is at word s + gi / 2 (Q8_0's and Q4_0's layout)."""
    return f"""
  let s = unpack2x16float({w}[{s}u + (gi >> 1u)]);
  return vec2<f32>(select(s.x, s.y, (gi & 1u) == 1u), 0.0f);"""


def wgsl_group(w: str, n: int) -> tuple[str, str]:
    # block b's word j / 4 is word e / 4: four int8s
    quant = f"""
  let w = {w}[e >> 2u];
  return vec4<f32>(f32(bitcast<i32>(w << 24u) >> 24u), f32(bitcast<i32>(w << 16u) >> 24u),
                   f32(bitcast<i32>(w << 8u) >> 24u), f32(bitcast<i32>(w) >> 24u));"""
    return group_scale(w, 8 * (n // 32)), quant


def tail_scale(word, blk: str, s: int, p: str) -> str:
    """WGSL: let {p}d, the scale of block blk whose f16 is at word s + blk / 2 (the layout
    of the formats whose f16_at moves d after the bodies)."""
    return f"""
  let {p}d2 = unpack2x16float({word(f"{s}u + (({blk}) >> 1u)")});
  let {p}d = select({p}d2.x, {p}d2.y, (({blk}) & 1u) == 1u);"""


def wgsl_chunk(n: int) -> Chunk:
    # chunk c < 2: quants 16 c .. 16 c + 15 of the block (one run); int8 as byte ^ 0x80 - 128
    def load(word, vec, blk, c, p):
        return (f"\n  let {p}q = {vec(f'8u * ({blk}) + 4u * {c}')};{tail_scale(word, blk, 8 * (n // 32), p)}"
                f"\n  let {p}s0 = vec2<f32>({p}d, 0.0f);")

    return Chunk(per_block=2, unit=4, runs=1, run=16, load=load,
                 quant=lambda p, r, i: bytes_f32(f"{p}q[{i}] ^ 0x80808080u", 128),
                 packed=lambda p, r, i: f"{p}q[{i}]",   # the file's int8s as they are
                 at=lambda r, c: f"(16u * {c})")


FORMAT = QuantFormat("Q8_0", f16_at=0, scales_at=(0,), python=python, numpy=numpy, wgsl=wgsl,
                     wgsl_group=wgsl_group, wgsl_chunk=wgsl_chunk)
