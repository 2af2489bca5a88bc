"""Quantized weights read in registers: the WGSL of `dequantize` (webgrad/quant.py's layout).

`dequantize(words)` is never stored. Every kernel that reads it calls a helper
`dq_<binding>(e) -> f32` that decodes element e (row-major over the logical shape) from the
words buffer, bound as array<u32>:

  * the expression rule below serves elementwise and gather consumers (an embedding decodes
    only the rows it gathers; a slice of the position table only its rows);
  * a matmul whose operand is a strided view of a dequantize (x @ W^T, GPT-2's linear layers
    and tied head) reads that operand through `operand_reader`: the tiled kernel decodes
    each element as it stages the tile in shared memory, the barrier-free kernel as it loads
    its registers (codegen/matmul.py). fusion.py and program.GroupCtx treat such a view as
    a stored operand (`quant_base`), so no f32 copy of the weight is planned.

Each helper is GGUF's formula in f32: a product of an f16 scale and a small integer is
exact, and Q4_K's one subtraction rounds once, as the host's numpy path does, so the values
equal gguf's dequantization (tests/test_quant.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from .emit import Emitter, Idx, Storage, rule


def quant_base(g, n: int, has_storage) -> bool:
    """Is node n a dequantize its consumers read in registers (its words are stored)?"""
    node = g[n]
    return node.op == "dequantize" and not has_storage(n) and has_storage(node.inputs[0])


@dataclass(frozen=True)
class QuantOperand:
    """A matmul operand read through dequantize: the words' storage, the type, the count."""
    words: Storage
    qtype: str
    n: int
    offset: int = 0

    @property
    def what(self) -> str:
        return f"{self.qtype} blocks of {self.words.what}"


def _q4k_scale_min(w: str) -> str:
    """WGSL: sub-block `sub`'s 6-bit scale `sc` and min `mn`, and the super-block's f16 pair
    `dm`, of the Q4_K super-block at word `base` of `w` (both decoders share it)."""
    return f"""
  let sh = (sub & 3u) << 3u;
  let b0 = ({w}[base + 1u] >> sh) & 255u;
  let mlo = ({w}[base + 2u] >> sh) & 255u;
  let top = ({w}[base + 3u] >> sh) & 255u;
  var sc = b0 & 63u;
  var mn = mlo & 63u;
  if (sub >= 4u) {{
    sc = (top & 15u) | ((b0 >> 6u) << 4u);
    mn = (top >> 4u) | ((mlo >> 6u) << 4u);
  }}
  let dm = unpack2x16float({w}[base]);"""


