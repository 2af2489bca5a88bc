"""Thin weight gradients computed in their parameter's layout, for the optimizer's merge.

`program.lower` runs `thin_grads(graph, limits)` before fusion (after the alignment pass).
A weight W read as W^T (x @ W^T: a Linear's [out, in] weight, and LoRA's factors A [r, in]
and B [out, r]) gets the gradient the matmul rule gives its transpose, transposed back:

  dW = transpose(sum_b(x_b^T @ g_b))             [in, out] product, read as [out, in]

The optimizer's update of W reads that product at a transposed index, so fusion's rule 3
(a reader joins the kernel of what it reads at the same flat index) leaves the update an
elementwise kernel of its own. Computed as the same sums in W's layout,

  dW = sum_b(g_b^T @ x_b)                         [out, in] product

the update (AdamW's m, v and W) joins the product's kernel (its epilogue). The pass takes
a transpose of the last two axes of a 2-D product (or of its sum over the batch axes) that
nothing else reads, where the gradient is thin (a side of at most KernelOptions.split_thin:
LoRA's [r, in] and [out, r] factors, r = 16: two elementwise kernels an adapter), and where
KernelOptions.thin_grads is on. Wider ones (a full fine-tune's [out, in] weights, GPT-2's
tied head on adapters without the alignment pass) would merge the same way, but their
products' tiles are measured in the traced layout and are left as they are.
"""
from __future__ import annotations

from ..dce import dce
from ..ir import Graph
from .layout import swaps_last_two


def _batch_sum(g: Graph, s) -> bool:
    """Is s a sum over every batch axis of a batched matmul (the rest kept in place)?"""
    return (s.op == "sum" and g[s.inputs[0]].op == "matmul"
            and tuple(s.attrs["axes"]) == tuple(range(len(g[s.inputs[0]].shape) - 2))
            and len(s.shape) == 2)


def thin_grads(g: Graph, limits) -> Graph:
    """g with each qualifying transposed product computed in the transpose's layout (else g)."""
    opts = limits.options
    if not opts.thin_grads or not opts.split_thin:
        return g
    cons = g.consumers()
    kept = set(g.roots())

    def only(reader, x) -> bool:   # x is read by `reader` alone and is no output
        return cons[x] == [reader] and x not in kept
    chosen: dict[int, int] = {}    # the product to swap -> the transpose it then computes
    for t in g.nodes:
        if not (swaps_last_two(t) and len(t.shape) == 2 and min(t.shape) <= opts.split_thin):
            continue
        s = g[t.inputs[0]]
        if s.op == "matmul" and len(s.shape) == 2 and only(t.id, s.id):
            chosen[s.id] = t.id
        elif _batch_sum(g, s) and only(t.id, s.id) and only(s.id, s.inputs[0]):
            chosen[s.inputs[0]] = t.id
    if not chosen:
        return g
    out = Graph(seed=g.seed, training=g.training)
    remap: dict[int, int] = {}

    views: dict[int, int] = {}   # original tensor -> its transpose in `out`

    def swapped(x: int, loc) -> int:
        """x^T in `out`: the source of a transpose of the last two axes, else a new one."""
        n = g[x]
        if swaps_last_two(n):
            return remap[n.inputs[0]]
        if x not in views:
            r = len(n.shape)
            views[x] = out.add("transpose", [remap[x]], n.shape[:-2] + (n.shape[-1], n.shape[-2]),
                               n.dtype, {"perm": (*range(r - 2), r - 1, r - 2)}, loc)
        return views[x]
    swapped_of: dict[int, int] = {}   # original transpose -> its new value
    for n in g.nodes:
        if n.id in chosen:   # (A B)^T = B^T A^T, the batch sum after it as before
            a, b = n.inputs
            mm = out.add("matmul", [swapped(b, n.loc), swapped(a, n.loc)],
                         n.shape[:-2] + (n.shape[-1], n.shape[-2]), n.dtype, n.attrs, n.loc)
            t = g[chosen[n.id]]
            if t.inputs[0] != n.id:   # the batch sum
                s = g[t.inputs[0]]
                mm = out.add("sum", [mm], t.shape, s.dtype, s.attrs, s.loc)
            swapped_of[t.id] = mm
            remap[n.id] = mm   # read by nothing else (`only`): the sum's input below
            continue
        if n.id in swapped_of:
            remap[n.id] = swapped_of[n.id]
            continue
        if n.op == "sum" and n.inputs[0] in chosen:
            remap[n.id] = remap[n.inputs[0]]   # the swapped product's sum, made above
            continue
        remap[n.id] = out.add(n.op, [remap[x] for x in n.inputs], n.shape, n.dtype, n.attrs,
                              n.loc)
    for name in ("inputs", "params", "state", "outputs", "writebacks"):
        setattr(out, name, {k: remap[v] for k, v in getattr(g, name).items()})
    return dce(out)


__all__ = ["thin_grads"]
