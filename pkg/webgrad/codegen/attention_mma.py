"""Fused attention on subgroup matrices (tensor cores through WGSL's
chromium_experimental_subgroup_matrix) for programs that round as precision="mixed" or
"f16" do: the products q k^T, p v, g v^T, ds k, p^T g and ds^T q on f16 x f16 -> f32
matrices, the softmax and its gradient in f32 by the workgroup's invocations between them.

Which ops: the half-precision forms attention_match.py makes (the normalized probabilities
are rounded, so the forward is two kernels), each with the tiled kernel's inputs and output
rows (attention_tiled.py's notation: q = A [.., T, D], k^T = B [.., D, S], v, g, lse, Drow):
  op        own rows  streamed  products per streamed block          writes
  attn_lse  queries   keys      S = q k^T                            lse_i
  attn_out  queries   keys      S = q k^T; O += P v                  O_i
  attn_dq   queries   keys      S = q k^T, dP = g v^T; dQ += dS k    dQ_i
  attn_dkv  keys      queries   S^T = k q^T, dP^T = v g^T;           [dK_j | dV_j]
                                dV += P^T g, dK += dS^T q
with P = f16(exp(s - lse)) and dS = f16(P (f16(dP) - Drow) scale), s = f16(q.k) scale
(attention.py's header says where the program rounds; "f16" rounds the scaled score
again). Every accumulation stays in result matrices: the probabilities come from the
saved lse (FA-2's backward form, and the forward's second kernel), so no row of an
accumulator is ever rescaled, which subgroup matrices cannot do.

A workgroup of NSG subgroups owns BR = 16 NSG rows, each subgroup 16 of them; its own
operand rows (q, or k and v for attn_dkv; g for attn_dq) are staged once through
workgroup memory into left matrices held for the whole kernel (D / 16 of each). Per
streamed block of BC rows the invocations copy the block's rows into f16 workgroup arrays
(element by element through the emitter, so views such as a fused QKV projection's slices
and GQA's shared K/V heads are read where they lie); each subgroup multiplies its 16 rows
against them (right matrices loaded column-major for the transposed operands) and stores
its score matrices (f32) to workgroup memory; every invocation then takes 1 / TPR of a
row's block, forms p / ds there and writes them back as f16 left matrices of the output
products. Causal blocks beyond the diagonal are never visited (TilePlan.streamed_range),
rows past T or S are read as zeros and masked. The results go through workgroup memory to
the group's epilogue, a row of result matrices at a time.

Every matrix load and store offset is built from the workgroup's indices, subgroup_id and
loop counters (Tint requires them uniform); the per-invocation work indexes by
local_invocation_index only, so no assumption ties subgroups to invocation ranges beyond
the configuration's fixed subgroup size. KernelOptions.attn_mma: None (default) where the
adapter offers f16 subgroup matrices, True / False forces; KernelOptions.mma_emulate (tests)
emits the same kernels with the matrix builtins replaced by plain WGSL functions
(codegen/mma_emulate.py), so that an adapter without subgroup matrices (lavapipe in CI)
runs their index arithmetic, barriers and rounding.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .attention_tiled_kernel import OperandReads
from .attention_tiled_plan import operands, plan_of
from .elementwise import ROUND_F16_WGSL
from .layout import nonunit_digits, strided_view
from .matmul_mma import config_for
from .mma_emulate import EMULATOR_BYTES, emulate_mma
from .wgsl import f32_lit

@dataclass(frozen=True)
class Staged:
    """An operand's rows staged in workgroup array `arr`: rows x width (fast False), or
    width x rows (fast: its rows were its unit-stride axis), rows `ld` halves apart."""
    arr: str
    fast: bool
    ld: int



OPS = frozenset({"attn_lse", "attn_out", "attn_dq", "attn_dkv"})
NSG = 4                 # subgroups a workgroup
PAD16, PAD32 = 8, 4     # padding at the end of each f16 / f32 workgroup row (16 bytes)
MAX_D = 128             # the widest head held in registers


def _arrays(op: str, BR: int, BC: int, D: int, Dv: int, tpr: int) -> list[tuple[str, str, int, int]]:
    """The workgroup arrays of an op: (name, type, rows, row length with padding). An
    operand's array holds its rows either way round (Staged: rows x width, or width x rows
    where the operand's rows are its unit-stride axis), so it takes the larger."""
    own = max(BR, BC)

    def f16(n, rows, w):
        size = max(rows * (w + PAD16), w * (rows + PAD16))
        return (n, "f16", 1, size) if n not in ("Ps", "PTs", "DSs") else (n, "f16", rows, w + PAD16)
    f32 = lambda n, rows, w: (n, "f32", rows, w + PAD32)
    if op == "attn_lse":
        return [f16("Ks", own, D), f32("Ss", BR, max(BC, 16)), ("red", "f32", 2 * BR * tpr, 0)]
    if op == "attn_out":
        return [f16("Ks", own, D), f16("Vs", BC, Dv), f32("Ss", BR, max(BC, 16)),
                f16("Ps", BR, BC)]
    if op == "attn_dq":
        return [f16("Ks", own, D), f16("Vs", own, Dv), f32("Ss", BR, BC), f32("Dps", BR, BC),
                f16("DSs", BR, BC)]
    return [f16("Qs", own, D), f16("Gs", own, Dv), f32("Ss", BR, BC), f32("Dps", BR, BC),
            f16("PTs", BR, BC), f16("DSs", BR, BC), ("ls", "f32", BC, 0), ("dr", "f32", BC, 0)]


