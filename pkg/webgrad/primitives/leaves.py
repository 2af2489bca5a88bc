"""Leaf primitives: the graph's inputs, parameters and state (buffers the executor fills),
and the constants and ranges computed from attributes alone.

input, param and state have no reference rule: each executor reads them from the feed or its
persistent store. const and arange have one, and codegen/elementwise.py emits them as
expressions.
"""
from __future__ import annotations

from .registry import FREE, LEAF, defprim


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
