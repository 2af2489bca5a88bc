"""Matmul: C[b, m, n] = sum_k A[b, m, k] B[b, k, n] with batch broadcasting.

`build_matmul` lowers a matmul group to one of four kernels, in this order:
  matmul_mma.py     subgroup matrices (tensor cores) for f16 operands where the device has
                    them and the group is the bare product (`_build_mma`)
  matmul_gemv.py    matrix-vector: a few rows of C against one B (decoding), GPUs;
  matmul_gemv_cpu.py  its barrier-free form on CPU adapters
  matmul_direct.py  barrier-free: each thread a block of C straight from global memory,
                    CPU adapters (a barrier costs a fiber switch per thread there)
  matmul_tiled.py   tiled in shared memory, every GPU
and a split product's second kernel (matmul_splitk.py) adds its K chunks. Which kernel and
which tile: matmul_config.py (`group_config`, the table ADAPTER_TILINGS), asked by this
module and by fusion.py and program.py (sums taken on the way, split-K scratch).

Operands are *strided views* (layout.strided_view): base buffer, offset, and per axis a
list of (size, stride) digits. A transposed operand (backward passes multiply by
swap_axes(W)) is just other strides, a broadcast batch axis has stride 0, and merge_heads'
transpose + reshape is two digits on one axis: nothing is copied. A weight gradient
sum_b x_b^T g_b is one matmul whose K axis runs over (b, k) (fusion.matmul_fold). Every
kernel hands its result to the group's epilogue `epi(flat, v)` (program.GroupCtx.epilogue),
so elementwise consumers (bias, relu, an optimizer update) are fused into the writer.
"""
from __future__ import annotations

from dataclasses import replace
from math import prod

from .layout import digits_addr, nonunit_digits, strided_view
from .matmul_config import Config, cpu_splits, gemv_cpu_form, group_config
from .matmul_direct import build_direct
from .matmul_epilogue import prefetch_epilogue
from .matmul_gemv import build_gemv
from .matmul_gemv_cpu import build_gemv_cpu
from .matmul_mma import c_elem, mma_matmul_wgsl, mma_splits, tiling_for, transposed_views_for
from .mma_emulate import emulate_mma
from .matmul_splitk import build_split_sum
from .matmul_tiled import build_tiled
from .quant import QuantOperand
from .wgsl import BindingTypeClash


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


def b_k_fast(g, fu, main: int) -> bool:
    """Does the matmul group's B have its K axis of stride 1 (group_config's k_fast)?"""
    if main in fu.matmul_fold:
        return False
    i = g[main].inputs[1]
    view = strided_view(g, i, fu.operand_base)
    return view is not None and nonunit_digits(view[2][-2]) == [(g[i].shape[-2], 1)]


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
    if config is None and ctx.prologue is None:
        mma = _build_mma(ctx, node, (sa, offa, dima, ash), (sb, offb, dimb, bsh))
        if mma is not None:
            return mma
    cfg = config or group_config(ctx.limits, M, K, N, nb, prod(bsh[:-2]) == 1,
                                 nonunit_digits(dimb[-2]) == [(K, 1)])
    if cfg is not None and cfg.splits > 1 and (not ctx.scratch or _mma_planned(ctx)):
        cfg = replace(cfg, splits=1)   # planned for the mma kernel (mma_takes), which declined
    if cfg is None:
        return build_direct(ctx, node, sa, offa, dima, ash, sb, offb, dimb, bsh)
    ops = (sa, offa, dima, ash), (sb, offb, dimb, bsh)
    if cfg.gemv:  # (fusion gives this kernel no sums to take on the way)
        build = build_gemv_cpu if gemv_cpu_form(ctx.limits) else build_gemv
        try:
            return build(ctx, node, *ops, vec=True)
        except BindingTypeClash:  # B's buffer is also read or written as f32
            return build(ctx, node, *ops, vec=False)
    try:
        return build_tiled(ctx, node, cfg, *ops)
    except BindingTypeClash:
        # the epilogue reads or writes an operand's buffer, which a vec4 view of it cannot
        # share (one binding per buffer): scalar loads
        if not cfg.vload:
            raise
        return build_tiled(ctx, node, replace(cfg, vload=False), *ops)


def mma_takes(g, fu, main: int, limits, half) -> bool:
    """Whether the subgroup-matrix kernel (_build_mma) will take the product of the group
    whose main node is `main`, as far as the plan can tell before buffers exist (operands
    f16 in storage: `half`, program.half_storage; row-major; a tiling that divides it; no
    sums on the way). Its split-K scratch: mma_scratch_bytes. Where the builder still
    declines it (an operand's offset, an epilogue reading an operand's buffer), the tiled
    kernel runs it unsplit."""
    return _mma_plan(g, fu, main, limits, half) is not None


def mma_scratch_bytes(g, fu, main: int, limits, half) -> int:
    """The K chunks' partial sums (f32) of a product the subgroup-matrix kernel splits
    (matmul_mma.mma_splits), else 0."""
    plan = _mma_plan(g, fu, main, limits, half)
    return 4 * plan[0] * plan[1] * plan[2] if plan and plan[0] > 1 else 0


