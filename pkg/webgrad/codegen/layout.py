"""Layout ops cost no kernel: they are index arithmetic in their consumers.

reshape      same buffer, same flat index (a contiguous tensor reinterpreted)
transpose    the consumer's index permuted (elementwise consumers); for matmul operands
             `strided_view` folds it into strides, so swap_axes(W) @ g reads W in place
broadcast_to the broadcast dims read at index 0 (stride 0 in a strided view)
slice        an offset on one axis
pad          a bounds test: zero outside, the input read only inside
concat       a select over the inputs, each read at a clamped index
A chain of transpose / broadcast_to / slice / reshape over a stored tensor is a *strided
view*: an offset and, per axis, a list of (size, stride) digits; one digit per axis is the
usual strided tensor, several appear where a reshape merges axes that a transpose
separated (merge_heads). Matmul reads its operands through such views, copying nothing.
"""
from __future__ import annotations

from math import prod

from .emit import Emitter, Idx, rule
from .wgsl import Literal, u32_lit, wgsl_type, zero

LAYOUT_OPS = {"reshape", "transpose", "broadcast_to", "slice", "pad", "concat"}


@rule("reshape")
def _reshape_rule(em: Emitter, node, idx: Idx) -> str:
    x = node.inputs[0]
    return em.value(x, Idx(em.g[x].shape, flat=idx.flat(em)))


@rule("transpose")
def _transpose_rule(em, node, idx):
    x = node.inputs[0]
    xs = em.g[x].shape
    moved = [p for p in node.attrs["perm"] if xs[p] != 1]
    if moved == sorted(moved):
        # only size-1 axes move: a reshape, so the flat index carries over (fusion's
        # `preserves` relies on this: a kernel reads its own output at the same text index)
        return em.value(x, Idx(xs, flat=idx.flat(em)))
    dims = idx.dims(em)
    ind = [None] * len(dims)
    for k, p in enumerate(node.attrs["perm"]):
        ind[p] = dims[k]
    return em.value(x, Idx(em.g[x].shape, dims=ind))


@rule("broadcast_to")
def _broadcast_rule(em, node, idx):
    x = node.inputs[0]
    return em.value(x, em.bcast(idx, em.g[x].shape))


@rule("slice")
def _slice_rule(em, node, idx):
    x = node.inputs[0]
    ax, start = node.attrs["axis"], node.attrs["start"]
    dims = list(idx.dims(em))
    if start:
        dims[ax] = em.let(f"{dims[ax]} + {start}u")
    return em.value(x, Idx(em.g[x].shape, dims=dims))


@rule("pad")
def _pad_rule(em, node, idx):
    x = node.inputs[0]
    ax, before = node.attrs["axis"], node.attrs["before"]
    n = em.g[x].shape[ax]
    dims = list(idx.dims(em))
    d = dims[ax]
    conds = ([f"{d} >= {before}u"] if before else []) + [f"{d} < {before + n}u"]
    inside = em.let(" && ".join(conds))
    # the input is read only inside: a select of a clamped read would load it everywhere
    # (the QKV gradient, three pads of [4096, 768] added into [4096, 2304], read three
    # values per element where one is used)
    out = em.var(wgsl_type(node.dtype), zero(node.dtype))
    with em.block(f"if ({inside})"):
        if before:
            dims[ax] = em.let(f"{d} - {before}u")
        em.emit(f"{out} = {em.value(x, Idx(em.g[x].shape, dims=dims))};")
    return out


@rule("concat")
def _concat_rule(em, node, idx):
    ax = node.attrs["axis"]
    dims = idx.dims(em)
    d = dims[ax]
    parts, start = [], 0
    for x in node.inputs:
        n = em.g[x].shape[ax]
        local = list(dims)
        at = f"{d} - {start}u" if start else d
        local[ax] = em.let(f"min({at}, {n - 1}u)")
        parts.append((start + n, em.value(x, Idx(em.g[x].shape, dims=local))))
        start += n
    out = parts[-1][1]
    for end, v in reversed(parts[:-1]):
        out = em.let(f"select({out}, {v}, {d} < {end}u)")
    return out


def build_concat_pieces(ctx) -> list:
    """A concat with more inputs than a kernel may bind: one dispatch per input, each
    writing its slab of the (stored) output."""
    from .wgsl import WG
    (n,) = ctx.group.anchors
    node = ctx.g[n]
    ax, out = node.attrs["axis"], ctx.storage(n)
    dispatches, start = [], 0
    for k, x in enumerate(node.inputs):
        shape = ctx.g[x].shape
        size = prod(shape)
        kernel = ctx.kernel(f"concat piece {k}")
        em = ctx.emitter(kernel)
        grid = kernel.thread_index(em, size, "i")
        v = em.value(x, Idx(shape, flat="i"))
        dims = list(em.unravel("i", shape))
        if start:
            dims[ax] = em.let(f"{dims[ax]} + {start}u")
        em.store(out, em.ravel(dims, node.shape), v)
        dispatches.append(ctx.dispatch(kernel, em.lines, grid, WG))
        start += shape[ax]
    return dispatches


# ---------------------------------------------------------------- strided views

