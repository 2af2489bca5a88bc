"""Q4_K: super-blocks of 256 4-bit quants in 8 sub-blocks of 32, each with a 6-bit scale
and min (144 bytes). Also the 12-byte scale packing that Q5_K shares.

    file block    d, dmin (f16), scales[12], qs[128]; four groups of 64 elements: group g
                  reads qs[32 g : 32 g + 32], low nibbles are sub-block 2 g, high nibbles
                  sub-block 2 g + 1       x = (d * scale[sub]) * q - dmin * min[sub]
    scales[12]    pairs (scale, min) 0-3 are the low 6 bits of bytes 0-3 (scales) and 4-7
                  (mins); pairs 4-7 take their low 4 bits from the nibbles of bytes 8-11
                  and their top 2 bits from the top bits of bytes 0-3 / 4-7
    GPU words     the file's bytes (f16_at = None): super-block b is words [36 b, 36 b + 36):
                  0 = d | dmin, 1-3 = the 12 scale bytes, 4-35 = the 128 nibble bytes
"""
from __future__ import annotations

import struct

from .format import Chunk, QuantFormat, bytes_f32


def k_scales(s) -> tuple[list[int], list[int]]:
    """12 scale bytes -> 8 (scale, min) pairs of 6 bits (the packing above)."""
    sc = [s[j] & 63 for j in range(4)] + [(s[j + 8] & 15) | ((s[j] >> 6) << 4) for j in range(4)]
    mn = [s[j + 4] & 63 for j in range(4)] + [(s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4)
                                              for j in range(4)]
    return sc, mn


def k_scales_numpy(np, blocks):
    """(d * scale, dmin * min) of each sub-block, float32 [nblocks, 8, 1] each, from
    super-blocks that open with d, dmin and the 12 scale bytes (Q4_K, Q5_K)."""
    f32 = np.float32
    d = blocks[:, 0:2].copy().view("<f2").astype(f32)
    dmin = blocks[:, 2:4].copy().view("<f2").astype(f32)
    s = blocks[:, 4:16].astype(np.int32)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return (d * sc.astype(f32))[:, :, None], (dmin * mn.astype(f32))[:, :, None]


def scale_min_wgsl(w: str) -> str:
    """WGSL: sub-block `sub`'s 6-bit scale `sc` and min `mn`, and the super-block's f16 pair
    `dm`, of the super-block at word `base` of `w` (words 1-3 hold the 12 scale bytes:
    bytes t, 4 + t and 8 + t, t = sub % 4, are byte t of words 1, 2, 3)."""
    return unpack_scale_min(*(f"{w}[base{f' + {j}u' if j else ''}]" for j in range(4)))


def unpack_scale_min(w0: str, w1: str, w2: str, w3: str, sub: str = "sub", p: str = "") -> str:
    """WGSL: lets {p}sc, {p}mn (sub-block `sub`'s 6-bit scale and min) and {p}dm (d, dmin)
    from a super-block's first four words w0..w3 (the packing in the module docstring)."""
    return f"""
  let {p}sh = ({sub} & 3u) << 3u;
  let {p}b0 = ({w1} >> {p}sh) & 255u;
  let {p}mlo = ({w2} >> {p}sh) & 255u;
  let {p}top = ({w3} >> {p}sh) & 255u;
  var {p}sc = {p}b0 & 63u;
  var {p}mn = {p}mlo & 63u;
  if ({sub} >= 4u) {{
    {p}sc = ({p}top & 15u) | (({p}b0 >> 6u) << 4u);
    {p}mn = ({p}top >> 4u) | (({p}mlo >> 6u) << 4u);
  }}
  let {p}dm = unpack2x16float({w0});"""


def group_scale_wgsl(w: str, words: int) -> str:
    """WGSL: (d * scale, dmin * min) of sub-block gi, in super-blocks of `words` words."""
    return f"""
  let base = (gi >> 3u) * {words}u;
  let sub = gi & 7u;{scale_min_wgsl(w)}
  return vec2<f32>(dm.x * f32(sc), dm.y * f32(mn));"""


def k_heads(raw: memoryview, nblocks: int, size: int):
    """(byte offset, d, dmin, scales, mins) of each super-block of `size` bytes that opens
    with d, dmin and the 12 scale bytes (Q4_K, Q5_K)."""
    for b in range(nblocks):
        o = size * b
        d, dmin = struct.unpack("<2e", raw[o:o + 4])
        yield (o, d, dmin, *k_scales(raw[o + 4:o + 16]))


def python(raw: memoryview, nblocks: int, out) -> None:
    for o, d, dmin, sc, mn in k_heads(raw, nblocks, 144):
        qs = raw[o + 16:o + 144]
        for g in range(4):
            chunk = qs[32 * g:32 * g + 32]
            lo_d, lo_m = d * sc[2 * g], dmin * mn[2 * g]
            hi_d, hi_m = d * sc[2 * g + 1], dmin * mn[2 * g + 1]
            out.extend([lo_d * (q & 15) - lo_m for q in chunk])
            out.extend([hi_d * (q >> 4) - hi_m for q in chunk])


