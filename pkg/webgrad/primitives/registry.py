"""The registry's machinery: `Prim`, `Cost`, `PRIMS`, `defprim` and `bind`, and the shape
helpers that several op families share.

Every family module of this package (elementwise.py, reduce.py, ...) calls `defprim` at import
time to add its rows to `PRIMS`; `bind` appends a node of a registered op to the graph being
traced (ops.py, trace.py, optim.py, module.py and stateful.py bind through it). The cost
constants (ELEMENT, COSTLY, ...) are what a row's `cost=` picks from; codegen/kinds.py and
codegen/cost.py read them back. This module imports no family and no codegen; grad rules reach
webgrad.ops through `ops_module()`, when they run (the op language's knot: ops binds
primitives, primitives return Tensors).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..tensor import Tensor, current_graph, user_location


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


def same_dtype(ins, copies: bool = False):
    """The operands' one dtype (a shape rule's helper); copies: the op only moves values
    (concat), so f16 is fine."""
    dts = {n.dtype for n in ins}
    if "f16" in dts and not copies:
        raise ShapeError(F16_MATH)
    if len(dts) > 1:
        raise ShapeError("operands have different dtypes " + "/".join(sorted(dts))
                         + "; convert with ops.cast(x, 'f32')")
    return dts.pop()


def unary_f32(ins, attrs):
    """The shape rule of an op of one f32 operand that keeps its shape (exp, softmax...)."""
    if ins[0].dtype == "f16":
        raise ShapeError(F16_MATH)
    if ins[0].dtype != "f32":
        raise ShapeError("needs an f32 operand; convert indices with ops.cast(x, 'f32')")
    return ins[0].shape, "f32"


# ---------------------------------------------------------------- helpers for grads

def ops_module():
    """webgrad.ops, for grad rules: imported when a rule runs, since ops imports this package."""
    from .. import ops
    return ops
