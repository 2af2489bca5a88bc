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
splits it (matmul_epilogue.prefetch_epilogue) so that the loads of a row of the thread's block are issued
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

from dataclasses import dataclass
from math import prod

from .layout import batch_base, digits_addr
from .matmul_config import Config, Tile, tile_of
from .matmul_epilogue import column_totals, output_sum_partials, prefetch_epilogue, write_block
from .matmul_splitk import build_split_sum
from .quant import QuantOperand, operand_reader, vec4_reader
from .wgsl import thread_xy, u32_lit

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
# pool of threads (webgpu_device.PIPELINE_THREADS), the unrolled steps' cold compile + init is
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


def load_modes(cfg: Config, t: Tile, opa, opb) -> tuple[str | None, str | None]:
    """How A's and B's tiles are read from global memory: vec_axis's axis ("x" / "k": 4
    floats as one vec4) where cfg.vload and the operand's layout allow, else None (a float
    at a time; always for a quantized operand, decoded element by element). One buffer
    read as both operands keeps one element type: both vec4 or neither."""
    (sa, offa, dima, ash), (sb, offb, dimb, bsh) = opa, opb
    M, K, N = ash[-2], ash[-1], bsh[-1]
    qa, qb = isinstance(sa, QuantOperand), isinstance(sb, QuantOperand)
    mode_a = vec_axis(dima, offa, M, K, t.BM, t.BK, t.NT) if cfg.vload and not qa else None
    mode_b = vec_axis(dimb[:-2] + [dimb[-1], dimb[-2]], offb, N, K, t.BN, t.BK, t.NT) \
        if cfg.vload and not qb else None
    if not (qa or qb) and sa.buffer == sb.buffer and (mode_a is None) != (mode_b is None):
        mode_a = mode_b = None  # one binding, one element type
    return mode_a, mode_b


def tile_order(tiles_m: int, tiles_n: int, group: int) -> list[str]:
    """WGSL lines giving workgroup w (< tiles_m tiles_n per batch element) its tile (tm, tn):
    row by row, or (group > 1) in runs of `group` tile rows, each run walked column by
    column: the workgroups running at once share a few B panels and `group` A panels,
    which stay in L2 (a [4096 x 768] @ [768 x 50257] product in row order reads its 154 MB
    B once per tile row)."""
    G = min(group, tiles_m)
    if G > 1 and tiles_n > 1:
        run = G * tiles_n
        return [f"let wt = w % {tiles_m * tiles_n}u;",
                f"let r0 = (wt / {run}u) * {G}u;",
                f"let gr = min({G}u, {tiles_m}u - r0);",  # the last run may be shorter
                f"let wr = wt % {run}u;",
                "let tm = r0 + wr % gr;",
                "let tn = wr / gr;"]
    return [f"let tn = w % {tiles_n}u;", f"let tm = (w / {tiles_n}u) % {tiles_m}u;"]


def tile_elements(tag: str, rows: int, BK: int, NT: int, s_row: int, s_col: int,
                  mode: str | None) -> list[tuple[str, str, str, str]]:
    """Thread lid's elements of a rows x BK tile: per element r, (x name, x in WGSL, k
    name, k in WGSL), each one float or (mode "x" / "k") 4 consecutive floats along x / k.
    Consecutive threads take consecutive elements along the axis whose stride (s_row
    along x, s_col along k) is smaller, so that a warp's loads coalesce."""
    per = rows * BK // NT // (4 if mode else 1)
    x_fast = s_row == 1 or (s_col != 1 and s_row <= s_col)
    out = []
    for r in range(per):
        e = f"({r * NT}u + lid)" if r else "lid"
        if mode == "x":
            xl, kl = f"({e} % {rows // 4}u) * 4u", f"{e} / {rows // 4}u"
        elif mode == "k":
            xl, kl = f"{e} / {BK // 4}u", f"({e} % {BK // 4}u) * 4u"
        else:
            xl, kl = (f"{e} % {rows}u", f"{e} / {rows}u") if x_fast else \
                (f"{e} / {BK}u", f"{e} % {BK}u")
        out.append((f"{tag}x{r}", xl, f"{tag}k{r}", kl))
    return out


@dataclass(frozen=True)
class Read:
    """One element (x, k, mode) of a thread's share of an operand's staged tile: read by
    `load` (address -> WGSL value) at `base` + the digits xdim / kdim of global x = origin +
    x (row0 or col0; tested against X where need_x) and k, stored into `arr` (rows of ld
    floats; a vec4 array where vec)."""
    load: object
    base: str
    x: str
    k: str
    mode: str | None
    xdim: list
    kdim: list
    need_x: bool
    X: int
    origin: str
    arr: str
    ld: int
    vec: bool


