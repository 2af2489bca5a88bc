"""The matmul kernels' tilings: which kernel takes a product and with what tile.

build_matmul (matmul.py) asks `group_config` for the kernel of an [nb x] [M, K] @ [K, N]
product on an adapter, and so do fusion.py and program.py (whether the kernel takes sums on
the way, how much split-K scratch it needs): the matrix-vector kernel (`use_gemv`,
matmul_gemv.py; on lavapipe matmul_gemv_cpu.py), the barrier-free one (None: `use_direct`,
matmul_direct.py) or a Config of the tiled one (matmul_tiled.py), chosen by `choose_config`
from ADAPTER_TILINGS.

Split-K: a long K over too few output tiles to fill the GPU's waves (a weight gradient,
K = B*T; the LM head's input gradient, K = vocabulary) keeps the large tile and gives each
workgroup one K chunk; the chunks' partial sums go to scratch and a second kernel adds them
in chunk order (deterministic) and runs the epilogue. How many workgroups run at once is a
property of the adapter: ADAPTER_TILINGS, a table keyed by words of the adapter's
description, not a start-up search; adapters without a row never split. The table also
names the tile of each shape class (wide products, batches of small ones such as
attention's, split-K) and the tile order (runs of tile rows, so that a vocabulary-wide
product's B panels stay in L2).

LoRA's rank-r products have rules of their own, ahead of the table's classes (both
KernelOptions switches; bench/thin_products.py times them): a product over K <= expand_k
writes far more than it reads, so `expand_config` gives it small blocks whose columns are
a warp wide apart (coalesced stores); a thin C (a side of at most thin_side) over a long K
reads one operand once, so `thin_config` gives it a grid of THIN_TILES workgroups through
narrow tiles and K chunks.

On CPU adapters K is split as well whenever one invocation's K loop would run past
wgsl.CPU_LOOP_ITERATIONS (lavapipe silently stops a shader's loops after 65535 iterations):
`cpu_splits`, the same partial sums and second kernel, for both kernels.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .options import DEFAULT, KernelOptions
from .wgsl import CPU_LOOP_ITERATIONS


TARGET_TILES = 256  # fewer workgroups than this: shrink the tile (an H200 has 132 SMs)
SPLIT_MIN_K = 2048  # split K (rather than shrink the tile) only for K at least this long
SPLIT_MIN_CHUNK = 512  # ... and never into K chunks shorter than this
# K chunks at least this long pay a tenth of the per-chunk penalty in choose_splits: their
# partial sums are little traffic beside them, and a grid of whole waves of them is worth
# the extra chunks (the LM head's input gradient, K = 50304 over 192 tiles: split 4, 2.9
# waves, 7.30 ms; split 11, 8 whole waves, 7.07; H200, 2026-12-01)
SPLIT_LONG_CHUNK = 4096
MAX_SPLITS = 16
# the longest K step of a thin product's unsplit tile (KernelOptions.split_thin): 32 x 16
# tiles at K step 64 stage 14 KiB and load 12 values a thread a step
THIN_MAX_BK = 64

# KernelOptions.force_config (bench/matmul.py) replaces choose_config to compare tilings.
# KernelOptions.operand_sums: bias gradients (the row sums of a weight gradient's operand)
# and layer norm's gradients (row sums of expressions of a product's output) are summed by
# the products' kernels (fusion.operand_sums, output_sums); False: by reductions of their own


@dataclass(frozen=True)
class Config:
    """tm x tn accumulators per thread (wy x wx threads: a wy tm x wx tn tile), bk: K step.
    vec: a thread's rows (columns) are 4-wide groups 4 wy (4 wx) apart, read from shared
    memory as vec4 (conflict-free); prefetch: the next K step's global loads are issued into
    registers before this step's multiply-adds, hiding their latency."""
    tm: int
    tn: int
    bk: int
    pad: int = 4
    vec: bool = True
    prefetch: bool = True
    splits: int = 1  # split-K: workgroups each sum one K chunk, a second kernel adds them
    double: bool = False  # two shared-memory buffers: one barrier per K step, not two
    wx: int = 16  # threads along N (a tile is wy tm x wx tn)
    wy: int = 16  # threads along M
    group: int = 0  # tile order: runs of `group` tile rows walked column by column (L2 reuse)
    vload: bool = False  # vec4 global loads where the operands' layouts allow (matmul_tiled.vec_axis)
    epi_rows: int = 0  # epilogue loads issued for this many of a thread's rows at once (0: per value)
    # threads as 4 x 8 patches of 32 consecutive ids (a warp on NVIDIA GPUs), not rows of wx:
    # a warp then reads 4 A vectors and 8 B vectors of a k (one 128-byte wavefront each)
    # where a 16-wide row of threads reads 2 and 16 (two wavefronts for B)
    warp_tiles: bool = False
    # the matrix-vector kernel (matmul_gemv.py) instead of tiles: a product of a few rows of C
    # (decoding) whose other fields are then unused
    gemv: bool = False
    # a thread's TN columns are wx apart (column tx + j wx), not in 4-wide groups: a warp's
    # stores of one accumulator (and the epilogue's loads) are consecutive floats, whole
    # 32-byte sectors, where the grouped columns touch a quarter of each (a product of
    # K <= KernelOptions.expand_k writes far more than it reads: expand_config); B is read
    # from workgroup memory as scalars, consecutive threads consecutive words
    cols_apart: bool = False

    @property
    def bm(self): return self.wy * self.tm
    @property
    def bn(self): return self.wx * self.tn
    @property
    def threads(self): return self.wx * self.wy


