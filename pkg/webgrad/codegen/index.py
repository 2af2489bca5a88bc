"""Index ops: one_hot and gather_rows are expressions; scatter_add_rows is a kernel.

one_hot      (idx == j) as f32, read where the consumer reads it (no [.., n] tensor made
             unless something needs one stored)
gather_rows  the table read at the row an index names (negative rows wrap, as numpy's)
scatter_add_rows  WGSL has no float atomics: a linked list of positions per row, built
             without atomics, then one thread per output element sums its row's values in
             index order, as numpy's add.at (deterministic; see build_scatter)
"""
from __future__ import annotations

from math import prod

from .emit import Emitter, Idx, Storage, rule
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


def scatter_scratch_bytes(g, node) -> int:
    """i32 scratch of a scatter: the first index position of each row, then the next
    position of each index position (a linked list per row, see build_scatter)."""
    return 4 * (node.shape[0] + prod(g[node.inputs[1]].shape))


def build_scatter(ctx) -> list:
    """out[r, d] = sum over positions j with idx[j] == r of values[j, d], in j order.

    Three dispatches, all without atomics, so the sum is deterministic and in index order
    (as numpy's add.at): (1) every row's list head := -1; (2) one thread per position j
    scans the indices for the next position with the same row (next[j]) and, when no
    earlier position has it, writes head[row] := j (the one writer of that head);
    (3) one thread per output element walks its row's list. The earlier kernel looped
    over every index for every output element: rows x D x positions reads, 86 ms of
    GPT-2's step for the token embedding's gradient; this reads each value once."""
    node = ctx.main_node
    g_in, i_in = node.inputs
    G = ctx.g
    n_idx = prod(G[i_in].shape)
    n_rows = node.shape[0]
    D = prod(node.shape[1:])
    total = n_rows * D
    sc = ctx.scratch[0]
    links = Storage(sc.buffer, sc.offset, "i32", sc.nbytes, "scatter_add_rows lists")
    out = []

    def row_of(em, j):  # the row index position j names, negative rows wrapped
        t = em.value(i_in, Idx(G[i_in].shape, flat=j))
        return em.let(f"select({t}, {t} + {n_rows}i, {t} < 0i)")

    # (1) heads := -1
    k1 = ctx.kernel("scatter_add_rows heads")
    em = ctx.emitter(k1)
    grid = k1.thread_index(em, n_rows, "r")
    em.store(links, "r", "-1i")
    out.append(ctx.dispatch(k1, em.lines, grid, WG))

    # (2) next[j] and the heads
    k2 = ctx.kernel("scatter_add_rows link")
    em = ctx.emitter(k2)
    grid = k2.thread_index(em, n_idx, "j")
    t = row_of(em, "j")
    first = em.var("bool", "true")
    nxt = em.var("i32", "-1i")
    with em.block(f"for (var q = 0u; q < {n_idx}u; q++)"):
        tq = row_of(em, "q")
        with em.block(f"if ({tq} == {t} && q != j)"):
            with em.block("if (q < j)"):
                em.emit(f"{first} = false;")
            with em.block("else"):
                em.emit(f"{nxt} = i32(q);")
                em.emit("break;")
    em.store(links, f"{n_rows}u + j", nxt)
    with em.block(f"if ({first} && {t} >= 0i && {t} < {n_rows}i)"):
        em.store(links, f"u32({t})", "i32(j)")
    out.append(ctx.dispatch(k2, em.lines, grid, WG))

    # (3) walk the lists; the group's epilogue (an optimizer update) rides along
    kernel = ctx.kernel("scatter_add_rows")
    epi = ctx.epilogue_fn(kernel)
    em = ctx.emitter(kernel)
    grid = kernel.thread_index(em, total, "o")
    r = em.let(f"o / {D}u") if D > 1 else "o"
    d = em.let(f"o % {D}u") if D > 1 else "0u"
    acc = em.var(node.dtype, zero(node.dtype))
    p = em.var("i32", em.load(links, Idx((n_rows,), flat=r)))
    with em.block("loop"):
        em.emit(f"if ({p} < 0i) {{ break; }}")
        jj = em.let(f"u32({p})")
        v = em.value(g_in, Idx(G[g_in].shape, flat=em.let(f"{jj} * {D}u + {d}") if D > 1 else jj))
        em.emit(f"{acc} += {v};")
        em.emit(f"{p} = {em.load(links, Idx((n_idx,), flat=f'{n_rows}u + {jj}'))};")
    em.emit(f"{epi}(o, {acc});")
    out.append(ctx.dispatch(kernel, em.lines, grid, WG))
    return out
