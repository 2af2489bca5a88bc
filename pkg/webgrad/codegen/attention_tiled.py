"""Tiled fused attention kernels for GPUs: the ops of codegen/attention.py, plus the
one-pass forms attention_match.py uses where these kernels run (attn_fwd: O and lse;
attn_dkv: dK and dV), each a workgroup that owns a block of rows and streams the other
side's rows through workgroup memory, flash-attention style.

Why: the row kernels of attention.py (a thread per query or key, its vectors in registers)
leave a GPU nearly idle in the backward: at GPT-2 size attn_dk / attn_dv ran 10-12 ms each
on an H200 (a few hundred workgroups of 64 threads, each thread walking 512 rows with 192
registers of vectors); here the three kernels of a training step take 0.79 ms together
(bench/README.md). Every kernel is a chain of small matrix products between
workgroup-memory tiles, which is the shape GPUs are built for.

Notation as in attention.py: q = A [.., T, D], k^T = B [.., D, S], v = V [.., S, Dv],
g = G [.., T, Dv]; s_ij = scale q_i . k_j over kept keys (j <= i + offset [+ pos]);
p_ij = exp(s_ij - lse_i); ds_ij = p_ij (g_i . v_j - Drow_i).

A workgroup of 16 x 16 threads owns BR rows ("own" side) and loops over the "streamed"
side BC rows at a time; W is a BR x BC tile, X the streamed rows it multiplies:
  kernel    own      streamed  W -> X                       out (a row of the result)
  attn_lse  queries  keys      online log-sum-exp per row    lse_i
  attn_out  queries  keys      p (or p online) -> v          O_i = sum_j W v_j
  attn_fwd  queries  keys      p online -> v                 [O_i | lse_i]
  attn_dq   queries  keys      ds -> k                       scale sum_j W k_j
  attn_dv   keys     queries   p^T -> g                      sum_i W g_i
  attn_dk   keys     queries   ds^T -> q                     scale sum_i W q_i
  attn_dkv  keys     queries   p^T -> g, then ds^T -> q      [dK_j | dV_j]
Per streamed block: the scores (own . streamed over D) and, for dq / dk / dkv, g . v over
Dv are products of D-chunks (DK wide) staged in workgroup memory (As: own, Bs: streamed),
each thread owning a TR x TC block of the tile (TR = BR / 16: rows ty*TR + a up to 4 per
thread, read as one vec{TR}; 8 are two vec4s 64 rows apart, likewise columns). W goes to
workgroup memory transposed (Ws: a thread's adjacent rows of one column are one vector,
stored as one), then out += W @ X with X staged XK rows at a time (Xs; where the loads
are issued ahead, the whole block at once in As's and Bs's words, the "x_whole" option), each thread
owning TR rows x EP/16 output columns (4 adjacent ones per 64, vec4 reads, where the
width pads to whole 64s; else tx + 16 e). Global loads are issued ahead of their use:
the next D chunk's before the current chunk's products, and a block's X rows before its
scores (the loads are `let`s, stored to workgroup memory later), so their latency hides
behind arithmetic; with barriers between every stage and one or two workgroups per SM,
the exposed latency was what held these kernels back (bench/README.md). The backward's
softmax statistics come from elsewhere (lse, Drow: FA-2's backward recomputes p from the
saved lse, and Drow = rowsum(g * O) is a plain reduction in the IR), so the only row
reductions across threads are attn_lse's final combine of per-thread (max, sum) pairs
and the online softmax's per-block row maximum and final row sums, through workgroup
memory (As, free between a block's products, read back as vec4s; no subgroup operations:
they are an optional WebGPU feature this compiler does not request yet).
Causal blocks beyond the diagonal are never visited: a query block stops at its last
kept key, a key block starts at its first query; the workgroups run block-major, the
blocks with the most streamed rows first, so that the short ones fill the GPU's tail.
dQ and dK / dV are separate kernels (WebGPU has no float atomics).

Every loop bound depends only on the workgroup (a runtime cache position is read with
workgroupUniformLoad), so the barriers are in uniform control flow. Rows past T or S
read clamped addresses and are zeroed or masked; head dims that are not multiples of 16
(odd ones too) are padded with zeros in workgroup memory. Tile sizes follow the device's
maxComputeWorkgroupStorageSize (WebGPU's default 16 KiB: 32-row blocks; 32 KiB or more:
64, with 32-wide D chunks where they fit: the H200 through Dawn offers 48 KiB; there the
query kernels over rows of 1024 or more take 128-row blocks, LONG_BLOCKS). Bounds tests
are emitted only where a block does not divide its extent. KernelOptions.attn_opts switches each of these
choices so that bench/attention.py --variants can measure it against its absence.
"""
from __future__ import annotations

