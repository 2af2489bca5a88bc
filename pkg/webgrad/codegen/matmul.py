"""Matmul: C[b, m, n] = sum_k A[b, m, k] B[b, k, n] with batch broadcasting; two kernels.

Barrier-free (`_build_direct`, on CPU adapters: `use_direct`): each thread owns an 8 x 8
block of C and loops over K reading A and B straight from global memory. CPU-emulated
WebGPU (SwiftShader, lavapipe) runs a workgroup's threads as fibers, so a barrier costs a
switch per thread: there this kernel is several times faster than the tiled one at any
size. Tiled (every GPU), below:

A workgroup of WY x WX threads (16 x 16 by default) computes a BM x BN tile of C (BM = WY
TM, BN = WX TN): each thread owns a TM x TN block of accumulators held in registers (the
code is unrolled here, in Python, so they stay registers). K advances BK at a time: the
workgroup stages an A tile (BM x BK) and a B tile (BK x BN) in shared memory, k-major so
that a thread's TM (TN) operands are adjacent, then every thread does TM*TN*BK fused
multiply-adds. Reading those operands from shared memory is what limits the kernel on an
H200 (without global loads it ran at 43 TFLOP/s, without shared reads too at 60, with
both at 37, 8 x 8 per thread): more outputs per thread (8 x 16) read fewer operands per
multiply-add. Where an operand's layout allows, threads read it from global memory as vec4
(`_vec_axis`), a quarter of the load instructions.

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
splits it (`_split_epilogue`) so that the loads of a row of the thread's block are issued
before any of its stores: the GPU's compiler must assume a storage load may alias an
earlier store, so one call after another waits out a memory latency per output.

Matrix-vector (`_build_gemv`, GPUs: `use_gemv`): a product of at most KernelOptions.gemv_rows
rows of C (decoding's Linear layers and LM head, M = 1) whose B has its K axis of stride 1
takes neither tiled form: a workgroup of 256 threads owns 8 columns, 32 lanes per column walk
its row of B (vec4 loads; a quantized row whole groups at a time) and add their partial sums
in workgroup memory. One kernel, no split over K, B read once at close to bandwidth
(bench/README.md, llama_decode.py: a Llama-3.2-1B-shaped decode step's products 8.8 -> 2.8
ms).

Split-K: a long K over too few output tiles to fill the GPU's waves (a weight gradient,
K = B*T; the LM head's input gradient, K = vocabulary) keeps the large tile and gives each
workgroup one K chunk; the chunks' partial sums go to scratch and a second kernel adds them
in chunk order (deterministic) and runs the epilogue. How many workgroups run at once is a
property of the adapter: ADAPTER_TILINGS, a table keyed by words of the adapter's
description, not a start-up search; adapters without a row never split. The table also
names the tile of each shape class (wide products, batches of small ones such as
attention's, split-K) and the tile order (runs of tile rows, so that a vocabulary-wide
product's B panels stay in L2).

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

On CPU adapters K is split as well whenever one invocation's K loop would run past
wgsl.CPU_LOOP_ITERATIONS (lavapipe silently stops a shader's loops after 65535 iterations):
`cpu_splits`, the same partial sums and second kernel, for both kernels.

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

import re
from dataclasses import dataclass, replace
from math import prod

from .emit import STORE_LINE
from .layout import digits_addr, strided_view
from .matmul_mma import mma_matmul_wgsl, tiling_for
from .quant import QuantOperand, group_helpers, operand_reader
from .options import DEFAULT, KernelOptions
from .wgsl import CPU_LOOP_ITERATIONS, BindingTypeClash, thread_xy


TARGET_TILES = 256  # fewer workgroups than this: shrink the tile (an H200 has 132 SMs)
SPLIT_MIN_K = 2048  # split K (rather than shrink the tile) only for K at least this long
SPLIT_MIN_CHUNK = 512  # ... and never into K chunks shorter than this
# K chunks at least this long pay a tenth of the per-chunk penalty in choose_splits: their
# partial sums are little traffic beside them, and a grid of whole waves of them is worth
# the extra chunks (the LM head's input gradient, K = 50304 over 192 tiles: split 4, 2.9
# waves, 7.30 ms; split 11, 8 whole waves, 7.07; H200, 2026-12-01)
SPLIT_LONG_CHUNK = 4096
MAX_SPLITS = 16

# KernelOptions.force_config (bench/matmul.py) replaces choose_config to compare tilings.
# KernelOptions.operand_sums: bias gradients (the row sums of a weight gradient's operand)
# and layer norm's gradients (row sums of expressions of a product's output) are summed by
# the products' kernels (fusion.operand_sums, output_sums); False: by reductions of their own
DIRECT_WG = 64             # threads per workgroup of the barrier-free kernel
# C block per thread of the barrier-free kernel: 8 x 8 (16 loads per 64 FMAs). In headless
# Chromium (SwiftShader) the addition transformer's step took ~15% less than with 8 x 4,
# the MLP's and the tiny transformer's the same (bench/README.md, transformer_browser.py).
# (Unrolling the K loop by 4 measured no better there.)
DIRECT_TM, DIRECT_TN = 8, 8
# ... except small products on SwiftShader (headless Chromium's WebGPU), whose pipeline
# creation (LLVM) grows with the unrolled block: there the MLP-sin step's pipelines took
# 6.0-7.7 s to create with 8 x 8 blocks and 1.2-2.7 s with 4 x 4, whose step ran as fast
# (13.5-14.2 against 16.4-18.9 ms/step; bench/README.md, cold_start.py). Products of at most
# DIRECT_SMALL elements (the MLP's 256 x 64; the addition transformer's are 1024 x 64 and up,
# where 8 x 8 ran 15% faster) get KernelOptions.small_block (4 x 4) on the adapters of
# KernelOptions.small_block_adapters (SwiftShader). KernelOptions.force_direct (tests):
# True / False forces the barrier-free / tiled kernel.
DIRECT_SMALL = 1 << 15
# On the adapters of KernelOptions.epi_loop_adapters (SwiftShader) the barrier-free kernel
# calls its epilogue once, in a loop over the block's values (kept in a local array), not
# once per value: SwiftShader inlines every call, so an 8 x 8 block repeated a fused AdamW
# update (with its cosine learning-rate schedule) 64 times. Only epilogues of more than
# KernelOptions.epi_loop_lines lines loop: a plain store or a bias add stays unrolled, since
# the loop reads the block from a local array. Headless Chromium, 2026-12-02:
# char_lm's 96 x 384 K=2048 weight gradient took 5.3 s to create its pipeline unrolled and
# 0.13 s looped (bench/README.md, "First Run of the transformer examples").
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
    vload: bool = False  # vec4 global loads where the operands' layouts allow (_vec_axis)
    epi_rows: int = 0  # epilogue loads issued for this many of a thread's rows at once (0: per value)
    # threads as 4 x 8 patches of 32 consecutive ids (a warp on NVIDIA GPUs), not rows of wx:
    # a warp then reads 4 A vectors and 8 B vectors of a k (one 128-byte wavefront each)
    # where a 16-wide row of threads reads 2 and 16 (two wavefronts for B)
    warp_tiles: bool = False
    # the matrix-vector kernel (_build_gemv) instead of tiles: a product of a few rows of C
    # (decoding) whose other fields are then unused
    gemv: bool = False

    @property
    def bm(self): return self.wy * self.tm
    @property
    def bn(self): return self.wx * self.tn
    @property
    def threads(self): return self.wx * self.wy


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
    row = adapter_tiling(adapter, options)
    slots = row.get("slots", 0)
    if K >= SPLIT_MIN_K and slots:
        # a long K over too few output tiles for whole waves (a weight gradient: K = B*T;
        # the LM head's input gradient: K = vocabulary): keep the large tile, which does
        # the most work per byte, and fill the GPU with K chunks instead
        S = choose_splits(tiles(tm, tn), K, slots)
        if S > 1:
            if "split" in row and tm == tn == 8:
                return replace(row["odd" if odd and "odd" in row else "split"], splits=S)
            return Config(tm, tn, max(8 if max(tm, tn) >= 8 else 16, 16 // min(tm, tn)),
                          splits=S)
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
    while tiles(tm, tn) < TARGET_TILES and (tm > 2 or tn > 2):
        if tm >= tn:
            tm //= 2
        else:
            tn //= 2
    bk = max(8 if max(tm, tn) >= 8 else 16, 16 // min(tm, tn))  # whole elements per thread
    return Config(tm, tn, bk)


def _offsets(T: int, vec: bool, w: int = 16) -> list[int]:
    """Offsets (within the tile, in units of the thread id) of a thread's T rows, `w`
    threads along the axis: with vec, groups of 4 adjacent rows, 4w apart (thread t owns
    4t..4t+3, 4w+4t.., ...)."""
    if vec and T >= 4:
        return [(i // 4) * 4 * w + i % 4 for i in range(T)]
    return list(range(T))


def _vec_axis(dims, off: int, X: int, K: int, rows: int, BK: int, NT: int) -> str | None:
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


def use_direct(cpu: bool, options: KernelOptions = DEFAULT) -> bool:
    """Whether the barrier-free kernel (_build_direct) computes a matmul: on CPU adapters.

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


