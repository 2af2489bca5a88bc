"""GGUF (llama.cpp's weight format), read in pure Python.

A GGUF v3 file (v2 has the same layout) is, little-endian:
    magic "GGUF", version u32, tensor count u64, metadata count u64,
    metadata:     key (string), value type u32, value      string = u64 length + UTF-8 bytes;
                  array = element type u32, count u64, elements
    tensor infos: name (string), n_dims u32, dims u64[n_dims] (ggml order: dims[0] is the
                  row length, the fastest-varying), ggml type u32, offset u64
    padding to `general.alignment` (default 32), then the data section; each tensor's offset
    is relative to it and a multiple of the alignment.

API (consumers: the models' GGUF loaders, models/gpt2_gguf.py and models/llama_gguf.py,
which map llama.cpp's names and metadata to a model; the tests; the browser page):

    from webgrad.io import gguf
    f = gguf.load(src)            # path, bytes-like or binary file -> GGUFFile
    f.version, f.alignment, f.metadata   # metadata: key -> int/float/bool/str/list
    t = f.tensors["blk.0.attn_qkv.weight"]
    t.type_name, t.shape          # "Q4_K"; shape in numpy/torch order (dims reversed)
    t.data                        # zero-copy memoryview of the raw blocks
    t.dequantize()                # HostArray f32 with t.shape (any type of
                                  #  gguf.DEQUANTIZABLE: floats, webgrad.quants.FORMATS)
    gguf.metadata_only(src)       # bytes: a GGUF file of src's metadata and no tensors (what
                                  #  a tokenizer is read from; the model cache keeps it)
    gguf.dequantize(type_name, raw, n)  # array('f') of n values from raw blocks

This module only parses: the block types' sizes (GGML_TYPES) and their decoding
(dequantize) come from webgrad.quants, which defines each quant format once and is bit-equal
to the `gguf` package's dequantization (tests/test_gguf.py, tests/test_quant_formats.py).

Reading checks everything against the file before allocating: magic and version, counts
against the bytes left (each entry takes at least a few bytes), string and array lengths,
dims (at most 4, each row a whole number of blocks), types, the alignment, and each tensor's
byte range (inside the data section, aligned, no overlaps). Failures raise GGUFError naming
the file and the field.
"""
from __future__ import annotations

import array
import struct
from math import prod

from .. import quants
from ..arrays import FeedError, HostArray, numpy_or_none, refuse_nonfinite
from ..quants import DEQUANTIZABLE, GGML_TYPES, TYPE_IDS  # noqa: F401  (this module's API too)
from .safetensors import read_source as _source  # the same path / bytes / file reading

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_NESTING = 8                      # arrays of arrays: GGUF writers produce at most 2 levels

# metadata value type -> (name, struct code or None for string/array)
_VALUE_TYPES = {0: ("UINT8", "B"), 1: ("INT8", "b"), 2: ("UINT16", "H"), 3: ("INT16", "h"),
                4: ("UINT32", "I"), 5: ("INT32", "i"), 6: ("FLOAT32", "f"), 7: ("BOOL", "?"),
                8: ("STRING", None), 9: ("ARRAY", None), 10: ("UINT64", "Q"),
                11: ("INT64", "q"), 12: ("FLOAT64", "d")}


class GGUFError(ValueError):
    """A GGUF file that cannot be read; says which file and which field."""


class GGUFTensor:
    """One tensor's info and raw blocks. `dims` is ggml's order, `shape` numpy's (reversed)."""

    __slots__ = ("name", "ggml_type", "dims", "offset", "data")

    def __init__(self, name, ggml_type, dims, offset, data):
        self.name, self.ggml_type, self.dims, self.offset, self.data = (
            name, ggml_type, tuple(dims), offset, data)

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.dims))

    @property
    def n_elements(self) -> int:
        return prod(self.dims)

    def __repr__(self):
        return f"GGUFTensor({self.name!r}, {self.type_name}{list(self.shape)})"

    def dequantize(self) -> HostArray:
        """The values as a HostArray f32 of this shape."""
        out = HostArray("f32", shape=self.shape)
        out.extend(dequantize(self.type_name, self.data, self.n_elements, what=self.name))
        return out

    to_host = dequantize          # what arrays.to_host calls: upload_params takes GGUFTensors


class GGUFFile:
    """A parsed GGUF file: version, alignment, metadata and tensors (name -> GGUFTensor)."""

    def __init__(self, name, version, alignment, metadata, tensors, metadata_span=None):
        self.name, self.version, self.alignment = name, version, alignment
        self.metadata, self.tensors = metadata, tensors
        self.metadata_span = metadata_span     # (start, end) of the metadata's bytes in the file

    def __repr__(self):
        return f"GGUFFile({self.name}, v{self.version}, {len(self.tensors)} tensors)"


# ----------------------------------------------------------------------------- parsing

_U64 = struct.Struct("<Q")


