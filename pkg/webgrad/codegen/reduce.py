"""Reductions: sum over axes, max_last, argmax_last, and the row ops softmax_last,
log_softmax_last and layer_norm_last, each ONE kernel (two for very long reductions).

Strategies, by the shape of the reduction (R elements reduced into each of O outputs):
  wg        reduced axes trailing and R >= 64: a workgroup per output; its threads stride
            over the row, then a shared-memory tree combines them (wgsl.workgroup_reduce,
            whose subgroup form measured no faster here on an H200: taken only when
            KernelOptions.subgroups forces it). Row ops do their passes (max, sum of exp / mean,
            variance, write) inside the same workgroup. Sums and maxima of rows up to
            ROWS_MAX_R long take several rows per workgroup instead (`_wg_rows`: about 4
            elements per thread, a tree per row), except on CPU adapters.
  thread    short rows, or reduced axes in front (a bias gradient sums [N, D] over N)
            and R short: a thread per output loops over R; neighbouring threads read
            neighbouring columns.
            Row ops take it on CPU adapters (Limits.cpu: SwiftShader, lavapipe) for rows up
            to CPU_ROW_MAX long, in workgroups of CPU_ROW_WG threads: there a workgroup's
            threads are emulated and each barrier of the tree switches between all of them,
            which made a 1024 x 64 layer norm 20-50x slower than a plain loop per row
            (bench/README.md). Longer rows keep the tree: it spreads a row over threads, and
            lavapipe stops an invocation's loops after 65535 iterations in all (silently:
            a 2 x 50257 log-softmax wrote its first 15k values only).
  split     very long reductions with few outputs: pass 1 reduces chunks into a scratch
            buffer, pass 2 reduces the partials and runs the epilogue (2 dispatches).
            argmax too on GPUs, in chunks of KernelOptions.argmax_chunk (1024: 4 elements a
            thread, 126 workgroups for 128256 logits): each chunk's (max, first index)
            pair, then the pairs by the same rule (the lowest index among equal maxima or
            NaNs). A greedy decode's argmax over 128256 logits was 0.18 ms in one workgroup
            on an H200. CPU adapters keep the workgroup per row
            (KernelOptions.argmax_split forces either).
  col_split reduced axes in front and R long (every bias and LayerNorm gradient of a
            training step: [B*T, D] summed over B*T, then AdamW in the epilogue): pass 1
            gives each workgroup a block of COL_WX columns and a chunk of rows; its threads
            stand in COL_WY rows of COL_WX (a warp reads one row segment: coalesced), each
            keeps COL_UNROLL independent sums, so that several loads are in flight per
            thread, and a shared-memory tree adds the rows; pass 2 adds the chunks in
            order. Chunks are sized for about COL_TARGET_WG workgroups. A thread per
            (column, chunk) of 256 rows instead (the kernel before) waited on one load at a
            time: 0.11 ms for a [4096, 768] sum on an H200, 98 of them in a GPT-2 step
            (bench/README.md, step_breakdown.py). CPU adapters keep that loop
            (`_thread_split`, same chunks): they emulate barriers (KernelOptions.column_tiled).
Inputs are read through the emitter, so an elementwise producer is computed inside the
reduction (loss chains: sum(d * d) is one kernel); the result goes through the group's
epilogue (`epi(flat, value)`), where fused elementwise consumers are evaluated.
Summation order is a tree (or chunked), not numpy's pairwise order: results agree within
f32 rounding of the sum's magnitude (~log2(R) * 6e-8 * sum|x|).
NaN follows torch: max propagates it and argmax picks the first NaN (WGSL's max leaves
NaN undefined, so both test the bits, elementwise.ISNAN_WGSL).
"""
from __future__ import annotations

from math import prod

from .elementwise import ISNAN_WGSL
from .emit import Emitter, Idx
from .kinds import REDUCE_OPS, ROW_OPS
from .options import DEFAULT, KernelOptions
from .wgsl import WG, f32_lit, pow2ceil, tree_reduce, use_subgroups, workgroup_reduce, zero

_NEG_INF = f32_lit(float("-inf"))

SPLIT_CHUNK = 4096     # elements per workgroup in pass 1 of a split row reduction
CPU_ROW_WG = 32        # threads (rows) per workgroup of a row op on a CPU adapter: small, so
                       # that even a few hundred rows spread over the CPU's cores
