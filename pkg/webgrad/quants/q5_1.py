"""Q5_1: blocks of 32 5-bit quants with an f16 scale and min (24 bytes).

    file block    d, m (f16), qh (u32: bit j is element j's fifth bit), qs[16] (u8):
                  element j < 16's low 4 bits are the low nibble of qs[j], element 16 + j's
                  its high nibble                           x = d * q + m
    GPU words     the file's bytes (f16_at = None): block b is words [6 b, 6 b + 6):
                  0 = d | m, 1 = qh, 2-5 = qs
"""
from __future__ import annotations

from functools import partial

from . import block32
from .format import QuantFormat

_AT = dict(has_min=True, offset=0)
FORMAT = QuantFormat(
    "Q5_1", f16_at=None, scales_at=(0, 2), has_min=True,
    python=partial(block32.python, size=24, qs_at=8, qh_at=4, **_AT),
    numpy=partial(block32.numpy, qs_at=8, qh_at=4, **_AT),
    wgsl=partial(block32.wgsl, words=6, qs_w=2, qh_w=1, **_AT),
    wgsl_group=partial(block32.wgsl_group, words=6, qs_w=2, qh_w=1, **_AT),
    wgsl_chunk=partial(block32.wgsl_chunk, words=6, qs_w=2, qh_w=1, **_AT))
