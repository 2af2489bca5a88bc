"""Reverse-mode autodiff, appended to the same graph.

Walks the forward nodes from the last to the first, asks each primitive's derivative rule
(webgrad.primitives) for the gradient of each input, sums a gradient down to its input's shape
where broadcasting widened it, and accumulates contributions with `add`. The backward
nodes are traced like user code, so they are ordinary IR nodes that later passes
(DCE, fusion, codegen) treat no differently.
"""
from __future__ import annotations

from . import ops
from .primitives import PRIMS, ShapeError
from .tensor import Tensor, tracing


def sum_to(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum g over the axes that broadcasting added or widened, to get `shape`."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead < 0:
        raise ShapeError(f"gradient of shape {list(g.shape)} cannot be summed to {list(shape)}")
    axes = list(range(lead)) + [lead + k for k, d in enumerate(shape) if d == 1 and g.shape[lead + k] != 1]
    out = ops.sum(g, axes) if axes else g
    return ops.reshape(out, shape)


def append_grad(graph, loss_id: int, wrt: list[int]) -> dict[int, Tensor]:
    """Append d loss / d x for each node id in `wrt`; returns {id: gradient Tensor}.
    A node the loss does not depend on gets a zero gradient."""
    keep = set(wrt)  # their gradients stay in `grads` to be returned; others are dropped once used
    with tracing(graph):
        grads: dict[int, Tensor] = {loss_id: ops.constant(1.0) if not graph[loss_id].shape
                                    else ops.broadcast_to(1.0, graph[loss_id].shape)}
        for node in reversed(graph.nodes[:loss_id + 1]):
            g = grads.pop(node.id, None) if node.id not in keep else grads.get(node.id)
            if g is None or not node.inputs:
                continue
            rule = PRIMS[node.op].grad
            if rule is None:
                continue
            ins = [Tensor(graph, i) for i in node.inputs]
            for x, gx in zip(ins, rule(g, ins, Tensor(graph, node.id), node.attrs)):
                if gx is None or x.dtype == "i32":  # an f16 value's gradient is f32
                    continue
                gx = sum_to(gx, x.shape)
                grads[x.id] = grads[x.id] + gx if x.id in grads else gx
        return {i: grads.get(i) if grads.get(i) is not None
                else ops.broadcast_to(0.0, graph[i].shape) for i in wrt}
