"""The tiled matmul kernel (every GPU; matmul_config.Config says its tile).

A workgroup of WY x WX threads (16 x 16 by default) computes a BM x BN tile of C (BM = WY
TM, BN = WX TN): each thread owns a TM x TN block of accumulators held in registers (the
code is unrolled here, in Python, so they stay registers). K advances BK at a time: the
workgroup stages an A tile (BM x BK) and a B tile (BK x BN) in shared memory, k-major so
that a thread's TM (TN) operands are adjacent, then every thread does TM*TN*BK fused
multiply-adds. Reading those operands from shared memory is what limits the kernel on an
H200 (without global loads it ran at 43 TFLOP/s, without shared reads too at 60, with
both at 37, 8 x 8 per thread): more outputs per thread (8 x 16) read fewer operands per
multiply-add. Where an operand's layout allows, threads read it from global memory as vec4
(`vec_axis`), a quarter of the load instructions.

Operands are *strided views* (layout.strided_view): base buffer, offset, and per axis a
list of (size, stride) digits. A transposed operand (backward passes multiply by
swap_axes(W)) is just other strides, a broadcast batch axis has stride 0, and merge_heads'
transpose + reshape is two digits on one axis: nothing is copied. A weight gradient
sum_b x_b^T g_b is one matmul whose K axis runs over (b, k) (fusion.matmul_fold). The
thread->element map of the tile loads follows whichever axis has the smaller stride, so
global reads stay coalesced for either orientation. An operand that is a view of
dequantize(words) (a quantized weight, codegen/quant.py) is read through a decode of its
blocks instead of a load: the f32 weight is never stored, only its blocks are read. Shapes
are constants; bounds tests are emitted only where a dimension is not a multiple of its
tile. The result goes to the group's epilogue `epi(flat, v)`, so elementwise consumers
(bias, relu, an optimizer update) are fused into the writer. Where the epilogue streams a
tensor of the output's size (GELU's pre-activation in its backward), `Config.epi_rows`
splits it (`prefetch_epilogue`) so that the loads of a row of the thread's block are issued
before any of its stores: the GPU's compiler must assume a storage load may alias an
earlier store, so one call after another waits out a memory latency per output.

Sums taken on the way (codegen/fusion.py rules 6 and 7). A bias gradient is the row sum of
the operand its weight gradient reads over the same rows (dY): the workgroups of the
first tile row add up each B tile they stage (only they: summed by every workgroup, the
products ran 3-4% slower on an H200) and write one partial per K chunk. Column sums of
expressions of the output (layer norm's weight and bias gradients from the next Linear's
input gradient) are added in the epilogue: in an unsplit product each thread over its
rows, the workgroup over its threads in workgroup memory, one partial per tile row; in a
split one's chunk sum, each thread over a run of rows of one column, the workgroup over
its runs. Their terms are evaluated before the epilogue's stores, so that their loads wait
out no store (after them the products ran 25% slower). Either way the sum's own kernel
adds the partials and runs its epilogue (the AdamW update of the bias, gamma or beta).

Subgroup operations (the H200's Dawn adapter has them) are not used here: sharing operands
between lanes by shuffles moves one float per lane and instruction where a shared-memory
vec4 read moves four, and operand traffic is what limits this kernel; no matmul variant
was measured. Row reductions were (bench/subgroups.py, H200, 2026-11-30): codegen emits
them for the one-pass logsumexp's (max, sum) pairs (1.38 -> 1.01 ms over [4096, 50257]);
single-value row reductions keep the shared-memory tree, whose subgroup form measured 1.0x
over [4096, 50257] and slower over rows of 512-768 (KernelOptions.subgroup_default;
bench/README.md). Also measured there: Dawn's
robustness (index clamping) costs this kernel 0-2% (`disable_robustness`), and vec4 stores
of 4 adjacent outputs in the epilogue were slower than scalar ones (0.969 against 0.888 ms
at [16384 x 512] @ [512 x 2048]).
"""
from __future__ import annotations

