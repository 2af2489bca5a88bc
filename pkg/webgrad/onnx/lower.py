"""The lowering of each IR primitive to ONNX operators (opset OPSET), and the graph walk.

One function per primitive in LOWERINGS, `fn(b, node, ins) -> value name`: `b` is the
Builder (it names values and emits nodes and initializers), `ins` the ONNX names of the
node's operands. The rules follow the primitives' reference rules, edges included: gathers
read zeros outside the table, scatters drop rows outside it, comparisons return f32 masks,
`where` takes any nonzero as true, `sign(NaN)` is 0. The counter-based random numbers are
the same integer hash (primitives.lowbias32) written with ONNX's uint64 bit operators, so
they give the same values as every other executor. The sliding windows (unfold2d, fold2d)
are a Gather and a ScatterND over index tables computed here, at export.

tests/test_onnx.py runs the op oracle's records through onnxruntime; tests/test_registry.py
fails when a primitive has no lowering here.
"""
from __future__ import annotations

import array
import struct
from dataclasses import dataclass, field
from math import prod

from .. import primitives as P
from ..ir import Graph
from . import proto

OPSET = 18        # BitwiseXor/BitwiseAnd (the random numbers' hash) need 18
IR_VERSION = 8    # the IR version of opset 18's release (onnx 1.13)
_PERSISTENT = ("param", "state")


class Builder:
    def __init__(self):
        self.nodes: list[tuple] = []       # (op, inputs, output, attrs), encoded by encode()
        self.made: set[str] = set()         # the values nodes produce
        self.inits: list[bytes] = []
        self.ops: set[str] = set()
        self._n = 0
        self._consts: dict = {}

    def fresh(self, hint="t") -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def emit(self, op: str, *inputs: str, out: str | None = None, **attrs) -> str:
        out = out or self.fresh(op.lower())
        self.ops.add(op)
        self.nodes.append((op, inputs, out, attrs))
        self.made.add(out)
        return out

    def encode(self, rename: dict[str, str]) -> list[bytes]:
        """The nodes as NodeProtos, each value named by `rename` where it has an entry."""
        r = lambda v: rename.get(v, v)  # noqa: E731
        return [proto.node(op, [r(i) for i in ins], [r(out)], **attrs)
                for op, ins, out, attrs in self.nodes]

    def init(self, name: str, dims, elem: int, raw: bytes) -> str:
        self.inits.append(proto.tensor(name, dims, elem, raw))
        return name

    def const(self, values, dtype: str, dims=None) -> str:
        """An initializer of int64s ('i64'), f32s, i32s or uint64s, shared by equal values."""
        values = tuple(values)
        dims = (len(values),) if dims is None else tuple(dims)
        key = (values, dtype, dims)
        if key not in self._consts:
            code, elem = {"i64": ("q", proto.INT64), "u64": ("Q", proto.UINT64),
                          "f32": ("f", proto.FLOAT), "i32": ("i", proto.INT32)}[dtype]
            raw = array.array(code, values)
            if struct.pack("=i", 1) != struct.pack("<i", 1):
                raw.byteswap()  # ONNX's raw data is little-endian
            self._consts[key] = self.init(self.fresh("c"), dims, elem, raw.tobytes())
        return self._consts[key]

    def scalar(self, v, dtype: str) -> str:
        return self.const([v], dtype, dims=())


# ---------------------------------------------------------------- the rules

def _unary(op):
    return lambda b, n, ins, a=None: b.emit(op, *ins)


def _rsqrt(b, n, ins):
    return b.emit("Reciprocal", b.emit("Sqrt", ins[0]))


def _sign(b, n, ins):
    x = ins[0]
    return b.emit("Where", b.emit("IsNaN", x), b.scalar(0.0, "f32"), b.emit("Sign", x))


def _trunc(b, n, ins):
    x = ins[0]
    return b.emit("Where", b.emit("Less", x, b.scalar(0.0, "f32")), b.emit("Ceil", x),
                  b.emit("Floor", x))


def _pow(b, n, ins):
    return b.emit("Pow", ins[0], b.scalar(float(n.attrs["p"]), "f32"))


