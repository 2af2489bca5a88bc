"""The matrix-vector matmul kernel of CPU adapters (matmul_config.use_gemv, lavapipe and
SwiftShader): decoding's products (M = 1 .. KernelOptions.gemv_rows rows of C) with no
barrier and no workgroup memory.

A CPU adapter runs a workgroup's invocations as SIMD lanes of one core and a barrier as a
switch between them, so matmul_gemv.py's form (32 lanes per column adding their partials
in a tree of 8 barriers) ran 2.4x slower on lavapipe than the barrier-free kernel
(matmul_direct.py), which the products took there before. That kernel gives each thread 8
columns of C and reads B one float at a time: with M = 1 a thread does one multiply-add
per load. Here each thread owns GEMV_CPU_COLS columns and walks their rows of B (K of
stride 1: x @ W^T, the tied head) four values at a time: a vec4 load of f32 rows, one word
of four int8s for Q8_0 (a quantized row whole groups at a time, the scale read once per
group), multiplied into vec4 accumulators by A's four values, which every lane reads at
the same address. bench/README.md ("decode_cpu.py") has the measurements.
"""
from __future__ import annotations

from math import prod

from .layout import addr_sum, batch_base, digits_addr, nonunit_digits
from .matmul_gemv import row_bases
from .quant import QuantOperand, group_helpers, grouped_quant, operand_reader, vec4_reader
from .wgsl import u32_lit

GEMV_CPU_WG = 64    # threads per workgroup
# columns of C (rows of W) per thread: on lavapipe (2-layer decode, bench/decode_cpu.py) the
# 1 x 49152 head took 52 / 47 / 29 / 37 ms (F32) with 1 / 2 / 8 / 16 columns, Q8_0 52 /
# 160 / 30 / 20 / 38 ms with 1 / 2 / 4 / 8 / 16: more columns share each of A's loads,
# 16 spill or leave too few workgroups
GEMV_CPU_COLS = 8