from math import prod

from .layout import batch_base, digits_addr
from .matmul_config import Config
from .matmul_splitk import build_split_sum
from .quant import QuantOperand, operand_reader
from .wgsl import thread_xy

# The tiled kernel's k loop is a WGSL loop when a K step has more FMAs per thread than this
# (0: always unrolled in the WGSL). H200 through Dawn, 2026-11-30, on a fresh machine (no
# driver cache): an unrolled 8 x 16 block at K step 16 (~100 KB of WGSL) took 0.46 s to
# create its pipeline and the loop 0.05 s; the 4096 product ran 3.08-3.15 ms unrolled and
# 3.21 ms looped. At K step 8 the loop cost more (2048: 1.97 -> 2.43 ms), so only the
# K-step-16 tiles loop (KernelOptions.k_loop, 1024).
# Tiles above KernelOptions.k_unroll[0] FMAs per K step (and at most k_loop) loop over the step
# k_unroll[1] k at a time instead of unrolling it whole; None (the default) unrolls. It trades kernel speed
# for pipeline-creation time. H200 through Dawn, 2026-11-30, on a cold driver cache: GPT-2
# 124M's compile + init 5.41 / 6.67 s unrolled, 4.50 / 4.83 s with (512, 4), 4.28 s with
# (512, 2); but the products ran 5-8% slower with (512, 4) (2048: 0.428 -> 0.455 ms;
# [4096 x 768] @ [768 x 3072]: 0.477 -> 0.516) and the vocabulary-wide "odd" tile 18% slower
# (8.11 -> 9.54 ms), so training speed keeps the unrolled steps. Since pipelines are made on a
# pool of threads (webgpu_native.PIPELINE_THREADS), the unrolled steps' cold compile + init is
# 1.5-1.7 s (bench/README.md, "Compile + init"): nothing is left to trade.