def _compare(op):
    return lambda b, n, ins: b.emit("Cast", b.emit(op, *ins), to=proto.FLOAT)


def _where(b, n, ins):
    c, x, y = ins
    return b.emit("Where", b.emit("Not", b.emit("Equal", c, b.scalar(0.0, "f32"))), x, y)


def _cast(b, n, ins, g):
    if g[n.inputs[0]].dtype == n.dtype:
        return b.emit("Identity", ins[0])
    return b.emit("Cast", ins[0], to=proto.ELEM[n.dtype])


def _const(b, n, ins):
    v = n.attrs["value"]
    values = list(v) if isinstance(v, (list, tuple)) else [v] * prod(n.shape)
    if n.dtype == "i32":
        values = [int(x) for x in values]
    return b.const(values, n.dtype, dims=n.shape)


def _range(b, n: int, dtype: str) -> str:
    return b.emit("Range", b.scalar(0, dtype), b.scalar(n, dtype), b.scalar(1, dtype))


def _arange(b, n, ins):
    return _range(b, n.attrs["n"], n.dtype)


def _sum(b, n, ins):
    if not n.attrs["axes"]:
        return b.emit("Identity", ins[0])
    return b.emit("ReduceSum", ins[0], b.const(n.attrs["axes"], "i64"), keepdims=0)


def _any_nan(b, x, keepdims=0):
    nan = b.emit("Cast", b.emit("IsNaN", x), to=proto.FLOAT)
    return nan, b.emit("Cast", b.emit("ReduceMax", nan, b.const([-1], "i64"), keepdims=keepdims),
                       to=proto.BOOL)


def _max_last(b, n, ins):
    # a NaN in the row makes the maximum NaN (numpy, torch); ReduceMax skips NaNs
    x = ins[0]
    _, nan = _any_nan(b, x)
    top = b.emit("ReduceMax", x, b.const([-1], "i64"), keepdims=0)
    return b.emit("Where", nan, b.scalar(float("nan"), "f32"), top)


def _argmax(b, n, ins):
    # the first NaN of a row wins (numpy, torch); ArgMax skips NaNs, but finds the first 1
    # of the row's NaN mask
    x = ins[0]
    mask, nan = _any_nan(b, x)
    top = b.emit("ArgMax", x, axis=-1, keepdims=0)
    first_nan = b.emit("ArgMax", mask, axis=-1, keepdims=0)
    return b.emit("Cast", b.emit("Where", nan, first_nan, top), to=proto.INT32)


def _softmax(op):
    return lambda b, n, ins: b.emit(op, ins[0], axis=-1)


def _layer_norm(b, n, ins):
    # (x - mean) / sqrt(var + eps), the reference's formula (LayerNormalization would need a
    # scale and bias input, and computes the same)
    x, last = ins[0], b.const([-1], "i64")
    xc = b.emit("Sub", x, b.emit("ReduceMean", x, last, keepdims=1))
    var = b.emit("ReduceMean", b.emit("Mul", xc, xc), last, keepdims=1)
    return b.emit("Div", xc, b.emit("Sqrt", b.emit("Add", var, b.scalar(float(n.attrs["eps"]), "f32"))))


def _reshape(b, n, ins):
    return _reshape_to(b, ins[0], n.shape)


def _reshape_to(b, x, shape):
    kw = {"allowzero": 1} if 0 in shape else {}  # else ONNX reads a 0 as "keep that dim"
    return b.emit("Reshape", x, b.const(shape, "i64"), **kw)


def _transpose(b, n, ins):
    return b.emit("Transpose", ins[0], perm=list(n.attrs["perm"]))


def _broadcast_to(b, n, ins, g):
    if prod(n.shape) == 0:  # Expand broadcasts both ways: a 1 against a 0 would stay 1
        return _zeros(b, n.shape, n.dtype)
    return b.emit("Expand", ins[0], b.const(n.shape, "i64"))


def _zeros(b, shape, dtype):
    return b.emit("ConstantOfShape", b.const(tuple(shape), "i64"),
                  value=proto.Tensor((1,), proto.ELEM[dtype],
                                     struct.pack("<f" if dtype == "f32" else "<i", 0)))


