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

from dataclasses import dataclass
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


# ---------------------------------------------------------------- the plan (no WGSL yet)
#
# build_tiled is a driver over the pieces below, in the order they emit: plan_tiled picks the
# blocks and code options of one op (pure: tests/test_attention_tiled.py checks its indices
# and workgroup arrays by emulation); _TiledKernel emits the kernel's stages, one method each:
# the workgroup's rows and causal range (open), the tile loads (fetch, put) and D-chunk
# products (dot_tiles), the scores and softmax statistics of a streamed block (scores,
# weights), the output products (accumulate), and the per-op epilogues (epilogue_lse for
# attn_lse, epilogue_rows for the others: attn_fwd's O and lse columns, attn_dq's scaled
# rows, attn_dkv's dK and dV pieces).

PER_KEY = ("attn_dk", "attn_dv", "attn_dkv")      # own rows are keys, queries stream
TWO_DOTS = ("attn_dq", "attn_dk", "attn_dkv")     # s = q.k and dp = g.v


def _products(op: str, D: int, Dv: int, scale: float) -> tuple:
    """The output products of an op: (width, output column offset, post-scale) of each."""
    return {"attn_lse": (), "attn_out": ((Dv, 0, None),), "attn_fwd": ((Dv, 0, None),),
            "attn_dq": ((D, 0, scale),),
            "attn_dv": ((Dv, 0, None),), "attn_dk": ((D, 0, scale),),
            "attn_dkv": ((Dv, D, None), (D, 0, scale))}[op]


@dataclass(frozen=True)
class Operands:
    """The graph inputs of one attention node: q, k^T, then V, G, lse, Drow and the runtime
    cache position (None where the op has none)."""
    q: int
    kt: int
    v: int | None
    g: int | None
    lse: int | None
    drow: int | None
    pos: int | None


def _online(op: str, attrs: dict) -> bool:
    """The softmax online: inference's attn_out, and attn_fwd (which also writes lse)."""
    return op == "attn_fwd" or (op == "attn_out" and bool(attrs.get("online")))


def operands(node) -> Operands:
    op, ins = node.op, node.inputs
    two_dots = op in TWO_DOTS
    lse = {"attn_out": None if _online(op, node.attrs) else 3, "attn_dv": 3, "attn_dq": 4,
           "attn_dk": 4, "attn_dkv": 4}.get(op)
    return Operands(q=ins[0], kt=ins[1],
                    v=ins[2] if op in ("attn_out", "attn_fwd") or two_dots else None,
                    g=ins[2] if op == "attn_dv" else ins[3] if two_dots else None,
                    lse=ins[lse] if lse is not None else None,
                    drow=ins[5] if two_dots else None,
                    pos=ins[-1] if node.attrs.get("dyn") else None)


