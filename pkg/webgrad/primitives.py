"""The primitive registry: every IR op defined once, with all of its rules side by side.

Adding a primitive is one `defprim(...)` here, with
  1. shape     `shape(ins: list[Node], attrs) -> (shape, dtype)`, raising ShapeError;
  2. grad      `grad(g, ins: list[Tensor], out: Tensor, attrs) -> [Tensor | None]`, written
               with webgrad.ops (so backward is traced into the same IR); the engine in
               grad.py sums a gradient down to its input's shape, so rules for broadcasting
               ops may return the broadcast shape. `grad=None` marks an op as not
               differentiable (comparisons, indices, random numbers; tests/test_registry.py's
               NONDIFF must list it);
  3. ref       `ref(np, attrs, *arrays)` in numpy: the executable specification that every
               other executor is judged against;
  4. lowering  where WebGPU computes it: "expr" (the default: an expression evaluated inside
               whichever kernel reads it, fused), "leaf" (a buffer the executor fills), or
               the kind of kernel of its own that stores it ("matmul", "reduce", "row",
               "scatter", "fold", "write_rows", or a new kind);
  5. cost      a Cost (below): its FLOPs (codegen/cost.py's model, the profiler's columns),
               fusion's weight for recomputing it in a reader, whether it is a view and
               whether it reads only the input elements it selects. Pick one of the
               constants (ELEMENT, COSTLY, FREE, VIEW, SELECT, REDUCE, ROW, MATMUL) or write
               a Cost; there is no default count;
and, outside this file:
  6. ops.py: the public function that binds it (and a docstring);
  7. backends/torch_backend.py: its torch lowering in TORCH_IMPLS;
  8. onnx/lower.py: its ONNX lowering in LOWERINGS;
  9. codegen/: for "expr", an expression rule (`@rule("name")`, codegen/emit.py's
     EXPR_RULES) in the file of its family (elementwise.py, layout.py, index.py, conv.py,
     ...); for a kernel of an existing kind, its case in that kind's builder (reduce.py
     builds "reduce" and "row"); for a new kind, a builder in codegen/program.py's KERNELS
     (and its scratch buffers in SCRATCH, if any), in a file of its own. Codegen's op sets
     (fusion's kernel ops, views, recompute weights; reduce.py's ops) and the profiler's
     FLOPs and bytes are read from items 4 and 5 (codegen/kinds.py): no list names the op.
     (Codegen reads this registry; this file never imports codegen.);
 10. tests/oracle.py: a record exercising it (run by tests/test_ops.py on every executor).
tests/test_registry.py fails, naming the op and the missing piece, while any of these is
missing (`registry_problems()` is the checklist as code; test_oracle_exercises_every_primitive
checks item 10). A builder of an existing kind that lacks the op's case fails in the oracle
run on WebGPU (tests/test_webgpu.py, tests/test_ops.py).

Everything else in webgrad.ops (gelu, silu, softmax_causal_last, conv2d, cross entropy, ...)
is a composition of these; a new primitive earns its place only when a composition is slow
or numerically poor (the reason is noted beside it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from math import prod
from typing import Callable

from .tensor import Tensor, current_graph, user_location


class ShapeError(ValueError):
    """A shape or dtype rule refused an op at trace time."""


# ---------------------------------------------------------------- cost rules
# A FLOP rule is `flops(ins: list[Node], out: Node) -> int`: the arithmetic of computing the
# whole output once (codegen/cost.py sums it over a kernel's nodes for the profiler).


def no_flops(ins, out) -> int:
    """No arithmetic: leaves, constants, casts, views, pads and concatenations."""
    return 0


def per_element(ins, out) -> int:
    """One per output element (an elementwise op: exp counts as one, as an add)."""
    return out.size


def per_input_element(ins, out) -> int:
    """One per element reduced (sum, max, argmax)."""
    return ins[0].size


ROW_FLOPS = 5  # per element of softmax / log-softmax / layer norm (max, exp, sum, scale...)


def per_row_element(ins, out) -> int:
    return ROW_FLOPS * out.size


def matmul_flops(ins, out) -> int:
    """2 M N K per product, batch included."""
    return 2 * out.size * ins[0].shape[-1]


@dataclass(frozen=True)
class Cost:
    """What an op costs where it runs; read by codegen/cost.py (FLOPs, bytes) and by fusion.
    flops      the FLOP rule (above);
    recompute  fusion's weight for computing one element again inside each kernel that reads
               it (rule 2 of codegen/fusion.py stores an expression read by several kernels
               once the weights along its chain reach 8): 0 for what costs no work in a
               reader (views, constants, casts), 4 for transcendentals and division;
    view       it reads its one input at remapped indices and computes nothing (reshape,
               transpose, broadcast, slice): a matmul operand may be a strided view of it;
    narrows    it reads only the input elements it selects (slice, gather_rows): the bytes
               model counts those, not the whole input.
    An op is *free* when its FLOP rule is no_flops: it counts no FLOPs and the profiler
    leaves it out of a kernel's op list (pad and concat are free but cost a bounds test,
    recompute 1)."""
    flops: Callable
    recompute: int = 1
    view: bool = False
    narrows: bool = False

    @property
    def free(self) -> bool:
        return self.flops is no_flops


ELEMENT = Cost(per_element)                           # add, mul, relu, comparisons, where ...
COSTLY = Cost(per_element, recompute=4)               # exp, log, tanh, erf, sqrt, div ...
FREE = Cost(no_flops, recompute=0)                    # leaves, constants, cast
VIEW = Cost(no_flops, recompute=0, view=True)         # reshape, transpose, broadcast_to
SELECT = Cost(no_flops)                               # pad, concat: a bounds test, no arithmetic
REDUCE = Cost(per_input_element)
ROW = Cost(per_row_element)
MATMUL = Cost(matmul_flops)

# the values of Prim.lowering that are not kernels of their own
EXPR, LEAF = "expr", "leaf"


@dataclass
class Prim:
    name: str
    family: str  # elementwise | reduce | layout | matmul | index | random | leaf | conv | quant
    shape: Callable
    ref: Callable
    grad: Callable | None
    doc: str = ""
    cost: Cost | None = None   # None only until tests/test_registry.py names it
    lowering: str = EXPR       # "expr", "leaf" or a kernel kind (the header's item 4)

    @property
    def kernel(self) -> str | None:
        """The kind of kernel of its own that computes and stores it, or None."""
        return None if self.lowering in (EXPR, LEAF) else self.lowering


PRIMS: dict[str, Prim] = {}


def defprim(name, family, *, shape, ref, grad, cost=None, lowering=EXPR, doc=""):
    PRIMS[name] = Prim(name, family, shape, ref, grad, doc, cost, lowering)


def bind(op: str, *args: Tensor, **attrs) -> Tensor:
    """Append one primitive node to the graph being traced and return its Tensor."""
    g = current_graph()
    loc = user_location()
    where = f" (at {loc})" if loc else ""
    for a in args:
        if not isinstance(a, Tensor):
            raise TypeError(f"{op}: expected Tensor arguments, got {type(a).__name__}")
        if a.graph is not g:
            raise ValueError(f"{op}: a Tensor from another traced graph was used here"
                             f"{where}; Tensors cannot be carried "
                             "between compile calls")
    ins = [a.node for a in args]
    try:
        shape, dtype = PRIMS[op].shape(ins, attrs)
    except ShapeError as e:
        got = ", ".join(n.type_str for n in ins)
        raise ShapeError(f"{op}({got}): {e}{where}") from None
    return Tensor(g, g.add(op, [a.id for a in args], shape, dtype, attrs, loc))


# ---------------------------------------------------------------- shape rules

def broadcast_shapes(*shapes) -> tuple[int, ...]:
    r = max(len(s) for s in shapes)
    out = []
    for dims in zip(*[(1,) * (r - len(s)) + tuple(s) for s in shapes]):
        big = {d for d in dims if d != 1}
        if len(big) > 1:
            raise ShapeError("shapes " + " and ".join(str(list(s)) for s in shapes)
                             + " do not broadcast (numpy rules: trailing dims must match or be 1)")
        out.append(big.pop() if big else 1)
    return tuple(out)


F16_MATH = ("f16 is a storage type: webgrad computes in f32; convert the operand with "
            "ops.cast(x, 'f32') first")


def _same_dtype(ins, copies: bool = False):
    """The operands' one dtype; copies: the op only moves values (concat), so f16 is fine."""
    dts = {n.dtype for n in ins}
    if "f16" in dts and not copies:
        raise ShapeError(F16_MATH)
    if len(dts) > 1:
        raise ShapeError("operands have different dtypes " + "/".join(sorted(dts))
                         + "; convert with ops.cast(x, 'f32')")
    return dts.pop()


