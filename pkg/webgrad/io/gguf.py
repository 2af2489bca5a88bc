"""GGUF (llama.cpp's weight format), read in pure Python.

A GGUF v3 file (v2 has the same layout) is, little-endian:
    magic "GGUF", version u32, tensor count u64, metadata count u64,
    metadata:     key (string), value type u32, value      string = u64 length + UTF-8 bytes;
                  array = element type u32, count u64, elements
    tensor infos: name (string), n_dims u32, dims u64[n_dims] (ggml order: dims[0] is the
                  row length, the fastest-varying), ggml type u32, offset u64
    padding to `general.alignment` (default 32), then the data section; each tensor's offset
    is relative to it and a multiple of the alignment.

API (consumers: GPT-2 loading, the tests, the browser page):

    from webgrad.io import gguf
    f = gguf.load(src)            # path, bytes-like or binary file -> GGUFFile
    f.version, f.alignment, f.metadata   # metadata: key -> int/float/bool/str/list
    t = f.tensors["blk.0.attn_qkv.weight"]
    t.type_name, t.shape          # "Q4_K"; shape in numpy/torch order (dims reversed)
    t.data                        # zero-copy memoryview of the raw blocks
    t.dequantize()                # HostArray f32 with t.shape (any type of
                                  #  gguf.DEQUANTIZABLE: floats, webgrad.quants.FORMATS)
    gguf.dequantize(type_name, raw, n)  # array('f') of n values from raw blocks
    gguf.gpt2_state_dict(f)       # (hyper-parameters, state dict in transformers' GPT-2
                                  #  names and layouts) from llama.cpp's gpt2 tensors;
                                  #  webgrad.models.gpt2.GPT2.from_gguf is built on it

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
from ..arrays import FeedError, HostArray, numpy_or_none, refuse_nonfinite, transpose2d
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

    def __init__(self, name, version, alignment, metadata, tensors):
        self.name, self.version, self.alignment = name, version, alignment
        self.metadata, self.tensors = metadata, tensors

    def __repr__(self):
        return f"GGUFFile({self.name}, v{self.version}, {len(self.tensors)} tensors)"


# ----------------------------------------------------------------------------- parsing

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
        return [self.value(etype, f"{field}[{i}]", depth + 1) for i in range(n)]




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
    metadata = {}
    for i in range(n_kv):
        key = cur.string(f"metadata[{i}].key")
        if key in metadata:
            cur.fail(f"metadata {key!r}", "the key appears twice")
        vtype = cur.scalar("I", f"metadata {key!r} (value type)")
        metadata[key] = cur.value(vtype, f"metadata {key!r}")
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
    return GGUFFile(name, version, alignment, metadata, tensors)


# ----------------------------------------------------------------------------- dequantizing

def dequantize(type_name: str, raw, n: int, *, what: str = "tensor",
               use_numpy: bool = True) -> array.array:
    """n f32 values (array('f')) from raw data of a ggml type (quants.dequantize, whose
    errors come back as GGUFError)."""
    try:
        return quants.dequantize(type_name, raw, n, what=what, use_numpy=use_numpy)
    except ValueError as e:
        raise GGUFError(str(e)) from None


# ----------------------------------------------------------------------------- GPT-2

# llama.cpp's gpt2 names -> transformers' GPT2LMHeadModel names (without "transformer.");
# the four Conv1D weights are stored [out, in] in GGUF (numpy order), [in, out] in transformers
_GPT2_GLOBAL = {"token_embd.weight": "wte.weight", "position_embd.weight": "wpe.weight",
                "output_norm.weight": "ln_f.weight", "output_norm.bias": "ln_f.bias",
                "output.weight": "lm_head.weight"}
_GPT2_BLOCK = {"attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj",
               "ffn_norm": "ln_2", "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
_GPT2_CONV1D = {"attn_qkv", "attn_output", "ffn_up", "ffn_down"}


def gpt2_tensors(f: GGUFFile) -> dict[str, tuple[GGUFTensor, bool]]:
    """transformers name -> (GGUF tensor, whether it is stored transposed), validated: every
    name in llama.cpp's gpt2 layout, token and position tables present."""
    out = {}
    for name, t in f.tensors.items():
        parts = name.split(".")
        if name in _GPT2_GLOBAL:
            out[_GPT2_GLOBAL[name]] = (t, False)
        elif (len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit()
              and parts[2] in _GPT2_BLOCK and parts[3] in ("weight", "bias")):
            out[f"h.{int(parts[1])}.{_GPT2_BLOCK[parts[2]]}.{parts[3]}"] = (
                t, parts[2] in _GPT2_CONV1D and parts[3] == "weight")
        else:
            raise GGUFError(f"GGUF file {f.name}: tensor {name!r} is not part of llama.cpp's gpt2 "
                            "layout")
    for need in ("wte.weight", "wpe.weight"):
        if need not in out:
            raise GGUFError(f"GGUF file {f.name}: tensor "
                            f"{[k for k, v in _GPT2_GLOBAL.items() if v == need][0]!r} is missing")
    wte = out["wte.weight"][0]
    if len(wte.shape) != 2:
        raise GGUFError(f"GGUF file {f.name}: tensor 'token_embd.weight' has shape "
                        f"{list(wte.shape)}; it should be [vocab, n_embd]")
    head = out.get("lm_head.weight")
    if head is not None and head[0].shape != wte.shape:
        raise GGUFError(f"GGUF file {f.name}: tensor 'output.weight' has shape "
                        f"{list(head[0].shape)}, token_embd.weight {list(wte.shape)}")
    return out