@dataclass(frozen=True)
class Tile:
    """A Config's tile on a device: a workgroup's BM x BN block of C, K step BK, TM x TN
    accumulators per thread on WY x WX threads (NT in all); the staged A and B tiles are
    k-major with rows of LDA / LDB floats (padded), vec4 arrays where va / vb (a thread's
    rows / columns in 4-wide groups 4 WY / 4 WX apart: thread_offsets)."""
    BM: int
    BN: int
    BK: int
    TM: int
    TN: int
    WX: int
    WY: int
    NT: int
    LDA: int
    LDB: int
    va: bool
    vb: bool
    apart: bool = False  # Config.cols_apart


def tile_of(cfg: Config, shared_limit: int) -> Tile:
    """cfg's Tile where the staged tiles get `shared_limit` bytes of workgroup memory: a
    K step of 8 where BK's would not fit."""
    BM, BN, BK, NT = cfg.bm, cfg.bn, cfg.bk, cfg.threads
    LDA, LDB = BM + cfg.pad, BN + cfg.pad
    if 4 * BK * (LDA + LDB) > shared_limit and BK > 8 and BM * 8 % NT == 0 and BN * 8 % NT == 0:
        BK = 8
    assert BM * BK % NT == 0 and BN * BK % NT == 0, cfg
    return Tile(BM, BN, BK, cfg.tm, cfg.tn, cfg.wx, cfg.wy, NT, LDA, LDB,
                cfg.vec and cfg.tm >= 4, cfg.vec and cfg.tn >= 4 and not cfg.cols_apart,
                cfg.cols_apart)