def _concat(b, n, ins):
    return b.emit("Concat", *ins, axis=n.attrs["axis"])


def _slice_axis(b, x, axis, start, stop):
    return b.emit("Slice", x, b.const([start], "i64"), b.const([stop], "i64"), b.const([axis], "i64"))


def _slice(b, n, ins):
    return _slice_axis(b, ins[0], n.attrs["axis"], n.attrs["start"], n.attrs["stop"])


def _pad(b, n, ins):
    r = len(n.shape)
    pads = [0] * (2 * r)
    pads[n.attrs["axis"]], pads[r + n.attrs["axis"]] = n.attrs["before"], n.attrs["after"]
    return b.emit("Pad", ins[0], b.const(pads, "i64"))


def _zero(b, dtype):
    return b.scalar(0.0 if dtype == "f32" else 0, dtype)


def _in_range(b, i, n: int):
    """Bool mask 0 <= i < n of an i32 tensor."""
    return b.emit("And", b.emit("GreaterOrEqual", i, b.scalar(0, "i32")),
                  b.emit("Less", i, b.scalar(n, "i32")))


def _gather_rows(b, n, ins, g):
    w, i = ins
    table, idx = g[n.inputs[0]], g[n.inputs[1]]
    ok = _in_range(b, i, table.shape[0])
    rows = b.emit("Gather", w, b.emit("Where", ok, i, b.scalar(0, "i32")), axis=0)
    ok = _reshape_to(b, ok, idx.shape + (1,) * (len(table.shape) - 1))
    return b.emit("Where", ok, rows, _zero(b, n.dtype))


def _scatter_rows(b, values, index, n_rows: int, rest, dtype):
    """A [n_rows, *rest] table of zeros with values[k] added to row index[k] (int64 [K, 1]
    indices; a row n_rows catches what falls outside and is cut off)."""
    zeros = _zeros(b, (n_rows + 1,) + tuple(rest), dtype)
    out = b.emit("ScatterND", zeros, index, values, reduction="add")
    return _slice_axis(b, out, 0, 0, n_rows)


def _scatter_add_rows(b, n, ins, g):
    v, i = ins
    rows = n.attrs["n"]
    ok = _in_range(b, i, rows)
    idx = b.emit("Cast", b.emit("Where", ok, i, b.scalar(rows, "i32")), to=proto.INT64)
    idx = b.emit("Unsqueeze", idx, b.const([-1], "i64"))
    return _scatter_rows(b, v, idx, rows, n.shape[1:], n.dtype)


def _write_rows(b, n, ins, g):
    base, vals, start = ins
    rows, t = n.shape[0], g[n.inputs[1]].shape[0]
    if t == 0:
        return b.emit("Identity", base)
    rel = b.emit("Sub", _range(b, rows, "i32"), _reshape_to(b, start, (1,)))
    inside = _in_range(b, rel, t)
    idx = b.emit("Max", b.emit("Min", rel, b.scalar(t - 1, "i32")), b.scalar(0, "i32"))
    got = b.emit("Gather", vals, idx, axis=0)
    inside = _reshape_to(b, inside, (rows,) + (1,) * (len(n.shape) - 1))
    return b.emit("Where", inside, got, base)


def _matmul(b, n, ins):
    return b.emit("MatMul", *ins)


# the random numbers: primitives.lowbias32 on uint64 lanes, masked to 32 bits after each
# product (a 32-bit value times a 32-bit constant fits in 64 bits)
_M32 = 0xFFFFFFFF


def _hash(b, x):
    u = lambda v: b.scalar(v, "u64")  # noqa: E731
    x = b.emit("BitwiseAnd", x, u(_M32))
    x = b.emit("BitwiseXor", x, b.emit("BitShift", x, u(16), direction="RIGHT"))
    x = b.emit("BitwiseAnd", b.emit("Mul", x, u(0x7FEB352D)), u(_M32))
    x = b.emit("BitwiseXor", x, b.emit("BitShift", x, u(15), direction="RIGHT"))
    x = b.emit("BitwiseAnd", b.emit("Mul", x, u(0x846CA68B)), u(_M32))
    return b.emit("BitwiseXor", x, b.emit("BitShift", x, u(16), direction="RIGHT"))


