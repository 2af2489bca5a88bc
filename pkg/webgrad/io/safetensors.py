"""safetensors, read and written in pure Python (numpy is absent in the browser).

The format (https://github.com/huggingface/safetensors): an 8-byte little-endian unsigned
header length N, N bytes of UTF-8 JSON, then the data buffer. The JSON maps each tensor name
to {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]} (offsets into the data
buffer, little-endian, C order) and may hold "__metadata__": {str: str}.

API (what webgrad.models.gpt2, checkpoints and the tests use):

    from webgrad.io import safetensors as st
    f = st.load(src)              # src: a path, bytes/bytearray/memoryview or a binary file
    f["wte.weight"]               # -> StoredTensor: .dtype ("F32", "BF16", ...), .shape,
                                  #    .data (a zero-copy memoryview of the raw bytes),
                                  #    .to_host() -> HostArray f32/i32 with .shape,
                                  #    .numpy() (native dtype), np.asarray(t), .tolist()
    f.metadata                    # the "__metadata__" dict ({} when absent)
    st.save({"w": value, ...}, dst, metadata={"format": "pt"})   # dst: a path or binary file
    blob = st.dumps({"w": value}, metadata=None)                 # the file as bytes

`save` takes StoredTensors, HostArrays, numpy arrays, torch tensors (any device, bf16
included), or a (dtype, shape, bytes-like) triple for raw data. Tensors are laid out in
the library's order (dtype, widest first, then name), so each start is aligned to its
element size and the bytes equal the library's for the same tensors and metadata.

Reading validates everything before touching the data: the header length against the file
size (and 100 MB, the library's limit), the JSON (no duplicate names), each dtype, shape and
offset pair, that each range holds exactly prod(shape) * itemsize bytes, and that the ranges
tile the data buffer with neither overlaps nor holes (the library's rule against polyglot
files). Failures raise SafetensorsError naming the file and the field, never reading past
the end or allocating what a header merely claims.
"""
from __future__ import annotations

import array
import json
import os
import struct
import sys
from math import prod

from ..arrays import HostArray, numpy_or_none

MAX_HEADER = 100_000_000          # the safetensors library refuses larger headers too
# Bounds on the work a header can ask for (the library's largest header, 1.4 M zero-size
# tensors, took 22-31 s and 1.5 GB to parse): tensors per file (a whole Llama 405B is
# ~1,100; a sharded MoE's shard a few thousand), counted in the raw bytes before parsing,
# and each dimension (the library's usize).
MAX_TENSORS = 100_000
MAX_DIM = 2 ** 63 - 1

# dtype -> (bytes per element, struct code for little-endian decoding or None), in the
# library's own dtype order, which its writer sorts by (last first) before names
DTYPES = {
    "BOOL": (1, "?"), "U8": (1, "B"), "I8": (1, "b"), "F8_E5M2": (1, None), "F8_E4M3": (1, None),
    "I16": (2, "h"), "U16": (2, "H"), "F16": (2, "e"), "BF16": (2, None),
    "I32": (4, "i"), "U32": (4, "I"), "F32": (4, "f"),
    "F64": (8, "d"), "I64": (8, "q"), "U64": (8, "Q"),
}
_ORDER = {d: i for i, d in enumerate(DTYPES)}
_FLOATS = {"F16", "BF16", "F32", "F64"}
# numpy dtype names <-> safetensors names, for save() and StoredTensor.numpy()
_NUMPY = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
          "F16": "float16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64",
          "U64": "uint64", "F64": "float64"}
_FROM_NUMPY = {v: k for k, v in _NUMPY.items()}
_TORCH = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
          "float16": "F16", "bfloat16": "BF16", "int32": "I32", "uint32": "U32",
          "float32": "F32", "int64": "I64", "uint64": "U64", "float64": "F64",
          "float8_e5m2": "F8_E5M2", "float8_e4m3fn": "F8_E4M3"}


