"""Normalized rows read by the matrix-vector kernel (matmul_gemv.py): fusion's rule 8.

A decoding step's RMSNorm, n = x * rsqrt(mean(x * x) + eps) * w, was two kernels: the sum
over the hidden row and an elementwise kernel writing n, which only the next products read
(q/k/v, gate/up, the LM head). On an H200 each took ~7.6 us, bound by the dispatch, not by
its 8 KB (bench/README.md: 66 of a Llama-3.2-1B decode step's 247 kernels). Where such a
product takes the GPU matrix-vector kernel, fusion_prologue.py stores neither; instead each
workgroup of the product

  1. sums its R rows of the reduction's input (here x * x) in a fixed order: every thread a
     strided part of the row, then a tree in the kernel's workgroup memory (deterministic;
     the R x K floats come from the cache, tiny next to the weights), and
  2. evaluates A's elementwise chain as it reads A, the sum given by name (Emitter.given)
     and the chain's parts that depend on the row alone (the rsqrt) computed once before
     the loop over K.

The quantized form (build_gemv_chunks) reads A as vec4s: where A's chain is arithmetic
(+ - * /) of row scalars and stored rows along K (RMSNorm's is), the stored rows are vec4
loads and the arithmetic vec4 arithmetic (the scalar form's roundings, element by
element), and the sum's input likewise; any other chain is read four scalars at a time.

RowOperand is the plan (fusion_prologue.py makes it, program.GroupCtx.matmul_operands
hands it to the builder in A's place); row_reader emits steps 1 and 2.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from .emit import Idx
from .quant import QuantOperand, vec4_reader
from .wgsl import u32_lit, zero


# the elementwise ops the vec4 form takes (elementwise.py's _BINARY text, which WGSL also
# reads for vec4 and scalar operands, with the same rounding per element)
_VEC_OPS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


@dataclass(frozen=True)
class RowOperand:
    """A matrix-vector product's A computed as it is read: node `a` ([.., M, K], its rows
    those of C), its one row reduction `s` (a sum over the last axis of s's input, over A's
    rows), and the nodes of a's chain that depend on s but not on k, with their axes (per
    axis the axis of A it runs along, None for size 1): evaluated once per row. Chain axes
    name A's axes; in the sum's input, A's last axis stands for the reduced one."""
    a: int
    s: int
    hoist: tuple      # ((node, axes), ...)
    dep: frozenset    # the nodes of a's chain that read s (fusion never stores them)


def input_axes(g, node, axes: tuple) -> list[tuple] | None:
    """The axes of A that each input of `node` runs along, where node's run along `axes`:
    numpy broadcasting for elementwise ops and broadcast_to, size-1 axes added or dropped
    by a reshape; None for a reshape that regroups axes."""
    if node.op == "reshape":
        sh = g[node.inputs[0]].shape
        if [d for d in sh if d != 1] != [d for d in node.shape if d != 1]:
            return None
        it = iter(m for m, d in zip(axes, node.shape) if d != 1)
        return [tuple(None if d == 1 else next(it) for d in sh)]
    out = []
    for i in node.inputs:
        sh = g[i].shape
        r = len(node.shape) - len(sh)
        out.append(tuple(None if d == 1 else axes[j + r] for j, d in enumerate(sh)))
    return out


