"""Host arrays without numpy: what goes in and out of a compiled program.

In: numpy arrays, array.array, memoryview/bytes (raw f32/i32 data), nested lists, torch
tensors, and JS typed arrays under Pyodide. Everything is checked against the declared
shape and dtype and becomes a `HostArray`: an `array.array` (so it has the buffer protocol)
with a `.shape`. Out: numpy.ndarray where numpy imports, else the HostArray itself, whose
`.tolist()` nests like numpy's.
"""
from __future__ import annotations

import array
import sys
from math import prod

TYPECODE = {"f32": "f", "i32": "i"}


class FeedError(ValueError):
    """A value passed to step/run/upload_params does not match what was declared."""


class HostArray(array.array):
    """A flat array.array with a shape; `tolist()` nests, `np.asarray(h)` works."""

    def __new__(cls, dtype: str, data=(), shape=None):
        self = super().__new__(cls, TYPECODE[dtype], data)
        self.shape = tuple(shape) if shape is not None else (len(self),)
        self.dtype = dtype
        return self

    @property
    def flat(self) -> array.array:
        return array.array(self.typecode, self)

    def tolist(self):
        flat = list(array.array.tolist(self))
        if not self.shape:
            return flat[0]
        for d in reversed(self.shape[1:]):
            flat = [flat[i:i + d] for i in range(0, len(flat), d)]
        return flat

    def __repr__(self):
        return f"HostArray({self.dtype}{list(self.shape)}, {self.tolist()!r})"


def _shape_of(value):
    shape = getattr(value, "shape", None)
    if shape is not None:
        return tuple(int(s) for s in shape)
    if isinstance(value, (list, tuple)):
        dims, v = [], value
        while isinstance(v, (list, tuple)):
            dims.append(len(v))
            v = v[0] if v else None
        return tuple(dims)
    return None


def _flat_list(v, out):
    if isinstance(v, (list, tuple)):
        for e in v:
            _flat_list(e, out)
    else:
        out.append(v)


def to_host(value, *, shape, dtype: str, what: str) -> HostArray:
    """Convert and check one value; `what` names it in errors ("step(): input 'x'")."""
    shape = tuple(shape)
    want = f"{dtype}{list(shape)}"
    value = _from_js(value)
    if isinstance(value, HostArray) and value.dtype == dtype:
        got_shape = value.shape
        data = value
    elif _is_numpy_like(value):
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        kind = value.dtype.kind
        if dtype == "i32" and kind not in "iu":
            raise FeedError(f"{what}: expects integer indices ({want}), got dtype {value.dtype}")
        got_shape = tuple(value.shape)
        if prod(got_shape) == prod(shape):
            data = value.astype("float32" if dtype == "f32" else "int32").tobytes()
    elif isinstance(value, (bytes, bytearray, memoryview)):
        mv = memoryview(value)
        if mv.format in ("f", "i") and TYPECODE[dtype] != mv.format:
            raise FeedError(f"{what}: expects {want}, got {'f32' if mv.format == 'f' else 'i32'} data")
        nbytes = mv.nbytes
        if nbytes != 4 * prod(shape):
            raise FeedError(f"{what}: expects {want} ({4 * prod(shape)} bytes), got {nbytes} bytes")
        got_shape, data = shape, mv.cast("B").tobytes()
    elif isinstance(value, array.array):
        if value.typecode not in ("f", "d") if dtype == "f32" else value.typecode not in "bBhHiIlLqQ":
            raise FeedError(f"{what}: expects {want}, got array('{value.typecode}')")
        got_shape = (len(value),) if len(value) != prod(shape) else shape
        data = list(value)
    elif isinstance(value, (list, tuple, int, float)):
        got_shape = _shape_of(value) or ()
        flat: list = []
        _flat_list(value, flat)
        if dtype == "i32" and any(not isinstance(v, int) or isinstance(v, bool) for v in flat):
            raise FeedError(f"{what}: expects integer indices ({want}), got non-integers")
        data = flat
    else:
        raise FeedError(f"{what}: cannot read a {type(value).__name__}; pass a numpy array, "
                        "array.array, memoryview, nested list or JS typed array")
    if got_shape != shape and not (prod(got_shape) == prod(shape) and len(got_shape) <= 1 and not _is_numpy_like(value)):
        raise FeedError(f"{what}: expects shape {list(shape)} ({want}), got shape {list(got_shape)}")
    out = HostArray(dtype, shape=shape)
    if isinstance(data, (bytes, bytearray)):
        out.frombytes(data)
    else:
        out.extend(data)
    if len(out) != prod(shape):
        raise FeedError(f"{what}: expects {prod(shape)} values for {want}, got {len(out)}")
    return out


def _is_numpy_like(v) -> bool:
    return hasattr(v, "__array_interface__") or type(v).__module__.startswith("torch")


def _from_js(v):
    """Under Pyodide, a JS typed array becomes a memoryview of its format (Float32Array ->
    'f'), a JS Array a list; anything else passes through."""
    if sys.platform != "emscripten":
        return v
    from pyodide.ffi import JsProxy
    if not isinstance(v, JsProxy):
        return v
    if hasattr(v, "to_memoryview"):
        return v.to_memoryview()
    return v.to_py()


def numpy_or_none():
    try:
        import numpy
        return numpy
    except ImportError:
        return None


BIG_RESULT = 1 << 20  # bytes: results this large come back as numpy arrays (device_result)


def device_result(data, offset: int, nbytes: int, dtype: str, shape):
    """A result read back from a GPU host, from bytes-like `data` at byte `offset`: a
    HostArray (one copy), or, when the host handed a numpy array and the result is large,
    a numpy view of it (no copy at all: bench/readback.py)."""
    if nbytes >= BIG_RESULT and type(data).__module__ == "numpy":
        import numpy as np
        return data[offset:offset + nbytes].view(
            np.float32 if dtype == "f32" else np.int32).reshape(shape)
    out = HostArray(dtype, shape=shape)
    out.frombytes(memoryview(data)[offset:offset + nbytes])
    return out


def to_user(h: HostArray):
    """What users get back: numpy where available, else the HostArray. The array views the
    HostArray's memory (no copy: every caller hands over a fresh HostArray nobody else
    holds, and a 100 MB result should not be copied once more)."""
    np = numpy_or_none()
    if np is None or not isinstance(h, HostArray):  # a numpy array already (device_result)
        return h
    return np.frombuffer(h, dtype=np.float32 if h.dtype == "f32" else np.int32).reshape(h.shape)


def to_numpy(np, h: HostArray):
    """A numpy copy of h, with its shape and dtype (float32 / int32)."""
    return np.frombuffer(h, dtype=np.float32 if h.dtype == "f32" else np.int32).reshape(h.shape).copy()
