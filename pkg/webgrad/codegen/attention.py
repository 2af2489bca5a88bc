"""Fused attention kernels: the ops that codegen/attention_match.py rewrites
`softmax(mask(scale * q @ k^T)) @ v` and its gradient into. None of them stores a score.

Notation: A = q [.., T, D], B = k^T [.., D, S], V [.., S, Dv], G = dL/dO [.., T, Dv];
s_ij = scale * q_i . k_j over the kept keys j <= i + offset (every key when offset is
None); lse_i = log sum_j exp(s_ij); p_ij = exp(s_ij - lse_i), the softmax.

  attn_lse (A, B)                    lse_i, by an online log-sum-exp over the keys
  attn_out (A, B, V, lse)            O_i = sum_j p_ij v_j
  attn_out (A, B, V)                 the same with the softmax online (inference graphs,
                                     where no backward needs lse; attrs online)
Each takes a last input `pos` when attrs dyn is set: the causal offset grows by that
runtime scalar (a KV cache's position).
  attn_dv  (A, B, G, lse)            dV_j = sum_i p_ij g_i
  attn_dq  (A, B, V, G, lse, Drow)   dQ_i = scale sum_j ds_ij k_j
  attn_dk  (A, B, V, G, lse, Drow)   dK_j = scale sum_i ds_ij q_i
with ds_ij = p_ij (g_i . v_j - Drow_i) and Drow_i = sum_d g_id O_id, which equals
softmax_last's sum_j dP_ij p_ij because dP_ij = g_i . v_j (the IR computes it as a plain
reduction). The backward recomputes s and p from lse instead of reading stored
probabilities; WebGPU has no float atomics, so dQ (a thread per query) and dK / dV (a
thread per key) are separate kernels, each with its rows' vectors in registers.

Which code: on GPUs, attention_tiled.py's tiled kernels (workgroups of row blocks through
workgroup memory; there the forward is one kernel, attn_fwd, and dK / dV one, attn_dkv);
on CPU adapters (Limits.cpu) the row kernels below, which use no barriers. A decoding
step's attn_out (few query rows, a long cache) on GPUs: attention_split.py's two passes
over chunks of keys.

Every row kernel is one thread per row (query or key): the thread holds its row's vectors in
registers and loops over the other side's rows, which all threads of a workgroup read at
the same address at the same time (consecutive threads are consecutive rows of one head),
so the reads are broadcasts served by the cache; no shared memory and no barriers, which
also suits CPU adapters (lavapipe, SwiftShader). On GPUs a head dimension up to
UNROLL_MAX is unrolled into vec4 registers; on CPU adapters (Limits.cpu), and for wider
heads, it is a loop over vec4 arrays instead: LLVM-based shader compilers (lavapipe,
SwiftShader) took 43 s of CPU over the unrolled kernels at head dim 128 against 1.6 s
for the loops (9.0 against 1.2 at 64).
Under precision="mixed" (attrs mixed, attention_pattern.py): the program rounds to f16
where torch.amp's f16 matmuls would, and so do the kernels, their arithmetic staying f32
(elementwise.wg_round_f16, r() below): s_ij = scale r(q_i . k_j); O_i = sum_j r(p_ij) v_j
and dV_j = sum_i r(p_ij) g_i (the normalized p: attn_out always reads lse); dP_ij =
r(g_i . v_j), ds_ij = p_ij (dP_ij - Drow_i), and dQ, dK sum r(scale ds_ij) (the rounded
gS) times k_j, q_i. q, k, v and g are the programs' f16 operands already. Under
precision="f16" (attrs round_x, forward only) the scaled score is rounded again:
s_ij = r(scale r(q_i . k_j)).
Operands are read through the emitter, so q, k and v may be views (split_heads, a fused
QKV projection's slices) of stored tensors; results go through the group's epilogue.
"""
from __future__ import annotations

from math import prod

from .elementwise import ROUND_F16_WGSL
from .emit import Idx
from .wgsl import f32_lit, u32_lit

