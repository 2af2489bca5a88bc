"""The WGSL of a tiled attention kernel, stage by stage, from its TilePlan
(codegen/attention_tiled_plan.py).

TiledKernel has one method per stage, in the order codegen/attention_tiled.py's build_tiled
calls them: the workgroup's rows and causal range (open), the tile loads (fetch, put) and
D-chunk products (dot_tiles), the reductions across a row's threads (across_row), the scores
and softmax weights of a streamed block (scores, weights), the output products (accumulate),
and the per-op epilogues (epilogue_lse for attn_lse; epilogue_rows for the others: attn_fwd's
O and lse columns, attn_dq's scaled rows, attn_dkv's dK and dV pieces). The design and its
measurements are in attention_tiled.py's header. Under precision="mixed" (the node's attrs
mixed) the scores, dp, the probabilities of the p products and the scaled ds are rounded
to f16 where attention.py's header says (r, elementwise.wg_round_f16).
"""
from __future__ import annotations

from .attention_tiled_plan import PREFETCH_D_MAX, Operands, TilePlan, padded
from .elementwise import ROUND_F16_WGSL
from .emit import Idx
from .wgsl import f32_lit, thread_xy, u32_lit


def _max(xs: list[str]) -> str:
    return xs[0] if len(xs) == 1 else f"max({xs[0]}, {_max(xs[1:])})"


def _vty(w: int) -> str:
    return "f32" if w == 1 else f"vec{w}<f32>"


def _comp(x: str, w: int, i: int) -> str:
    return x if w == 1 else f"{x}.{'xyzw'[i]}"


def _put(arr: str, w: int, q: str, v: str) -> str:
    """Store scalar v at word q of a shared array of vec{w}."""
    if w == 1:
        return f"{arr}[{q}] = {v};"
    sh = {2: 1, 4: 2}[w]
    return f"{{ let q = {q}; {arr}[q >> {sh}u][q & {w - 1}u] = {v}; }}"


class OperandReads:
    """What a fused attention kernel of TilePlan self.p (this module's and attention_mma's)
    shares: the workgroup's block in launch order, and its operands' elements (self.g,
    self.em, self.ops; self.bdims, batch element bo's indices, set by block_order)."""

    def block_order(self) -> None:
        """`let blk` (the workgroup's block of own rows) and `let bo` (its batch element)
        from the workgroup index w, and bo's indices over the batch."""
        p, L = self.p, self.em.emit
        nb, nblk = p.nb, p.nblk
        if p.off is not None and p.opts.attn_opt("heavy_first") and nblk > 1:
            # causal: block-major order, the blocks with the most streamed rows first (a query
            # kernel's last blocks, a key kernel's first) so that the short ones fill the tail
            L(f"let bo = w % {nb}u;")
            L(f"let blk = {'' if p.per_key else f'{nblk - 1}u - '}w / {nb}u;")
        else:
            L(f"let blk = w % {nblk}u;")
            L(f"let bo = w / {nblk}u;")

    def batch_dims(self) -> None:
        self.bdims = self.em.unravel("bo", self.p.batch) if self.p.batch else []

    # -- operands at (their last two dims), batch element bo
    def at(self, n, last):
        shape = self.g[n].shape
        k0 = len(shape) - len(last)
        r = len(self.p.batch) - k0
        dims = [u32_lit(0) if shape[k] == 1 else self.bdims[r + k] for k in range(k0)] + last
        return self.em.value(n, Idx(shape, dims=dims))

    def Q(self, i, d): return self.at(self.ops.q, [i, d])
    def K(self, j, d): return self.at(self.ops.kt, [d, j])
    def V(self, j, e): return self.at(self.ops.v, [j, e])
    def G(self, i, e): return self.at(self.ops.g, [i, e])

    def stat(self, n, i):  # lse / Drow of query i ([batch.., T])
        return self.em.value(n, Idx(self.g[n].shape, flat=self.em.let(f"bo * {self.p.T}u + {i}")))


