"""The alignment pass: vocabulary-wide products computed on padded columns, for WebGPU.

`program.lower` runs `align_products(graph, limits)` before fusion (after the row pass)
on adapters whose tiling row (matmul_config.ADAPTER_TILINGS) has an "align" entry (A, MIN,
ROWS). A matmul whose output has N >= MIN columns, N not a multiple of A, and at least
ROWS rows (all its other axes together: a decoding step's logits, one row, would pay the
padded copy of the head for nothing) reads its B operand padded with zero columns up to
the next multiple of A, and its readers see the first N columns of the padded product
through a slice (a view: no copy). The LM head of a GPT-2 step:

  logits  = x @ W               -> slice(x @ pad(W))           W: [d, 50257] -> [d, 50304]
  f16(x @ W)                    -> slice(f16(x @ pad(W)))      (precision="mixed")
  dW      = sum_b(x_b^T @ dl_b)   -> slice(sum_b(x_b^T @ pad(dl)))   (the slice after the
                                                                    batch sum it feeds)
  dx      = dl @ W^T              -> pad(dl) @ pad(W)^T          K = 50304: zeros times zeros

Rows of 50257 floats start unaligned, so the tiles read them a float at a time and test
every column against N; padded, they are read as vec4 and the tiles of the last column
are whole. H200 through Dawn, 2026-12-01 (bench/README.md): [4096 x 768] @ [768 x N] 8.12
ms at N = 50257 against 7.37 at 50304, the weight gradient [768 x 4096] @ [4096 x N]
7.70 against 7.05; in the GPT-2 step 96.2 -> 95.1 ms (tied head: 95.7 -> 95.2). The
costs (+0.8 ms of elementwise kernels in that step): W copied to its padded form each
step, and the weight gradient's optimizer update no longer fused into the product (its
domain is the sliced one). A matmul reading a padded tensor as A (along its K axis) reads
the padded copy whole where its B is the transpose of a padded tensor (the untied head's
W^T) or a tensor whose transpose is padded (a tied head's token table): the input
gradient [4096 x 50257] @ [50257 x 768] 8.39 ms, over K = 50304 7.72; where B is a cast to
f16 (precision="mixed" rounds W^T into a tensor of its own) that copy is padded with zero
rows instead, so the product runs on the subgroup-matrix kernel over K = 50304; else it
reads A through a slice of the padded copy, so the tensor is stored once. The reference and torch
executors keep the plain IR; the padded entries are zeros, so the products' first N
columns are the same sums.
"""
from __future__ import annotations

from math import prod

from ..dce import dce
from ..ir import Graph, Node
from .kinds import VIEW_OPS
from .layout import swaps_last_two
from .matmul_config import adapter_tiling


def _align(limits) -> tuple[int, int, int] | None:
    forced = limits.options.force_align  # KernelOptions (tests): (A, MIN, ROWS) on any adapter
    if forced is not None:
        return forced
    return adapter_tiling(str(getattr(limits, "adapter", "") or ""), limits.options).get("align")


def _quantized(g: Graph, n: int) -> bool:
    """Is n (through views) a dequantize? Its matmul reads the quantized words in
    registers (codegen/quant.py); a padded copy would store the weights as f32."""
    while g[n].op in VIEW_OPS:
        n = g[n].inputs[0]
    return g[n].op == "dequantize"


def flat_view(g: Graph, n: Node) -> bool:
    """Is n a reshape that keeps the last axis (merges or splits the leading ones)?"""
    return n.op == "reshape" and bool(n.shape) and n.shape[-1:] == g[n.inputs[0]].shape[-1:]