class _Rows:
    """Emits one kernel's row sums and A's values (row_reader)."""

    def __init__(self, ctx, em, op: RowOperand, R: int, wg: int):
        self.g, self.em, self.op, self.wg = ctx.g, em, op, wg
        self.storage, self.kernel = ctx.storage, em.k
        A = self.g[op.a]
        self.kax = len(A.shape) - 1
        self.digits = [_unravel(r, A.shape[:-1]) for r in range(R)]
        self.totals: list[str] = []

    def idx(self, shape, axes, r: int, k: str | None) -> Idx:
        """The index of a node of shape/axes at row r and A's last index k."""
        dims = []
        for m in axes:
            if m is None:
                dims.append(u32_lit(0))
            elif m == self.kax:
                dims.append(k)
            else:
                dims.append(u32_lit(self.digits[r][m]))
        return Idx(shape, dims=dims)

    def y_axes(self) -> tuple:
        y = self.g[self.g[self.op.s].inputs[0]]
        rows = [m for m, d in enumerate(self.g[self.op.a].shape[:-1]) if d != 1]
        it = iter(rows)
        return tuple(None if d == 1 else next(it) for d in y.shape[:-1]) + (self.kax,)

    # -- step 1: the row sums
    def sums(self, vec4: bool) -> None:
        em, g, wg = self.em, self.g, self.wg
        y = g[self.op.s].inputs[0]
        D, yax = g[y].shape[-1], self.y_axes()
        R = len(self.digits)
        acc = [em.var("f32", zero("f32"), prefix="ps") for _ in range(R)]
        em.declare("pk")
        step = 4 * wg if vec4 else wg
        with em.block(f"for (var pk = {'lid * 4u' if vec4 else 'lid'}; pk < {D}u; pk += {step}u)"):
            for r in range(R):
                if vec4:
                    t = f"dot({self.vexpr(y, yax, r, 'pk')}, vec4<f32>(1.0f))"
                else:
                    t = em.value(y, self.idx(g[y].shape, yax, r, "pk"))
                em.emit(f"{acc[r]} = {acc[r]} + {t};")
        for r in range(R):
            em.emit(f"gv[{r * wg}u + lid] = {acc[r]};")
        em.emit("workgroupBarrier();")
        s = wg // 2
        while s >= 1:   # a fixed tree per row: every workgroup gets the same bits
            with em.block(f"if (lid < {s}u)"):
                for r in range(R):
                    at = f"{r * wg}u + lid"
                    em.emit(f"gv[{at}] = gv[{at}] + gv[{at} + {s}u];")
            em.emit("workgroupBarrier();")
            s //= 2
        self.totals = [em.snapshot(f"gv[{r * wg}u]") for r in range(R)]
        em.emit("workgroupBarrier();")   # every total read before the product reuses gv
        for r in range(R):   # the row's scalars (the rsqrt), once: the loop's lets reuse them
            self.em.given[self.op.s] = self.totals[r]
            for n, axes in self.op.hoist:
                em.value(n, self.idx(g[n].shape, axes, r, None))

    # -- step 2: A's values
    def scalar(self, r: int, k: str) -> str:
        self.em.given[self.op.s] = self.totals[r]
        A = self.g[self.op.a]
        k = k if k.isidentifier() or k.startswith("(") else f"({k})"
        return self.em.value(self.op.a, self.idx(A.shape, range(len(A.shape)), r, k))

    def vexpr(self, n: int, axes: tuple, r: int, k: str) -> str:
        """vec4<f32> of node n at row r, A's last index k .. k + 3 (the vec4 form), or a row
        scalar (WGSL multiplies it into a vec4 as is) where n does not run along k."""
        g, em = self.g, self.em
        node = g[n]
        if self.kax not in axes:
            if self.totals:
                em.given[self.op.s] = self.totals[r]
            return em.value(n, self.idx(node.shape, axes, r, None))
        st = self._stored(n)
        if st is not None:
            return self._leaf(n, axes, st, r, k)
        parts = [self.vexpr(i, ax, r, k) for i, ax in zip(node.inputs, input_axes(g, node, axes))]
        if len(parts) == 1:   # a view
            return parts[0]
        return em.let(f"({parts[0]} {_VEC_OPS[node.op]} {parts[1]})")

    def vec4_ok(self, n: int, axes: tuple) -> bool:
        """Does the vec4 form take node n: a row scalar, a stored row along k (_leaf), or
        a sum, difference, product, quotient or view of such?"""
        node = self.g[n]
        if self.kax not in axes:
            return True
        st = self._stored(n)
        if st is not None:
            sh = node.shape
            return (not isinstance(st, QuantOperand) and st.dtype in ("f32", "f16")
                    and sh[-1] % 4 == 0 and st.offset % 4 == 0 and axes[-1] == self.kax
                    and self.kax not in axes[:-1])
        ins = input_axes(self.g, node, axes)
        return ((node.op in _VEC_OPS or node.op in ("reshape", "broadcast_to"))
                and node.dtype == "f32" and ins is not None
                and any(self.kax in ax for ax in ins)   # a vec4, not a scalar broadcast
                and all(self.vec4_ok(i, ax) for i, ax in zip(node.inputs, ins)))

    def _stored(self, n: int):
        return None if n == self.op.a or n in self.em.compute else self.storage(n)

    def _leaf(self, n: int, axes: tuple, st, r: int, k: str) -> str:
        """The vec4 load of stored node n at row r, k .. k + 3 (vec4_ok's conditions)."""
        sh = self.g[n].shape
        base = st.offset + sum(self.digits[r][m] * prod(sh[j + 1:])
                               for j, m in enumerate(axes[:-1]) if m is not None)
        return self.em.let(vec4_reader(self.kernel, st)(f"{base}u + {k}" if base else k))


def _unravel(r: int, shape) -> list[int]:
    out = []
    for d in reversed(shape):
        r, v = divmod(r, d)
        out.append(v)
    return out[::-1]


def row_reader(ctx, em, op: RowOperand, R: int, wg: int, *, vec4: bool):
    """Emit the row sums of A's R rows in a kernel of wg threads (workgroup memory `gv` of
    at least R * wg floats, free until the product's own tree) and return A's reader:
    (row, k) -> A[row, k] (f32), or with vec4 A[row, k .. k + 3] (vec4<f32>; k a multiple
    of 4, the sum's length too). Call in workgroup-uniform control flow."""
    rows = _Rows(ctx, em, op, R, wg)
    top = tuple(range(len(ctx.g[op.a].shape)))
    if vec4 and rows.vec4_ok(ctx.g[op.s].inputs[0], rows.y_axes()) and rows.vec4_ok(op.a, top):
        rows.sums(vec4=True)
        return lambda r, k: rows.vexpr(op.a, top, r, k)
    rows.sums(vec4=False)
    if vec4:
        return lambda r, k: "vec4<f32>({})".format(", ".join(
            rows.scalar(r, f"{k} + {t}u" if t else k) for t in range(4)))
    return rows.scalar


__all__ = ["RowOperand", "input_axes", "row_reader"]