def swaps_last_two(node) -> bool:
    """Is node a transpose of its last two axes (W^T, k^T), the others in place?"""
    r = len(node.shape)
    return (node.op == "transpose" and r >= 2
            and tuple(node.attrs["perm"]) == (*range(r - 2), r - 1, r - 2))


def contiguous_strides(shape) -> list[int]:
    return [prod(shape[k + 1:]) for k in range(len(shape))]


def canon_digits(comps):
    """Drop size-1 digits and merge neighbours that are contiguous: (c1, s1), (c2, s2) with
    s1 == c2 * s2 is one digit (c1 * c2, s2)."""
    out = []
    for c, st in comps:
        if c == 1:
            continue
        if out and out[-1][1] == c * st:
            out[-1] = (out[-1][0] * c, st)
        else:
            out.append((c, st))
    return out or [(1, 0)]


def strided_view(g, n: int, has_storage):
    """(base node, element offset, dims) such that node n's element [i0, i1, ...] is
    base's storage at offset + sum_k addr(dims[k], ik), where each dims[k] is a list of
    (size, stride) digits, most significant first: ik = d1 * c2 * ... + d2 * ... + dn and
    addr = sum dj * sj. One digit per axis is an ordinary strided view; a reshape that merges
    axes a transpose separated (merge_heads) makes several. None when n is no chain of
    transpose / broadcast_to / slice / reshape over a stored tensor. `has_storage(m)` says
    whether node m is stored (the chain stops there)."""
    node = g[n]
    if has_storage(n):
        return n, 0, [[(d, st)] for d, st in zip(node.shape, contiguous_strides(node.shape))]
    op = node.op
    if op not in ("transpose", "broadcast_to", "slice", "reshape"):
        return None
    v = strided_view(g, node.inputs[0], has_storage)
    if v is None:
        return None
    base, off, dims = v
    ins = g[node.inputs[0]].shape
    if op == "transpose":
        return base, off, [dims[p] for p in node.attrs["perm"]]
    if op == "broadcast_to":
        out = node.shape
        r = len(out) - len(ins)
        return base, off, [[(out[k], 0)] if k < r or ins[k - r] == 1 else dims[k - r]
                           for k in range(len(out))]
    if op == "slice":
        ax = node.attrs["axis"]
        comps = [c for c in dims[ax] if c[0] != 1]
        if len(comps) > 1:
            return None
        st = comps[0][1] if comps else 0
        dims = list(dims)
        dims[ax] = [(node.attrs["stop"] - node.attrs["start"], st)]
        return base, off + node.attrs["start"] * st, dims
    # reshape: the digits of all axes in row-major order, regrouped under the new shape
    queue = [c for d in dims for c in d if c[0] != 1]
    out = []
    for d in node.shape:
        need, cur = d, []
        while need > 1:
            if not queue:
                return None
            c, st = queue.pop(0)
            if c <= need:
                if need % c:
                    return None
                cur.append((c, st))
                need //= c
            else:
                if c % need:
                    return None
                cur.append((need, st * (c // need)))
                queue.insert(0, (c // need, st))
                need = 1
        out.append(canon_digits(cur))
    if queue:
        return None
    return base, off, out


def merge_batch_into_k(dims, k_axis: int):
    """A batched matmul operand's dims with the batch axes merged into its K axis (k_axis
    = -1 for A [.., M, K], -2 for B [.., K, N]): sum over the batch of A_b @ B_b is then ONE
    matmul whose K runs over (batch, k)."""
    nb = len(dims) - 2
    k = canon_digits([c for d in dims[:nb] for c in d] + list(dims[k_axis]))
    return [dims[-2], k] if k_axis == -1 else [k, dims[-1]]


def digits_addr(comps, i: str, total: int) -> list[str]:
    """WGSL terms of the address of index `i` (< total) along one axis of a strided view."""
    terms, inner = [], 1
    for c, st in reversed(comps):
        if c > 1 and st:
            e = i if inner == 1 else f"({i} / {inner}u)"
            if inner * c < total:
                e = f"({e} % {c}u)"
            terms.append(e if st == 1 else f"{e} * {st}u")
        inner *= c
    return terms


def nonunit_digits(digits) -> list[tuple[int, int]]:
    """An axis' (size, stride) digits without those of size 1 (they address nothing)."""
    return [(c, st) for c, st in digits if c > 1]


def addr_sum(terms: list[str]) -> str:
    """A WGSL sum of address terms, without the zeros (a term alone is itself: a name or
    a literal stays one)."""
    terms = [t for t in terms if not (isinstance(t, Literal) and t == "0u")]
    return terms[0] if len(terms) == 1 else " + ".join(terms) or u32_lit(0)


def batch_base(em, batch, bdims, off, dims, shape) -> str:
    """WGSL address of an operand's (broadcast) batch element `bdims` of C's batch (a
    strided view's offset `off` and digits `dims` of an operand of `shape`: the matmul
    kernels)."""
    terms = [u32_lit(off)] if off else []
    r = len(batch) - (len(shape) - 2)
    for k, d in enumerate(shape[:-2]):
        if d != 1:
            terms += digits_addr(dims[k], bdims[k + r], d)
    return em.let(addr_sum(terms))