class SafetensorsError(ValueError):
    """A safetensors file or value that cannot be read or written; says which and where."""


class StoredTensor:
    """One tensor of a safetensors file: dtype name, shape, and its raw little-endian bytes."""

    __slots__ = ("dtype", "shape", "data")

    def __init__(self, dtype: str, shape, data):
        self.dtype = dtype
        self.shape = tuple(shape)
        self.data = memoryview(data).cast("B")

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def __repr__(self):
        return f"StoredTensor({self.dtype}{list(self.shape)})"

    def to_host(self) -> HostArray:
        """A HostArray (f32 for float dtypes, i32 for integer ones) with this shape.

        F16/BF16/F64 widen or round to f32; integers must fit in i32 (checked)."""
        n = prod(self.shape)
        if self.dtype in _FLOATS:
            out = HostArray("f32", shape=self.shape)
            if self.dtype == "F32":
                out.frombytes(self.data)
            elif self.dtype == "BF16" and (np := numpy_or_none()) is not None:
                # bf16 is the top half of an f32: shift its 16 bits up (one pass in numpy)
                wide = np.frombuffer(self.data, "<u2").astype(np.uint32)
                wide <<= 16
                out.frombytes(memoryview(wide).cast("B"))
                return out
            elif self.dtype == "BF16":
                # the same without numpy: its two bytes above two zero bytes
                wide = bytearray(4 * n)
                wide[2::4] = self.data[0::2]
                wide[3::4] = self.data[1::2]
                out.frombytes(wide)
            else:
                np = numpy_or_none()
                if np is not None:
                    # F64 past f32's range becomes inf, refused by name in arrays.to_host
                    with np.errstate(over="ignore"):
                        out.frombytes(self.numpy().astype(np.float32).tobytes())
                    return out
                out.extend(struct.unpack(f"<{n}{DTYPES[self.dtype][1]}", self.data))
                return out
            if sys.byteorder != "little":
                out.byteswap()
            return out
        code = DTYPES[self.dtype][1]
        if code is None:
            raise SafetensorsError(f"StoredTensor.to_host: dtype {self.dtype} has no host "
                                   "conversion; read .data (raw bytes) instead")
        values = struct.unpack(f"<{n}{code}", self.data)
        if self.dtype in ("I64", "U64", "U32") and values and not (
                -2**31 <= min(values) and max(values) < 2**31):
            raise SafetensorsError(f"StoredTensor.to_host: {self.dtype} values outside the i32 "
                                   f"range ({min(values)}..{max(values)}); read .data instead")
        return HostArray("i32", [int(v) for v in values], shape=self.shape)

    def first_nonfinite(self) -> int | None:
        """The flat position of the first NaN or inf of a float tensor, or None. F16/BF16
        are checked on their bits (an all-ones exponent), with numpy in one pass over the
        file's bytes and no f32 copy (what a loader that widens on the GPU needs); without
        numpy, and for F32/F64, through to_host."""
        np = numpy_or_none()
        if self.dtype in ("F16", "BF16") and np is not None:
            limit = 0x7C00 if self.dtype == "F16" else 0x7F80   # |bits| at or past inf
            bits = np.frombuffer(self.data, "<u2")
            step = 1 << 22
            tmp = np.empty(min(step, bits.size), np.uint16)
            for at in range(0, bits.size, step):
                chunk = tmp[:min(step, bits.size - at)]
                np.bitwise_and(bits[at:at + step], 0x7FFF, out=chunk)
                if chunk.size and chunk.max() >= limit:
                    return at + int(np.flatnonzero(chunk >= limit)[0])
            return None
        if self.dtype not in _FLOATS:
            return None
        from ..arrays import first_nonfinite
        return first_nonfinite(self.to_host())

    def numpy(self):
        """A numpy array of the stored dtype (BF16 comes as float32: numpy has no bf16)."""
        np = numpy_or_none()
        if np is None:
            raise SafetensorsError("StoredTensor.numpy: numpy is not installed; use to_host()")
        if self.dtype == "BF16":
            return np.frombuffer(self.to_host(), dtype=np.float32).reshape(self.shape).copy()
        name = _NUMPY.get(self.dtype)
        if name is None:
            raise SafetensorsError(f"StoredTensor.numpy: numpy has no {self.dtype}; read .data")
        a = np.frombuffer(self.data, dtype=np.dtype(name).newbyteorder("<")).reshape(self.shape)
        a.flags.writeable = False       # a view of the file's buffer: copy it to write
        return a

    def __array__(self, dtype=None, copy=None):
        """np.asarray(t): a read-only view of the file's bytes; np.array(t) (copy=True): a
        copy of its own, never a view that writes through into the file's buffer."""
        a = self.numpy()
        if dtype is not None and a.dtype != dtype:
            return a.astype(dtype)
        if copy:
            return a.copy()
        return a

    def tolist(self):
        return self.to_host().tolist()