def _unary_f32(ins, attrs):
    if ins[0].dtype == "f16":
        raise ShapeError(F16_MATH)
    if ins[0].dtype != "f32":
        raise ShapeError("needs an f32 operand; convert indices with ops.cast(x, 'f32')")
    return ins[0].shape, "f32"


def _binary(ins, attrs):
    return broadcast_shapes(ins[0].shape, ins[1].shape), _same_dtype(ins)


def _compare(ins, attrs):
    return broadcast_shapes(ins[0].shape, ins[1].shape), (_same_dtype(ins) and "f32")


def _last_axis(ins, attrs):
    if not ins[0].shape:
        raise ShapeError("needs at least one axis")
    return _unary_f32(ins, attrs)


def _nonempty_last(ins, attrs):
    # the max of nothing has no value (torch and numpy refuse it too)
    x = ins[0]
    if x.shape and x.shape[-1] == 0 and prod(x.shape[:-1]) > 0:
        raise ShapeError("reduces an empty last axis, which has no maximum")
    return _last_axis(ins, attrs)


# ---------------------------------------------------------------- helpers for grads

def _O():
    from . import ops
    return ops


def _keep(g: Tensor, shape) -> Tensor:
    """Reshape a last-axis-reduced g back to keepdims form."""
    return _O().reshape(g, tuple(shape[:-1]) + (1,))


# ---------------------------------------------------------------- elementwise

def _unary(name, cost, ref, grad, doc=""):
    defprim(name, "elementwise", shape=_unary_f32, ref=ref, grad=grad, cost=cost, doc=doc)


def _erf_ref(np, a, x):
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


