"""The quant formats webgrad decodes: one module per type, listed once here."""
from __future__ import annotations

from . import q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0
from .format import QuantFormat

FORMATS: dict[str, QuantFormat] = {m.FORMAT.name: m.FORMAT for m in (q8_0, q4_0, q4_1, q5_0, q5_1,
                                                                 q4_k, q5_k, q6_k)}

# float types: decoded on the host by decode.py (F16 also on the GPU: gpu_dequant); they are
# not block formats, and webgrad holds them as f32
FLOATS = ("F32", "F16", "BF16", "F64")

__all__ = ["FORMATS", "FLOATS"]
