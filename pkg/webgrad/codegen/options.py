"""Kernel options: every switch that changes the generated WGSL, carried by the compile.

`KernelOptions` rides on `Limits.options` (wgsl.py), which every pass and builder already
receives, so the same graph, options and adapter always give the same WGSL: nothing in
codegen reads a module global that a test or a bench could flip. The defaults are the
measured choices (the comments in each builder say where they were measured); tests and
benches take another set with `dataclasses.replace(KernelOptions(), field=value)` and pass
it to `compile_module(..., kernel_options=...)`, `WebGPUBackend(options=...)`, or straight
to `lower(graph, Limits(..., options=...))`. The adapter-specific rows (matmul_config.py's
ADAPTER_TILINGS) stay tables keyed by the adapter's description.

Switches that only change how the host runs a plan (webgpu_device's PIPELINE_THREADS and
DAWN_TOGGLES, webgpu_native's PREFETCH, SUBMIT_FIRST, SPIN_WAIT) are not here: they never
change the WGSL.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

# attention_tiled.py's code options, each measured against its absence (bench/attention.py
# --variants); the comments there say what each one changes
ATTN_PREFETCH_OPS = frozenset({"attn_fwd", "attn_out", "attn_dq", "attn_dkv", "attn_dk", "attn_dv"})
ATTN_OPTS = (
    ("heavy_first", True),  # causal: the row blocks with most streamed blocks get the lowest ids
    ("red_in_as", True),    # the online softmax's row reductions in As, read as vec4
    ("ws_vec", True),       # W stored to Ws as one vector per column, not TR scalars
    ("exact", True),        # no clamps / zero selects where the block sizes divide the extents
    # a block's X rows staged whole, in the words of As and Bs (free once the scores are
    # made): one barrier pair per output product instead of one per XK rows (with
    # prefetch_x, whose registers hold the whole block already)
    ("x_whole", True),
    # threads as 4 x 8 patches of 32 consecutive ids (a warp on NVIDIA GPUs), not rows of WX:
    # a warp's reads of a k then cover 4 row vectors and 8 column vectors (one 128-byte
    # wavefront each) where 2 rows of 16 threads read 2 and 16 (codegen/matmul_tiled.py measured
    # 8-9% on its 8 x 8 tile)
    ("warp_tiles", True),
    # ops whose next D chunk's global loads are issued before the current chunk's products
    ("prefetch_d", ATTN_PREFETCH_OPS),
    # ops whose X rows (v, g, q or k) are loaded at the block's start, before the scores
    ("prefetch_x", ATTN_PREFETCH_OPS),
)


@dataclass(frozen=True)
class KernelOptions:
    # ---- wgsl.py: workgroup reductions
    # True / False: the subgroup / shared-memory-tree form of every workgroup reduction on any
    # adapter (True needs a device requested with 'subgroups'); None: use_subgroups decides
    subgroups: bool | None = None
    # the reductions that take the subgroup form by default where the device has 'subgroups'
    subgroup_default: frozenset = frozenset({"pairs"})

    # ---- matmul.py
    # a matmul_config.Config used for every product in place of choose_config (bench/matmul.py)
    force_config: object = None
    # True / False: the barrier-free / tiled kernel on any adapter; None: CPU adapters direct
    force_direct: bool | None = None
    # products of at most this many rows of C (decoding's M = 1 .. a few) against one B take
    # the matrix-vector kernel (matmul_gemv.py) on GPUs; 0: never
    gemv_rows: int = 4
    # True / False: the matrix-vector kernel for such products on any adapter / on none;
    # None: GPUs and the CPU adapters of gemv_cpu_adapters, unless force_direct names a kernel
    force_gemv: bool | None = None
    # True / False: the matrix-vector kernel's CPU form (matmul_gemv_cpu.py: no barriers) /
    # not, on any adapter; None: the CPU adapters of gemv_cpu_adapters take it, except where
    # force_gemv=True asks for the matrix-vector kernel by name (tests of the workgroup form
    # on lavapipe); other CPU adapters keep the barrier-free kernel (matmul_direct.py)
    gemv_cpu: bool | None = None
    # lavapipe; not SwiftShader, where it ran 10% slower than matmul_direct.py's 1 x 8 / 1 x 4
    # blocks (bench/README.md, decode_browser.py)
    gemv_cpu_adapters: tuple = ("llvmpipe", "lavapipe")
    # the matrix-vector kernel's quantized form (matmul_gemv.build_gemv_chunks): threads per
    # workgroup, lanes per column (consecutive lanes read consecutive chunks of a row's
    # blocks; fewer where a row has fewer chunks) and columns per lane (sharing A's loads)
    gemv_quant: tuple = (64, 32, 4)
    # True: that form quantizes A to 8 bits first, as llama.cpp's CUDA decode does (its q8_1:
    # per 32 values d = max|a| / 127, q = round(a / d)), each workgroup into its workgroup
    # memory, and multiplies by integer dot products of four int8 pairs (WGSL dot4I8Packed)
    # for the formats whose Chunk has `packed` (Q4_K, Q5_K, Q6_K, Q8_0). It changes the
    # products' values (A's rounding: about |W row| max|a| / 440 a product, matmul_gemv_q8.py;
    # docs/precision.md). True / False: on any adapter / on none; None: on GPUs whose WGSL has
    # dot4I8Packed (Limits.packed_dot). Measured on the H200 (2026-12-04, bench/README.md):
    # the Llama-3.2-1B-shaped Q4_K_M decode 420.9 -> 488.8 tokens/s (0.46x -> 0.53x llama.cpp)
    gemv_q8_dot: bool | None = None
    # ... also where B's N axis (not K) has stride 1 (matmul_config.use_gemv says why not by default)
    gemv_n_fast: bool = False
    # True / False: a matrix-vector product whose A is a normalized row (RMSNorm: an
    # elementwise chain of one row sum) sums and normalizes that row itself (fusion's rule 8,
    # codegen/gemv_prologue.py) on any adapter where the workgroup form runs / on none;
    # None: on GPUs (CPU adapters keep the sum and the elementwise kernel)
    gemv_prologue: bool | None = None
    # adapters (substrings of Limits.adapter, lower case) whose small direct products take
    # small_block (SwiftShader: pipeline creation grows with the unrolled block)
    small_block_adapters: tuple = ("swiftshader",)
    small_block: tuple = (4, 4)
    # adapters whose barrier-free products call the epilogue in a loop over the block
    # (the note at matmul_direct.DIRECT_SMALL: SwiftShader inlines each call)
    epi_loop_adapters: tuple = ("swiftshader",)
    # ... when the epilogue function has more lines than this
    epi_loop_lines: int = 12
    # the tiled kernel's k loop is a WGSL loop past this many FMAs per thread per K step
    k_loop: int = 1024
    # (FMAs, k): tiles above FMAs per K step loop k at a time instead of unrolling; None unrolls
    k_unroll: tuple | None = None
    # bias / layer-norm gradients summed by the products' kernels (fusion.operand_sums,
    # output_sums); False: by reductions of their own
    operand_sums: bool = True
    # epilogues loading more values per output than this keep their loads in place
    # (matmul_epilogue.prefetch_epilogue)
    epi_max_loads: int = 2
    # products whose C has at most this many rows or columns (a LoRA factor's [T, r] product,
    # its [r, in] gradient) are not split over K where smaller tiles give as many workgroups
    # as the chunks (matmul_config._choose_config; products thin_config takes, on adapters
    # with slots unless thin_split=0, never reach this rule); 0: they split as any other
    split_thin: int = 16
    # a thin weight gradient read through a transpose (LoRA's dA, dB: a side of at most
    # split_thin) is computed in its parameter's layout, so that the optimizer's update joins
    # its product's kernel (codegen/thin_grads.py); False: in the layout the matmul rule gives
    thin_grads: bool = True
    # True / False: thin products (at most split_thin columns) that read the same A with
    # 2-D B's of one K (LoRA's x @ A_q^T, x @ A_k^T, x @ A_v^T; gate's and up's) are one
    # product against the B's concatenated, read in slices (codegen/thin_siblings.py), on
    # any adapter / on none; None: on GPUs. The Llama-1B-shaped LoRA step on the H200
    # (2026-12-04) took 269.3-269.4 ms with it, 270.0-270.2 without (bench/README.md)
    thin_siblings: bool | None = None
    # True / False: a product over K <= 16 added elementwise to a larger product's output
    # (LoRA's (x A^T) B^T, (dY B) A) is computed in that product's epilogue
    # (codegen/lowrank.py), on any adapter / on none; None: on GPUs. False by default: the
    # Llama-1B-shaped LoRA step on the H200 (2026-12-04) took 304.8 ms with it, 269.8 without
    # (1065 against 1290 kernels: the inlined rank sums cost the base products more than the
    # kernels they save)
    lowrank_epilogue: bool | None = False
    # an ADAPTER_TILINGS row (a dict) used in place of the adapter's own (tests)
    tiling_row: dict | None = None
    # The rank-r products of LoRA (matmul_config.expand_config, thin_config; bench/
    # thin_products.py times each against torch). Products over K <= expand_k (LoRA's
    # (x A^T) B^T and (dY B) A at r = 16: M x N outputs from 16 values each) take
    # expand_config's tile: a thread's columns wx apart (Config.cols_apart: a warp's stores
    # whole sectors), the epilogue's loads issued before its stores, tm halved until the
    # grid is large (expand_tile); 0: the table's tiles, on any adapter (the rule applies
    # wherever the tiled kernel runs: GPUs, or forced), where N >= expand_min_n.
    # H200, 2026-12-04 (bench/README.md): [2048 x 16] @ [16 x 8192] 55 -> 30 us (torch 37.5),
    # with a residual add 66 -> 46 (torch 87); at N 512 the table's 64 x 64 tile stays (9 us
    # against 17)
    expand_k: int = 32
    expand_min_n: int = 1024
    # (tm, tn, wx, wy, workgroups) of that tile: tm halved until the grid has that many;
    # None: matmul_config.EXPAND_TILE, (4, 4, 32, 8, 1024)
    expand_tile: tuple | None = None
    # products whose C has at most thin_side rows or columns over K >= 2 thin_chunk (LoRA's
    # x A^T [T, r], dY B, and the factor gradients [r, in], [out, r]): one 16-wide tile
    # across the thin side, the other side's tile halved, then K split in chunks of at least
    # thin_chunk, until the grid has thin_split workgroups (thin_config; K step thin_bk);
    # None: matmul_config.THIN_TILES (1024) where the adapter's row has "slots" (the GPUs of
    # ADAPTER_TILINGS), 0: off (split_thin's rule); K up to matmul_config.THIN_MAX_K. H200,
    # 2026-12-04: [2048 x 2048] @ [2048 x 16] 35 -> 29 us, the 32-wide siblings 39 -> 34, dA
    # [16 x 2048] 41 -> 30, dB 32 -> 24; slower, so left to the other rules: K 8192 (49 ->
    # 77 us) and thin_siblings' 48-wide q, k, v product (51 -> 61): thin_side 32
    thin_split: int | None = None
    thin_side: int = 32
    thin_chunk: int = 128
    thin_bk: int = 64

    # ---- attention_match.py, attention_tiled.py
    # False: no attention is fused (the plain matmuls and row softmax); True: every matched
    # attention, training steps too; None: attention_match._fuse_training's policy
    fuse_attention: bool | None = None
    # a precision="mixed" (or "f16") program's attention is matched through the f16 casts
    # precision.py inserts (attention_pattern.py) and its kernels round where the program
    # does: the scores after q @ k^T, the normalized probabilities before @ v (so the
    # forward is attn_lse then attn_out, not the one-pass online softmax), gP and gS in the
    # backward (attention.py, attention_tiled_kernel.py); False leaves such a program's
    # attention unfused, its [.., T, S] scores and probabilities stored. None: inference
    # programs (precision="f16") fused everywhere, training programs on CPU adapters only:
    # on GPUs the unfused products run on the tensor cores where the fused kernels do f32
    # maths (the H200, 2026-12-04: GPT-2 124M 8 x 512 mixed step 54.9 ms fused, 47.0
    # unfused; medium 8 x 1024 348 against 270; bench/README.md), at a memory cost of the
    # stored f16 scores (124M 4358 -> 5371 MiB, 0.75x torch bf16's). The fused kernels on
    # subgroup matrices (attn_mma, the fused form where the adapter has them) took the 124M
    # step to 52.2 ms against 44.8 unfused, medium 320.8 against 256.7 (2026-12-04 later:
    # 0.33-0.39 ms each of the four kernels at T 512, their staging and softmax stages
    # element by element), so None stays unfused on GPUs
    attn_mixed: bool | None = None
    # True / False: a half-precision program's attention kernels (attn_lse, attn_out, attn_dq,
    # attn_dkv with attrs mixed) on subgroup matrices (attention_mma.py) wherever the adapter
    # offers f16 ones and the heads fit / never; None: the same as True
    attn_mma: bool | None = None
    # tests: every subgroup-matrix kernel emitted in plain WGSL (mma_emulate.py) and the
    # adapter given the 16x16x16 f16 -> f32 configuration (subgroup size 32) where it has
    # shader-f16 but no subgroup matrices (lavapipe): slow, for the kernels' logic only
    mma_emulate: bool = False
    # True / False: an inference attention's queries (a decoding step's q rope) read as an
    # expression by the attention kernel (fusion_storage._query_expr), not stored by an
    # elementwise kernel, on any adapter / on none; None: on GPUs
    attn_q_expr: bool | None = None
    # ---- rowfuse_match.py: False keeps cross entropy and layer norm's backward as traced
    fuse_rows: bool = True
    # True / False: the tiled / row attention kernels on any adapter; None: GPUs tiled
    attn_tiled: bool | None = None
    # True / False: an inference attn_out split over chunks of keys (attention_split.py) /
    # not, on any adapter; None: not (measured no quicker on an H200 at S 513: use_split)
    attn_split: bool | None = None
    # keys per workgroup of its first pass (and threads: one per key)
    attn_split_chunk: int = 64
    # {op: (BR, BC, DK, XK)} in place of choose_blocks (bench/attention.py)
    attn_blocks: dict | None = None
    # {op: (WY, WX)} threads per workgroup of an op's tiled kernel; others take (16, 16)
    attn_threads: dict | None = None
    # the tiled kernels' code options (ATTN_OPTS): override some by name
    attn_opts: tuple = ATTN_OPTS
    # True / False: the tiled kernels' prefetches on any adapter; None: prefetch_adapters only
    attn_prefetch: bool | None = None
    prefetch_adapters: tuple = ("h200", "h100")

    # ---- reduce.py
    # column sums at least this long are split (col_split)
    col_split_min_r: int = 2048
    # True / False: col_split's tiled / per-thread pass 1; None: its own rule
    column_tiled: bool | None = None
    # True / False: several trailing rows per workgroup (_wg_rows) on / off; None: not on CPUs
    rows_tiled: bool | None = None
    # about this many elements of a row per thread of a row kernel's workgroup (None: WG)
    row_elems: int | None = 8
    # True / False: row kernels loop over a row in one thread / a workgroup per row, on any
    # adapter; None: one thread on CPU adapters (rows up to reduce.CPU_ROW_MAX)
    row_per_thread: bool | None = None
    # True / False: a long argmax_last row split over workgroups (two passes) / one
    # workgroup per row, on any adapter; None: split on GPUs only
    argmax_split: bool | None = None
    # elements per workgroup of a split argmax's first pass (reduce.py)
    argmax_chunk: int = 1024

    # ---- fusion.py
    # False: a tensor _assemble would assemble from pieces is computed by a kernel of its own
    assemble: bool = True
    # elements: a transpose read by an elementwise op at least this large is stored first
    transposed_read_min: int = 1 << 20

    # True / False: an in-place write_rows whose rows a product computes at its own index
    # (a decoding step's V cache row; GPT-2's K and V, columns of c_attn's output) stored by
    # that product's epilogue (fusion rule 9, fusion_groups._row_epilogues), not by a
    # write_rows kernel, on any adapter / on none; None: on GPUs (a Llama-3.2-1B-shaped H200
    # decode step: 165 -> 149 kernels; GPT-2 124M's: 140 -> 116; off, the join below is off)
    write_rows_epilogue: bool | None = None
    # True / False: an in-place write_rows whose rows read their product at other columns
    # too (K, rotated) joins the product whose epilogue writes a sibling's rows (V's, read by
    # the same attention) on any adapter / on none; None: on GPUs (149 -> 133 kernels)
    write_rows_join: bool | None = None

    # ---- elementwise.py
    # elements per thread of a large elementwise kernel, and the domain size from which
    # threads take that many (smaller kernels: one a thread)
    elems: int = 4
    elems_min: int = 1 << 18
    # copies through a last-two-axes transpose tiled through workgroup memory on GPUs
    tiled_transpose: bool = True
    # True / False: the tiled transposing copy regardless of the adapter
    force_tiled_transpose: bool | None = None

    # precision="mixed"/"f16" programs (precision.py) keep their f16 values in f32 buffers
    # (rounded with integer arithmetic on the f32 bits, elementwise.wg_round_f16, as every
    # program does), so they run without shader-f16; False stores them in f16 and refuses
    # an adapter without shader-f16: the fallback for those adapters
    f16_emulation: bool = False

    # ---- matmul.py / matmul_mma.py
    # a 2-D product on subgroup matrices with fewer tiles than this is split along K into
    # chunks (a power of two) until it has twice as many (0: never split; mma_splits)
    mma_split_below: int = 256
    # an epilogue that streams a tensor (GELU's pre-activation in its backward) has its
    # loads issued for this many elements before their stores (0: element by element)
    mma_epi_prefetch: int = 8
    # (field, value) pairs replacing fields of matmul_mma.MmaTiling's default (e.g.
    # (("bn", 256), ("sg_n", 4), ("frag", "row"))) for every product on subgroup matrices
    # whose shape the variant divides and whose workgroup memory fits (tiling_for); the
    # others keep the table's tiling. () : the table everywhere (bench/matmul_f16.py --sweep)
    mma_tiling: tuple = ()
    # the thread copies' width (MmaTiling.width) of every product on subgroup matrices: 4
    # binds the operands as vec2<u32>, four halves a load (2-way bank conflicts in the
    # workgroup stores, not 4-way): bench/matmul_f16.py measured it +10% at every shape on
    # the H200 (4096^3: 262 against 238 TFLOP/s), but not in GPT-2 124M's mixed step
    # (bench/gpt2_train.py --rows gpt2, 2026-12-04: 55.1 -> 55.7 ms; the split head gradient
    # 1.44 -> 1.77 ms); 8 (the default): vec4 loads, eight halves
    mma_width: int = 8
    # products with an epilogue: rows of result matrices staged a round (MmaTiling.epi_rows;
    # the most up to this that fit the workgroup memory: 1 on a 128 x 128 tile in 48 KB)
    # and neighbouring elements per invocation a step (epi_vec: 1, 2, 4, 8; wider reads of
    # the staging, neighbouring stores); 1, 1: a row a round, 32 neighbours a call. On the
    # H200 (GPT-2 124M mixed step, 2026-12-04) epi_vec 4 took the GELU products
    # [8x512x3072 K=768 -> epilogue] from 0.57 to 0.39 ms (33 -> 50 TFLOP/s), the step from
    # 55.1 to 53.0 ms (8: the same); epi_rows 2 (which needs mma_tiling bk 16 to fit) no
    # quicker. So epi_vec 4 is the default
    mma_epi_rows: int = 1
    mma_epi_vec: int = 4
    # products whose only output is their f16 rounding (C in f16, no epilogue): halves each
    # invocation converts from the staging and stores as one word (MmaTiling.out_vec: 1 a
    # f16 store each, 2 / 4 / 8 a u32 / vec2<u32> / vec4<u32>, C bound as such)
    mma_out_vec: int = 1
    # f16 C products (mma_stage) and epilogue products (mma_epi_stage): result matrices of a
    # row staged in workgroup memory a round (MmaTiling.stage; 0: the whole row of the
    # subgroup's block, 4 on the 128 x 128 tile). The staging adds to the slabs' workgroup
    # memory, which decides how many workgroups an SM runs at once: on the H200 (2026-12-04,
    # bench/README.md) the f16 C kernel at 4096^3 ran 154 TFLOP/s with a row staged (35 KB
    # a workgroup), 237 with one matrix (23 KB), as f32 C; GPT-2 medium's mixed step 242 ->
    # 202 ms with both 1
    mma_stage: int = 1
    mma_epi_stage: int = 1
    # ... and for an epilogue whose loads mma_epi_prefetch issues ahead (it streams a tensor
    # of the output's size: GELU's pre-activation in its backward, a residual)
    mma_epi_load_stage: int = 1
    # ... whose loads, too, go a round ahead: issued before the previous round is handed
    # over (MmaTiling.epi_ahead), in flight across its barriers and stores
    mma_epi_ahead: bool = False
    # the subgroup-matrix kernel takes an operand stored transposed (A as [K, M], B as
    # [N, K]: MmaTiling.a_t / b_t, the matrices loaded column-major from its slab), and a
    # precision="mixed" program's backward products read the forward's f16 copies
    # transposed (x^T of a weight gradient, W^T of an input gradient) instead of a rounded
    # copy of the transpose (precision.apply_precision's transposed_views). True: where
    # the view costs no memory (precision._viewed_transposes: a backward product reads the
    # value anyway, or nothing else in the backward keeps it or what it is computed from);
    # "all": every transpose; "weights": only the weights' (W^T); None (the default): True
    # where the products run on subgroup matrices (matmul_mma.transposed_views_for), else
    # False; the backend decides for compile_module (Backend.transposed_views). On an H100
    # (bench/README.md, 2026-12-06) "all" took GPT-2 124M's mixed step 43.3 -> 37.2 ms but
    # its plan 5371 -> 6393 MiB; True plans as False's memory (5326 MiB for the H200) with
    # 1099 kernels instead of 1147, not yet timed (bench/h200_round.sh 11)
    mma_transposed: bool | str | None = None
    # the thread copies transpose A's ("a"), B's ("b") or both slabs (True) on their way to
    # workgroup memory (MmaTiling.a_x / b_x): consecutive invocations take consecutive rows,
    # so a subgroup's f16 stores fill consecutive words where 16-byte rows put four
    # invocations on each bank; the matrices are loaded with the other major. False: copies
    # as stored
    mma_xcopy: bool | str = False

    # ---- index.py
    # True / False: the tiled / chunked scan (scatter_add_rows' counts); None: GPUs tiled
    scan_tiled: bool | None = None

    # ---- align_match.py
    # (A, MIN, ROWS) padding rule on any adapter in place of the adapter's table row
    force_align: tuple | None = None

    def attn_opt(self, name: str):
        """One of attention_tiled.py's code options (ATTN_OPTS names)."""
        return dict(self.attn_opts)[name]

    def with_attn_opts(self, **over) -> "KernelOptions":
        """These options with some attention code options replaced by name."""
        d = dict(self.attn_opts)
        unknown = set(over) - set(d)
        if unknown:
            raise KeyError(f"KernelOptions.with_attn_opts: no attention option {sorted(unknown)}; "
                           f"known: {sorted(d)}")
        d.update(over)
        return replace(self, attn_opts=tuple(d.items()))