_unary("neg", ELEMENT, lambda np, a, x: -x, lambda g, i, o, a: [-g])
_unary("exp", COSTLY, lambda np, a, x: np.exp(x), lambda g, i, o, a: [g * o])          # d e^x = e^x dx
_unary("log", COSTLY, lambda np, a, x: np.log(x), lambda g, i, o, a: [g / i[0]])       # d log x = dx / x
_unary("sqrt", COSTLY, lambda np, a, x: np.sqrt(x), lambda g, i, o, a: [g / (2 * o)])  # d sqrt x = dx / (2 sqrt x)
_unary("rsqrt", COSTLY, lambda np, a, x: 1 / np.sqrt(x),
       lambda g, i, o, a: [g * (-0.5) * o * o * o])                            # d x^-1/2 = -1/2 x^-3/2 dx
_unary("tanh", COSTLY, lambda np, a, x: np.tanh(x), lambda g, i, o, a: [g * (1 - o * o)])  # d tanh = 1 - tanh^2
_unary("sigmoid", COSTLY, lambda np, a, x: (1 / (1 + np.exp(-x))).astype(x.dtype),
       lambda g, i, o, a: [g * o * (1 - o)],                                   # d s = s (1 - s) dx
       doc="primitive rather than 1/(1+exp(-x)): one kernel and no inf/inf for large |x|")
_unary("relu", ELEMENT, lambda np, a, x: np.maximum(x, 0),
       # relu'(0) = 0, as torch: written as a mask, not through maximum's tie rule
       lambda g, i, o, a: [g * _O().greater(i[0], 0.0)])
_unary("erf", COSTLY, _erf_ref,
       lambda g, i, o, a: [g * (2 / math.sqrt(math.pi)) * _O().exp(-(i[0] * i[0]))],  # d erf = 2/sqrt(pi) e^{-x^2}
       doc="no composition of exp/tanh gives erf to f32 accuracy")
_unary("abs", ELEMENT, lambda np, a, x: np.abs(x), lambda g, i, o, a: [g * _O().sign(i[0])])
# sign(NaN) = 0, as torch (numpy says NaN)
_unary("sign", ELEMENT, lambda np, a, x: np.where(np.isnan(x), np.zeros_like(x), np.sign(x)), None)
_unary("sin", COSTLY, lambda np, a, x: np.sin(x), lambda g, i, o, a: [g * _O().cos(i[0])])
_unary("cos", COSTLY, lambda np, a, x: np.cos(x), lambda g, i, o, a: [-g * _O().sin(i[0])])
# x ** p for a Python number p (attrs: p); d x^p = p x^(p-1) dx
_unary("pow", COSTLY, lambda np, a, x: np.power(x, np.asarray(a["p"], x.dtype)),
       lambda g, i, o, a: [g * a["p"] * _O().pow(i[0], a["p"] - 1)] if a["p"] != 0 else [None])


# rounding: piecewise constant, so the gradient is zero (torch's too); round is half to
# even, as torch.round, numpy and WGSL's round
_unary("floor", ELEMENT, lambda np, a, x: np.floor(x), lambda g, i, o, a: [None])
_unary("trunc", ELEMENT, lambda np, a, x: np.trunc(x), lambda g, i, o, a: [None])
_unary("round", ELEMENT, lambda np, a, x: np.round(x), lambda g, i, o, a: [None])


def _identity_shape(ins, attrs):
    return ins[0].shape, ins[0].dtype


defprim("stop_gradient", "elementwise", shape=_identity_shape, ref=lambda np, a, x: x,
        grad=lambda g, i, o, a: [None], cost=ELEMENT,
        doc="the identity whose gradient is zero (torch's detach): padding rows of an "
            "embedding, the shift of logsumexp")


def _bin(name, cost, ref, grad, shape=_binary):
    defprim(name, "elementwise", shape=shape, ref=ref, grad=grad, cost=cost)


_bin("add", ELEMENT, lambda np, a, x, y: x + y, lambda g, i, o, a: [g, g])
_bin("sub", ELEMENT, lambda np, a, x, y: x - y, lambda g, i, o, a: [g, -g])
_bin("mul", ELEMENT, lambda np, a, x, y: x * y, lambda g, i, o, a: [g * i[1], g * i[0]])
_bin("div", COSTLY, lambda np, a, x, y: (x / y) if x.dtype.kind == "f" else np.trunc(x / y).astype(x.dtype),
     lambda g, i, o, a: [g / i[1], -g * o / i[1]])                             # d(x/y) = dx/y - x dy/y^2


def _minmax_grad(first_wins):
    # torch's rule: the larger (smaller) operand takes the gradient; on a tie each gets half
    def grad(g, i, o, a):
        O = _O()
        win = O.greater(i[0], i[1]) if first_wins else O.less(i[0], i[1])
        m = win + 0.5 * O.equal(i[0], i[1])
        return [g * m, g * (1 - m)]
    return grad


_bin("maximum", ELEMENT, lambda np, a, x, y: np.maximum(x, y), _minmax_grad(True))
_bin("minimum", ELEMENT, lambda np, a, x, y: np.minimum(x, y), _minmax_grad(False))


def _power_shape(ins, attrs):
    if ins[0].dtype != "f32" or ins[1].dtype != "f32":
        raise ShapeError("needs f32 base and exponent; convert with ops.cast(x, 'f32')")
    return _binary(ins, attrs)


