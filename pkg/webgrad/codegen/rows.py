"""write_rows: rows start..start+T-1 of a target replaced by values, as one kernel.

Two forms, chosen by where fusion put the result:
  in place   the result lives in the target's own buffer (a state assigned its own
             write_rows, fusion's in-place writeback): one thread per element of the T new
             rows, nothing else is read or written. This is the KV cache step: a decode
             token costs T * D writes per cache, not a pass over all of it.
  copy       anywhere else: one thread per element of the result, the new row where one
             lands and the target's element otherwise.
start is read from its buffer at run time (an i32 feed), so one program serves every position.
Rows that land outside the target are dropped, as in the reference rule.
The in-place store (store_row) is also a product's epilogue's (fusion_groups._row_epilogues: a
decoding step's V row, computed by v_proj at its own index, and K's rotated row beside it):
then write_rows has no kernel of its own.
"""
from __future__ import annotations

from math import prod

from .emit import Idx
from .wgsl import WG, u32_lit


def build_write_rows(ctx) -> list:
    node = ctx.main_node
    base, vals, start = node.inputs
    G = ctx.g
    n_rows, t_rows = node.shape[0], G[vals].shape[0]
    D = prod(node.shape[1:])
    out = ctx.storage(node.id)
    in_place = ctx.storage(base) is not None and ctx.storage(base).buffer == out.buffer
    kernel = ctx.kernel("write_rows" + ("_in_place" if in_place else ""))
    em = ctx.emitter(kernel)
    grid = kernel.thread_index(em, (t_rows if in_place else n_rows) * D, "o")
    if in_place:
        store_row(em, node, out, "o", lambda: em.value(vals, Idx(G[vals].shape, flat="o")))
    else:
        s = em.value(start, Idx(G[start].shape, flat=u32_lit(0)))
        row = em.let(f"o / {D}u") if D > 1 else "o"
        col = em.let(f"o % {D}u") if D > 1 else u32_lit(0)
        t = em.let(f"i32({row}) - {s}")
        tc = em.let(f"u32(clamp({t}, 0i, {t_rows - 1}i))")
        v = em.value(vals, Idx(G[vals].shape, flat=em.let(f"{tc} * {D}u + {col}") if D > 1 else tc))
        old = em.value(base, Idx(G[base].shape, flat="o"))
        em.store(out, "o", f"select({old}, {v}, {t} >= 0i && {t} < {t_rows}i)")
    return [ctx.dispatch(kernel, em.lines, grid, WG)]


def store_row(em, node, out, flat: str, value) -> None:
    """The in-place form's store: element `flat` of write_rows `node`'s new rows (its
    values, flattened), value() its value, into row start + flat / D of `out` (the target's
    buffer), dropped outside the target. Also a product's epilogue's, where that product
    computes the rows (fusion_groups._row_epilogues)."""
    G = em.g
    start = node.inputs[2]
    n_rows, D = node.shape[0], prod(node.shape[1:])
    s = em.value(start, Idx(G[start].shape, flat=u32_lit(0)))
    row = em.let(f"{flat} / {D}u") if D > 1 else flat
    col = em.let(f"{flat} % {D}u") if D > 1 else u32_lit(0)
    dst = em.let(f"{s} + i32({row})")
    v = value()
    with em.block(f"if ({dst} >= 0i && {dst} < {n_rows}i)"):
        em.store(out, f"u32({dst}) * {D}u + {col}" if D > 1 else f"u32({dst})", v)