from .attention_match import ATTN_OPS
from .attention_split import build_split, use_split
from .attention_tiled import build_tiled, use_tiled

WGS = 64  # threads per workgroup (rows of one head side by side)
UNROLL_MAX = 64  # widest head dim unrolled into registers on GPUs (GPT-2's is 64)


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(s, min(4, n - s)) for s in range(0, n, 4)]


def _vty(c: int) -> str:
    return "f32" if c == 1 else f"vec{c}<f32>"


def _comp(name: str, c: int, k: int) -> str:
    return name if c == 1 else f"{name}.{'xyzw'[k]}"


class _Rows:
    """Row vectors of one thread. A vector is a register array (("arr", name, width): vec4
    variables, unrolled, or one array<vec4> when looping) or a lazy row of an operand
    (("row", node, index, transposed)), read where it is used."""

    def __init__(self, ctx, em, batch, bdims, loop: bool):
        self.em, self.g = em, ctx.g
        self.batch, self.bdims, self.loop = batch, bdims, loop

    def at(self, n: int, last: list[str]) -> str:
        shape = self.g[n].shape
        nb = len(shape) - len(last)
        r = len(self.batch) - nb
        dims = [u32_lit(0) if shape[k] == 1 else self.bdims[r + k] for k in range(nb)] + last
        return self.em.value(n, Idx(shape, dims=dims))

    @staticmethod
    def row(n, idx, transposed=False):
        return ("row", n, idx, transposed)

    def _width(self, v) -> int:
        return v[2] if v[0] == "arr" else self.g[v[1]].shape[-2 if v[3] else -1]

    def _chunk(self, v, s, c: int) -> str:
        """Chunk starting at element s (a WGSL u32 expression in a loop, else an int) of c
        elements of v."""
        if v[0] == "arr":
            return f"{v[1]}[{s}]" if self.loop else v[1][s // 4]
        _, n, idx, tr = v
        at = [f"{s} + {k}u" if self.loop else f"{s + k}u" for k in range(c)]
        vals = [self.at(n, [a, idx] if tr else [idx, a]) for a in at]
        return self.em.let(vals[0] if c == 1 else f"{_vty(c)}({', '.join(vals)})")

    def _over(self, width, body):
        """body(chunk start, chunk size, array index) for every chunk of a row (the start
        a WGSL expression in a loop, else an int)."""
        if self.loop:
            with self.em.block(f"for (var c = 0u; c < {width // 4}u; c++)"):
                body("c * 4u", 4, "c")
        else:
            for s, c in _chunks(width):
                body(s, c, s // 4)

    def regs(self, width: int, src=None):
        """A register vector: zeros, or a copy of the lazy row src."""
        em = self.em
        if self.loop:
            name = em.fresh("r")
            em.emit(f"var {name}: array<vec4<f32>, {width // 4}>;")
            v = ("arr", name, width)
            if src is not None:
                self._over(width, lambda s, c, i: em.emit(f"{name}[{i}] = {self._chunk(src, s, c)};"))
            return v
        if src is None:
            names = [em.var(_vty(c), f"{_vty(c)}()") for _, c in _chunks(width)]
        else:
            names = [self._chunk(src, s, c) for s, c in _chunks(width)]
        return ("arr", names if not self.loop else None, width)

    def _get(self, v, s, c, i):
        if v[0] == "arr":
            return f"{v[1]}[{i}]" if self.loop else v[1][i]
        return self._chunk(v, s, c)

    def dot(self, a, b) -> str:
        em, width = self.em, self._width(a)
        if not self.loop:
            terms = []
            self._over(width, lambda s, c, i: terms.append(
                f"dot({self._get(a, s, c, i)}, {self._get(b, s, c, i)})" if c > 1
                else f"{self._get(a, s, c, i)} * {self._get(b, s, c, i)}"))
            return em.let(" + ".join(terms))
        acc = em.var("f32", "0.0f")
        self._over(width, lambda s, c, i: em.emit(
            f"{acc} = {acc} + dot({self._get(a, s, c, i)}, {self._get(b, s, c, i)});"))
        return em.let(acc)

    def axpy(self, acc, p: str, x, decay: str | None = None) -> None:
        """acc = acc * decay + p * x."""
        def body(s, c, i):
            a = self._get(acc, s, c, i)
            old = a if decay is None else f"{a} * {decay}"
            self.em.emit(f"{a} = {old} + {p} * {self._get(x, s, c, i)};")
        self._over(self._width(acc), body)

    def write(self, epi: str, acc, scale: str | None) -> None:
        """epi(o * width + d, acc_d * scale) for every component d of the row."""
        width = self._width(acc)
        mul = "" if scale is None else f" * {scale}"

        def body(s, c, i):
            a = self._get(acc, s, c, i)
            start = s if self.loop else f"{s}u"
            for k in range(c):
                self.em.emit(f"{epi}(o * {width}u + {start} + {k}u, {_comp(a, c, k)}{mul});")
        self._over(width, body)


def build_attention(ctx) -> list[dict]:
    if use_split(ctx.g, ctx.main_node, ctx.limits):  # decoding on GPUs: chunks of keys
        return build_split(ctx)
    if use_tiled(ctx.limits):  # GPUs: workgroups of row blocks (attention_tiled.py)
        return build_tiled(ctx)
    return _build_rows(ctx)


def _build_rows(ctx) -> list[dict]:
    node = ctx.main_node
    op, g = node.op, ctx.g
    a, b = node.inputs[0], node.inputs[1]
    T, D = g[a].shape[-2], g[a].shape[-1]
    S = g[b].shape[-1]
    Dv = g[node.inputs[2]].shape[-1] if op != "attn_lse" else D
    scale, off = node.attrs["scale"], node.attrs["offset"]
    per_key = op in ("attn_dk", "attn_dv")
    batch = tuple(node.shape[:-2]) if op != "attn_lse" else tuple(node.shape[:-1])
    nb = prod(batch)
    rows = S if per_key else T
    loop = (ctx.limits.cpu or max(D, Dv) > UNROLL_MAX) and D % 4 == 0 and Dv % 4 == 0
    kernel = ctx.kernel(f"{op} [{'x'.join(map(str, batch)) or '1'}] T{T} S{S} D{D}")
    epi = ctx.epilogue_fn(kernel)
    em = ctx.emitter(kernel)
    grid = kernel.thread_index(em, nb * rows, "o", WGS)
    em.emit(f"let r = o % {rows}u;")
    em.emit(f"let bo = o / {rows}u;")
    em.declare("r", "bo")
    R = _Rows(ctx, em, batch, em.unravel("bo", batch) if batch else [], loop)
    row = R.row
    sc = f32_lit(scale)
    neg_inf = f32_lit(float("-inf"))
    mixed = node.attrs.get("mixed", False)

    def r(x: str) -> str:  # rounded to f16 where the program rounds (mixed), else x
        return f"{kernel.helper('wg_round_f16', ROUND_F16_WGSL)}({x})" if mixed else x

    def score(qd: str) -> str:  # s_ij from the dot product q_i . k_j
        if node.attrs.get("round_x"):  # precision="f16": the scaled score rounded too
            return r(f"{r(qd)} * {sc}")
        return f"{r(qd)} * {sc}"

    def grad_s(p: str, dp: str, drow: str) -> str:  # ds_ij, scaled and rounded when mixed
        if mixed:
            return em.let(r(f"{p} * ({r(dp)} - {drow}) * {sc}"))
        return em.let(f"{p} * ({dp} - {drow})")
    post = None if mixed else sc  # dQ and dK's scale, where ds has not taken it

    def stat(n, i):  # lse / Drow of query i ([batch.., T], written by this program)
        return em.value(n, Idx(g[n].shape, flat=em.let(f"bo * {T}u + {i}")))

    def done():
        return [ctx.dispatch(kernel, em.lines, grid, WGS)]

    dyn = None
    if node.attrs.get("dyn"):  # offset + a runtime scalar (a cache position), read once
        pn = node.inputs[-1]
        dyn = em.let(f"i32({em.value(pn, Idx(g[pn].shape, flat=u32_lit(0)))})")

    if not per_key:
        # query i = r: keys j < jend
        jend = f"{S}u" if off is None else f"min(r + {off + 1}u, {S}u)"
        if dyn is not None:
            jend = em.let(f"u32(clamp(i32(r) + {off + 1}i + {dyn}, 0i, {S}i))")
        keys = f"for (var j = 0u; j < {jend}; j++)"
        em.declare("j")
        q = R.regs(D, row(a, "r"))
        if op == "attn_lse":
            m, l_ = em.var("f32", neg_inf), em.var("f32", "0.0f")
            with em.block(keys):
                s = em.let(score(R.dot(q, row(b, 'j', True))))
                mn = em.let(f"max({m}, {s})")
                em.emit(f"{l_} = {l_} * exp({m} - {mn}) + exp({s} - {mn});")
                em.emit(f"{m} = {mn};")
            em.emit(f"{epi}(o, {m} + log({l_}));")
            return done()
        v_ = node.inputs[2]
        if node.attrs.get("online"):  # inference: softmax online, no lse input
            acc = R.regs(Dv)
            m, l_ = em.var("f32", neg_inf), em.var("f32", "0.0f")
            with em.block(keys):
                s = em.let(f"{R.dot(q, row(b, 'j', True))} * {sc}")
                mn = em.let(f"max({m}, {s})")
                al = em.let(f"exp({m} - {mn})")
                p = em.let(f"exp({s} - {mn})")
                em.emit(f"{l_} = {l_} * {al} + {p};")
                R.axpy(acc, p, row(v_, "j"), decay=al)
                em.emit(f"{m} = {mn};")
            R.write(epi, acc, em.let(f"1.0f / {l_}"))
            return done()
        lse = stat(node.inputs[4 if op == "attn_dq" else 3], "r")
        if op == "attn_out":
            acc = R.regs(Dv)
            with em.block(keys):
                p = em.let(r(f"exp({score(R.dot(q, row(b, 'j', True)))} - {lse})"))
                R.axpy(acc, p, row(v_, "j"))
            R.write(epi, acc, None)
        else:  # attn_dq
            gi = R.regs(Dv, row(node.inputs[3], "r"))
            drow = stat(node.inputs[5], "r")
            acc = R.regs(D)
            with em.block(keys):
                p = em.let(f"exp({score(R.dot(q, row(b, 'j', True)))} - {lse})")
                ds = grad_s(p, R.dot(gi, row(v_, 'j')), drow)
                R.axpy(acc, ds, row(b, "j", True))
            R.write(epi, acc, post)
        return done()

    # key j = r: queries i >= istart (kept iff j <= i + off)
    istart = u32_lit(0) if off is None else (f"select(0u, r - {off}u, r > {off}u)" if off else "r")
    if dyn is not None:
        istart = em.let(f"u32(clamp(i32(r) - {off}i - {dyn}, 0i, {T}i))")
    queries = f"for (var i = {istart}; i < {T}u; i++)"
    em.declare("i")
    k = R.regs(D, row(b, "r", True))
    if op == "attn_dv":
        gg, lse_n = node.inputs[2], node.inputs[3]
        acc = R.regs(g[gg].shape[-1])
        with em.block(queries):
            p = em.let(r(f"exp({score(R.dot(row(a, 'i'), k))} - {stat(lse_n, 'i')})"))
            R.axpy(acc, p, row(gg, "i"))
        R.write(epi, acc, None)
    else:  # attn_dk
        v_, gg, lse_n, dr = node.inputs[2:6]
        vj = R.regs(Dv, row(v_, "r"))
        acc = R.regs(D)
        with em.block(queries):
            p = em.let(f"exp({score(R.dot(row(a, 'i'), k))} - {stat(lse_n, 'i')})")
            ds = grad_s(p, R.dot(row(gg, 'i'), vj), stat(dr, 'i'))
            R.axpy(acc, ds, row(a, "i"))
        R.write(epi, acc, post)
    return done()


__all__ = ["ATTN_OPS", "build_attention"]