from math import prod

from .emit import Idx
from .options import DEFAULT, KernelOptions
from .wgsl import f32_lit, pow2ceil, thread_xy

# The workgroup: WY x WX threads (WY along the own rows, WX along the streamed ones and the
# output columns); KernelOptions.attn_threads per op (bench/attention.py, tests), else (16, 16).
# Fewer threads with more of the tile each were 1.3-4x slower on an H200 at 64 x 64 blocks
# (8 x 16, 16 x 8, 8 x 8 threads; attn_dkv 0.32 -> 0.98-2.1 ms at 8 x 12 x 512 x 64: a
# thread then also holds twice or four times the prefetched X rows; bench/README.md).
def _threads(op, opts: KernelOptions = DEFAULT) -> tuple[int, int]:
    forced = opts.attn_threads
    if forced is not None and op in forced:
        return forced[op]
    return (16, 16)


def use_tiled(limits) -> bool:
    """GPUs get the tiled kernels; CPU adapters (lavapipe, SwiftShader: Limits.cpu) keep
    attention.py's barrier-free row kernels (a barrier there costs a fiber switch per
    thread, as for codegen/matmul_direct.py's kernel). KernelOptions.attn_tiled (tests):
    True / False forces the tiled / row kernels on any adapter."""
    if limits.options.attn_tiled is not None:
        return limits.options.attn_tiled
    return not limits.cpu


PAD = 4  # extra words per shared row: keeps vec4 alignment, staggers the banks


def _red_in_as(op, BR, DK, WX=16, opts: KernelOptions = DEFAULT) -> bool:
    """The online softmax's row reductions (WX words per own row) reuse As: it is free
    between a block's score product and the next block's staging, and after the loop."""
    return (opts.attn_opt("red_in_as") and op in ("attn_out", "attn_fwd")
            and DK * (BR + PAD) >= WX * BR)


def _shared_bytes(op, BR, BC, DK, XK, EP, WX=16, opts: KernelOptions = DEFAULT) -> int:
    n = DK * (BR + PAD) + DK * (BC + PAD)
    if op != "attn_lse":
        n += BC * (BR + PAD) + XK * EP
    if op == "attn_lse":
        n += 2 * WX * BR
    elif op in ("attn_out", "attn_fwd") and not _red_in_as(op, BR, DK, WX, opts):
        n += WX * BR  # the online softmax's row maxima (and the final row sums)
    return 4 * n


# KernelOptions.attn_blocks (bench/attention.py): {op: (BR, BC, DK, XK)} in place of
# choose_blocks. The code options, each measured against its absence (bench/attention.py
# --variants), are KernelOptions.attn_opts (options.ATTN_OPTS says what each one changes).
PREFETCH_D_MAX = 4  # D chunks unrolled (and prefetched) at most; more: a loop
# Adapters whose kernels issue the prefetches: those they were measured on (bench/README.md).
# They double the kernels' WGSL (attn_fwd of the T 37, D 33 record: 15 -> 31 KB), and
# SwiftShader, which creates a pipeline with LLVM inside Chrome's GPU process, lost its device
# creating them in headless Chromium (tests/browser/test_gpu_host.py, test_webgpu.py's Tint
# check); other GPUs' compilers are unmeasured. Those adapters are
# KernelOptions.prefetch_adapters (h200, h100); KernelOptions.attn_prefetch (tests): True /
# False on any.
def _prefetches(op: str, kind: str, limits) -> bool:
    """Whether `op`'s kernel issues the `kind` prefetch ("prefetch_d", "prefetch_x")."""
    opts, adapter = limits.options, str(limits.adapter)
    on = (opts.attn_prefetch if opts.attn_prefetch is not None
          else any(w in adapter.lower() for w in opts.prefetch_adapters))
    return on and op in opts.attn_opt(kind)


