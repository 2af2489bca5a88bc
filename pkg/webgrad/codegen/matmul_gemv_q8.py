"""The quantized matrix-vector kernel's integer form (KernelOptions.gemv_q8_dot): A rounded
to 8 bits, products as dot products of four int8 pairs.

build_gemv_chunks (matmul_gemv.py) decodes every weight to f32 and adds an f32 fma per
weight; on an H200 that bounds Q4_K at 576 GB/s against 2060 for f32 rows (ALU, not
memory). llama.cpp's CUDA decode (mmvq) instead rounds the activation row once, per 32
values a scale d = max|a| / 127 and q = round(a / d) (its q8_1), and sums weight quants times
A's quants four pairs at a time (dp4a; WGSL's dot4I8Packed), applying the scales once per run
of values sharing one. This module is that form, with the rounding in the product's own
prologue: each workgroup quantizes A's R rows into workgroup memory (A is re-read by every
workgroup anyway, from the cache), so no kernel and no buffer are added.

    qa8[x * K / 16 + k / 16]   vec4<u32>: A[x, k .. k + 15]'s quants, four int8 a word
    qd8[x * K / 16 + k / 16]   vec2<f32>: (d, d * sum q) of those 16 values, d of their 32

A run r of a chunk (format.Chunk: consecutive values sharing (scale, min), 16 of them in
every format here, starting at a multiple of 16) then adds

    scale * (d * sum_i w_i q_i) - min * (d * sum q)      (w_i the weight's integers, Chunk.packed)

which is exactly sum_i (scale w_i - min) (d q_i) in real arithmetic: the product of the
f32-decoded weights with A rounded to d q, up to f32 rounding of a few terms a run. Against
the f32 form it differs by sum_i (scale w_i - min) (a_i - d q_i), at most
1/2 sum_i |value_i| d_i (d_i the scale of a_i's block, |a_i - d q_i| <= d_i / 2); random
signs make it ~ |W row| max|a| / 127 / sqrt(12) (tests/test_gemv_q8.py checks both).
"""
from __future__ import annotations

QD = 16   # values a word vector of qa8 (and one (d, d * sum q) of qd8) holds


def q8_dot_takes(ctx, ch, R: int, K: int, gv_floats: int) -> bool:
    """Does the product take the integer form: the option on (None: on a GPU whose WGSL has
    dot4I8Packed), the format's chunk giving
    packed bytes in runs of whole 16s, and A's quants beside the kernel's own `gv` fitting
    in workgroup memory (1.5 bytes a value of A's R x K)?"""
    want = ctx.limits.options.gemv_q8_dot
    if want is False or (want is None and (ctx.limits.cpu or not ctx.limits.packed_dot)):
        return False
    if ch.packed is None or ch.run % QD or K % 32:
        return False
    nbytes = R * K // QD * (16 + 8) + 4 * gv_floats
    return nbytes <= ctx.limits.max_compute_workgroup_storage_size


def quantize_rows(kernel, em, A4, ra: list, K: int, WG: int) -> None:
    """Emit the prologue: A's rows (A4(ra[x], k): vec4<f32> of A[x, k .. k + 3]) quantized
    into qa8 / qd8, a thread per block of 32 values, then a barrier (call in uniform control
    flow). q = round(a * (1 / d)), ties to even (llama.cpp's CPU reference multiplies by 1 / d
    too; its roundf takes ties away from zero: a tie is a measure-zero case)."""
    L = em.emit
    R = len(ra)
    kernel.decls.append(f"var<workgroup> qa8: array<vec4<u32>, {R * K // QD}>;")
    kernel.decls.append(f"var<workgroup> qd8: array<vec2<f32>, {R * K // QD}>;")
    for x in range(R):
        with em.block(f"for (var a8b = lid; a8b < {K // 32}u; a8b += {WG}u)"):
            L("let a8k = a8b * 32u;")
            v = [em.let(A4(ra[x], f"a8k + {4 * i}u" if i else "a8k")) for i in range(8)]
            m = [f"abs({t})" for t in v]
            while len(m) > 1:
                m = [f"max({m[i]}, {m[i + 1]})" for i in range(0, len(m), 2)]
            L(f"let a8m = {m[0]};")
            L("let a8max = max(max(a8m.x, a8m.y), max(a8m.z, a8m.w));")
            L("let a8d = a8max / 127.0f;")
            L("let a8id = select(0.0f, 1.0f / a8d, a8max > 0.0f);")
            for h in range(2):
                qs = [f"a8q{h}_{t}" for t in range(4)]
                for t, q in enumerate(qs):
                    L(f"let {q} = vec4<i32>(round({v[4 * h + t]} * a8id));")
                at = f"{x * K // QD}u + 2u * a8b + {h}u"
                words = ", ".join(f"pack4xI8({q})" for q in qs)
                L(f"qa8[{at}] = vec4<u32>({words});")
                L(f"let a8s{h} = dot({' + '.join(qs)}, vec4<i32>(1));")
                L(f"qd8[{at}] = vec2<f32>(a8d, a8d * f32(a8s{h}));")
    L("workgroupBarrier();")


def run_terms(em, ch, R: int, K: int, cols: int, r: int, has_min: bool) -> list[list[str]]:
    """Emit, in the block of run r (its first value's index `k` in the row, chunk loads
    q{j}_ of `cols` columns), the reads of A's quants and the integer dot products; return
    the f32 term each row x adds to column j: terms[x][j]."""
    L = em.emit
    parts = ch.run // QD
    for x in range(R):
        for h in range(parts):
            at = f"{x * K // QD}u + (k >> 4u)" + (f" + {h}u" if h else "")
            L(f"let qa{x}_{h} = qa8[{at}];")
            L(f"let qd{x}_{h} = qd8[{at}];")
    terms = [[""] * cols for _ in range(R)]
    for j in range(cols):
        p = f"q{j}_"
        for i in range(ch.run // 4):
            L(f"let w{j}_{i} = {ch.packed(p, r, i)};")
        for x in range(R):
            scaled = []
            for h in range(parts):
                dots = " + ".join(f"dot4I8Packed(w{j}_{4 * h + t}, qa{x}_{h}[{t}])"
                                  for t in range(4))
                scaled.append(f"qd{x}_{h}.x * f32({dots})")
            term = f"{p}s{r}.x * ({' + '.join(scaled)})"
            if has_min:
                term += f" - {p}s{r}.y * ({' + '.join(f'qd{x}_{h}.y' for h in range(parts))})"
            terms[x][j] = term
    return terms


__all__ = ["q8_dot_takes", "quantize_rows", "run_terms"]
