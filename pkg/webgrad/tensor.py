"""Tensor: a symbolic handle on one IR node, used while tracing.

A Tensor holds no data. Calling an op on Tensors appends a node to the graph being traced
(the innermost `tracing(graph)` context) and returns a new Tensor. Operators `+ - * / @ **`,
unary `-`, `abs()` and the comparisons `< <= > >= == !=` (elementwise, f32 0/1 masks)
forward to `webgrad.ops`. Each node records the user's source line, so
errors raised later (shape mismatches, bad feeds) can point at the line that built it.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from .ir import Graph

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_graphs: list[Graph] = []


@contextmanager
def tracing(graph: Graph):
    _graphs.append(graph)
    try:
        yield graph
    finally:
        _graphs.pop()


def current_graph() -> Graph:
    if not _graphs:
        loc = user_location()
        raise RuntimeError("webgrad ops build a graph and only work while tracing"
                           + (f" (used at {loc})" if loc else "") + ": call them "
                           "inside the forward/loss function given to compile_module or "
                           "compile_forward")
    return _graphs[-1]


_inside: dict[str, bool] = {}  # code file -> whether it is webgrad's (abspath is slow)


def _in_package(fn: str) -> bool:
    v = _inside.get(fn)
    if v is None:
        v = _inside[fn] = os.path.abspath(fn).startswith(_PKG_DIR) or fn.startswith("<frozen")
    return v


def user_location() -> str | None:
    """'file.py:12 in loss_fn' for the innermost frame outside the webgrad package."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        generated = fn == "<string>" and f.f_code.co_name == "__init__"  # a dataclass's __init__
        if not _in_package(fn) and not generated:
            return f"{os.path.basename(fn)}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return None


def at_user_line() -> str:
    """' (at file.py:12 in loss_fn)' for error messages, or '' when there is no user frame."""
    loc = user_location()
    return f" (at {loc})" if loc else ""


class Tensor:
    __slots__ = ("graph", "id")
    __array_priority__ = 1000  # so numpy scalars on the left defer to our operators

    def __init__(self, graph: Graph, id: int):
        self.graph = graph
        self.id = id

    @property
    def node(self):
        return self.graph.nodes[self.id]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> str:
        return self.node.dtype

    @property
    def ndim(self) -> int:
        return len(self.node.shape)

    def __repr__(self):
        n = self.node
        return f"Tensor(%{n.id} {n.op} {n.dtype}{list(n.shape)})"

    def __bool__(self):
        raise TypeError("a traced Tensor has no value yet, so it cannot be used in `if`/`and`/"
                        "`or`; use ops.where(cond, a, b) for data-dependent choices" + at_user_line())

    def _no_value(self, what: str):
        raise TypeError(f"a traced Tensor has no value yet, so {what}; the compiled program's "
                        "outputs have values (c.step, c.run, with_captures=True for "
                        "intermediates)" + at_user_line())

    def __float__(self): self._no_value("float() cannot read it")
    def __int__(self): self._no_value("int() cannot read it")
    def __index__(self): self._no_value("it cannot be used as a Python index or size")

    def __getitem__(self, key):
        raise TypeError(f"{self!r}[{key!r}]: Tensors are not indexed with []; use "
                        "ops.slice(x, axis, start, stop), ops.gather_rows(table, idx) or "
                        "ops.take_along_last(x, idx)" + at_user_line())

    def __iter__(self):
        raise TypeError(f"{self!r} cannot be iterated over in Python; use ops.slice or a "
                        "reduction (ops.sum, ops.max) over an axis" + at_user_line())

    # Operators forward to webgrad.ops (imported lazily: ops imports this module).
    def __add__(self, o): return _ops().add(self, o)
    def __radd__(self, o): return _ops().add(o, self)
    def __sub__(self, o): return _ops().sub(self, o)
    def __rsub__(self, o): return _ops().sub(o, self)
    def __mul__(self, o): return _ops().mul(self, o)
    def __rmul__(self, o): return _ops().mul(o, self)
    def __truediv__(self, o): return _ops().div(self, o)
    def __rtruediv__(self, o): return _ops().div(o, self)
    def __matmul__(self, o): return _ops().matmul(self, o)
    def __rmatmul__(self, o): return _ops().matmul(o, self)
    def __neg__(self): return _ops().neg(self)
    def __abs__(self): return _ops().abs(self)

    def __pow__(self, p): return _ops().pow(self, p)
    def __rpow__(self, b): return _ops().pow(b, self)

    # Comparisons are elementwise and return f32 0/1 masks, as torch's (bool) tensors do.
    # `==` too: a silent identity test (`t == 0.0` -> False) hides bugs. Tensors stay
    # hashable by identity, so they can still be dict keys.
    def __lt__(self, o): return _ops().less(self, o)
    def __gt__(self, o): return _ops().greater(self, o)
    def __le__(self, o): return _ops().less_equal(self, o)
    def __ge__(self, o): return _ops().greater_equal(self, o)
    def __eq__(self, o): return _ops().equal(self, o)
    def __ne__(self, o): return _ops().not_equal(self, o)
    __hash__ = object.__hash__

    def reshape(self, *shape): return _ops().reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else shape)
    def transpose(self, *perm): return _ops().transpose(self, perm[0] if len(perm) == 1 and isinstance(perm[0], (list, tuple)) else perm)

    @property
    def T(self): return _ops().swap_axes(self, -1, -2)


def _ops():
    from . import ops
    return ops
