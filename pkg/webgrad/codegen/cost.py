"""The cost model of a kernel: the bytes it moves and the FLOPs it computes, from fusion's groups.

program.py records one row per dispatch at lowering (`Lowered.kernels`); the profiler
(../profile.py) divides them by the measured GPU time. The model:
  bytes       compulsory global traffic: every stored tensor the kernel reads counted once
              (an op whose Cost `narrows`, slice and gather_rows, only for the elements it
              selects), plus what it writes (a write_rows in place: its new rows, not the
              target it writes them into); tiles re-read through caches are not counted,
              so achieved GB/s is a floor
  flops       each covered node's FLOP rule, from its row in the registry (primitives.Cost:
              2 M N K per matmul, batch included; one per element of an elementwise op and
              per input element of a reduction; 5 per element of a row op; none for free
              ops, layout and leaves; a fused attention kernel 2 x (kept query-key pairs) x
              (the widths of its products), attention_match.py). An op without a rule is
              an error (kinds.cost_of), not a guess.
"""
from __future__ import annotations

from .kinds import cost_of


def node_flops(g, node) -> int:
    """FLOPs of computing `node` once over its whole shape (its Cost's rule)."""
    return cost_of(node.op).flops([g[i] for i in node.inputs], node)


def group_cost(fu, gid: int, stored_outputs) -> dict:
    """{'nodes', 'ops', 'bytes', 'flops'} of fusion group `gid` (codegen/fusion.py), whose
    stored outputs are `stored_outputs`."""
    g, G = fu.g, fu.groups[gid]
    inside = set(G.anchors)
    covered: list[int] = []
    reads: dict[int, int] = {}  # stored tensor -> elements read (at most its size)
    seen: dict[int, int] = {}
    stack = [(a, g[a].size) for a in G.anchors]
    def rows_only(n):  # a write_rows in place: reads its new rows and start, writes the rows
        return g[n].op == "write_rows" and n in fu.inplace
    if G.main is not None:
        covered.append(G.main)
        stack += [(i, g[i].size) for i in g[G.main].inputs[rows_only(G.main):]]
    for r in G.rows:  # write_rows stored by the epilogue (fusion rule 9)
        stack += [(i, g[i].size) for i in g[r].inputs[1:]]
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
        narrows = cost_of(node.op).narrows
        for i in node.inputs:
            stack.append((i, count if narrows else g[i].size))
    covered = sorted(set(covered))
    folded = fu.matmul_fold.get(G.main) if G.main is not None else None
    flops = sum(node_flops(g, g[n]) for n in covered if n != G.main or folded is None)
    written = [g[g[n].inputs[1]] if rows_only(n) else g[n] for n in [*stored_outputs, *G.rows]]
    nbytes = 4 * (sum(reads.values()) + sum(n.size for n in written))
    ops = ([g[G.main].op] if G.main is not None else []) + [
        g[n].op for n in covered if not cost_of(g[n].op).free and n != G.main]
    return {"nodes": covered, "ops": "+".join(dict.fromkeys(ops)) or "copy", "bytes": nbytes,
            "flops": flops}