def align_products(g: Graph, limits) -> Graph:
    """The graph with every qualifying product computed on padded columns (else g)."""
    rule = _align(limits)
    if not rule:
        return g
    A, MIN, ROWS = rule

    def rounded(b: int) -> bool:  # a cast to f16 (precision.f16_in_f32 keeps its attrs)
        return g[b].op == "cast" and g[b].attrs.get("dtype") == "f16"

    def wide(n: Node) -> bool:
        # fewer rows qualify where B is rounded to f16 by a kernel of its own anyway (the
        # folded weight gradient of precision="mixed": 768 rows over K = 4096), which
        # then writes the zero columns too
        if n.op != "matmul":
            return False
        b = n.inputs[1]
        return (n.shape[-1] >= MIN and n.shape[-1] % A != 0
                and (prod(n.shape[:-1]) >= ROWS
                     or rounded(g[b].inputs[0] if flat_view(g, g[b]) else b))
                and not _quantized(g, b))
    cons = g.consumers()
    padded: dict[int, int] = {}  # B operand -> its padded width
    for n in g.nodes:
        if wide(n):
            padded[n.inputs[1]] = -(-n.shape[-1] // A) * A
    if not padded:
        return g
    # a reshape of leading axes pads as its source does (the weight gradient's B, the
    # [B * T, N] rows of the logit gradient whose [B, T, N] form the input gradient reads)
    for x, w in list(padded.items()):
        if flat_view(g, g[x]):
            padded.setdefault(g[x].inputs[0], w)
    # a sum over leading (batch) axes of such a product takes the slice after it
    def batch_sum(s: Node, mm: Node) -> bool:
        return s.op == "sum" and len(mm.shape) - 1 not in s.attrs["axes"]

    out = Graph(seed=g.seed, training=g.training)
    remap: dict[int, int] = {}
    pad_of: dict[int, int] = {}  # original tensor -> its padded copy in `out`
    mm_padded: dict[int, int] = {}  # original product -> the padded product in `out`

    add = out.add

    def pad(x: int, loc) -> int:
        """The padded copy of original tensor x (made once; a reshape of leading axes
        the same view of its source's)."""
        if x not in pad_of and flat_view(g, g[x]) and padded.get(g[x].inputs[0]) == padded[x]:
            src = pad(g[x].inputs[0], loc)
            shape = g[x].shape[:-1] + (padded[x],)
            pad_of[x] = add("reshape", [src], shape, out[src].dtype, {"shape": shape}, loc)
        if x not in pad_of:
            s = out[remap[x]].shape
            pad_of[x] = add("pad", [remap[x]], s[:-1] + (padded[x],), out[remap[x]].dtype,
                            {"axis": len(s) - 1, "before": 0, "after": padded[x] - s[-1]}, loc)
        return pad_of[x]

    def sliced(x: int, width: int, loc) -> int:
        shape = out[x].shape
        ax = len(shape) - 1
        return add("slice", [x], shape[:-1] + (width,), out[x].dtype,
                   {"axis": ax, "start": 0, "stop": width}, loc)

    def k_padded_b(b: int, width: int):
        """B [.., K, N] as the transpose of a padded [.., N, Kp] copy: B itself a transpose
        of a padded tensor (the untied head: W^T), or a tensor whose transpose is padded
        (the tied head: the token table). None when neither."""
        bn = g[b]
        if swaps_last_two(bn) and padded.get(bn.inputs[0]) == width:
            src = bn.inputs[0]
        else:
            src = next((c for c in cons[b] if c in remap and swaps_last_two(g[c])
                        and padded.get(c) == width), None)
        if src is None:
            return None
        tp = pad(src, bn.loc)
        s = out[tp].shape
        r = len(s)
        return add("transpose", [tp], s[:-2] + (s[-1], s[-2]), bn.dtype,
                   {"perm": (*range(r - 2), r - 1, r - 2)}, bn.loc)

    for n in g.nodes:
        ins = [remap[x] for x in n.inputs]
        if wide(n):
            mm = add("matmul", [ins[0], pad(n.inputs[1], n.loc)],
                     n.shape[:-1] + (padded[n.inputs[1]],), n.dtype, n.attrs, n.loc)
            mm_padded[n.id] = mm
            remap[n.id] = sliced(mm, n.shape[-1], n.loc)
            continue
        a = n.inputs[0] if n.inputs else None
        if rounded(n.id) and a in mm_padded:
            # the f16 rounding of a padded product (precision="mixed": the logits) rounds
            # the padded product and slices that: the product's kernel stores f16 (half
            # the bytes of the f32 product the slice would otherwise keep)
            mp = mm_padded[a]
            c = add("cast", [mp], out[mp].shape, n.dtype, n.attrs, n.loc)
            remap[n.id] = sliced(c, n.shape[-1], n.loc)
            continue
        if n.op == "matmul" and a in padded:
            # A read along K from a tensor padded for another product: K padded too where
            # B's rows can be padded the same way (both pads are zeros: the same sums),
            # else A through a slice of the padded copy (the tensor is stored once)
            kb = k_padded_b(n.inputs[1], padded[a])
            if kb is None and rounded(n.inputs[1]):
                # B is an f16 copy already (precision="mixed": the head's W^T rounded, a
                # tensor of its own): the copy takes the zero rows, so that both operands
                # are whole and row-major (the subgroup-matrix kernel, matmul_mma.py)
                s = out[ins[1]].shape
                kb = add("pad", [ins[1]], s[:-2] + (padded[a], s[-1]), out[ins[1]].dtype,
                         {"axis": len(s) - 2, "before": 0, "after": padded[a] - s[-2]}, n.loc)
            if kb is not None:
                remap[n.id] = add("matmul", [pad(a, n.loc), kb], n.shape, n.dtype, n.attrs, n.loc)
                continue
            ins[0] = sliced(pad(a, n.loc), g[a].shape[-1], n.loc)
        if a in mm_padded and batch_sum(n, g[a]):
            # the batch sum of a padded product sums the padded product, then slices
            mp = mm_padded[a]
            s = add("sum", [mp], n.shape[:-1] + (out[mp].shape[-1],), n.dtype, n.attrs, n.loc)
            remap[n.id] = sliced(s, n.shape[-1], n.loc)
            continue
        remap[n.id] = add(n.op, ins, n.shape, n.dtype, n.attrs, n.loc)
    for name in ("inputs", "params", "state", "outputs", "writebacks"):
        setattr(out, name, {k: remap[v] for k, v in getattr(g, name).items()})
    return dce(out)


__all__ = ["align_products"]
