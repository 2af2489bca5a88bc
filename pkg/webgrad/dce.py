"""Dead-code elimination: keep only nodes that an output or a writeback needs.

Runs after the optimizer is appended. Renumbers nodes densely (order is kept, so the list
stays topologically sorted) and rewrites every table that refers to ids. Leaves named in
`graph.inputs`/`params`/`state` stay even when unused, so feeds and persistent buffers keep
a stable interface (a feed the loss ignores is still validated).
"""
from __future__ import annotations

from .ir import Graph, Node


def dce(g: Graph) -> Graph:
    live = set(g.roots()) | set(g.inputs.values()) | set(g.params.values()) | set(g.state.values())
    for n in reversed(g.nodes):
        if n.id in live:
            live.update(n.inputs)
    remap: dict[int, int] = {}
    out = Graph(seed=g.seed, training=g.training)
    for n in g.nodes:
        if n.id in live:
            remap[n.id] = len(out.nodes)
            out.nodes.append(Node(remap[n.id], n.op, tuple(remap[i] for i in n.inputs), n.shape,
                                  n.dtype, n.attrs, n.loc))
    return _remap_tables(g, out, remap)


def cse(g: Graph) -> Graph:
    """Merge nodes with the same op, inputs and attrs (constants traced twice, the same
    reshape asked for by forward and backward). Leaves with names are never merged."""
    seen: dict[tuple, int] = {}
    remap: dict[int, int] = {}
    out = Graph(seed=g.seed, training=g.training)
    for n in g.nodes:
        ins = tuple(remap[i] for i in n.inputs)
        key = None
        if n.op not in ("input", "param", "state", "rand_uniform"):
            key = (n.op, ins, n.shape, n.dtype, tuple(sorted((k, _hashable(v)) for k, v in n.attrs.items())))
            if key in seen:
                remap[n.id] = seen[key]
                continue
        remap[n.id] = len(out.nodes)
        out.nodes.append(Node(remap[n.id], n.op, ins, n.shape, n.dtype, n.attrs, n.loc))
        if key is not None:
            seen[key] = remap[n.id]
    return _remap_tables(g, out, remap)


def _remap_tables(g: Graph, out: Graph, remap: dict[int, int]) -> Graph:
    """Copy g's name -> id tables into out, with ids renumbered by remap."""
    for name in ("inputs", "params", "state", "outputs", "writebacks"):
        setattr(out, name, {k: remap[v] for k, v in getattr(g, name).items()})
    return out


def _hashable(v):
    if isinstance(v, list):
        return tuple(_hashable(e) for e in v)
    if isinstance(v, float) and v != v:
        return "nan"
    return v
