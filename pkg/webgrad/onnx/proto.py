"""The protobuf wire format of the ONNX messages webgrad writes, in pure Python.

An ONNX file is one `ModelProto` (onnx/onnx.proto) in protobuf's binary encoding: each
field is a key (field number << 3 | wire type) followed by a varint (integers) or a length
and bytes (strings, raw tensor data, nested messages). webgrad writes only the fields below,
and writes every repeated integer unpacked (one key per element), which every protobuf
parser accepts; so no onnx or protobuf package is needed to export (in Pyodide there is
none). The field numbers are onnx.proto's.
"""
from __future__ import annotations

import struct

# TensorProto.DataType
FLOAT, INT32, INT64, BOOL, UINT32, UINT64 = 1, 6, 7, 9, 12, 13
ELEM = {"f32": FLOAT, "i32": INT32}

_M64 = (1 << 64) - 1


def varint(v: int) -> bytes:
    v &= _M64  # negative int64s are written as their 64-bit two's complement (10 bytes)
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def f_int(field: int, v: int) -> bytes:
    return varint(field << 3) + varint(int(v))


def f_bytes(field: int, b) -> bytes:
    b = b.encode() if isinstance(b, str) else bytes(b)
    return varint(field << 3 | 2) + varint(len(b)) + b


def f_float(field: int, v: float) -> bytes:
    return varint(field << 3 | 5) + struct.pack("<f", v)


def tensor(name: str, dims, elem: int, raw: bytes) -> bytes:
    """TensorProto: dims=1, data_type=2, name=8, raw_data=9 (little-endian values)."""
    return (b"".join(f_int(1, d) for d in dims) + f_int(2, elem) + f_bytes(8, name)
            + f_bytes(9, raw))


def external_tensor(name: str, dims, elem: int, location: str, nbytes: int) -> bytes:
    """TensorProto whose values lie outside the model: external_data=13 (StringStringEntryProto
    {key=1, value=2}: location, offset, length), data_location=14 (EXTERNAL = 1). The runtime
    is handed the bytes of each location with the model (in memory, no file)."""
    entries = (("location", location), ("offset", "0"), ("length", str(nbytes)))
    return (b"".join(f_int(1, d) for d in dims) + f_int(2, elem) + f_bytes(8, name)
            + b"".join(f_bytes(13, f_bytes(1, k) + f_bytes(2, v)) for k, v in entries)
            + f_int(14, 1))


def value_info(name: str, elem: int, dims) -> bytes:
    """ValueInfoProto{name=1, type=2: TypeProto{tensor_type=1: {elem_type=1, shape=2:
    TensorShapeProto{dim=1: Dimension{dim_value=1 or dim_param=2}}}}}: a str in dims is a
    symbolic dimension (its length known at run time only)."""
    shape = b"".join(f_bytes(1, f_bytes(2, d) if isinstance(d, str) else f_int(1, d)) for d in dims)
    return f_bytes(1, name) + f_bytes(2, f_bytes(1, f_int(1, elem) + f_bytes(2, shape)))


def attribute(name: str, v) -> bytes:
    """AttributeProto: name=1, f=2, i=3, s=4, t=5, floats=7, ints=8, type=20."""
    if isinstance(v, int):  # bools too
        return f_bytes(1, name) + f_int(3, int(v)) + f_int(20, 2)
    if isinstance(v, float):
        return f_bytes(1, name) + f_float(2, v) + f_int(20, 1)
    if isinstance(v, str):
        return f_bytes(1, name) + f_bytes(4, v) + f_int(20, 3)
    if isinstance(v, Tensor):
        return f_bytes(1, name) + f_bytes(5, v.encode()) + f_int(20, 4)
    if isinstance(v, (list, tuple)) and all(isinstance(x, int) for x in v):
        return f_bytes(1, name) + b"".join(f_int(8, x) for x in v) + f_int(20, 7)
    raise TypeError(f"ONNX attribute {name}: cannot encode {v!r}")


class Tensor:
    """A tensor value for an attribute (ConstantOfShape's value)."""

    def __init__(self, dims, elem: int, raw: bytes):
        self.dims, self.elem, self.raw = tuple(dims), elem, raw

    def encode(self) -> bytes:
        return tensor("", self.dims, self.elem, self.raw)


def node(op: str, inputs, outputs, name: str = "", domain: str = "", **attrs) -> bytes:
    """NodeProto: input=1, output=2, name=3, op_type=4, attribute=5, domain=7 (empty: the
    default ai.onnx)."""
    return (b"".join(f_bytes(1, i) for i in inputs) + b"".join(f_bytes(2, o) for o in outputs)
            + (f_bytes(3, name) if name else b"") + f_bytes(4, op)
            + b"".join(f_bytes(5, attribute(k, v)) for k, v in attrs.items())
            + (f_bytes(7, domain) if domain else b""))


def graph(name: str, nodes, initializers, inputs, outputs, doc: str = "") -> bytes:
    """GraphProto: node=1, name=2, initializer=5, doc_string=10, input=11, output=12."""
    return (b"".join(f_bytes(1, n) for n in nodes) + f_bytes(2, name)
            + b"".join(f_bytes(5, t) for t in initializers)
            + (f_bytes(10, doc) if doc else b"")
            + b"".join(f_bytes(11, v) for v in inputs) + b"".join(f_bytes(12, v) for v in outputs))


def model(graph_bytes: bytes, *, ir_version: int, opset: int, producer: str,
          doc: str = "", domains: dict | None = None) -> bytes:
    """ModelProto: ir_version=1, producer_name=2, doc_string=6, graph=7,
    opset_import=8 (OperatorSetIdProto: domain=1 (empty: the default ai.onnx), version=2),
    one more for each of `domains` (name -> version: onnxruntime's com.microsoft)."""
    return (f_int(1, ir_version) + f_bytes(2, producer)
            + (f_bytes(6, doc) if doc else b"") + f_bytes(7, graph_bytes)
            + f_bytes(8, f_bytes(1, "") + f_int(2, opset))
            + b"".join(f_bytes(8, f_bytes(1, d) + f_int(2, v)) for d, v in (domains or {}).items()))