DEFAULT = KernelOptions()

# The module attributes these fields replace (bench scripts' `--set MODULE.ATTR=VALUE` of the
# old spelling maps through this): "module.ATTR" -> field name
OLD_NAMES = {
    "wgsl.SUBGROUPS": "subgroups", "wgsl.SUBGROUP_DEFAULT": "subgroup_default",
    "matmul.FORCE_CONFIG": "force_config", "matmul.FORCE_DIRECT": "force_direct",
    "matmul.SMALL_BLOCK_ADAPTERS": "small_block_adapters", "matmul.SMALL_BLOCK": "small_block",
    "matmul.EPI_MAX_LOADS": "epi_max_loads", "matmul.K_LOOP": "k_loop", "matmul.K_UNROLL": "k_unroll", "matmul.OPERAND_SUMS": "operand_sums",
    "attention_tiled.FORCE_TILED": "attn_tiled", "attention_tiled.FORCE_BLOCKS": "attn_blocks",
    "attention_tiled.FORCE_THREADS": "attn_threads", "attention_tiled.THREADS": "attn_threads",
    "attention_tiled.FORCE_PREFETCH": "attn_prefetch",
    "attention_tiled.PREFETCH_ADAPTERS": "prefetch_adapters",
    "reduce.COL_SPLIT_MIN_R": "col_split_min_r", "reduce.COLUMN_TILED": "column_tiled",
    "reduce.ROWS_TILED": "rows_tiled", "reduce.ROW_ELEMS": "row_elems",
    "fusion.ASSEMBLE": "assemble", "fusion.TRANSPOSED_READ_MIN": "transposed_read_min",
    "elementwise.ELEMS": "elems", "elementwise.ELEMS_MIN": "elems_min",
    "elementwise.TILED_TRANSPOSE": "tiled_transpose",
    "elementwise.FORCE_TILED_TRANSPOSE": "force_tiled_transpose",
    "index.SCAN_TILED": "scan_tiled", "align_match.FORCE_ALIGN": "force_align",
}