class _Cursor:
    """Bounds-checked little-endian reads over the file; every error names the field."""

    def __init__(self, buf: memoryview, name: str):
        self.buf, self.pos, self.name = buf, 0, name

    def fail(self, field: str, msg: str):
        raise GGUFError(f"GGUF file {self.name}: {field}: {msg}")

    def left(self) -> int:
        return len(self.buf) - self.pos

    def take(self, n: int, field: str) -> memoryview:
        if n > self.left():
            self.fail(field, f"needs {n} bytes at offset {self.pos} but the file has "
                      f"{self.left()} left (truncated?)")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, code: str, field: str):
        size = struct.calcsize("<" + code)
        return struct.unpack("<" + code, self.take(size, field))[0]

    def string(self, field: str) -> str:
        n = self.scalar("Q", f"{field} (length)")
        raw = self.take(n, field)
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(field, f"not UTF-8 ({e.reason} at byte {e.start})")

    def count(self, field: str, min_size: int):
        """A u64 count of entries that each take at least min_size bytes: bounded by the
        bytes left, so an absurd count fails here instead of allocating."""
        n = self.scalar("Q", field)
        if n * min_size > self.left():
            self.fail(field, f"{n} entries of at least {min_size} bytes each cannot fit in the "
                      f"{self.left()} bytes left")
        return n

    def value(self, vtype: int, field: str, depth: int = 0):
        if vtype not in _VALUE_TYPES:
            self.fail(field, f"unknown value type {vtype} (known: 0..12)")
        tname, code = _VALUE_TYPES[vtype]
        if code is not None:
            return self.scalar(code, field)
        if tname == "STRING":
            return self.string(field)
        if depth >= MAX_NESTING:
            self.fail(field, f"arrays nested deeper than {MAX_NESTING}")
        etype = self.scalar("I", f"{field} (array element type)")
        if etype not in _VALUE_TYPES:
            self.fail(field, f"unknown array element type {etype} (known: 0..12)")
        ename, ecode = _VALUE_TYPES[etype]
        min_size = struct.calcsize("<" + ecode) if ecode else (8 if ename == "STRING" else 12)
        n = self.count(f"{field} (array length)", min_size)
        if ecode is not None:                     # one C-level unpack for numeric arrays
            return list(struct.unpack(f"<{n}{ecode}", self.take(n * min_size, field)))
        if ename == "STRING":
            return self.strings(n, field)
        return [self.value(etype, f"{field}[{i}]", depth + 1) for i in range(n)]

    def strings(self, n: int, field: str) -> list:
        """n strings (a tokenizer's 49 K-150 K tokens) in one tight loop: the per-value
        calls of value() took seconds in the browser worker. An entry that does not fit or
        is not UTF-8 is read again by string(), which names it."""
        buf, pos, end = self.buf, self.pos, len(self.buf)
        length = _U64.unpack_from
        out = []
        append = out.append
        try:
            for _ in range(n):
                k = length(buf, pos)[0]
                if k > end - pos - 8:
                    break
                append(str(buf[pos + 8:pos + 8 + k], "utf-8"))
                pos += 8 + k
        except (struct.error, UnicodeDecodeError):
            pass
        self.pos = pos
        for i in range(len(out), n):              # the bad entry fails here, by name
            out.append(self.string(f"{field}[{i}]"))
        return out