class TiledKernel(OperandReads):
    """The WGSL of one planned kernel, emitted stage by stage (build_tiled calls them in
    order; the emitter's names follow that order, so the stages must keep it)."""

    def __init__(self, ctx, plan: TilePlan, ops: Operands):
        self.ctx, self.p, self.ops, self.g = ctx, plan, ops, ctx.g
        p = plan
        self.kernel = kernel = ctx.kernel(p.name)
        for name, w, n in p.shared_arrays():
            kernel.decls.append(f"var<workgroup> {name}: array<{_vty(w)}, {n}>;")
        # the epilogue takes (batch element, row, column): a store through views (the QKV
        # gradient assembled in place, fusion_sums._assemble) regroups them, not a flat index
        # (or one per product: epilogue_rows)
        self.epi = ctx.epilogue_fn(kernel, (p.nb, p.T) if p.op == "attn_lse" else (p.nb, p.NR, p.Eo)) \
            if len(p.prods) <= 1 or not ctx.writes_pieces else None
        self.em = ctx.emitter(kernel)
        self.L = self.em.emit
        self.grid = kernel.workgroup_index(self.em, p.nb * p.nblk, "w")  # uniform: barriers legal
        self.sc = f32_lit(p.scale)
        self.ninf = f32_lit(float("-inf"))
        self.mixed = ctx.main_node.attrs.get("mixed", False)
        if p.per_key:
            self.own_load, self.str_load = self.K, self.Q
            self.dp_own, self.dp_str = self.V, self.G
            self.X_loads = {"attn_dv": [self.G], "attn_dk": [self.Q], "attn_dkv": [self.G, self.Q]}[p.op]
        else:
            self.own_load, self.str_load = self.Q, self.K
            self.dp_own, self.dp_str = self.G, self.V
            self.X_loads = {"attn_out": [self.V], "attn_fwd": [self.V], "attn_dq": [self.K]}.get(p.op, [])

    # -- the workgroup: its block, threads, runtime offset, streamed range and own rows
    def open(self) -> None:
        p, em, L = self.p, self.em, self.L
        self.block_order()
        for line in thread_xy(p.WX, p.WY, p.opts.attn_opt("warp_tiles")):
            L(line)
        L(f"let r0 = blk * {p.BR}u;")
        em.declare("bo", "r0")
        self.batch_dims()
        # the causal limit: key j is kept for query i iff j <= i + off (+ dyn)
        if p.dyn:
            pn = self.ops.pos
            self.kernel.decls.append("var<workgroup> wdyn: i32;")
            with em.block("if (lid == 0u)"):
                L(f"wdyn = i32({em.value(pn, Idx(self.g[pn].shape, flat=u32_lit(0)))});")
            L("let dyn = workgroupUniformLoad(&wdyn);")
        cbeg, cend = p.streamed_range()
        self.cbeg, self.cend = em.let(cbeg), em.let(cend)
        self.own_rows = [em.let(f"r0 + {p.row(a)}") for a in range(p.TR)]

    # -- loads and stores of tiles
    def fetch(self, store, nrows, nk, row0, rows_total, k0, k_total, load, rows_exact=False,
              k_exact=False):
        """The global loads of a tile: word store(rr, kk) = load(row0 + rr, k0 + kk) for
        rr < nrows, kk < nk (kk fastest across threads: coalesced reads), zero outside
        rows_total x k_total (no test where rows_exact / k_exact say the tile lies inside).
        Returns [(condition or None, word, value)] for put: the loads are `let`s in the
        current scope, so they can be issued well before the stores (prefetch)."""
        em, NT, opts = self.em, self.p.NT, self.p.opts
        n = nrows * nk
        rows_exact = rows_exact and opts.attn_opt("exact")
        k_exact = k_exact and opts.attn_opt("exact")
        items = []
        for t in range(-(-n // NT)):
            e = f"lid + {t * NT}u" if t else "lid"
            partial = (t + 1) * NT > n  # some threads have no word: load a clamped one
            ee = em.let(f"min({e}, {n - 1}u)") if partial else e
            rr, kk = em.let(f"({ee}) / {nk}u"), em.let(f"({ee}) % {nk}u")
            row, k = em.let(f"{row0} + {rr}"), em.let(f"{k0} + {kk}")
            conds = ([] if rows_exact else [f"{row} < {rows_total}u"]) + \
                ([] if k_exact else [f"{k} < {k_total}u"])
            val = load(row if rows_exact else f"min({row}, {rows_total - 1}u)",
                       k if k_exact else f"min({k}, {k_total - 1}u)")
            if conds:
                val = f"select(0.0f, {val}, {' && '.join(conds)})"
            items.append((f"{e} < {n}u" if partial else None, store(rr, kk), em.let(val)))
        return items

    def put(self, arr, w, items):
        """The stores of fetch's words into arr (of vec{w}; an alias: its words of As)."""
        arr, base = self.p.alias.get(arr, (arr, 0))
        for cond, q, v in items:
            q = f"{base}u + {q}" if base else q
            if cond:
                with self.em.block(f"if ({cond})"):
                    self.L(_put(arr, w, q, v))
            else:
                self.L(_put(arr, w, q, v))

    def dot_tiles(self, accs, width, own_load, str_load):
        """accs[a][b] += own row a . streamed row b (the thread's), over width: D chunks of
        DK staged in As / Bs, the next chunk's loads issued before this one's products
        where the op prefetches and there are few chunks."""
        p, em, L = self.p, self.em, self.L
        DK, LDA, LDB, WR, WC, WY, WX = p.DK, p.LDA, p.LDB, p.WR, p.WC, p.WY, p.WX

        def tiles(d0):
            return (self.fetch(lambda rr, kk: f"{kk} * {LDA}u + {rr}", p.BR, DK, "r0", p.NR, d0,
                               width, own_load, p.NR % p.BR == 0, width % DK == 0),
                    self.fetch(lambda rr, kk: f"{kk} * {LDB}u + {rr}", p.BC, DK, "c0", p.NC, d0,
                               width, str_load, p.NC % p.BC == 0 and not p.causal_tail,
                               width % DK == 0))

        bs, boff = p.alias.get("Bs", ("Bs", 0))

        def products():
            for dd in range(DK):
                xs = [em.fresh("x") for _ in range(p.TR // WR)]
                ys = [em.fresh("y") for _ in range(p.TC // WC)]
                for h, x in enumerate(xs):
                    L(f"let {x} = As[{dd * LDA // WR + WY * h}u + ty];")
                for h, y in enumerate(ys):
                    L(f"let {y} = {bs}[{(boff + dd * LDB) // WC + WX * h}u + tx];")
                for a in range(p.TR):
                    for b in range(p.TC):
                        L(f"{accs[a][b]} = fma({_comp(xs[a // WR], WR, a % WR)}, "
                          f"{_comp(ys[b // WC], WC, b % WC)}, {accs[a][b]});")

        nch = -(-width // DK)
        if p.prefetch_d and nch <= PREFETCH_D_MAX:
            cur = tiles("0u")
            for ci in range(nch):
                self.put("As", WR, cur[0])
                self.put("Bs", WC, cur[1])
                L("workgroupBarrier();")
                if ci + 1 < nch:
                    cur = tiles(f"{(ci + 1) * DK}u")
                products()
                L("workgroupBarrier();")
            return
        with em.block(f"for (var d0 = 0u; d0 < {width}u; d0 += {DK}u)"):
            own, streamed = tiles("d0")
            self.put("As", WR, own)
            self.put("Bs", WC, streamed)
            L("workgroupBarrier();")
            products()
            L("workgroupBarrier();")

    def across_row(self, values, name, combine):
        """Each own row's value (one per thread) combined over the row's WX threads through
        workgroup memory (red, or As where _red_in_as): one new variable per row,
        combine(r, x) folding the WX entries in order from the first."""
        p, em, L = self.p, self.em, self.L
        WX, WR = p.WX, p.WR
        for a in range(p.TR):
            q = f"({p.row(a)}) * {WX}u + tx"
            L(_put("As", WR, q, values[a]) if p.red_in_as else f"red[{q}] = {values[a]};")
        L("workgroupBarrier();")
        out = []
        for a in range(p.TR):
            base = f"({p.row(a)}) * {WX}u"
            r = em.fresh(name)
            if p.red_in_as and WR == 4:  # the row's WX entries as WX / 4 vec4 reads
                vs = [em.let(f"As[({p.row(a)}) * {WX // 4}u + {i}u]") for i in range(WX // 4)]
                xs = [f"{v}.{c}" for v in vs for c in "xyzw"]
            elif p.red_in_as:
                sh = {1: 0, 2: 1}[WR]
                xs = [f"As[({base} + {t}u) >> {sh}u]" + (f"[({base} + {t}u) & 1u]" if WR == 2 else "")
                      for t in range(WX)]
            else:
                xs = None
            if xs is not None:
                L(f"var {r}: f32 = {xs[0]};")
                for x in xs[1:]:
                    L(f"{r} = {combine.format(r=r, x=x)};")
            else:
                L(f"var {r}: f32 = red[{base}];")
                with em.block(f"for (var t = 1u; t < {WX}u; t++)"):
                    L(f"{r} = {combine.format(r=r, x=f'red[{base} + t]')};")
            out.append(r)
        return out

    # -- own-row statistics and the accumulators, before the streamed loop
    def accumulators(self) -> None:
        p, em = self.p, self.em
        self.own_lse = self.own_dr = None
        if not p.per_key and self.ops.lse is not None:  # query kernels: read once
            self.own_lse = [em.let(self.stat(self.ops.lse, f"min({r}, {p.T - 1}u)"))
                            for r in self.own_rows]
        if not p.per_key and self.ops.drow is not None:
            self.own_dr = [em.let(self.stat(self.ops.drow, f"min({r}, {p.T - 1}u)"))
                           for r in self.own_rows]
        self.accs = [[[em.var("f32", "0.0f", "o") for _ in range(padded(w, p.WX) // p.WX)]
                      for _ in range(p.TR)] for w, _, _ in p.prods]
        running = p.op == "attn_lse" or p.online
        self.m_run = [em.var("f32", self.ninf, "m") for _ in range(p.TR)] if running else []
        self.l_run = [em.var("f32", "0.0f", "l") for _ in range(p.TR)] if running else []

    # -- one streamed block (inside the loop over c0)
    def x_rows(self, k, x0):
        """The loads of the XK rows x0.. of X for product k."""
        p = self.p
        width = p.prods[k][0]
        x_exact = p.NC % p.BC == 0 and p.BC % p.XK == 0 and not p.causal_tail
        return self.fetch(lambda rr, kk: f"{rr} * {p.EP}u + {kk}", p.XK, padded(width, p.WX),
                          f"c0 + {x0}", p.NC, "0u", width, self.X_loads[k], x_exact,
                          padded(width, p.WX) == width)

    def prefetch_x(self):
        """Every X row of the block, loaded before the scores (None where the op does not
        prefetch). X rows past a causal block's last kept one are real rows times W = 0."""
        p = self.p
        if not p.prefetch_x:
            return None
        return [[self.x_rows(k, f"{x0}u") for x0 in range(0, p.BC, p.XK)]
                for k in range(len(p.prods))]

    def scores(self):
        """The thread's scores s (own . streamed over D) and, for dq / dk / dkv, dp (g . v
        over Dv); then the block's streamed columns and (key kernels) their statistics."""
        p, em = self.p, self.em
        s = [[em.var("f32", "0.0f", "s") for _ in range(p.TC)] for _ in range(p.TR)]
        self.dot_tiles(s, p.D, self.own_load, self.str_load)
        dp = None
        if p.two_dots:
            dp = [[em.var("f32", "0.0f", "p") for _ in range(p.TC)] for _ in range(p.TR)]
            self.dot_tiles(dp, p.Dv, self.dp_own, self.dp_str)
        if self.mixed:  # q.k and g.v rounded to f16, as the program's products are; the
            # scores scaled here (round_x: rounded again), so that weights() reads them as
            # they are (scaled)
            rx = self.ctx.main_node.attrs.get("round_x", False)
            for a in range(p.TR):
                for b in range(p.TC):
                    x = f"{self.r(s[a][b])} * {self.sc}"
                    self.L(f"{s[a][b]} = {self.r(x) if rx else x};")
                    if dp is not None:
                        self.L(f"{dp[a][b]} = {self.r(dp[a][b])};")
        self.cols = [em.let(f"c0 + {p.col(b)}") for b in range(p.TC)]
        self.str_lse = self.str_dr = None
        if p.per_key:
            self.str_lse = [em.let(self.stat(self.ops.lse, f"min({c}, {p.T - 1}u)")) for c in self.cols]
            if self.ops.drow is not None:
                self.str_dr = [em.let(self.stat(self.ops.drow, f"min({c}, {p.T - 1}u)"))
                               for c in self.cols]
        return s, dp

    def kept(self, a, b):
        return self.em.let(self.p.kept(self.own_rows[a], self.cols[b]))

    def scaled(self, s: str) -> str:
        """The score s times the scale (mixed: scores() scaled it already)."""
        return s if self.mixed else f"{s} * {self.sc}"

    def r(self, x: str) -> str:
        """x rounded to f16 (as an f32) where the program rounds (mixed), else x."""
        return f"{self.kernel.helper('wg_round_f16', ROUND_F16_WGSL)}({x})" if self.mixed else x

    def weights(self, s, dp):
        """The softmax statistics of the block and the W tiles of its output products:
        attn_lse's per-thread running (max, sum); the online softmax's rescaled p (its row
        maximum across threads); else p from the saved lse, ds = p (dp - Drow) where dp is
        there. Returns [W of each product] (attn_dkv: p for dV, ds for dK)."""
        p, em, L, ninf, sc = self.p, self.em, self.L, self.ninf, self.sc
        TR, TC = p.TR, p.TC
        xsc = [[em.let(f"select({ninf}, {self.scaled(s[a][b])}, {self.kept(a, b)})") for b in range(TC)]
               for a in range(TR)] if p.op == "attn_lse" or p.online else None
        w = [[None] * TC for _ in range(TR)]
        w2 = None
        if p.op == "attn_lse":  # per-thread running (max, sum) over the thread's columns
            m_run, l_run = self.m_run, self.l_run
            for a in range(TR):
                mn = em.let(f"max({m_run[a]}, {_max(xsc[a])})")
                mz = em.let(f"select({mn}, 0.0f, {mn} == {ninf})")  # no -inf - -inf
                terms = " + ".join(f"exp({x} - {mz})" for x in xsc[a])
                L(f"{l_run[a]} = {l_run[a]} * exp({m_run[a]} - {mz}) + {terms};")
                L(f"{m_run[a]} = {mn};")
        elif p.online:  # the row's maximum over this block
            m_run, l_run, acc = self.m_run, self.l_run, self.accs[0]
            TE = padded(p.prods[0][0], p.WX) // p.WX
            row_max = self.across_row([_max(xsc[a]) for a in range(TR)], "rm", "max({r}, {x})")
            for a in range(TR):
                mn = em.let(f"max({m_run[a]}, {row_max[a]})")
                mz = em.let(f"select({mn}, 0.0f, {mn} == {ninf})")
                al = em.let(f"exp({m_run[a]} - {mz})")
                for b in range(TC):
                    w[a][b] = em.let(f"exp({xsc[a][b]} - {mz})")
                L(f"{l_run[a]} = {l_run[a]} * {al} + {' + '.join(w[a])};")
                for e in range(TE):
                    L(f"{acc[a][e]} = {acc[a][e]} * {al};")
                L(f"{m_run[a]} = {mn};")
        else:
            if p.op == "attn_dkv":
                w2 = [[None] * TC for _ in range(TR)]
            for a in range(TR):
                for b in range(TC):
                    lse = self.str_lse[b] if p.per_key else self.own_lse[a]
                    pr = em.let(f"select(0.0f, exp({self.scaled(s[a][b])} - {lse}), {self.kept(a, b)})")
                    if dp is not None:
                        dr = self.str_dr[b] if p.per_key else self.own_dr[a]
                        ds = em.let(self.r(f"{pr} * ({dp[a][b]} - {dr}) * {sc}") if self.mixed
                                    else f"{pr} * ({dp[a][b]} - {dr})")
                    if self.mixed and (dp is None or p.op == "attn_dkv"):
                        pr = em.let(self.r(pr))  # the probability of a p product (O, dV)
                    if p.op == "attn_dkv":
                        w[a][b], w2[a][b] = pr, ds
                    else:
                        w[a][b] = ds if dp is not None else pr
        return [w, w2][:len(p.prods)]

    def accumulate(self, k, wk, x_pre):
        """Output product k: W to Ws (transposed), then acc += W @ X over X's rows staged
        XK at a time (all of them already loaded where x_pre has them)."""
        p, em, L = self.p, self.em, self.L
        WR, WY, LDW, XK, EP, WX = p.WR, p.WY, p.LDW, p.XK, p.EP, p.WX
        width = p.prods[k][0]
        acc = self.accs[k]
        TE = padded(width, WX) // WX
        if p.opts.attn_opt("ws_vec"):  # a thread's rows are WR adjacent words per vector
            for b in range(p.TC):
                for h in range(p.TR // WR):
                    vals = [wk[h * WR + i][b] for i in range(WR)]
                    L(f"Ws[({p.col(b)}) * {LDW // WR}u + {WY * h}u + ty] = "
                      f"{_vty(WR)}({', '.join(vals)});")
        else:
            for a in range(p.TR):
                for b in range(p.TC):
                    L(_put("Ws", WR, f"({p.col(b)}) * {LDW}u + {p.row(a)}", wk[a][b]))
        L("workgroupBarrier();")

        xs_name = p.alias.get("Xs", ("Xs", 0))[0]

        def pv(x0):  # acc += W[:, x0 + xx] X[x0 + xx] over the XK staged rows
            for xx in range(XK):
                wvs = [em.fresh("w") for _ in range(p.TR // WR)]
                for h, wv in enumerate(wvs):
                    L(f"let {wv} = Ws[({x0} + {xx}u) * {LDW // WR}u + {WY * h}u + ty];")
                if p.XV == 4:
                    xv = [em.fresh("x") for _ in range(TE // 4)]
                    for q, nm in enumerate(xv):
                        L(f"let {nm} = {xs_name}[{(xx * EP + 4 * WX * q) // 4}u + tx];")
                    xe = [f"{xv[e // 4]}.{'xyzw'[e % 4]}" for e in range(TE)]
                else:
                    xe = [em.fresh("x") for _ in range(TE)]
                    for e, nm in enumerate(xe):
                        L(f"let {nm} = {xs_name}[{xx * EP + WX * e}u + tx];")
                for a in range(p.TR):
                    for e in range(TE):
                        L(f"{acc[a][e]} = fma({_comp(wvs[a // WR], WR, a % WR)}, {xe[e]}, "
                          f"{acc[a][e]});")
        if x_pre is not None:  # every row of the block, loaded before the scores
            for i, x0 in enumerate(range(0, p.BC, XK)):
                self.put("Xs", p.XV, x_pre[k][i])
                L("workgroupBarrier();")
                pv(f"{x0}u")
                L("workgroupBarrier();")
        else:
            xn = em.let(f"min({p.BC}u, {self.cend} - c0)")  # the last block may be short
            with em.block(f"for (var x0 = 0u; x0 < {xn}; x0 += {XK}u)"):
                self.put("Xs", p.XV, self.x_rows(k, "x0"))
                L("workgroupBarrier();")
                pv("x0")
                L("workgroupBarrier();")

    # -- the epilogues, after the streamed loop
    def epilogue_lse(self) -> None:
        """attn_lse: combine the WX threads' (max, sum) of each row into lse_i."""
        p, em, L, ninf = self.p, self.em, self.L, self.ninf
        WX = p.WX
        for a in range(p.TR):
            L(f"red_m[({p.row(a)}) * {WX}u + tx] = {self.m_run[a]};")
            L(f"red_l[({p.row(a)}) * {WX}u + tx] = {self.l_run[a]};")
        L("workgroupBarrier();")
        with em.block("if (tx == 0u)"):
            for a in range(p.TR):
                base = f"({p.row(a)}) * {WX}u"
                with em.block(f"if ({self.own_rows[a]} < {p.NR}u)"):
                    L(f"var mm: f32 = red_m[{base}];")
                    with em.block(f"for (var t = 1u; t < {WX}u; t++)"):
                        L(f"mm = max(mm, red_m[{base} + t]);")
                    L(f"let mz = select(mm, 0.0f, mm == {ninf});")
                    L("var ll: f32 = 0.0f;")
                    with em.block(f"for (var t = 0u; t < {WX}u; t++)"):
                        L(f"ll = ll + red_l[{base} + t] * exp(red_m[{base} + t] - mz);")
                    L(f"{self.epi}(bo, {self.own_rows[a]}, mm + log(ll));")

    def epilogue_rows(self) -> None:
        """The other ops: each own row's products (O divided by the online row sum; attn_dq's
        and dK's scaled; attn_dkv's dK and dV columns), and attn_fwd's lse_i = m_i + log(sum)
        in the last column."""
        p, em, L = self.p, self.em, self.L
        inv = [None] * p.TR
        if p.online:  # the row sums: each thread holds its columns' part
            row_sum = self.across_row(self.l_run, "ls", "{r} + {x}")
            for a in range(p.TR):
                ls = row_sum[a]
                inv[a] = em.let(f"1.0f / {ls}")
                if p.op == "attn_fwd":  # lse_i = m_i + log(sum), after the row's O
                    with em.block(f"if (tx == 0u && {self.own_rows[a]} < {p.NR}u)"):
                        L(f"{self.epi}(bo, {self.own_rows[a]}, {p.Eo - 1}u, "
                          f"{self.m_run[a]} + log({ls}));")
        # several products (attn_dkv's dK and dV columns) writing pieces of an assembled
        # tensor: an epilogue per product, which knows which piece its columns go to (with
        # one, each value tested its column: attn_dkv ran 7% slower on an H200)
        per_prod = len(p.prods) > 1 and self.ctx.writes_pieces
        epi_k = [self.ctx.epilogue_fn(self.kernel, (p.nb, p.NR, p.Eo), (col0, col0 + width))
                 if per_prod else self.epi for width, col0, _ in p.prods]
        for a in range(p.TR):
            with em.block(f"if ({self.own_rows[a]} < {p.NR}u)"):
                for k, (width, col0, post) in enumerate(p.prods):
                    for e, ce in enumerate(p.out_cols(width)):
                        col = em.let(ce)
                        v = self.accs[k][a][e]
                        if inv[a] is not None:
                            v = f"{v} * {inv[a]}"
                        if post is not None and not self.mixed:  # (mixed: ds is scaled)
                            v = f"{v} * {self.sc}"
                        at_ = f"{col0}u + {col}" if col0 else col
                        call = f"{epi_k[k]}(bo, {self.own_rows[a]}, {at_}, {v});"
                        L(f"if ({col} < {width}u) {{ {call} }}" if padded(width, p.WX) != width
                          else call)

    def dispatch(self) -> dict:
        return self.ctx.dispatch(self.kernel, self.em.lines, self.grid, self.p.NT)
