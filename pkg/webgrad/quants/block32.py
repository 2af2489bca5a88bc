"""The decoders Q4_1, Q5_0 and Q5_1 share: blocks of 32 values, 16 bytes of nibbles (element
j < 16 the low nibble of byte j, 16 + j its high one), maybe a u32 of fifth bits (bit j for
element j), an f16 scale d and maybe an f16 min m:

    x = d * (q - offset)        (no min)        x = d * q + m        (a min)

Each format's module gives its byte offsets; the words are the format's GPU layout (its
module docstring): `words` words a block, the nibbles from word `qs_w`, the fifth bits at
word `qh_w`, d | m in word 0 of the block (a min) or, without a min, d after all blocks'
bodies (f16_at = 0).
"""
from __future__ import annotations

from .format import Chunk, bytes_f32, f16
from .q8_0 import tail_scale


def python(raw: memoryview, nblocks: int, out, *, size: int, qs_at: int, qh_at: int | None,
           has_min: bool, offset: int) -> None:
    for b in range(nblocks):
        o = size * b
        d = f16(raw[o:o + 2])
        qs = raw[o + qs_at:o + qs_at + 16]
        qh = 0 if qh_at is None else int.from_bytes(raw[o + qh_at:o + qh_at + 4], "little")
        q = ([(a & 15) | (((qh >> j) & 1) << 4) for j, a in enumerate(qs)]
             + [(a >> 4) | (((qh >> (j + 16)) & 1) << 4) for j, a in enumerate(qs)])
        if has_min:          # no "+ 0.0" without one: it would turn d * 0 = -0.0 into +0.0
            m = f16(raw[o + 2:o + 4])
            out.extend([d * v + m for v in q])
        else:
            out.extend([d * (v - offset) for v in q])


def numpy(np, blocks, *, qs_at: int, qh_at: int | None, has_min: bool, offset: int):
    f32 = np.float32
    d = blocks[:, 0:2].copy().view("<f2").astype(f32)
    qs = blocks[:, qs_at:qs_at + 16]
    q = np.concatenate([qs & 15, qs >> 4], axis=1)
    if qh_at is not None:
        qh = blocks[:, qh_at:qh_at + 4].copy().view("<u4")
        q = q | (((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4)
    if has_min:
        return d * q.astype(f32) + blocks[:, 2:4].copy().view("<f2").astype(f32)
    return d * (q.astype(f32) - f32(offset))


def wgsl(w: str, n: int, *, words: int, qs_w: int, qh_w: int | None, has_min: bool,
         offset: int) -> str:
    high = "" if qh_w is None else f" | ((({w}[base + {qh_w}u] >> j) & 1u) << 4u)"
    if has_min:
        value = f"""
  let dm = unpack2x16float({w}[base]);
  return dm.x * f32(q) + dm.y;"""
    else:
        value = f"""
  let s = unpack2x16float({w}[{words * (n // 32)}u + (b >> 1u)]);
  return select(s.x, s.y, (b & 1u) == 1u) * f32(i32(q) - {offset}i);"""
    return f"""
  let b = e >> 5u;
  let j = e & 31u;
  let base = b * {words}u;
  let byte = ({w}[base + {qs_w}u + ((j & 15u) >> 2u)] >> ((j & 3u) << 3u)) & 255u;
  let q = select(byte & 15u, byte >> 4u, j >= 16u){high};{value}"""


def wgsl_group(w: str, n: int, *, words: int, qs_w: int, qh_w: int | None, has_min: bool,
               offset: int) -> tuple[str, str]:
    if has_min:              # value = scale * q - min: the min goes in negated (exact)
        scale = f"""
  let dm = unpack2x16float({w}[gi * {words}u]);
  return vec2<f32>(dm.x, -dm.y);"""
    else:
        scale = f"""
  let s = unpack2x16float({w}[{words * (n // 32)}u + (gi >> 1u)]);
  return vec2<f32>(select(s.x, s.y, (gi & 1u) == 1u), 0.0f);"""
    # four bytes of nibbles; the fifth bits j..j+3 spread to bit 4 of each byte
    high = "" if qh_w is None else f"""
  let h = {w}[base + {qh_w}u] >> j;
  v = v | (((h & 1u) | ((h & 2u) << 7u) | ((h & 4u) << 14u) | ((h & 8u) << 21u)) << 4u);"""
    o = f" - {offset}" if offset else ""
    quant = f"""
  let j = e & 31u;
  let base = (e >> 5u) * {words}u;
  let w = {w}[base + {qs_w}u + ((j & 15u) >> 2u)];
  var v = select(w & 0x0f0f0f0fu, (w >> 4u) & 0x0f0f0f0fu, j >= 16u);{high}
  return vec4<f32>(f32(i32(v & 255u){o}), f32(i32((v >> 8u) & 255u){o}),
                   f32(i32((v >> 16u) & 255u){o}), f32(i32(v >> 24u){o}));"""
    return scale, quant


def wgsl_chunk(n: int, *, words: int, qs_w: int, qh_w: int | None, has_min: bool,
               offset: int) -> Chunk:
    """One chunk a block: its 16 nibble bytes, run 0 the low nibbles (values 0-15), run 1
    the high ones (16-31), loaded in the widest unit the block's words allow."""
    unit = next(u for u in (4, 2, 1) if words % u == 0 and qs_w % u == 0)

    def load(word, vec, blk, c, p):
        text = f"\n  let {p}o = ({blk}) * {words}u;\n  let {p}q = {vec(f'{p}o + {qs_w}u')};"
        if qh_w is not None:
            text += f"\n  let {p}qh = {word(f'{p}o + {qh_w}u')};"
        if has_min:          # value = scale * q - min: the min goes in negated (exact)
            text += (f"\n  let {p}dm = unpack2x16float({word(f'{p}o')});"
                     f"\n  let {p}s0 = vec2<f32>({p}dm.x, -{p}dm.y);")
        else:
            text += (tail_scale(word, blk, words * (n // 32), p)
                     + f"\n  let {p}s0 = vec2<f32>({p}d, 0.0f);")
        return text + f"\n  let {p}s1 = {p}s0;"

    def quant(p, r, i):
        v = f"(({p}q[{i}] >> {4 * r}u) & 0x0f0f0f0fu)"
        if qh_w is not None:   # fifth bits 16 r + 4 i .. + 3 spread to bit 4 of each byte
            h = f"({p}qh >> {16 * r + 4 * i}u)"
            v = (f"({v} | ((({h} & 1u) | (({h} & 2u) << 7u) | (({h} & 4u) << 14u)"
                 f" | (({h} & 8u) << 21u)) << 4u))")
        return bytes_f32(v, offset)

    return Chunk(per_block=1, unit=unit, runs=2, run=16, load=load, quant=quant,
                 at=lambda r, c: f"{16 * r}u")
