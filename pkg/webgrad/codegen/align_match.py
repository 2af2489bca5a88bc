"""The alignment pass: vocabulary-wide products computed on padded columns, for WebGPU.

`program.lower` runs `align_products(graph, limits)` before fusion (after the row pass)
on adapters whose tiling row (matmul.ADAPTER_TILINGS) has an "align" entry (A, MIN,
ROWS). A matmul whose output has N >= MIN columns, N not a multiple of A, and at least
ROWS rows (all its other axes together: a decoding step's logits, one row, would pay the
padded copy of the head for nothing) reads its B operand padded with zero columns up to
the next multiple of A, and its readers see the first N columns of the padded product
through a slice (a view: no copy). The LM head of a GPT-2 step:

  logits  = x @ W               -> slice(x @ pad(W))           W: [d, 50257] -> [d, 50304]
  dW      = sum_b(x_b^T @ dl_b)   -> slice(sum_b(x_b^T @ pad(dl)))   (the slice after the
                                                                    batch sum it feeds)
  dx      = dl @ W^T              -> slice(pad(dl)) @ W^T        dl stored once, padded

Rows of 50257 floats start unaligned, so the tiles read them a float at a time and test
every column against N; padded, they are read as vec4 and the tiles of the last column
are whole. H200 through Dawn, 2026-12-01 (bench/README.md): [4096 x 768] @ [768 x N] 8.12
ms at N = 50257 against 7.37 at 50304, the weight gradient [768 x 4096] @ [4096 x N]
7.70 against 7.05; in the GPT-2 step 96.2 -> 95.1 ms (tied head: 95.7 -> 95.2). The
costs (+0.8 ms of elementwise kernels in that step): W copied to its padded form each
step, and the weight gradient's optimizer update no longer fused into the product (its
domain is the sliced one). A pad of an operand that another matmul reads as A (its K axis) serves that read
too, through a slice, so the tensor is not stored twice. The reference and torch
executors keep the plain IR; the padded columns are zeros, so the products' first N
columns are the same sums.
"""
from __future__ import annotations

from math import prod

from ..dce import dce
from ..ir import Graph, Node
from .matmul import adapter_tiling

FORCE_ALIGN: tuple[int, int, int] | None = None  # tests: (A, MIN, ROWS) on any adapter


def _align(limits) -> tuple[int, int, int] | None:
    if FORCE_ALIGN is not None:
        return FORCE_ALIGN
    return adapter_tiling(str(getattr(limits, "adapter", "") or "")).get("align")


def align_products(g: Graph, limits) -> Graph:
    """The graph with every qualifying product computed on padded columns (else g)."""
    rule = _align(limits)
    if not rule:
        return g
    A, MIN, ROWS = rule

    def wide(n: Node) -> bool:
        return (n.op == "matmul" and n.shape[-1] >= MIN and n.shape[-1] % A != 0
                and prod(n.shape[:-1]) >= ROWS)
    cons = g.consumers()
    padded: dict[int, int] = {}  # B operand -> its padded width
    for n in g.nodes:
        if wide(n):
            padded[n.inputs[1]] = -(-n.shape[-1] // A) * A
    if not padded:
        return g
    # a sum over leading (batch) axes of such a product takes the slice after it
    def batch_sum(s: Node, mm: Node) -> bool:
        return s.op == "sum" and len(mm.shape) - 1 not in s.attrs["axes"]

    out = Graph(seed=g.seed, training=g.training)
    remap: dict[int, int] = {}
    pad_of: dict[int, int] = {}  # original tensor -> its padded copy in `out`
    mm_padded: dict[int, int] = {}  # original product -> the padded product in `out`

    def add(op, ins, shape, dtype, attrs, loc) -> int:
        i = len(out.nodes)
        out.nodes.append(Node(i, op, tuple(ins), tuple(shape), dtype, dict(attrs), loc))
        return i

    def sliced(x: int, width: int, loc) -> int:
        shape = out[x].shape
        ax = len(shape) - 1
        return add("slice", [x], shape[:-1] + (width,), out[x].dtype,
                   {"axis": ax, "start": 0, "stop": width}, loc)

    for n in g.nodes:
        ins = [remap[x] for x in n.inputs]
        if wide(n):
            b = n.inputs[1]
            if b not in pad_of:
                bs = out[remap[b]].shape
                pad_of[b] = add("pad", [remap[b]], bs[:-1] + (padded[b],), out[remap[b]].dtype,
                                {"axis": len(bs) - 1, "before": 0,
                                 "after": padded[b] - bs[-1]}, n.loc)
            mm = add("matmul", [ins[0], pad_of[b]], n.shape[:-1] + (padded[b],), n.dtype,
                     n.attrs, n.loc)
            mm_padded[n.id] = mm
            remap[n.id] = sliced(mm, n.shape[-1], n.loc)
            continue
        if n.op == "matmul" and n.inputs[0] in pad_of:
            # A read along K from a tensor that is padded anyway: through the padded copy
            ins[0] = sliced(pad_of[n.inputs[0]], g[n.inputs[0]].shape[-1], n.loc)
        elif n.op == "matmul" and n.inputs[0] in padded and n.inputs[0] not in pad_of \
                and any(g[c].op == "matmul" and g[c].inputs[1] == n.inputs[0]
                        and c > n.id for c in cons[n.inputs[0]]):
            # the B reader comes later in the graph: pad now so that both share it
            a = n.inputs[0]
            s = out[remap[a]].shape
            pad_of[a] = add("pad", [remap[a]], s[:-1] + (padded[a],), out[remap[a]].dtype,
                            {"axis": len(s) - 1, "before": 0, "after": padded[a] - s[-1]}, n.loc)
            ins[0] = sliced(pad_of[a], s[-1], n.loc)
        src = n.inputs[0] if n.inputs else None
        if src in mm_padded and batch_sum(n, g[src]):
            # the batch sum of a padded product sums the padded product, then slices
            mp = mm_padded[src]
            s = add("sum", [mp], n.shape[:-1] + (out[mp].shape[-1],), n.dtype, n.attrs, n.loc)
            remap[n.id] = sliced(s, n.shape[-1], n.loc)
            continue
        remap[n.id] = add(n.op, ins, n.shape, n.dtype, n.attrs, n.loc)
    for name in ("inputs", "params", "state", "outputs", "writebacks"):
        setattr(out, name, {k: remap[v] for k, v in getattr(g, name).items()})
    return dce(out)


__all__ = ["FORCE_ALIGN", "align_products"]