def global_read(rd: Read, k0: str, K: int, need_k: bool) -> str:
    """The WGSL value of rd at the K step starting at k0: zero where out of range. A vec4
    item's 4 floats are all in range or all out: its axis' size is a multiple of 4
    (vec_axis), and so are its first index and the tile origins."""
    gx, gk = f"({rd.origin} + {rd.x})", f"({k0} + {rd.k})"
    at = " + ".join([rd.base] + digits_addr(rd.xdim, gx, rd.X) + digits_addr(rd.kdim, gk, K))
    conds = ([f"{gx} < {rd.X}u"] if rd.need_x else []) + ([f"{gk} < {K}u"] if need_k else [])
    v, zero = rd.load(at), ("vec4<f32>(0.0f)" if rd.mode else "0.0f")
    return f"select({zero}, {v}, {' && '.join(conds)})" if conds else v


def shared_store(em, arr: str, ld: int, vec: bool, x: str, k: str, mode, v: str,
                 base: str = "") -> None:
    """Emit the store of value v (of element (x, k, mode)) into the staged tile `arr`
    (k-major, rows of ld floats, from offset `base`)."""
    if mode == "x" and vec:  # 4 floats along x: one vec4 of the k-major tile
        em.emit(f"{arr}[({base}{k} * {ld}u + {x}) >> 2u] = {v};")
        return
    parts = [(f"{v}.{c}", f"{base}{k} * {ld}u + {x} + {j}u" if mode == "x" else
              f"{base}({k} + {j}u) * {ld}u + {x}") for j, c in enumerate("xyzw")] \
        if mode else [(v, f"{base}{k} * {ld}u + {x}")]
    for val, at in parts:
        if vec:
            em.emit(f"{{ let q = {at}; {arr}[q >> 2u][q & 3u] = {val}; }}")
        else:
            em.emit(f"{arr}[{at}] = {val};")


class Staging:
    """The K loop's global reads and shared stores of one thread: `reads` (A's, then B's),
    and, where the product also takes an operand's row sums (fusion.operand_sums: a bias
    gradient beside its weight gradient), which reads add up what they stage (`side`:
    their indices; `other`: the tile coordinate that is 0 in the workgroups that sum)."""

    def __init__(self, em, reads: list[Read], K: int, need_k: bool, side=(), other=""):
        self.em, self.reads, self.K, self.need_k = em, reads, K, need_k
        self.side, self.other = set(side), other

    def fetch(self, k0: str) -> list[str]:
        """Every read's value at the K step starting at k0."""
        return [global_read(rd, k0, self.K, self.need_k) for rd in self.reads]

    def stage(self, r: int, v: str, base: str = "") -> None:
        """Store read r's value v into its place in the staged tile."""
        rd = self.reads[r]
        if r in self.side:
            v = self.em.let(v)
            # only where they are written (a branch whole workgroups take): summed by every
            # thread, the products ran 3-4% slower on an H200, this way 0.7-1.7%
            self.em.emit(f"if ({self.other} == 0u) {{ s{r} += {v}; }}")
        shared_store(self.em, rd.arr, rd.ld, rd.vec, rd.x, rd.k, rd.mode, v, base)


