"""Row kernels and the pick that codegen/rowfuse_match.py rewrites cross entropy and
layer-norm backward into.

  pick_last(A, i)        an expression: A[..., i[...]], 0 where i is outside [0, V)
  logsumexp_last(x)      [..] = max_j x_j + log sum_j exp(x_j - max): one workgroup per
                         row, one pass over it: each thread keeps its running max m and
                         s = sum exp(x - m), rescaled when m grows (s e^(m - m') + 1), and
                         the tree combines (m, s) pairs the same way. The two-pass form
                         (max, then the sum) read a [4096, 50257] row block twice: 0.69 ms
                         on an H200, at 1.2 TB/s of rows (bench/README.md). Where the
                         device has 'subgroups' the pairs are combined by subgroupMax /
                         subgroupAdd instead of the tree (_logsumexp_subgroups): 1.38 ->
                         1.01 ms over [4096, 50257] on an H200 (bench/subgroups.py)
  layer_norm_grad(x, g)  dx of layer_norm_last (no affine) given g = dL/dy:
                         mu = mean(x), r = (mean((x - mu)^2) + eps)^-1/2, xhat = (x - mu) r,
                         dx = r (g - mean(g) - xhat mean(g xhat))
                         one workgroup per row: the mean, the variance, then mean(g) and
                         mean(g xhat) together, then dx (4 passes over the row, 1 kernel)
On CPU adapters (Limits.cpu) rows up to reduce.CPU_ROW_MAX long take a thread per row
instead, as reduce.py's row ops do: the same passes as a plain loop, no shared memory and no
barriers.
The row kernels read their inputs through the emitter (g is usually an expression: the
upstream gradient times the affine weight) and hand results to the group's epilogue.
"""
from __future__ import annotations

from math import prod

from .emit import Idx, rule
from .reduce import RowPasses, row_per_thread, row_thread_wg, row_wgsize
from .wgsl import f32_lit, tree_reduce, use_subgroups, workgroup_reduce

from .rowfuse_match import ROW_KERNEL_OPS


@rule("pick_last")
def _pick_rule(em, node, idx):
    a, i = node.inputs
    V = em.g[a].shape[-1]
    k = em.value(i, em.bcast(idx, em.g[i].shape))
    ku = em.let(f"u32({k})")
    at = em.let(f"min({ku}, {V - 1}u)")
    v = em.value(a, Idx(em.g[a].shape, dims=list(idx.dims(em)) + [at]))
    return f"select(0.0f, {v}, {ku} < {V}u)"