# Tilings per adapter class: the first row whose words occur in the adapter's description
# (Limits.adapter) applies; no start-up search. Keys of a row:
#   "slots": how many workgroups of a 128 x 128 tile run at once (SMs x workgroups per SM):
#       split-K sizes its grid in whole waves of these;
#   "double": double-buffered shared memory (Config.double);
#   "split": the tile of a split-K product; "wide": the tile of a product with at least 3/4
#       of a wave of 128 x 128 tiles, its K step "wide_bk" (if given) once there are 3
#       waves or more;
#   "batched": the tile of a batch of small products (M x N <= BATCHED_MN, K < SPLIT_MIN_K:
#       attention's [B*H] x [T, 64] @ [64, T] and the products of its backward pass; a long
#       K, such as the LM head's input gradient [B] x [T, vocab] @ [vocab, d], is work enough
#       per tile for the wide tile: 36 TFLOP/s on the 64 x 64 one at vocab 4096);
#   "group": tile order in runs of this many tile rows when one tile row has at least a
#       wave of tiles (a vocabulary-wide product), so that the B panels stay in L2;
#   "odd": the tile (of "wide" and "split" products) where N or K is not a multiple of 4:
#       an operand whose rows are that long starts them unaligned, so it is read one float
#       at a time (the vocabulary's products: 50257); also of a vocabulary-wide product
#       (a tile row of a wave or more) with K >= SPLIT_MIN_K: the head's weight gradient
#       on padded columns, [768 x 4096] @ [4096 x 50304], 7.05 ms on the wide tile, 6.70
#       on this one (H200, 2026-12-01; the logits, K = 768, stay wide: 7.37 against 7.50),
#       unless the row has
#   "vocab_wgrad": the tile of that vocabulary-wide product with K >= SPLIT_MIN_K where N
#       is a multiple of 4 (the padded head weight gradient: 6.44 ms on 256 x 128 tiles);
#   "mid": the tile of a product with less than 3/4 of a wave of 128 x 128 tiles but a
#       wave of 64 x 64 ones.
# Shapes no class takes keep the tile-shrinking rule. GPUs not listed get no split-K
# (their slot count is unknown) and that rule alone.
BATCHED_MN = 512 * 512
ADAPTER_TILINGS = (
    # 132 SMs. Measured 2026-11-30 (bench/matmul.py, bench/README.md), ratios to torch fp32:
    # the 128-thread 8 x 16-per-thread tile beat the 256-thread 8 x 8 one at 4096 (0.78 with
    # K step 16, 0.76 with 8, against 0.73), 0.86 with vec4 loads; the GPT step's forward
    # products went from 0.72-0.75 to 0.86-0.87, its weight gradients from 0.73-0.79 to
    # 0.83-0.91; a 64 x 64 tile of 64 threads does attention's products (scores 1.01
    # against 0.82); runs of 32 tile rows and the new tile took the [4096 x 768] @ [768 x
    # 50257] logits from 9.9 to 8.3 ms. Double buffering was slower (0.64-0.69).
    # 2026-11-30 (step_breakdown.py's session): the GPT-2 step's three vocabulary products
    # (N or K = 50257, scalar loads of the unaligned operand) ran faster on 256 threads of
    # 8 x 8 at K step 16 than on the wide tile: LM head input gradient (K = 50257, split 4)
    # 9.74 -> 8.47 ms, logits 8.45 -> 8.18, head weight gradient 8.46 -> 7.80; [4096 x 768]
    # @ [768 x 768] (192 tiles of 128 x 128) 0.192 ms on 64 x 128 tiles, 0.158 on the 64 x
    # 64 one, 0.167 split in 2.
    # 2026-11-30 (evening, bench/README.md "epilogues"): the wide tile issues its epilogue's
    # loads a row at a time (epi_rows 1): GELU's backward twin 0.579 -> 0.548 ms in the
    # step; two rows spilled the AdamW-fused head weight gradient (7.95 -> 10.1 ms; hence
    # KernelOptions.epi_max_loads). Tried and not kept: the output tile staged through workgroup memory so
    # that each warp stores whole 128-byte lines (every product slower: [4096 x 768] @ [768
    # x 3072] 0.473 -> 0.508 ms, with GELU 0.537 -> 0.554, the vocabulary's 8.1 -> 10.8),
    # and vec4 loads of the vocabulary's unaligned rows as two aligned vec4s shifted by
    # selects (logits 8.15 -> 8.20, head weight gradient 7.77 -> 7.95, input gradient 8.46
    # -> 8.95 ms).
    # 2026-12-01 (bench/README.md "tiles, the last round"), slower on every shape measured
    # (4096, [4096 x 768] @ [768 x 3072], the three vocabulary products): tiles whose k-rows
    # are XOR-swizzled instead of padded (conflict-free transposing stores; 6-15% slower:
    # the reads' addresses are no longer base + constant), double buffering on the current
    # tiles (20-40% slower), K step 32 (30-40%), no register prefetch (8-35%), 256 threads
    # of 8 x 16 (128 x 256 tiles), 64 x 256 tiles; A's tile m-major, each thread's loaded
    # vec4 of 4 k stored as it is and the k loop reading 4 k of a row at once (as cuBLAS's
    # "tn" kernels lay A out; no transposing stores): 10-25% slower; other split counts and
    # the 64 x 64 tile for the split products ([4096 x 3072] @ [3072 x 768], the weight
    # gradients at K = 4096): no better than the table's.
    # 2026-12-01 (later): the 64 x 64 "mid" tile at K step 16 instead of 8: [4096 x 768] @
    # [768 x 768] 0.151 -> 0.145 ms, [3072 x 768] @ [768 x 768] 0.147 -> 0.135, [2048 x
    # 1024] @ [1024 x 1024] 0.137 -> 0.125 (:tb, :ta within 0.002). Not taken: the [4096 x
    # 2304 / 3072] @ [.. x 768] input gradients on 64 x 64 tiles without split-K (0.406 /
    # 0.532-0.536 ms against 0.399 / 0.500-0.516 with the table's split 4 and its sum).
    # 2026-12-01 (next session): threads in warp tiles (Config.warp_tiles: each 32 ids a 4
    # x 8 patch of the 16 x 16 grid; with rows of 16 a warp's B reads took two wavefronts)
    # made the 256-thread 8 x 8 tile 8-9% faster (4096: 3.37 -> 3.10 ms; [16384 x 512] @
    # [512 x 2048] 0.896 -> 0.823) and faster than the 128-thread 8 x 16 one, which
    # "wide" and "split" were (3.26 / 0.867 ms at K step 16; at K step 16 the 8 x 8 one
    # is slower: 3.22 / 0.862). Per product, 8 x 16 -> 8 x 8 in warp tiles: the LM head's
    # input gradient 7.71 -> 7.31 ms, [4096 x 3072] @ [3072 x 768] (B^T) 0.537 -> 0.506,
    # small64's products 3-5% faster; [4096 x 768] @ [768 x 3072] 0.483 -> 0.490 and [768
    # x 4096] @ [4096 x 2304] (A^T, split 7) 0.370 -> 0.389 slower. Steps: small64 83.92 ->
    # 81.85 ms, GPT-2 8 x 512 93.74 -> 91.55 (bench/README.md).
    # 2026-12-01 (third session): the padded head weight gradient [768 x 4096] @ [4096 x
    # 50304] on 256 x 128 tiles (16 x 8 per thread, warp tiles, K step 8): 6.67 -> 6.44 ms
    # (torch 5.98); at K step 16 7.10. The logits and the input gradient on that tile were
    # slower (7.16 -> 7.38, 7.33 -> 7.83 ms), as 128 x 256 tiles (8 x 16 per thread or 512
    # threads of 8 x 8) were on every shape (6.7 -> 9.1 ms on this one). With the head's
    # AdamW update as its epilogue (the product on the weight's 50257 columns, reading the
    # padded gradient as vec4 past each row's end) it took 8.1-9.4 ms on these tiles and
    # the wide ones, against 6.44 + 0.32 apart: align_match keeps the update apart.
    # Double buffering with the K loop unrolled over the two buffers (every shared address
    # a constant offset; the buffer index in a variable was what made it 20-40% slower):
    # 4096 3.097 / 3.105 ms, [4096 x 768] @ [768 x 3072] 0.468 / 0.468, 0.500 / 0.495 on
    # [4096 x 3072] @ [3072 x 768] (B^T): as fast as one buffer, not faster; the 64 x 64
    # mid tile 0.149 -> 0.281.
    (("h200", "h100"), {
        "slots": 264, "double": False,
        "split": Config(8, 8, 8, vload=True, warp_tiles=True),
        "wide": Config(8, 8, 8, vload=True, epi_rows=1, warp_tiles=True),
        "odd": Config(8, 8, 16, vload=True, warp_tiles=True),
        "vocab_wgrad": Config(16, 8, 8, vload=True, warp_tiles=True),
        "batched": Config(8, 8, 8, wx=8, wy=8, vload=True),
        "mid": Config(8, 8, 16, wx=8, wy=8, vload=True),
        "group": 32,
        "align": (128, 8192, 2048),  # codegen/align_match.py: vocabulary-wide products padded
    }),
)