def gpt2_config(f: GGUFFile) -> dict:
    """GPT2Config's fields from the gpt2.* metadata (vocab_size from the token table), each
    checked (type, range) and checked against the tensors in the file before anything is
    built from it: a header cannot ask for more layers, positions or columns than the file
    holds."""
    md = f.metadata
    arch = md.get("general.architecture")
    if arch != "gpt2":
        raise GGUFError(f"GGUF file {f.name}: metadata 'general.architecture': expected 'gpt2', "
                        f"got {arch!r}")

    def fail(k, msg):
        raise GGUFError(f"GGUF file {f.name}: metadata {k!r} {msg}")

    def key(k):
        k = f"gpt2.{k}"
        if k not in md:
            fail(k, "is missing")
        v = md[k]
        if type(v) is not int or v < 1:
            fail(k, f"must be a whole number >= 1 (a GGUF integer type), got {v!r}")
        return v

    cfg = {"n_layer": key("block_count"), "n_head": key("attention.head_count"),
           "n_embd": key("embedding_length"), "n_ctx": key("context_length")}
    tensors = gpt2_tensors(f)
    vocab, n_embd = tensors["wte.weight"][0].shape
    if cfg["n_embd"] != n_embd:
        fail("gpt2.embedding_length", f"is {cfg['n_embd']} but token_embd.weight has {n_embd} "
             "columns")
    if n_embd % cfg["n_head"]:
        fail("gpt2.attention.head_count", f"is {cfg['n_head']}, which does not divide embedding_length "
             f"{n_embd}")
    wpe = tensors["wpe.weight"][0].shape
    if tuple(wpe) != (cfg["n_ctx"], n_embd):
        fail("gpt2.context_length", f"is {cfg['n_ctx']} but position_embd.weight has shape "
             f"{list(wpe)}; they must agree ([context_length, embedding_length])")
    blocks = {int(n.split(".")[1]) for n in tensors if n.startswith("h.")}
    # the count first: set(range(2**63)) would be the very allocation this check prevents
    if len(blocks) != cfg["n_layer"] or blocks != set(range(cfg["n_layer"])):
        fail("gpt2.block_count", f"is {cfg['n_layer']} but the file holds blocks "
             f"{_ranges(sorted(blocks))}; they must be blk.0 .. blk.{cfg['n_layer'] - 1}")
    eps = md.get("gpt2.attention.layer_norm_epsilon", 1e-5)
    if type(eps) not in (int, float) or not 0 < eps < 1:
        fail("gpt2.attention.layer_norm_epsilon", f"must be a number in (0, 1), got {eps!r}")
    eos = md.get("tokenizer.ggml.eos_token_id")
    if eos is not None and (type(eos) is not int or not 0 <= eos < vocab):
        fail("tokenizer.ggml.eos_token_id", f"must be a token id in [0, {vocab}), got {eos!r}")
    cfg.update(vocab_size=vocab, layer_norm_epsilon=float(eps), eos_token_id=eos)
    return cfg