def nibbles_numpy(np, qs):
    """128 bytes a super-block -> its 8 sub-blocks of 32 nibbles, uint8 [nblocks, 8, 32]:
    group g's 32 bytes give sub-block 2 g (low nibbles) and 2 g + 1 (high)."""
    qs = qs.reshape(-1, 4, 32)
    return np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32)


def numpy(np, blocks):
    dl, ml = k_scales_numpy(np, blocks)
    q = nibbles_numpy(np, blocks[:, 16:]).astype(np.float32)
    return (dl * q - ml).reshape(-1, 256)


def element_wgsl(w: str, words: int, qs_at: int, high: str = "") -> str:
    """WGSL: element e of super-blocks of `words` words whose 128 nibble bytes start at byte
    qs_at, plus the bits `high` ORs into the quant (Q5_K's fifth; none for Q4_K)."""
    # element w: group g = w / 64 reads bytes 32 g + w % 32, low nibbles for the first 32
    # (sub-block 2 g), high for the next 32 (sub-block 2 g + 1)
    return f"""
  let base = (e >> 8u) * {words}u;
  let w = e & 255u;
  let g = w >> 6u;
  let hi = (w & 63u) >= 32u;
  let sub = 2u * g + select(0u, 1u, hi);
  let k = {qs_at}u + 32u * g + (w & 31u);
  let packed = ({w}[base + (k >> 2u)] >> ((k & 3u) << 3u)) & 255u;
  let q = select(packed & 15u, packed >> 4u, hi){high};
  // bytes t, 4 + t and 8 + t of the 12 scale bytes (t = sub % 4): words 1, 2, 3{scale_min_wgsl(w)}
  return (dm.x * f32(sc)) * f32(q) - dm.y * f32(mn);"""


def group_quant_wgsl(w: str, words: int, qs_at: int, high: str = "") -> str:
    """WGSL: the quants of elements e..e+3 (one word of nibbles), plus `high` (as above)."""
    return f"""
  let i = e & 255u;
  let k = {qs_at}u + 32u * (i >> 6u) + (i & 31u);
  let w = {w}[(e >> 8u) * {words}u + (k >> 2u)];
  let v = select(w & 0x0f0f0f0fu, (w >> 4u) & 0x0f0f0f0fu, (i & 63u) >= 32u){high};
  return vec4<f32>(f32(v & 255u), f32((v >> 8u) & 255u), f32((v >> 16u) & 255u), f32(v >> 24u));"""


def k_chunk(words: int, qs_w: int, qh_w: int | None = None) -> Chunk:
    """The chunks of super-blocks of `words` words whose nibbles start at word qs_w, and
    with qh_w, whose fifth bits (32 bytes) start at word qh_w (Q5_K). Chunk c < 8 is the 16
    nibble bytes 16 c .. 16 c + 15, half c % 2 of group g = c / 2: run 0 their low nibbles
    (sub-block 2 g), run 1 their high ones (2 g + 1), values 64 g + 32 r + 16 (c % 2) + j;
    their fifth bits are bit 2 g + r of qh bytes 16 (c % 2) + j (read by the 4 chunks of
    that half)."""
    def load(word, vec, blk, c, p):
        text = f"""
  let {p}o = ({blk}) * {words}u;
  let {p}hd = {vec(f"{p}o")};
  let {p}q = {vec(f"{p}o + {qs_w}u + 4u * {c}")};"""
        if qh_w is not None:
            text += f"\n  let {p}qh = {vec(f'{p}o + {qh_w}u + 4u * ({c} & 1u)')};"
        for r in (0, 1):
            pr = f"{p}{r}"
            text += f"\n  let {pr}sub = 2u * ({c} >> 1u) + {r}u;"
            text += unpack_scale_min(f"{p}hd.x", f"{p}hd.y", f"{p}hd.z", f"{p}hd.w", f"{pr}sub", pr)
            text += f"\n  let {p}s{r} = vec2<f32>({pr}dm.x * f32({pr}sc), {pr}dm.y * f32({pr}mn));"
        return text

    def packed(p, r, i):   # four quants of 4 (5) bits: bytes 0 .. 15 (31), int8 as they are
        v = f"(({p}q[{i}] >> {4 * r}u) & 0x0f0f0f0fu)"
        if qh_w is not None:
            v = f"({v} | ((({p}qh[{i}] >> {p}{r}sub) & 0x01010101u) << 4u))"
        return v

    return Chunk(per_block=8, unit=4, runs=2, run=16, load=load,
                 quant=lambda p, r, i: bytes_f32(packed(p, r, i)), packed=packed,
                 at=lambda r, c: f"(64u * ({c} >> 1u) + {32 * r}u + 16u * ({c} & 1u))")


def wgsl(w: str, n: int) -> str:
    return element_wgsl(w, 36, 16)


def wgsl_group(w: str, n: int) -> tuple[str, str]:
    return group_scale_wgsl(w, 36), group_quant_wgsl(w, 36, 16)


FORMAT = QuantFormat("Q4_K", f16_at=None, scales_at=(0, 2), python=python, numpy=numpy,
                     wgsl=wgsl, wgsl_group=wgsl_group, wgsl_chunk=lambda n: k_chunk(36, 4),
                     has_min=True)
