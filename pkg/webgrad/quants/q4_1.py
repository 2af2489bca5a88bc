"""Q4_1: blocks of 32 4-bit quants with an f16 scale and min (20 bytes).

    file block    d, m (f16), qs[16] (u8): element j < 16 is the low nibble of qs[j],
                  element 16 + j its high nibble            x = d * q + m
    GPU words     the file's bytes (f16_at = None): block b is words [5 b, 5 b + 5):
                  0 = d | m, 1-4 = qs
"""
from __future__ import annotations

from functools import partial

from . import block32
from .format import QuantFormat

_AT = dict(has_min=True, offset=0)
FORMAT = QuantFormat(
    "Q4_1", f16_at=None, scales_at=(0, 2), has_min=True,
    python=partial(block32.python, size=20, qs_at=4, qh_at=None, **_AT),
    numpy=partial(block32.numpy, qs_at=4, qh_at=None, **_AT),
    wgsl=partial(block32.wgsl, words=5, qs_w=1, qh_w=None, **_AT),
    wgsl_group=partial(block32.wgsl_group, words=5, qs_w=1, qh_w=None, **_AT),
    wgsl_chunk=partial(block32.wgsl_chunk, words=5, qs_w=1, qh_w=None, **_AT))