def _batch_base(em, batch, bdims, off, dims, shape) -> str:
    """WGSL address of an operand's (broadcast) batch element `bdims` of C's batch."""
    terms = [f"{off}u"] if off else []
    r = len(batch) - (len(shape) - 2)
    for k, d in enumerate(shape[:-2]):
        if d != 1:
            terms += digits_addr(dims[k], bdims[k + r], d)
    return em.let(" + ".join(terms)) if terms else "0u"


def matmul_dims(g, fu, main: int) -> tuple[int, int, int, int, bool]:
    """(M, K, N, batch count, B shared) of the matmul group whose main node is `main` (a
    matmul, or a sum folded over a batched matmul, whose batch joins K:
    fusion.matmul_fold). B shared: one B matrix for the whole batch (a Linear's weight)."""
    x = fu.matmul_fold.get(main)
    if x is not None:
        a, b = (g[i].shape for i in g[x].inputs)
        return a[-2], prod(a[:-2]) * a[-1], b[-1], 1, True
    a, b = (g[i].shape for i in g[main].inputs)
    return a[-2], a[-1], b[-1], prod(g[main].shape[:-2]), prod(b[:-2]) == 1


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
GEMV_WG = 256  # threads per workgroup of the matrix-vector kernel


def use_gemv(limits, M: int, K: int, nb: int, shared_b: bool,
             k_fast: bool | None = None) -> bool:
    """Whether an [nb x] [M, K] @ [K, N] product takes the matrix-vector kernel: at most
    KernelOptions.gemv_rows rows of C in all against one B (a decoding step's Linear layers
    and LM head, M = 1), on GPUs (KernelOptions.force_gemv: on any adapter / none).

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
    if opts.force_gemv is None and limits.cpu:
        return False
    if nb > 1 and not shared_b:
        return False
    if limits.cpu and K > CPU_LOOP_ITERATIONS:  # one lane's K loop must stay bounded there
        return False
    return M * nb <= opts.gemv_rows


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


def b_k_fast(g, fu, main: int) -> bool:
    """Does the matmul group's B have its K axis of stride 1 (group_config's k_fast)?"""
    if main in fu.matmul_fold:
        return False
    i = g[main].inputs[1]
    view = strided_view(g, i, fu.operand_base)
    return view is not None and _canon_digits(view[2][-2]) == [(g[i].shape[-2], 1)]


def matmul_scratch_bytes(g, fu, main: int, limits) -> int:
    """Partial sums of a split-K matmul: splits x batch x M x N floats (0: no split)."""
    M, K, N, nb, shared_b = matmul_dims(g, fu, main)
    cfg = group_config(limits, M, K, N, nb, shared_b, b_k_fast(g, fu, main))
    S = cfg.splits if cfg is not None else cpu_splits(K)[0]
    return 4 * S * nb * M * N if S > 1 else 0


def build_matmul(ctx, config: Config | None = None) -> list:
    node = ctx.main_node
    (sa, offa, dima, ash), (sb, offb, dimb, bsh) = ctx.matmul_operands()
    M, K, N = ash[-2], ash[-1], bsh[-1]
    batch = tuple(node.shape[:-2])
    nb = prod(batch)
    if config is None:
        mma = _build_mma(ctx, node, (sa, offa, dima, ash), (sb, offb, dimb, bsh))
        if mma is not None:
            return mma
    cfg = config or group_config(ctx.limits, M, K, N, nb, prod(bsh[:-2]) == 1,
                                 _canon_digits(dimb[-2]) == [(K, 1)])
    if cfg is not None and cfg.splits > 1 and not ctx.scratch:
        cfg = replace(cfg, splits=1)   # planned for the mma kernel (mma_takes), which declined
    if cfg is None:
        return _build_direct(ctx, node, sa, offa, dima, ash, sb, offb, dimb, bsh)
    ops = (sa, offa, dima, ash), (sb, offb, dimb, bsh)
    if cfg.gemv:  # (fusion gives this kernel no sums to take on the way)
        try:
            return _build_gemv(ctx, node, *ops, vec=True)
        except BindingTypeClash:  # B's buffer is also read or written as f32
            return _build_gemv(ctx, node, *ops, vec=False)
    try:
        return _build_tiled(ctx, node, cfg, *ops)
    except BindingTypeClash:
        # the epilogue reads or writes an operand's buffer, which a vec4 view of it cannot
        # share (one binding per buffer): scalar loads
        if not cfg.vload:
            raise
        return _build_tiled(ctx, node, replace(cfg, vload=False), *ops)


def mma_takes(g, fu, main: int, limits, half) -> bool:
    """Whether the subgroup-matrix kernel (_build_mma) will take the product of the group
    whose main node is `main`, as far as the plan can tell before buffers exist (operands
    f16 in storage: `half`, program.half_storage; row-major; a tiling that divides it; no
    sums on the way): such a product needs no split-K scratch. Where the builder still
    declines it (an operand's offset, an epilogue reading an operand's buffer), the tiled
    kernel runs it unsplit."""
    node = g[main]
    if not limits.subgroup_matrix or node.op != "matmul" or main in fu.matmul_fold:
        return False
    gid = fu.group_of[main]
    if any(mg == gid for mg, _ in fu.operand_sums.values()) or gid in fu.output_sums.values() \
            or any(n in fu.assembled for n in fu.groups[gid].outputs):
        return False
    ops = []
    for i in node.inputs:
        base, off, dims = strided_view(g, i, fu.operand_base)
        if base not in half:
            return False
        ops.append((off, dims, tuple(g[i].shape)))
    shape = _mma_shape(tuple(node.shape), *ops, limits)
    return shape is not None and tiling_for(limits, shape[0], shape[1], shape[2], "f32", epilogue=True) is not None


def _mma_shape(shape, opa, opb, limits):
    """(M, N, K, batch count, A's and B's offset expressions in wg.z) of a product the
    subgroup-matrix kernel can read (row-major matrices at 16-byte offsets), else None.
    opa, opb: (element offset, dims, shape) of the operands (layout.strided_view)."""
    (offa, dima, ash), (offb, dimb, bsh) = opa, opb
    if len(ash) < 2 or len(bsh) < 2:
        return None
    M, K, N = ash[-2], ash[-1], bsh[-1]
    canon = _canon_digits
    if canon(dima[-2]) != canon([(M, K)]) or canon(dima[-1]) != canon([(K, 1)]) or \
            canon(dimb[-2]) != canon([(K, N)]) or canon(dimb[-1]) != canon([(N, 1)]):
        return None
    batch = tuple(shape[:-2])
    nb = prod(batch)

    def batch_digits(dims, sh):  # (axis of C's batch, digits) of an operand's batch axes
        r = len(batch) - (len(sh) - 2)
        return [(k + r, dims[k]) for k, d in enumerate(sh[:-2]) if d != 1]
    bda, bdb = batch_digits(dima, ash), batch_digits(dimb, bsh)
    if offa % 8 or offb % 8 or any(st % 8 for _, d in bda + bdb for _, st in d):
        return None   # the kernel reads its operands 16 bytes (eight halves) at a time

    def base(off, bd):  # WGSL offset (halves) of batch element wg.z in an operand
        terms = [f"{off}u"] if off else []
        for k, d in bd:
            inner = prod(batch[k + 1:])
            idx = "wg.z" if inner == 1 else f"(wg.z / {inner}u)"
            terms += digits_addr(d, idx if k == 0 else f"({idx} % {batch[k]}u)", batch[k])
        return " + ".join(terms)
    shared_b = all(not canon([(c, st) for c, st in d if st]) for _, d in bdb)
    if nb > 1 and shared_b and canon([dg for _, d in bda for dg in d]) == canon([(nb, M * K)]):
        M, nb, bda, bdb = nb * M, 1, [], []   # one product of nb * M rows
    elif nb > limits.max_compute_workgroups_per_dimension:
        return None
    return M, N, K, nb, base(offa, bda), base(offb, bdb)


def _build_mma(ctx, node, opa, opb) -> list | None:
    """The subgroup-matrix kernel (matmul_mma.py: tensor cores, f16 operands, f32
    accumulation) for a product it can take, else None (the tiled or direct kernel then):
    the device offers f16 x f16 -> f32 subgroup matrices at a tiling that divides the shape
    (matmul_mma.tiling_for), both operands are f16 in storage with row-major matrices, at
    offsets of whole 16-byte units. A batch whose B is shared and whose A is contiguous over
    it (a Linear of [B, T, d]) is one product of B*T rows; another batch (attention's, a
    per-batch weight gradient) puts the batch element on workgroup_id.z. The group's
    outputs: the product itself (C in f32), only its f16 rounding (C in f16, as
    precision="mixed" stores every product), or anything else elementwise (bias, GELU, a
    residual add) through the group's epilogue, called on each result from workgroup
    memory. Split-K, sums taken on the way and assembled pieces keep the tiled kernel."""
    (sa, offa, dima, ash), (sb, offb, dimb, bsh) = opa, opb
    if not ctx.limits.subgroup_matrix:
        return None
    if isinstance(sa, QuantOperand) or isinstance(sb, QuantOperand) or "f16" != sa.dtype or \
            sb.dtype != "f16":
        return None
    if ctx.scratch or ctx.operand_sum or ctx.output_sums or ctx.writes_pieces:
        return None
    shape = _mma_shape(tuple(node.shape), (offa, dima, ash), (offb, dimb, bsh), ctx.limits)
    if shape is None:
        return None
    M, N, K, nb, a_base, b_base = shape
    g = ctx.g
    if ctx.outs == [node.id] and ctx.storage(node.id).dtype == "f32":
        out = "f32"
    elif (len(ctx.outs) == 1 and g[ctx.outs[0]].op == "cast" and list(g[ctx.outs[0]].inputs) == [node.id]
          and g[ctx.outs[0]].attrs.get("dtype") == "f16" and ctx.storage(ctx.outs[0]).dtype == "f16"):
        out = "f16"
    else:
        out = None   # the epilogue
    t = tiling_for(ctx.limits, M, N, K, out or "f32", epilogue=out is None)
    if t is None:
        return None
    what = f"matmul {'x'.join(map(str, node.shape))} K={K} mma {t.bm}x{t.bn}x{t.bk} -> {out or 'epilogue'}"
    kernel = ctx.kernel(what)
    an = kernel.binding(sa.buffer, "vec4_u32", what=sa.what, nbytes=sa.nbytes)
    bn = kernel.binding(sb.buffer, "vec4_u32", what=sb.what, nbytes=sb.nbytes)
    epi, cn = None, ""
    try:
        if out is None:
            epi = ctx.epilogue_fn(kernel)
        else:
            c = ctx.storage(ctx.outs[0])
            cn = kernel.binding(c.buffer, out, write=True, what=c.what, nbytes=c.nbytes)
    except BindingTypeClash:   # the epilogue reads an operand's buffer as f16 values
        return None
    wgsl, groups = mma_matmul_wgsl(M, N, K, t, ctx.limits.max_compute_workgroup_storage_size,
                                   batch=nb, a_base=a_base, b_base=b_base,
                                   header=kernel.module_scope(), names=(an, bn, cn), epi=epi)
    return [{"wgsl": wgsl, "bindings": [b.buffer for b in kernel.bindings],
             "workgroups": list(groups), "name": what}]


def _build_tiled(ctx, node, cfg: Config, opa, opb) -> list:
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
    mode_a = _vec_axis(dima, offa, M, K, BM, BK, NT) if cfg.vload and not qa else None
    mode_b = _vec_axis(dimb[:-2] + [dimb[-1], dimb[-2]], offb, N, K, BN, BK, NT) \
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
        epi = ctx.epilogue_fn(kernel)
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

    base_a = _batch_base(em, batch, bdims, offa, dima, ash)
    base_b = _batch_base(em, batch, bdims, offb, dimb, bsh)
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
        # of 4 (_vec_axis), and so are its first index and the tile origins
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
            if not re.fullmatch(r"\w+", v):
                v = em.let(v)
            # only where they are written (a branch whole workgroups take): summed by every
            # thread, the products ran 3-4% slower on an H200, this way 0.7-1.7%
            L(f"if ({other} == 0u) {{ s{r} += {v}; }}")
        shared_store(rd[8], rd[9], rd[10], rd[2], v, base)

    if cfg.prefetch:
        regs = [f"p{r}" for r in range(len(reads))]
        for reg, v, rd in zip(regs, fetch(kbeg), reads):
            L(f"var {reg}: {'vec4<f32>' if rd[2][2] else 'f32'} = {v};")

    rows_a, cols_b = _offsets(TM, va, WY), _offsets(TN, vb, WX)

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
    pre = S == 1 and cfg.epi_rows > 0 and _split_epilogue(kernel, epi)
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
        out.append(_build_split_sum(ctx, node, S, nb * M * N))
    return out


# KernelOptions.epi_max_loads (2): epilogues loading more values per output keep their loads
# in place
_LET = re.compile(r"^\s*let (\w+) = (.*);$")
_LOAD = re.compile(r"^(b\d+)\[.*\]$")
_STREAMED = re.compile(r"^\s*let \w+ = b\d+\[(\d+u \+ )?f\];$")  # a load at the output's index


def _epilogue_lines(kernel, epi: str) -> int:
    """How many lines the epilogue function `epi` has (program.epilogue_fn)."""
    fn = next(fn for fn in kernel.functions if fn.startswith(f"fn {epi}(f: u32, v: "))
    return fn.count("\n")


def _split_epilogue(kernel, epi: str) -> bool:
    """Split the epilogue `fn epi(f, v)` (program.epilogue_fn) in two where it loads
    anything (a bias, a pre-activation): `epi_ld(f)` makes those loads, which depend on f
    alone, and returns them in a struct; `epi(f, v, p)` is the rest, taking the loaded
    values from p. The tile's writer then issues the loads of several outputs before
    their stores (Config.epi_rows): the GPU's compiler keeps a load after any earlier
    store to a storage buffer (they may alias), so one call after another waits out a
    memory latency per value. Only where a load streams a tensor of the output's size
    (read at f): a broadcast bias alone is a cache hit, and prefetching it measured slower
    (the GPT-2 MLP's GELU forward, 0.546 -> 0.554 ms). False (nothing changed): no such
    load, or more than KernelOptions.epi_max_loads loads."""
    at = next(k for k, fn in enumerate(kernel.functions) if fn.startswith(f"fn {epi}(f: u32, v: "))
    head, *body = kernel.functions[at].rstrip().rstrip("}").rstrip().split("\n")
    dep, loads, pure = {"v"}, [], []
    if not all(_LET.match(ln) or STORE_LINE.match(ln) for ln in body):
        return False  # anything but straight-line lets and stores: left as it is
    for ln in body:
        m = _LET.match(ln)
        if not m:
            continue
        name, expr = m.groups()
        if set(re.findall(r"\w+", expr)) & dep:
            dep.add(name)
            continue
        pure.append(ln)
        lm = _LOAD.match(expr)
        if lm:
            elem = kernel.bindings[int(lm.group(1)[1:])].elem
            loads.append((name, elem))
    if len(loads) > kernel.limits.options.epi_max_loads or not any(_STREAMED.match(ln) for ln in pure):
        return False  # nothing streamed from memory at f: a broadcast bias stays in cache
    need = {n for n, _ in loads}  # epi_ld keeps the lines the loads' indices come from
    keep = []
    for ln in reversed(pure):
        name, expr = _LET.match(ln).groups()
        if name in need:
            keep.append(ln)
            need |= set(re.findall(r"\w+", expr))
    pure = keep[::-1]
    fields = ", ".join(f"{n}: {t}" for n, t in loads)
    kernel.functions[at:at + 1] = [
        f"struct EpiLoads {{ {fields} }}\n",
        f"fn {epi}_ld(f: u32) -> EpiLoads {{\n" + "\n".join(pure)
        + f"\n  return EpiLoads({', '.join(n for n, _ in loads)});\n}}\n",
        head.replace(") {", ", p: EpiLoads) {") + "\n" + "\n".join(
            f"  let {m.group(1)} = p.{m.group(1)};" if (m := _LET.match(ln)) and
            m.group(1) in dict(loads) else ln for ln in body) + "\n}\n"]
    return True


# a chunk sum that takes output sums: each thread walks SPLIT_SUM_ROWS rows of one column,
# a workgroup SPLIT_SUM_GROUPS such row runs of 256 / SPLIT_SUM_GROUPS columns
SPLIT_SUM_ROWS, SPLIT_SUM_GROUPS = 16, 4


def split_sum_parts(total: int, N: int) -> int:
    """Partials per output sum (fusion.output_sums) of a split product's chunk sum: one
    per workgroup's block of rows of the [total / N, N] output."""
    return -(-(total // N) // (SPLIT_SUM_ROWS * SPLIT_SUM_GROUPS))


def _build_gemv(ctx, node, opa, opb, vec: bool) -> list:
    """C[r, n] = sum_k A[r, k] B[k, n] for the R <= gemv_rows rows r of C (all batch
    elements: B is shared), one kernel, no split: a workgroup of GEMV_WG threads owns CW
    columns of C, and the KL = GEMV_WG / CW threads of a column each sum every KL-th part of
    K for all R rows; the workgroup then adds the KL partial sums in a tree in workgroup
    memory (fixed order: deterministic) and one thread per column runs the epilogue.

    The lanes of a column walk B's fast axis: where B's K axis has stride 1 (x @ W^T of a
    Linear's [out, in] weight, the tied LM head, a quantized W^T) 32 lanes read 32
    consecutive vec4s of a row (CW = 8), a quantized row whole groups of G values that share
    a scale (32 lanes, one group each); otherwise (B's N axis of stride 1, or any other
    view) the 32 columns of a workgroup are adjacent and 8 lanes split K (CW = 32). Either
    way a warp's loads are whole 128-byte lines, and B, the only large operand, is read once.
    A's rows (R x K floats) are re-read by every workgroup from the cache."""
    (sa, offa, dima, ash), (sb, offb, dimb, bsh) = opa, opb
    M, K, N = ash[-2], ash[-1], bsh[-1]
    batch = tuple(node.shape[:-2])
    R = M * prod(batch)
    k_fast = _canon_digits(dimb[-2]) == [(K, 1)]
    grouped = _grouped_quant(sb, offb, dimb, bsh, K)
    qb = isinstance(sb, QuantOperand)
    CW = 8 if (k_fast or grouped) else 32
    KL = GEMV_WG // CW
    # vec4 loads of B's rows: plain f32, K in whole vec4s, every row start a multiple of 4
    v4 = (vec and k_fast and not qb and K % 4 == 0 and offb % 4 == 0
          and all(st % 4 == 0 for c, st in dimb[-1] if c > 1))
    kernel = ctx.kernel(f"matmul {'x'.join(map(str, node.shape))} K={K} gemv {CW}x{KL}"
                        + (" vec4" if v4 else ""))
    A = operand_reader(kernel, sa)
    if v4:
        bname = kernel.binding(sb.buffer, "vec4_f32", what=sb.what, nbytes=sb.nbytes)
        B4 = lambda at: f"{bname}[({at}) >> 2u]"   # noqa: E731
    elif not grouped:
        B = operand_reader(kernel, sb)
    epi = ctx.epilogue_fn(kernel)
    kernel.decls.append(f"var<workgroup> gv: array<f32, {R * GEMV_WG}>;")
    em = ctx.emitter(kernel)
    L = em.emit
    tiles = -(-N // CW)
    grid = kernel.workgroup_index(em, tiles, "w")
    if CW == 8:
        L(f"let kl = lid % {KL}u;")
        L(f"let c = lid / {KL}u;")
    else:
        L(f"let c = lid % {CW}u;")
        L(f"let kl = lid / {CW}u;")
    L(f"let n = w * {CW}u + c;")
    col = "n" if N % CW == 0 else em.let(f"min(n, {N - 1}u)")  # past N: a valid address
    base_b = _batch_base(em, batch, ["0u"] * len(batch), offb, dimb, bsh)
    cb = em.let(_sum([base_b] + digits_addr(dimb[-1], f"({col})", N)))
    ra = []
    for r in range(R):
        b, m = divmod(r, M)
        bd = em.unravel(f"{b}u", batch) if batch else []
        base_a = _batch_base(em, batch, bd, offa, dima, ash)
        ra.append(em.let(_sum([base_a] + digits_addr(dima[-2], f"{m}u", M))))
    acc = [f"c{r}" for r in range(R)]
    for a in acc:
        L(f"var {a}: f32 = 0.0f;")

    def k_term(k, y):
        L(f"let ka = {_sum(digits_addr(dima[-1], k, K))};")
        for r in range(R):
            L(f"{acc[r]} = fma({A(f'{ra[r]} + ka')}, {y}, {acc[r]});")

    if grouped:
        sfn, qfn, has_min, G = group_helpers(kernel, sb)
        sh = G.bit_length() - 1
        with em.block(f"for (var kq = kl; kq < {K // G}u; kq += {KL}u)"):
            L(f"let s = {sfn}(({cb} >> {sh}u) + kq);")
            with em.block(f"for (var kk = 0u; kk < {G}u; kk += 4u)"):
                L(f"let k0 = kq * {G}u + kk;")
                L(f"let q = {qfn}({cb} + k0);")
                for t in range(4):
                    with em.block(""):
                        L(f"let y = s.x * q[{t}]" + (" - s.y;" if has_min else ";"))
                        k_term(f"(k0 + {t}u)" if t else "k0", "y")
    elif v4:
        with em.block(f"for (var k = kl * 4u; k < {K}u; k += {4 * KL}u)"):
            L(f"let y = {B4(f'{cb} + k')};")
            for t in range(4):
                with em.block(""):
                    k_term(f"(k + {t}u)" if t else "k", f"y[{t}]")
    else:
        with em.block(f"for (var k = kl; k < {K}u; k += {KL}u)"):
            L(f"let y = {B(_sum([cb] + digits_addr(dimb[-2], 'k', K)))};")
            k_term("k", "y")
    # the KL lanes' partials of column c: gv[r * WG + c * KL + kl]
    for r in range(R):
        L(f"gv[{r * GEMV_WG}u + c * {KL}u + kl] = {acc[r]};")
    L("workgroupBarrier();")
    s = KL // 2
    while s >= 1:
        with em.block(f"if (kl < {s}u)"):
            for r in range(R):
                at = f"{r * GEMV_WG}u + c * {KL}u + kl"
                L(f"gv[{at}] = gv[{at}] + gv[{at} + {s}u];")
        L("workgroupBarrier();")
        s //= 2
    cond = "kl == 0u" + ("" if N % CW == 0 else f" && n < {N}u")
    with em.block(f"if ({cond})"):
        for r in range(R):
            L(f"{epi}({r * N}u + n, gv[{r * GEMV_WG}u + c * {KL}u]);")
    return [ctx.dispatch(kernel, em.lines, grid, GEMV_WG)]


def _build_split_sum(ctx, node, S: int, total: int) -> dict:
    """Second kernel of a split-K matmul: C = the S partial sums added in chunk order
    (deterministic), then the group's epilogue. With output sums (fusion.output_sums) a
    thread walks SPLIT_SUM_ROWS rows of one column, adding the sums' terms (each before
    the row's epilogue stores, so that its load waits out none of them), and the
    workgroup adds its row runs into one partial of each sum per block of rows (partials
    per thread made the sums' second pass loop over 256 of them: slower than the first
    pass they replace, on GPT-2's step on an H200)."""
    part = ctx.scratch[0]
    kernel = ctx.kernel(f"matmul {'x'.join(map(str, node.shape))} sum of {S} K chunks")
    P = kernel.binding(part.buffer, "f32", what=part.what, nbytes=part.nbytes)
    epi = ctx.epilogue_fn(kernel)
    em = ctx.emitter(kernel)

    def add_chunks():  # acc = value f's S partial sums, in chunk order
        em.emit(f"var acc: f32 = {P}[f];")
        for k in range(1, S):
            em.emit(f"acc += {P}[{k * total}u + f];")
    osums = getattr(ctx, "output_sums", [])
    if osums:
        N, R, RG = node.shape[-1], SPLIT_SUM_ROWS, SPLIT_SUM_GROUPS
        W = 256 // RG  # columns per workgroup
        rows, cb = total // N, -(-N // W)
        grid = kernel.workgroup_index(em, cb * split_sum_parts(total, N), "w")
        kernel.decls.append("var<workgroup> Os: array<f32, 256>;")
        em.emit(f"let rb = w / {cb}u;")
        em.emit(f"let c = (w % {cb}u) * {W}u + lid % {W}u;")
        em.emit(f"let r0 = rb * {R * RG}u + (lid / {W}u) * {R}u;")
        fns = [ctx.sum_fn(kernel, x, f"osum{j}") for j, (x, _) in enumerate(osums)]
        ts = [em.var("f32", "0.0f", prefix="ot") for _ in osums]
        with em.block(f"if (c < {N}u)" if N % W else ""):
            with em.block(f"for (var r = r0; r < min(r0 + {R}u, {rows}u); r++)"):
                em.emit(f"let f = r * {N}u + c;")
                add_chunks()
                for fn, t in zip(fns, ts):
                    em.emit(f"{t} += {fn}(f, acc);")
                em.emit(f"{epi}(f, acc);")
        for (_, q), t in zip(osums, ts):
            Q = kernel.binding(q.buffer, "f32", write=True, what=q.what, nbytes=q.nbytes)
            em.emit(f"Os[lid] = {t};")
            em.emit("workgroupBarrier();")
            total_ = " + ".join(f"Os[{g * W}u + lid]" for g in range(RG))
            cond = f"lid < {W}u" + (f" && c < {N}u" if N % W else "")
            em.emit(f"if ({cond}) {{ {Q}[rb * {N}u + c] = {total_}; }}")
            em.emit("workgroupBarrier();")
        return ctx.dispatch(kernel, em.lines, grid, 256)
    grid = kernel.thread_index(em, total, "f")
    add_chunks()
    em.emit(f"{epi}(f, acc);")
    return ctx.dispatch(kernel, em.lines, grid, 256)


def _sum(terms: list[str]) -> str:
    """A WGSL sum of address terms, without the zeros."""
    return " + ".join(t for t in terms if t != "0u") or "0u"


def _grouped_quant(sb, offb, dimb, bsh, K) -> bool:
    """Is B a quantized W^T whose K runs along W's rows (stride 1) from group starts?"""
    if not isinstance(sb, QuantOperand):
        return False
    G = sb.group
    return (len(bsh) == 2 and K % G == 0 and offb % G == 0
            and _canon_digits(dimb[-2]) == [(K, 1)]
            and all(st % G == 0 for c, st in dimb[-1] if c > 1))


def _canon_digits(digits):
    return [(c, st) for c, st in digits if c > 1]


def _build_direct(ctx, node, sa, offa, dima, ash, sb, offb, dimb, bsh) -> list:
    """Barrier-free matmul: each thread owns a TM x TN block of C and reads its A rows and
    B columns straight from global memory (no shared memory, no barriers). Neighbouring
    threads own neighbouring column blocks, so B reads coalesce; out-of-range rows/columns
    read a clamped (valid) address and are not written."""
    M, K, N = ash[-2], ash[-1], bsh[-1]
    batch = tuple(node.shape[:-2])
    nb = prod(batch)
    TM, TN = DIRECT_TM, DIRECT_TN
    adapter, opts = str(getattr(ctx.limits, "adapter", "")).lower(), ctx.limits.options
    if M * N * nb <= DIRECT_SMALL and any(a in adapter for a in opts.small_block_adapters):
        TM, TN = opts.small_block
    TM, TN = min(TM, M), min(TN, N)
    tiles_m, tiles_n = -(-M // TM), -(-N // TN)
    total = tiles_m * tiles_n * nb
    # K chunks (cpu_splits): thread t sums chunk sk = t / total of its block into scratch
    S, KS = cpu_splits(K)
    split = f" split {S}" if S > 1 else ""
    kernel = ctx.kernel(f"matmul {'x'.join(map(str, node.shape))} K={K} direct {TM}x{TN}{split}")
    A, B = operand_reader(kernel, sa), operand_reader(kernel, sb)
    if S > 1:
        part = ctx.scratch[0]
        P = kernel.binding(part.buffer, "f32", write=True, what=part.what, nbytes=part.nbytes)
    else:
        epi = ctx.epilogue_fn(kernel)
    em = ctx.emitter(kernel)
    L = em.emit
    grid = kernel.thread_index(em, total * S, "ts", DIRECT_WG)
    L(f"let sk = ts / {total}u;")
    L(f"let t = ts % {total}u;")
    L(f"let m0 = ((t / {tiles_n}u) % {tiles_m}u) * {TM}u;")
    L(f"let n0 = (t % {tiles_n}u) * {TN}u;")
    L(f"let bt = t / {tiles_m * tiles_n}u;")
    kbeg, kend = ("sk * {KS}u".format(KS=KS), f"min(sk * {KS}u + {KS}u, {K}u)") if S > 1 \
        else ("0u", f"{K}u")
    bdims = em.unravel("bt", batch) if batch else []

    base_a = _batch_base(em, batch, bdims, offa, dima, ash)
    base_b = _batch_base(em, batch, bdims, offb, dimb, bsh)
    # per-row (per-column) address parts, hoisted out of the K loop
    ra = []
    for i in range(TM):
        row = f"m0 + {i}u" if M % TM == 0 or i == 0 else f"min(m0 + {i}u, {M - 1}u)"
        ra.append(em.let(_sum([base_a] + digits_addr(dima[-2], f"({row})", M))))
    cb = []
    for j in range(TN):
        col = f"n0 + {j}u" if N % TN == 0 or j == 0 else f"min(n0 + {j}u, {N - 1}u)"
        cb.append(em.let(_sum([base_b] + digits_addr(dimb[-1], f"({col})", N))))
    acc = [[f"c{i}_{j}" for j in range(TN)] for i in range(TM)]
    for i in range(TM):
        for j in range(TN):
            L(f"var {acc[i][j]}: f32 = 0.0f;")

    def k_step(k):
        L(f"let ka = {_sum(digits_addr(dima[-1], k, K))};")
        for i in range(TM):
            L(f"let xa{i} = {A(f'{ra[i]} + ka')};")
        for i in range(TM):
            for j in range(TN):
                L(f"{acc[i][j]} = fma(xa{i}, yb{j}, {acc[i][j]});")

    if _grouped_quant(sb, offb, dimb, bsh, K):
        # x @ W^T of a quantized W: K walks each row of W in groups of G values (32; Q6_K
        # 16) that share a scale (and a min), read once per group, and 4 at a time from one
        # word; each value is the same f32 operations as the per-element decode
        sfn, qfn, has_min, G = group_helpers(kernel, sb)
        sh = G.bit_length() - 1
        with em.block(f"for (var kq = {kbeg} / {G}u; kq < {kend} / {G}u; kq++)"):
            for j in range(TN):
                L(f"let s{j} = {sfn}(({cb[j]} >> {sh}u) + kq);")
            with em.block(f"for (var kk = 0u; kk < {G}u; kk += 4u)"):
                L(f"let k0 = kq * {G}u + kk;")
                for j in range(TN):
                    L(f"let q{j} = {qfn}({cb[j]} + k0);")   # one word: 4 values of W's row
                for t in range(4):
                    with em.block(""):
                        for j in range(TN):
                            L(f"let yb{j} = s{j}.x * q{j}[{t}]" + (f" - s{j}.y;" if has_min else ";"))
                        k_step(f"(k0 + {t}u)" if t else "k0")
    else:
        with em.block(f"for (var k = {kbeg}; k < {kend}; k++)"):
            L(f"let kb = {_sum(digits_addr(dimb[-2], 'k', K))};")
            for j in range(TN):
                L(f"let yb{j} = {B(f'{cb[j]} + kb')};")
            k_step("k")
    L(f"let f0 = bt * {M * N}u + m0 * {N}u + n0;")
    if (S == 1 and TM * TN > 1 and any(a in adapter for a in opts.epi_loop_adapters)
            and _epilogue_lines(kernel, epi) > opts.epi_loop_lines):
        # one call of the epilogue in a loop over the block (see the note at DIRECT_SMALL)
        L(f"var cv = array<f32, {TM * TN}>({', '.join(a for row in acc for a in row)});")
        with em.block(f"for (var e = 0u; e < {TM * TN}u; e++)"):
            L(f"let ei = e / {TN}u;")
            L(f"let ej = e % {TN}u;")
            conds = (([f"m0 + ei < {M}u"] if M % TM else [])
                     + ([f"n0 + ej < {N}u"] if N % TN else []))
            call = f"{epi}(f0 + ei * {N}u + ej, cv[e]);"
            L(f"if ({' && '.join(conds)}) {{ {call} }}" if conds else call)
    else:
        for i in range(TM):
            for j in range(TN):
                conds = (([f"m0 + {i}u < {M}u"] if M % TM else [])
                         + ([f"n0 + {j}u < {N}u"] if N % TN else []))
                call = (f"{P}[sk * {nb * M * N}u + f0 + {i * N + j}u] = {acc[i][j]};" if S > 1
                        else f"{epi}(f0 + {i * N + j}u, {acc[i][j]});")
                L(f"if ({' && '.join(conds)}) {{ {call} }}" if conds else call)
    out = [ctx.dispatch(kernel, em.lines, grid, DIRECT_WG)]
    if S > 1:
        out[0]["cost"] = True  # the profiler's bytes and FLOPs: the product, not the sum
        out.append(_build_split_sum(ctx, node, S, nb * M * N))
    return out


__all__ = ["Config", "choose_config", "build_matmul", "use_direct", "use_gemv", "group_config",
           "ADAPTER_TILINGS", "matmul_dims", "matmul_scratch_bytes", "b_k_fast", "mma_takes"]
