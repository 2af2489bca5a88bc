"""Fused attention kernels: the ops that codegen/attention_match.py rewrites
`softmax(mask(scale * q @ k^T)) @ v` and its gradient into. None of them stores a score.

Notation: A = q [.., T, D], B = k^T [.., D, S], V [.., S, Dv], G = dL/dO [.., T, Dv];
s_ij = scale * q_i . k_j over the kept keys j <= i + offset (every key when offset is
None); lse_i = log sum_j exp(s_ij); p_ij = exp(s_ij - lse_i), the softmax.

  attn_lse (A, B)                    lse_i, by an online log-sum-exp over the keys
  attn_out (A, B, V, lse)            O_i = sum_j p_ij v_j
  attn_dv  (A, B, G, lse)            dV_j = sum_i p_ij g_i
  attn_dq  (A, B, V, G, lse, Drow)   dQ_i = scale sum_j ds_ij k_j
  attn_dk  (A, B, V, G, lse, Drow)   dK_j = scale sum_i ds_ij q_i
with ds_ij = p_ij (g_i . v_j - Drow_i) and Drow_i = sum_d g_id O_id, which equals
softmax_last's sum_j dP_ij p_ij because dP_ij = g_i . v_j (the IR computes it as a plain
reduction). The backward recomputes s and p from lse instead of reading stored
probabilities; WebGPU has no float atomics, so dQ (a thread per query) and dK / dV (a
thread per key) are separate kernels, each with its rows' vectors in registers.

Every kernel is one thread per row (query or key): the thread holds its row's vectors in
registers (unrolled, as vec4s) and loops over the other side's rows, which all threads of
a workgroup read at the same address at the same time (consecutive threads are
consecutive rows of one head), so the reads are broadcasts served by the cache; no
shared memory and no barriers, which also suits CPU adapters (lavapipe, SwiftShader).
Operands are read through the emitter, so q, k and v may be views (split_heads, a fused
QKV projection's slices) of stored tensors; results go through the group's epilogue.
"""
from __future__ import annotations

from math import prod

from .emit import Idx
from .wgsl import f32_lit

from .attention_match import ATTN_OPS

WGS = 64  # threads per workgroup (rows of one head side by side)


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(s, min(4, n - s)) for s in range(0, n, 4)]


def _vty(c: int) -> str:
    return "f32" if c == 1 else f"vec{c}<f32>"


def _comp(name: str, c: int, k: int) -> str:
    return name if c == 1 else f"{name}.{'xyzw'[k]}"


class _Rows:
    """Reads whole rows of the operands for one thread: the batch index `bo` is shared."""

    def __init__(self, ctx, em, batch, bdims):
        self.ctx, self.em, self.g = ctx, em, ctx.g
        self.batch, self.bdims = batch, bdims

    def at(self, n: int, last: list[str]) -> str:
        shape = self.g[n].shape
        nb = len(shape) - len(last)
        r = len(self.batch) - nb
        dims = ["0u" if shape[k] == 1 else self.bdims[r + k] for k in range(nb)] + last
        return self.em.value(n, Idx(shape, dims=dims))

    def row(self, n: int, idx: str, width: int, transposed: bool = False) -> list[tuple[str, int]]:
        """Row `idx` of n ([.., rows, width]; of n^T when transposed) as vec4 lets."""
        out = []
        for s, c in _chunks(width):
            vals = [self.at(n, [f"{s + k}u", idx] if transposed else [idx, f"{s + k}u"])
                    for k in range(c)]
            out.append((self.em.let(vals[0] if c == 1 else f"{_vty(c)}({', '.join(vals)})"), c))
        return out

    def acc(self, width: int) -> list[tuple[str, int]]:
        return [(self.em.var(_vty(c), f"{_vty(c)}()"), c) for _, c in _chunks(width)]


def _dot(xs, ys) -> str:
    return " + ".join(f"dot({x}, {y})" if c > 1 else f"{x} * {y}" for (x, c), (y, _) in zip(xs, ys))


