"""Zero-size tensors leave the graph before WebGPU lowering.

A tensor with a zero-length axis ([0, 3] params, an empty batch) holds nothing, and WebGPU
can neither bind a zero-byte buffer nor size a kernel by it; the interpreters (reference,
torch) need no help. `strip_empty(graph)` returns a graph without them:
  * every zero-size node is dropped (its consumers are zero-size too, except below);
  * a non-empty result of empty operands becomes its value: zeros for sum, matmul with
    K = 0, pad, gather_rows / scatter_add_rows / fold2d with nothing to move; a concat
    keeps its non-empty inputs;
  * zero-size inputs, params, state, outputs and writebacks are dropped: the runtime feeds,
    reads and writes them as the empty arrays they are (program.Lowered.empty_outputs).
max_last / argmax_last over an empty axis are refused at trace time (primitives/reduce.py), as
torch refuses them.
"""
from __future__ import annotations

from ..ir import Graph

# ops whose result is all zeros when an operand is empty (the result itself is not)
_ZERO_WHEN_EMPTY = {"sum", "matmul", "pad", "gather_rows", "scatter_add_rows", "fold2d"}


def strip_empty(g):
    """(graph without zero-size tensors, {output name: (shape, dtype)} of empty outputs)."""
    if all(n.size > 0 for n in g.nodes):
        return g, {}
    out = Graph(seed=g.seed, training=g.training)
    m: dict[int, int | None] = {}
    for n in g.nodes:
        if n.size == 0:
            m[n.id] = None
            continue
        ins = [m[i] for i in n.inputs]
        if None not in ins:
            m[n.id] = out.add(n.op, ins, n.shape, n.dtype, n.attrs, n.loc)
        elif n.op == "concat":
            kept = [i for i in ins if i is not None]
            m[n.id] = kept[0] if len(kept) == 1 else out.add(n.op, kept, n.shape, n.dtype,
                                                              n.attrs, n.loc)
        elif n.op in _ZERO_WHEN_EMPTY:
            z = out.add("const", [], (), n.dtype, {"value": 0.0 if n.dtype == "f32" else 0,
                                                  "shape": (), "dtype": n.dtype}, n.loc)
            m[n.id] = out.add("broadcast_to", [z], n.shape, n.dtype, {"shape": n.shape}, n.loc)
        else:
            where = f" (at {n.loc})" if n.loc else ""
            raise NotImplementedError(f"webgpu: {n.op} of a zero-size operand gives a non-empty "
                                      f"{n.type_str}{where}; no rule for it")
    out.outputs = {k: m[i] for k, i in g.outputs.items() if m[i] is not None}
    out.writebacks = {k: m[i] for k, i in g.writebacks.items() if m[i] is not None}
    empty = {k: (g[i].shape, g[i].dtype) for k, i in g.outputs.items() if m[i] is None}
    return out, empty
