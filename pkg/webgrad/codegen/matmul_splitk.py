"""The second kernel of a split-K matmul: the K chunks' partial sums added, then the epilogue.

The tiled kernel (matmul_config.Config.splits) and the barrier-free one on CPU adapters
(matmul_config.cpu_splits) write one partial product per K chunk to scratch; this kernel
adds them in chunk order (deterministic) and runs the group's epilogue, and takes the
output sums of a split product (fusion.output_sums) on the way.
"""
from __future__ import annotations


# a chunk sum that takes output sums: each thread walks SPLIT_SUM_ROWS rows of one column,
# a workgroup SPLIT_SUM_GROUPS such row runs of 256 / SPLIT_SUM_GROUPS columns
SPLIT_SUM_ROWS, SPLIT_SUM_GROUPS = 16, 4


def split_sum_parts(total: int, N: int) -> int:
    """Partials per output sum (fusion.output_sums) of a split product's chunk sum: one
    per workgroup's block of rows of the [total / N, N] output."""
    return -(-(total // N) // (SPLIT_SUM_ROWS * SPLIT_SUM_GROUPS))


def build_split_sum(ctx, node, S: int, total: int) -> dict:
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
