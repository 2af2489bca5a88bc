"""Sibling thin products merged into one, so their shared operand is read once.

`program.lower` runs `thin_siblings(graph, limits)` before fusion, after `thin_grads`.
LoRA's adapters on q, k and v each multiply the same normalized activations x by their
own down-projection (gate's and up's likewise):

  x @ A_q^T, x @ A_k^T, x @ A_v^T              three [T, in] @ [in, r] products

Each of those products reads all of x for 16 columns (on an H200, 64 workgroups of 32
rows, 40 us for the 16 MiB of a 4 x 512 x 2048 x). Computed as

  y = x @ concat(A_q^T, A_k^T, A_v^T)           one [T, in] @ [in, 3r] product
  x @ A_q^T = y[..., 0:r]   (slices: strided views that the readers' kernels read)

x is read once; the concatenated B is a small elementwise kernel of its own ([in, 3r]).
On the table's tiles (thin_split=0) the merged product is no longer thin (matmul_config's
rule for split_thin): over K = 2048 on an H200 it splits in 4 chunks, which measured faster
than unsplit 32 x 32 tiles (bench/README.md: the 1B LoRA step 269.3 ms against 270.1
without the pass); thin_config (thin_side 48) takes it like the other thin products.
The pass merges the matmuls that read the same A node with a 2-D B of the same K and
dtype (weights, not batched operands), each of at most KernelOptions.split_thin columns,
where KernelOptions.thin_siblings asks (None: on GPUs). The merged product is computed
where the first sibling was, so a B that a later product computes keeps its own product.
Not merged: the factor gradients that share their B (dA_q, dA_k, dA_v all read x): their
AdamW updates would read them through slices, out of the products' epilogues (thin_grads).
"""
from __future__ import annotations

from ..dce import dce
from ..ir import Graph


def _groups(g: Graph, thin: int) -> list[list[int]]:
    """Lists (two or more, in graph order) of thin products that share their A node."""
    by_a: dict[tuple, list[int]] = {}
    for n in g.nodes:
        if n.op != "matmul" or len(g[n.inputs[1]].shape) != 2 or n.shape[-1] > thin:
            continue
        a, b = g[n.inputs[0]], g[n.inputs[1]]
        key = (a.id, b.shape[0], b.dtype, n.dtype, repr(sorted(n.attrs.items())))
        by_a.setdefault(key, []).append(n.id)
    return [ids for ids in by_a.values() if len(ids) > 1]


def _hoistable(g: Graph, group: list[int]) -> list[int]:
    """The members whose B can be computed where the first is: from nodes before it and
    products of none after it (weights: a param's transpose, its f16 cast)."""
    first, keep = group[0], [group[0]]
    for m in group[1:]:
        seen, stack = set(), [g[m].inputs[1]]
        while stack:
            x = stack.pop()
            if x >= first and x not in seen and g[x].op != "matmul":
                seen.add(x)
                stack.extend(g[x].inputs)
            elif x >= first and g[x].op == "matmul":
                break
        else:
            keep.append(m)
    return keep


def thin_siblings(g: Graph, limits) -> Graph:
    """g with each group of sibling thin products computed as one (else g)."""
    opts = limits.options
    want = opts.thin_siblings
    if want is False or (want is None and limits.cpu) or not opts.split_thin:
        return g
    groups = [m for m in (_hoistable(g, ids) for ids in _groups(g, opts.split_thin))
              if len(m) > 1]
    if not groups:
        return g
    first_of = {grp[0]: grp for grp in groups}
    member = {m for grp in groups for m in grp}
    out = Graph(seed=g.seed, training=g.training)
    remap: dict[int, int] = {}

    def emit(x: int) -> int:
        """x in `out`, its inputs first (a later sibling's B, hoisted to the first one)."""
        if x not in remap:
            n = g[x]
            ins = [emit(i) for i in n.inputs]
            remap[x] = out.add(n.op, ins, n.shape, n.dtype, n.attrs, n.loc)
        return remap[x]
    for n in g.nodes:
        if n.id in remap:
            continue
        if n.id in first_of:
            grp = first_of[n.id]
            bs = [emit(g[m].inputs[1]) for m in grp]
            widths = [g[m].shape[-1] for m in grp]
            k = g[n.inputs[1]].shape[0]
            cat = out.add("concat", bs, (k, sum(widths)), g[n.inputs[1]].dtype, {"axis": 1},
                          n.loc)
            ax = len(n.shape) - 1
            y = out.add("matmul", [emit(n.inputs[0]), cat], n.shape[:-1] + (sum(widths),),
                        n.dtype, n.attrs, n.loc)
            start = 0
            for m, w in zip(grp, widths):
                remap[m] = out.add("slice", [y], g[m].shape, g[m].dtype,
                                   {"axis": ax, "start": start, "stop": start + w}, g[m].loc)
                start += w
            continue
        assert n.id not in member, "a sibling is emitted with the first of its group"
        emit(n.id)
    for name in ("inputs", "params", "state", "outputs", "writebacks"):
        setattr(out, name, {k: remap[v] for k, v in getattr(g, name).items()})
    return dce(out)


__all__ = ["thin_siblings"]
