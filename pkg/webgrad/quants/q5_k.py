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

from .format import QuantFormat
from .q4_k import (element_wgsl, group_quant_wgsl, group_scale_wgsl, k_chunk, k_heads,
                   k_scales_numpy, nibbles_numpy)


def python(raw: memoryview, nblocks: int, out) -> None:
    for o, d, dmin, sc, mn in k_heads(raw, nblocks, 176):
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
    low = nibbles_numpy(np, blocks[:, 48:])
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1   # bit sub of qh[l]
    q = (low | (high << 4)).astype(np.float32)
    return (dl * q - ml).reshape(-1, 256)


def wgsl(w: str, n: int) -> str:
    # Q4_K's decoder, the nibbles 32 bytes further on, and the fifth bit: bit sub of byte
    # w % 32 of qh (words 4-11)
    high = (f" | ((({w}[base + 4u + ((w & 31u) >> 2u)] >> (((w & 3u) << 3u) + sub)) & 1u)"
            " << 4u)")
    return element_wgsl(w, 44, 48, high)


def wgsl_group(w: str, n: int) -> tuple[str, str]:
    # four consecutive elements: bit sub (= i / 32) of each byte of one word of qh
    high = (f" | ((({w}[(e >> 8u) * 44u + 4u + ((i & 31u) >> 2u)] >> (i >> 5u)) & 0x01010101u)"
            " << 4u)")
    return group_scale_wgsl(w, 44), group_quant_wgsl(w, 44, 48, high)


FORMAT = QuantFormat("Q5_K", f16_at=None, scales_at=(0, 2), python=python, numpy=numpy,
                     wgsl=wgsl, wgsl_group=wgsl_group, wgsl_chunk=lambda n: k_chunk(44, 12, 4),
                     has_min=True)