def _power_grad(g, i, o, a):
    # d x^y = y x^(y-1) dx + x^y log(x) dy; torch's conventions at the edges: no dx where
    # y = 0, no dy where x = 0 and y >= 0 (0^y is flat in y there)
    O = _O()
    x, y = i
    dx = O.where(O.equal(y, 0.0), 0.0, g * y * O.pow(x, y - 1.0))
    dy = O.where(O.equal(x, 0.0) * O.greater_equal(y, 0.0), 0.0, g * o * O.log(x))
    return [dx, dy]


_bin("power", ELEMENT, lambda np, a, x, y: np.power(x, y), _power_grad, _power_shape)

_bin("less", ELEMENT, lambda np, a, x, y: (x < y).astype("float32"), None, _compare)
_bin("greater", ELEMENT, lambda np, a, x, y: (x > y).astype("float32"), None, _compare)
_bin("equal", ELEMENT, lambda np, a, x, y: (x == y).astype("float32"), None, _compare)


def _where_shape(ins, attrs):
    c, x, y = ins
    if c.dtype != "f32":
        raise ShapeError("the condition must be an f32 mask (nonzero = true), as comparisons return")
    return broadcast_shapes(c.shape, x.shape, y.shape), _same_dtype([x, y])


defprim("where", "elementwise", shape=_where_shape,
        ref=lambda np, a, c, x, y: np.where(c != 0, x, y),
        grad=lambda g, i, o, a: [None, _O().where(i[0], g, 0.0), _O().where(i[0], 0.0, g)],
        cost=ELEMENT)


NUMPY_DTYPES = {"f32": "float32", "i32": "int32", "f16": "float16"}


def _cast_shape(ins, attrs):
    if attrs["dtype"] not in NUMPY_DTYPES:
        raise ShapeError(f"unknown dtype {attrs['dtype']!r}; use 'f32', 'f16' or 'i32'")
    if attrs["dtype"] == "f16" and ins[0].dtype == "i32":
        raise ShapeError("i32 -> f16 is not a cast webgrad has; go through f32 "
                         "(ops.cast(ops.cast(x, 'f32'), 'f16'))")
    return ins[0].shape, attrs["dtype"]


def _cast_ref(np, a, x):
    # f32 -> f16 rounds to nearest even, overflowing to +-inf past 65504 (IEEE, as WGSL's
    # f16() and torch's .half()); f16 -> f32 is exact
    with np.errstate(over="ignore"):
        return x.astype(NUMPY_DTYPES[a["dtype"]])


# the gradient of a float value is an f32 value whatever the value's storage (grad.py), so
# a cast between f32 and f16 passes it through unchanged
defprim("cast", "elementwise", shape=_cast_shape, ref=_cast_ref, cost=FREE,
        grad=lambda g, i, o, a: [g if i[0].dtype != "i32" and o.dtype != "i32" else None])

# ---------------------------------------------------------------- leaves


def _leaf_shape(ins, attrs):
    return tuple(attrs["shape"]), attrs["dtype"]


for _leaf in ("input", "param", "state"):
    defprim(_leaf, "leaf", shape=_leaf_shape, ref=None, grad=None, cost=FREE, lowering=LEAF,
            doc="read from the feed or the persistent store by the executor")
defprim("const", "leaf", shape=_leaf_shape, grad=None, cost=FREE,
        ref=lambda np, a: np.asarray(a["value"], "float32" if a["dtype"] == "f32" else "int32")
        .reshape(a["shape"]))
defprim("arange", "leaf", shape=lambda ins, a: ((a["n"],), a["dtype"]), grad=None, cost=FREE,
        ref=lambda np, a: np.arange(a["n"], dtype="float32" if a["dtype"] == "f32" else "int32"))

# ---------------------------------------------------------------- reductions


def _sum_shape(ins, attrs):
    x = ins[0]
    axes = attrs["axes"]
    if len(set(axes)) != len(axes) or any(not 0 <= ax < len(x.shape) for ax in axes):
        raise ShapeError(f"bad axes {list(axes)} for rank {len(x.shape)}")
    if x.dtype == "f16":
        raise ShapeError(F16_MATH)
    return tuple(d for k, d in enumerate(x.shape) if k not in axes), x.dtype


def _sum_grad(g, i, o, a):
    O = _O()
    x = i[0]
    keep = tuple(1 if k in a["axes"] else d for k, d in enumerate(x.shape))
    return [O.broadcast_to(O.reshape(g, keep), x.shape)]


defprim("sum", "reduce", shape=_sum_shape, grad=_sum_grad, cost=REDUCE, lowering="reduce",
        ref=lambda np, a, x: np.sum(x, axis=tuple(a["axes"]), dtype=x.dtype))


def _max_grad(g, i, o, a):
    # torch.amax's rule: the gradient is shared equally by all the maximal elements,
    # dx = g * [x == max] / #{x == max} (max_pool2d routes it to one element instead)
    O = _O()
    hit = O.equal(i[0], O.unsqueeze(o, -1))
    return [O.unsqueeze(g, -1) * hit / O.sum_last(hit, keepdims=True)]


defprim("max_last", "reduce", shape=lambda ins, a: (_nonempty_last(ins, a)[0][:-1], "f32"),
        ref=lambda np, a, x: np.max(x, axis=-1), grad=_max_grad, cost=REDUCE, lowering="reduce")