class SafetensorsFile(dict):
    """name -> StoredTensor, in file order, with the header's `metadata` dict."""

    def __init__(self, tensors, metadata, name):
        super().__init__(tensors)
        self.metadata = metadata
        self.name = name


# ----------------------------------------------------------------------------- reading

def read_source(src, reader: str = "safetensors.load", error=None) -> tuple[memoryview, str]:
    """The whole file as a memoryview, and a name for errors (GGUF's reader uses it too,
    with its own `error` class)."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        return memoryview(src).cast("B"), "<bytes>"
    if isinstance(src, (str, os.PathLike)):
        path = os.fspath(src)
        with open(path, "rb") as f:
            return memoryview(f.read()), repr(path)
    if hasattr(src, "read"):
        name = getattr(src, "name", None)
        name = repr(name) if isinstance(name, str) else "<file>"
        data = src.read()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise (error or SafetensorsError)(f"{reader}: file {name} gave {type(data).__name__}, not bytes: "
                            "open it in binary mode (open(path, 'rb'))")
        return memoryview(data).cast("B"), name
    raise TypeError(f"{reader}: src must be a path, bytes or a binary file, "
                    f"got {type(src).__name__}")


def _fail(name: str, field: str, msg: str):
    raise SafetensorsError(f"safetensors file {name}: {field}: {msg}")


def parse_header(buf: memoryview, name: str = "<bytes>") -> tuple[int, dict, dict]:
    """(start of the data buffer, {tensor: (dtype, shape, begin, end)}, metadata), validated
    against len(buf); nothing is allocated beyond the header's own size."""
    size = len(buf)
    if size < 8:
        _fail(name, "header length", f"the file has {size} bytes; it needs at least 8 "
              "(a little-endian u64 header length)")
    n = int.from_bytes(buf[:8], "little")
    if n > MAX_HEADER:
        _fail(name, "header length", f"{n} bytes is over the {MAX_HEADER}-byte limit: not a "
              f"safetensors file? (it starts with {bytes(buf[:8])!r})")
    if 8 + n > size:
        _fail(name, "header length", f"says {n} bytes of JSON but only {size - 8} follow "
              "(truncated file?)")
    raw = bytes(buf[8:8 + n])
    if not raw.startswith(b"{"):
        _fail(name, "header", "the JSON header must start with '{'")
    if raw.count(b'"data_offsets"') > MAX_TENSORS:     # one C-level scan, before json.loads
        _fail(name, "header", f"names more than {MAX_TENSORS} tensors ({raw.count(b'data_offsets')}"
              " 'data_offsets' keys); split the file into shards")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        _fail(name, "header", f"not UTF-8 ({e.reason} at byte {e.start})")

    def no_duplicates(pairs):
        d = {}
        for k, v in pairs:
            if k in d:
                _fail(name, "header", f"name {k!r} appears twice")
            d[k] = v
        return d

    try:
        header = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as e:
        _fail(name, "header", f"invalid JSON ({e.msg} at character {e.pos})")
    except RecursionError:
        _fail(name, "header", "JSON nested too deeply")
    except ValueError as e:                        # e.g. an integer of more than 4300 digits
        _fail(name, "header", f"invalid JSON ({e})")
    if not isinstance(header, dict):
        _fail(name, "header", f"must be a JSON object, got {type(header).__name__}")
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    elif not (isinstance(metadata, dict)
              and all(isinstance(v, str) for v in metadata.values())):
        _fail(name, "__metadata__", "must be an object of string values")
    data_size = size - 8 - n
    entries = {}
    for tname, info in header.items():
        where = f"tensor {tname!r}"
        if not isinstance(info, dict):
            _fail(name, where, f"must be an object, got {type(info).__name__}")
        extra = set(info) - {"dtype", "shape", "data_offsets"}
        missing = {"dtype", "shape", "data_offsets"} - set(info)
        if missing or extra:
            _fail(name, where, f"needs exactly dtype, shape, data_offsets "
                  f"(missing {sorted(missing)}, unexpected {sorted(extra)})")
        dtype = info["dtype"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            _fail(name, f"{where}.dtype", f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
        shape = info["shape"]
        if not (isinstance(shape, list) and all(type(d) is int and 0 <= d <= MAX_DIM
                                                for d in shape)):
            _fail(name, f"{where}.shape", f"must be a list of integers in [0, 2**63), got "
                  f"{shape!r:.200}")
        offs = info["data_offsets"]
        if not (isinstance(offs, list) and len(offs) == 2
                and all(type(o) is int and o >= 0 for o in offs)):
            _fail(name, f"{where}.data_offsets", f"must be [begin, end] (non-negative integers), "
                  f"got {offs!r}")
        begin, end = offs
        if begin > end:
            _fail(name, f"{where}.data_offsets", f"begin {begin} is after end {end}")
        if end > data_size:
            _fail(name, f"{where}.data_offsets", f"end {end} is beyond the data buffer "
                  f"({data_size} bytes; truncated file?)")
        want = prod(shape) * DTYPES[dtype][0]       # Python ints: no overflow, no allocation
        if end - begin != want:
            _fail(name, f"{where}.data_offsets", f"[{begin}, {end}] holds {end - begin} bytes "
                  f"but {dtype}{shape} needs {want}")
        entries[tname] = (dtype, tuple(shape), begin, end)
    # the ranges must tile [0, data_size): no overlaps (two names over the same bytes), no holes
    pos, prev = 0, None
    for tname, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if begin < pos:
            _fail(name, f"tensor {tname!r}.data_offsets", f"[{begin}, {end}] overlaps tensor "
                  f"{prev!r} (which ends at {pos})")
        if begin > pos:
            _fail(name, f"tensor {tname!r}.data_offsets", f"starts at {begin}, leaving bytes "
                  f"{pos}..{begin} unused after {prev!r}" if prev else
                  f"starts at {begin}, leaving bytes 0..{begin} unused")
        pos, prev = end, tname
    if pos != data_size:
        _fail(name, "data buffer", f"{data_size} bytes but the tensors cover only {pos} "
              "(trailing bytes)")
    return 8 + n, entries, metadata


def load(src) -> SafetensorsFile:
    """Every tensor of a safetensors file (path, bytes-like or binary file), zero-copy."""
    buf, name = read_source(src)
    start, entries, metadata = parse_header(buf, name)
    tensors = {t: StoredTensor(dtype, shape, buf[start + b:start + e])
               for t, (dtype, shape, b, e) in entries.items()}
    return SafetensorsFile(tensors, metadata, name)


# ----------------------------------------------------------------------------- writing

def _raw(name: str, value) -> tuple[str, tuple[int, ...], memoryview]:
    """(safetensors dtype, shape, little-endian bytes) of one value to save."""
    what = f"safetensors.save: tensor {name!r}"
    if isinstance(value, StoredTensor):
        return value.dtype, value.shape, value.data
    if isinstance(value, HostArray):
        data = array.array(value.typecode, value)
        if sys.byteorder != "little":
            data.byteswap()
        return {"f32": "F32", "i32": "I32"}[value.dtype], value.shape, memoryview(data).cast("B")
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], str):
        dtype, shape, data = value
        if dtype not in DTYPES:
            raise SafetensorsError(f"{what}: unknown dtype {dtype!r}")
        return dtype, tuple(int(d) for d in shape), memoryview(data).cast("B")
    if type(value).__module__.startswith("torch"):
        t = value.detach().cpu().contiguous()
        dtype = _TORCH.get(str(t.dtype).removeprefix("torch."))
        if dtype is None:
            raise SafetensorsError(f"{what}: torch dtype {t.dtype} has no safetensors name")
        import torch
        raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
        data = bytes(raw.numpy().tobytes())
        if sys.byteorder != "little" and DTYPES[dtype][0] > 1:
            raise SafetensorsError(f"{what}: saving torch tensors needs a little-endian host")
        return dtype, tuple(t.shape), memoryview(data)
    if hasattr(value, "__array_interface__"):
        np = numpy_or_none()
        a = np.ascontiguousarray(value)
        dtype = _FROM_NUMPY.get(a.dtype.name)
        if dtype is None:
            raise SafetensorsError(f"{what}: numpy dtype {a.dtype} has no safetensors name")
        return dtype, a.shape, memoryview(a.astype(a.dtype.newbyteorder("<")).tobytes())
    raise SafetensorsError(f"{what}: cannot save a {type(value).__name__}; pass a numpy "
                           "array, torch tensor, HostArray, StoredTensor or (dtype, shape, bytes)")