def _mma_plan(g, fu, main: int, limits, half):
    """(K chunks, M, N) of the subgroup-matrix kernel's product of group `main`, or None
    where it will not take it (mma_takes)."""
    node = g[main]
    if not limits.subgroup_matrix or node.op != "matmul" or main in fu.matmul_fold:
        return None
    gid = fu.group_of[main]
    if any(mg == gid for mg, _ in fu.operand_sums.values()) or gid in fu.output_sums.values() \
            or any(n in fu.assembled for n in fu.groups[gid].outputs):
        return None
    if main in fu.prologue:   # A computed as it is read: the matrix-vector kernel's
        return None
    ops = []
    for i in node.inputs:
        base, off, dims = strided_view(g, i, fu.operand_base)
        if base not in half:
            return None
        ops.append((off, dims, tuple(g[i].shape)))
    shape = _mma_shape(tuple(node.shape), *ops, limits)
    if shape is None:
        return None
    S = _mma_split(limits, *shape[:4], *shape[6:])
    return None if S is None else (S, shape[0], shape[1])


def _mma_planned(ctx) -> bool:
    """Was the group's scratch planned for the subgroup-matrix kernel's split (which then
    declined the product: the tiled kernel runs it unsplit)?"""
    low = ctx._low
    return ctx.group.main is not None and mma_takes(ctx.g, low.fu, ctx.group.main, ctx.limits, low.half)


def _mma_split(limits, M: int, N: int, K: int, nb: int, a_t: bool = False,
               b_t: bool = False) -> int | None:
    """K chunks of the subgroup-matrix kernel's [M, K] @ [K, N] (x nb), None where no
    tiling divides it: the planner (_mma_plan) and the builder (_build_mma) agree on it."""
    t = tiling_for(limits, M, N, K, "f32", epilogue=True, a_t=a_t, b_t=b_t)
    return None if t is None else mma_splits(t, M, N, K, nb, limits.options.mma_split_below)


def _mma_shape(shape, opa, opb, limits):
    """(M, N, K, batch count, A's and B's offset expressions in wg.z) of a product the
    subgroup-matrix kernel can read (row-major matrices at 16-byte offsets), else None.
    opa, opb: (element offset, dims, shape) of the operands (layout.strided_view)."""
    (offa, dima, ash), (offb, dimb, bsh) = opa, opb
    if len(ash) < 2 or len(bsh) < 2:
        return None
    M, K, N = ash[-2], ash[-1], bsh[-1]
    canon = nonunit_digits

    def layout(dims, R, C):   # False: row-major [R, C]; True: stored transposed, [C, R]
        if canon(dims[-2]) == canon([(R, C)]) and canon(dims[-1]) == canon([(C, 1)]):
            return False
        if transposed_views_for(limits) and canon(dims[-2]) == canon([(R, 1)]) and \
                canon(dims[-1]) == canon([(C, R)]):
            return True
        return None
    a_t, b_t = layout(dima, M, K), layout(dimb, K, N)
    if a_t is None or b_t is None:
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
    if nb > 1 and shared_b and not a_t and canon([dg for _, d in bda for dg in d]) == canon([(nb, M * K)]):
        M, nb, bda, bdb = nb * M, 1, [], []   # one product of nb * M rows
    elif nb > limits.max_compute_workgroups_per_dimension:
        return None
    return M, N, K, nb, base(offa, bda), base(offb, bdb), a_t, b_t


