"""Fusion's rule 8: normalized rows are not stored where the matrix-vector products that
read them can compute them (codegen/gemv_prologue.py says how the kernel does it and why).

`row_prologues(fu)` runs in fusion.Fusion's constructor twice: before rule 2's cost and
binding tests, which then store none of the chains' nodes that read the sum (a Llama's
residual stream is an expression of every earlier product: the binding test stored
x * rsqrt(..) there, and the chain then read no sum) and with store_rows' rows stored,
and after the storage rules, before the groups form, for the plan. A matmul's A operand
`a` qualifies when
  - every reader of `a` is such a product (A = a, B another tensor) that takes the GPU
    matrix-vector kernel (matmul_config: cfg.gemv, not the CPU form), C's rows A's rows;
  - a is an f32 expression of stored tensors and of exactly one sum s (over the last axis
    of another expression), read along A's rows (row r of A reads row r of s: between a
    and s only elementwise ops, broadcasts and reshapes adding or dropping size-1 axes);
  - nothing outside a's chain reads s or a part of the chain that depends on s, and neither
    a nor s is an output or written back.
Then neither a nor s is stored: s's kernel and a's elementwise kernel are not emitted.
KernelOptions.gemv_prologue: None (GPUs only), True (any adapter the workgroup form runs
on: tests on lavapipe with force_gemv), False (never).
"""
from __future__ import annotations

from .emit import EXPR_RULES
from .gemv_prologue import RowOperand, input_axes
from .kinds import ELEMENTWISE_OPS, KERNEL_OPS
from .matmul import b_k_fast, matmul_dims
from .matmul_config import gemv_cpu_form, group_config

_VIEWS = ("reshape", "broadcast_to")   # followed with their axes (input_axes)


def row_prologues(fu) -> dict[int, RowOperand]:
    """{matmul node: its A's RowOperand} for every product whose A is not stored (rule 8)."""
    g, limits = fu.g, fu.limits
    want = limits.options.gemv_prologue
    if want is False or (want is None and limits.cpu) or gemv_cpu_form(limits):
        return {}
    roots = {fu.storage_base(r) for r in g.roots()}
    out: dict[int, RowOperand] = {}
    seen: set[int] = set()
    for n in g.nodes:
        if n.op != "matmul" or n.inputs[0] in seen:
            continue
        a = n.inputs[0]
        seen.add(a)
        if not all(_gemv_reader(fu, u, a) for u in fu.cons[a]):
            continue
        op = _chain(fu, a, roots)
        if op is not None:
            out.update((u, op) for u in fu.cons[a])
    return out


def store_rows(fu, ops) -> set[int]:
    """The expressions of rule 8's chains to store before rule 2 runs: each input of a
    chain's part that reads the sum, where that input is an expression of two or more
    stored tensors, one of them a kernel's output of its size read at its index (a Llama's
    residual stream, x + o_proj(..) + down_proj(..)): stored, it joins that kernel's
    epilogue (rule 3), and the products read one tensor as they read A instead of
    recomputing the stream in their inner loop. (A lone gather, the first layer's token
    rows, joins no kernel: it stays an expression.)"""
    g, out = fu.g, set()
    for op in ops:
        for n in op.dep | {op.a}:
            for i in g[n].inputs:
                if i in op.dep or i == op.s or fu.has_storage(i) or g[i].op == "const":
                    continue
                loads = fu.stored_reads([(i, True)])
                ident = any(True in ats and m in fu.mat and g[m].size == g[i].size
                            for m, ats in loads.items())
                if len(loads) >= 2 and ident:
                    out.add(i)
    return out


def _gemv_reader(fu, u: int, a: int) -> bool:
    """Is node u a product of A = a that takes the GPU matrix-vector kernel?"""
    g = fu.g
    node = g[u]
    if node.op != "matmul" or node.inputs[0] != a or node.inputs[1] == a:
        return False
    if u in fu.matmul_fold.values() or g[a].shape[:-1] != node.shape[:-1]:
        return False
    M, K, N, nb, shared_b = matmul_dims(g, fu, u)
    cfg = group_config(fu.limits, M, K, N, nb, shared_b, b_k_fast(g, fu, u))
    return cfg is not None and cfg.gemv


def _chain(fu, a: int, roots) -> RowOperand | None:
    g = fu.g
    A = g[a]
    if (a not in fu.mat or a in fu.stored or a in roots or A.op not in EXPR_RULES
            or A.op in KERNEL_OPS  # a kernel's output (a product has a rule too: lowrank.py)
            or A.dtype != "f32"):
        return None
    kax = len(A.shape) - 1
    rows = [m for m, d in enumerate(A.shape[:-1]) if d != 1]
    # a's chain: node -> the axes of A each read of it runs along (None: not followed,
    # under an op that is no elementwise op or view of size-1 axes: a gather, a slice)
    inner: dict[int, set] = {}
    sums: dict[int, set] = {}   # stored row sums the chain reads -> the axes of those reads
    stack = [(a, tuple(None if d == 1 else m for m, d in enumerate(A.shape)))]
    while stack:
        n, ax = stack.pop()
        node = g[n]
        if n != a and fu.has_storage(n) and not _rounded_sum(fu, n):
            if node.op == "sum":
                sums.setdefault(n, set()).add(ax)
            continue
        if ax in inner.setdefault(n, set()):
            continue
        inner[n].add(ax)
        ins = None
        if ax is not None and (node.op in ELEMENTWISE_OPS or node.op in _VIEWS):
            ins = input_axes(g, node, ax)
        stack.extend(zip(node.inputs, ins or [None] * len(node.inputs)))
    if len(sums) != 1:
        return None
    (s, reads), = sums.items()
    y = g[g[s].inputs[0]]
    if (s in fu.sum_source or s in roots or y.dtype != "f32" or _not_a_row_sum(g[s], y)
            or any(ax is None or [m for m in ax if m is not None] != rows for ax in reads)):
        return None
    dep = set()   # the chain's nodes that read s
    for n in sorted(inner):
        if any(i == s or i in dep for i in g[n].inputs):
            dep.add(n)
    if any(c not in inner for n in dep | {s} if n != a for c in fu.cons[n]):
        return None   # s is needed outside the chain: keep it stored
    hoist = tuple((n, min(inner[n], key=str)) for n in sorted(dep)
                  if all(ax is not None and kax not in ax for ax in inner[n]))
    return RowOperand(a, s, hoist, frozenset(dep - {a}))


def _rounded_sum(fu, n: int) -> bool:
    """Is stored node n a sum's only reader, its f16 rounding (precision="f16": the sum's
    kernel would store it rounded, fusion_storage._half_results)? The chain then reads
    through it: the product rounds the sum as it computes it."""
    node = fu.g[n]
    return node.op == "cast" and node.attrs.get("dtype") == "f16" \
        and fu.g[node.inputs[0]].op == "sum" and fu.cons[node.inputs[0]] == [n]


def _not_a_row_sum(s, y) -> bool:
    """Is sum s anything but a sum of y over its last axis?"""
    return tuple(s.attrs["axes"]) != (len(y.shape) - 1,) or s.shape != y.shape[:-1]


__all__ = ["row_prologues", "store_rows"]
