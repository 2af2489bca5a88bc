"""Elementwise primitives: unary math, binary arithmetic and comparisons, where, cast and
stop_gradient.

Each is an expression (lowering "expr"): codegen/elementwise.py has its WGSL rule and fusion
evaluates it inside whichever kernel reads it. Their grad rules are written with webgrad.ops,
so a backward pass is traced into the same IR. NUMPY_DTYPES (webgrad's dtype names to numpy's)
is read by the reference backend.
"""
from __future__ import annotations

import math

from .registry import (COSTLY, ELEMENT, FREE, ShapeError, broadcast_shapes, defprim,
                       ops_module as _O, same_dtype, unary_f32)


def _binary(ins, attrs):
    return broadcast_shapes(ins[0].shape, ins[1].shape), same_dtype(ins)


def _compare(ins, attrs):
    return broadcast_shapes(ins[0].shape, ins[1].shape), (same_dtype(ins) and "f32")


def _unary(name, cost, ref, grad, doc=""):
    defprim(name, "elementwise", shape=unary_f32, ref=ref, grad=grad, cost=cost, doc=doc)


def _erf_ref(np, a, x):
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


_unary("neg", ELEMENT, lambda np, a, x: -x, lambda g, i, o, a: [-g])
_unary("exp", COSTLY, lambda np, a, x: np.exp(x), lambda g, i, o, a: [g * o])          # d e^x = e^x dx
_unary("log", COSTLY, lambda np, a, x: np.log(x), lambda g, i, o, a: [g / i[0]])       # d log x = dx / x
_unary("sqrt", COSTLY, lambda np, a, x: np.sqrt(x), lambda g, i, o, a: [g / (2 * o)])  # d sqrt x = dx / (2 sqrt x)
_unary("rsqrt", COSTLY, lambda np, a, x: 1 / np.sqrt(x),
       lambda g, i, o, a: [g * (-0.5) * o * o * o])                            # d x^-1/2 = -1/2 x^-3/2 dx
_unary("tanh", COSTLY, lambda np, a, x: np.tanh(x), lambda g, i, o, a: [g * (1 - o * o)])  # d tanh = 1 - tanh^2
_unary("sigmoid", COSTLY, lambda np, a, x: (1 / (1 + np.exp(-x))).astype(x.dtype),
       lambda g, i, o, a: [g * o * (1 - o)],                                   # d s = s (1 - s) dx
       doc="primitive rather than 1/(1+exp(-x)): one kernel and no inf/inf for large |x|")
_unary("relu", ELEMENT, lambda np, a, x: np.maximum(x, 0),
       # relu'(0) = 0, as torch: written as a mask, not through maximum's tie rule
       lambda g, i, o, a: [g * _O().greater(i[0], 0.0)])
_unary("erf", COSTLY, _erf_ref,
       lambda g, i, o, a: [g * (2 / math.sqrt(math.pi)) * _O().exp(-(i[0] * i[0]))],  # d erf = 2/sqrt(pi) e^{-x^2}
       doc="no composition of exp/tanh gives erf to f32 accuracy")
_unary("abs", ELEMENT, lambda np, a, x: np.abs(x), lambda g, i, o, a: [g * _O().sign(i[0])])
# sign(NaN) = 0, as torch (numpy says NaN)
_unary("sign", ELEMENT, lambda np, a, x: np.where(np.isnan(x), np.zeros_like(x), np.sign(x)), None)
_unary("sin", COSTLY, lambda np, a, x: np.sin(x), lambda g, i, o, a: [g * _O().cos(i[0])])
_unary("cos", COSTLY, lambda np, a, x: np.cos(x), lambda g, i, o, a: [-g * _O().sin(i[0])])
# x ** p for a Python number p (attrs: p); d x^p = p x^(p-1) dx
_unary("pow", COSTLY, lambda np, a, x: np.power(x, np.asarray(a["p"], x.dtype)),
       lambda g, i, o, a: [g * a["p"] * _O().pow(i[0], a["p"] - 1)] if a["p"] != 0 else [None])


# rounding: piecewise constant, so the gradient is zero (torch's too); round is half to
# even, as torch.round, numpy and WGSL's round
_unary("floor", ELEMENT, lambda np, a, x: np.floor(x), lambda g, i, o, a: [None])
_unary("trunc", ELEMENT, lambda np, a, x: np.trunc(x), lambda g, i, o, a: [None])
_unary("round", ELEMENT, lambda np, a, x: np.round(x), lambda g, i, o, a: [None])


def _identity_shape(ins, attrs):
    return ins[0].shape, ins[0].dtype