def _ranges(ids: list[int]) -> str:
    if not ids:
        return "none"
    return f"{ids[0]}..{ids[-1]} ({len(ids)} of them)" if len(ids) > 3 else str(ids)


def check_values(f: GGUFFile, *, allow_nonfinite: bool = False) -> None:
    """Refuse (GGUFError naming the file and tensor) a NaN or inf in any tensor's values, by
    arrays.refuse_nonfinite, the check every path in shares. Float tensors are checked
    value by value; quantized blocks by their decoded values where numpy imports (a NaN or
    inf scale), and not at all without numpy (the browser: decoding on the host there is
    what the GPU path avoids)."""
    if allow_nonfinite:
        return
    np = numpy_or_none()
    for name, t in f.tensors.items():
        if t.type_name not in quants.FLOATS and np is None:
            continue
        try:
            refuse_nonfinite(t.dequantize(), t.shape, f"GGUF file {f.name}: tensor {name!r}")
        except FeedError as e:
            raise GGUFError(str(e)) from None


def gpt2_state_dict(f: GGUFFile | object) -> tuple[dict, dict[str, HostArray]]:
    """(hyper-parameters, state dict) of a llama.cpp gpt2 GGUF, in transformers' GPT-2 names
    and layouts, dequantized to f32 on the host. Hyper-parameters: GPT2Config's fields
    (gpt2_config). A missing output.weight means the head is tied to token_embd.weight
    (GPT-2's own tying); a present one comes back as "lm_head.weight", as in transformers'
    state dict (llama.cpp's converter writes the tied table twice, and llama-quantize may then
    give the two copies different types)."""
    if not isinstance(f, GGUFFile):
        f = load(f)
    cfg = gpt2_config(f)
    sd = {}
    for hf, (t, transposed) in gpt2_tensors(f).items():
        h = t.dequantize()
        sd[hf] = transpose2d(h) if transposed else h
    return cfg, sd


async def gpt2_write_async(model, f: GGUFFile, *, progress=None) -> None:
    """Write a gpt2 GGUF's weights into a webgrad.models.gpt2.GPT2 built from gpt2_config(f):
    weights the model holds quantized (GPT2.quant_full) get their blocks (write_blocks);
    others on WebGPU are uploaded as they are and dequantized by a kernel
    (io/gpu_dequant.py); a token table the device splits into chunks, and other backends,
    take the host path. The tied head (output.weight) is not a GPT2 parameter.
    progress(done, total), if given, hears the tensor bytes written so far."""
    from . import gpu_dequant
    tensors = gpt2_tensors(f)
    missing = sorted(set(model.shapes) - set(tensors) - {n for n in model.shapes if n.startswith("wte.")})
    if missing:
        raise GGUFError(f"GGUF file {f.name}: missing {', '.join(missing[:5])} for {model.cfg}")
    done, total = 0, sum(t.data.nbytes for hf, (t, _) in tensors.items() if hf != "lm_head.weight")
    for hf, (t, transposed) in tensors.items():
        if hf == "lm_head.weight":
            continue
        if hf in getattr(model, "quant_full", {}):   # kept quantized: the blocks themselves
            model.write_blocks(hf, t.data)
        elif hf == "wte.weight" and "wte.weight" not in model.shapes:     # split table
            model._write({hf: t.dequantize()})
        else:
            await gpu_dequant.write_async(model.backend, hf, t, transpose=transposed)
        done += t.data.nbytes
        if progress is not None:
            progress(done, total)
