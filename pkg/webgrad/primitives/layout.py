"""Layout primitives: reshape, transpose and broadcast_to (views), concat, slice and pad.

None computes anything: codegen/layout.py makes them index arithmetic in the kernel that
consumes them, and a matmul reads an operand through reshape/transpose/broadcast_to as a
strided view (Cost.view) instead of a stored copy.
Each gradient is the adjoint layout op (slice <-> pad, concat -> slices, transpose -> the
inverse permutation).
"""
from __future__ import annotations

from math import prod

from .registry import (SELECT, VIEW, Cost, ShapeError, broadcast_shapes, defprim, no_flops,
                       ops_module as _O, same_dtype)


def _reshape_shape(ins, attrs):
    if prod(attrs["shape"]) != ins[0].size:
        raise ShapeError(f"cannot reshape {list(ins[0].shape)} ({ins[0].size} elements) "
                         f"to {list(attrs['shape'])} ({prod(attrs['shape'])} elements)")
    return tuple(attrs["shape"]), ins[0].dtype


defprim("reshape", "layout", shape=_reshape_shape,
        ref=lambda np, a, x: x.reshape(a["shape"]),
        grad=lambda g, i, o, a: [_O().reshape(g, i[0].shape)], cost=VIEW)


def _transpose_shape(ins, attrs):
    perm = attrs["perm"]
    if sorted(perm) != list(range(len(ins[0].shape))):
        raise ShapeError(f"perm {list(perm)} is not a permutation of the {len(ins[0].shape)} axes")
    return tuple(ins[0].shape[p] for p in perm), ins[0].dtype


def _inverse(perm):
    inv = [0] * len(perm)
    for k, p in enumerate(perm):
        inv[p] = k
    return tuple(inv)


defprim("transpose", "layout", shape=_transpose_shape,
        ref=lambda np, a, x: np.transpose(x, a["perm"]),
        grad=lambda g, i, o, a: [_O().transpose(g, _inverse(a["perm"]))], cost=VIEW)


def _broadcast_to_shape(ins, attrs):
    tgt = tuple(attrs["shape"])
    if broadcast_shapes(ins[0].shape, tgt) != tgt:
        raise ShapeError(f"cannot broadcast {list(ins[0].shape)} to {list(tgt)}")
    return tgt, ins[0].dtype


defprim("broadcast_to", "layout", shape=_broadcast_to_shape,
        ref=lambda np, a, x: np.broadcast_to(x, a["shape"]).copy(),
        grad=lambda g, i, o, a: [g], cost=VIEW)  # grad.py sums g down to the input's shape


def _concat_shape(ins, attrs):
    ax = attrs["axis"]
    r = len(ins[0].shape)
    for n in ins[1:]:
        if len(n.shape) != r or any(d != e for k, (d, e) in enumerate(zip(n.shape, ins[0].shape)) if k != ax):
            raise ShapeError(f"all shapes must match except along axis {ax}")
    out = list(ins[0].shape)
    out[ax] = sum(n.shape[ax] for n in ins)
    return tuple(out), same_dtype(ins, copies=True)


def _concat_grad(g, i, o, a):
    O = _O()
    ax, out, start = a["axis"], [], 0
    for t in i:
        out.append(O.slice(g, ax, start, start + t.shape[ax]))
        start += t.shape[ax]
    return out


defprim("concat", "layout", shape=_concat_shape, grad=_concat_grad, cost=SELECT,
        ref=lambda np, a, *xs: np.concatenate(xs, axis=a["axis"]))


def _slice_shape(ins, attrs):
    ax, s, e = attrs["axis"], attrs["start"], attrs["stop"]
    n = ins[0].shape[ax]
    if not 0 <= s <= e <= n:
        raise ShapeError(f"range [{s}, {e}) is outside axis {ax} of length {n}")
    out = list(ins[0].shape)
    out[ax] = e - s
    return tuple(out), ins[0].dtype


def _slice_ref(np, a, x):
    idx = [slice(None)] * x.ndim
    idx[a["axis"]] = slice(a["start"], a["stop"])
    return x[tuple(idx)]


defprim("slice", "layout", shape=_slice_shape, ref=_slice_ref,
        cost=Cost(no_flops, recompute=0, view=True, narrows=True),
        grad=lambda g, i, o, a: [_O().pad(g, a["axis"], a["start"],
                                          i[0].shape[a["axis"]] - a["stop"])])


def _pad_shape(ins, attrs):
    out = list(ins[0].shape)
    out[attrs["axis"]] += attrs["before"] + attrs["after"]
    return tuple(out), ins[0].dtype


def _pad_ref(np, a, x):
    w = [(0, 0)] * x.ndim
    w[a["axis"]] = (a["before"], a["after"])
    return np.pad(x, w)


defprim("pad", "layout", shape=_pad_shape, ref=_pad_ref, cost=SELECT,
        grad=lambda g, i, o, a: [_O().slice(g, a["axis"], a["before"],
                                            a["before"] + i[0].shape[a["axis"]])],
        doc="zero padding along one axis: the adjoint of slice")
