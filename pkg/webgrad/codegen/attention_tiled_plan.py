"""The plan of a tiled attention kernel (codegen/attention_tiled.py), before any WGSL: which
kernel runs (use_tiled), its blocks and thread grid (choose_blocks: the largest that fit the
adapter's workgroup memory), the code options in force, and the node's operands.

A TilePlan is plain data with the index expressions of a thread's rows and columns and the
list of workgroup arrays as methods, so tests/test_attention_tiled.py checks the indices and
array sizes by emulation without a GPU; attention_tiled_kernel.py emits the WGSL from it.
attention.py and attention_match.py ask use_tiled which kernels an adapter gets.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from .options import DEFAULT, KernelOptions
from .wgsl import pow2ceil, u32_lit

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


def shared_bytes(op, BR, BC, DK, XK, EP, WX=16, opts: KernelOptions = DEFAULT) -> int:
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
# creating them in headless Chromium (tests/browser/test_gpu_host.py, test_webgpu_limits.py's
# Tint check); other GPUs' compilers are unmeasured. Those adapters are
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
    EP = padded(E, WX)
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
                if shared_bytes(op, BR, BC, DK, XK, EP, WX, opts) <= limit:
                    return BR, BC, DK, XK
    raise AssertionError(f"{op}: no tile fits {limit} bytes of workgroup memory")


def padded(E: int, WX: int = 16) -> int:
    """Output columns with padding: E itself when it is whole groups of 4 WX (4 adjacent
    columns per thread, vec4 reads), else whole groups of WX (one column per thread)."""
    return E if E % (4 * WX) == 0 else WX * -(-E // WX)


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
    EP = property(lambda p: padded(p.E, p.WX))
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
        n = padded(width, self.WX) // self.WX
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
            return u32_lit(0), u32_lit(NC)
        if not self.per_key:  # the block's last query r0 + BR - 1 keeps keys < r0 + BR + off
            return u32_lit(0), f"u32(clamp(i32(r0) + {self.BR + off}i{dyn}, 0i, {NC}i))"
        # the block's first key r0 is kept by queries >= r0 - off
        return f"u32(clamp(i32(r0) - {off}i{' - dyn' if dyn else ''}, 0i, {NC}i))", u32_lit(NC)

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
    EP = padded(E, WX)
    XV = 4 if all(padded(w, WX) % (4 * WX) == 0 for w, _, _ in prods) else 1
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