def field_for(name: str) -> str:
    """The KernelOptions field `name` means: a field name, or an old module attribute
    ("webgrad.codegen.matmul.FORCE_DIRECT", "matmul.FORCE_DIRECT")."""
    names = {f.name for f in fields(KernelOptions)}
    if name in names:
        return name
    short = name.removeprefix("webgrad.").removeprefix("codegen.")
    if short in OLD_NAMES:
        return OLD_NAMES[short]
    raise KeyError(f"{name!r} is no KernelOptions field (fields: {', '.join(sorted(names))})")


def with_setting(options: KernelOptions, item: str) -> KernelOptions:
    """`options` with one "NAME=VALUE" applied (the benches' --set): NAME a field or an old
    module attribute (field_for), VALUE a Python literal."""
    import ast
    name, eq, value = item.partition("=")
    if not eq:
        raise ValueError(f"{item!r}: write NAME=VALUE (a KernelOptions field and a Python literal)")
    v = ast.literal_eval(value.strip())
    if isinstance(v, (set, list)) and field_for(name.strip()) == "subgroup_default":
        v = frozenset(v)
    return replace(options, **{field_for(name.strip()): v})


__all__ = ["KernelOptions", "DEFAULT", "ATTN_OPTS", "field_for", "OLD_NAMES", "with_setting"]