def _bytes(arrays) -> int:
    return sum((2 if ty == "f16" else 4) * rows * max(w, 1) for _, ty, rows, w in arrays)


def mma_blocks(op: str, NR: int, NC: int, D: int, Dv: int, limit: int, size: int = 32):
    """(BR, BC) of an op's kernel, the largest streamed block whose workgroup arrays fit
    `limit` bytes, or None."""
    BR, tpr = 16 * NSG, size * NSG // (16 * NSG)
    for BC in (64, 32, 16):
        if BC > 16 and BC >= 2 * NC:
            continue   # (a short streamed side: no wider block than it needs)
        if BC % tpr == 0 and _bytes(_arrays(op, BR, BC, D, Dv, tpr)) <= limit:
            return BR, BC
    return None


def offered(limits) -> bool:
    """Whether the adapter of codegen `limits` runs these kernels at all: shader-f16 and an
    f16 -> f32 16x16x16 subgroup-matrix configuration, KernelOptions.attn_mma not False."""
    cfg = config_for(getattr(limits, "subgroup_matrix", ()))
    return (limits.options.attn_mma is not False and bool(getattr(limits, "shader_f16", False))
            and cfg is not None and cfg[:3] == (16, 16, 16))


def use_mma(ctx) -> bool:
    """Whether ctx's attention node runs on subgroup matrices: an op of OPS from a program
    that rounds to f16 (attrs mixed), no runtime cache position, head widths multiples of
    16 up to MAX_D, the adapter's f16 -> f32 16x16x16 configuration (or mma_emulate's),
    blocks that fit; KernelOptions.attn_mma None: wherever so, False: never."""
    node, limits = ctx.main_node, ctx.limits
    if not offered(limits) or node.op not in OPS or not node.attrs.get("mixed"):
        return False
    if (node.op == "attn_out" and node.attrs.get("online")) or node.attrs.get("dyn"):
        return False
    cfg = config_for(limits.subgroup_matrix)
    p = plan_of(node, ctx.g, limits)
    if p.D % 16 or p.Dv % 16 or max(p.D, p.Dv) > MAX_D:
        return False
    return mma_blocks(node.op, p.NR, p.NC, p.D, p.Dv, _room(limits), cfg[3]) is not None


