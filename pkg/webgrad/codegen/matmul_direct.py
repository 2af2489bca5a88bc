"""The barrier-free matmul kernel (CPU adapters: matmul_config.use_direct).

Barrier-free (`build_direct`, on CPU adapters: matmul_config.use_direct): each thread owns an 8 x 8
block of C and loops over K reading A and B straight from global memory. CPU-emulated
WebGPU (SwiftShader, lavapipe) runs a workgroup's threads as fibers, so a barrier costs a
switch per thread: there this kernel is several times faster than the tiled one at any
size. GPUs take the tiled one
(matmul_tiled.py).
"""
from __future__ import annotations

from math import prod

from .layout import addr_sum, batch_base, digits_addr
from .matmul_config import cpu_splits
from .matmul_splitk import build_split_sum
from .quant import group_helpers, grouped_quant, operand_reader
from .wgsl import u32_lit

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


def build_direct(ctx, node, sa, offa, dima, ash, sb, offb, dimb, bsh) -> list:
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
        epi_fn = ctx.epilogue(kernel)
        epi = epi_fn.name
    em = ctx.emitter(kernel)
    L = em.emit
    grid = kernel.thread_index(em, total * S, "ts", DIRECT_WG)
    L(f"let sk = ts / {total}u;")
    L(f"let t = ts % {total}u;")
    L(f"let m0 = ((t / {tiles_n}u) % {tiles_m}u) * {TM}u;")
    L(f"let n0 = (t % {tiles_n}u) * {TN}u;")
    L(f"let bt = t / {tiles_m * tiles_n}u;")
    em.declare("bt")
    kbeg, kend = ("sk * {KS}u".format(KS=KS), f"min(sk * {KS}u + {KS}u, {K}u)") if S > 1 \
        else (u32_lit(0), u32_lit(K))
    bdims = em.unravel("bt", batch) if batch else []

    base_a = batch_base(em, batch, bdims, offa, dima, ash)
    base_b = batch_base(em, batch, bdims, offb, dimb, bsh)
    # per-row (per-column) address parts, hoisted out of the K loop
    ra = []
    for i in range(TM):
        row = f"m0 + {i}u" if M % TM == 0 or i == 0 else f"min(m0 + {i}u, {M - 1}u)"
        ra.append(em.let(addr_sum([base_a] + digits_addr(dima[-2], f"({row})", M))))
    cb = []
    for j in range(TN):
        col = f"n0 + {j}u" if N % TN == 0 or j == 0 else f"min(n0 + {j}u, {N - 1}u)"
        cb.append(em.let(addr_sum([base_b] + digits_addr(dimb[-1], f"({col})", N))))
    acc = [[f"c{i}_{j}" for j in range(TN)] for i in range(TM)]
    for i in range(TM):
        for j in range(TN):
            L(f"var {acc[i][j]}: f32 = 0.0f;")

    def k_step(k):
        L(f"let ka = {addr_sum(digits_addr(dima[-1], k, K))};")
        for i in range(TM):
            L(f"let xa{i} = {A(f'{ra[i]} + ka')};")
        for i in range(TM):
            for j in range(TN):
                L(f"{acc[i][j]} = fma(xa{i}, yb{j}, {acc[i][j]});")

    if grouped_quant(sb, offb, dimb, bsh, K):
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
            L(f"let kb = {addr_sum(digits_addr(dimb[-2], 'k', K))};")
            for j in range(TN):
                L(f"let yb{j} = {B(f'{cb[j]} + kb')};")
            k_step("k")
    L(f"let f0 = bt * {M * N}u + m0 * {N}u + n0;")
    if (S == 1 and TM * TN > 1 and any(a in adapter for a in opts.epi_loop_adapters)
            and epi_fn.line_count > opts.epi_loop_lines):
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
        out.append(build_split_sum(ctx, node, S, nb * M * N))
    return out