def load(src) -> GGUFFile:
    """Parse a GGUF file (path, bytes-like or binary file); tensor data stays zero-copy."""
    buf, name = _source(src, "gguf.load", GGUFError)
    cur = _Cursor(buf, name)
    magic = bytes(cur.take(4, "magic"))
    if magic != MAGIC:
        cur.fail("magic", f"expected b'GGUF', got {magic!r} (not a GGUF file)")
    version = cur.scalar("I", "version")
    if version not in (2, 3):
        if version in (2 << 24, 3 << 24):
            cur.fail("version", "big-endian GGUF files are not supported")
        cur.fail("version", f"{version} is not supported (GGUF v2 and v3 are)")
    n_tensors = cur.count("tensor count", 8 + 4 + 4 + 8)   # name length, n_dims, type, offset
    n_kv = cur.count("metadata count", 8 + 4)                # key length, value type
    kv_start = cur.pos
    metadata = {}
    for i in range(n_kv):
        key = cur.string(f"metadata[{i}].key")
        if key in metadata:
            cur.fail(f"metadata {key!r}", "the key appears twice")
        vtype = cur.scalar("I", f"metadata {key!r} (value type)")
        metadata[key] = cur.value(vtype, f"metadata {key!r}")
    kv_end = cur.pos
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not (type(alignment) is int and alignment > 0 and alignment & (alignment - 1) == 0):
        cur.fail("metadata 'general.alignment'", f"must be a positive power of two, got {alignment!r}")
    infos = []
    seen = set()
    for i in range(n_tensors):
        tname = cur.string(f"tensor[{i}].name")
        where = f"tensor {tname!r}"
        if tname in seen:
            cur.fail(where, "the name appears twice")
        seen.add(tname)
        n_dims = cur.scalar("I", f"{where}.n_dims")
        if n_dims > MAX_DIMS:
            cur.fail(f"{where}.n_dims", f"{n_dims} dims; GGUF tensors have at most {MAX_DIMS}")
        dims = struct.unpack(f"<{n_dims}Q", cur.take(8 * n_dims, f"{where}.dims"))
        ttype = cur.scalar("I", f"{where}.type")
        if ttype not in GGML_TYPES:
            cur.fail(f"{where}.type", f"unknown ggml type {ttype}")
        offset = cur.scalar("Q", f"{where}.offset")
        tname_, block, _ = GGML_TYPES[ttype]
        if dims and dims[0] % block:
            cur.fail(f"{where}.dims", f"a row of {dims[0]} elements is not a whole number of "
                     f"{tname_} blocks ({block} elements each)")
        if offset % alignment:
            cur.fail(f"{where}.offset", f"{offset} is not a multiple of the alignment {alignment}")
        infos.append((tname, ttype, dims, offset))
    data_start = -(-cur.pos // alignment) * alignment
    data_size = len(buf) - data_start
    if infos and data_size < 0:
        cur.fail("data section", f"starts at {data_start} (aligned to {alignment}), past the "
                 f"end of the {len(buf)}-byte file (truncated?)")
    tensors = {}
    ranges = []
    for tname, ttype, dims, offset in infos:
        _, block, bsize = GGML_TYPES[ttype]
        nbytes = prod(dims) // block * bsize          # Python ints: no overflow
        if offset + nbytes > data_size:
            cur.fail(f"tensor {tname!r}.offset", f"bytes [{offset}, {offset + nbytes}) of "
                     f"{GGML_TYPES[ttype][0]}{list(reversed(dims))} go beyond the "
                     f"{max(data_size, 0)}-byte data section (truncated file?)")
        start = data_start + offset
        tensors[tname] = GGUFTensor(tname, ttype, dims, offset, buf[start:start + nbytes])
        if nbytes:
            ranges.append((offset, offset + nbytes, tname))
    ranges.sort()
    for (a0, a1, an), (b0, b1, bn) in zip(ranges, ranges[1:]):
        if b0 < a1:
            cur.fail(f"tensor {bn!r}.offset", f"bytes [{b0}, {b1}) overlap tensor {an!r} "
                     f"[{a0}, {a1})")
    return GGUFFile(name, version, alignment, metadata, tensors, (kv_start, kv_end))


def metadata_only(src) -> bytes:
    """A GGUF file of `src`'s metadata (its bytes as they are) and no tensors: a few MB that a
    tokenizer (models/tokenizer.py's Tokenizer.from_gguf) is read from without the weights."""
    buf, _ = _source(src, "gguf.metadata_only", GGUFError)
    f = load(buf)
    a, b = f.metadata_span
    return MAGIC + struct.pack("<IQQ", f.version, 0, len(f.metadata)) + bytes(buf[a:b])


# ----------------------------------------------------------------------------- dequantizing

def dequantize(type_name: str, raw, n: int, *, what: str = "tensor",
               use_numpy: bool = True) -> array.array:
    """n f32 values (array('f')) from raw data of a ggml type (quants.dequantize, whose
    errors come back as GGUFError)."""
    try:
        return quants.dequantize(type_name, raw, n, what=what, use_numpy=use_numpy)
    except ValueError as e:
        raise GGUFError(str(e)) from None


def check_values(f: GGUFFile, *, allow_nonfinite: bool = False) -> None:
    """Refuse (GGUFError naming the file and tensor) a NaN or inf in any tensor's values, by
    arrays.refuse_nonfinite, the check every path in shares. Float tensors are checked
    value by value; quantized blocks by their decoded values where numpy imports, and by
    their f16 scales without it (the browser: decoding on the host there is what the GPU
    path avoids; with finite scales every value of a block is finite)."""
    if allow_nonfinite:
        return
    np = numpy_or_none()
    for name, t in f.tensors.items():
        what = f"GGUF file {f.name}: tensor {name!r}"
        fmt = quants.FORMATS.get(t.type_name)
        if fmt is not None and np is None:
            b = fmt.first_nonfinite_block(t.data)
            if b is not None:
                raise GGUFError(
                    f"{what}: {t.type_name} block {b} (values {b * fmt.block} to "
                    f"{(b + 1) * fmt.block - 1}) has a NaN or inf scale, so its values are "
                    "not finite; a non-finite weight would spread into every output, so nothing "
                    "was loaded. Re-quantize the model from finite weights, or pass "
                    "allow_nonfinite=True if it is meant")
            continue
        if t.type_name not in quants.FLOATS and np is None:
            continue
        try:
            refuse_nonfinite(t.dequantize(), t.shape, what)
        except FeedError as e:
            raise GGUFError(str(e)) from None
