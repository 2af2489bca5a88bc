"""Q6_K: super-blocks of 256 6-bit quants in 16 sub-blocks of 16, each with an int8 scale
(210 bytes).

    file block    ql[128], qh[64], scales[16] (i8), d (f16); element i = 128 h + 32 t + l
                  (h < 2, t < 4, l < 32): its low 4 bits are the low (t < 2) or high
                  (t >= 2) nibble of ql[64 h + 32 (t % 2) + l], its top 2 bits are bits
                  2 t, 2 t + 1 of qh[32 h + l]; its scale is scales[i / 16]
                  x = (d * scale[i / 16]) * (q - 32)
    GPU words     [52 b, 52 b + 52)  super-block b without d: words 0-31 ql, 32-47 qh,
                                     48-51 scales
                  52 nb + b / 2      block b's d, in half b % 2     (f16_at = 208)
"""
from __future__ import annotations

import struct

from .format import Chunk, QuantFormat, bytes_f32, f16
from .q8_0 import tail_scale


def python(raw: memoryview, nblocks: int, out) -> None:
    for b in range(nblocks):
        o = 210 * b
        ql, qh = raw[o:o + 128], raw[o + 128:o + 192]
        sc = struct.unpack("<16b", raw[o + 192:o + 208])
        d = f16(raw[o + 208:o + 210])
        for h in range(2):
            for t in range(4):
                low = ql[64 * h + 32 * (t % 2):64 * h + 32 * (t % 2) + 32]
                shift = 4 * (t // 2)
                q = [((a >> shift) & 15) | (((c >> (2 * t)) & 3) << 4)
                     for a, c in zip(low, qh[32 * h:32 * h + 32])]
                s0, s1 = d * sc[8 * h + 2 * t], d * sc[8 * h + 2 * t + 1]
                out.extend([s0 * (v - 32) for v in q[:16]])
                out.extend([s1 * (v - 32) for v in q[16:]])


def numpy(np, blocks):
    f32 = np.float32
    ql = blocks[:, :128].reshape(-1, 2, 1, 2, 32)                    # [h, t // 2, t % 2, l]
    low = np.concatenate([ql & 15, ql >> 4], axis=2).reshape(-1, 2, 4, 32)
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32)
    high = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]) & 3
    q = ((low | (high << 4)).astype(np.int8) - np.int8(32)).astype(f32).reshape(-1, 16, 16)
    d = blocks[:, 208:210].copy().view("<f2").astype(f32)
    ds = d * blocks[:, 192:208].view(np.int8).astype(f32)
    return (ds[:, :, None] * q).reshape(-1, 256)


def _scale(w: str, n: int) -> str:
    """WGSL: `ds`, d * scale of sub-block ks of super-block b at word `base`."""
    return f"""
  let sw = bitcast<i32>({w}[base + 48u + (ks >> 2u)] << (24u - ((ks & 3u) << 3u))) >> 24u;
  let d = unpack2x16float({w}[{52 * (n // 256)}u + (b >> 1u)]);
  let ds = select(d.x, d.y, (b & 1u) == 1u) * f32(sw);"""


def wgsl(w: str, n: int) -> str:
    return f"""
  let b = e >> 8u;
  let base = b * 52u;
  let i = e & 255u;
  let h = i >> 7u;
  let t = (i >> 5u) & 3u;
  let l = i & 31u;
  let k = 64u * h + 32u * (t & 1u) + l;
  let packed = ({w}[base + (k >> 2u)] >> ((k & 3u) << 3u)) & 255u;
  let kh = 128u + 32u * h + l;
  let high = ({w}[base + (kh >> 2u)] >> ((kh & 3u) << 3u)) & 255u;
  let q = select(packed & 15u, packed >> 4u, t >= 2u) | (((high >> (2u * t)) & 3u) << 4u);
  let ks = i >> 4u;{_scale(w, n)}
  return ds * f32(i32(q) - 32i);"""


