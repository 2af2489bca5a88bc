"""Q5_0: blocks of 32 5-bit quants and an f16 scale (22 bytes).

    file block    d (f16), qh (u32: bit j is element j's fifth bit), qs[16] (u8): element
                  j < 16's low 4 bits are the low nibble of qs[j], element 16 + j's its
                  high nibble                               x = d * (q - 16)
    GPU words     [5 b, 5 b + 5)   block b without d: word 0 = qh, 1-4 = qs
                  5 nb + b / 2     block b's d, in half b % 2      (f16_at = 0)
"""
from __future__ import annotations

from functools import partial

from . import block32
from .format import QuantFormat

_AT = dict(has_min=False, offset=16)
FORMAT = QuantFormat(
    "Q5_0", f16_at=0, scales_at=(0,),
    python=partial(block32.python, size=22, qs_at=6, qh_at=2, **_AT),
    numpy=partial(block32.numpy, qs_at=6, qh_at=2, **_AT),
    wgsl=partial(block32.wgsl, words=5, qs_w=1, qh_w=0, **_AT),
    wgsl_group=partial(block32.wgsl_group, words=5, qs_w=1, qh_w=0, **_AT),
    wgsl_chunk=partial(block32.wgsl_chunk, words=5, qs_w=1, qh_w=0, **_AT))