def _rand_uniform(b, n, ins):
    # u = (h >> 8) / 2^24, h = H(i + H(seed + H(counter))): primitives.rand_bits
    count = b.emit("Cast", _reshape_to(b, ins[0], (1,)), to=proto.UINT64)  # UINT64
    key = _hash(b, b.emit("Add", _hash(b, count), b.scalar(n.attrs["seed"], "u64")))
    lanes = b.emit("Cast", _range(b, prod(n.shape), "i64"), to=proto.UINT64)
    h = _hash(b, b.emit("Add", lanes, key))
    top = b.emit("Cast", b.emit("BitShift", h, b.scalar(8, "u64"), direction="RIGHT"), to=proto.FLOAT)
    return _reshape_to(b, b.emit("Mul", top, b.scalar(2.0 ** -24, "f32")), n.shape)


def _window_index(w: P.Window, H: int, W: int) -> list[int]:
    """For each window entry (i*kw + j, oy*ow + ox), flattened: the pixel y*W + x it reads,
    or H*W (a pad cell) where it lies outside the image."""
    out = []
    for i in range(w.kh):
        for j in range(w.kw):
            for oy in range(w.oh):
                y = oy * w.sh + i * w.dh - w.ph
                for ox in range(w.ow):
                    x = ox * w.sw + j * w.dw - w.pw
                    out.append(y * W + x if 0 <= y < H and 0 <= x < W else H * W)
    return out


def _unfold2d(b, n, ins, g):
    N, C, H, W = g[n.inputs[0]].shape
    w = P.window(n.attrs, H, W)
    flat = _reshape_to(b, ins[0], (N, C, H * W))
    pad = b.emit("Expand", b.scalar(float(n.attrs["pad_value"]), "f32") if n.dtype == "f32"
                 else b.scalar(int(n.attrs["pad_value"]), "i32"), b.const((N, C, 1), "i64"))
    src = b.emit("Concat", flat, pad, axis=2)
    out = b.emit("Gather", src, b.const(_window_index(w, H, W), "i64"), axis=2)
    return _reshape_to(b, out, n.shape)


def _fold2d(b, n, ins, g):
    N, C, H, W = n.shape
    w = P.window(n.attrs, H, W)
    k = w.kh * w.kw * w.oh * w.ow
    vals = b.emit("Transpose", _reshape_to(b, ins[0], (N, C, k)), perm=[2, 0, 1])
    idx = b.const(_window_index(w, H, W), "i64", dims=(k, 1))
    img = _scatter_rows(b, vals, idx, H * W, (N, C), n.dtype)
    return _reshape_to(b, b.emit("Transpose", img, perm=[1, 2, 0]), n.shape)


def _dequantize(b, n, ins, g):
    raise NotImplementedError(
        "ONNX export: dequantize is lowered only where it reads a parameter directly (the "
        "blocks are decoded on the host, at export or by the ONNX backend before a run); "
        f"node %{n.id} reads %{n.inputs[0]} ({g[n.inputs[0]].op})")


def _with_graph(fn):
    fn.needs_graph = True
    return fn


