"""Host arrays without numpy: what goes in and out of a compiled program.

In: numpy arrays, array.array, memoryview/bytes (raw f32/i32 data), nested lists, torch
tensors, and JS typed arrays under Pyodide. Everything is checked against the declared
shape and dtype and becomes a `HostArray`: an `array.array` (so it has the buffer protocol)
with a `.shape`. Out: numpy.ndarray where numpy imports, else the HostArray itself, whose
`.tolist()` nests like numpy's.
"""
from __future__ import annotations

import array
import math
import sys
from itertools import chain
from math import prod

TYPECODE = {"f32": "f", "i32": "i"}

# Device buffer sizes are multiples of ALIGN bytes (vec4 views stay possible). Here, with the
# data, because every layer that makes a GPU buffer sizes it so: the planner (buffers.py),
# the backends, and the file formats' upload paths (io/gpu_dequant.py), which must give a
# parameter the size compiled programs expect.
ALIGN = 16


def align(nbytes: int) -> int:
    """nbytes rounded up to a whole number of ALIGN-byte units (at least one)."""
    return max(ALIGN, -(-int(nbytes) // ALIGN) * ALIGN)


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
        if 0 in self.shape:                   # nothing to chunk: [] nested to the first 0
            k = self.shape.index(0)
            out: list = []
            for d in reversed(self.shape[:k]):
                out = [list(out) for _ in range(d)]
            return out
        for d in reversed(self.shape[1:]):
            flat = [flat[i:i + d] for i in range(0, len(flat), d)]
        return flat

    # A rank-0 array converts to a Python number and item() takes the one element of any
    # one-element array, as numpy's do: `float(f.run(...))` of a rank-0 result is the same
    # code with and without numpy.
    def item(self):
        if len(self) != 1:
            raise ValueError(f"item(): this HostArray has shape {list(self.shape)} ({len(self)} "
                             f"elements), not one: index it or use tolist()")
        return array.array.__getitem__(self, 0)

    def _scalar(self, kind):
        if self.shape:
            raise TypeError(f"only a rank-0 HostArray converts to {kind}; this one has shape "
                            f"{list(self.shape)}: use .item() for one element, or index it")
        return self.item()

    def __float__(self):
        return float(self._scalar("float"))

    def __int__(self):
        return int(self._scalar("int"))

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


def flat_list(v, out):
    """Append the leaves of nested lists/tuples `v` to `out`, row-major (init.literal too)."""
    if isinstance(v, (list, tuple)):
        for e in v:
            flat_list(e, out)
    else:
        out.append(v)


I32_MIN, I32_MAX = -2 ** 31, 2 ** 31 - 1
_INT_FORMATS = "bBhHiIlLqQnN"
_FLOAT_FORMATS = "efd"
_FORMAT_NAMES = {"b": "int8", "B": "uint8", "h": "int16", "H": "uint16", "i": "i32",
                 "I": "uint32", "l": "int64", "L": "uint64", "q": "int64", "Q": "uint64",
                 "n": "ssize_t", "N": "size_t", "e": "f16", "f": "f32", "d": "f64"}  # i32/f32: our names


def to_host(value, *, shape, dtype: str, what: str, allow_nonfinite: bool = False) -> HostArray:
    """Convert and check one value; `what` names it in errors ("step(): input 'x'").

    Values are converted, never reinterpreted: a float64 buffer fed as f32 is rounded value by
    value, an int16 or int64 buffer fed as i32 is widened or range-checked. The raw-bytes form
    (bytes, bytearray, a memoryview of format 'B') is the one exception: it IS the f32/i32 data.
    Refused, naming the input and the position: NaN and +-inf in f32 data unless
    allow_nonfinite (a NaN or inf fed to a training step poisons parameters and optimizer
    state for good), which also catches a finite float64 too large for f32 (inf after the
    cast); integers outside i32, integer *buffers* for f32 (an index array uploaded as weights
    is a mistake; Python lists of ints are fine), bools, non-numbers in lists, torch meta
    tensors. This is the one value check of every path that brings values in: feeds,
    upload_params, load_state_dict, checkpoints, safetensors, GGUF and torch tensors.
    """
    shape = tuple(shape)
    want = f"{dtype}{list(shape)}"
    value = _from_js(value)
    fresh = False
    if not isinstance(value, HostArray) and callable(getattr(value, "to_host", None)):
        value = value.to_host()      # a tensor read from a file: io.safetensors, io.gguf
        fresh = True                 # made just now, owned here: kept without a copy
    if isinstance(value, HostArray) and value.dtype == dtype:
        got_shape, data = value.shape, value
    elif _is_numpy_like(value):
        got_shape, data = _from_numpy(value, dtype, want, what)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        got_shape, data = _from_buffer(memoryview(value), shape, dtype, want, what)
    elif isinstance(value, array.array):
        got_shape, data = _from_array(value, shape, dtype, want, what)
    elif isinstance(value, (list, tuple, int, float)) and not isinstance(value, bool):
        got_shape = _shape_of(value) or ()
        data = _flat_nested(value, got_shape)
        if data is None:  # ragged: the element-wise walk, then the count check reports it
            data = []
            flat_list(value, data)
        if dtype == "i32":
            _check_ints(data, want, what, got_shape)
        elif any(type(v) is bool for v in data):
            at = next(i for i, v in enumerate(data) if type(v) is bool)
            raise FeedError(f"{what}: expects numbers ({want}), got the bool {data[at]!r} at "
                            f"{_position(at, got_shape)}; write 1.0/0.0 if a number is meant")
    else:
        raise FeedError(f"{what}: cannot read a {type(value).__name__}; pass a numpy array, "
                        "array.array, memoryview, nested list or JS typed array")
    if got_shape != shape and not (prod(got_shape) == prod(shape) and len(got_shape) <= 1 and not _is_numpy_like(value)):
        raise FeedError(f"{what}: expects shape {list(shape)} ({want}), got shape {list(got_shape)}")
    if fresh and data is value and tuple(value.shape) == shape:
        out = value
    else:
        out = HostArray(dtype, shape=shape)
    if out is value:
        pass
    elif isinstance(data, (bytes, bytearray)):
        out.frombytes(data)
    else:
        try:
            out.extend(data)
        except TypeError:  # a str, None, a list where a number belongs: say which, and where
            at = next(i for i, v in enumerate(data) if not _is_number(v))
            raise FeedError(f"{what}: expects numbers ({want}), got {type(data[at]).__name__} "
                            f"{data[at]!r} at {_position(at, got_shape)}") from None
    if len(out) != prod(shape):
        raise FeedError(f"{what}: expects {prod(shape)} values for {want}, got {len(out)}")
    if dtype == "f32" and not allow_nonfinite:
        refuse_nonfinite(out, shape, what)
    return out


def _from_numpy(value, dtype, want, what):
    if hasattr(value, "detach"):
        value = _torch_to_numpy(value, want, what)
    kind = value.dtype.kind
    if dtype == "i32":
        if kind not in "iu":
            raise FeedError(f"{what}: expects integer indices ({want}), got dtype {value.dtype}")
        if value.size and value.dtype.itemsize >= 4 and value.dtype != "int32":
            lo, hi = int(value.min()), int(value.max())
            if lo < I32_MIN or hi > I32_MAX:
                bad = lo if lo < I32_MIN else hi
                pos = _np_position(value, value == bad)
                raise FeedError(f"{what}: value {bad} at {pos} does not fit i32 ({want}); i32 "
                                f"holds {I32_MIN}..{I32_MAX}")
        return tuple(value.shape), value.astype("int32").tobytes()
    if kind != "f":
        raise FeedError(f"{what}: expects {want}, got dtype {value.dtype}; convert it first "
                        "(.astype(numpy.float32)) if these are really values, not indices")
    import numpy
    with numpy.errstate(over="ignore"):       # an overflow to inf is refused by name below
        return tuple(value.shape), value.astype("float32").tobytes()


def _torch_to_numpy(t, want, what):
    """A torch tensor's values as numpy: floats numpy lacks (bfloat16, float8) widen to f32
    first, as load_state_dict always did; a meta tensor holds no values."""
    if t.device.type == "meta":
        raise FeedError(f"{what}: a torch meta tensor {tuple(t.shape)} holds no values ({want}); "
                        "materialise it first (load its weights, or .to_empty(device='cpu') "
                        "and initialise it)")
    t = t.detach().cpu()
    if t.dtype.is_complex:
        raise FeedError(f"{what}: expects {want}, got the complex dtype {t.dtype}; pass "
                        ".real or .abs()")
    if t.dtype.is_floating_point and t.dtype.itemsize < 4:
        t = t.float()                      # bf16, f16, float8: every value exact in f32
    return t.numpy()


def _np_position(value, mask) -> str:
    import numpy
    idx = tuple(int(i) for i in numpy.argwhere(mask)[0])
    return f"index {list(idx)}"


def _format(mv: memoryview, what: str) -> str:
    fmt = mv.format
    if len(fmt) == 2 and fmt[0] in "@=<>!":
        if fmt[0] in ">!" and sys.byteorder == "little":
            raise FeedError(f"{what}: big-endian data ({fmt!r}) is not supported; byte-swap it first")
        fmt = fmt[1:]
    return fmt


def _from_buffer(mv, shape, dtype, want, what):
    fmt = _format(mv, what)
    if fmt in ("B", "c"):  # raw bytes: the f32/i32 data itself
        if mv.nbytes != 4 * prod(shape):
            raise FeedError(f"{what}: expects {want} ({4 * prod(shape)} bytes), got {mv.nbytes} bytes")
        return shape, mv.tobytes()
    name = _FORMAT_NAMES.get(fmt, repr(fmt))
    got_shape = tuple(mv.shape) if mv.ndim else ()
    ok = _FLOAT_FORMATS if dtype == "f32" else _INT_FORMATS
    if fmt not in ok:
        raise FeedError(f"{what}: expects {want}, got {name} data (memoryview format {mv.format!r})")
    if fmt == TYPECODE[dtype]:
        return got_shape, mv.tobytes()
    raw = mv.tobytes()
    if fmt == "e":  # memoryview cannot cast to half floats; struct can read them
        import struct
        values = list(struct.unpack(f"{len(raw) // 2}e", raw))
    else:
        values = memoryview(raw).cast(fmt)
    if dtype == "i32":
        _check_i32_range(values, what, want)
    return got_shape, values


def _from_array(value, shape, dtype, want, what):
    ok = "fd" if dtype == "f32" else "bBhHiIlLqQ"
    if value.typecode not in ok:
        raise FeedError(f"{what}: expects {want}, got array('{value.typecode}')")
    if dtype == "i32" and value.typecode in "IlLqQ":
        _check_i32_range(value, what, want)
    got_shape = (len(value),) if len(value) != prod(shape) else shape
    # array.extend refuses an array of another typecode; a memoryview of it is just iterable
    return got_shape, value if value.typecode == TYPECODE[dtype] else memoryview(value)


def _check_i32_range(values, what, want):
    if len(values) and (min(values) < I32_MIN or max(values) > I32_MAX):
        at = next(i for i, v in enumerate(values) if not I32_MIN <= v <= I32_MAX)
        raise FeedError(f"{what}: value {values[at]} at flat position {at} does not fit i32 "
                        f"({want}); i32 holds {I32_MIN}..{I32_MAX}")


def _flat_nested(value, shape) -> list | None:
    """Nested lists flattened one level at a time (itertools.chain: C speed, where a walk
    per element costs ~1 s per million values); None when a level is ragged."""
    level = [value]
    for d in shape:
        if not all(isinstance(r, (list, tuple)) and len(r) == d for r in level):
            return None
        level = list(chain.from_iterable(level))
    return level


def _check_ints(flat: list, want, what, got_shape):
    """Python ints in i32 range (no floats, no bools: True is not an index). Floats and
    strings would also fail array('i').extend, but bools would pass as 1 and 0."""
    if all(map(_is_int, flat)):
        _check_i32_range(flat, what, want)
        return
    at = next(i for i, v in enumerate(flat) if not _is_int(v))
    raise FeedError(f"{what}: expects integer indices ({want}), got non-integers: "
                    f"{flat[at]!r} at {_position(at, got_shape)}")


def _is_int(v) -> bool:
    return type(v) is int or (isinstance(v, int) and not isinstance(v, bool))


def _is_number(v) -> bool:
    return type(v) in (float, int) or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _position(flat_index: int, shape) -> str:
    """'index [1, 2]' for a flat position in a C-ordered array of `shape`."""
    if len(shape) <= 1:
        return f"index {flat_index}"
    idx = []
    for d in reversed(shape):
        idx.append(flat_index % d if d else 0)
        flat_index //= d if d else 1
    return f"index {list(reversed(idx))}"


def first_nonfinite(h: array.array) -> int | None:
    """The flat position of the first NaN, inf or -inf in f32 data, or None.

    Cheap on the common path: with numpy, one vectorised isfinite over a zero-copy view;
    without (the browser), one C-level sum() in float64 (a NaN or inf makes it non-finite,
    and f32 values cannot overflow a float64 sum of fewer than 10^270 of them), confirmed by
    a scan, which only a bad value pays."""
    np = numpy_or_none()
    if np is not None:
        hits = np.flatnonzero(~np.isfinite(np.frombuffer(h, dtype=np.float32)))
        return int(hits[0]) if hits.size else None
    if math.isfinite(sum(h)):
        return None
    return next((i for i, v in enumerate(h) if not math.isfinite(v)), None)


def extent(h: array.array) -> tuple[int, int]:
    """(min, max) of non-empty i32 data: with numpy one vectorised pass over a zero-copy view,
    without (the browser) Python's min() and max(), which took 1.8 ms a step for two [64, 256]
    index feeds on the H200's host (bench/README.md)."""
    np = numpy_or_none()
    if np is not None:
        v = np.frombuffer(h, dtype=h.typecode)  # array.array typecodes are numpy dtypes
        return int(v.min()), int(v.max())
    return min(h), max(h)


def refuse_nonfinite(h: array.array, shape, what: str) -> None:
    """FeedError naming `what` and the position of the first NaN/inf of f32 data `h`."""
    at = first_nonfinite(h)
    if at is None:
        return
    v = h[at]
    kind = "NaN" if v != v else repr(v)
    why = ("" if v != v else " (an inf, or a finite value beyond f32's range, +-3.4e38, "
           "cast to f32)")
    raise FeedError(f"{what}: {kind} at {_position(at, shape)} (flat position {at}){why}; a "
                    "non-finite value would spread into the parameters and optimizer state, so "
                    "nothing ran. Clean the data (e.g. numpy.nan_to_num), mask it out, or pass "
                    "allow_nonfinite=True if it is meant")


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


def transpose2d(h: HostArray) -> HostArray:
    """An f32 [cols, rows] HostArray holding the 2-D f32 HostArray h [rows, cols] transposed
    (GGUF's [out, in] matrices, dequantized on the host, into transformers' Conv1D [in, out])."""
    rows, cols = h.shape
    out = HostArray("f32", shape=(cols, rows))
    out.frombytes(bytes(4 * rows * cols))
    for r in range(rows):                    # row r of h is column r of the result
        out[r::rows] = h[r * cols:(r + 1) * cols]
    return out


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