def adapter_tiling(adapter: str, options: KernelOptions = DEFAULT) -> dict:
    """The ADAPTER_TILINGS row of `adapter` ({}: none); KernelOptions.tiling_row replaces it."""
    if options.tiling_row is not None:
        return options.tiling_row
    text = adapter.lower()
    for words, row in ADAPTER_TILINGS:
        if any(w in text for w in words):
            return row
    return {}


def choose_splits(tiles: int, K: int, slots: int) -> int:
    """How many K chunks for a grid of `tiles` output tiles on `slots` concurrent
    workgroups: whole waves (tiles x S close to a multiple of slots), few chunks (each adds
    a partial result to write and read back), chunks of at least SPLIT_MIN_CHUNK."""
    best, score = 1, tiles / (-(-tiles // slots) * slots) if slots else 1.0
    for S in range(2, MAX_SPLITS + 1):
        chunk = -(-K // S)
        if chunk < SPLIT_MIN_CHUNK:
            break
        w = tiles * S
        sc = w / (-(-w // slots) * slots) - (0.001 if chunk >= SPLIT_LONG_CHUNK else 0.01) * S
        if sc > score + 0.02:
            best, score = S, sc
    return best


def choose_config(M: int, N: int, K: int, nb: int, shared_limit: int = 16384,
                  adapter: str = "", options: KernelOptions = DEFAULT) -> Config:
    """The tiling of an [nb x] [M, K] @ [K, N] product on `adapter` (Limits.adapter)."""
    if options.force_config is not None:
        return options.force_config
    cfg = _choose_config(M, N, K, nb, adapter, options)
    if adapter_tiling(adapter, options).get("double"):
        cfg = replace(cfg, double=True)
    return cfg


def _choose_config(M: int, N: int, K: int, nb: int, adapter: str,
                   options: KernelOptions = DEFAULT) -> Config:
    def t(d):
        return 8 if d >= 128 else 4 if d >= 64 else 2 if d >= 32 else 1
    tm, tn = t(M), t(N)
    odd = N % 4 != 0 or K % 4 != 0

    def tiles(tm, tn):
        return -(-M // (16 * tm)) * -(-N // (16 * tn)) * nb
    def shrunk(tm, tn):  # the tile-shrinking rule: (tm, tn) once the grid is large enough
        while tiles(tm, tn) < TARGET_TILES and (tm > 2 or tn > 2):
            if tm >= tn:
                tm //= 2
            else:
                tn //= 2
        return tm, tn
    row = adapter_tiling(adapter, options)
    slots = row.get("slots", 0)
    if nb == 1 and 0 < K <= options.expand_k and N >= options.expand_min_n:   # (batches: below)
        return expand_config(M, N, K, nb, options)
    thin = thin_config(M, N, K, nb, slots, options) if nb == 1 else None
    if thin is not None:
        return thin
    if K >= SPLIT_MIN_K and slots:
        # a long K over too few output tiles for whole waves (a weight gradient: K = B*T;
        # the LM head's input gradient: K = vocabulary): keep the large tile, which does
        # the most work per byte, and fill the GPU with K chunks instead
        S = choose_splits(tiles(tm, tn), K, slots)
        if S > 1 and min(M, N) <= options.split_thin:
            # a thin C (a LoRA factor's [T, r] product or its [r, in] gradient, r <= 16):
            # its tile is one thread column (row) wide already. Where the shrunk tiles give
            # as many workgroups as the chunks, each reading as much of A in as many K steps
            # (a K step S times as long: as many loads in flight), no chunks: no partial
            # sums' scratch and no second kernel adding them
            stm, stn = shrunk(tm, tn)
            bk = _k_step(tm, tn) * S
            if tiles(stm, stn) >= tiles(tm, tn) * S and bk <= THIN_MAX_BK:
                return Config(stm, stn, bk)
        if S > 1:
            if "split" in row and tm == tn == 8:
                return replace(row["odd" if odd and "odd" in row else "split"], splits=S)
            return Config(tm, tn, _k_step(tm, tn), splits=S)
    if "batched" in row and nb > 1 and M * N <= BATCHED_MN and K < SPLIT_MIN_K:
        return row["batched"]
    big = tiles(8, 8)  # 128 x 128 tiles
    if "wide" in row and slots and 4 * big >= 3 * slots:  # 3/4 of a wave: 2048 square
        vocab_long_k = K >= SPLIT_MIN_K and -(-N // row["wide"].bn) >= slots
        if (odd or vocab_long_k) and "odd" in row:
            cfg = row["vocab_wgrad" if vocab_long_k and not odd and "vocab_wgrad" in row
                      else "odd"]
            if row.get("group") and -(-N // cfg.bn) >= slots:
                cfg = replace(cfg, group=row["group"])
            return cfg
        cfg = row["wide"]
        if big >= 3 * slots:
            cfg = replace(cfg, bk=row.get("wide_bk", cfg.bk))
        if row.get("group") and -(-N // cfg.bn) >= slots:
            cfg = replace(cfg, group=row["group"])
        return cfg
    if "mid" in row and slots and tiles(4, 4) >= slots:  # a wave of 64 x 64 tiles
        return row["mid"]
    tm, tn = shrunk(tm, tn)
    return Config(tm, tn, _k_step(tm, tn))


# expand_config's tile (KernelOptions.expand_tile): (tm, tn, wx, wy, workgroups): 32 threads
# along N (a warp's stores of one accumulator: one 128-byte line), tm halved until the grid
# has that many workgroups
EXPAND_TILE = (4, 4, 32, 8, 1024)
# the longest K a thin product takes thin_config's tiles for (8192 ran slower than the table's
# 128 x 16 tile split 16 on the H200: 77 against 49 us)
THIN_MAX_K = 4096
# the workgroups a thin product's grid aims at (thin_config) where the adapter's row has slots
THIN_TILES = 1024
# ... and its thin side's least size: a C of fewer rows is a decoding step's (the matrix-vector
# kernel's, or on the tiles measured for GPT-2's decode where B's N axis is the fast one)
THIN_MIN_SIDE = 8


def _fit_bk(bk: int, bm: int, bn: int, threads: int) -> int:
    """bk, doubled until each of the threads stages whole elements of both tiles."""
    while bm * bk % threads or bn * bk % threads:
        bk *= 2
    return bk


def expand_config(M: int, N: int, K: int, nb: int, options: KernelOptions = DEFAULT) -> Config:
    """The tile of a product over K <= KernelOptions.expand_k (LoRA's (x A^T) B^T: [T, r] @
    [r, out], r = 16). Its cost is C's stores (and the epilogue's loads), r multiply-adds
    each: a thread's columns are wx apart (Config.cols_apart) so that a warp's accesses of
    one accumulator are 32 consecutive floats; its block is small (tm x tn, tm halved until
    the grid has EXPAND_TILE's workgroups: many loads in flight), the epilogue's loads of
    every row issued first (epi_rows), and K one step (bk >= K)."""
    tm, tn, wx, wy, target = options.expand_tile or EXPAND_TILE
    while tn > 1 and wx * tn // 2 >= N:
        tn //= 2

    def tiles(tm):
        return -(-M // (wy * tm)) * -(-N // (wx * tn)) * nb
    while tm > 1 and tiles(tm) < target:
        tm //= 2
    bk = _fit_bk(max(8, 1 << (K - 1).bit_length()), wy * tm, wx * tn, wx * wy)
    return Config(tm, tn, bk, wx=wx, wy=wy, vload=True, epi_rows=tm, cols_apart=True)


def thin_config(M: int, N: int, K: int, nb: int, slots: int,
                options: KernelOptions = DEFAULT) -> Config | None:
    """The tile and K chunks of a thin product (KernelOptions.thin_split: C with at most
    thin_side rows or columns, a long K: LoRA's x A^T [T, r], dY B, the factor gradients
    [r, in] and [out, r]), or None (the other rules). Its cost is reading the wide operand
    once; on the table's tiles it ran on a few dozen workgroups (a 32 x 16 tile of [T, 16],
    64 for T = 2048), each walking all of K. So: one tile across the thin side (16 or 32
    wide), the other side's tile halved down to 16 (re-reading nothing: the thin side is
    one tile), then K split into 2, 4, .. chunks of at least thin_chunk, until the grid has
    thin_split workgroups (None: 4 x slots, the adapter row's)."""
    target = options.thin_split if options.thin_split is not None else THIN_TILES * bool(slots)
    if not target or not THIN_MIN_SIDE <= min(M, N) <= options.thin_side \
            or K < 2 * options.thin_chunk or K > THIN_MAX_K:
        return None

    def t(d):
        return 8 if d >= 128 else 4 if d >= 64 else 2 if d >= 32 else 1
    tm, tn = t(M), t(N)

    def tiles(tm, tn):
        return -(-M // (16 * tm)) * -(-N // (16 * tn)) * nb

    def shrink(floor):  # the wide side's tile halved down to 16 floor rows (columns)
        nonlocal tm, tn
        while tiles(tm, tn) * S < target and (tm if M > N else tn) > floor:
            if M > N:
                tm //= 2
            else:
                tn //= 2
    S = 1
    shrink(2)
    while (tiles(tm, tn) * S < target and 2 * S <= MAX_SPLITS
           and -(-K // (2 * S)) >= options.thin_chunk):
        S *= 2
    shrink(1)   # (a 16-row tile re-reads the thin operand from L2 as often as A from memory)
    bk = options.thin_bk
    while bk > 16 and bk > -(-K // S):
        bk //= 2
    return Config(tm, tn, _fit_bk(bk, 16 * tm, 16 * tn, 256), vload=True, splits=S)


def _k_step(tm: int, tn: int) -> int:
    """The K step of the tile-shrinking rule's tiles: whole elements per thread."""
    return max(8 if max(tm, tn) >= 8 else 16, 16 // min(tm, tn))


def use_direct(cpu: bool, options: KernelOptions = DEFAULT) -> bool:
    """Whether the barrier-free kernel (matmul_direct.py) computes a matmul: on CPU adapters.

    There (SwiftShader, lavapipe: Limits.cpu) a workgroup's threads are emulated and every
    workgroupBarrier costs a switch per thread: the tiled kernel was 2-5x slower for square
    n = 64..512 and 6-15x for the MLP's shapes on lavapipe (bench/README.md). On an H200 the
    barrier-free kernel did not help even the MLP's tiny matmuls (its step took 0.41-0.60 ms
    against 0.41-0.44 ms tiled), so GPUs keep the tiled kernel at every size."""
    if options.force_config is not None:
        return False
    if options.force_direct is not None:
        return options.force_direct
    return cpu


def group_config(limits, M: int, K: int, N: int, nb: int,
                 shared_b: bool = False, k_fast: bool | None = None) -> Config | None:
    """The tiled kernel's configuration for these dims on this adapter (None: the
    barrier-free kernel). One function for the builder and the scratch planner.

    A batch of products against one B (a Linear applied to [B, T, C]) is one [nb M, K] @
    [K, N] product to the tiling table: its tile class is that of the whole, not of one
    batch element (which would take the "batched" class of attention's small products:
    small64's [64 x 256 x 1536] @ [1536 x 512] ran on 64 x 64 tiles)."""
    if use_gemv(limits, M, K, nb, shared_b, k_fast):
        return GEMV
    if use_direct(limits.cpu, limits.options):
        return None
    if shared_b and nb > 1:
        M, nb = M * nb, 1
    cfg = choose_config(M, N, K, nb, limits.max_compute_workgroup_storage_size,
                        limits.adapter, limits.options)
    if limits.cpu:  # a tiled kernel forced onto a CPU adapter: its K loop is bounded too
        S = cpu_splits(K)[0]
        if S > cfg.splits:
            cfg = replace(cfg, splits=S)
    return cfg


GEMV = Config(1, 1, 1, gemv=True)


def use_gemv(limits, M: int, K: int, nb: int, shared_b: bool,
             k_fast: bool | None = None) -> bool:
    """Whether an [nb x] [M, K] @ [K, N] product takes the matrix-vector kernel: at most
    KernelOptions.gemv_rows rows of C in all against one B (a decoding step's Linear layers
    and LM head, M = 1), on every adapter (KernelOptions.force_gemv: on any adapter / none;
    lavapipe takes its barrier-free form, gemv_cpu_form; SwiftShader the barrier-free
    kernel, matmul_direct.py).

    Through the tiled kernel such a product ran on 16 x 16-thread tiles of which one row of
    threads had a row of C, split over K with a second kernel adding the chunks: a step of
    the Llama-3.2-1B-shaped decode took 8.8 ms for 4.9 GB of weights that stream in ~1 ms
    on an H200 (bench/README.md, llama_decode.py).

    k_fast: B's K axis has stride 1 (x @ W^T of an [out, in] weight; None: not known, as
    for fusion's questions, which only ask whether the kernel takes sums). Products whose B
    is laid out otherwise (GPT-2's [in, out] Conv1D weights) take it only with
    KernelOptions.gemv_n_fast: there a workgroup's 32 columns are all the lanes of a warp
    can share, too few workgroups for the GPU (GPT-2 124M's decode ran 236 tokens/s
    through it against 410 on the tiled and split products, H200, 2026-12-02)."""
    opts = limits.options
    if k_fast is False and not opts.gemv_n_fast:
        return False
    if opts.force_config is not None or opts.force_gemv is False or not opts.gemv_rows:
        return False
    if opts.force_direct is not None and opts.force_gemv is None:
        return False  # a kernel asked for by name (tests)
    if nb > 1 and not shared_b:
        return False
    if opts.force_gemv is None and limits.cpu and not gemv_cpu_form(limits):
        return False   # SwiftShader: the barrier-free kernel (KernelOptions.gemv_cpu_adapters)
    if limits.cpu and K > CPU_LOOP_ITERATIONS:  # one lane's K loop must stay bounded there
        return False
    return M * nb <= opts.gemv_rows


def gemv_cpu_form(limits) -> bool:
    """Does a product the matrix-vector kernel takes run its CPU form (matmul_gemv_cpu.py)?
    On the CPU adapters of KernelOptions.gemv_cpu_adapters (lavapipe), unless force_gemv
    asks for the kernel by name (its workgroup form, as on GPUs) or gemv_cpu says otherwise.
    The CPU form took a SmolLM2-135M-shaped decode (30 layers) on lavapipe from 2.55 to 3.41
    tokens/s (F32) and 4.72 to 5.12 (Q8_0), where the barrier-free kernel (matmul_direct.py)
    took these products before (bench/README.md, decode_cpu.py)."""
    opts = limits.options
    if opts.gemv_cpu is not None:
        return opts.gemv_cpu
    adapter = str(getattr(limits, "adapter", "")).lower()
    return (bool(limits.cpu) and opts.force_gemv is None
            and any(a in adapter for a in opts.gemv_cpu_adapters))


def cpu_splits(K: int) -> tuple[int, int]:
    """(chunks, K per chunk) so that no invocation loops over more than
    CPU_LOOP_ITERATIONS values of K (a chunk of K runs at most that many iterations in
    either kernel: the tiled one K/BK steps of BK, the direct one K, or K/G groups of G/4
    for a quantized W^T); chunks are multiples of 32, so quantized groups (of 32 or 16)
    never straddle two. (1, K): no split."""
    if K <= CPU_LOOP_ITERATIONS:
        return 1, K
    S = -(-K // CPU_LOOP_ITERATIONS)
    KS = -(-(-(-K // S)) // 32) * 32
    return -(-K // KS), KS