def _body(qtype: str, w: str, n: int) -> str:
    # indices past the end (a tile's edge, read then discarded) stay safe: WebGPU clamps
    # out-of-bounds storage reads
    if qtype == "Q8_0":
        s = 8 * (n // 32)
        return f"""
  let b = e >> 5u;
  let j = e & 31u;
  let q = bitcast<i32>({w}[(b << 3u) + (j >> 2u)] << (24u - ((j & 3u) << 3u))) >> 24u;
  let s = unpack2x16float({w}[{s}u + (b >> 1u)]);
  return select(s.x, s.y, (b & 1u) == 1u) * f32(q);"""
    if qtype == "Q4_0":
        s = 4 * (n // 32)
        return f"""
  let b = e >> 5u;
  let j = e & 31u;
  let byte = ({w}[(b << 2u) + ((j & 15u) >> 2u)] >> ((j & 3u) << 3u)) & 255u;
  let q = select(byte & 15u, byte >> 4u, j >= 16u);
  let s = unpack2x16float({w}[{s}u + (b >> 1u)]);
  return select(s.x, s.y, (b & 1u) == 1u) * f32(i32(q) - 8i);"""
    if qtype == "Q4_K":
        # super-block words: 0 = d | dmin, 1-3 = 12 scale bytes, 4-35 = 128 nibble bytes;
        # element w: group g = w / 64 reads bytes 32 g + w % 32, low nibbles for the first 32
        # (sub-block 2 g), high for the next 32 (sub-block 2 g + 1)
        return f"""
  let base = (e >> 8u) * 36u;
  let w = e & 255u;
  let g = w >> 6u;
  let hi = (w & 63u) >= 32u;
  let sub = 2u * g + select(0u, 1u, hi);
  let k = 16u + 32u * g + (w & 31u);
  let packed = ({w}[base + (k >> 2u)] >> ((k & 3u) << 3u)) & 255u;
  let q = select(packed & 15u, packed >> 4u, hi);
  // bytes t, 4 + t and 8 + t of the 12 scale bytes (t = sub % 4): words 1, 2, 3{_q4k_scale_min(w)}
  return (dm.x * f32(sc)) * f32(q) - dm.y * f32(mn);"""
    raise AssertionError(qtype)


def helper(kernel, words: Storage, qtype: str, n: int) -> str:
    """The name of `fn dq_<binding>(e: u32) -> f32` in `kernel`, reading `words`."""
    b = kernel.binding(words.buffer, "u32", what=f"{qtype} blocks of {words.what}",
                       nbytes=words.nbytes)
    name = f"dq_{b}"
    kernel.helper(name, f"fn {name}(e: u32) -> f32 {{{_body(qtype, b, n)}\n}}\n")
    return name


def _group_bodies(qtype: str, w: str, n: int) -> tuple[str, str]:
    """(scale, quant) bodies: every type decodes in groups of 32 values sharing one scale
    (and Q4_K one min), and 4 consecutive values (from a multiple of 4) share one word:
    the quant body returns the 4 integers of the word holding element e; value = s.x * q -
    s.y, the same f32 operations as _body's."""
    if qtype in ("Q8_0", "Q4_0"):
        s = (8 if qtype == "Q8_0" else 4) * (n // 32)
        scale = f"""
  let s = unpack2x16float({w}[{s}u + (gi >> 1u)]);
  return vec2<f32>(select(s.x, s.y, (gi & 1u) == 1u), 0.0f);"""
        if qtype == "Q8_0":   # block b's word j / 4 is word e / 4: four int8s
            quant = f"""
  let w = {w}[e >> 2u];
  return vec4<f32>(f32(bitcast<i32>(w << 24u) >> 24u), f32(bitcast<i32>(w << 16u) >> 24u),
                   f32(bitcast<i32>(w << 8u) >> 24u), f32(bitcast<i32>(w) >> 24u));"""
        else:                 # four bytes of the block: their low or their high nibbles
            quant = f"""
  let j = e & 31u;
  let w = {w}[((e >> 5u) << 2u) + ((j & 15u) >> 2u)];
  let v = select(w & 0x0f0f0f0fu, (w >> 4u) & 0x0f0f0f0fu, j >= 16u);
  return vec4<f32>(f32(i32(v & 255u) - 8i), f32(i32((v >> 8u) & 255u) - 8i),
                   f32(i32((v >> 16u) & 255u) - 8i), f32(i32(v >> 24u) - 8i));"""
        return scale, quant
    scale = f"""
  let base = (gi >> 3u) * 36u;
  let sub = gi & 7u;{_q4k_scale_min(w)}
  return vec2<f32>(dm.x * f32(sc), dm.y * f32(mn));"""
    quant = f"""
  let i = e & 255u;
  let k = 16u + 32u * (i >> 6u) + (i & 31u);
  let w = {w}[(e >> 8u) * 36u + (k >> 2u)];
  let v = select(w & 0x0f0f0f0fu, (w >> 4u) & 0x0f0f0f0fu, (i & 63u) >= 32u);
  return vec4<f32>(f32(v & 255u), f32((v >> 8u) & 255u), f32((v >> 16u) & 255u), f32(v >> 24u));"""
    return scale, quant


def group_helpers(kernel, st: "QuantOperand") -> tuple[str, str, bool]:
    """(scale fn, quant fn, has a min) for a kernel that walks whole groups of 32 values:
    `dqs_<b>(group) -> vec2<f32>` (scale, min) once per group, `dqq_<b>(e) -> vec4<f32>`
    the integers of elements e..e+3 (e a multiple of 4); value = scale * q - min. The barrier-free matmul hoists the
    scale out of its K loop this way (codegen/matmul.py)."""
    b = kernel.binding(st.words.buffer, "u32", what=st.what, nbytes=st.words.nbytes)
    scale, quant = _group_bodies(st.qtype, b, st.n)
    kernel.helper(f"dqs_{b}", f"fn dqs_{b}(gi: u32) -> vec2<f32> {{{scale}\n}}\n")
    kernel.helper(f"dqq_{b}", f"fn dqq_{b}(e: u32) -> vec4<f32> {{{quant}\n}}\n")
    return f"dqs_{b}", f"dqq_{b}", st.qtype == "Q4_K"


def operand_reader(kernel, st):
    """at -> WGSL of a matmul operand's element at address `at`: a load of f32 storage, or a
    decode of a quantized operand's blocks (the address is then the logical flat index)."""
    if isinstance(st, QuantOperand):
        fn = helper(kernel, st.words, st.qtype, st.n)
        return lambda at: f"{fn}({at})"
    name = kernel.binding(st.buffer, "f32", what=st.what, nbytes=st.nbytes)
    return lambda at: f"{name}[{at}]"


@rule("dequantize")
def _dequantize_rule(em: Emitter, node, idx: Idx) -> str:
    st = em.storage(node.inputs[0])
    if st is None:
        raise AssertionError(f"dequantize %{node.id}: its words are not stored")
    return f"{helper(em.k, st, node.attrs['qtype'], node.size)}({idx.flat(em)})"


__all__ = ["QuantOperand", "quant_base", "operand_reader", "helper", "group_helpers"]