def build_attention(ctx) -> list[dict]:
    node = ctx.main_node
    op, g = node.op, ctx.g
    a, b = node.inputs[0], node.inputs[1]
    T, D = g[a].shape[-2], g[a].shape[-1]
    S = g[b].shape[-1]
    scale, off = node.attrs["scale"], node.attrs["offset"]
    per_key = op in ("attn_dk", "attn_dv")
    batch = tuple(node.shape[:-2]) if op != "attn_lse" else tuple(node.shape[:-1])
    nb = prod(batch)
    rows = S if per_key else T
    kernel = ctx.kernel(f"{op} [{'x'.join(map(str, batch)) or '1'}] T{T} S{S} D{D}")
    epi = ctx.epilogue_fn(kernel)
    em = ctx.emitter(kernel)
    grid = kernel.thread_index(em, nb * rows, "o", WGS)
    em.emit(f"let r = o % {rows}u;")
    em.emit(f"let bo = o / {rows}u;")
    R = _Rows(ctx, em, batch, em.unravel("bo", batch) if batch else [])
    sc = f32_lit(scale)

    def stat(n, i):  # lse / Drow of query i ([batch.., T], written by this program)
        return em.value(n, Idx(g[n].shape, flat=em.let(f"bo * {T}u + {i}")))

    if not per_key:
        # query i = r: keys j < jend
        jend = f"{S}u" if off is None else f"min(r + {off + 1}u, {S}u)"
        q = R.row(a, "r", D)
        if op == "attn_lse":
            m = em.var("f32", f32_lit(float("-inf")))
            l_ = em.var("f32", "0.0f")
            with em.block(f"for (var j = 0u; j < {jend}; j++)"):
                k = R.row(b, "j", D, transposed=True)
                s = em.let(f"({_dot(q, k)}) * {sc}")
                mn = em.let(f"max({m}, {s})")
                em.emit(f"{l_} = {l_} * exp({m} - {mn}) + exp({s} - {mn});")
                em.emit(f"{m} = {mn};")
            em.emit(f"{epi}(o, {m} + log({l_}));")
            return [ctx.dispatch(kernel, em.lines, grid, WGS)]
        lse = stat(node.inputs[4 if op == "attn_dq" else 3], "r")
        if op == "attn_out":
            v_ = node.inputs[2]
            Dv = g[v_].shape[-1]
            acc = R.acc(Dv)
            with em.block(f"for (var j = 0u; j < {jend}; j++)"):
                k = R.row(b, "j", D, transposed=True)
                p = em.let(f"exp(({_dot(q, k)}) * {sc} - {lse})")
                for (x, c), (y, _) in zip(acc, R.row(v_, "j", Dv)):
                    em.emit(f"{x} = {x} + {p} * {y};")
            _write(em, epi, acc, Dv, 1.0)
        else:  # attn_dq
            v_, gg, dr = node.inputs[2], node.inputs[3], node.inputs[5]
            Dv = g[v_].shape[-1]
            gi = R.row(gg, "r", Dv)
            drow = stat(dr, "r")
            acc = R.acc(D)
            with em.block(f"for (var j = 0u; j < {jend}; j++)"):
                k = R.row(b, "j", D, transposed=True)
                p = em.let(f"exp(({_dot(q, k)}) * {sc} - {lse})")
                ds = em.let(f"{p} * ({_dot(gi, R.row(v_, 'j', Dv))} - {drow})")
                for (x, c), (y, _) in zip(acc, k):
                    em.emit(f"{x} = {x} + {ds} * {y};")
            _write(em, epi, acc, D, scale)
        return [ctx.dispatch(kernel, em.lines, grid, WGS)]

    # key j = r: queries i >= istart (kept iff j <= i + off)
    istart = "0u" if off is None else (f"select(0u, r - {off}u, r > {off}u)" if off else "r")
    k = R.row(b, "r", D, transposed=True)
    if op == "attn_dv":
        gg, lse_n = node.inputs[2], node.inputs[3]
        Dv = g[gg].shape[-1]
        acc = R.acc(Dv)
        with em.block(f"for (var i = {istart}; i < {T}u; i++)"):
            q = R.row(a, "i", D)
            p = em.let(f"exp(({_dot(q, k)}) * {sc} - {stat(lse_n, 'i')})")
            for (x, c), (y, _) in zip(acc, R.row(gg, "i", Dv)):
                em.emit(f"{x} = {x} + {p} * {y};")
        _write(em, epi, acc, Dv, 1.0)
    else:  # attn_dk
        v_, gg, lse_n, dr = node.inputs[2:6]
        Dv = g[v_].shape[-1]
        vj = R.row(v_, "r", Dv)
        acc = R.acc(D)
        with em.block(f"for (var i = {istart}; i < {T}u; i++)"):
            q = R.row(a, "i", D)
            p = em.let(f"exp(({_dot(q, k)}) * {sc} - {stat(lse_n, 'i')})")
            ds = em.let(f"{p} * ({_dot(R.row(gg, 'i', Dv), vj)} - {stat(dr, 'i')})")
            for (x, c), (y, _) in zip(acc, q):
                em.emit(f"{x} = {x} + {ds} * {y};")
        _write(em, epi, acc, D, scale)
    return [ctx.dispatch(kernel, em.lines, grid, WGS)]


def _write(em, epi, acc, width, scale) -> None:
    """epi(o * width + d, acc_d * scale) for every component d of the row."""
    mul = "" if scale == 1.0 else f" * {f32_lit(scale)}"
    for s, c in _chunks(width):
        name = acc[s // 4][0]
        for k in range(c):
            em.emit(f"{epi}(o * {width}u + {s + k}u, {_comp(name, c, k)}{mul});")


__all__ = ["ATTN_OPS", "build_attention"]
