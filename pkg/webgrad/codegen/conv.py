"""Convolution windows: unfold2d (im2col) is an expression, fold2d (col2im) a kernel.

unfold2d  out[n, c, i*kw + j, oy*OW + ox] = x[n, c, oy*sh + i*dh - ph, ox*sw + j*dw - pw], or
          pad_value outside the image: index arithmetic in the consumer (conv2d's matmul
          reads it through a stored copy; max_pool2d's max_last reads it directly)
fold2d    its adjoint: one thread per image pixel sums the window entries that cover it
          (a gather, so no atomics; the kh*kw candidates are unrolled)
"""
from __future__ import annotations

from math import prod

from .emit import Emitter, Idx, rule
from ..primitives import window
from .wgsl import WG, f32_lit, u32_lit, zero


@rule("unfold2d")
def _unfold_rule(em: Emitter, node, idx: Idx) -> str:
    x = node.inputs[0]
    N, C, H, W = em.g[x].shape
    w = window(node.attrs, H, W)
    n, c, kk, p = idx.dims(em)
    i = em.let(f"{kk} / {w.kw}u") if w.kw > 1 else kk
    j = em.let(f"{kk} % {w.kw}u") if w.kw > 1 else u32_lit(0)
    oy = em.let(f"{p} / {w.ow}u") if w.ow > 1 else p
    ox = em.let(f"{p} % {w.ow}u") if w.ow > 1 else u32_lit(0)
    y = em.let(f"i32({oy} * {w.sh}u + {i} * {w.dh}u) - {w.ph}i")
    xx = em.let(f"i32({ox} * {w.sw}u + {j} * {w.dw}u) - {w.pw}i")
    inside = em.let(f"{y} >= 0i && {y} < {H}i && {xx} >= 0i && {xx} < {W}i")
    yc = em.let(f"u32(clamp({y}, 0i, {H - 1}i))")
    xc = em.let(f"u32(clamp({xx}, 0i, {W - 1}i))")
    v = em.value(x, Idx((N, C, H, W), dims=[n, c, yc, xc]))
    return f"select({f32_lit(node.attrs['pad_value'])}, {v}, {inside})"


def build_fold(ctx) -> list:
    node = ctx.main_node
    g_in = node.inputs[0]
    N, C, H, W = node.shape
    w = window(node.attrs, H, W)
    total = prod(node.shape)
    kernel = ctx.kernel("fold2d")
    epi = ctx.epilogue_fn(kernel)
    em = ctx.emitter(kernel)
    grid = kernel.thread_index(em, total, "o")
    n, c, y, x = em.unravel("o", node.shape)
    acc = em.var(node.dtype, zero(node.dtype))
    for i in range(w.kh):
        for j in range(w.kw):
            # tap (i, j) of output (oy, ox) covers this pixel when oy*sh = y + ph - i*dh
            ty = em.let(f"i32({y}) + {w.ph - i * w.dh}i")
            tx = em.let(f"i32({x}) + {w.pw - j * w.dw}i")
            conds = [f"{ty} >= 0i", f"{tx} >= 0i", f"{ty} < {w.oh * w.sh}i", f"{tx} < {w.ow * w.sw}i"]
            if w.sh > 1:
                conds.append(f"{ty} % {w.sh}i == 0i")
            if w.sw > 1:
                conds.append(f"{tx} % {w.sw}i == 0i")
            with em.block(f"if ({' && '.join(conds)})"):
                p = em.let(f"u32({ty} / {w.sh}i) * {w.ow}u + u32({tx} / {w.sw}i)")
                v = em.value(g_in, Idx(em.g[g_in].shape, dims=[n, c, u32_lit(i * w.kw + j), p]))
                em.emit(f"{acc} += {v};")
    em.emit(f"{epi}(o, {acc});")
    return [ctx.dispatch(kernel, em.lines, grid, WG)]