def thread_offsets(T: int, vec: bool, w: int = 16) -> list[int]:
    """Offsets (within the tile, in units of the thread id) of a thread's T rows, `w`
    threads along the axis: with vec, groups of 4 adjacent rows, 4w apart (thread t owns
    4t..4t+3, 4w+4t.., ...)."""
    if vec and T >= 4:
        return [(i // 4) * 4 * w + i % 4 for i in range(T)]
    return list(range(T))


def vec_axis(dims, off: int, X: int, K: int, rows: int, BK: int, NT: int) -> str | None:
    """Which axis of an operand's tile ("x": M for A / N for B, "k") its threads may read
    as vec4 (4 consecutive floats, 16-byte aligned), or None. `dims` lists the operand's
    axes as [batch..., x, k] digit lists (layout.strided_view). The axis must be one digit
    of stride 1 whose size is a multiple of 4 (so a vec4 never straddles the end), every
    other stride and the offset multiples of 4, and the tile's vec4s shared evenly by the
    NT threads."""
    if rows * BK % (4 * NT) or off % 4:
        return None
    for axis, size in (("x", X), ("k", K)):
        d = dims[-2] if axis == "x" else dims[-1]
        if len(d) != 1 or d[0][1] != 1 or size % 4:
            continue
        if all(st % 4 == 0 for ax in dims if ax is not d for _, st in ax):
            return axis
    return None


def build_tiled(ctx, node, cfg: Config, opa, opb) -> list:
    (sa, offa, dima, ash), (sb, offb, dimb, bsh) = opa, opb
    M, K, N = ash[-2], ash[-1], bsh[-1]
    batch = tuple(node.shape[:-2])
    nb = prod(batch)
    BM, BN, BK, TM, TN = cfg.bm, cfg.bn, cfg.bk, cfg.tm, cfg.tn
    WX, WY, NT = cfg.wx, cfg.wy, cfg.threads
    LDA, LDB = BM + cfg.pad, BN + cfg.pad
    va, vb = cfg.vec and TM >= 4, cfg.vec and TN >= 4
    if 4 * BK * (LDA + LDB) > ctx.limits.max_compute_workgroup_storage_size and BK > 8 \
            and BM * 8 % NT == 0 and BN * 8 % NT == 0:
        BK = 8
    assert BM * BK % NT == 0 and BN * BK % NT == 0, cfg
    tiles_m, tiles_n = -(-M // BM), -(-N // BN)
    total = tiles_m * tiles_n * nb
    S = cfg.splits
    KS = -(-(-(-K // S)) // BK) * BK  # K per chunk, whole BK steps

    split = f" split {S}" if S > 1 else ""
    kernel = ctx.kernel(f"matmul {'x'.join(map(str, node.shape))} K={K} tile {BM}x{BN}x{BK}{split}")
    # vec4 global loads where an operand's layout allows them on its fast axis (a quantized
    # operand is decoded element by element: never vec4)
    qa, qb = isinstance(sa, QuantOperand), isinstance(sb, QuantOperand)
    mode_a = vec_axis(dima, offa, M, K, BM, BK, NT) if cfg.vload and not qa else None
    mode_b = vec_axis(dimb[:-2] + [dimb[-1], dimb[-2]], offb, N, K, BN, BK, NT) \
        if cfg.vload and not qb else None
    if not (qa or qb) and sa.buffer == sb.buffer and (mode_a is None) != (mode_b is None):
        mode_a = mode_b = None  # one binding, one element type

    def reader(st, mode):  # at -> WGSL: an f32 load, a vec4 load, or a decode of blocks
        if mode is None:
            return operand_reader(kernel, st)
        if st.dtype == "f16":  # four f16 values (8 bytes) widened to f32 as they are read
            name = kernel.binding(st.buffer, "vec4_f16", what=st.what, nbytes=st.nbytes)
            return lambda at: f"vec4<f32>({name}[({at}) >> 2u])"
        name = kernel.binding(st.buffer, "vec4_f32", what=st.what, nbytes=st.nbytes)
        return lambda at: f"{name}[({at}) >> 2u]"
    A, B = reader(sa, mode_a), reader(sb, mode_b)
    db = (cfg.double and cfg.prefetch
          and 8 * BK * (LDA + LDB) <= ctx.limits.max_compute_workgroup_storage_size)
    for name, ld, vec in (("As", LDA, va), ("Bs", LDB, vb)):
        n = BK * ld * (2 if db else 1)
        kernel.decls.append(f"var<workgroup> {name}: array<vec4<f32>, {n // 4}>;" if vec else
                            f"var<workgroup> {name}: array<f32, {n}>;")
    if S > 1:  # partial sums go to scratch; the second kernel runs the epilogue
        part = ctx.scratch[0]
        P = kernel.binding(part.buffer, "f32", write=True, what=part.what, nbytes=part.nbytes)
    else:
        epi_fn = ctx.epilogue(kernel)
        epi = epi_fn.name
    em = ctx.emitter(kernel)
    L = em.emit

    # workgroup-uniform: barriers stay legal
    grid = kernel.workgroup_index(em, total * S, "ws" if S > 1 else "w")
    if S > 1:
        L(f"let sk = ws / {total}u;")
        L(f"let w = ws % {total}u;")
        kbeg, kend = f"sk * {KS}u", em.let(f"min({K}u, sk * {KS}u + {KS}u)")
    else:
        kbeg, kend = "0u", f"{K}u"
    G = min(cfg.group, tiles_m)
    if G > 1 and tiles_n > 1:
        # runs of G tile rows, each run walked column by column: the workgroups running at
        # once share a few B panels and G A panels, which stay in L2 (a [4096 x 768] @
        # [768 x 50257] product in row order reads its 154 MB B once per tile row)
        run = G * tiles_n
        L(f"let wt = w % {tiles_m * tiles_n}u;")
        L(f"let r0 = (wt / {run}u) * {G}u;")
        L(f"let gr = min({G}u, {tiles_m}u - r0);")  # the last run may be shorter
        L(f"let wr = wt % {run}u;")
        L("let tm = r0 + wr % gr;")
        L("let tn = wr / gr;")
    else:
        L(f"let tn = w % {tiles_n}u;")
        L(f"let tm = (w / {tiles_n}u) % {tiles_m}u;")
    L(f"let bt = w / {tiles_m * tiles_n}u;")
    for line in thread_xy(WX, WY, cfg.warp_tiles):
        L(line)
    L(f"let row0 = tm * {BM}u;")
    L(f"let col0 = tn * {BN}u;")
    bdims = em.unravel("bt", batch) if batch else []

    base_a = batch_base(em, batch, bdims, offa, dima, ash)
    base_b = batch_base(em, batch, bdims, offb, dimb, bsh)
    # innermost strides, to pick the coalesced thread -> element map of the tile loads
    sam, sak = dima[-2][-1][1], dima[-1][-1][1]
    sbk, sbn = dimb[-2][-1][1], dimb[-1][-1][1]

    acc = [[f"c{i}_{j}" for j in range(TN)] for i in range(TM)]
    for i in range(TM):
        for j in range(TN):
            L(f"var {acc[i][j]}: f32 = 0.0f;")

    # -- staging: thread -> (x, k) element map, the global read, the shared store
    def plan_tile(tag, rows, s_row, s_col, mode):
        """Each thread's elements of the tile: (x, k, mode) with mode None (one float) or
        "x" / "k" (4 consecutive floats along x / k, read as one vec4)."""
        per = rows * BK // NT // (4 if mode else 1)
        x_fast = s_row == 1 or (s_col != 1 and s_row <= s_col)
        items = []
        for r in range(per):
            e = f"({r * NT}u + lid)" if r else "lid"
            if mode == "x":
                xl, kl = f"({e} % {rows // 4}u) * 4u", f"{e} / {rows // 4}u"
            elif mode == "k":
                xl, kl = f"{e} / {BK // 4}u", f"({e} % {BK // 4}u) * 4u"
            else:
                xl, kl = (f"{e} % {rows}u", f"{e} / {rows}u") if x_fast else \
                    (f"{e} / {BK}u", f"{e} % {BK}u")
            L(f"let {tag}x{r} = {xl};")
            L(f"let {tag}k{r} = {kl};")
            items.append((f"{tag}x{r}", f"{tag}k{r}", mode))
        return items

    def global_read(name, base_e, item, xdim, kdim, need_r, need_c, nrows, row0, k0):
        # a vec4 item's 4 floats are all in range or all out: its axis' size is a multiple
        # of 4 (vec_axis), and so are its first index and the tile origins
        x, k, mode = item
        gx, gk = f"({row0} + {x})", f"({k0} + {k})"
        at = " + ".join([base_e] + digits_addr(xdim, gx, nrows) + digits_addr(kdim, gk, K))
        conds = ([f"{gx} < {nrows}u"] if need_r else []) + ([f"{gk} < {K}u"] if need_c else [])
        v, zero = name(at), ("vec4<f32>(0.0f)" if mode else "0.0f")
        return f"select({zero}, {v}, {' && '.join(conds)})" if conds else v

    def shared_store(arr, ld, vec, item, v, base=""):
        x, k, mode = item
        if mode == "x" and vec:  # 4 floats along x: one vec4 of the k-major tile
            L(f"{arr}[({base}{k} * {ld}u + {x}) >> 2u] = {v};")
            return
        parts = [(f"{v}.{c}", f"{base}{k} * {ld}u + {x} + {j}u" if mode == "x" else
                  f"{base}({k} + {j}u) * {ld}u + {x}") for j, c in enumerate("xyzw")] \
            if mode else [(v, f"{base}{k} * {ld}u + {x}")]
        for val, at in parts:
            if vec:
                L(f"{{ let q = {at}; {arr}[q >> 2u][q & 3u] = {val}; }}")
            else:
                L(f"{arr}[{at}] = {val};")

    need_m, need_n, need_k = M % BM != 0, N % BN != 0, K % BK != 0
    ia = plan_tile("a", BM, sam, sak, mode_a)
    ib = plan_tile("b", BN, sbn, sbk, mode_b)
    reads = ([(A, base_a, it, dima[-2], dima[-1], need_m, M, "row0", "As", LDA, va) for it in ia]
             + [(B, base_b, it, dimb[-1], dimb[-2], need_n, N, "col0", "Bs", LDB, vb) for it in ib])

    def fetch(k0):
        return [global_read(nm, be, it, sr, sc, nr, need_k, nrows, r0, k0)
                for nm, be, it, sr, sc, nr, nrows, r0, _, _, _ in reads]

    # an operand's row sums over K (fusion.operand_sums: a bias gradient beside its weight
    # gradient): each thread adds up what it stages, then the workgroups of the first tile
    # row (column, for A) sum their threads' parts per row of the operand into K-chunk
    # partials
    side = getattr(ctx, "operand_sum", None)
    side_reads = set()
    if side is not None:
        side_reads = set(range(len(ia))) if side[0] == 0 else set(range(len(ia), len(reads)))
        other = "tn" if side[0] == 0 else "tm"
        for r in sorted(side_reads):
            vec4 = reads[r][2][2] is not None
            L(f"var s{r}: {'vec4<f32>' if vec4 else 'f32'} = "
              f"{'vec4<f32>(0.0f)' if vec4 else '0.0f'};")

    def stage(r, v, base=""):  # read r's value v into its place in the staged tile
        rd = reads[r]
        if r in side_reads:
            v = em.let(v)
            # only where they are written (a branch whole workgroups take): summed by every
            # thread, the products ran 3-4% slower on an H200, this way 0.7-1.7%
            L(f"if ({other} == 0u) {{ s{r} += {v}; }}")
        shared_store(rd[8], rd[9], rd[10], rd[2], v, base)

    if cfg.prefetch:
        regs = [f"p{r}" for r in range(len(reads))]
        for reg, v, rd in zip(regs, fetch(kbeg), reads):
            L(f"var {reg}: {'vec4<f32>' if rd[2][2] else 'f32'} = {v};")

    rows_a, cols_b = thread_offsets(TM, va, WY), thread_offsets(TN, vb, WX)

    def k_step(kk, tag, oa="", ob=""):   # one k of the tile: TM + TN shared reads, TM x TN FMAs
        def operand(name, arr, off, ld, t, T, W, vec):  # a thread's T values of this k
            row = ld // 4 if vec else ld  # a k-row of the staged tile, in array elements
            at = f"{kk * row}u" if isinstance(kk, int) else f"{kk} * {row}u"  # kk: constant or loop variable
            if vec:
                for q in range(T // 4):
                    L(f"let {name}v{tag}_{q} = {arr}[{off}{at} + {t} + {W * q}u];")
                return [f"{name}v{tag}_{i // 4}.{'xyzw'[i % 4]}" for i in range(T)]
            for i in range(T):
                L(f"let {name}{tag}_{i} = {arr}[{off}{at} + {t} * {T}u + {i}u];")
            return [f"{name}{tag}_{i}" for i in range(T)]
        a_names = operand("a", "As", oa, LDA, "ty", TM, WY, va)
        b_names = operand("b", "Bs", ob, LDB, "tx", TN, WX, vb)
        for i in range(TM):
            for j in range(TN):
                L(f"{acc[i][j]} = fma({a_names[i]}, {b_names[j]}, {acc[i][j]});")

    def k_tile(oa="", ob=""):  # the staged tile's BK k
        K_LOOP, K_UNROLL = ctx.limits.options.k_loop, ctx.limits.options.k_unroll
        if K_LOOP and TM * TN * BK > K_LOOP:
            # a WGSL loop over the tile's k rather than BK unrolled copies: the shader stays
            # small (an 8 x 16 block at K step 16 is ~100 KB unrolled, and the driver takes
            # ~0.15 s to compile each such pipeline), the GPU's compiler unrolls it anyway
            with em.block(f"for (var kk = 0u; kk < {BK}u; kk++)"):
                k_step("kk", "", oa, ob)
        elif K_UNROLL and TM * TN * BK > K_UNROLL[0] and BK % K_UNROLL[1] == 0 and BK > K_UNROLL[1]:
            U = K_UNROLL[1]
            with em.block(f"for (var kb = 0u; kb < {BK}u; kb += {U}u)"):
                for u in range(U):
                    k_step(f"(kb + {u}u)", u, oa, ob)
        else:
            for kk in range(BK):
                k_step(kk, kk, oa, ob)

    if db:
        # two buffers, the loop unrolled over them so that every shared address is a
        # constant offset from the thread's base (an offset computed from the buffer's
        # index cost more than the barrier it saves): the first K step's tiles go to buffer
        # 0; each half computes from its buffer while the next step's tiles (already in
        # registers) go to the other one, and one barrier ends the half (the other buffer
        # was last read in the half before, which that half's barrier closed)
        for r, reg in enumerate(regs):
            stage(r, reg)
        L("workgroupBarrier();")

        def half(b, k, more):
            L(f"let {more} = {k} + {BK}u < {kend};")
            with em.block(f"if ({more})"):
                for reg, v in zip(regs, fetch(f"{k} + {BK}u")):
                    L(f"{reg} = {v};")
            k_tile(f"{b * BK * LDA // (4 if va else 1)}u + ", f"{b * BK * LDB // (4 if vb else 1)}u + ")
            with em.block(f"if ({more})"):
                for r, reg in enumerate(regs):
                    stage(r, reg, f"{(1 - b) * BK * reads[r][9]}u + ")
            L("workgroupBarrier();")
        with em.block(f"for (var k0 = {kbeg}; k0 < {kend}; k0 += {2 * BK}u)"):
            half(0, "k0", "more0")
            with em.block("if (more0)"):
                half(1, f"(k0 + {BK}u)", "more1")
    else:
        with em.block(f"for (var k0 = {kbeg}; k0 < {kend}; k0 += {BK}u)"):
            if cfg.prefetch:
                for r, reg in enumerate(regs):
                    stage(r, reg)
                L("workgroupBarrier();")
                with em.block(f"if (k0 + {BK}u < {kend})"):
                    for reg, v in zip(regs, fetch(f"k0 + {BK}u")):
                        L(f"{reg} = {v};")
            else:
                for r, v in enumerate(fetch("k0")):
                    stage(r, v)
                L("workgroupBarrier();")
            k_tile()
            L("workgroupBarrier();")
    def column_totals(B, terms, Q, at, guard):
        """A thread per column c of B (looping where B > NT): Q[at(c)] = the sum of
        terms(c), where guard(c) holds (None: everywhere); the sums' partials."""
        with em.block(f"for (var c = lid; c < {B}u; c += {NT}u)" if B > NT else
                      f"if (lid < {B}u)"):
            c = "c" if B > NT else "lid"
            L("var t = 0.0f;")
            for term in terms(c):
                L(f"t += {term};")
            store = f"{Q}[{at(c)}] = t;"
            L(f"if ({guard(c)}) {{ {store} }}" if guard else store)

    if side is not None:
        # the first tile row (B; column, A) of workgroups: each thread's staged sums go
        # where its loads went, and the tile's k are added per row of the operand into
        # the K chunk's partial sum of that row: scratch[sk * X + x]
        BX, x0, X = (BM, "row0", M) if side[0] == 0 else (BN, "col0", N)
        part = side[1]
        Q = kernel.binding(part.buffer, "f32", write=True, what=part.what, nbytes=part.nbytes)
        arr, ld, vec = reads[min(side_reads)][8:11]
        with em.block(f"if ({other} == 0u)"):
            for r in sorted(side_reads):
                shared_store(arr, ld, vec, reads[r][2], f"s{r}")
            L("workgroupBarrier();")
            column_totals(
                BX, lambda c: [f"{arr}[({kk * ld}u + {c}) >> 2u][{c} & 3u]" if vec
                               else f"{arr}[{kk * ld}u + {c}]" for kk in range(BK)],
                Q, lambda c: f"{'sk * ' + str(X) + 'u + ' if S > 1 else ''}{x0} + {c}",
                (lambda c: f"{x0} + {c} < {X}u") if X % BX else None)

    L(f"let m0 = row0 + ty * {4 if va else TM}u;")
    L(f"let n0 = col0 + tx * {4 if vb else TN}u;")
    L(f"let f0 = bt * {M * N}u + m0 * {N}u + n0;")
    if S > 1:
        L(f"let poff = sk * {nb * M * N}u + f0;")
    osums = getattr(ctx, "output_sums", []) if S == 1 else []  # (split: in the chunk sum)
    if osums:
        # sums over the rows of expressions of the output (fusion.output_sums): each thread
        # adds its rows per column, the workgroup its WY threads per column, and the tile
        # row's partial of each column goes to scratch[(bt * tiles_m + tm) * N + n]. Before
        # the epilogue's stores: the loads of the sums' terms wait out no store (the GPU's
        # compiler keeps a storage load after any earlier storage store)
        kernel.decls.append(f"var<workgroup> Os: array<f32, {WY * BN}>;")
        totals = []  # every sum's per-column totals first: all their loads, then stores
        for j, (x, part) in enumerate(osums):
            fn = ctx.sum_fn(kernel, x, f"osum{j}")
            totals.append([])
            for c, cj in enumerate(cols_b):
                t = em.var("f32", "0.0f", prefix="ot")
                for i, ri in enumerate(rows_a):
                    conds = (([f"m0 + {ri}u < {M}u"] if need_m else [])
                             + ([f"n0 + {cj}u < {N}u"] if need_n else []))
                    add = f"{t} += {fn}(f0 + {ri * N + cj}u, {acc[i][c]});"
                    L(f"if ({' && '.join(conds)}) {{ {add} }}" if conds else add)
                totals[-1].append(t)
        for (x, part), ts in zip(osums, totals):
            Q = kernel.binding(part.buffer, "f32", write=True, what=part.what, nbytes=part.nbytes)
            for t, cj in zip(ts, cols_b):
                L(f"Os[ty * {BN}u + n0 - col0 + {cj}u] = {t};")
            L("workgroupBarrier();")
            column_totals(BN, lambda c: [f"Os[{y * BN}u + {c}]" for y in range(WY)],
                          Q, lambda c: f"(bt * {tiles_m}u + tm) * {N}u + col0 + {c}",
                          (lambda c: f"col0 + {c} < {N}u") if need_n else None)
            L("workgroupBarrier();")
    pre = S == 1 and cfg.epi_rows > 0 and prefetch_epilogue(
        kernel, epi_fn, ctx.limits.options.epi_max_loads)
    for i0 in range(0, TM, max(1, cfg.epi_rows) if pre else TM):
        rows = list(enumerate(rows_a))[i0:i0 + cfg.epi_rows] if pre else list(enumerate(rows_a))
        if pre:  # the epilogue's loads of these rows first, then their stores
            for i, ri in rows:
                for j, cj in enumerate(cols_b):
                    L(f"let q{i}_{j} = {epi}_ld(f0 + {ri * N + cj}u);")
        for i, ri in rows:
            for j, cj in enumerate(cols_b):
                conds = (([f"m0 + {ri}u < {M}u"] if need_m else [])
                         + ([f"n0 + {cj}u < {N}u"] if need_n else []))
                call = (f"{P}[poff + {ri * N + cj}u] = {acc[i][j]};" if S > 1 else
                        f"{epi}(f0 + {ri * N + cj}u, {acc[i][j]}, q{i}_{j});" if pre else
                        f"{epi}(f0 + {ri * N + cj}u, {acc[i][j]});")
                L(f"if ({' && '.join(conds)}) {{ {call} }}" if conds else call)
    out = [ctx.dispatch(kernel, em.lines, grid, NT)]
    if S > 1:
        out[0]["cost"] = True  # the profiler's bytes and FLOPs: the product, not the sum
        out.append(build_split_sum(ctx, node, S, nb * M * N))
    return out


def prefetch_epilogue(kernel, epi, max_loads: int) -> bool:
    """Put the epilogue `fn epi(f, v)` (program.GroupCtx.epilogue, emit.Epilogue) in
    kernel's functions as two where it loads anything (a bias, a pre-activation):
    `epi_ld(f)` makes those loads, which depend on f alone, and returns them in a struct;
    `epi(f, v, p)` is the rest, taking the loaded values from p. The tile's writer then
    issues the loads of several outputs before their stores (Config.epi_rows): the GPU's
    compiler keeps a load after any earlier store to a storage buffer (they may alias), so
    one call after another waits out a memory latency per value. Only where a load
    streams a tensor of the output's size (read at f): a broadcast bias alone is a cache
    hit, and prefetching it measured slower (the GPT-2 MLP's GELU forward, 0.546 -> 0.554
    ms). False (nothing changed): no such load, or more than max_loads loads
    (KernelOptions.epi_max_loads), or a body that is not straight-line lets and stores."""
    got = epilogue_loads(epi, max_loads)
    if got is None:
        return False
    keep, loads = got
    names = [s.name for s in loads]
    fields = ", ".join(f"{s.name}: {s.elem}" for s in loads)
    kernel.functions[epi.slot:epi.slot + 1] = [
        f"struct EpiLoads {{ {fields} }}\n",
        f"fn {epi.name}_ld({epi.params}) -> EpiLoads {{\n" + "\n".join(s.text for s in keep)
        + f"\n  return EpiLoads({', '.join(names)});\n}}\n",
        epi.function([f"  let {s.name} = p.{s.name};" if s.name in names else s.text
                      for s in epi.stmts], ", p: EpiLoads")]
    return True


def epilogue_loads(epi, max_loads: int):
    """(the statements epi_ld keeps: its loads and what their indices are computed from,
    the loads) of prefetch_epilogue's split of `epi`, or None where it does not split.
    A statement depends on the value v where any name it is built from does (Stmt.deps);
    the loads are those that do not, except loads widened from f16 (their value is a
    conversion, computed in place)."""
    if epi.flat is None or any(s.kind not in ("let", "load", "store") for s in epi.stmts):
        return None  # anything but straight-line lets and stores: left as it is
    dep, loads, pure = {"v"}, [], []
    for s in epi.stmts:
        if s.kind == "store":
            continue
        if s.deps & dep:
            dep.add(s.name)
            continue
        pure.append(s)
        if s.kind == "load" and s.elem != "f16":
            loads.append(s)
    if len(loads) > max_loads or not any(s.at == epi.flat for s in loads):
        return None  # nothing streamed from memory at f: a broadcast bias stays in cache
    need, keep = {s.name for s in loads}, []  # epi_ld keeps what the loads' indices need
    for s in reversed(pure):
        if s.name in need:
            keep.append(s)
            need |= s.deps
    return keep[::-1], loads
