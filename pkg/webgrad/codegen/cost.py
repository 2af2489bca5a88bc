"""The cost model of a kernel: the bytes it moves and the FLOPs it computes, from fusion's groups.

program.py records one row per dispatch at lowering (`Lowered.kernels`); the profiler
(../profile.py) divides them by the measured GPU time. The model:
  bytes       compulsory global traffic: every stored tensor the kernel reads counted once
              (a slice or gather only for the elements it selects), plus what it writes;
              tiles re-read through caches are not counted, so achieved GB/s is a floor
  flops       2 M N K per matmul (batch included), one per element per elementwise op and
              per input element of a reduction, 5 per element of a row op (softmax,
              log-softmax, layer norm); layout ops are free; a fused attention kernel
              2 x (kept query-key pairs) x (the widths of its products)
"""
from __future__ import annotations

from math import prod

from .attention_match import attention_flops
from .reduce import REDUCE_OPS, ROW_OPS

ROW_FLOPS = 5  # per element of softmax / log-softmax / layer norm (max, exp, sum, scale...)
_FREE = {"transpose", "broadcast_to", "slice", "reshape", "const", "arange", "cast",
         "input", "param", "state", "pad", "concat"}


def node_flops(g, node) -> int:
    """FLOPs of computing `node` once over its whole shape (the model in the header)."""
    if node.op == "matmul":
        return 2 * prod(node.shape) * g[node.inputs[0]].shape[-1]
    if node.op in REDUCE_OPS:
        return g[node.inputs[0]].size
    if node.op in ROW_OPS:
        return ROW_FLOPS * node.size
    if node.op in _FREE:
        return 0
    if node.op.startswith("attn_"):
        return attention_flops(g, node)
    return node.size


def group_cost(fu, gid: int, stored_outputs) -> dict:
    """{'nodes', 'ops', 'bytes', 'flops'} of fusion group `gid` (codegen/fusion.py), whose
    stored outputs are `stored_outputs`."""
    g, G = fu.g, fu.groups[gid]
    inside = set(G.anchors)
    covered: list[int] = []
    reads: dict[int, int] = {}  # stored tensor -> elements read (at most its size)
    seen: dict[int, int] = {}
    stack = [(a, g[a].size) for a in G.anchors]
    if G.main is not None:
        covered.append(G.main)
        stack += [(i, g[i].size) for i in g[G.main].inputs]
    while stack:
        n, count = stack.pop()
        node = g[n]
        count = min(count, node.size)
        if n != G.main and fu.has_storage(n) and n not in inside:
            reads[n] = max(reads.get(n, 0), count)
            continue
        if seen.get(n, -1) >= count:
            continue
        if n not in seen:
            covered.append(n)
        seen[n] = count
        # a slice or gather reads only what it selects; everything else its whole input
        narrows = node.op in ("slice", "gather_rows")
        for i in node.inputs:
            stack.append((i, count if narrows else g[i].size))
    covered = sorted(set(covered))
    folded = fu.matmul_fold.get(G.main) if G.main is not None else None
    flops = sum(node_flops(g, g[n]) for n in covered if n != G.main or folded is None)
    nbytes = 4 * (sum(reads.values()) + sum(g[n].size for n in stored_outputs))
    ops = ([g[G.main].op] if G.main is not None else []) + [
        g[n].op for n in covered if g[n].op not in _FREE and n != G.main]
    return {"nodes": covered, "ops": "+".join(dict.fromkeys(ops)) or "copy", "bytes": nbytes,
            "flops": flops}
