"""Rematerialisation: expressions recomputed by their readers instead of stored.

Fusion's rule 2 (fusion.py) stores an expression that is costly and read by several kernels,
so that it is computed once. In a training step that choice can cost memory for nothing: the
tanh of a GELU is read by its forward kernel and by the backward one, and its only input,
the pre-activation, is kept for the backward anyway. Storing the tanh then keeps a second
tensor of the same size alive from the forward to the backward (an eighth of the GPT bench's
activations at 64 x 256), to save a few ALU operations per element in one backward kernel.

`remat_candidates(fu)` names the expressions whose storage buys only that: stored by the
cost test alone (not as a matmul operand, an output or to bound a kernel's bindings), every
reader reads them at its own index or through permuting views (so each recomputes an
element once: _read_once), every stored
tensor they are computed from stays live at least as long as they would (so recomputing
extends no lifetime), and each reader loads all of those tensors already but at most one
(which it then loads instead of the expression: no more bytes or bindings than before).
`plan_fusion` (program.py's fusion) then plans the graph again with those expressions left
as expressions (Fusion(remat=...)); the whole of fusion runs again, so in-place writebacks
see the new readers of a parameter an expression was computed from. Measured on the GPT
bench's H200 plan (bench/README.md, memory_plan.py): 6791 -> 6247 MiB at 64 x 256.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..buffers import END
from .kinds import ELEMENTWISE_OPS


def _expression_loads(fu, e: int) -> set[int]:
    """The stored tensors expression e is computed from (each read once per element of e:
    an expression reads O(1) elements per element, a broadcast bias among them)."""
    g = fu.g
    out: set[int] = set()
    stack, seen = list(g[e].inputs), set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if fu.has_storage(n):
            out.add(n)
        else:
            stack.extend(g[n].inputs)
    return out


def _read_once(fu, gid: int, e: int) -> bool:
    """Whether group gid reads each element of e at most once though not at its own index:
    only through same-size elementwise ops and permuting views (reshape, transpose) from
    its anchors, never from its main's inputs (a product rereads its operands). Under
    precision="mixed" the transposed f16 copy of a GELU's output for the weight gradient,
    cast(transpose(gelu(h))), reads the tanh so."""
    g = fu.g
    G = fu.groups[gid]
    if G.main is not None and e in _expression_loads(fu, G.main) | {G.main}:
        return False
    stack, seen, hit = list(G.anchors), set(), False
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        node = g[n]
        for i in node.inputs:
            x = g[i]
            once = x.size == node.size and (node.op in ELEMENTWISE_OPS or node.op in _PERMUTE) \
                or x.size == 1
            if i == e:
                if not once:
                    return False
                hit = True
            elif not fu.has_storage(i) or i in G.anchors:
                if not once and e in _expression_loads(fu, i) | {i}:
                    return False
                stack.append(i)
    return hit


_PERMUTE = ("reshape", "transpose")


def remat_candidates(fu) -> frozenset:
    """Cost-stored expressions to recompute in their readers (see the module docstring)."""
    g = fu.g
    if not fu.cost_stored:
        return frozenset()
    pos = {gid: t for t, gid in enumerate(fu.order)}
    readers: dict[int, list[tuple[int, bool]]] = {}
    for gid in fu.order:
        for s, ident in fu.loads(gid).items():
            if fu.group_of.get(s) != gid:
                readers.setdefault(s, []).append((gid, ident))
    roots = {fu.storage_base(r) for r in (*g.outputs.values(), *g.writebacks.values())}
    roots |= set(fu.inplace) | {s for s, _ in fu.end_copies}

    def last(s: int) -> int:
        if s in roots or s not in fu.group_of:  # leaves, constants, outputs: whole step
            return END
        return max((pos[h] for h, _ in readers.get(s, ())), default=pos[fu.group_of[s]])

    out = set()
    for e in fu.cost_stored:
        rs = readers.get(e)
        if e in roots or not rs or not all(ident or _read_once(fu, h, e) for h, ident in rs):
            continue
        loads = _expression_loads(fu, e)
        if not loads:
            continue
        if any(last(s) < last(e) for s in loads):
            continue  # recomputing would keep an input alive longer than e
        if any(len(loads - set(fu.loads(h))) > 1 for h, _ in rs):
            continue  # a reader would bind and load more than it does now
        out.add(e)
    return frozenset(out)


@dataclass(frozen=True)
class Remat:
    """What Fusion's cost test (rule 2) must leave unstored: the named expressions, and any
    expression the first plan did not store whose stored inputs are all among theirs.
    Leaving tanh(...) unstored makes its consumer 1 + tanh(...) costly in turn; that
    consumer was evaluated by readers of the tanh, which its inputs outlive, so it is
    recomputed as well, in the same fusion pass (not one more pass per link)."""
    nodes: frozenset
    loads: frozenset   # the stored tensors the named expressions are computed from
    kept: frozenset    # what the first plan's cost test stored and stays stored

    def skip(self, n: int, loads) -> bool:
        return n in self.nodes or (n not in self.kept and bool(loads) and loads <= self.loads)


def plan_fusion(graph, limits, rounds: int = 3):
    """Fusion with the expressions remat_candidates names left unstored (see Remat), then
    again while that names more, a few rounds at most (one, on the GPT bench's step)."""
    from .fusion import Fusion
    fu = Fusion(graph, limits)
    first = fu
    nodes: frozenset = frozenset()
    for _ in range(rounds):
        more = remat_candidates(fu) - nodes
        if not more:
            break
        nodes |= more
        loads = frozenset().union(*(_expression_loads(first, e) for e in nodes))
        fu = Fusion(graph, limits, Remat(nodes, loads, frozenset(first.cost_stored - nodes)))
    return fu


__all__ = ["remat_candidates", "plan_fusion", "Remat"]