def _room(limits) -> int:
    """The workgroup memory these kernels may take (less the emulator's scratch)."""
    return limits.max_compute_workgroup_storage_size - (
        EMULATOR_BYTES * NSG if limits.options.mma_emulate else 0)


class MmaAttention(OperandReads):
    """The WGSL of one attention node on subgroup matrices (use_mma said yes)."""

    def __init__(self, ctx):
        self.ctx, self.g = ctx, ctx.g
        node = ctx.main_node
        limits = ctx.limits
        self.size = config_for(limits.subgroup_matrix)[3]
        base = plan_of(node, ctx.g, limits)
        BR, BC = mma_blocks(node.op, base.NR, base.NC, base.D, base.Dv, _room(limits), self.size)
        self.p = p = replace(base, BR=BR, BC=BC)
        self.ops = operands(node)
        self.round_x = bool(node.attrs.get("round_x"))
        self.wgs = NSG * self.size
        self.tpr = self.wgs // BR                 # invocations per row of a score block
        self.cpt = BC // self.tpr                 # ... each this many columns of it
        self.name = (f"{p.op} [{'x'.join(map(str, p.batch)) or '1'}] T{p.T} S{p.S} D{p.D} "
                     f"mma {BR}x{BC}")
        self.kernel = kernel = ctx.kernel(self.name)
        kernel.f16 = True
        self.ld = {}
        for name, ty, rows, w in _arrays(p.op, BR, BC, p.D, p.Dv, self.tpr):
            self.ld[name] = w
            kernel.decls.append(f"var<workgroup> {name}: array<{ty}, {rows * max(w, 1)}>;")
        self.epi = ctx.epilogue_fn(kernel, (p.nb, p.T) if p.op == "attn_lse" else (p.nb, p.NR, p.Eo)) \
            if len(p.prods) <= 1 or not ctx.writes_pieces else None
        self.em = em = ctx.emitter(kernel)
        self.L = em.emit
        self.grid = kernel.workgroup_index(em, p.nb * p.nblk, "w")
        self.sc = f32_lit(p.scale)
        self.ninf = f32_lit(float("-inf"))
        self.rnd = kernel.helper("wg_round_f16", ROUND_F16_WGSL)
        self.left = "subgroup_matrix_left<f16, 16, 16>"
        self.right = "subgroup_matrix_right<f16, 16, 16>"
        self.res = "subgroup_matrix_result<f32, 16, 16>"

    def r(self, x: str) -> str:
        """x rounded to f16 (as an f32), to nearest even (elementwise.wg_round_f16). Not
        WGSL's f16 conversion, which NVIDIA's compiler folds away in f32(f16(x)) (the loss
        of bench/attention_mma.py moved from 1.6e-5 to 4.2e-4 of the unfused program's);
        a value so rounded converts to f16 exactly."""
        return f"{self.rnd}({x})"

    # -- the workgroup
    def open(self) -> None:
        p, em, L = self.p, self.em, self.L
        self.block_order()
        L(f"let r0 = blk * {p.BR}u;")
        # the invocation's row of a score block and its first column there
        L(f"let er = lid / {self.tpr}u;")
        L(f"let ec = (lid % {self.tpr}u) * {self.cpt}u;")
        L(f"let egr = r0 + er;")
        em.declare("bo", "r0", "blk", "er", "ec", "egr")
        self.batch_dims()
        cbeg, cend = p.streamed_range()
        self.cbeg, self.cend = em.let(cbeg), em.let(cend)

    def rows_fast(self, n: int, row_axis: int) -> bool:
        """Whether operand n's rows (its axis row_axis, -2 or -1) are the unit-stride axis of
        the tensor it views and its other axis is not (a stored k^T [.., D, S] read as k's
        rows, or a transposed view)."""
        view = strided_view(self.g, n, self.ctx._low.fu.operand_base)
        if view is None:
            return False
        unit = {a: any(st == 1 for _, st in nonunit_digits(view[2][a])) for a in (-2, -1)}
        return unit[row_axis] and not unit[-3 - row_axis]

    def stage(self, arr: str, rows: int, width: int, row0: str, total: int, load,
              fast: bool) -> "Staged":
        """X[rr][d] = f16(load(row0 + rr, d)) for rr < rows, d < width into arr, zeros past
        `total` rows: as rows x width (row-major, d fastest across invocations), or, `fast`
        (the operand's rows are its unit-stride axis), as width x rows, rr fastest: either
        way the invocations' reads are coalesced and their stores neighbours."""
        em, L = self.em, self.L
        st = Staged(arr, fast, (rows if fast else width) + PAD16)
        n = rows * width
        for t in range(-(-n // self.wgs)):
            e = f"lid + {t * self.wgs}u" if t else "lid"
            with em.block("" if (t + 1) * self.wgs <= n else f"if ({e} < {n}u)"):
                inner = rows if fast else width
                a, b = em.let(f"({e}) / {inner}u"), em.let(f"({e}) % {inner}u")
                rr, d = (b, a) if fast else (a, b)
                row = em.let(f"{row0} + {rr}")
                val = load(f"min({row}, {total - 1}u)", d)
                L(f"{arr}[{a} * {st.ld}u + {b}] = f16(select(0.0f, {val}, {row} < {total}u));")
        return st

    def load(self, typ: str, st: "Staged", row0: str, d0: int, transposed: bool) -> str:
        """A matrix of the staged operand: 16 of its rows from row0 (WGSL, uniform) by 16 of
        its columns from d0, as `typ` (self.left / self.right); transposed: its columns are
        the matrix's rows (a right matrix k^T, v^T, g^T or q^T of the streamed rows)."""
        at = f"({d0}u) * {st.ld}u + {row0}" if st.fast else f"({row0}) * {st.ld}u + {d0}u"
        return (f"subgroupMatrixLoad<{typ}>(&{st.arr}, {at}, "
                f"{'true' if st.fast != transposed else 'false'}, {st.ld}u)")

    def own_fragments(self, arr: str, prefix: str, width: int, n: int, row_axis: int, load) -> list[str]:
        """The own rows' left matrices (width / 16 of them, this subgroup's 16 rows), staged
        through `arr` (operand n, its rows on axis row_axis)."""
        p = self.p
        st = self.stage(arr, p.BR, width, "r0", p.NR, load, self.rows_fast(n, row_axis))
        self.L("workgroupBarrier();")
        names = []
        for d in range(width // 16):
            names.append(f"{prefix}{d}")
            self.L(f"let {prefix}{d} = {self.load(self.left, st, 'sg * 16u', 16 * d, False)};")
        self.L("workgroupBarrier();")
        return names

    def scores(self, out: str, own: list[str], st: "Staged") -> None:
        """Each subgroup's 16 rows against the block's staged rows (own . streamed over the
        width of own's matrices, the streamed side as right matrices of its transpose),
        stored f32 to `out` at the subgroup's rows."""
        p, L = self.p, self.L
        lo = self.ld[out]
        for n in range(p.BC // 16):
            L(f"var {out}_{n} = {self.res}();")
            for d, f in enumerate(own):
                L(f"{out}_{n} = subgroupMatrixMultiplyAccumulate({f}, "
                  f"{self.load(self.right, st, f'{16 * n}u', 16 * d, True)}, {out}_{n});")
            L(f"subgroupMatrixStore(&{out}, sg * {16 * lo}u + {16 * n}u, {out}_{n}, false, {lo}u);")

    def product(self, accs: list[str], left: str, right: "Staged") -> None:
        """accs[e] += left (the subgroup's 16 rows of a BC-wide f16 block) @ the staged
        operand's BC rows (its columns 16 e ..)."""
        p, L = self.p, self.L
        ll = self.ld[left]
        for kk in range(p.BC // 16):
            L(f"let {left}_l{kk} = subgroupMatrixLoad<{self.left}>(&{left}, sg * {16 * ll}u + "
              f"{16 * kk}u, false, {ll}u);")
            for e, acc in enumerate(accs):
                L(f"{acc} = subgroupMatrixMultiplyAccumulate({left}_l{kk}, "
                  f"{self.load(self.right, right, f'{16 * kk}u', 16 * e, False)}, {acc});")

    def score(self, s: str) -> str:
        """The program's scaled score from a product's f32 sum."""
        x = f"{self.r(s)} * {self.sc}"
        return self.r(x) if self.round_x else x

    def each(self, body) -> None:
        """body(c, gc): for each of the invocation's columns c of its row er of the block
        (gc: the streamed row c0 + c)."""
        em = self.em
        with em.block(f"for (var j = 0u; j < {self.cpt}u; j++)"):
            c = em.let("ec + j")
            body(c, em.let(f"c0 + {c}"))

    def kept(self, gc: str) -> str:
        return self.em.let(self.p.kept("egr", gc))

    def accumulators(self, prefix: str, width: int) -> list[str]:
        names = [f"{prefix}{e}" for e in range(width // 16)]
        for n in names:
            self.L(f"var {n} = {self.res}();")
        return names

    def write(self, accs: list[str], col0: int, epi: str, post: str | None = None) -> None:
        """The accumulators' rows through Ss to the epilogue: columns col0 + 16 e of the own
        rows below NR, BC / 16 result matrices a round."""
        p, em, L, ld = self.p, self.em, self.L, self.ld["Ss"]
        per = max(1, min(len(accs), (ld - PAD32) // 16))
        for j0 in range(0, len(accs), per):
            part = accs[j0:j0 + per]
            for j, acc in enumerate(part):
                L(f"subgroupMatrixStore(&Ss, sg * {16 * ld}u + {16 * j}u, {acc}, false, {ld}u);")
            L("workgroupBarrier();")
            w = 16 * len(part)
            with em.block(f"for (var t = lid; t < {p.BR * w}u; t += {self.wgs}u)"):
                rr, cc = em.let(f"t / {w}u"), em.let(f"t % {w}u")
                with em.block(f"if (r0 + {rr} < {p.NR}u)"):
                    v = f"Ss[{rr} * {ld}u + {cc}]" + (f" * {post}" if post else "")
                    L(f"{epi}(bo, r0 + {rr}, {col0 + 16 * j0}u + {cc}, {v});")
            L("workgroupBarrier();")

    # -- the ops
    def build_lse(self) -> None:
        p, em, L = self.p, self.em, self.L
        qf = self.own_fragments("Ks", "qf", p.D, self.ops.q, -2, self.Q)
        m, l = em.var("f32", self.ninf, "m"), em.var("f32", "0.0f", "l")
        ls = self.ld["Ss"]
        kfast = self.rows_fast(self.ops.kt, -1)
        with em.block(f"for (var c0 = {self.cbeg}; c0 < {self.cend}; c0 += {p.BC}u)"):
            kst = self.stage("Ks", p.BC, p.D, "c0", p.NC, lambda j, d: self.K(j, d), kfast)
            L("workgroupBarrier();")
            self.scores("Ss", qf, kst)
            L("workgroupBarrier();")
            bm = em.var("f32", self.ninf, "bm")

            def mx(c, gc):   # the masked scaled scores, kept for the sums
                at = em.let(f"er * {ls}u + {c}")
                x = em.let(f"select({self.ninf}, {self.score(f'Ss[{at}]')}, {self.kept(gc)})")
                L(f"Ss[{at}] = {x};")
                L(f"{bm} = max({bm}, {x});")
            self.each(mx)
            mn = em.let(f"max({m}, {bm})")
            mz = em.let(f"select({mn}, 0.0f, {mn} == {self.ninf})")
            L(f"{l} = {l} * exp({m} - {mz});")

            def sm(c, gc):
                L(f"{l} = {l} + exp(Ss[er * {ls}u + {c}] - {mz});")
            self.each(sm)
            L(f"{m} = {mn};")
            L("workgroupBarrier();")
        tpr = self.tpr
        L(f"red[lid] = {m};")
        L(f"red[{self.wgs}u + lid] = {l};")
        L("workgroupBarrier();")
        with em.block(f"if (lid % {tpr}u == 0u && egr < {p.NR}u)"):
            L("var mm: f32 = red[lid];")
            with em.block(f"for (var t = 1u; t < {tpr}u; t++)"):
                L("mm = max(mm, red[lid + t]);")
            L(f"let mz = select(mm, 0.0f, mm == {self.ninf});")
            L("var ll: f32 = 0.0f;")
            with em.block(f"for (var t = 0u; t < {tpr}u; t++)"):
                L(f"ll = ll + red[{self.wgs}u + lid + t] * exp(red[lid + t] - mz);")
            L(f"{self.epi}(bo, egr, mm + log(ll));")

    def keys_values(self) -> tuple["Staged", "Staged"]:
        """The query kernels' streamed block: its keys' and values' rows staged (Ks, Vs),
        then a barrier."""
        p = self.p
        kst = self.stage("Ks", p.BC, p.D, "c0", p.NC, lambda j, d: self.K(j, d),
                         self.rows_fast(self.ops.kt, -1))
        vst = self.stage("Vs", p.BC, p.Dv, "c0", p.NC, self.V, self.rows_fast(self.ops.v, -2))
        self.L("workgroupBarrier();")
        return kst, vst

    def build_out(self) -> None:
        p, em, L = self.p, self.em, self.L
        qf = self.own_fragments("Ks", "qf", p.D, self.ops.q, -2, self.Q)
        lse = em.let(self.stat(self.ops.lse, f"min(egr, {p.T - 1}u)"))
        acc = self.accumulators("o", p.Dv)
        ls, lp = self.ld["Ss"], self.ld["Ps"]
        with em.block(f"for (var c0 = {self.cbeg}; c0 < {self.cend}; c0 += {p.BC}u)"):
            kst, vst = self.keys_values()
            self.scores("Ss", qf, kst)
            L("workgroupBarrier();")

            def pr(c, gc):
                x = self.score(f"Ss[er * {ls}u + {c}]")
                px = self.r(f"exp({x} - {lse})")
                L(f"Ps[er * {lp}u + {c}] = f16(select(0.0f, {px}, {self.kept(gc)}));")
            self.each(pr)
            L("workgroupBarrier();")
            self.product(acc, "Ps", vst)
            L("workgroupBarrier();")
        self.write(acc, 0, self.epi)

    def build_dq(self) -> None:
        p, em, L = self.p, self.em, self.L
        qf = self.own_fragments("Ks", "qf", p.D, self.ops.q, -2, self.Q)
        gf = self.own_fragments("Vs", "gf", p.Dv, self.ops.g, -2, self.G)
        lse = em.let(self.stat(self.ops.lse, f"min(egr, {p.T - 1}u)"))
        dr = em.let(self.stat(self.ops.drow, f"min(egr, {p.T - 1}u)"))
        acc = self.accumulators("dq", p.D)
        ls, ld = self.ld["Ss"], self.ld["DSs"]
        with em.block(f"for (var c0 = {self.cbeg}; c0 < {self.cend}; c0 += {p.BC}u)"):
            kst, vst = self.keys_values()
            self.scores("Ss", qf, kst)
            self.scores("Dps", gf, vst)
            L("workgroupBarrier();")

            def ds(c, gc):
                at = em.let(f"er * {ls}u + {c}")
                x = self.score(f"Ss[{at}]")
                pr = em.let(f"select(0.0f, exp({x} - {lse}), {self.kept(gc)})")
                dp = self.r(f"Dps[{at}]")
                L(f"DSs[er * {ld}u + {c}] = f16({self.r(f'{pr} * ({dp} - {dr}) * {self.sc}')});")
            self.each(ds)
            L("workgroupBarrier();")
            self.product(acc, "DSs", kst)
            L("workgroupBarrier();")
        self.write(acc, 0, self.epi)

    def build_dkv(self) -> None:
        p, em, L = self.p, self.em, self.L
        kf = self.own_fragments("Qs", "kf", p.D, self.ops.kt, -1, lambda j, d: self.K(j, d))
        vf = self.own_fragments("Gs", "vf", p.Dv, self.ops.v, -2, self.V)
        qfast, gfast = self.rows_fast(self.ops.q, -2), self.rows_fast(self.ops.g, -2)
        dv, dk = self.accumulators("dv", p.Dv), self.accumulators("dk", p.D)
        ls, lp = self.ld["Ss"], self.ld["PTs"]
        with em.block(f"for (var c0 = {self.cbeg}; c0 < {self.cend}; c0 += {p.BC}u)"):
            qst = self.stage("Qs", p.BC, p.D, "c0", p.NC, self.Q, qfast)
            gst = self.stage("Gs", p.BC, p.Dv, "c0", p.NC, self.G, gfast)
            with em.block(f"if (lid < {p.BC}u)"):
                q = em.let(f"min(c0 + lid, {p.T - 1}u)")
                L(f"ls[lid] = {self.stat(self.ops.lse, q)};")
                L(f"dr[lid] = {self.stat(self.ops.drow, q)};")
            L("workgroupBarrier();")
            self.scores("Ss", kf, qst)
            self.scores("Dps", vf, gst)
            L("workgroupBarrier();")

            def pds(c, gc):
                at = em.let(f"er * {ls}u + {c}")
                x = self.score(f"Ss[{at}]")
                pr = em.let(f"select(0.0f, exp({x} - ls[{c}]), {self.kept(gc)})")
                dp = self.r(f"Dps[{at}]")
                L(f"PTs[er * {lp}u + {c}] = f16({self.r(pr)});")
                L(f"DSs[er * {lp}u + {c}] = f16({self.r(f'{pr} * ({dp} - dr[{c}]) * {self.sc}')});")
            self.each(pds)
            L("workgroupBarrier();")
            self.product(dv, "PTs", gst)
            self.product(dk, "DSs", qst)
            L("workgroupBarrier();")
        per_prod = self.ctx.writes_pieces
        for (width, col0, _), accs in zip(p.prods, (dv, dk)):
            epi = (self.ctx.epilogue_fn(self.kernel, (p.nb, p.NR, p.Eo), (col0, col0 + width))
                   if per_prod else self.epi)
            self.write(accs, col0, epi)

    def source(self) -> str:
        src = self.kernel.source(self.em.lines, workgroup_size=self.wgs)
        head = "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {"
        assert head in src
        src = src.replace(head, head[:-3] + ", @builtin(subgroup_id) sg: u32) {")
        src = src.replace("enable f16;\n", "enable f16;\nenable subgroups;\n"
                          "enable chromium_experimental_subgroup_matrix;\n", 1)
        if self.ctx.limits.options.mma_emulate:
            src = emulate_mma(src)
        return src


def build_mma(ctx) -> list[dict]:
    """The kernel of ctx's attention node on subgroup matrices (use_mma(ctx) is true)."""
    k = MmaAttention(ctx)
    k.open()
    {"attn_lse": k.build_lse, "attn_out": k.build_out, "attn_dq": k.build_dq,
     "attn_dkv": k.build_dkv}[k.p.op]()
    return [{"wgsl": k.source(), "bindings": [b.buffer for b in k.kernel.bindings],
             "workgroups": k.grid, "name": k.name}]


__all__ = ["offered", "use_mma", "build_mma", "mma_blocks", "OPS"]
