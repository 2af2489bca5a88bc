"""Reduction primitives: sum over axes, max and argmax of the last axis (kernels of kind
"reduce"), and the row ops softmax, log-softmax and layer norm (kind "row").

codegen/reduce.py builds both kinds. The row ops are primitives for one kernel over a row and
for numerical stability (each row's doc says which).
"""
from __future__ import annotations

from math import prod

from .registry import (F16_MATH, REDUCE, ROW, ShapeError, defprim, ops_module as _O,
                       unary_f32)


def _last_axis(ins, attrs):
    if not ins[0].shape:
        raise ShapeError("needs at least one axis")
    return unary_f32(ins, attrs)


def _nonempty_last(ins, attrs):
    # the max of nothing has no value (torch and numpy refuse it too)
    x = ins[0]
    if x.shape and x.shape[-1] == 0 and prod(x.shape[:-1]) > 0:
        raise ShapeError("reduces an empty last axis, which has no maximum")
    return _last_axis(ins, attrs)


def _sum_shape(ins, attrs):
    x = ins[0]
    axes = attrs["axes"]
    if len(set(axes)) != len(axes) or any(not 0 <= ax < len(x.shape) for ax in axes):
        raise ShapeError(f"bad axes {list(axes)} for rank {len(x.shape)}")
    if x.dtype == "f16":
        raise ShapeError(F16_MATH)
    return tuple(d for k, d in enumerate(x.shape) if k not in axes), x.dtype


def _sum_grad(g, i, o, a):
    O = _O()
    x = i[0]
    keep = tuple(1 if k in a["axes"] else d for k, d in enumerate(x.shape))
    return [O.broadcast_to(O.reshape(g, keep), x.shape)]


defprim("sum", "reduce", shape=_sum_shape, grad=_sum_grad, cost=REDUCE, lowering="reduce",
        ref=lambda np, a, x: np.sum(x, axis=tuple(a["axes"]), dtype=x.dtype))


def _max_grad(g, i, o, a):
    # torch.amax's rule: the gradient is shared equally by all the maximal elements,
    # dx = g * [x == max] / #{x == max} (max_pool2d routes it to one element instead)
    O = _O()
    hit = O.equal(i[0], O.unsqueeze(o, -1))
    return [O.unsqueeze(g, -1) * hit / O.sum_last(hit, keepdims=True)]


defprim("max_last", "reduce", shape=lambda ins, a: (_nonempty_last(ins, a)[0][:-1], "f32"),
        ref=lambda np, a, x: np.max(x, axis=-1), grad=_max_grad, cost=REDUCE, lowering="reduce")
defprim("argmax_last", "reduce", shape=lambda ins, a: (_nonempty_last(ins, a)[0][:-1], "i32"),
        ref=lambda np, a, x: np.argmax(x, axis=-1).astype("int32"), grad=None, cost=REDUCE,
        lowering="reduce")


def _softmax_ref(np, a, x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def _log_softmax_ref(np, a, x):
    z = x - np.max(x, axis=-1, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def _softmax_grad(g, i, o, a):
    # dx = y * (g - sum(g * y))
    O = _O()
    return [o * (g - O.sum_last(g * o, keepdims=True))]


def _log_softmax_grad(g, i, o, a):
    # dx = g - softmax(x) * sum(g)
    O = _O()
    return [g - O.exp(o) * O.sum_last(g, keepdims=True)]


defprim("softmax_last", "reduce", shape=_last_axis, ref=_softmax_ref, grad=_softmax_grad,
        cost=ROW, lowering="row",
        doc="primitive: max-subtracted and one kernel; the composition needs 4 passes")
defprim("log_softmax_last", "reduce", shape=_last_axis, ref=_log_softmax_ref,
        grad=_log_softmax_grad, cost=ROW, lowering="row",
        doc="primitive: log(softmax) underflows to -inf")


def _layer_norm_ref(np, a, x):
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return ((x - mu) / np.sqrt(var + np.asarray(a["eps"], x.dtype))).astype(x.dtype)


def _layer_norm_grad(g, i, o, a):
    # xhat = (x - mu) * r, r = (var + eps)^-1/2:  dx = r * (g - mean(g) - xhat * mean(g * xhat))
    O = _O()
    x = i[0]
    xc = x - O.mean_last(x, keepdims=True)
    r = O.rsqrt(O.mean_last(xc * xc, keepdims=True) + a["eps"])
    return [r * (g - O.mean_last(g, keepdims=True) - o * O.mean_last(g * o, keepdims=True))]


defprim("layer_norm_last", "reduce", shape=_last_axis, ref=_layer_norm_ref,
        grad=_layer_norm_grad, cost=ROW, lowering="row",
        doc="normalisation without affine; primitive so that the forward is one kernel "
            "(mean, variance and scale in one pass over a row)")