CPU_ROW_MAX = 4096     # longest row a CPU adapter loops over in one thread (4 passes at most)
# KernelOptions.col_split_min_r (2048): column sums at least this long are split (col_split)
COL_WX, COL_WY = 32, 8  # pass 1 of col_split: threads along columns x along rows
COL_UNROLL = 4          # independent partial sums (loads in flight) per thread
COL_MIN_ROWS = 16       # rows per thread at least, per chunk
COL_TARGET_WG = 1024    # about this many workgroups in pass 1 (an H200 holds 132 x 8)
# KernelOptions.column_tiled (tests): True/False forces col_split's tiled/per-thread pass 1
ROWS_MAX_R = 512        # trailing rows up to this long: several per workgroup (_wg_rows)
# KernelOptions.rows_tiled (tests): True/False forces _wg_rows on/off (default: not on CPUs)


class ReduceShape:
    """What is reduced: x's shape, the reduced axes, O outputs of R elements each."""

    def __init__(self, g, node, source=None, options: KernelOptions = DEFAULT, *,
                 cpu: bool = False):
        """source: (x, axes) when fusion folded sum(sum(x)) into one reduction of x; cpu:
        a CPU adapter's (Limits.cpu), which keeps argmax in one workgroup per row."""
        self.col_split_min_r = options.col_split_min_r
        forced = options.argmax_split
        self.argmax_split = forced if forced is not None else not cpu
        self.argmax_chunk = options.argmax_chunk
        self.x = source[0] if source else node.inputs[0]
        self.xs = tuple(g[self.x].shape)
        if source:
            self.axes = tuple(source[1])
        elif node.op == "sum":
            self.axes = tuple(sorted(node.attrs["axes"]))
        else:
            self.axes = (len(self.xs) - 1,)
        self.R = prod(self.xs[a] for a in self.axes)
        self.O = prod(node.shape) if node.op not in ROW_OPS else prod(self.xs[:-1])
        n = len(self.xs)
        self.trailing = self.axes == tuple(range(n - len(self.axes), n))
        self.kept = tuple(d for k, d in enumerate(self.xs) if k not in self.axes)
        self.red = tuple(self.xs[a] for a in self.axes)
        self.kind = {"sum": "sum", "max_last": "max", "argmax_last": "argmax"}.get(node.op, "row")
        # a split argmax keeps its chunks' indices as f32 beside their maxima: exact below 2^24
        self.argmax_split = (self.argmax_split and self.kind == "argmax"
                             and g[self.x].dtype == "f32" and self.R <= 1 << 24)

    def strategy(self):
        if self.kind == "row":
            return ("wg", None) if self.R > 32 else ("thread", None)
        if self.trailing and self.R >= 64:
            if self.kind != "argmax" and self.R >= 8 * SPLIT_CHUNK and self.O <= 64:
                return "wg_split", min(-(-self.R // SPLIT_CHUNK), 1024)
            if self.argmax_split and self.R >= 8 * self.argmax_chunk and self.O <= 64:
                return "wg_split", min(-(-self.R // self.argmax_chunk), 1024)
            return "wg", None
        if self.kind == "sum" and not self.trailing and self.R >= self.col_split_min_r and self.O <= 8192:
            return "col_split", self.col_chunks()
        return "thread", None

    def col_tile(self) -> tuple[int, int]:
        """(threads along columns, along rows) of a col_split workgroup: COL_WX x COL_WY,
        fewer columns (more rows) where there are fewer than COL_WX outputs."""
        wx = min(COL_WX, pow2ceil(self.O))
        return wx, COL_WX * COL_WY // wx

    def col_chunks(self) -> int:
        """How many row chunks col_split cuts R into: about COL_TARGET_WG workgroups in
        all, each thread at least COL_MIN_ROWS rows, at most 1024 chunks."""
        wx, wy = self.col_tile()
        blocks = -(-self.O // wx)
        return max(1, min(-(-COL_TARGET_WG // blocks), -(-self.R // (wy * COL_MIN_ROWS)), 1024))

    def x_idx(self, em: Emitter, o: str, r: str) -> Idx:
        if self.trailing:
            if self.O == 1:
                return Idx(self.xs, flat=r)
            if self.R == 1:
                return Idx(self.xs, flat=o)
            return Idx(self.xs, flat=em.ravel([o, r], (self.O, self.R)))
        kd = iter(em.unravel(o, self.kept))
        rd = iter(em.unravel(r, self.red))
        return Idx(self.xs, dims=[next(rd) if k in self.axes else next(kd)
                                  for k in range(len(self.xs))])


def scratch_specs(g, node, source=None, options: KernelOptions = DEFAULT, *,
                  cpu: bool = False) -> list[tuple[int, str]]:
    """[(bytes, dtype)] of scratch a reduction needs between its two passes (none: one
    pass); the partials have the reduced tensor's dtype (i32 sums stay i32); a split
    argmax's O * P maxima are followed by their O * P indices (as f32)."""
    if node.op not in REDUCE_OPS:
        return []
    s = ReduceShape(g, node, source, options, cpu=cpu)
    strat, P = s.strategy()
    if strat not in ("wg_split", "col_split"):
        return []
    return [(4 * s.O * P * (2 if s.kind == "argmax" else 1), g[s.x].dtype)]


def _wgsize(ctx, n: int) -> int:
    cap = min(WG, ctx.limits.max_compute_invocations_per_workgroup,
              ctx.limits.max_compute_workgroup_size_x)
    return max(1, min(cap, max(32, pow2ceil(n))))


# Threads of a row kernel's workgroup: about KernelOptions.row_elems elements each (at least 32, at most
# WG; None: WG whatever the row's length). Rows of a few hundred are short for 256 threads:
# each reduction is 8 tree steps for 3 values a thread, and fewer rows' workgroups fit an SM.
# H200 through Dawn, 2026-12-01 (bench/README.md "Row kernels' workgroups"), ms at 256 /
# 128-64 threads (8 a thread) / 64 (12) / 32 (24): layer norm [4096, 768] 0.0188 / 0.0166 /
# 0.0175 / 0.0227, its backward 0.0293 / 0.0250 / 0.0237 / 0.0301, layer norm [16384, 512]
# 0.058 / 0.042 / 0.042 / 0.063, softmax [49152, 512] 0.162 / 0.108 / 0.176 / 0.292; rows of
# 50257 keep 256 threads.
# (8 by default)


def row_wgsize(ctx, D: int) -> int:
    """Threads of a row kernel's workgroup (one row each) for rows of D."""
    per = ctx.limits.options.row_elems
    return _wgsize(ctx, D if per is None else -(-D // per))


# A workgroup row kernel whose threads hold at most ROW_REGS elements of the row keeps them
# in registers: the elements are unrolled at the kernel's top level, so each is loaded (and
# any fused producer computed) once for all the passes over the row, where a loop per pass
# read it again every pass. H200 through Dawn, 2026-12-01 (bench/README.md): the GPT-2
# step's 50 layer-norm kernels 1.74 -> 1.30 ms (its backward 0.049 -> 0.035 ms), small64's
# 34 2.46 -> 1.76 ms.
ROW_REGS = 8


class RowPasses:
    """The passes of a row kernel over its row of D (row `row`; `wgs` threads per row when
    `wg`, else one thread): `fold` accumulates a term of every element into a per-thread
    var, `each` emits statements per element (the epilogue's stores). Either a loop per
    pass (j = lid, lid + wgs, ...; one thread: j = 0, 1, ...), or, for a workgroup whose
    threads have at most ROW_REGS elements, those elements unrolled (see ROW_REGS): element
    e is j = lid + e * wgs, and where that can pass D its index is clamped (a valid load),
    its terms selected away and its statements guarded."""

    def __init__(self, em, D: int, rows: int, wgs: int, wg: bool):
        self.em, self.D, self.rows, self.wgs = em, D, rows, wgs
        self.unrolled = wg and -(-D // wgs) <= ROW_REGS
        self.loop = (f"for (var j = lid; j < {D}u; j += {wgs}u)" if wg
                     else f"for (var j = 0u; j < {D}u; j++)")
        em.declare("j")  # the loop's index, and `row` the caller's
        self.slots = []  # (flat index, in range: None (always) or a WGSL bool)
        if self.unrolled:
            for e in range(-(-D // wgs)):
                whole = (e + 1) * wgs <= D
                j = em.let(f"lid + {e * wgs}u" if e else "lid") if whole else \
                    em.let(f"min(lid + {e * wgs}u, {D - 1}u)")
                ok = None if whole else em.let(f"lid + {e * wgs}u < {D}u")
                self.slots.append((self._flat(j), ok))

    def _flat(self, j: str) -> str:
        return self.em.ravel(["row", j], (self.rows, self.D))

    def fold(self, *pairs, combine=lambda a, t: f"{a} + {t}", ident="0.0f") -> None:
        """For each (acc, term) pair: acc = combine(acc, term(flat)) over the thread's
        elements, in one pass; term(flat) returns a WGSL expression (it may emit lets)."""
        em = self.em

        def step(flat, ok):
            for acc, term in pairs:
                v = term(flat)
                em.emit(f"{acc} = {combine(acc, v if ok is None else f'select({ident}, {v}, {ok})')};")
        if not self.unrolled:
            with em.block(self.loop):
                step(self._flat("j"), None)
            return
        for flat, ok in self.slots:
            step(flat, ok)

    def each(self, body) -> None:
        """body(flat) emits the statements of one element."""
        em = self.em
        if not self.unrolled:
            with em.block(self.loop):
                body(self._flat("j"))
            return
        for flat, ok in self.slots:
            if ok is None:
                body(flat)
            else:
                with em.block(f"if ({ok})"):
                    body(flat)

    def preload(self, at) -> None:
        """Unrolled: at(flat) for every element now, so its loads are issued together."""
        for flat, _ in self.slots if self.unrolled else ():
            at(flat)


def _combine(kind: str, dtype: str):
    if kind == "sum":
        return lambda a, b: f"{a} = {a} + {b};"
    return lambda a, b: f"{a} = {_max(a, b)};"


def _kernel(ctx, name: str, kind: str):
    k = ctx.kernel(name)
    if kind in ("max", "argmax"):
        k.helper("isnan_f", ISNAN_WGSL)
    return k


def _max(a: str, b: str) -> str:
    """max that propagates NaN, as torch.amax (elementwise.py's maximum)."""
    return f"select(select(max({a}, {b}), {b}, isnan_f({b})), {a}, isnan_f({a}))"


def _init(kind: str, dtype: str) -> str:
    return zero(dtype) if kind == "sum" else _NEG_INF


def build_reduce(ctx) -> list:
    node = ctx.main_node
    s = ReduceShape(ctx.g, node, ctx.sum_source, ctx.limits.options, cpu=ctx.limits.cpu)
    if ctx.operand_parts:  # a matmul wrote the partials (fusion.operand_sums): pass 2 alone
        return [_split_pass2(ctx, node, s, ctx.operand_parts)]
    strat, P = s.strategy()
    if node.op in ROW_OPS:
        return [_row_op(ctx, node, s, strat)]

    if strat == "wg":
        if _rows_per_wg(ctx, s) > 1:
            return [_wg_rows(ctx, node, s)]
        return [_wg_reduce(ctx, node, s)]
    if strat == "thread":
        return [_thread_reduce(ctx, node, s)]
    if strat == "wg_split":
        return _wg_split(ctx, node, s, P)
    forced = ctx.limits.options.column_tiled
    tiled = forced if forced is not None else not ctx.limits.cpu
    return _col_split(ctx, node, s, P) if tiled else _thread_split(ctx, node, s, P)


def _accumulate(em, s, kind, acc, acci, o, r):
    v = em.value(s.x, s.x_idx(em, o, r))
    if kind == "argmax":  # the first maximum; a NaN beats everything but an earlier NaN
        with em.block(f"if ({v} > {acc} || (isnan_f({v}) && !isnan_f({acc})))"):
            em.emit(f"{acc} = {v};")
            em.emit(f"{acci} = {r};")
    elif kind == "sum":
        em.emit(f"{acc} = {acc} + {v};")
    else:
        em.emit(f"{acc} = {_max(acc, v)};")


def _thread_reduce(ctx, node, s):
    kernel = _kernel(ctx, node.op, s.kind)
    xdt = ctx.g[s.x].dtype
    epi = ctx.epilogue_fn(kernel)
    em = ctx.emitter(kernel)
    grid = kernel.thread_index(em, s.O, "o")
    acc = em.var(xdt, _init(s.kind, xdt))
    acci = em.var("u32", "0u") if s.kind == "argmax" else None
    em.declare("r")
    with em.block(f"for (var r = 0u; r < {s.R}u; r++)"):
        _accumulate(em, s, s.kind, acc, acci, "o", "r")
    em.emit(f"{epi}(o, {'i32(' + acci + ')' if s.kind == 'argmax' else acc});")
    return ctx.dispatch(kernel, em.lines, grid, WG)


def _tree_argmax(em, wgs):
    em.emit("workgroupBarrier();")
    st = wgs // 2
    while st >= 1:
        em.emit(f"if (lid < {st}u) {{ let bv = red[lid + {st}u]; let bi = redi[lid + {st}u]; "
                f"let an = isnan_f(red[lid]); let bn = isnan_f(bv); "
                f"if ((bn && !an) || bv > red[lid] || ((bv == red[lid] || (an && bn)) "
                f"&& bi < redi[lid])) {{ red[lid] = bv; redi[lid] = bi; }} }}")
        em.emit("workgroupBarrier();")
        st //= 2


def _wg_body(ctx, kernel, em, s, kind, dtype, o, r_from, r_to, wgs, finish):
    acc = em.var(dtype, _init(kind, dtype))
    acci = em.var("u32", "0u") if kind == "argmax" else None
    em.declare("r")
    with em.block(f"for (var r = {r_from} + lid; r < {r_to}; r += {wgs}u)"):
        _accumulate(em, s, kind, acc, acci, o, "r")
    if kind == "sum":  # subgroups where the device has them (max must propagate NaN)
        total = workgroup_reduce(em, wgs, acc, kind, _combine(kind, dtype), dtype)
    else:
        em.emit(f"red[lid] = {acc};")
        if kind == "argmax":
            em.emit(f"redi[lid] = {acci};")
            _tree_argmax(em, wgs)
        else:
            tree_reduce(em.lines, "  ", "red", wgs, _combine(kind, dtype))
        total = "red[0]" if kind != "argmax" else "i32(redi[0])"
    with em.block("if (lid == 0u)"):
        finish(total)


def _wg_reduce(ctx, node, s):
    kernel = _kernel(ctx, node.op, s.kind)
    wgs = _wgsize(ctx, s.R)
    xdt = ctx.g[s.x].dtype
    kernel.decls.append(f"var<workgroup> red: array<{xdt}, {wgs}>;")
    if s.kind == "argmax":
        kernel.decls.append(f"var<workgroup> redi: array<u32, {wgs}>;")
    epi = ctx.epilogue_fn(kernel)
    em = ctx.emitter(kernel)
    grid = kernel.workgroup_index(em, s.O, "o")  # workgroup-uniform: barriers stay legal
    _wg_body(ctx, kernel, em, s, s.kind, xdt, "o", "0u", f"{s.R}u", wgs,
             lambda v: em.emit(f"{epi}(o, {v});"))
    return ctx.dispatch(kernel, em.lines, grid, wgs)


def _rows_per_wg(ctx, s) -> int:
    """How many short rows (trailing sums and maxima of R <= ROWS_MAX_R) one workgroup of
    _wg_rows reduces: WG / lanes per row; 1 (the workgroup per row of _wg_reduce) for
    longer rows, argmax, sums that take subgroup operations (wgsl.use_subgroups), and on CPU
    adapters (KernelOptions.rows_tiled forces either way)."""
    forced = ctx.limits.options.rows_tiled
    tiled = forced if forced is not None else not ctx.limits.cpu
    if not tiled or s.kind not in ("sum", "max") or s.R > ROWS_MAX_R:
        return 1
    if s.kind == "sum" and use_subgroups(ctx.limits):  # workgroup_reduce's subgroup form
        return 1
    return WG // _row_lanes(s.R)


def _row_lanes(R: int) -> int:
    """Threads per row in _wg_rows: about 4 elements each, 4 to 64."""
    return max(4, min(64, pow2ceil(R) // 4))


def _wg_rows(ctx, node, s):
    """Short trailing rows, several per workgroup (attention's backward row sums, rowsum(dO
    * O) over D = 64, are 49152-98304 rows): L lanes per row read L consecutive elements
    per step (coalesced), then a shared-memory tree over each row's lanes. A workgroup of
    64 threads per row, one element each, read a [8 x 12 x 512, 64] product at 0.66 TB/s
    on an H200."""
    xdt = ctx.g[s.x].dtype
    L = _row_lanes(s.R)
    RPW = WG // L
    kernel = _kernel(ctx, node.op, s.kind)
    kernel.decls.append(f"var<workgroup> red: array<{xdt}, {WG}>;")
    epi = ctx.epilogue_fn(kernel)
    em = ctx.emitter(kernel)
    grid = kernel.workgroup_index(em, -(-s.O // RPW), "w")  # uniform: barriers stay legal
    em.emit(f"let lane = lid % {L}u;")
    em.emit(f"let row = w * {RPW}u + lid / {L}u;")
    em.declare("row", "r")  # and the loop's r below
    acc = em.var(xdt, _init(s.kind, xdt))
    with em.block(f"if (row < {s.O}u)" if s.O % RPW else ""):
        with em.block(f"for (var r = lane; r < {s.R}u; r += {L}u)"):
            _accumulate(em, s, s.kind, acc, None, "row", "r")
    em.emit(f"red[lid] = {acc};")
    tree_reduce(em.lines, "  ", "red", L, _combine(s.kind, xdt), pos="lane")  # each row's lanes
    with em.block(f"if (lane == 0u && row < {s.O}u)" if s.O % RPW else "if (lane == 0u)"):
        em.emit(f"{epi}(row, red[lid]);")
    return ctx.dispatch(kernel, em.lines, grid, WG)


def _wg_split(ctx, node, s, P):
    xdt = ctx.g[s.x].dtype
    scratch = ctx.scratch[0]
    C = -(-s.R // P)
    arg = s.kind == "argmax"
    # pass 1: workgroup (o, p) reduces x[o, p*C : (p+1)*C] into scratch[o*P + p] (argmax:
    # its first index in scratch[O*P + o*P + p])
    k1 = _kernel(ctx, node.op + " (pass 1)", s.kind)
    wgs = _wgsize(ctx, C)
    k1.decls.append(f"var<workgroup> red: array<{xdt}, {wgs}>;")
    if arg:
        k1.decls.append(f"var<workgroup> redi: array<u32, {wgs}>;")
    em = ctx.emitter(k1)
    grid1 = k1.workgroup_index(em, s.O * P, "w")
    em.emit(f"let o = w / {P}u;")
    em.emit(f"let p = w % {P}u;")
    em.declare("o")
    em.emit(f"let r0 = p * {C}u;")
    em.emit(f"let r1 = min(r0 + {C}u, {s.R}u);")

    def finish(v):
        em.store(scratch, "w", "red[0]" if arg else v)
        if arg:
            em.store(scratch, f"{s.O * P}u + w", "f32(redi[0])")
    _wg_body(ctx, k1, em, s, s.kind, xdt, "o", "r0", "r1", wgs, finish)
    d1 = ctx.dispatch(k1, em.lines, grid1, wgs)
    # pass 2: workgroup o reduces the P partials, then the epilogue
    k2 = _kernel(ctx, node.op + " (pass 2)", s.kind)
    wgs2 = _wgsize(ctx, P)
    k2.decls.append(f"var<workgroup> red: array<{xdt}, {wgs2}>;")
    if arg:
        k2.decls.append(f"var<workgroup> redi: array<u32, {wgs2}>;")
    epi = ctx.epilogue_fn(k2)
    em = ctx.emitter(k2)
    grid2 = k2.workgroup_index(em, s.O, "o")
    acc = em.var(xdt, _init(s.kind, xdt))
    acci = em.var("u32", "0u") if arg else None
    comb = _combine(s.kind, xdt)
    words = s.O * P * (2 if arg else 1)
    with em.block(f"for (var r = lid; r < {P}u; r += {wgs2}u)"):
        at = em.let(f"o * {P}u + r")
        v = em.load(scratch, Idx((words,), flat=at))
        if arg:  # the chunks in order: an equal maximum later is never taken
            with em.block(f"if ({v} > {acc} || (isnan_f({v}) && !isnan_f({acc})))"):
                em.emit(f"{acc} = {v};")
                i = em.load(scratch, Idx((words,), flat=em.let(f"{s.O * P}u + {at}")))
                em.emit(f"{acci} = u32({i});")
        else:
            em.emit(comb(acc, v))
    if s.kind == "sum":
        total = workgroup_reduce(em, wgs2, acc, "sum", comb, xdt)
    elif arg:
        em.emit(f"red[lid] = {acc};")
        em.emit(f"redi[lid] = {acci};")
        _tree_argmax(em, wgs2)
        total = "i32(redi[0])"
    else:
        em.emit(f"red[lid] = {acc};")
        tree_reduce(em.lines, "  ", "red", wgs2, comb)
        total = "red[0]"
    with em.block("if (lid == 0u)"):
        em.emit(f"{epi}(o, {total});")
    return [d1, ctx.dispatch(k2, em.lines, grid2, wgs2)]


def _col_split(ctx, node, s, P):
    """col_split (header): pass 1 tiled over columns x rows, then `_split_pass2`."""
    xdt = ctx.g[s.x].dtype
    scratch = ctx.scratch[0]
    wx, wy = s.col_tile()
    U = COL_UNROLL
    C = -(-(-(-s.R // P)) // (wy * U)) * (wy * U)  # rows per chunk: whole steps of wy x U
    blocks = -(-s.O // wx)
    k1 = _kernel(ctx, node.op + " (pass 1)", s.kind)
    k1.decls.append(f"var<workgroup> red: array<{xdt}, {wx * wy}>;")
    em = ctx.emitter(k1)
    grid1 = k1.workgroup_index(em, blocks * P, "w")  # workgroup-uniform: barriers stay legal
    em.emit(f"let p = w / {blocks}u;")
    em.emit(f"let o = (w % {blocks}u) * {wx}u + lid % {wx}u;")
    em.emit(f"let ty = lid / {wx}u;")
    em.emit(f"let r1 = min(p * {C}u + {C}u, {s.R}u);")
    accs = [em.var(xdt, zero(xdt)) for _ in range(U)]
    em.emit(f"var r = p * {C}u + ty;")
    em.declare("o", "r")
    with em.block(f"if (o < {s.O}u)" if s.O % wx else ""):
        # U rows wy apart per step, their loads independent; then the rest one at a time
        with em.block(f"for (; r + {(U - 1) * wy}u < r1; r += {U * wy}u)"):
            for u, acc in enumerate(accs):
                with em.block(""):
                    _accumulate(em, s, "sum", acc, None, "o", f"(r + {u * wy}u)" if u else "r")
        with em.block(f"for (; r < r1; r += {wy}u)"):
            _accumulate(em, s, "sum", accs[0], None, "o", "r")
    em.emit(f"red[lid] = ({accs[0]} + {accs[1 % U]})" + "".join(f" + {a}" for a in accs[2:]) + ";"
            if U > 1 else f"red[lid] = {accs[0]};")
    # a tree over the rows of each column
    tree_reduce(em.lines, "  ", "red", wy, _combine("sum", xdt), pos="ty", stride=wx)
    with em.block(f"if (ty == 0u && o < {s.O}u)" if s.O % wx else "if (ty == 0u)"):
        em.store(scratch, f"p * {s.O}u + o", "red[lid]")
    d1 = ctx.dispatch(k1, em.lines, grid1, wx * wy)
    return [d1, _split_pass2(ctx, node, s, P)]


def _thread_split(ctx, node, s, P):
    xdt = ctx.g[s.x].dtype
    scratch = ctx.scratch[0]
    C = -(-s.R // P)
    comb = _combine(s.kind, xdt)
    # pass 1: thread (p, o) reduces r in [p*C, (p+1)*C) into scratch[p*O + o]
    k1 = _kernel(ctx, node.op + " (pass 1)", s.kind)
    total = s.O * P
    em = ctx.emitter(k1)
    grid1 = k1.thread_index(em, total, "t")
    em.emit(f"let o = t % {s.O}u;")
    em.emit(f"let r0 = (t / {s.O}u) * {C}u;")
    em.emit(f"let r1 = min(r0 + {C}u, {s.R}u);")
    em.declare("o", "r")  # and the loop's r below
    acc = em.var(xdt, _init(s.kind, xdt))
    with em.block("for (var r = r0; r < r1; r++)"):
        _accumulate(em, s, s.kind, acc, None, "o", "r")
    em.store(scratch, "t", acc)
    d1 = ctx.dispatch(k1, em.lines, grid1, WG)
    return [d1, _split_pass2(ctx, node, s, P)]


def _split_pass2(ctx, node, s, P):
    """Pass 2 of a column split: thread o adds its P partials (scratch[p * O + o]) in
    chunk order, then the epilogue."""
    xdt = ctx.g[s.x].dtype
    scratch = ctx.scratch[0]
    total = s.O * P
    comb = _combine(s.kind, xdt)
    k2 = _kernel(ctx, node.op + " (pass 2)", s.kind)
    epi = ctx.epilogue_fn(k2)
    em = ctx.emitter(k2)
    grid2 = k2.thread_index(em, s.O, "o")
    acc = em.var(xdt, _init(s.kind, xdt))
    with em.block(f"for (var p = 0u; p < {P}u; p++)"):
        v = em.load(scratch, Idx((total,), flat=em.let(f"p * {s.O}u + o")))
        em.emit(comb(acc, v))
    em.emit(f"{epi}(o, {acc});")
    return ctx.dispatch(k2, em.lines, grid2, WG)


# ---------------------------------------------------------------- row ops

def _row_op(ctx, node, s, strat):
    """softmax / log_softmax / layer_norm over the last axis (D = s.R), rows = s.O."""
    D, rows = s.R, s.O
    op = node.op
    kernel = _kernel(ctx, op, "max" if op != "layer_norm_last" else "sum")  # max's NaN test
    epi = ctx.epilogue_fn(kernel)
    wg = strat == "wg" and not row_per_thread(ctx, D)
    wgs = row_wgsize(ctx, D) if wg else row_thread_wg(ctx)
    if wg:
        kernel.decls.append(f"var<workgroup> red: array<f32, {wgs}>;")
    em = ctx.emitter(kernel)
    grid = (kernel.workgroup_index(em, rows, "row") if wg
            else kernel.thread_index(em, rows, "row", wgs))
    rp = RowPasses(em, D, rows, wgs, wg)

    def x_at(flat):
        return em.value(s.x, Idx(s.xs, flat=flat))

    def reduce_all(acc, kind):
        """acc (a per-thread var) -> a let holding the row's total."""
        if not wg:
            return em.let(acc)
        total = workgroup_reduce(em, wgs, acc, kind, _combine(kind, "f32"))
        em.emit("workgroupBarrier();")  # everyone has read the total before red is reused
        return total

    rp.preload(x_at)
    if op in ("softmax_last", "log_softmax_last"):
        m = em.var("f32", _NEG_INF)
        rp.fold((m, x_at), combine=_max, ident=_NEG_INF)  # NaN-safe: a NaN row is all NaN
        mx = reduce_all(m, "max")
        acc = em.var("f32", "0.0f")
        rp.fold((acc, lambda f: f"exp({x_at(f)} - {mx})"))
        tot = reduce_all(acc, "sum")
        if op == "log_softmax_last":
            lse = em.let(f"{mx} + log({tot})")
            rp.each(lambda f: em.emit(f"{epi}({f}, {x_at(f)} - {lse});"))
        else:
            rp.each(lambda f: em.emit(f"{epi}({f}, exp({x_at(f)} - {mx}) / {tot});"))
    else:  # layer_norm_last: mean, then the variance about it (two passes, as the reference)
        acc = em.var("f32", "0.0f")
        rp.fold((acc, x_at))
        mean = em.let(f"{reduce_all(acc, 'sum')} / {f32_lit(D)}")
        acc2 = em.var("f32", "0.0f")

        def sq(f):
            dv = em.let(f"{x_at(f)} - {mean}")
            return f"{dv} * {dv}"
        rp.fold((acc2, sq))
        var = em.let(f"{reduce_all(acc2, 'sum')} / {f32_lit(D)}")
        den = em.let(f"sqrt({var} + {f32_lit(node.attrs['eps'])})")
        rp.each(lambda f: em.emit(f"{epi}({f}, ({x_at(f)} - {mean}) / {den});"))
    return ctx.dispatch(kernel, em.lines, grid, wgs)


def row_per_thread(ctx, D: int) -> bool:
    """Whether a row kernel over rows of D loops in one thread per row rather than a
    workgroup per row: on CPU adapters, for rows up to CPU_ROW_MAX (the header).
    KernelOptions.row_per_thread (tests) forces either form."""
    forced = ctx.limits.options.row_per_thread
    if forced is not None:
        return forced
    return ctx.limits.cpu and D <= CPU_ROW_MAX


def row_thread_wg(ctx) -> int:
    """Workgroup size of a row kernel with a thread per row."""
    return CPU_ROW_WG if ctx.limits.cpu else WG