defprim("argmax_last", "reduce", shape=lambda ins, a: (_nonempty_last(ins, a)[0][:-1], "i32"),
        ref=lambda np, a, x: np.argmax(x, axis=-1).astype("int32"), grad=None, cost=REDUCE,
        lowering="reduce")


def _softmax_ref(np, a, x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def _log_softmax_ref(np, a, x):
    z = x - np.max(x, axis=-1, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def _softmax_grad(g, i, o, a):
    # dx = y * (g - sum(g * y))
    O = _O()
    return [o * (g - O.sum_last(g * o, keepdims=True))]


def _log_softmax_grad(g, i, o, a):
    # dx = g - softmax(x) * sum(g)
    O = _O()
    return [g - O.exp(o) * O.sum_last(g, keepdims=True)]


defprim("softmax_last", "reduce", shape=_last_axis, ref=_softmax_ref, grad=_softmax_grad,
        cost=ROW, lowering="row",
        doc="primitive: max-subtracted and one kernel; the composition needs 4 passes")
defprim("log_softmax_last", "reduce", shape=_last_axis, ref=_log_softmax_ref,
        grad=_log_softmax_grad, cost=ROW, lowering="row",
        doc="primitive: log(softmax) underflows to -inf")


def _layer_norm_ref(np, a, x):
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return ((x - mu) / np.sqrt(var + np.asarray(a["eps"], x.dtype))).astype(x.dtype)


def _layer_norm_grad(g, i, o, a):
    # xhat = (x - mu) * r, r = (var + eps)^-1/2:  dx = r * (g - mean(g) - xhat * mean(g * xhat))
    O = _O()
    x = i[0]
    xc = x - O.mean_last(x, keepdims=True)
    r = O.rsqrt(O.mean_last(xc * xc, keepdims=True) + a["eps"])
    return [r * (g - O.mean_last(g, keepdims=True) - o * O.mean_last(g * o, keepdims=True))]


defprim("layer_norm_last", "reduce", shape=_last_axis, ref=_layer_norm_ref,
        grad=_layer_norm_grad, cost=ROW, lowering="row",
        doc="normalisation without affine; primitive so that the forward is one kernel "
            "(mean, variance and scale in one pass over a row)")

# ---------------------------------------------------------------- layout


def _reshape_shape(ins, attrs):
    if prod(attrs["shape"]) != ins[0].size:
        raise ShapeError(f"cannot reshape {list(ins[0].shape)} ({ins[0].size} elements) "
                         f"to {list(attrs['shape'])} ({prod(attrs['shape'])} elements)")
    return tuple(attrs["shape"]), ins[0].dtype


defprim("reshape", "layout", shape=_reshape_shape,
        ref=lambda np, a, x: x.reshape(a["shape"]),
        grad=lambda g, i, o, a: [_O().reshape(g, i[0].shape)], cost=VIEW)


def _transpose_shape(ins, attrs):
    perm = attrs["perm"]
    if sorted(perm) != list(range(len(ins[0].shape))):
        raise ShapeError(f"perm {list(perm)} is not a permutation of the {len(ins[0].shape)} axes")
    return tuple(ins[0].shape[p] for p in perm), ins[0].dtype


def _inverse(perm):
    inv = [0] * len(perm)
    for k, p in enumerate(perm):
        inv[p] = k
    return tuple(inv)


defprim("transpose", "layout", shape=_transpose_shape,
        ref=lambda np, a, x: np.transpose(x, a["perm"]),
        grad=lambda g, i, o, a: [_O().transpose(g, _inverse(a["perm"]))], cost=VIEW)


def _broadcast_to_shape(ins, attrs):
    tgt = tuple(attrs["shape"])
    if broadcast_shapes(ins[0].shape, tgt) != tgt:
        raise ShapeError(f"cannot broadcast {list(ins[0].shape)} to {list(tgt)}")
    return tgt, ins[0].dtype


defprim("broadcast_to", "layout", shape=_broadcast_to_shape,
        ref=lambda np, a, x: np.broadcast_to(x, a["shape"]).copy(),
        grad=lambda g, i, o, a: [g], cost=VIEW)  # grad.py sums g down to the input's shape


def _concat_shape(ins, attrs):
    ax = attrs["axis"]
    r = len(ins[0].shape)
    for n in ins[1:]:
        if len(n.shape) != r or any(d != e for k, (d, e) in enumerate(zip(n.shape, ins[0].shape)) if k != ax):
            raise ShapeError(f"all shapes must match except along axis {ax}")
    out = list(ins[0].shape)
    out[ax] = sum(n.shape[ax] for n in ins)
    return tuple(out), _same_dtype(ins, copies=True)


def _concat_grad(g, i, o, a):
    O = _O()
    ax, out, start = a["axis"], [], 0
    for t in i:
        out.append(O.slice(g, ax, start, start + t.shape[ax]))
        start += t.shape[ax]
    return out


defprim("concat", "layout", shape=_concat_shape, grad=_concat_grad, cost=SELECT,
        ref=lambda np, a, *xs: np.concatenate(xs, axis=a["axis"]))


def _slice_shape(ins, attrs):
    ax, s, e = attrs["axis"], attrs["start"], attrs["stop"]
    n = ins[0].shape[ax]
    if not 0 <= s <= e <= n:
        raise ShapeError(f"range [{s}, {e}) is outside axis {ax} of length {n}")
    out = list(ins[0].shape)
    out[ax] = e - s
    return tuple(out), ins[0].dtype


def _slice_ref(np, a, x):
    idx = [slice(None)] * x.ndim
    idx[a["axis"]] = slice(a["start"], a["stop"])
    return x[tuple(idx)]


defprim("slice", "layout", shape=_slice_shape, ref=_slice_ref,
        cost=Cost(no_flops, recompute=0, view=True, narrows=True),
        grad=lambda g, i, o, a: [_O().pad(g, a["axis"], a["start"],
                                          i[0].shape[a["axis"]] - a["stop"])])


def _pad_shape(ins, attrs):
    out = list(ins[0].shape)
    out[attrs["axis"]] += attrs["before"] + attrs["after"]
    return tuple(out), ins[0].dtype


def _pad_ref(np, a, x):
    w = [(0, 0)] * x.ndim
    w[a["axis"]] = (a["before"], a["after"])
    return np.pad(x, w)


defprim("pad", "layout", shape=_pad_shape, ref=_pad_ref, cost=SELECT,
        grad=lambda g, i, o, a: [_O().slice(g, a["axis"], a["before"],
                                            a["before"] + i[0].shape[a["axis"]])],
        doc="zero padding along one axis: the adjoint of slice")

# ---------------------------------------------------------------- matmul


def _matmul_shape(ins, attrs):
    a, b = ins
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ShapeError("operands need rank >= 2 (ops.matmul lifts vectors)")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"inner dimensions differ: {a.shape[-1]} vs {b.shape[-2]}")
    if a.dtype != b.dtype or a.dtype not in ("f32", "f16"):
        raise ShapeError("needs two f32 or two f16 operands (f16 x f16 accumulates in f32); "
                         "convert with ops.cast(x, 'f32') or ops.cast(x, 'f16')")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return batch + (a.shape[-2], b.shape[-1]), "f32"


def _matmul_ref(np, a, x, y):
    # f16 operands are multiplied and summed in f32 (the GPU's f16 x f16 -> f32 products);
    # numpy's own float16 matmul would round every partial sum to f16
    if x.dtype == np.float16:
        return np.matmul(x.astype(np.float32), y.astype(np.float32))
    return np.matmul(x, y)


def _matmul_grad(g, i, o, a):
    # C = A B:  dA = dC B^T,  dB = A^T dC  (then summed over broadcast batch dims); with f16
    # operands the incoming gradient is rounded to f16 too, as torch.amp's backward does
    O = _O()
    if i[0].dtype == "f16":
        g = O.cast(g, "f16")
    return [O.matmul(g, O.swap_axes(i[1], -1, -2)), O.matmul(O.swap_axes(i[0], -1, -2), g)]


defprim("matmul", "matmul", shape=_matmul_shape, ref=_matmul_ref, grad=_matmul_grad, cost=MATMUL,
        lowering="matmul")


def _dequantize_shape(ins, attrs):
    from .quants import check, n_words
    w, qtype, shape = ins[0], attrs["qtype"], tuple(attrs["shape"])
    if w.dtype != "i32" or len(w.shape) != 1:
        raise ShapeError("the blocks must be an i32 vector of words (webgrad.quants' word layout)")
    try:
        check(qtype, shape, "dequantize")
    except ValueError as e:
        raise ShapeError(str(e)) from None
    if w.shape[0] != n_words(qtype, prod(shape)):
        raise ShapeError(f"{qtype}{list(shape)} takes {n_words(qtype, prod(shape))} words, "
                         f"got {w.shape[0]}")
    return shape, "f32"


def _dequantize_ref(np, a, w):
    from .quants import dequantize_numpy
    return dequantize_numpy(np, a["qtype"], w, a["shape"])


defprim("dequantize", "quant", shape=_dequantize_shape, ref=_dequantize_ref, grad=None,
        cost=ELEMENT,
        doc="quantized blocks -> f32 (webgrad/quants): a primitive because on WebGPU its consumers "
            "decode the blocks in registers (codegen/quant.py), which no composition of "
            "bit ops on i32 would let a matmul do without storing the f32 weights")

# ---------------------------------------------------------------- indices


def _one_hot_shape(ins, attrs):
    if ins[0].dtype != "i32":
        raise ShapeError("indices must be i32")
    return ins[0].shape + (attrs["n"],), "f32"


defprim("one_hot", "index", shape=_one_hot_shape, grad=None, cost=ELEMENT,
        ref=lambda np, a, i: (i[..., None] == np.arange(a["n"])).astype("float32"))


def _gather_shape(ins, attrs):
    w, idx = ins
    if idx.dtype != "i32":
        raise ShapeError("indices must be i32")
    if not w.shape:
        raise ShapeError("the table needs at least one axis")
    return idx.shape + w.shape[1:], w.dtype


def _gather_ref(np, a, w, i):
    # rows outside [0, n) read as zeros and negative indices never wrap (bounds.py: fed
    # indices are refused before a step; this is the rule for computed ones)
    ok = (i >= 0) & (i < w.shape[0])
    rows = w[np.where(ok, i, 0)]
    return np.where(ok.reshape(ok.shape + (1,) * (w.ndim - 1)), rows, np.zeros_like(rows))


defprim("gather_rows", "index", shape=_gather_shape, ref=_gather_ref,
        cost=Cost(per_element, narrows=True),
        grad=lambda g, i, o, a: [_O().scatter_add_rows(g, i[1], i[0].shape[0]), None],
        doc="rows of a table by index (embedding); primitive because one_hot @ W costs "
            "V times more work and memory")


def _scatter_shape(ins, attrs):
    g, idx = ins
    if idx.dtype != "i32":
        raise ShapeError("indices must be i32")
    if g.shape[:len(idx.shape)] != idx.shape:
        raise ShapeError("values must start with the indices' shape")
    if g.dtype == "f16":
        raise ShapeError(F16_MATH)
    return (attrs["n"],) + g.shape[len(idx.shape):], g.dtype


def _scatter_ref(np, a, g, i):
    rest = g.shape[i.ndim:]
    out = np.zeros((a["n"],) + rest, g.dtype)
    flat = i.reshape(-1)
    ok = (flat >= 0) & (flat < a["n"])  # out-of-range rows are dropped (gather reads zeros)
    np.add.at(out, flat[ok], g.reshape((-1,) + rest)[ok])
    return out


# its FLOPs: one per element of the table it writes (per_element), not per row added
defprim("scatter_add_rows", "index", shape=_scatter_shape, ref=_scatter_ref, cost=ELEMENT,
        lowering="scatter",
        grad=lambda g, i, o, a: [_O().gather_rows(g, i[1]), None],
        doc="the adjoint of gather_rows: rows summed into a zero table")


def _write_rows_shape(ins, attrs):
    base, vals, start = ins
    if not base.shape:
        raise ShapeError("the target needs at least one axis (its rows)")
    if vals.shape[1:] != base.shape[1:] or len(vals.shape) != len(base.shape):
        raise ShapeError(f"values {list(vals.shape)} must be rows of the target {list(base.shape)} "
                         f"(shape [T, {', '.join(map(str, base.shape[1:]))}])")
    if vals.dtype != base.dtype:
        raise ShapeError(f"values are {vals.dtype}, the target {base.dtype}")
    if start.dtype != "i32" or start.size != 1:
        raise ShapeError(f"start must be one i32 (shape [] or [1]), got {start.type_str}")
    return base.shape, base.dtype


def _write_rows_ref(np, a, base, vals, start):
    out = base.copy()
    s, n = int(start.reshape(-1)[0]), base.shape[0]
    lo, hi = max(s, 0), min(s + vals.shape[0], n)  # rows that land outside the target are dropped
    if lo < hi:
        out[lo:hi] = vals[lo - s:hi - s]
    return out


def _write_rows_grad(g, i, o, a):
    # out[r] = values[r - s] where 0 <= r - s < T, else base[r]:
    #   d base = g off the written rows,  d values[t] = g[s + t] (0 where s + t is outside)
    O = _O()
    base, vals, start = i
    n, t = base.shape[0], vals.shape[0]
    s = O.reshape(start, (1,))
    rows = O.arange(n) - s
    written = O.cast(O.greater_equal(rows, 0), "f32") * O.less(rows, t)
    keep = O.reshape(1.0 - written, (n,) + (1,) * (len(base.shape) - 1))
    dst = O.arange(t) + s
    inside = O.greater_equal(dst, 0) * O.less(dst, n)
    rows_of_g = O.gather_rows(g, O.minimum(O.maximum(dst, 0), n - 1))
    return [g * keep, rows_of_g * O.reshape(inside, (t,) + (1,) * (len(base.shape) - 1)), None]


defprim("write_rows", "index", shape=_write_rows_shape, ref=_write_rows_ref, grad=_write_rows_grad,
        cost=ELEMENT, lowering="write_rows",
        doc="rows start..start+T-1 of a target replaced by values (start a run-time i32; rows "
            "outside the target dropped). A primitive, not where(mask, gather(values), base), "
            "because assigned back to its own state (stateful.py) the WebGPU kernel writes only "
            "the T rows in place: a KV cache step touches T rows, not the whole cache")


# ---------------------------------------------------------------- random

_M32 = 0xFFFFFFFF


def lowbias32(np, x):
    """rand_bits' 32-bit integer hash (two multiply-xorshift rounds) of a Python int
    (np=None) or an int64 array of numpy or torch; the torch executor and init.py use it."""
    # int64 lanes keep the low 32 bits exact on every executor, WGSL does the same in u32
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def rand_key(counter: int, seed: int) -> int:
    """H(seed + H(counter)), the per-step key of rand_bits, in Python ints: exact, where an
    int64 scalar product overflows (and warns). Every executor derives its key here."""
    return lowbias32(None, (seed + lowbias32(None, int(counter) & _M32)) & _M32)


def rand_bits(np, counter: int, seed: int, n: int):
    """The uniform generator's spec: u = (h >> 8) / 2^24 with h = H(i + H(seed + H(counter)))."""
    return lowbias32(np, np.arange(n, dtype=np.int64) + rand_key(counter, seed))


def _rand_ref(np, a, counter):
    n = prod(a["shape"])
    h = rand_bits(np, int(counter.reshape(-1)[0]), a["seed"], n)
    return ((h >> 8).astype(np.float32) * np.float32(2.0 ** -24)).reshape(a["shape"])


def _rand_shape(ins, attrs):
    if ins[0].shape not in ((), (1,)):
        raise ShapeError("the counter must be a scalar")
    return tuple(attrs["shape"]), "f32"


# recompute 6: two multiply-xorshift rounds of the hash per number
defprim("rand_uniform", "random", shape=_rand_shape, ref=_rand_ref, grad=None,
        cost=Cost(per_element, recompute=6),
        doc="counter-based uniform [0, 1) numbers: same bits on every executor; the "
            "counter is the step number, so dropout masks change every step")

# ---------------------------------------------------------------- convolution windows


def conv_out_size(n, k, s, p, d=1, ceil=False):
    """Output length of a window of k taps spaced d apart, stride s, padding p on both
    sides (torch's rule). ceil: round up, but a window must start inside the input or
    its left padding (torch's ceil_mode)."""
    span = d * (k - 1) + 1
    if not ceil:
        return (n + 2 * p - span) // s + 1
    out = -(-(n + 2 * p - span) // s) + 1
    if (out - 1) * s >= n + p:
        out -= 1
    return out


@dataclass(frozen=True)
class Window:
    """The geometry of an unfold2d/fold2d node: taps (kh, kw) spaced (dh, dw), stride,
    padding and output grid (oh, ow) over an H x W image."""
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    oh: int
    ow: int


def window(attrs, H: int, W: int) -> Window:
    (kh, kw), (sh, sw), (ph, pw) = attrs["kernel"], attrs["stride"], attrs["padding"]
    dh, dw = attrs.get("dilation", (1, 1))
    ceil = attrs.get("ceil", False)
    return Window(kh, kw, sh, sw, ph, pw, dh, dw, conv_out_size(H, kh, sh, ph, dh, ceil),
                  conv_out_size(W, kw, sw, pw, dw, ceil))


def window_rows(np, w: Window):
    """(rows [kh, oh], cols [kw, ow]): the image coordinate each tap reads (may be outside)."""
    rows = np.arange(w.oh)[None, :] * w.sh + np.arange(w.kh)[:, None] * w.dh - w.ph
    cols = np.arange(w.ow)[None, :] * w.sw + np.arange(w.kw)[:, None] * w.dw - w.pw
    return rows, cols


def _unfold_shape(ins, attrs):
    x = ins[0]
    if len(x.shape) != 4:
        raise ShapeError("expects [N, C, H, W]")
    N, C, H, W = x.shape
    w = window(attrs, H, W)
    if w.oh < 1 or w.ow < 1:
        raise ShapeError(f"a {w.kh}x{w.kw} window (dilation {w.dh},{w.dw}) does not fit in "
                         f"{H}x{W} with padding {w.ph},{w.pw}")
    return (N, C, w.kh * w.kw, w.oh * w.ow), x.dtype


def _unfold_ref(np, a, x):
    # out[n, c, i*kw + j, oy*ow + ox] = x[n, c, rows[i, oy], cols[j, ox]], pad_value outside
    N, C, H, W = x.shape
    w = window(a, H, W)
    rows, cols = window_rows(np, w)
    r = rows[:, None, :, None]
    c = cols[None, :, None, :]
    inside = (r >= 0) & (r < H) & (c >= 0) & (c < W)
    v = x[:, :, np.clip(r, 0, H - 1), np.clip(c, 0, W - 1)]  # [N, C, kh, kw, oh, ow]
    out = np.where(inside, v, np.asarray(a["pad_value"], x.dtype)).astype(x.dtype)
    return out.reshape(N, C, w.kh * w.kw, w.oh * w.ow)


def _fold_shape(ins, attrs):
    N, C, _, _ = ins[0].shape
    return (N, C, attrs["size"][0], attrs["size"][1]), ins[0].dtype


def _fold_ref(np, a, g):
    # the adjoint: every window entry that lies inside the image is added back to its pixel
    N, C = g.shape[:2]
    H, W = a["size"]
    w = window(a, H, W)
    rows, cols = window_rows(np, w)
    r = np.broadcast_to(rows[:, None, :, None], (w.kh, w.kw, w.oh, w.ow))
    c = np.broadcast_to(cols[None, :, None, :], (w.kh, w.kw, w.oh, w.ow))
    inside = (r >= 0) & (r < H) & (c >= 0) & (c < W)
    out = np.zeros((N, C, H * W), g.dtype)
    vals = g.reshape(N, C, w.kh, w.kw, w.oh, w.ow)[:, :, inside]
    np.add.at(out, (slice(None), slice(None), (r * W + c)[inside]), vals)
    return out.reshape(N, C, H, W)


def _window(a):
    return {k: a[k] for k in ("kernel", "stride", "padding", "dilation", "ceil") if k in a}


defprim("unfold2d", "conv", shape=_unfold_shape, ref=_unfold_ref, cost=ELEMENT,
        grad=lambda g, i, o, a: [_O().fold2d(g, size=i[0].shape[2:], **_window(a))],
        doc="sliding windows [N,C,H,W] -> [N,C,kh*kw,OH*OW] (im2col), so conv2d is a "
            "matmul and max_pool2d a max_last; pad_value fills the border")
defprim("fold2d", "conv", shape=_fold_shape, ref=_fold_ref, cost=ELEMENT, lowering="fold",
        grad=lambda g, i, o, a: [_O().unfold2d(g, pad_value=0.0, **_window(a))],
        doc="the adjoint of unfold2d: window entries summed back into the image")
