"""Counter-based random numbers, bit-identical to primitives.rand_bits.

u = (h >> 8) / 2^24 with h = H(i + H(seed + H(counter))), H the lowbias32 integer hash, all
in u32 arithmetic (which wraps mod 2^32 in WGSL exactly as the spec's masked int64 lanes).
rand_uniform is an expression: a dropout mask is computed where it is used, never stored.
"""
from __future__ import annotations

from .emit import Emitter, Idx, rule
from .wgsl import u32_lit

HASH_WGSL = """fn lowbias32(x0: u32) -> u32 {
  var x = x0;
  x = x ^ (x >> 16u);
  x = x * 0x7feb352du;
  x = x ^ (x >> 15u);
  x = x * 0x846ca68bu;
  return x ^ (x >> 16u);
}
"""


@rule("rand_uniform")
def _rand_rule(em: Emitter, node, idx: Idx) -> str:
    em.k.helper("lowbias32", HASH_WGSL)
    c = node.inputs[0]
    counter = em.value(c, Idx(em.g[c].shape, flat=u32_lit(0)))
    key = em.let(f"lowbias32({u32_lit(node.attrs['seed'] & 0xFFFFFFFF)} + lowbias32(u32({counter})))")
    h = em.let(f"lowbias32({idx.flat(em)} + {key})")
    return f"(f32({h} >> 8u) * 5.9604644775390625e-08f)"