BLOCK_SIZES = ((64, 64),)  # (BR, BC) tried first, where they fit (then 32 x 32, 16 x 16)
# ... before them, for the query kernels over long rows: 128 query rows (8 per thread) took
# attn_fwd 0.668 -> 0.607 ms and attn_dq 0.839 -> 0.756 at 8 x 12 x 1024 x 64 on an H200,
# but were slower at T 512 (0.206 -> 0.215, 0.257 -> 0.271) and for attn_dkv everywhere
# (bench/README.md, "Tiled attention kernels")
LONG_BLOCKS = {"attn_fwd": (128, 64), "attn_dq": (128, 64)}
LONG_MIN = 1024  # own and streamed rows at least this many


def choose_blocks(op, own_n, str_n, E, limit, opts: KernelOptions = DEFAULT):
    """(BR, BC, DK, XK): own rows per workgroup, streamed rows per step, the D chunk of the
    score products, the X rows per step of the output product; the largest that fit."""
    if opts.attn_blocks is not None and op in opts.attn_blocks:
        return opts.attn_blocks[op]
    WX = _threads(op, opts)[1]
    EP = _padded(E, WX)
    cands = []
    first = ((LONG_BLOCKS[op],) if op in LONG_BLOCKS and min(own_n, str_n) >= LONG_MIN else ())
    for br, bc in first + BLOCK_SIZES + ((32, 32), (16, 16)):
        BR = min(br, max(16, pow2ceil(own_n)))
        BC = min(bc, max(16, pow2ceil(str_n)))
        if (BR, BC) not in cands:
            cands.append((BR, BC))
    for BR, BC in cands:
        for DK in (32, 16, 8):
            for XK in (16, 8, 4):
                if _shared_bytes(op, BR, BC, DK, XK, EP, WX, opts) <= limit:
                    return BR, BC, DK, XK
    raise AssertionError(f"{op}: no tile fits {limit} bytes of workgroup memory")


