"""Q4_0: blocks of 32 4-bit quants and one f16 scale (18 bytes).

    file block    d (f16), qs[16] (u8): element j < 16 is the low nibble of qs[j],
                  element 16 + j its high nibble            x = d * (q - 8)
    GPU words     [4 b, 4 b + 4)   block b's 16 bytes
                  4 nb + b / 2     block b's d, in half b % 2      (f16_at = 0)
"""
from __future__ import annotations

from functools import partial

from . import block32
from .format import QuantFormat, f16
from .q8_0 import group_scale


def python(raw: memoryview, nblocks: int, out) -> None:
    for b in range(nblocks):
        o = 18 * b
        d = f16(raw[o:o + 2])
        qs = raw[o + 2:o + 18]
        out.extend([d * ((q & 15) - 8) for q in qs])
        out.extend([d * ((q >> 4) - 8) for q in qs])


def numpy(np, blocks):
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)
    qs = blocks[:, 2:]
    q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


def wgsl(w: str, n: int) -> str:
    s = 4 * (n // 32)
    return f"""
  let b = e >> 5u;
  let j = e & 31u;
  let byte = ({w}[(b << 2u) + ((j & 15u) >> 2u)] >> ((j & 3u) << 3u)) & 255u;
  let q = select(byte & 15u, byte >> 4u, j >= 16u);
  let s = unpack2x16float({w}[{s}u + (b >> 1u)]);
  return select(s.x, s.y, (b & 1u) == 1u) * f32(i32(q) - 8i);"""


def wgsl_group(w: str, n: int) -> tuple[str, str]:
    # four bytes of the block: their low or their high nibbles
    quant = f"""
  let j = e & 31u;
  let w = {w}[((e >> 5u) << 2u) + ((j & 15u) >> 2u)];
  let v = select(w & 0x0f0f0f0fu, (w >> 4u) & 0x0f0f0f0fu, j >= 16u);
  return vec4<f32>(f32(i32(v & 255u) - 8i), f32(i32((v >> 8u) & 255u) - 8i),
                   f32(i32((v >> 16u) & 255u) - 8i), f32(i32(v >> 24u) - 8i));"""
    return group_scale(w, 4 * (n // 32)), quant


FORMAT = QuantFormat("Q4_0", f16_at=0, scales_at=(0,), python=python, numpy=numpy, wgsl=wgsl,
                     wgsl_group=wgsl_group,
                     wgsl_chunk=partial(block32.wgsl_chunk, words=4, qs_w=0, qh_w=None,
                                        has_min=False, offset=8))
