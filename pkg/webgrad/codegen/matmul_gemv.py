"""The matrix-vector matmul kernel (GPUs: matmul_config.use_gemv; CPU adapters take
matmul_gemv_cpu.py's form).

Matrix-vector (`build_gemv`, GPUs: matmul_config.use_gemv): a product of at most KernelOptions.gemv_rows
rows of C (decoding's Linear layers and LM head, M = 1) whose B has its K axis of stride 1
takes neither tiled form: a workgroup of 256 threads owns 8 columns, 32 lanes per column walk
its row of B (vec4 loads) and add their partial sums in workgroup memory. One kernel, no
split over K, B read once at close to bandwidth (bench/README.md, llama_decode.py: a
Llama-3.2-1B-shaped decode step's products 8.8 -> 2.8 ms).

A quantized W^T whose rows start at block starts takes `build_gemv_chunks`: consecutive
lanes read consecutive aligned chunks of the blocks (each format's Chunk, webgrad/quants),
where the grouped form gave each lane a whole group of values sharing a scale and a warp's
loads scattered over 32 groups (Q4_K on an H200: 120 GB/s, against 2500 for f32 rows).

With KernelOptions.gemv_q8_dot (on GPUs whose WGSL has dot4I8Packed) the chunked form
rounds A to int8 first and sums integer dot products, as llama.cpp's CUDA decode does
(matmul_gemv_q8.py).

Either form takes an A that fusion left unstored (rule 8: a normalized row, RMSNorm's):
codegen/gemv_prologue.py sums its rows first and evaluates it where A is read.
"""
from __future__ import annotations

from math import prod

from .gemv_prologue import RowOperand, row_reader
from .matmul_gemv_q8 import q8_dot_takes, quantize_rows, run_terms
from .layout import addr_sum, batch_base, digits_addr, nonunit_digits
from .quant import (QuantOperand, chunk_reader, chunked_quant, group_helpers, grouped_quant,
                    operand_reader, vec4_reader)
from .wgsl import u32_lit

GEMV_WG = 256  # threads per workgroup of the matrix-vector kernel


def build_gemv(ctx, node, opa, opb, vec: bool) -> list:
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
    A's rows (R x K floats) are re-read by every workgroup from the cache; an A computed
    as it is read (a gemv_prologue.RowOperand: a normalized row) is summed first, then
    normalized as it is read."""
    (sa, offa, dima, ash), (sb, offb, dimb, bsh) = opa, opb
    M, K, N = ash[-2], ash[-1], bsh[-1]
    if vec and chunked_quant(sb, offb, dimb, bsh, K):
        return build_gemv_chunks(ctx, node, opa, opb)
    batch = tuple(node.shape[:-2])
    R = M * prod(batch)
    k_fast = nonunit_digits(dimb[-2]) == [(K, 1)]
    grouped = grouped_quant(sb, offb, dimb, bsh, K)
    qb = isinstance(sb, QuantOperand)
    CW = 8 if (k_fast or grouped) else 32
    KL = GEMV_WG // CW
    # vec4 loads of B's rows: plain f32 or f16, K in whole vec4s, every row start a multiple of 4
    v4 = (vec and k_fast and not qb and K % 4 == 0 and offb % 4 == 0
          and all(st % 4 == 0 for c, st in dimb[-1] if c > 1))
    kernel = ctx.kernel(f"matmul {'x'.join(map(str, node.shape))} K={K} gemv {CW}x{KL}"
                        + (" vec4" if v4 else ""))
    rowop = isinstance(sa, RowOperand)
    A = None if rowop else operand_reader(kernel, sa)
    if v4:
        B4 = vec4_reader(kernel, sb)   # f32, or f16 widened as it is read
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
    base_b = batch_base(em, batch, [u32_lit(0)] * len(batch), offb, dimb, bsh)
    cb = em.let(addr_sum([base_b] + digits_addr(dimb[-1], f"({col})", N)))
    if rowop:
        em.declare("k", "k0")
        read = row_reader(ctx, em, sa, R, GEMV_WG, vec4=False)
    else:
        ra = row_bases(em, opa, batch, R)
    acc = [f"c{r}" for r in range(R)]
    for a in acc:
        L(f"var {a}: f32 = 0.0f;")

    def k_term(k, y):
        if rowop:
            for r in range(R):
                L(f"{acc[r]} = fma({read(r, k)}, {y}, {acc[r]});")
            return
        L(f"let ka = {addr_sum(digits_addr(dima[-1], k, K))};")
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
            L(f"let y = {B(addr_sum([cb] + digits_addr(dimb[-2], 'k', K)))};")
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


def row_bases(em, opa, batch: tuple, R: int) -> list[str]:
    """The address of each of A's R rows (batch elements times M) at k = 0."""
    sa, offa, dima, ash = opa
    M = ash[-2]
    out = []
    for r in range(R):
        b, m = divmod(r, M)
        bd = em.unravel(u32_lit(b), batch) if batch else []
        base_a = batch_base(em, batch, bd, offa, dima, ash)
        out.append(em.let(addr_sum([base_a] + digits_addr(dima[-2], u32_lit(m), M))))
    return out