def build_gemv_cpu(ctx, node, opa, opb, vec: bool) -> list:
    """C[r, n] = sum_k A[r, k] B[k, n] for the R <= gemv_rows rows r of C (all batch
    elements: B is shared): thread t owns columns t*CT .. t*CT+CT-1 for every r and sums
    all of K itself (the module docstring says why). Columns past N read column N-1 and are
    not written."""
    (sa, offa, dima, ash), (sb, offb, dimb, bsh) = opa, opb
    M, K, N = ash[-2], ash[-1], bsh[-1]
    batch = tuple(node.shape[:-2])
    R = M * prod(batch)
    CT = min(GEMV_CPU_COLS, N)
    k_fast = nonunit_digits(dimb[-2]) == [(K, 1)]
    grouped = grouped_quant(sb, offb, dimb, bsh, K)
    qb = isinstance(sb, QuantOperand)
    v4 = (vec and k_fast and not qb and K % 4 == 0 and offb % 4 == 0
          and all(st % 4 == 0 for c, st in dimb[-1] if c > 1))
    form = "q" if grouped else "vec4" if v4 else "scalar"
    kernel = ctx.kernel(f"matmul {'x'.join(map(str, node.shape))} K={K} gemv cpu {CT} {form}")
    # A's rows as vec4s where they start at multiples of 4 (one load of four values)
    a4 = (vec and (v4 or grouped) and not isinstance(sa, QuantOperand)
          and offa % 4 == 0 and nonunit_digits(dima[-1]) == [(K, 1)]
          and all(st % 4 == 0 for d in dima[:-1] for c, st in d if c > 1))
    A4 = vec4_reader(kernel, sa) if a4 else None   # f32, or f16 widened as it is read
    A = operand_reader(kernel, sa) if not a4 else None
    if v4:
        B4 = vec4_reader(kernel, sb)
    elif not grouped:
        B = operand_reader(kernel, sb)
    epi = ctx.epilogue_fn(kernel)
    em = ctx.emitter(kernel)
    L = em.emit
    threads = -(-N // CT)
    grid = kernel.thread_index(em, threads, "t", GEMV_CPU_WG)
    L(f"let n0 = t * {CT}u;")
    base_b = batch_base(em, batch, [u32_lit(0)] * len(batch), offb, dimb, bsh)
    cb = []
    for j in range(CT):
        col = f"n0 + {j}u" if N % CT == 0 or j == 0 else f"min(n0 + {j}u, {N - 1}u)"
        cb.append(em.let(addr_sum([base_b] + digits_addr(dimb[-1], f"({col})", N))))
    ra = row_bases(em, opa, batch, R)

    def a_vec(r, k0):  # A's four values at k0 .. k0+3 (one address for every lane)
        if a4:
            return A4(f"{ra[r]} + {k0}")
        vals = []
        for t in range(4):
            k = f"({k0} + {t}u)" if t else k0
            vals.append(A(addr_sum([ra[r]] + digits_addr(dima[-1], k, K))))
        return f"vec4<f32>({', '.join(vals)})"

    if v4 or grouped:
        acc = [[f"c{r}_{j}" for j in range(CT)] for r in range(R)]
        for row in acc:
            for a in row:
                L(f"var {a} = vec4<f32>(0.0f);")

        def step(k0, ys):   # acc[r][j] += A[r, k0..k0+3] * ys[j]
            for r in range(R):
                L(f"let a{r} = {a_vec(r, k0)};")
                for j in range(CT):
                    L(f"{acc[r][j]} = fma(a{r}, {ys[j]}, {acc[r][j]});")

        if grouped:
            sfn, qfn, has_min, G = group_helpers(kernel, sb)
            sh = G.bit_length() - 1
            with em.block(f"for (var kq = 0u; kq < {K // G}u; kq++)"):
                for j in range(CT):
                    L(f"let s{j} = {sfn}(({cb[j]} >> {sh}u) + kq);")
                with em.block(f"for (var kk = 0u; kk < {G}u; kk += 4u)"):
                    L(f"let k0 = kq * {G}u + kk;")
                    for j in range(CT):   # the same f32 operations as the per-element decode
                        L(f"let y{j} = s{j}.x * {qfn}({cb[j]} + k0)"
                          + (f" - vec4<f32>(s{j}.y);" if has_min else ";"))
                    step("k0", [f"y{j}" for j in range(CT)])
        else:
            with em.block(f"for (var k = 0u; k < {K}u; k += 4u)"):
                for j in range(CT):
                    L(f"let y{j} = {B4(f'{cb[j]} + k')};")
                step("k", [f"y{j}" for j in range(CT)])
        sums = [[f"dot({acc[r][j]}, vec4<f32>(1.0f))" for j in range(CT)] for r in range(R)]
    else:
        acc = [[f"c{r}_{j}" for j in range(CT)] for r in range(R)]
        for row in acc:
            for a in row:
                L(f"var {a}: f32 = 0.0f;")
        with em.block(f"for (var k = 0u; k < {K}u; k++)"):
            L(f"let kb = {addr_sum(digits_addr(dimb[-2], 'k', K))};")
            for j in range(CT):
                L(f"let y{j} = {B(f'{cb[j]} + kb')};")
            for r in range(R):
                L(f"let a{r} = {A(addr_sum([ra[r]] + digits_addr(dima[-1], 'k', K)))};")
                for j in range(CT):
                    L(f"{acc[r][j]} = fma(a{r}, y{j}, {acc[r][j]});")
        sums = acc
    for j in range(CT):
        cond = "" if N % CT == 0 or j == 0 else f"n0 + {j}u < {N}u"
        calls = " ".join(f"{epi}({r * N}u + n0 + {j}u, {sums[r][j]});" for r in range(R))
        L(f"if ({cond}) {{ {calls} }}" if cond else calls)
    return [ctx.dispatch(kernel, em.lines, grid, GEMV_CPU_WG)]


__all__ = ["build_gemv_cpu", "GEMV_CPU_WG", "GEMV_CPU_COLS"]