LOWERINGS = {
    "neg": _unary("Neg"), "exp": _unary("Exp"), "log": _unary("Log"), "sqrt": _unary("Sqrt"),
    "rsqrt": _rsqrt, "tanh": _unary("Tanh"), "sigmoid": _unary("Sigmoid"), "relu": _unary("Relu"),
    "erf": _unary("Erf"), "abs": _unary("Abs"), "sign": _sign, "sin": _unary("Sin"),
    "cos": _unary("Cos"), "pow": _pow, "floor": _unary("Floor"), "trunc": _trunc,
    "round": _unary("Round"), "stop_gradient": _unary("Identity"),
    "add": _unary("Add"), "sub": _unary("Sub"), "mul": _unary("Mul"), "div": _unary("Div"),
    "maximum": _unary("Max"), "minimum": _unary("Min"), "power": _unary("Pow"),
    "less": _compare("Less"), "greater": _compare("Greater"), "equal": _compare("Equal"),
    "where": _where, "cast": _with_graph(_cast),
    "const": _const, "arange": _arange,
    "sum": _sum, "max_last": _max_last, "argmax_last": _argmax,
    "softmax_last": _softmax("Softmax"), "log_softmax_last": _softmax("LogSoftmax"),
    "layer_norm_last": _layer_norm,
    "reshape": _reshape, "transpose": _transpose, "broadcast_to": _with_graph(_broadcast_to),
    "concat": _concat, "slice": _slice, "pad": _pad,
    "matmul": _matmul, "dequantize": _with_graph(_dequantize),
    "one_hot": lambda b, n, ins: b.emit("Cast", b.emit(
        "Equal", b.emit("Unsqueeze", ins[0], b.const([-1], "i64")), _range(b, n.attrs["n"], "i32")),
        to=proto.FLOAT),
    "gather_rows": _with_graph(_gather_rows), "scatter_add_rows": _with_graph(_scatter_add_rows),
    "write_rows": _with_graph(_write_rows),
    "rand_uniform": _rand_uniform,
    "unfold2d": _with_graph(_unfold2d), "fold2d": _with_graph(_fold2d),
}
LEAVES = ("input", "param", "state")  # the model's inputs (or initializers), not lowered


# ---------------------------------------------------------------- the walk

@dataclass
class Exported:
    """An exported model and how its inputs and outputs map to the program's.

    feeds:       ONNX input name -> the program's feed of that name (the same name)
    persistent:  ONNX input name -> the persistent buffer (parameter or state) it is
    dequantized: ONNX input name -> (kind, name, qtype, shape): quantized blocks (a feed or a
                 persistent buffer: kind "input", "param" or "state") that the runtime
                 decodes on the host and feeds as f32 (the dequantize node it was)
    resident:    external data location -> (kind, name, qtype, shape): the persistent buffers
                 exported as initializers whose bytes the runtime hands over with the model
                 (export_graph's `resident`); qtype None: the buffer's own values, else its
                 f32 decoding, as in `dequantized`
    outputs:     ONNX output name -> the graph's output key ("loss", "output", "capture:x")
    writebacks:  ONNX output name ("<buffer>:new") -> the persistent buffer it replaces
    ops:         the ONNX operators the model uses
    n_nodes:     how many nodes its graph has
    """
    model: bytes
    feeds: dict[str, str] = field(default_factory=dict)
    persistent: dict[str, str] = field(default_factory=dict)
    dequantized: dict[str, tuple] = field(default_factory=dict)
    resident: dict[str, tuple] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    writebacks: dict[str, str] = field(default_factory=dict)
    ops: tuple[str, ...] = ()
    n_nodes: int = 0

    def save(self, path) -> None:
        with open(path, "wb") as f:
            f.write(self.model)


def _raw(h, dtype: str) -> bytes:
    a = array.array("f" if dtype == "f32" else "i", h)
    if struct.pack("=i", 1) != struct.pack("<i", 1):
        a.byteswap()
    return a.tobytes()