def a_vec4_reader(kernel, opa):
    """(row base, k) -> WGSL vec4<f32> of A[row, k .. k+3] (k a multiple of 4): one vec4
    load where A's rows are plain storage of stride-1 K starting at multiples of 4, else
    four loads."""
    sa, offa, dima, ash = opa
    K = ash[-1]
    if (not isinstance(sa, QuantOperand) and offa % 4 == 0
            and nonunit_digits(dima[-1]) == [(K, 1)]
            and all(st % 4 == 0 for d in dima[:-1] for c, st in d if c > 1)):
        A4 = vec4_reader(kernel, sa)
        return lambda ra, k: A4(f"{ra} + {k}")
    A = operand_reader(kernel, sa)
    return lambda ra, k: "vec4<f32>({})".format(", ".join(
        A(addr_sum([ra] + digits_addr(dima[-1], f"({k} + {t}u)", K))) for t in range(4)))


def build_gemv_chunks(ctx, node, opa, opb) -> list:
    """The quantized form: C = A B for a B that is a quantized W^T read in its format's
    chunks (quants/format.Chunk). A workgroup of WG threads (KernelOptions.gemv_quant) has
    WG / LC groups of LC lanes; each group owns RW adjacent columns of C, and lane kl takes
    chunks kl, kl + LC, ... of their rows of W: consecutive lanes load consecutive aligned
    chunks (a warp's load is one contiguous span, every quant byte read once, where one
    lane per group of values read scattered words). Each lane decodes its chunk's runs with
    their scales, loads A's values for them as vec4s once for its RW columns, and adds
    scale * sum(a q) - min * sum(a) per run. The LC partials of a column are then added in
    workgroup memory, a fixed tree of fan-in 8 (deterministic), and lane 0 runs the
    epilogue. A computed as it is read (a gemv_prologue.RowOperand) is summed first, then
    normalized as its vec4s are read. With KernelOptions.gemv_q8_dot the workgroup first
    rounds A to int8 and the runs are integer dot products (matmul_gemv_q8.py)."""
    (sa, offa, dima, ash), (sb, offb, dimb, bsh) = opa, opb
    M, K, N = ash[-2], ash[-1], bsh[-1]
    batch = tuple(node.shape[:-2])
    R = M * prod(batch)
    WG, lanes, RW = ctx.limits.options.gemv_quant
    rowop = isinstance(sa, RowOperand)
    kernel = ctx.kernel("")   # named below, once the shape is known
    ch, word, vec = chunk_reader(kernel, sb)
    block = sb.block
    lpb = ch.per_block.bit_length() - 1
    nch = K // block * ch.per_block         # chunks per row of W
    LC = min(lanes, 1 << (nch.bit_length() - 1), WG)
    CW = WG // LC * RW                      # columns per workgroup
    q8 = q8_dot_takes(ctx, ch, R, K, R * CW * LC)   # A rounded to int8 (matmul_gemv_q8.py)
    kernel.name = (f"matmul {'x'.join(map(str, node.shape))} K={K} gemv q "
                   f"{WG // LC}x{LC}x{RW}" + (" q8" if q8 else ""))
    A4 = None if rowop else a_vec4_reader(kernel, opa)
    epi = ctx.epilogue_fn(kernel)
    kernel.decls.append(f"var<workgroup> gv: array<f32, {R * CW * LC}>;")
    em = ctx.emitter(kernel)
    L = em.emit
    grid = kernel.workgroup_index(em, -(-N // CW), "w")
    L(f"let kl = lid % {LC}u;")
    L(f"let n0 = w * {CW}u + (lid / {LC}u) * {RW}u;")
    base_b = batch_base(em, batch, [u32_lit(0)] * len(batch), offb, dimb, bsh)
    rb = []   # each column's first block of W
    for j in range(RW):
        col = f"n0 + {j}u" if N % CW == 0 else f"min(n0 + {j}u, {N - 1}u)"
        cb = addr_sum([base_b] + digits_addr(dimb[-1], f"({col})", N))
        rb.append(em.let(f"({cb}) / {block}u"))
    if rowop:
        em.declare("k")
        A4, ra = row_reader(ctx, em, sa, R, WG, vec4=True), list(range(R))
    else:
        ra = row_bases(em, opa, batch, R)
    if q8:
        quantize_rows(kernel, em, A4, ra, K, WG)
    acc = [[f"c{r}_{j}" for j in range(RW)] for r in range(R)]
    for row in acc:
        for a in row:
            L(f"var {a}: f32 = 0.0f;")
    has_min = sb.has_min
    with em.block(f"for (var ch = kl; ch < {nch}u; ch += {LC}u)"):
        L(f"let kb = ch >> {lpb}u;")
        L(f"let c = ch & {ch.per_block - 1}u;")
        for j in range(RW):   # every column's loads first: all in flight together
            for line in ch.load(word, vec, f"{rb[j]} + kb", "c", f"q{j}_").strip("\n").split("\n"):
                L(line.removeprefix("  "))
        for r in range(ch.runs):
            with em.block(""):
                L(f"let k = kb * {block}u + {ch.at(r, 'c')};")
                if q8:
                    for x, row in enumerate(run_terms(em, ch, R, K, RW, r, has_min)):
                        for j, term in enumerate(row):
                            L(f"{acc[x][j]} = {acc[x][j]} + ({term});")
                    continue
                pieces = range(ch.run // 4)
                for x in range(R):
                    for i in pieces:
                        L(f"let a{x}_{i} = {A4(ra[x], f'k + {4 * i}u' if i else 'k')};")
                    if has_min:   # sum(a) of the run, once for all RW columns
                        total = " + ".join(f"a{x}_{i}" for i in pieces)
                        L(f"let as{x} = dot({total}, vec4<f32>(1.0f));")
                for j in range(RW):
                    for i in pieces:
                        L(f"let y{j}_{i} = {ch.quant(f'q{j}_', r, i)};")
                    s_ = f"q{j}_s{r}"
                    for x in range(R):
                        dots = " + ".join(f"a{x}_{i} * y{j}_{i}" for i in pieces)
                        term = f"{s_}.x * dot({dots}, vec4<f32>(1.0f))"
                        if has_min:
                            term += f" - {s_}.y * as{x}"
                        L(f"{acc[x][j]} = {acc[x][j]} + ({term});")
    # the LC partials of row r, column j of the lane's: gv[(r * CW + column) * LC + kl]
    L(f"let gs = (lid / {LC}u) * {RW * LC}u;")
    slot = [[f"gs + {(r * CW + j) * LC}u" for j in range(RW)] for r in range(R)]
    for r in range(R):
        for j in range(RW):
            L(f"gv[{slot[r][j]} + kl] = {acc[r][j]};")
    L("workgroupBarrier();")
    s = LC
    while s > 1:
        f = min(8, s)
        s //= f
        with em.block(f"if (kl < {s}u)"):
            for r in range(R):
                for j in range(RW):
                    at = f"{slot[r][j]} + kl"
                    L(f"gv[{at}] = " + " + ".join(
                        f"gv[{at}{f' + {t * s}u' if t else ''}]" for t in range(f)) + ";")
        L("workgroupBarrier();")
    with em.block("if (kl == 0u)"):
        for j in range(RW):
            calls = " ".join(f"{epi}({r * N}u + n0 + {j}u, gv[{slot[r][j]}]);" for r in range(R))
            L(f"if (n0 + {j}u < {N}u) {{ {calls} }}" if N % CW else calls)
    return [ctx.dispatch(kernel, em.lines, grid, WG)]