def wgsl_group(w: str, n: int) -> tuple[str, str]:
    scale = f"""
  let b = gi >> 4u;
  let base = b * 52u;
  let ks = gi & 15u;{_scale(w, n)}
  return vec2<f32>(ds, 0.0f);"""
    # four consecutive elements: one word of ql's nibbles, one word of qh (2 bits a byte)
    quant = f"""
  let base = (e >> 8u) * 52u;
  let i = e & 255u;
  let h = i >> 7u;
  let t = (i >> 5u) & 3u;
  let l = i & 31u;
  let lw = {w}[base + 16u * h + 8u * (t & 1u) + (l >> 2u)];
  let low = select(lw & 0x0f0f0f0fu, (lw >> 4u) & 0x0f0f0f0fu, t >= 2u);
  let hw = {w}[base + 32u + 8u * h + (l >> 2u)];
  let v = low | (((hw >> (2u * t)) & 0x03030303u) << 4u);
  return vec4<f32>(f32(i32(v & 255u) - 32i), f32(i32((v >> 8u) & 255u) - 32i),
                   f32(i32((v >> 16u) & 255u) - 32i), f32(i32(v >> 24u) - 32i));"""
    return scale, quant


def wgsl_chunk(n: int) -> Chunk:
    # chunk c = 4 h + 2 t1 + u (< 8) is ql's 16 bytes 16 c = 64 h + 32 t1 + 16 u: run r its
    # low (r = 0, t = t1) or high (r = 1, t = t1 + 2) nibbles, values 128 h + 32 t + 16 u + j
    # (sub-block ks = 8 h + 2 t + u: scale byte 4 (2 h + r) + c % 4); their top bits are
    # bits 2 t of qh's 16 bytes 32 h + 16 u (words 32 + 8 h + 4 u, shared with chunk c ^ 2)
    def load(word, vec, blk, c, p):
        text = f"""
  let {p}o = ({blk}) * 52u;
  let {p}ql = {vec(f"{p}o + 4u * {c}")};
  let {p}qh = {vec(f"{p}o + 32u + 8u * ({c} >> 2u) + 4u * ({c} & 1u)")};
  let {p}sw = {vec(f"{p}o + 48u")};{tail_scale(word, blk, 52 * (n // 256), p)}
  let {p}t2 = 2u * (({c} >> 1u) & 1u);"""
        for r in (0, 1):
            text += f"""
  let {p}sc{r} = bitcast<i32>({p}sw[2u * ({c} >> 2u) + {r}u] << (24u - (({c} & 3u) << 3u))) >> 24u;
  let {p}s{r} = vec2<f32>({p}d * f32({p}sc{r}), 0.0f);"""
        return text

    def ints(p, r, i):   # four 6-bit quants q, bytes 0 .. 63 (the value is d * (q - 32))
        low = f"(({p}ql[{i}] >> {4 * r}u) & 0x0f0f0f0fu)"
        high = f"((({p}qh[{i}] >> ({p}t2 + {4 * r}u)) & 0x03030303u) << 4u)"
        return f"{low} | {high}"

    def packed(p, r, i):
        # q - 32 in each byte: with bit 7 set a byte is q + 128 >= 32, so subtracting 32
        # borrows from no neighbour, and flipping bit 7 back turns q + 96 into q - 32 mod 256,
        # the two's complement byte of q - 32
        return f"((({ints(p, r, i)}) | 0x80808080u) - 0x20202020u) ^ 0x80808080u"

    return Chunk(per_block=8, unit=4, runs=2, run=16, load=load,
                 quant=lambda p, r, i: bytes_f32(ints(p, r, i), 32), packed=packed,
                 at=lambda r, c: (f"(128u * ({c} >> 2u) + 32u * (({c} >> 1u) & 1u) + {64 * r}u"
                                  f" + 16u * ({c} & 1u))"))


FORMAT = QuantFormat("Q6_K", f16_at=208, scales_at=(208,), python=python, numpy=numpy,
                     wgsl=wgsl, wgsl_group=wgsl_group, wgsl_chunk=wgsl_chunk, group=16)
