"""Any GGUF type's values on the host: `dequantize(type_name, raw, n)` -> array('f').

Block formats run their own decoders (registry.FORMATS: numpy where it imports, else the
pure-Python spec); the float types are decoded here. Both paths equal the `gguf` package's
dequantization bit for bit (tests/test_gguf.py, tests/test_quant_formats.py): the block
formulas, computed in Python floats and rounded once to f32, are exact, because every
product and difference involved is a multiple of 2^-24 far below 2^53 (f16 scales times
small integers), which a double holds exactly; in numpy's float32 each operation is then
exact or rounds once, as gguf's do.
"""
from __future__ import annotations

import array
import struct
import sys

from ..arrays import numpy_or_none
from .format import GGML_TYPES, TYPE_IDS
from .registry import FLOATS, FORMATS

DEQUANTIZABLE = FLOATS + tuple(FORMATS)


def f16_wgsl(w: str, n: int) -> str:
    """F16 on the GPU (io/gpu_dequant.py): element e of f16 values, two a word of `w`."""
    return f"""
  let s = unpack2x16float({w}[e >> 1u]);
  return select(s.x, s.y, (e & 1u) == 1u);"""


_F16: list | None = None


def _f16_table() -> list:
    """Every f16 bit pattern's value (65536 floats, built once): struct's per-value 'e'
    unpacking is several times slower than a list lookup."""
    global _F16
    if _F16 is None:
        _F16 = list(struct.unpack("<65536e", array.array("H", range(65536)).tobytes()
                                  if sys.byteorder == "little" else
                                  struct.pack("<65536H", *range(65536))))
    return _F16


def _floats(type_name: str, raw: memoryview, n: int, np, out: array.array) -> None:
    if type_name == "F32":
        out.frombytes(raw)
        if sys.byteorder != "little":
            out.byteswap()
    elif type_name == "BF16":
        wide = bytearray(4 * n)                       # bf16 = the top half of an f32
        wide[2::4] = raw[0::2]
        wide[3::4] = raw[1::2]
        out.frombytes(wide)
        if sys.byteorder != "little":
            out.byteswap()
    elif type_name == "F16":
        if np is not None:
            out.frombytes(np.frombuffer(raw, dtype="<f2").astype("<f4").tobytes())
            return
        halves = array.array("H")
        halves.frombytes(raw)
        if sys.byteorder != "little":
            halves.byteswap()
        out.extend(map(_f16_table().__getitem__, halves))   # one C-level lookup per value
    else:                                             # F64
        out.extend(struct.unpack(f"<{n}d", raw))


def dequantize(type_name: str, raw, n: int, *, what: str = "tensor",
               use_numpy: bool = True) -> array.array:
    """n f32 values (array('f')) from raw GGUF data of a ggml type; `what` names the tensor
    in errors. use_numpy=False runs the pure-Python spec (as where numpy is missing)."""
    if type_name not in TYPE_IDS:
        raise ValueError(f"dequantize {what}: unknown ggml type {type_name!r}")
    _, block, bsize = GGML_TYPES[TYPE_IDS[type_name]]
    raw = memoryview(raw).cast("B")
    if n % block or raw.nbytes != n // block * bsize:
        raise ValueError(f"dequantize {what}: {raw.nbytes} bytes is not {n} {type_name} values "
                         f"({n // block * bsize} bytes in blocks of {block})")
    if type_name not in DEQUANTIZABLE:
        raise ValueError(f"dequantize {what}: {type_name} is not supported (supported: "
                         f"{', '.join(DEQUANTIZABLE)}); convert the file to one of those, or "
                         "add the format (webgrad/quants/__init__.py says how)")
    np = numpy_or_none() if use_numpy else None
    out = array.array("f")
    if type_name in FLOATS:
        _floats(type_name, raw, n, np, out)
        return out
    fmt = FORMATS[type_name]
    if np is not None:
        blocks = np.frombuffer(raw, dtype=np.uint8).reshape(-1, bsize)
        out.frombytes(fmt.numpy(np, blocks).astype("<f4").tobytes())
    else:
        fmt.python(raw, n // block, out)
    return out


__all__ = ["DEQUANTIZABLE", "f16_wgsl", "dequantize"]