@dataclass(frozen=True)
class TilePlan:
    """Everything build_tiled decides before it writes a line: the op and its extents, the
    blocks (BR own rows x BC streamed, D chunks of DK, X rows XK at a time), the WY x WX
    thread grid and the code options in force. The WGSL index expressions of a thread's
    rows and columns (row, col, out_cols) and the workgroup arrays are its methods."""
    op: str
    T: int
    S: int
    D: int
    Dv: int
    batch: tuple
    scale: float
    off: int | None         # causal offset (None: no mask)
    dyn: bool               # a runtime cache position adds to off
    online: bool
    prods: tuple
    BR: int
    BC: int
    DK: int
    XK: int
    WY: int
    WX: int
    XV: int                 # output columns per vector read of X: 4, or 1
    xw: bool                # X staged whole in As's and Bs's words (the "x_whole" option)
    red_in_as: bool         # the online softmax's row reductions in As
    prefetch_d: bool
    prefetch_x: bool
    opts: KernelOptions

    per_key = property(lambda p: p.op in PER_KEY)
    two_dots = property(lambda p: p.op in TWO_DOTS)
    nb = property(lambda p: prod(p.batch))
    NR = property(lambda p: p.S if p.per_key else p.T)    # own rows
    NC = property(lambda p: p.T if p.per_key else p.S)    # streamed rows
    Eo = property(lambda p: sum(w for w, _, _ in p.prods) + (p.op == "attn_fwd"))  # row width
    E = property(lambda p: max((w for w, _, _ in p.prods), default=0))
    EP = property(lambda p: _padded(p.E, p.WX))
    NT = property(lambda p: p.WY * p.WX)
    TR = property(lambda p: p.BR // p.WY)   # a thread's rows and columns of the W tile ...
    TC = property(lambda p: p.BC // p.WX)
    WR = property(lambda p: min(p.TR, 4))   # ... in vectors of WR (WC) adjacent ones
    WC = property(lambda p: min(p.TC, 4))
    LDA = property(lambda p: p.BR + PAD)
    LDB = property(lambda p: p.BC + PAD)
    LDW = property(lambda p: p.BR + PAD)
    nblk = property(lambda p: -(-p.NR // p.BR))

    @property
    def name(self) -> str:
        return (f"{self.op} [{'x'.join(map(str, self.batch)) or '1'}] T{self.T} S{self.S} "
                f"D{self.D} tiled {self.BR}x{self.BC}")

    @property
    def alias(self) -> dict:
        """Arrays that live in another's words: {name: (array, first word)}."""
        return {"Bs": ("As", self.DK * self.LDA), "Xs": ("As", 0)} if self.xw else {}

    @property
    def causal_tail(self) -> bool:
        """A key block's first query r0 - off (- dyn) may not start a BC block: the last is
        short."""
        return (self.per_key and self.off is not None
                and bool(self.dyn or self.off % self.BC or self.BR % self.BC))

    def row(self, a: int) -> str:
        """The block-local index of a thread's row a (groups of WY WR rows apart)."""
        WR, WY = self.WR, self.WY
        return f"ty * {WR}u + {(a // WR) * WY * WR + a % WR}u"

    def col(self, b: int) -> str:
        """... and of its column b (groups of WX WC columns apart)."""
        WC, WX = self.WC, self.WX
        return f"tx * {WC}u + {(b // WC) * WX * WC + b % WC}u"

    def out_cols(self, width: int) -> list[str]:
        """A thread's output columns of a product `width` wide: 4 WX q + 4 tx + i (vec4
        reads of X), or tx + WX e."""
        n = _padded(width, self.WX) // self.WX
        if self.XV == 4:
            return [f"{4 * self.WX * (e // 4) + e % 4}u + tx * 4u" for e in range(n)]
        return [f"tx + {self.WX * e}u" for e in range(n)]

    def shared_arrays(self) -> list[tuple[str, int, int]]:
        """The workgroup arrays, in declaration order: (name, vector width, length)."""
        DK, LDA, LDB, LDW = self.DK, self.LDA, self.LDB, self.LDW
        out = [("As", self.WR, (DK * LDA + (DK * LDB if self.xw else 0)) // self.WR)]
        if not self.xw:
            out.append(("Bs", self.WC, DK * LDB // self.WC))
        if self.op != "attn_lse":  # W transposed: a thread's WR adjacent rows of one column
            out.append(("Ws", self.WR, self.BC * LDW // self.WR))
            if not self.xw:
                out.append(("Xs", self.XV, self.XK * self.EP // self.XV))
        if self.op == "attn_lse":
            out += [("red_m", 1, self.WX * self.BR), ("red_l", 1, self.WX * self.BR)]
        if self.online and not self.red_in_as:
            out.append(("red", 1, self.WX * self.BR))
        return out

    def streamed_range(self) -> tuple[str, str]:
        """[cbeg, cend) of the streamed rows a block visits (WGSL, over r0 and dyn): causal
        blocks beyond the diagonal are never visited."""
        NC, off, dyn = self.NC, self.off, " + dyn" if self.dyn else ""
        if off is None:
            return "0u", f"{NC}u"
        if not self.per_key:  # the block's last query r0 + BR - 1 keeps keys < r0 + BR + off
            return "0u", f"u32(clamp(i32(r0) + {self.BR + off}i{dyn}, 0i, {NC}i))"
        # the block's first key r0 is kept by queries >= r0 - off
        return f"u32(clamp(i32(r0) - {off}i{' - dyn' if dyn else ''}, 0i, {NC}i))", f"{NC}u"

    def kept(self, r: str, c: str) -> str:
        """Whether own row r and streamed row c meet (WGSL): c inside the streamed extent and,
        causal, key j <= query i + off (+ dyn)."""
        conds = [f"{c} < {self.NC}u"]
        if self.off is not None:
            i, j = (c, r) if self.per_key else (r, c)
            conds.append(f"i32({j}) <= i32({i}) + {self.off}i{' + dyn' if self.dyn else ''}")
        return " && ".join(conds)


def plan_tiled(op: str, *, T: int, S: int, D: int, Dv: int, batch: tuple = (),
               scale: float = 1.0, offset: int | None = None, online: bool = False,
               dyn: bool = False, limits) -> TilePlan:
    """The tiled kernel of `op` over these extents on an adapter of `limits`: its blocks
    (choose_blocks), thread grid and code options."""
    opts = limits.options
    limit = limits.max_compute_workgroup_storage_size
    prods = _products(op, D, Dv, scale)
    E = max((w for w, _, _ in prods), default=0)
    NR, NC = (S, T) if op in PER_KEY else (T, S)
    BR, BC, DK, XK = choose_blocks(op, NR, NC, E, limit, opts)
    WY, WX = _threads(op, opts)
    WR, WC = min(BR // WY, 4), min(BC // WX, 4)
    EP = _padded(E, WX)
    XV = 4 if all(_padded(w, WX) % (4 * WX) == 0 for w, _, _ in prods) else 1
    LDA, LDB, LDW = BR + PAD, BC + PAD, BR + PAD
    prefetch_x = _prefetches(op, "prefetch_x", limits)
    # X staged whole in As's and Bs's words: one array of one vector type holds As, then
    # Bs; the online softmax's row reductions then go to `red`, since X is stored into As
    # right after them
    xw = (opts.attn_opt("x_whole") and op != "attn_lse" and prefetch_x
          and WR == WC == XV and BC * EP <= DK * (LDA + LDB)
          and 4 * (DK * (LDA + LDB) + BC * LDW + (WX * BR if online else 0)) <= limit)
    return TilePlan(op=op, T=T, S=S, D=D, Dv=Dv, batch=tuple(batch), scale=scale, off=offset,
                    dyn=dyn, online=online, prods=prods, BR=BR, BC=BC, DK=DK,
                    XK=BC if xw else XK, WY=WY, WX=WX, XV=XV, xw=bool(xw),
                    red_in_as=_red_in_as(op, BR, DK, WX, opts) and not xw,
                    prefetch_d=_prefetches(op, "prefetch_d", limits), prefetch_x=prefetch_x,
                    opts=opts)


def plan_of(node, g, limits) -> TilePlan:
    """plan_tiled for an attention node of graph g."""
    ops = operands(node)
    T, D = g[ops.q].shape[-2], g[ops.q].shape[-1]
    Dv = g[ops.v].shape[-1] if ops.v is not None else g[ops.g].shape[-1] if ops.g is not None else D
    batch = node.shape[:-1] if node.op == "attn_lse" else node.shape[:-2]
    return plan_tiled(node.op, T=T, S=g[ops.kt].shape[-1], D=D, Dv=Dv, batch=tuple(batch),
                      scale=node.attrs["scale"], offset=node.attrs["offset"],
                      online=_online(node.op, node.attrs), dyn=bool(node.attrs.get("dyn")),
                      limits=limits)


# ---------------------------------------------------------------- the kernel, stage by stage

class _TiledKernel:
    """The WGSL of one planned kernel, emitted stage by stage (build_tiled calls them in
    order; the emitter's names follow that order, so the stages must keep it)."""

    def __init__(self, ctx, plan: TilePlan, ops: Operands):
        self.ctx, self.p, self.ops, self.g = ctx, plan, ops, ctx.g
        p = plan
        self.kernel = kernel = ctx.kernel(p.name)
        for name, w, n in p.shared_arrays():
            kernel.decls.append(f"var<workgroup> {name}: array<{_vty(w)}, {n}>;")
        # the epilogue takes (batch element, row, column): a store through views (the QKV
        # gradient assembled in place, fusion._assemble) regroups them, not a flat index
        # (or one per product: epilogue_rows)
        self.epi = ctx.epilogue_fn(kernel, (p.nb, p.T) if p.op == "attn_lse" else (p.nb, p.NR, p.Eo)) \
            if len(p.prods) <= 1 or not ctx.writes_pieces else None
        self.em = ctx.emitter(kernel)
        self.L = self.em.emit
        self.grid = kernel.workgroup_index(self.em, p.nb * p.nblk, "w")  # uniform: barriers legal
        self.sc = f32_lit(p.scale)
        self.ninf = f32_lit(float("-inf"))
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
        nb, nblk = p.nb, p.nblk
        if p.off is not None and p.opts.attn_opt("heavy_first") and nblk > 1:
            # causal: block-major order, the blocks with the most streamed rows first (a query
            # kernel's last blocks, a key kernel's first) so that the short ones fill the tail
            L(f"let bo = w % {nb}u;")
            L(f"let blk = {'' if p.per_key else f'{nblk - 1}u - '}w / {nb}u;")
        else:
            L(f"let blk = w % {nblk}u;")
            L(f"let bo = w / {nblk}u;")
        for line in thread_xy(p.WX, p.WY, p.opts.attn_opt("warp_tiles")):
            L(line)
        L(f"let r0 = blk * {p.BR}u;")
        self.bdims = em.unravel("bo", p.batch) if p.batch else []
        # the causal limit: key j is kept for query i iff j <= i + off (+ dyn)
        if p.dyn:
            pn = self.ops.pos
            self.kernel.decls.append("var<workgroup> wdyn: i32;")
            with em.block("if (lid == 0u)"):
                L(f"wdyn = i32({em.value(pn, Idx(self.g[pn].shape, flat='0u'))});")
            L("let dyn = workgroupUniformLoad(&wdyn);")
        cbeg, cend = p.streamed_range()
        self.cbeg = em.let(cbeg) if "clamp" in cbeg else cbeg
        self.cend = em.let(cend) if "clamp" in cend else cend
        self.own_rows = [em.let(f"r0 + {p.row(a)}") for a in range(p.TR)]

    # -- operands at (their last two dims), batch element bo
    def at(self, n, last):
        shape = self.g[n].shape
        k0 = len(shape) - len(last)
        r = len(self.p.batch) - k0
        dims = ["0u" if shape[k] == 1 else self.bdims[r + k] for k in range(k0)] + last
        return self.em.value(n, Idx(shape, dims=dims))

    def Q(self, i, d): return self.at(self.ops.q, [i, d])
    def K(self, j, d): return self.at(self.ops.kt, [d, j])
    def V(self, j, e): return self.at(self.ops.v, [j, e])
    def G(self, i, e): return self.at(self.ops.g, [i, e])

    def stat(self, n, i):  # lse / Drow of query i ([batch.., T])
        return self.em.value(n, Idx(self.g[n].shape, flat=self.em.let(f"bo * {self.p.T}u + {i}")))

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
        self.accs = [[[em.var("f32", "0.0f", "o") for _ in range(_padded(w, p.WX) // p.WX)]
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
        return self.fetch(lambda rr, kk: f"{rr} * {p.EP}u + {kk}", p.XK, _padded(width, p.WX),
                          f"c0 + {x0}", p.NC, "0u", width, self.X_loads[k], x_exact,
                          _padded(width, p.WX) == width)

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

    def weights(self, s, dp):
        """The softmax statistics of the block and the W tiles of its output products:
        attn_lse's per-thread running (max, sum); the online softmax's rescaled p (its row
        maximum across threads); else p from the saved lse, ds = p (dp - Drow) where dp is
        there. Returns [W of each product] (attn_dkv: p for dV, ds for dK)."""
        p, em, L, ninf, sc = self.p, self.em, self.L, self.ninf, self.sc
        TR, TC = p.TR, p.TC
        xsc = [[em.let(f"select({ninf}, {s[a][b]} * {sc}, {self.kept(a, b)})") for b in range(TC)]
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
            TE = _padded(p.prods[0][0], p.WX) // p.WX
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
                    pr = em.let(f"select(0.0f, exp({s[a][b]} * {sc} - {lse}), {self.kept(a, b)})")
                    if dp is not None:
                        dr = self.str_dr[b] if p.per_key else self.own_dr[a]
                        ds = em.let(f"{pr} * ({dp[a][b]} - {dr})")
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
        TE = _padded(width, WX) // WX
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
                        if post is not None:
                            v = f"{v} * {self.sc}"
                        at_ = f"{col0}u + {col}" if col0 else col
                        call = f"{epi_k[k]}(bo, {self.own_rows[a]}, {at_}, {v});"
                        L(f"if ({col} < {width}u) {{ {call} }}" if _padded(width, p.WX) != width
                          else call)

    def dispatch(self) -> dict:
        return self.ctx.dispatch(self.kernel, self.em.lines, self.grid, self.p.NT)


def build_tiled(ctx) -> list[dict]:
    """The tiled kernel of ctx's attention node: plan, then the stages in order."""
    plan = plan_of(ctx.main_node, ctx.g, ctx.limits)
    k = _TiledKernel(ctx, plan, operands(ctx.main_node))
    k.open()
    k.accumulators()
    with k.em.block(f"for (var c0 = {k.cbeg}; c0 < {k.cend}; c0 += {plan.BC}u)"):
        x_pre = k.prefetch_x()
        s, dp = k.scores()
        for i, w in enumerate(k.weights(s, dp)):
            k.accumulate(i, w, x_pre)
    if plan.op == "attn_lse":
        k.epilogue_lse()
    else:
        k.epilogue_rows()
    return [k.dispatch()]


__all__ = ["build_tiled", "use_tiled", "choose_blocks", "plan_tiled", "plan_of", "TilePlan",
           "operands", "Operands"]