def dumps(tensors: dict, metadata: dict | None = None) -> bytes:
    """The safetensors file of these tensors, as bytes."""
    if metadata is not None and not (isinstance(metadata, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise SafetensorsError("safetensors.save: metadata must be a dict of str -> str")
    raws = {}
    for name in tensors:
        if not isinstance(name, str) or name == "__metadata__":
            raise SafetensorsError(f"safetensors.save: tensor names must be str other than "
                                   f"'__metadata__', got {name!r}")
        dtype, shape, data = _raw(name, tensors[name])
        if data.nbytes != prod(shape) * DTYPES[dtype][0]:
            raise SafetensorsError(f"safetensors.save: tensor {name!r}: {data.nbytes} bytes "
                                   f"for {dtype}{list(shape)}, which needs "
                                   f"{prod(shape) * DTYPES[dtype][0]}")
        raws[name] = (dtype, shape, data)
    # the library's order (dtypes as _ORDER, last first, then names): widest dtypes come
    # first, so every start stays aligned to its element size, and files come out identical
    order = sorted(raws, key=lambda k: (-_ORDER[raws[k][0]], k))
    header: dict = {"__metadata__": metadata} if metadata else {}
    pos = 0
    for name in order:
        dtype, shape, data = raws[name]
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [pos, pos + data.nbytes]}
        pos += data.nbytes
    js = json.dumps(header, separators=(",", ":")).encode("utf-8")
    js += b" " * (-len(js) % 8)                      # the data buffer starts 8-aligned
    out = bytearray(len(js).to_bytes(8, "little"))
    out += js
    for name in order:
        out += raws[name][2]
    return bytes(out)


def save(tensors: dict, dst, metadata: dict | None = None) -> None:
    """Write a safetensors file to a path or a binary file object."""
    blob = dumps(tensors, metadata)
    if hasattr(dst, "write"):
        dst.write(blob)
        return
    with open(os.fspath(dst), "wb") as f:
        f.write(blob)
