"""The lowering of each IR primitive to ONNX operators (opset OPSET), and the graph walk.

One function per primitive in LOWERINGS, `fn(b, node, ins) -> value name`: `b` is the
Builder (it names values and emits nodes and initializers), `ins` the ONNX names of the
node's operands. The rules follow the primitives' reference rules, edges included: gathers
read zeros outside the table, scatters drop rows outside it, comparisons return f32 masks,
`where` takes any nonzero as true, `sign(NaN)` is 0. The counter-based random numbers are
the same integer hash (primitives.lowbias32) written with ONNX's uint64 bit operators, so
they give the same values as every other executor. The sliding windows (unfold2d, fold2d)
are a Gather and a ScatterND over index tables computed here, at export.

Three patterns are lowered as a whole (docs/onnx.md): products sharing their operand
(_shared_products), RMS norms (_rms_norms) and a decode step's attention on its KV cache
(attention.py: onnxruntime's GroupQueryAttention); nodes only they read are not lowered.

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
from . import attention, proto

OPSET = 18        # BitwiseXor/BitwiseAnd (the random numbers' hash) need 18
IR_VERSION = 8    # the IR version of opset 18's release (onnx 1.13)
_PERSISTENT = ("param", "state")


class Builder:
    def __init__(self):
        self.nodes: list[tuple] = []       # (op, inputs, outputs, attrs), encoded by encode()
        self.made: set[str] = set()         # the values nodes produce
        self.inits: list[bytes] = []
        self.ops: set[str] = set()
        self.domains: set[str] = set()      # other than ai.onnx (onnxruntime's com.microsoft)
        self._n = 0
        self._consts: dict = {}

    def fresh(self, hint="t") -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def emit(self, op: str, *inputs: str, out: str | None = None, **attrs) -> str:
        return self.emit_n(op, *inputs, outs=[out or self.fresh(op.lower())], **attrs)[0]

    def emit_n(self, op: str, *inputs: str, outs: list[str], domain: str = "", **attrs) -> list[str]:
        """A node of several outputs (Split), named `outs`; `domain` for an operator outside
        ai.onnx (attention.py's com.microsoft one)."""
        if domain:
            self.domains.add(domain)
            attrs["domain"] = domain
        self.ops.add(op)
        self.nodes.append((op, inputs, tuple(outs), attrs))
        self.made.update(outs)
        return list(outs)

    def encode(self, rename: dict[str, str]) -> list[bytes]:
        """The nodes as NodeProtos, each value named by `rename` where it has an entry."""
        r = lambda v: rename.get(v, v)  # noqa: E731
        return [proto.node(op, [r(i) for i in ins], [r(o) for o in outs], **attrs)
                for op, ins, outs, attrs in self.nodes]

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
    inside = _reshape_to(b, _in_range(b, rel, t), (rows,) + (1,) * (len(n.shape) - 1))
    if t == 1:   # a decode step's row: broadcast by the Where (no [rows, ...] gathered first)
        return b.emit("Where", inside, vals, base)
    idx = b.emit("Max", b.emit("Min", rel, b.scalar(t - 1, "i32")), b.scalar(0, "i32"))
    return b.emit("Where", inside, b.emit("Gather", vals, idx, axis=0), base)


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


def _shared_products(graph: Graph, resident_leaf) -> dict[int, list[int]]:
    """The products x @ W_1, x @ W_2, ... of one x by constant matrices (a layer's q, k and v
    projections; gate and up): each member -> its group, in the graph's order. W_i: a
    resident leaf (`resident_leaf(node)`), its dequantization or a transpose of either, which
    onnxruntime folds into one initializer when the session is made. _lower_products makes
    a group one MatMul and a Split: a decode step's products of one row are each a pass over
    the weights with a fixed cost (onnxruntime-web's kernel dispatch, MLAS's packing of the
    row), so fewer, wider products stream the same bytes faster."""
    def constant(i: int) -> bool:
        n = graph[i]
        if n.op in LEAVES:
            return resident_leaf(n)
        return n.op in ("transpose", "dequantize") and all(constant(j) for j in n.inputs)
    by_row: dict[int, list[int]] = {}
    for n in graph.nodes:
        if (n.op == "matmul" and n.dtype == "f32" and len(graph[n.inputs[1]].shape) == 2
                and constant(n.inputs[1])):
            by_row.setdefault(n.inputs[0], []).append(n.id)
    return {m: group for group in by_row.values() if len(group) > 1 for m in group}


def _rms_norms(graph: Graph) -> tuple[dict[int, tuple], set[int]]:
    """The RMS norms x * rsqrt(mean_last(x * x, keepdims) + eps) [* w] (ops.mean_last: a sum
    times 1/n) whose inner values nothing else reads: {the norm's node: (x, w or None, eps)},
    and the inner nodes, which are not lowered. _lower_rms writes each in the form that
    onnxruntime makes one SimplifiedLayerNormalization (9 nodes otherwise; two norms a layer,
    and each node of a decode step is a fixed cost in onnxruntime-web)."""
    users = graph.consumers()
    roots = set(graph.roots())
    sole = lambda i, user: users.get(i, []) == [user] and i not in roots  # noqa: E731

    def scalar(i: int):
        n = graph[i]
        v = n.attrs.get("value")
        return float(v) if n.op == "const" and isinstance(v, (int, float)) else None

    def other(n, i):  # the operand of binary node n that is not i (None if neither is)
        a, c = n.inputs
        return c if a == i else a if c == i else None

    norms, inner = {}, set()
    for r in graph.nodes:
        if r.op != "rsqrt" or r.dtype != "f32":
            continue
        add = graph[r.inputs[0]]
        if add.op != "add" or not sole(add.id, r.id):
            continue
        mean, e = add.inputs if scalar(add.inputs[1]) is not None else add.inputs[::-1]
        mean, eps = graph[mean], scalar(e)
        if eps is None or mean.op != "mul" or not sole(mean.id, add.id):
            continue
        ks, kc = mean.inputs if scalar(mean.inputs[1]) is not None else mean.inputs[::-1]
        keep, k = graph[ks], scalar(kc)
        if keep.op != "reshape" or not sole(keep.id, mean.id):
            continue
        tot = graph[keep.inputs[0]]
        if tot.op != "sum" or not sole(tot.id, keep.id):
            continue
        sq = graph[tot.inputs[0]]
        if sq.op != "mul" or sq.inputs[0] != sq.inputs[1] or not sole(sq.id, tot.id):
            continue
        x = graph[sq.inputs[0]]
        d = x.shape[-1] if x.shape else 0
        if (d == 0 or k is None or abs(k * d - 1) > 1e-6 or tuple(tot.attrs["axes"]) != (len(x.shape) - 1,)
                or keep.shape != x.shape[:-1] + (1,) or len(users.get(r.id, [])) != 1):
            continue
        norm = graph[users[r.id][0]]
        if norm.op != "mul" or other(norm, r.id) != x.id or norm.shape != x.shape or r.id in roots:
            continue
        w = None
        if len(users.get(norm.id, [])) == 1 and norm.id not in roots:
            scaled = graph[users[norm.id][0]]
            ws = other(scaled, norm.id) if scaled.op == "mul" else None
            if ws is not None and graph[ws].shape == (d,) and scaled.shape == x.shape:
                inner.add(norm.id)
                norm, w = scaled, ws
        norms[norm.id] = (x.id, w, eps)
        inner.update((sq.id, tot.id, keep.id, mean.id, add.id, r.id))
    return norms, inner


def _lower_rms(b: Builder, x: str, w: str | None, eps: float) -> str:
    # the standard operators in the form onnxruntime's SimplifiedLayerNormFusion makes one
    # SimplifiedLayerNormalization (Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul by the scale)
    ms = b.emit("ReduceMean", b.emit("Pow", x, b.scalar(2.0, "f32")), b.const([-1], "i64"), keepdims=1)
    y = b.emit("Div", x, b.emit("Sqrt", b.emit("Add", ms, b.scalar(eps, "f32"))))
    return y if w is None else b.emit("Mul", y, w)


def _lower_products(b: Builder, graph: Graph, members: list[int], names: dict) -> None:
    """x @ concat(W_1, W_2, ..., axis=1), split back into the members' products (the same sums
    per column: the results equal the separate products')."""
    widths = [graph[m].shape[-1] for m in members]
    w = b.emit("Concat", *(names[graph[m].inputs[1]] for m in members), axis=1)
    y = b.emit("MatMul", names[graph[members[0]].inputs[0]], w)
    outs = b.emit_n("Split", y, b.const(widths, "i64"), outs=[b.fresh("split") for _ in members],
                    axis=-1)
    for m, o in zip(members, outs):
        names[m] = o


def _live(graph: Graph, groups: dict, norms: dict, attns: dict) -> set[int]:
    """The nodes the roots need once the patterns are lowered as a whole (the rotary tables
    of a graph whose every attention became GroupQueryAttention: none)."""
    live, todo = set(), list(graph.roots())
    while todo:
        i = todo.pop()
        if i in live:
            continue
        live.add(i)
        if i in attns:
            rec = attns[i]
            todo += [*rec.reads, graph[rec.k_full].inputs[0], graph[rec.v_full].inputs[0]]
        elif i in norms:
            todo += [j for j in norms[i][:2] if j is not None]
        else:
            todo += [j for m in groups.get(i, [i]) for j in graph[m].inputs]
    return live


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
    row_reads:   ONNX input name -> (state, position feed): a KV cache state exchanged by rows
                 (attention.row_states): the runtime feeds its rows below the feed's value
                 (the input's first dimension is symbolic)
    row_writes:  ONNX output name ("<buffer>:rows") -> (state, position feed): the new rows
                 the runtime writes into the state at the feed's value, after the run (rows
                 past the state's end are dropped, as write_rows drops them); such a state
                 has no "<buffer>:new"
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
    row_reads: dict[str, tuple] = field(default_factory=dict)
    row_writes: dict[str, tuple] = field(default_factory=dict)
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
                 outputs=None, writebacks: bool = True, resident=(), by_rows: bool = False,
                 doc: str = "") -> Exported:
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
    by_rows:    exchange each KV cache state that attention.row_states allows by rows
                (Exported.row_reads, row_writes) instead of whole (a runtime that feeds
                the rows below the position and writes the new rows back itself)
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
    groups = _shared_products(graph, lambda n: n.op != "input" and (
        n.attrs["name"] in resident or (n.attrs["name"] in values and (
            n.id not in quant_reads or decode is not None))))
    norms, inner = _rms_norms(graph)
    attns, attn_inner = attention.find(graph)
    inner |= attn_inner
    by_rows = attention.row_states(graph, attns) if writebacks and by_rows else {}
    live = _live(graph, groups, norms, attns)
    done: set[int] = set()

    def visit(i: int) -> None:
        """Lower node i after its operands (those of a product lowered ahead: its group's)."""
        if i in done:
            return
        if i in inner:   # a norm's or an attention's inner value: lowered as a whole
            done.add(i)
            return
        if i in attns:
            rec = attns[i]
            for j in rec.reads + (graph[rec.k_full].inputs[0], graph[rec.v_full].inputs[0]):
                visit(j)
            done.update((rec.out, rec.k_full, rec.v_full))
            attention.lower(b, rec, graph, names, reshape=_reshape_to, write_rows=_write_rows,
                            by_rows=by_rows)
            return
        if i in norms:
            x, w, eps = norms[i]
            for j in (x, w):
                if j is not None:
                    visit(j)
            done.add(i)
            names[i] = _lower_rms(b, names[x], None if w is None else names[w], eps)
            return
        members = groups.get(i, [i])
        for m in members:  # the group's weights are constants: lowering them early is safe
            for j in graph[m].inputs:
                visit(j)
        done.update(members)
        if len(members) > 1:
            _lower_products(b, graph, members, names)
        else:
            lower(graph[i])

    def lower(n) -> None:
        if n.op in LEAVES:
            buf = n.attrs["name"]
            if n.id in quant_reads and all(m.op == "dequantize" for m in graph.nodes
                                           if n.id in m.inputs):
                return  # read only through its dequantize node: that node is the input
            if buf in values:
                names[n.id] = b.init(claim(buf), n.shape, proto.ELEM[n.dtype], _raw(values[buf], n.dtype))
                return
            if buf in resident and n.op != "input":
                names[n.id] = external(claim(buf), n, proto.ELEM[n.dtype], (n.op, buf, None, n.shape))
                return
            names[n.id] = claim(buf)
            if n.id in by_rows:   # the cache's rows below the position feed's value
                inputs.append(proto.value_info(buf, proto.ELEM[n.dtype], (by_rows[n.id],) + n.shape[1:]))
                ex.row_reads[buf] = (buf, by_rows[n.id])
                return
            inputs.append(proto.value_info(buf, proto.ELEM[n.dtype], n.shape))
            (ex.feeds if n.op == "input" else ex.persistent)[buf] = buf
            return
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
            return
        rule = LOWERINGS.get(n.op)
        if rule is None:
            raise NotImplementedError(f"ONNX export: no lowering of {n.op!r} (node %{n.id}); "
                                      "add one to webgrad/onnx/lower.py's LOWERINGS")
        ins = [names[i] for i in n.inputs]
        names[n.id] = rule(b, n, ins, graph) if getattr(rule, "needs_graph", False) else rule(b, n, ins)

    for n in graph.nodes:
        if n.op in LEAVES or n.id in live:   # the leaves stay the model's inputs
            visit(n.id)

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
            if buf in ex.row_reads:   # the new rows alone (attention.lower's value of it)
                o = claim(f"{buf}:rows")
                output(names[i], o, graph[graph[i].inputs[1]])
                ex.row_writes[o] = ex.row_reads[buf]
                continue
            o = claim(f"{buf}:new")
            output(names[i], o, graph[i])
            ex.writebacks[o] = buf
    ex.model = proto.model(proto.graph(name, b.encode(rename), b.inits, inputs, outs),
                           ir_version=IR_VERSION, opset=OPSET, producer="webgrad", doc=doc,
                           domains={d: 1 for d in sorted(b.domains)})
    ex.ops, ex.n_nodes = tuple(sorted(b.ops)), len(b.nodes)
    return ex