def _padded(E: int, WX: int = 16) -> int:
    """Output columns with padding: E itself when it is whole groups of 4 WX (4 adjacent
    columns per thread, vec4 reads), else whole groups of WX (one column per thread)."""
    return E if E % (4 * WX) == 0 else WX * -(-E // WX)


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


def build_tiled(ctx) -> list[dict]:
    node, g = ctx.main_node, ctx.g
    op = node.op
    ins = node.inputs
    a_, b_ = ins[0], ins[1]
    T, D = g[a_].shape[-2], g[a_].shape[-1]
    S = g[b_].shape[-1]
    scale, off = node.attrs["scale"], node.attrs["offset"]
    per_key = op in ("attn_dk", "attn_dv", "attn_dkv")
    two_dots = op in ("attn_dq", "attn_dk", "attn_dkv")  # s = q.k and dp = g.v
    batch = tuple(node.shape[:-1]) if op == "attn_lse" else tuple(node.shape[:-2])
    nb = prod(batch)
    # the softmax online: inference's attn_out, and attn_fwd (which also writes lse)
    online = op == "attn_fwd" or (op == "attn_out" and node.attrs.get("online"))
    # which inputs: V, G, lse, Drow (None where the op has none)
    v_ = ins[2] if op in ("attn_out", "attn_fwd") or two_dots else None
    g_ = ins[2] if op == "attn_dv" else ins[3] if two_dots else None
    lse_n = {"attn_out": None if online else 3, "attn_dv": 3, "attn_dq": 4, "attn_dk": 4,
             "attn_dkv": 4}.get(op)
    lse_n = ins[lse_n] if lse_n is not None else None
    dr_n = ins[5] if two_dots else None
    Dv = g[v_].shape[-1] if v_ is not None else g[g_].shape[-1] if g_ is not None else D
    # the output products: (width, output column offset, post-scale) of each
    prods = {"attn_lse": [], "attn_out": [(Dv, 0, None)], "attn_fwd": [(Dv, 0, None)],
             "attn_dq": [(D, 0, scale)],
             "attn_dv": [(Dv, 0, None)], "attn_dk": [(D, 0, scale)],
             "attn_dkv": [(Dv, D, None), (D, 0, scale)]}[op]
    Eo = sum(w for w, _, _ in prods) + (op == "attn_fwd")  # the output's row width
    E = max((w for w, _, _ in prods), default=0)
    NR, NC = (S, T) if per_key else (T, S)  # own rows, streamed rows
    opts = ctx.limits.options
    BR, BC, DK, XK = choose_blocks(op, NR, NC, E, ctx.limits.max_compute_workgroup_storage_size, opts)
    WY, WX = _threads(op, opts)
    NT = WY * WX
    TR, TC = BR // WY, BC // WX  # a thread's rows and columns of the W tile
    # ... in vectors of WR (WC) adjacent ones, groups of WY WR (WX WC) apart (rl, cl)
    WR, WC = min(TR, 4), min(TC, 4)
    EP = _padded(E, WX)
    # output columns 4 WX q + 4 tx + i (vec4 reads of X), or tx + WX e
    XV = 4 if all(_padded(w, WX) % (4 * WX) == 0 for w, _, _ in prods) else 1
    LDA, LDB, LDW = BR + PAD, BC + PAD, BR + PAD
    nblk = -(-NR // BR)
    # X staged whole in As's and Bs's words (the "x_whole" option): one array of one vector type
    # holds As, then Bs; the online softmax's row reductions then go to `red`, since X is
    # stored into As right after them
    xw = (opts.attn_opt("x_whole") and op != "attn_lse" and _prefetches(op, "prefetch_x", ctx.limits)
          and WR == WC == XV and BC * EP <= DK * (LDA + LDB)
          and 4 * (DK * (LDA + LDB) + BC * LDW + (WX * BR if online else 0))
          <= ctx.limits.max_compute_workgroup_storage_size)
    if xw:
        XK = BC
    alias = {"Bs": ("As", DK * LDA), "Xs": ("As", 0)} if xw else {}

    kernel = ctx.kernel(f"{op} [{'x'.join(map(str, batch)) or '1'}] T{T} S{S} D{D} "
                        f"tiled {BR}x{BC}")
    kernel.decls.append(f"var<workgroup> As: array<{_vty(WR)}, {(DK * LDA + (DK * LDB if xw else 0)) // WR}>;")
    if not xw:
        kernel.decls.append(f"var<workgroup> Bs: array<{_vty(WC)}, {DK * LDB // WC}>;")
    if op != "attn_lse":  # W transposed: a thread's WR adjacent rows of one column, a vector
        kernel.decls.append(f"var<workgroup> Ws: array<{_vty(WR)}, {BC * LDW // WR}>;")
        if not xw:
            kernel.decls.append(f"var<workgroup> Xs: array<{_vty(XV)}, {XK * EP // XV}>;")
    if op == "attn_lse":
        kernel.decls.append(f"var<workgroup> red_m: array<f32, {WX * BR}>;")
        kernel.decls.append(f"var<workgroup> red_l: array<f32, {WX * BR}>;")
    red_in_as = _red_in_as(op, BR, DK, WX, opts) and not xw
    if online and not red_in_as:
        kernel.decls.append(f"var<workgroup> red: array<f32, {WX * BR}>;")
    # the epilogue takes (batch element, row, column): a store through views (the QKV
    # gradient assembled in place, fusion._assemble) regroups them, not a flat index
    # (or one per product: per_prod, below)
    epi = ctx.epilogue_fn(kernel, (nb, T) if op == "attn_lse" else (nb, NR, Eo)) \
        if len(prods) <= 1 or not ctx.writes_pieces else None
    em = ctx.emitter(kernel)
    L = em.emit
    grid = kernel.workgroup_index(em, nb * nblk, "w")  # workgroup-uniform: barriers legal
    if off is not None and opts.attn_opt("heavy_first") and nblk > 1:
        # causal: block-major order, the blocks with the most streamed rows first (a query
        # kernel's last blocks, a key kernel's first) so that the short ones fill the tail
        L(f"let bo = w % {nb}u;")
        L(f"let blk = {'' if per_key else f'{nblk - 1}u - '}w / {nb}u;")
    else:
        L(f"let blk = w % {nblk}u;")
        L(f"let bo = w / {nblk}u;")
    for line in thread_xy(WX, WY, opts.attn_opt("warp_tiles")):
        L(line)
    L(f"let r0 = blk * {BR}u;")
    bdims = em.unravel("bo", batch) if batch else []
    sc = f32_lit(scale)
    ninf = f32_lit(float("-inf"))

    def at(n, last):  # operand n at (its last two dims) = last, batch element bo
        shape = g[n].shape
        k0 = len(shape) - len(last)
        r = len(batch) - k0
        dims = ["0u" if shape[k] == 1 else bdims[r + k] for k in range(k0)] + last
        return em.value(n, Idx(shape, dims=dims))

    def Q(i, d): return at(a_, [i, d])
    def K(j, d): return at(b_, [d, j])
    def Vv(j, e): return at(v_, [j, e])
    def Gg(i, e): return at(g_, [i, e])

    def stat(n, i):  # lse / Drow of query i ([batch.., T])
        return em.value(n, Idx(g[n].shape, flat=em.let(f"bo * {T}u + {i}")))

    # the causal limit: key j is kept for query i iff j <= i + off (+ dyn)
    dyn = ""
    if node.attrs.get("dyn"):
        pn = ins[-1]
        kernel.decls.append("var<workgroup> wdyn: i32;")
        with em.block("if (lid == 0u)"):
            L(f"wdyn = i32({em.value(pn, Idx(g[pn].shape, flat='0u'))});")
        L("let dyn = workgroupUniformLoad(&wdyn);")
        dyn = " + dyn"

    # the streamed range [cbeg, cend)
    if off is None:
        cbeg, cend = "0u", f"{NC}u"
    elif not per_key:  # the block's last query r0 + BR - 1 keeps keys < r0 + BR + off
        cbeg = "0u"
        cend = em.let(f"u32(clamp(i32(r0) + {BR + off}i{dyn}, 0i, {NC}i))")
    else:  # the block's first key r0 is kept by queries >= r0 - off
        cbeg = em.let(f"u32(clamp(i32(r0) - {off}i{' - dyn' if dyn else ''}, 0i, {NC}i))")
        cend = f"{NC}u"
    # a key block's first query r0 - off (- dyn) may not start a BC block: the last is short
    causal_tail = per_key and off is not None and bool(dyn or off % BC or BR % BC)

    def fetch(store, nrows, nk, row0, rows_total, k0, k_total, load, rows_exact=False,
              k_exact=False):
        """The global loads of a tile: word store(rr, kk) = load(row0 + rr, k0 + kk) for
        rr < nrows, kk < nk (kk fastest across threads: coalesced reads), zero outside
        rows_total x k_total (no test where rows_exact / k_exact say the tile lies inside).
        Returns [(condition or None, word, value)] for put: the loads are `let`s in the
        current scope, so they can be issued well before the stores (prefetch)."""
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

    def put(arr, w, items):
        """The stores of fetch's words into arr (of vec{w}; an alias: its words of As)."""
        arr, base = alias.get(arr, (arr, 0))
        for cond, q, v in items:
            q = f"{base}u + {q}" if base else q
            if cond:
                with em.block(f"if ({cond})"):
                    L(_put(arr, w, q, v))
            else:
                L(_put(arr, w, q, v))

    def dot_tiles(accs, width, own_load, str_load):
        """accs[a][b] += own row a . streamed row b (the thread's), over width: D chunks of
        DK staged in As / Bs, the next chunk's loads issued before this one's products
        where the op prefetches and there are few chunks."""
        def tiles(d0):
            return (fetch(lambda rr, kk: f"{kk} * {LDA}u + {rr}", BR, DK, "r0", NR, d0,
                          width, own_load, NR % BR == 0, width % DK == 0),
                    fetch(lambda rr, kk: f"{kk} * {LDB}u + {rr}", BC, DK, "c0", NC, d0,
                          width, str_load, NC % BC == 0 and not causal_tail, width % DK == 0))

        bs, boff = alias.get("Bs", ("Bs", 0))

        def products():
            for dd in range(DK):
                xs = [em.fresh("x") for _ in range(TR // WR)]
                ys = [em.fresh("y") for _ in range(TC // WC)]
                for h, x in enumerate(xs):
                    L(f"let {x} = As[{dd * LDA // WR + WY * h}u + ty];")
                for h, y in enumerate(ys):
                    L(f"let {y} = {bs}[{(boff + dd * LDB) // WC + WX * h}u + tx];")
                for a in range(TR):
                    for b in range(TC):
                        L(f"{accs[a][b]} = fma({_comp(xs[a // WR], WR, a % WR)}, "
                          f"{_comp(ys[b // WC], WC, b % WC)}, {accs[a][b]});")

        nch = -(-width // DK)
        if _prefetches(op, "prefetch_d", ctx.limits) and nch <= PREFETCH_D_MAX:
            cur = tiles("0u")
            for ci in range(nch):
                put("As", WR, cur[0])
                put("Bs", WC, cur[1])
                L("workgroupBarrier();")
                if ci + 1 < nch:
                    cur = tiles(f"{(ci + 1) * DK}u")
                products()
                L("workgroupBarrier();")
            return
        with em.block(f"for (var d0 = 0u; d0 < {width}u; d0 += {DK}u)"):
            a_, b_ = tiles("d0")
            put("As", WR, a_)
            put("Bs", WC, b_)
            L("workgroupBarrier();")
            products()
            L("workgroupBarrier();")

    def rl(a):  # the block-local index of a thread's row a
        return f"ty * {WR}u + {(a // WR) * WY * WR + a % WR}u"

    def cl(b):  # ... and of its column b
        return f"tx * {WC}u + {(b // WC) * WX * WC + b % WC}u"

    own_rows = [em.let(f"r0 + {rl(a)}") for a in range(TR)]

    def across_row(values, name, combine):
        """Each own row's value (one per thread) combined over the row's WX threads through
        workgroup memory (red, or As where _red_in_as): one new variable per row,
        combine(r, x) folding the WX entries in order from the first."""
        for a in range(TR):
            q = f"({rl(a)}) * {WX}u + tx"
            L(_put("As", WR, q, values[a]) if red_in_as else f"red[{q}] = {values[a]};")
        L("workgroupBarrier();")
        out = []
        for a in range(TR):
            base = f"({rl(a)}) * {WX}u"
            r = em.fresh(name)
            if red_in_as and WR == 4:  # the row's WX entries as WX / 4 vec4 reads
                vs = [em.let(f"As[({rl(a)}) * {WX // 4}u + {i}u]") for i in range(WX // 4)]
                xs = [f"{v}.{c}" for v in vs for c in "xyzw"]
            elif red_in_as:
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

    def out_cols(width):
        n = _padded(width, WX) // WX
        if XV == 4:
            return [f"{4 * WX * (e // 4) + e % 4}u + tx * 4u" for e in range(n)]
        return [f"tx + {WX * e}u" for e in range(n)]
    if per_key:
        own_load, str_load = K, Q
        dp_own, dp_str = Vv, Gg
        X_loads = {"attn_dv": [Gg], "attn_dk": [Q], "attn_dkv": [Gg, Q]}[op]
    else:
        own_load, str_load = Q, K
        dp_own, dp_str = Gg, Vv
        X_loads = {"attn_out": [Vv], "attn_fwd": [Vv], "attn_dq": [K]}.get(op, [])

    # own-row statistics (query kernels), read once
    own_lse = own_dr = None
    if not per_key and lse_n is not None:
        own_lse = [em.let(stat(lse_n, f"min({r}, {T - 1}u)")) for r in own_rows]
    if not per_key and dr_n is not None:
        own_dr = [em.let(stat(dr_n, f"min({r}, {T - 1}u)")) for r in own_rows]

    accs = [[[em.var("f32", "0.0f", "o") for _ in range(_padded(w, WX) // WX)] for _ in range(TR)]
            for w, _, _ in prods]
    acc = accs[0] if accs else []
    TE = _padded(prods[0][0], WX) // WX if prods else 0
    m_run = [em.var("f32", ninf, "m") for _ in range(TR)] if op == "attn_lse" or online else []
    l_run = [em.var("f32", "0.0f", "l") for _ in range(TR)] if op == "attn_lse" or online else []

    with em.block(f"for (var c0 = {cbeg}; c0 < {cend}; c0 += {BC}u)"):
        x_exact = NC % BC == 0 and BC % XK == 0 and not causal_tail

        def x_rows(k, x0):  # the XK rows x0.. of X for product k
            width = prods[k][0]
            return fetch(lambda rr, kk: f"{rr} * {EP}u + {kk}", XK, _padded(width, WX), f"c0 + {x0}",
                         NC, "0u", width, X_loads[k], x_exact, _padded(width, WX) == width)
        # X rows past a causal block's last kept one are real rows times W = 0, or zeros
        x_pre = ([[x_rows(k, f"{x0}u") for x0 in range(0, BC, XK)] for k in range(len(prods))]
                 if _prefetches(op, "prefetch_x", ctx.limits) else None)
        s = [[em.var("f32", "0.0f", "s") for _ in range(TC)] for _ in range(TR)]
        dot_tiles(s, D, own_load, str_load)
        dp = None
        if two_dots:
            dp = [[em.var("f32", "0.0f", "p") for _ in range(TC)] for _ in range(TR)]
            dot_tiles(dp, Dv, dp_own, dp_str)
        cols = [em.let(f"c0 + {cl(b)}") for b in range(TC)]
        str_lse = str_dr = None
        if per_key:
            str_lse = [em.let(stat(lse_n, f"min({c}, {T - 1}u)")) for c in cols]
            if dr_n is not None:
                str_dr = [em.let(stat(dr_n, f"min({c}, {T - 1}u)")) for c in cols]

        def kept(a, b):
            r, c = own_rows[a], cols[b]
            conds = [f"{c} < {NC}u"]
            if off is not None:
                i, j = (c, r) if per_key else (r, c)
                conds.append(f"i32({j}) <= i32({i}) + {off}i{dyn}")
            return em.let(" && ".join(conds))

        xsc = [[em.let(f"select({ninf}, {s[a][b]} * {sc}, {kept(a, b)})") for b in range(TC)]
               for a in range(TR)] if op == "attn_lse" or online else None
        w = [[None] * TC for _ in range(TR)]
        w2 = None  # attn_dkv: W = p for dV, then W2 = ds for dK
        if op == "attn_lse":  # per-thread running (max, sum) over the thread's columns
            for a in range(TR):
                mn = em.let(f"max({m_run[a]}, {_max(xsc[a])})")
                mz = em.let(f"select({mn}, 0.0f, {mn} == {ninf})")  # no -inf - -inf
                terms = " + ".join(f"exp({x} - {mz})" for x in xsc[a])
                L(f"{l_run[a]} = {l_run[a]} * exp({m_run[a]} - {mz}) + {terms};")
                L(f"{m_run[a]} = {mn};")
        elif online:  # the row's maximum over this block
            row_max = across_row([_max(xsc[a]) for a in range(TR)], "rm", "max({r}, {x})")
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
            if op == "attn_dkv":
                w2 = [[None] * TC for _ in range(TR)]
            for a in range(TR):
                for b in range(TC):
                    lse = str_lse[b] if per_key else own_lse[a]
                    p = em.let(f"select(0.0f, exp({s[a][b]} * {sc} - {lse}), {kept(a, b)})")
                    if dp is not None:
                        dr = str_dr[b] if per_key else own_dr[a]
                        ds = em.let(f"{p} * ({dp[a][b]} - {dr})")
                    if op == "attn_dkv":
                        w[a][b], w2[a][b] = p, ds
                    else:
                        w[a][b] = ds if dp is not None else p
        for k, (width, _, _) in enumerate(prods):
            wk = w if k == 0 else w2
            acc = accs[k]
            TE = _padded(width, WX) // WX
            if opts.attn_opt("ws_vec"):  # a thread's rows are WR adjacent words per vector
                for b in range(TC):
                    for h in range(TR // WR):
                        vals = [wk[h * WR + i][b] for i in range(WR)]
                        L(f"Ws[({cl(b)}) * {LDW // WR}u + {WY * h}u + ty] = "
                          f"{_vty(WR)}({', '.join(vals)});")
            else:
                for a in range(TR):
                    for b in range(TC):
                        L(_put("Ws", WR, f"({cl(b)}) * {LDW}u + {rl(a)}", wk[a][b]))
            L("workgroupBarrier();")

            xs_name = alias.get("Xs", ("Xs", 0))[0]

            def pv(x0):  # acc += W[:, x0 + xx] X[x0 + xx] over the XK staged rows
                for xx in range(XK):
                    wvs = [em.fresh("w") for _ in range(TR // WR)]
                    for h, wv in enumerate(wvs):
                        L(f"let {wv} = Ws[({x0} + {xx}u) * {LDW // WR}u + {WY * h}u + ty];")
                    if XV == 4:
                        xv = [em.fresh("x") for _ in range(TE // 4)]
                        for q, nm in enumerate(xv):
                            L(f"let {nm} = {xs_name}[{(xx * EP + 4 * WX * q) // 4}u + tx];")
                        xe = [f"{xv[e // 4]}.{'xyzw'[e % 4]}" for e in range(TE)]
                    else:
                        xe = [em.fresh("x") for _ in range(TE)]
                        for e, nm in enumerate(xe):
                            L(f"let {nm} = {xs_name}[{xx * EP + WX * e}u + tx];")
                    for a in range(TR):
                        for e in range(TE):
                            L(f"{acc[a][e]} = fma({_comp(wvs[a // WR], WR, a % WR)}, {xe[e]}, "
                              f"{acc[a][e]});")
            if x_pre is not None:  # every row of the block, loaded before the scores
                for i, x0 in enumerate(range(0, BC, XK)):
                    put("Xs", XV, x_pre[k][i])
                    L("workgroupBarrier();")
                    pv(f"{x0}u")
                    L("workgroupBarrier();")
            else:
                xn = em.let(f"min({BC}u, {cend} - c0)")  # the last block may be short
                with em.block(f"for (var x0 = 0u; x0 < {xn}; x0 += {XK}u)"):
                    put("Xs", XV, x_rows(k, "x0"))
                    L("workgroupBarrier();")
                    pv("x0")
                    L("workgroupBarrier();")

    if op == "attn_lse":  # combine the WX threads' (max, sum) of each row
        for a in range(TR):
            L(f"red_m[({rl(a)}) * {WX}u + tx] = {m_run[a]};")
            L(f"red_l[({rl(a)}) * {WX}u + tx] = {l_run[a]};")
        L("workgroupBarrier();")
        with em.block("if (tx == 0u)"):
            for a in range(TR):
                base = f"({rl(a)}) * {WX}u"
                with em.block(f"if ({own_rows[a]} < {NR}u)"):
                    L(f"var mm: f32 = red_m[{base}];")
                    with em.block(f"for (var t = 1u; t < {WX}u; t++)"):
                        L(f"mm = max(mm, red_m[{base} + t]);")
                    L(f"let mz = select(mm, 0.0f, mm == {ninf});")
                    L("var ll: f32 = 0.0f;")
                    with em.block(f"for (var t = 0u; t < {WX}u; t++)"):
                        L(f"ll = ll + red_l[{base} + t] * exp(red_m[{base} + t] - mz);")
                    L(f"{epi}(bo, {own_rows[a]}, mm + log(ll));")
        return [ctx.dispatch(kernel, em.lines, grid, NT)]

    inv = [None] * TR
    if online:  # the row sums: each thread holds its columns' part
        row_sum = across_row(l_run, "ls", "{r} + {x}")
        for a in range(TR):
            ls = row_sum[a]
            inv[a] = em.let(f"1.0f / {ls}")
            if op == "attn_fwd":  # lse_i = m_i + log(sum), after the row's O
                with em.block(f"if (tx == 0u && {own_rows[a]} < {NR}u)"):
                    L(f"{epi}(bo, {own_rows[a]}, {Eo - 1}u, {m_run[a]} + log({ls}));")
    # several products (attn_dkv's dK and dV columns) writing pieces of an assembled tensor:
    # an epilogue per product, which knows which piece its columns go to (with one, each
    # value tested its column: attn_dkv ran 7% slower on an H200)
    per_prod = len(prods) > 1 and ctx.writes_pieces
    epi_k = [ctx.epilogue_fn(kernel, (nb, NR, Eo), (col0, col0 + width)) if per_prod else epi
             for width, col0, _ in prods]
    for a in range(TR):
        with em.block(f"if ({own_rows[a]} < {NR}u)"):
            for k, (width, col0, post) in enumerate(prods):
                for e, ce in enumerate(out_cols(width)):
                    col = em.let(ce)
                    v = accs[k][a][e]
                    if inv[a] is not None:
                        v = f"{v} * {inv[a]}"
                    if post is not None:
                        v = f"{v} * {sc}"
                    at_ = f"{col0}u + {col}" if col0 else col
                    call = f"{epi_k[k]}(bo, {own_rows[a]}, {at_}, {v});"
                    L(f"if ({col} < {width}u) {{ {call} }}" if _padded(width, WX) != width else call)
    return [ctx.dispatch(kernel, em.lines, grid, NT)]


__all__ = ["build_tiled", "use_tiled", "choose_blocks"]