def build_row_kernel(ctx) -> list[dict]:
    node = ctx.main_node
    g = ctx.g
    x = node.inputs[0]
    D = g[x].shape[-1]
    rows = prod(g[x].shape[:-1])
    per_thread = row_per_thread(ctx, D)
    kernel = ctx.kernel(f"{node.op} {rows}x{D}" + (" thread" if per_thread else ""))
    epi = ctx.epilogue_fn(kernel)
    wgs = row_thread_wg(ctx) if per_thread else row_wgsize(ctx, D)
    if not per_thread:
        kernel.decls.append(f"var<workgroup> red: array<f32, {wgs}>;")
    em = ctx.emitter(kernel)
    if per_thread:
        grid = kernel.thread_index(em, rows, "row", wgs)
        loop = f"for (var j = 0u; j < {D}u; j++)"
    else:
        grid = kernel.workgroup_index(em, rows, "row")  # workgroup-uniform: barriers stay legal
        loop = f"for (var j = lid; j < {D}u; j += {wgs}u)"

    em.declare("j")  # the loops' index

    def flat():
        return em.ravel(["row", "j"], (rows, D))  # remembered: views regroup [row, j]

    def at(n):
        return em.value(n, Idx(g[n].shape, flat=flat()))

    def total(acc, combine="sum"):
        if per_thread:  # the thread's own sum is the row's
            return em.let(acc)
        t = workgroup_reduce(em, wgs, acc, combine,
                             (lambda a, b: f"{a} = {a} + {b};") if combine == "sum"
                             else (lambda a, b: f"{a} = max({a}, {b});"))
        em.emit("workgroupBarrier();")  # everyone has read the total before red is reused
        return t

    if node.op == "logsumexp_last" and not per_thread:
        # one pass: (m, s) per thread; x == m adds e^0 = 1 also where m is infinite (+inf
        # twice gives +inf, as torch.logsumexp; -inf only gives -inf + log(n)); a NaN x
        # makes s NaN, and the combine keeps it (only s == 0, an empty thread, is dropped)
        kernel.decls.append(f"var<workgroup> red2: array<f32, {wgs}>;")
        m, sm = em.var("f32", f32_lit(float("-inf"))), em.var("f32", "0.0f")
        with em.block(loop):
            v = at(x)
            with em.block(f"if ({v} > {m})"):
                em.emit(f"{sm} = {sm} * exp({m} - {v}) + 1.0f;")
                em.emit(f"{m} = {v};")
            with em.block("else"):
                em.emit(f"{sm} = {sm} + select(exp({v} - {m}), 1.0f, {v} == {m});")

        def part(ma, sa, mm):
            return f"select({sa} * select(exp({ma} - {mm}), 1.0f, {ma} == {mm}), 0.0f, {sa} == 0.0f)"
        if use_subgroups(ctx.limits, "pairs"):
            _logsumexp_subgroups(em, kernel, wgs, m, sm, part, lambda v: em.emit(f"{epi}(row, {v});"))
            return [ctx.dispatch(kernel, em.lines, grid, wgs)]
        em.emit(f"red[lid] = {m};")
        em.emit(f"red2[lid] = {sm};")
        # the pairs at indices i (this thread's) and j, in red (maxima) and red2 (sums)
        tree_reduce(em.lines, "  ", "red", wgs, lambda i, j: (
            f"let ma = red[{i}]; let mb = red[{j}]; let mm = max(ma, mb); "
            f"red2[{i}] = {part('ma', f'red2[{i}]', 'mm')} + {part('mb', f'red2[{j}]', 'mm')}; "
            f"red[{i}] = mm;"), by_index=True)
        with em.block("if (lid == 0u)"):
            em.emit(f"{epi}(row, red[0] + log(red2[0]));")
        return [ctx.dispatch(kernel, em.lines, grid, wgs)]
    if node.op == "logsumexp_last":
        m = em.var("f32", f32_lit(float("-inf")))
        with em.block(loop):
            em.emit(f"{m} = max({m}, {at(x)});")
        mx = total(m, "max")
        acc = em.var("f32", "0.0f")
        with em.block(loop):
            em.emit(f"{acc} = {acc} + exp({at(x)} - {mx});")
        tot = total(acc)
        if per_thread:
            em.emit(f"{epi}(row, {mx} + log({tot}));")
        else:
            with em.block("if (lid == 0u)"):
                em.emit(f"{epi}(row, {mx} + log({tot}));")
        return [ctx.dispatch(kernel, em.lines, grid, wgs)]

    # layer_norm_grad(x, g)
    gg = node.inputs[1]
    inv = f32_lit(1.0 / D)
    rp = RowPasses(em, D, rows, wgs, not per_thread)

    def val(n):
        return lambda f: em.value(n, Idx(g[n].shape, flat=f))
    xv, gv = val(x), val(gg)
    rp.preload(lambda f: (xv(f), gv(f)))
    acc = em.var("f32", "0.0f")
    rp.fold((acc, xv))
    mean = em.let(f"{total(acc)} * {inv}")
    acc2 = em.var("f32", "0.0f")

    def sq(f):
        dv = em.let(f"{xv(f)} - {mean}")
        return f"{dv} * {dv}"
    rp.fold((acc2, sq))
    r = em.let(f"inverseSqrt({total(acc2)} * {inv} + {f32_lit(node.attrs['eps'])})")
    sg, sgx = em.var("f32", "0.0f"), em.var("f32", "0.0f")

    def xhat(f):
        return em.let(f"({xv(f)} - {mean}) * {r}")
    rp.fold((sg, gv), (sgx, lambda f: f"{gv(f)} * {xhat(f)}"))
    mg = em.let(f"{total(sg)} * {inv}")
    mgx = em.let(f"{total(sgx)} * {inv}")
    rp.each(lambda f: em.emit(f"{epi}({f}, {r} * ({gv(f)} - {mg} - {xhat(f)} * {mgx}));"))
    return [ctx.dispatch(kernel, em.lines, grid, wgs)]


def _logsumexp_subgroups(em, kernel, wgs, m, sm, part, finish):
    """The (m, s) pairs of a one-pass logsumexp combined through subgroups, as
    wgsl.workgroup_reduce combines one value: each subgroup takes the largest m and adds
    its s rescaled to it; its first active invocation writes the pair, the others the
    empty pair (-inf, 0); one barrier; each lane folds every n-th pair in order, and one
    more max and sum over the subgroup give every invocation the row's pair."""
    rank, count = kernel.enable_subgroups()
    ninf = f32_lit(float("-inf"))
    mg = em.snapshot(f"subgroupMax({m})")
    sg = em.snapshot(f"subgroupAdd({part(m, sm, mg)})")
    em.emit(f"red[lid] = select({ninf}, {mg}, {rank} == 0u);")
    em.emit(f"red2[lid] = select(0.0f, {sg}, {rank} == 0u);")
    em.emit("workgroupBarrier();")
    m2, s2 = em.var("f32", ninf), em.var("f32", "0.0f")
    with em.block(f"for (var wg_k = {rank}; wg_k < {wgs}u; wg_k += {count})"):
        mb, sb = em.snapshot("red[wg_k]"), em.snapshot("red2[wg_k]")
        mm = em.snapshot(f"max({m2}, {mb})")
        em.emit(f"{s2} = {part(m2, s2, mm)} + {part(mb, sb, mm)};")
        em.emit(f"{m2} = {mm};")
    mt = em.snapshot(f"subgroupMax({m2})")
    st = em.snapshot(f"subgroupAdd({part(m2, s2, mt)})")
    with em.block("if (lid == 0u)"):
        finish(f"{mt} + log({st})")


__all__ = ["ROW_KERNEL_OPS", "build_row_kernel"]