def k_step(em, t: Tile, acc, kk, tag, oa: str = "", ob: str = "") -> None:
    """One k of the staged tiles (kk: a constant or a loop variable): TM + TN shared reads,
    TM x TN FMAs into acc. oa / ob: the offset of the buffer read (double buffering)."""
    def operand(name, arr, off, ld, tid, T, W, vec, apart=False):  # a thread's T values of this k
        row = ld // 4 if vec else ld  # a k-row of the staged tile, in array elements
        at = f"{kk * row}u" if isinstance(kk, int) else f"{kk} * {row}u"
        if vec:
            for q in range(T // 4):
                em.emit(f"let {name}v{tag}_{q} = {arr}[{off}{at} + {tid} + {W * q}u];")
            return [f"{name}v{tag}_{i // 4}.{'xyzw'[i % 4]}" for i in range(T)]
        for i in range(T):
            at_i = f"{tid} + {i * W}u" if apart else f"{tid} * {T}u + {i}u"
            em.emit(f"let {name}{tag}_{i} = {arr}[{off}{at} + {at_i}];")
        return [f"{name}{tag}_{i}" for i in range(T)]
    a_names = operand("a", "As", oa, t.LDA, "ty", t.TM, t.WY, t.va)
    b_names = operand("b", "Bs", ob, t.LDB, "tx", t.TN, t.WX, t.vb, t.apart)
    for i in range(t.TM):
        for j in range(t.TN):
            em.emit(f"{acc[i][j]} = fma({a_names[i]}, {b_names[j]}, {acc[i][j]});")


def k_tile(em, t: Tile, acc, options, oa: str = "", ob: str = "") -> None:
    """The staged tiles' BK k: unrolled, or a WGSL loop (KernelOptions.k_loop, k_unroll)."""
    K_LOOP, K_UNROLL = options.k_loop, options.k_unroll
    if K_LOOP and t.TM * t.TN * t.BK > K_LOOP:
        # a WGSL loop over the tile's k rather than BK unrolled copies: the shader stays
        # small (an 8 x 16 block at K step 16 is ~100 KB unrolled, and the driver takes
        # ~0.15 s to compile each such pipeline), the GPU's compiler unrolls it anyway
        with em.block(f"for (var kk = 0u; kk < {t.BK}u; kk++)"):
            k_step(em, t, acc, "kk", "", oa, ob)
    elif K_UNROLL and t.TM * t.TN * t.BK > K_UNROLL[0] and t.BK % K_UNROLL[1] == 0 \
            and t.BK > K_UNROLL[1]:
        U = K_UNROLL[1]
        with em.block(f"for (var kb = 0u; kb < {t.BK}u; kb += {U}u)"):
            for u in range(U):
                k_step(em, t, acc, f"(kb + {u}u)", u, oa, ob)
    else:
        for kk in range(t.BK):
            k_step(em, t, acc, kk, kk, oa, ob)


def k_loop(em, t: Tile, acc, stg: Staging, options, *, prefetch: bool, double: bool,
           kbeg: str, kend: str) -> None:
    """The loop over K steps [kbeg, kend): stage the tiles, barrier, multiply-add, barrier.
    prefetch: the next step's global reads go to registers before this step's FMAs;
    double (with prefetch): two shared buffers, one barrier per step."""
    BK, L = t.BK, em.emit
    regs = [f"p{r}" for r in range(len(stg.reads))] if prefetch else []
    em.declare(*regs)  # stage() takes them as they are
    for reg, v, rd in zip(regs, stg.fetch(kbeg), stg.reads):
        L(f"var {reg}: {'vec4<f32>' if rd.mode else 'f32'} = {v};")
    if double:
        # two buffers, the loop unrolled over them so that every shared address is a
        # constant offset from the thread's base (an offset computed from the buffer's
        # index cost more than the barrier it saves): the first K step's tiles go to buffer
        # 0; each half computes from its buffer while the next step's tiles (already in
        # registers) go to the other one, and one barrier ends the half (the other buffer
        # was last read in the half before, which that half's barrier closed)
        for r, reg in enumerate(regs):
            stg.stage(r, reg)
        L("workgroupBarrier();")

        def half(b, k, more):
            L(f"let {more} = {k} + {BK}u < {kend};")
            with em.block(f"if ({more})"):
                for reg, v in zip(regs, stg.fetch(f"{k} + {BK}u")):
                    L(f"{reg} = {v};")
            k_tile(em, t, acc, options, f"{b * BK * t.LDA // (4 if t.va else 1)}u + ",
                   f"{b * BK * t.LDB // (4 if t.vb else 1)}u + ")
            with em.block(f"if ({more})"):
                for r, reg in enumerate(regs):
                    stg.stage(r, reg, f"{(1 - b) * BK * stg.reads[r].ld}u + ")
            L("workgroupBarrier();")
        with em.block(f"for (var k0 = {kbeg}; k0 < {kend}; k0 += {2 * BK}u)"):
            half(0, "k0", "more0")
            with em.block("if (more0)"):
                half(1, f"(k0 + {BK}u)", "more1")
        return
    with em.block(f"for (var k0 = {kbeg}; k0 < {kend}; k0 += {BK}u)"):
        if prefetch:
            for r, reg in enumerate(regs):
                stg.stage(r, reg)
            L("workgroupBarrier();")
            with em.block(f"if (k0 + {BK}u < {kend})"):
                for reg, v in zip(regs, stg.fetch(f"k0 + {BK}u")):
                    L(f"{reg} = {v};")
        else:
            for r, v in enumerate(stg.fetch("k0")):
                stg.stage(r, v)
            L("workgroupBarrier();")
        k_tile(em, t, acc, options)
        L("workgroupBarrier();")


def operand_sum_partials(em, kernel, t: Tile, stg: Staging, side, X: int, split: bool) -> None:
    """The operand's row sums (Staging.side): the first tile row (B; column, A) of
    workgroups stores each thread's sums where its loads went, and the tile's k are added
    per row of the operand into the K chunk's partial sum of that row: scratch[sk * X + x]."""
    BX, x0 = (t.BM, "row0") if side[0] == 0 else (t.BN, "col0")
    part = side[1]
    Q = kernel.binding(part.buffer, "f32", write=True, what=part.what, nbytes=part.nbytes)
    first = stg.reads[min(stg.side)]
    arr, ld, vec = first.arr, first.ld, first.vec
    with em.block(f"if ({stg.other} == 0u)"):
        for r in sorted(stg.side):
            rd = stg.reads[r]
            shared_store(em, arr, ld, vec, rd.x, rd.k, rd.mode, f"s{r}")
        em.emit("workgroupBarrier();")
        column_totals(
            em, BX, t.NT, lambda c: [f"{arr}[({kk * ld}u + {c}) >> 2u][{c} & 3u]" if vec
                                     else f"{arr}[{kk * ld}u + {c}]" for kk in range(t.BK)],
            Q, lambda c: f"{'sk * ' + str(X) + 'u + ' if split else ''}{x0} + {c}",
            (lambda c: f"{x0} + {c} < {X}u") if X % BX else None)


def build_tiled(ctx, node, cfg: Config, opa, opb) -> list:
    """The tiled kernel of the matmul group's product (opa, opb: matmul_operands) on cfg's
    tile, in stages, each a function of this module or of matmul_epilogue.py: set-up
    (matmul_config.tile_of, load_modes, tile_order), staging (tile_elements: a thread's
    elements of the tiles; Read, global_read, shared_store, Staging), compute (k_loop,
    k_tile, k_step), the sums taken on the way (operand_sum_partials,
    output_sum_partials) and the block's write (write_block, prefetch_epilogue)."""
    (sa, offa, dima, ash), (sb, offb, dimb, bsh) = opa, opb
    M, K, N = ash[-2], ash[-1], bsh[-1]
    batch = tuple(node.shape[:-2])
    nb = prod(batch)
    t = tile_of(cfg, ctx.limits.max_compute_workgroup_storage_size)
    BM, BN, BK, TM, TN, NT = t.BM, t.BN, t.BK, t.TM, t.TN, t.NT
    tiles_m, tiles_n = -(-M // BM), -(-N // BN)
    total = tiles_m * tiles_n * nb
    S = cfg.splits
    KS = -(-(-(-K // S)) // BK) * BK  # K per chunk, whole BK steps

    split = f" split {S}" if S > 1 else ""
    kernel = ctx.kernel(f"matmul {'x'.join(map(str, node.shape))} K={K} tile {BM}x{BN}x{BK}{split}")
    mode_a, mode_b = load_modes(cfg, t, opa, opb)

    def reader(st, mode):  # at -> WGSL: an f32 load, a vec4 load, or a decode of blocks
        if mode is None:
            return operand_reader(kernel, st)
        return vec4_reader(kernel, st)  # f16 storage: four values (8 bytes) widened
    A, B = reader(sa, mode_a), reader(sb, mode_b)
    db = (cfg.double and cfg.prefetch
          and 8 * BK * (t.LDA + t.LDB) <= ctx.limits.max_compute_workgroup_storage_size)
    for name, ld, vec in (("As", t.LDA, t.va), ("Bs", t.LDB, t.vb)):
        n = BK * ld * (2 if db else 1)
        kernel.decls.append(f"var<workgroup> {name}: array<vec4<f32>, {n // 4}>;" if vec else
                            f"var<workgroup> {name}: array<f32, {n}>;")
    if S > 1:  # partial sums go to scratch; the second kernel runs the epilogue
        part = ctx.scratch[0]
        P = kernel.binding(part.buffer, "f32", write=True, what=part.what, nbytes=part.nbytes)
    else:
        epi_fn = ctx.epilogue(kernel)
    em = ctx.emitter(kernel)
    L = em.emit

    # workgroup-uniform: barriers stay legal
    grid = kernel.workgroup_index(em, total * S, "ws" if S > 1 else "w")
    if S > 1:
        L(f"let sk = ws / {total}u;")
        L(f"let w = ws % {total}u;")
        kbeg, kend = f"sk * {KS}u", em.let(f"min({K}u, sk * {KS}u + {KS}u)")
    else:
        kbeg, kend = u32_lit(0), u32_lit(K)
    for line in tile_order(tiles_m, tiles_n, cfg.group):
        L(line)
    L(f"let bt = w / {tiles_m * tiles_n}u;")
    em.declare("bt")
    for line in thread_xy(t.WX, t.WY, cfg.warp_tiles):
        L(line)
    L(f"let row0 = tm * {BM}u;")
    L(f"let col0 = tn * {BN}u;")
    bdims = em.unravel("bt", batch) if batch else []

    base_a = batch_base(em, batch, bdims, offa, dima, ash)
    base_b = batch_base(em, batch, bdims, offb, dimb, bsh)
    acc = [[f"c{i}_{j}" for j in range(TN)] for i in range(TM)]
    for i in range(TM):
        for j in range(TN):
            L(f"var {acc[i][j]}: f32 = 0.0f;")

    # thread -> (x, k) element maps, by the operands' innermost strides (coalesced reads)
    need_m, need_n, need_k = M % BM != 0, N % BN != 0, K % BK != 0
    reads = []
    for tag, rows, s_row, s_col, mode, load, base, xdim, kdim, need_x, X, origin, arr, ld, vec in (
            ("a", BM, dima[-2][-1][1], dima[-1][-1][1], mode_a, A, base_a, dima[-2], dima[-1],
             need_m, M, "row0", "As", t.LDA, t.va),
            ("b", BN, dimb[-1][-1][1], dimb[-2][-1][1], mode_b, B, base_b, dimb[-1], dimb[-2],
             need_n, N, "col0", "Bs", t.LDB, t.vb)):
        for xn, xl, kn, kl in tile_elements(tag, rows, BK, NT, s_row, s_col, mode):
            L(f"let {xn} = {xl};")
            L(f"let {kn} = {kl};")
            reads.append(Read(load, base, xn, kn, mode, xdim, kdim, need_x, X, origin, arr, ld, vec))

    # an operand's row sums over K (fusion.operand_sums): each thread adds up what it
    # stages, then the workgroups of the first tile row (column, for A) sum their threads'
    # parts per row of the operand into K-chunk partials (operand_sum_partials)
    side = getattr(ctx, "operand_sum", None)
    na = sum(rd.arr == "As" for rd in reads)
    if side is not None:
        mine = range(na) if side[0] == 0 else range(na, len(reads))
        stg = Staging(em, reads, K, need_k, mine, "tn" if side[0] == 0 else "tm")
        for r in mine:
            vec4 = reads[r].mode is not None
            L(f"var s{r}: {'vec4<f32>' if vec4 else 'f32'} = "
              f"{'vec4<f32>(0.0f)' if vec4 else '0.0f'};")
    else:
        stg = Staging(em, reads, K, need_k)
    k_loop(em, t, acc, stg, ctx.limits.options, prefetch=cfg.prefetch, double=db,
           kbeg=kbeg, kend=kend)
    if side is not None:
        operand_sum_partials(em, kernel, t, stg, side, M if side[0] == 0 else N, S > 1)

    rows_a = thread_offsets(TM, t.va, t.WY)
    cols_b = [j * t.WX for j in range(TN)] if t.apart else thread_offsets(TN, t.vb, t.WX)
    L(f"let m0 = row0 + ty * {4 if t.va else TM}u;")
    L(f"let n0 = col0 + tx * {1 if t.apart else 4 if t.vb else TN}u;")
    L(f"let f0 = bt * {M * N}u + m0 * {N}u + n0;")
    if S > 1:
        L(f"let poff = sk * {nb * M * N}u + f0;")
        write_block(em, acc, rows_a, cols_b, M, N, need_m, need_n, partials=P)
    else:
        osums = getattr(ctx, "output_sums", [])  # (split: in the chunk sum)
        if osums:
            output_sum_partials(ctx, em, kernel, t, acc, osums, rows_a, cols_b, M, N, tiles_m)
        pre = cfg.epi_rows > 0 and prefetch_epilogue(kernel, epi_fn,
                                                     ctx.limits.options.epi_max_loads)
        write_block(em, acc, rows_a, cols_b, M, N, need_m, need_n, epi=epi_fn.name,
                    prefetch_rows=cfg.epi_rows if pre else 0)
    out = [ctx.dispatch(kernel, em.lines, grid, NT)]
    if S > 1:
        out[0]["cost"] = True  # the profiler's bytes and FLOPs: the product, not the sum
        out.append(build_split_sum(ctx, node, S, nb * M * N))
    return out
