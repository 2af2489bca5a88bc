"""Low-rank products in another product's epilogue (fusion_storage._lowrank, rule 1's one
exception): a matmul over K <= LOWRANK_K (a LoRA adapter's (x A^T) B^T, whose x A^T is
stored [T, r]; its backward's (dY B) A) that is added elementwise to a larger product's
output at the same index is no kernel of its own but an expression, computed where it is
read: in that product's epilogue, y = x W^T + u B^T, each output summing its row of u
against its column of B (K multiply-adds, its operands read through the expression rules,
so a transposed B is just its index). Rule 3 then merges the sum into the larger product's
kernel, which ever kernel form that is (tiled, matrix-vector, barrier-free, a split
product's chunk sum).

KernelOptions.lowrank_epilogue: None (GPU adapters), True (any adapter), False (never: the
default, measured slower on the H200, options.py).
"""
from __future__ import annotations

from .emit import Idx, rule
from .kinds import ELEMENTWISE_OPS
from .wgsl import u32_lit

LOWRANK_K = 16  # the largest K computed in a reader's epilogue


@rule("matmul")
def _matmul_expr(em, node, idx: Idx) -> str:
    """C[.., m, n] = sum_k A[.., m, k] B[.., k, n], batch axes broadcast; k in order, as
    the kernels' accumulators add (f32)."""
    a, b = (em.g[i] for i in node.inputs)
    dims = idx.dims(em)
    r = len(node.shape)

    def at(shape, last2):
        lead = len(shape) - 2
        batch = [u32_lit(0) if shape[j] == 1 else dims[r - 2 - lead + j] for j in range(lead)]
        return Idx(tuple(shape), dims=batch + last2)

    terms = []
    for k in range(a.shape[-1]):
        kk = u32_lit(k)
        x = em.value(a.id, at(a.shape, [dims[-2], kk]))
        y = em.value(b.id, at(b.shape, [kk, dims[-1]]))
        terms.append(f"{x} * {y}")
    return " + ".join(terms) if len(terms) > 1 else terms[0]


def small_product(g, n) -> bool:
    node = g[n]
    return (node.op == "matmul" and g[node.inputs[0]].shape[-1] <= LOWRANK_K
            and node.dtype == "f32" and all(g[i].dtype == "f32" for i in node.inputs))


def _products_under(g, n, size, depth=4):
    """The matmuls that n reads at its own index (through at most `depth` elementwise ops
    and reshapes of one size: a bias added to the base product first)."""
    node = g[n]
    if node.size != size:
        return []
    if node.op == "matmul":
        return [n]
    if depth == 0 or (node.op not in ELEMENTWISE_OPS and node.op != "reshape"):
        return []
    return [p for i in node.inputs for p in _products_under(g, i, size, depth - 1)]


def lowrank_products(g, cons, roots) -> set[int]:
    """The small products (small_product) that are computed in a reader's epilogue: every
    reader an elementwise op or reshape of the same size, and through them (at most 4 steps)
    an add whose other input is (an elementwise chain of) a product over a larger K (or
    the same K, traced earlier): the product whose epilogue computes it."""
    out = set()
    for node in g.nodes:
        n = node.id
        if not small_product(g, n) or n in roots or not cons[n]:
            continue
        K = g[node.inputs[0]].shape[-1]
        ok, found, front, seen = True, False, [n], {n}
        for _ in range(4):
            nxt = []
            for x in front:
                for c in cons[x]:
                    op = g[c]
                    if op.size != node.size or (op.op not in ELEMENTWISE_OPS and op.op != "reshape"):
                        if x == n:
                            ok = False
                        continue
                    if op.op == "add":
                        for i in op.inputs:
                            if i == x:
                                continue
                            for p in _products_under(g, i, node.size):
                                kp = g[g[p].inputs[0]].shape[-1]
                                if p not in out and (kp > K or (kp == K and p < n)):
                                    found = True
                    if c not in seen:
                        seen.add(c)
                        nxt.append(c)
            front = nxt
        if ok and found:
            out.add(n)
    return out