# the operands' binding type by the tiling's copy width (KernelOptions.mma_width: 4 binds
# vec2<u32>, bench/matmul_f16.py's kernel; its vec4 form, reading the vec4 that holds an
# invocation's halves, measured slower on the H200: 2.23 -> 3.47 ms for GPT-2's head product)
_MMA_BIND = {8: "vec4_u32", 4: "vec2_u32"}
_C_BIND = {"vec4<u32>": "vec4_u32", "vec2<u32>": "vec2_u32", "u32": "u32"}   # f16 C's words


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
    memory. A product of few tiles is split over K (matmul_mma.mma_splits,
    _build_mma_split); sums taken on the way and assembled pieces keep the tiled kernel."""
    (sa, offa, dima, ash), (sb, offb, dimb, bsh) = opa, opb
    if not ctx.limits.subgroup_matrix:
        return None
    if isinstance(sa, QuantOperand) or isinstance(sb, QuantOperand) or "f16" != sa.dtype or \
            sb.dtype != "f16":
        return None
    if ctx.operand_sum or ctx.output_sums or ctx.writes_pieces:
        return None
    shape = _mma_shape(tuple(node.shape), (offa, dima, ash), (offb, dimb, bsh), ctx.limits)
    if shape is None:
        return None
    M, N, K, nb, a_base, b_base, a_t, b_t = shape
    S = _mma_split(ctx.limits, M, N, K, nb, a_t, b_t) or 1
    if (S > 1) != bool(ctx.scratch):
        return None   # scratch planned for another kernel's split
    if S > 1:
        return _build_mma_split(ctx, node, sa, sb, M, N, K, S, a_base, a_t, b_t)
    g = ctx.g
    if ctx.rows:
        out = None   # the epilogue stores cache rows too
    elif ctx.outs == [node.id] and ctx.storage(node.id).dtype == "f32":
        out = "f32"
    elif (len(ctx.outs) == 1 and g[ctx.outs[0]].op == "cast" and list(g[ctx.outs[0]].inputs) == [node.id]
          and g[ctx.outs[0]].attrs.get("dtype") == "f16" and ctx.storage(ctx.outs[0]).dtype == "f16"):
        out = "f16"
    else:
        out = None   # the epilogue
    t = tiling_for(ctx.limits, M, N, K, out or "f32", epilogue=out is None, a_t=a_t, b_t=b_t)
    if t is None:
        return None
    what = f"matmul {'x'.join(map(str, node.shape))} K={K} mma {t.bm}x{t.bn}x{t.bk} -> {out or 'epilogue'}"
    kernel = ctx.kernel(what)
    an = kernel.binding(sa.buffer, _MMA_BIND[t.width], what=sa.what, nbytes=sa.nbytes)
    bn = kernel.binding(sb.buffer, _MMA_BIND[t.width], what=sb.what, nbytes=sb.nbytes)
    epi, cn, ld = None, "", 0
    try:
        if out is None:
            ep = ctx.epilogue(kernel)
            epi = ep.name
            # the loads of several elements before their stores (matmul_epilogue)
            ld = ctx.limits.options.mma_epi_prefetch
            if ld and not prefetch_epilogue(kernel, ep, ctx.limits.options.epi_max_loads,
                                            widened=True):
                ld = 0
            if ld:   # a streamed load: its staging per mma_epi_load_stage, on the same tile
                u = tiling_for(ctx.limits, M, N, K, "f32", epilogue=True, streams=True,
                               a_t=a_t, b_t=b_t)
                if u is not None and (u.bm, u.bn, u.bk) == (t.bm, t.bn, t.bk):
                    t = u
        else:
            c = ctx.storage(ctx.outs[0])
            cn = kernel.binding(c.buffer, _C_BIND.get(c_elem(t), out), write=True, what=c.what,
                                nbytes=c.nbytes)
    except BindingTypeClash:   # the epilogue reads an operand's buffer as f16 values
        return None
    wgsl, groups = mma_matmul_wgsl(M, N, K, t, ctx.limits.max_compute_workgroup_storage_size,
                                   batch=nb, a_base=a_base, b_base=b_base,
                                   header=kernel.module_scope(), names=(an, bn, cn), epi=epi,
                                   epi_ld=ld, bound=t.width)
    return [{"wgsl": emulate_mma(wgsl) if ctx.limits.options.mma_emulate else wgsl,
             "bindings": [b.buffer for b in kernel.bindings],
             "workgroups": list(groups), "name": what}]


def _build_mma_split(ctx, node, sa, sb, M: int, N: int, K: int, S: int, a_base: str,
                     a_t: bool = False, b_t: bool = False) -> list | None:
    """A product split into S chunks of K (matmul_mma.mma_splits): the subgroup-matrix
    kernel writes chunk wg.z's partial product to scratch (A's columns and B's rows of the
    chunk; of an operand stored transposed, its rows or columns), then matmul_splitk's
    kernel adds them in order and runs the epilogue."""
    Kc = K // S
    t = tiling_for(ctx.limits, M, N, Kc, "f32", a_t=a_t, b_t=b_t)
    if t is None or a_base:
        return None
    part = ctx.scratch[0]
    what = f"matmul {'x'.join(map(str, node.shape))} K={K} mma {t.bm}x{t.bn}x{t.bk} split {S}"
    kernel = ctx.kernel(what)
    an = kernel.binding(sa.buffer, _MMA_BIND[t.width], what=sa.what, nbytes=sa.nbytes)
    bn = kernel.binding(sb.buffer, _MMA_BIND[t.width], what=sb.what, nbytes=sb.nbytes)
    cn = kernel.binding(part.buffer, "f32", write=True, what=part.what, nbytes=part.nbytes)
    wgsl, groups = mma_matmul_wgsl(M, N, Kc, t, ctx.limits.max_compute_workgroup_storage_size,
                                   batch=S, a_base=f"wg.z * {Kc * M if a_t else Kc}u",
                                   b_base=f"wg.z * {Kc if b_t else Kc * N}u",
                                   header=kernel.module_scope(), names=(an, bn, cn),
                                   lda=None if a_t else K, ldb=K if b_t else None,
                                   bound=t.width)
    return [{"wgsl": emulate_mma(wgsl) if ctx.limits.options.mma_emulate else wgsl,
             "bindings": [b.buffer for b in kernel.bindings],
             "workgroups": list(groups), "name": what, "cost": True},   # the profile's FLOPs
            build_split_sum(ctx, node, S, M * N)]


__all__ = ["build_matmul", "matmul_dims", "matmul_scratch_bytes", "b_k_fast", "mma_takes",
           "mma_scratch_bytes"]
