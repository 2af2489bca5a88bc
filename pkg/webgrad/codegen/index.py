"""Index ops: one_hot and gather_rows are expressions; scatter_add_rows is a kernel.

one_hot      (idx == j) as f32, read where the consumer reads it (no [.., n] tensor made
             unless something needs one stored)
gather_rows  the table read at the row an index names (negative rows wrap, as numpy's)
scatter_add_rows  WGSL has no float atomics, so each output element (row r, column d) is
             one thread that loops over all indices and adds the values whose index is r:
             deterministic, and the summation order is index order, as numpy's add.at
"""
from __future__ import annotations

from math import prod

from .emit import Emitter, Idx, rule
from .wgsl import WG, zero


@rule("one_hot")
def _one_hot_rule(em: Emitter, node, idx: Idx) -> str:
    i = node.inputs[0]
    dims = idx.dims(em)
    v = em.value(i, Idx(em.g[i].shape, dims=dims[:-1]))
    return f"select(0.0f, 1.0f, {v} == i32({dims[-1]}))"


@rule("gather_rows")
def _gather_rule(em, node, idx):
    w, i = node.inputs
    k = len(em.g[i].shape)
    rows = em.g[w].shape[0]
    dims = idx.dims(em)
    r = em.value(i, Idx(em.g[i].shape, dims=dims[:k]))
    row = em.let(f"u32(select({r}, {r} + {rows}i, {r} < 0i))")
    return em.value(w, Idx(em.g[w].shape, dims=[row] + list(dims[k:])))


def build_scatter(ctx) -> list:
    node = ctx.main_node
    g_in, i_in = node.inputs
    G = ctx.g
    n_idx = prod(G[i_in].shape)
    n_rows = node.shape[0]
    D = prod(node.shape[1:])
    total = n_rows * D
    kernel = ctx.kernel("scatter_add_rows")
    epi = ctx.epilogue_fn(kernel)
    em = ctx.emitter(kernel)
    grid = kernel.thread_index(em, total, "o")
    r = em.let(f"i32(o / {D}u)") if D > 1 else "i32(o)"
    d = em.let(f"o % {D}u") if D > 1 else "0u"
    acc = em.var(node.dtype, zero(node.dtype))
    with em.block(f"for (var j = 0u; j < {n_idx}u; j++)"):
        t = em.value(i_in, Idx(G[i_in].shape, flat="j"))
        t = em.let(f"select({t}, {t} + {n_rows}i, {t} < 0i)")
        with em.block(f"if ({t} == {r})"):
            v = em.value(g_in, Idx(G[g_in].shape, flat=em.let(f"j * {D}u + {d}") if D > 1 else "j"))
            em.emit(f"{acc} += {v};")
    em.emit(f"{epi}(o, {acc});")
    return [ctx.dispatch(kernel, em.lines, grid, WG)]
