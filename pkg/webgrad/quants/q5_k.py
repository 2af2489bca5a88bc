"""Q5_K: Q4_K with a fifth bit per quant (176 bytes per super-block of 256).

    file block    d, dmin (f16), scales[12] (Q4_K's packing), qh[32], qs[128]; element
                  i = 64 g + 32 h + l (g < 4, h < 2, l < 32) is sub-block 2 g + h: its low
                  4 bits are qs[32 g + l]'s low (h = 0) or high (h = 1) nibble, its fifth
                  bit is bit 2 g + h of qh[l]
                  x = (d * scale[sub]) * q - dmin * min[sub]   (q < 32)
    GPU words     the file's bytes (f16_at = None): super-block b is words [44 b, 44 b + 44):
                  0 = d | dmin, 1-3 = the 12 scale bytes, 4-11 = qh, 12-43 = qs
"""
from __future__ import annotations

import struct

from .format import QuantFormat
from .q4_k import group_scale_wgsl, k_scales, k_scales_numpy, scale_min_wgsl


def python(raw: memoryview, nblocks: int, out) -> None:
    for b in range(nblocks):
        o = 176 * b
        d, dmin = struct.unpack("<2e", raw[o:o + 4])
        sc, mn = k_scales(raw[o + 4:o + 16])
        qh = raw[o + 16:o + 48]
        qs = raw[o + 48:o + 176]
        for sub in range(8):
            chunk = qs[32 * (sub // 2):32 * (sub // 2) + 32]
            dl, ml = d * sc[sub], dmin * mn[sub]
            shift = 4 * (sub & 1)
            out.extend([dl * (((q >> shift) & 15) | (((h >> sub) & 1) << 4)) - ml
                        for q, h in zip(chunk, qh)])


def numpy(np, blocks):
    dl, ml = k_scales_numpy(np, blocks)
    qh = blocks[:, 16:48]
    qs = blocks[:, 48:].reshape(-1, 4, 32)
    low = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32)              # sub-blocks
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1   # bit sub of qh[l]
    q = (low | (high << 4)).astype(np.float32)
    return (dl * q - ml).reshape(-1, 256)


def wgsl(w: str, n: int) -> str:
    return f"""
  let base = (e >> 8u) * 44u;
  let i = e & 255u;
  let sub = i >> 5u;
  let l = i & 31u;
  let k = 48u + 32u * (sub >> 1u) + l;
  let packed = ({w}[base + (k >> 2u)] >> ((k & 3u) << 3u)) & 255u;
  let kh = 16u + l;
  let high = ({w}[base + (kh >> 2u)] >> ((kh & 3u) << 3u)) & 255u;
  let q = select(packed & 15u, packed >> 4u, (sub & 1u) == 1u) | (((high >> sub) & 1u) << 4u);{scale_min_wgsl(w)}
  return (dm.x * f32(sc)) * f32(q) - dm.y * f32(mn);"""


def wgsl_group(w: str, n: int) -> tuple[str, str]:
    # four consecutive elements: one word of nibbles, one word of qh (bit sub of each byte)
    quant = f"""
  let base = (e >> 8u) * 44u;
  let i = e & 255u;
  let sub = i >> 5u;
  let lw = {w}[base + 12u + 8u * (sub >> 1u) + ((i & 31u) >> 2u)];
  let low = select(lw & 0x0f0f0f0fu, (lw >> 4u) & 0x0f0f0f0fu, (sub & 1u) == 1u);
  let hw = {w}[base + 4u + ((i & 31u) >> 2u)];
  let v = low | (((hw >> sub) & 0x01010101u) << 4u);
  return vec4<f32>(f32(v & 255u), f32((v >> 8u) & 255u), f32((v >> 16u) & 255u), f32(v >> 24u));"""
    return group_scale_wgsl(w, 44), quant


FORMAT = QuantFormat("Q5_K", f16_at=None, python=python, numpy=numpy, wgsl=wgsl,
                     wgsl_group=wgsl_group, has_min=True)