def export_graph(graph: Graph, *, name: str = "webgrad", values=None, decode=None,
                 outputs=None, writebacks: bool = True, resident=(), doc: str = "") -> Exported:
    """Lower `graph` to an ONNX model.

    values:     buffer name -> HostArray (or flat sequence) to embed as an initializer
                instead of a model input (a forward program's parameters, for deployment)
    decode:     fn(buffer, qtype, shape) -> f32 values of a quantized parameter, to embed
                its dequantize node's result (with values); without it such a node becomes
                an f32 model input (`<buffer>:f32`) that the runtime feeds
    outputs:    the graph outputs to export (default: all)
    writebacks: export the new value of each written persistent buffer (`<buffer>:new`)
    resident:   persistent buffers to export as initializers with external data (locations
                "w0", "w1", ...: Exported.resident), not as model inputs: a runtime hands
                their bytes over once, when it makes the session, instead of on every run,
                and may fold and pre-pack them (backends/onnx_runtime.py: parameters that a
                program only reads). A quantized one becomes its decoding (`<buffer>:f32`)
    """
    values = values or {}
    resident = set(resident)
    b = Builder()
    ex = Exported(b"")
    inputs: list[bytes] = []
    names: dict[int, str] = {}
    taken: set[str] = set()

    def claim(s: str) -> str:
        if s in taken:
            raise ValueError(f"ONNX export: the name {s!r} is both a feed and a persistent "
                             "buffer (or an output); rename the feed")
        taken.add(s)
        return s

    def external(name: str, n, elem: int, key: tuple) -> str:
        loc = f"w{len(ex.resident)}"
        ex.resident[loc] = key
        b.inits.append(proto.external_tensor(name, n.shape, elem, loc, 4 * prod(n.shape)))
        return name

    quant_reads = {n.inputs[0]: n for n in graph.nodes
                   if n.op == "dequantize" and graph[n.inputs[0]].op in LEAVES}
    for n in graph.nodes:
        if n.op in LEAVES:
            buf = n.attrs["name"]
            if n.id in quant_reads and all(m.op == "dequantize" for m in graph.nodes
                                           if n.id in m.inputs):
                continue  # read only through its dequantize node: that node is the input
            if buf in values:
                names[n.id] = b.init(claim(buf), n.shape, proto.ELEM[n.dtype], _raw(values[buf], n.dtype))
                continue
            if buf in resident and n.op != "input":
                names[n.id] = external(claim(buf), n, proto.ELEM[n.dtype], (n.op, buf, None, n.shape))
                continue
            names[n.id] = claim(buf)
            inputs.append(proto.value_info(buf, proto.ELEM[n.dtype], n.shape))
            (ex.feeds if n.op == "input" else ex.persistent)[buf] = buf
            continue
        if n.op == "dequantize" and n.inputs[0] in quant_reads:
            leaf = graph[n.inputs[0]]
            buf = leaf.attrs["name"]
            key = (leaf.op, buf, n.attrs["qtype"], tuple(n.attrs["shape"]))
            if buf in values and decode is not None:
                names[n.id] = b.init(claim(f"{buf}:f32"), n.shape, proto.FLOAT,
                                     _raw(decode(*key[1:]), "f32"))
            elif buf in resident and leaf.op != "input":
                names[n.id] = external(claim(f"{buf}:f32"), n, proto.FLOAT, key)
            else:
                names[n.id] = claim(f"{buf}:f32")
                inputs.append(proto.value_info(names[n.id], proto.FLOAT, n.shape))
                ex.dequantized[names[n.id]] = key
            continue
        rule = LOWERINGS.get(n.op)
        if rule is None:
            raise NotImplementedError(f"ONNX export: no lowering of {n.op!r} (node %{n.id}); "
                                      "add one to webgrad/onnx/lower.py's LOWERINGS")
        ins = [names[i] for i in n.inputs]
        names[n.id] = rule(b, n, ins, graph) if getattr(rule, "needs_graph", False) else rule(b, n, ins)

    # each output names the value of the node that computes it (no Identity), unless that
    # value is a model input, an initializer or already another output's
    outs: list[bytes] = []
    rename: dict[str, str] = {}

    def output(src: str, key: str, node) -> None:
        if src in b.made and src not in rename:
            rename[src] = key
        else:
            b.emit("Identity", src, out=key)
        outs.append(proto.value_info(key, proto.ELEM[node.dtype], node.shape))

    want = graph.outputs if outputs is None else {k: graph.outputs[k] for k in outputs}
    for key, i in want.items():
        output(names[i], claim(key), graph[i])
        ex.outputs[key] = key
    if writebacks:
        for buf, i in graph.writebacks.items():
            o = claim(f"{buf}:new")
            output(names[i], o, graph[i])
            ex.writebacks[o] = buf
    ex.model = proto.model(proto.graph(name, b.encode(rename), b.inits, inputs, outs),
                           ir_version=IR_VERSION, opset=OPSET, producer="webgrad", doc=doc)
    ex.ops, ex.n_nodes = tuple(sorted(b.ops)), len(b.nodes)
    return ex