defprim("stop_gradient", "elementwise", shape=_identity_shape, ref=lambda np, a, x: x,
        grad=lambda g, i, o, a: [None], cost=ELEMENT,
        doc="the identity whose gradient is zero (torch's detach): padding rows of an "
            "embedding, the shift of logsumexp")


def _bin(name, cost, ref, grad, shape=_binary):
    defprim(name, "elementwise", shape=shape, ref=ref, grad=grad, cost=cost)


_bin("add", ELEMENT, lambda np, a, x, y: x + y, lambda g, i, o, a: [g, g])
_bin("sub", ELEMENT, lambda np, a, x, y: x - y, lambda g, i, o, a: [g, -g])
_bin("mul", ELEMENT, lambda np, a, x, y: x * y, lambda g, i, o, a: [g * i[1], g * i[0]])
_bin("div", COSTLY, lambda np, a, x, y: (x / y) if x.dtype.kind == "f" else np.trunc(x / y).astype(x.dtype),
     lambda g, i, o, a: [g / i[1], -g * o / i[1]])                             # d(x/y) = dx/y - x dy/y^2


def _minmax_grad(first_wins):
    # torch's rule: the larger (smaller) operand takes the gradient; on a tie each gets half
    def grad(g, i, o, a):
        O = _O()
        win = O.greater(i[0], i[1]) if first_wins else O.less(i[0], i[1])
        m = win + 0.5 * O.equal(i[0], i[1])
        return [g * m, g * (1 - m)]
    return grad


_bin("maximum", ELEMENT, lambda np, a, x, y: np.maximum(x, y), _minmax_grad(True))
_bin("minimum", ELEMENT, lambda np, a, x, y: np.minimum(x, y), _minmax_grad(False))


def _power_shape(ins, attrs):
    if ins[0].dtype != "f32" or ins[1].dtype != "f32":
        raise ShapeError("needs f32 base and exponent; convert with ops.cast(x, 'f32')")
    return _binary(ins, attrs)


def _power_grad(g, i, o, a):
    # d x^y = y x^(y-1) dx + x^y log(x) dy; torch's conventions at the edges: no dx where
    # y = 0, no dy where x = 0 and y >= 0 (0^y is flat in y there)
    O = _O()
    x, y = i
    dx = O.where(O.equal(y, 0.0), 0.0, g * y * O.pow(x, y - 1.0))
    dy = O.where(O.equal(x, 0.0) * O.greater_equal(y, 0.0), 0.0, g * o * O.log(x))
    return [dx, dy]


_bin("power", ELEMENT, lambda np, a, x, y: np.power(x, y), _power_grad, _power_shape)

_bin("less", ELEMENT, lambda np, a, x, y: (x < y).astype("float32"), None, _compare)
_bin("greater", ELEMENT, lambda np, a, x, y: (x > y).astype("float32"), None, _compare)
_bin("equal", ELEMENT, lambda np, a, x, y: (x == y).astype("float32"), None, _compare)


def _where_shape(ins, attrs):
    c, x, y = ins
    if c.dtype != "f32":
        raise ShapeError("the condition must be an f32 mask (nonzero = true), as comparisons return")
    return broadcast_shapes(c.shape, x.shape, y.shape), same_dtype([x, y])


defprim("where", "elementwise", shape=_where_shape,
        ref=lambda np, a, c, x, y: np.where(c != 0, x, y),
        grad=lambda g, i, o, a: [None, _O().where(i[0], g, 0.0), _O().where(i[0], 0.0, g)],
        cost=ELEMENT)


NUMPY_DTYPES = {"f32": "float32", "i32": "int32", "f16": "float16"}


def _cast_shape(ins, attrs):
    if attrs["dtype"] not in NUMPY_DTYPES:
        raise ShapeError(f"unknown dtype {attrs['dtype']!r}; use 'f32', 'f16' or 'i32'")
    if attrs["dtype"] == "f16" and ins[0].dtype == "i32":
        raise ShapeError("i32 -> f16 is not a cast webgrad has; go through f32 "
                         "(ops.cast(ops.cast(x, 'f32'), 'f16'))")
    return ins[0].shape, attrs["dtype"]


def _cast_ref(np, a, x):
    # f32 -> f16 rounds to nearest even, overflowing to +-inf past 65504 (IEEE, as WGSL's
    # f16() and torch's .half()); f16 -> f32 is exact
    with np.errstate(over="ignore"):
        return x.astype(NUMPY_DTYPES[a["dtype"]])


# the gradient of a float value is an f32 value whatever the value's storage (grad.py), so
# a cast between f32 and f16 passes it through unchanged
defprim("cast", "elementwise", shape=_cast_shape, ref=_cast_ref, cost=FREE,
        grad=lambda g, i, o, a: [g if i[0].dtype != "i32" and o.dtype != "i32" else None])
