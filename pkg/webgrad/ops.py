"""Public ops: thin wrappers over the primitives plus the compositions built from them.

Composite ops (no rules of their own; autograd and codegen see only primitives):
  sum_last, sum_all, mean_last, mean_all, gelu (tanh form), silu, swap_axes, unsqueeze,
  slice_last_range, broadcast binary ops with Python numbers, where_causal,
  softmax_causal_last, take_along_last, dropout, rope, conv2d, max_pool2d, categorical.
Primitive ops are listed in webgrad.primitives (one module per family) with the reason
each one is primitive.
"""
from __future__ import annotations

import builtins
import math
from math import prod
from typing import Sequence

from .primitives import ShapeError, bind, conv_out_size
from .tensor import Tensor, at_user_line, current_graph


# ---------------------------------------------------------------- constants and lifting

def constant(value, *, dtype: str | None = None, shape: Sequence[int] | None = None) -> Tensor:
    """A value baked into the program: a Python number, or flat/nested data with `shape`."""
    if isinstance(value, (int, float)) and shape is None:
        dtype = dtype or ("i32" if isinstance(value, int) and not isinstance(value, bool) else "f32")
        value = float(value) if dtype == "f32" else int(value)
        shape = ()
    else:
        value, shape = _flatten(value, shape)
        dtype = dtype or "f32"
        value = tuple(float(v) if dtype == "f32" else int(v) for v in value)
    return bind("const", value=value, shape=tuple(shape), dtype=dtype)


def _flatten(value, shape):
    if hasattr(value, "tolist"):
        shape = shape or getattr(value, "shape", None)
        value = value.tolist()
    out, dims = [], []

    def walk(v, depth):
        if isinstance(v, (list, tuple)):
            if len(dims) <= depth:
                dims.append(len(v))
            for e in v:
                walk(e, depth + 1)
        else:
            out.append(v)
    walk(value, 0)
    shape = tuple(shape) if shape is not None else tuple(dims)
    if prod(shape) != len(out):
        raise ValueError(f"constant: {len(out)} values do not fill shape {list(shape)}")
    return out, shape


def _lift(x, like: Tensor | None = None) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        if hasattr(x, "item") and getattr(x, "ndim", None) == 0:  # numpy scalar
            return _lift(x.item(), like)
        raise TypeError(f"expected a Tensor or a Python number, got {type(x).__name__}" + at_user_line())
    dtype = like.dtype if like is not None and (like.dtype == "f32" or isinstance(x, int)) else "f32"
    return constant(x, dtype=dtype)


def _pair(a, b):
    if isinstance(a, Tensor):
        return a, _lift(b, a)
    if isinstance(b, Tensor):
        return _lift(a, b), b
    raise TypeError("at least one operand must be a Tensor")


# ---------------------------------------------------------------- elementwise

def add(a, b): return bind("add", *_pair(a, b))
def sub(a, b): return bind("sub", *_pair(a, b))
def mul(a, b): return bind("mul", *_pair(a, b))
def div(a, b): return bind("div", *_pair(a, b))
def maximum(a, b): return bind("maximum", *_pair(a, b))
def minimum(a, b): return bind("minimum", *_pair(a, b))
def less(a, b): return bind("less", *_pair(a, b))
def greater(a, b): return bind("greater", *_pair(a, b))
def equal(a, b): return bind("equal", *_pair(a, b))
# not 1 - greater(a, b): that is 1 where either operand is NaN (torch: False); two
# exclusive masks added fuse into one expression
def less_equal(a, b): return less(a, b) + equal(a, b)
def greater_equal(a, b): return greater(a, b) + equal(a, b)
def not_equal(a, b): return 1.0 - equal(a, b)  # NaN != NaN is true, as in torch
def neg(x): return bind("neg", x)
def exp(x): return bind("exp", x)
def log(x): return bind("log", x)
def sqrt(x): return bind("sqrt", x)
def rsqrt(x): return bind("rsqrt", x)
def tanh(x): return bind("tanh", x)
def sigmoid(x): return bind("sigmoid", x)
def relu(x): return bind("relu", x)
def erf(x): return bind("erf", x)
def abs(x): return bind("abs", x)
def sign(x): return bind("sign", x)
def sin(x): return bind("sin", x)
def cos(x): return bind("cos", x)


def pow(x, p):
    """x ** p, elementwise, as torch.pow: p a Python number (x ** 2 is a multiply) or a
    Tensor (broadcast against x; a negative base needs an integer exponent, else NaN)."""
    if isinstance(p, Tensor) or not isinstance(x, Tensor):
        x, p = _pair(x, p)
        return bind("power", x, p)
    if p == 1:
        return x
    if p == 2:
        return x * x
    return bind("pow", x, p=float(p))


def floor(x): return bind("floor", x)
def trunc(x): return bind("trunc", x)
def round(x): return bind("round", x)  # noqa: A001  (half to even, as torch.round)


def stop_gradient(x):
    """x, with no gradient flowing back through it (torch's x.detach())."""
    return bind("stop_gradient", x)


def cast(x, dtype: str): return x if x.dtype == dtype else bind("cast", x, dtype=dtype)


def where(cond, a, b):
    """Elementwise choice: a where cond != 0, else b (cond is an f32 mask, as from less)."""
    like = a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else None
    return bind("where", _lift(cond), _lift(a, like), _lift(b, like))


def gelu(x):
    """GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * (x * x * x))))


def silu(x): return x * sigmoid(x)


# ---------------------------------------------------------------- reductions

def _axis(x, axis):
    if not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"axis {axis} is out of range for {x.dtype}{list(x.shape)}"
                         + at_user_line())
    return axis % x.ndim


def sum(x, axes=None, *, keepdims=False):
    axes = tuple(range(x.ndim)) if axes is None else tuple(sorted(_axis(x, a) for a in (
        axes if isinstance(axes, (list, tuple)) else [axes])))
    out = bind("sum", x, axes=axes) if axes else x
    return reshape(out, tuple(1 if k in axes else d for k, d in enumerate(x.shape))) if keepdims else out


def sum_last(x, *, keepdims=False): return sum(x, -1, keepdims=keepdims)
def sum_all(x): return sum(x)
def mean_last(x, *, keepdims=False): return sum_last(x, keepdims=keepdims) * (1.0 / x.shape[-1])
def mean_all(x): return sum_all(x) * (1.0 / builtins.max(x.node.size, 1))


def max_last(x, *, keepdims=False):
    out = bind("max_last", x)
    return unsqueeze(out, -1) if keepdims else out


def argmax_last(x): return bind("argmax_last", x)

# ---- reductions over any axes: compositions that move the axes last and merge them, so
# that one max_last / argmax_last / sum does the work (a transpose is free in a kernel's
# prologue); ties share the gradient as in torch.amax


def _axes(x, axes) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(x.ndim))
    axes = axes if isinstance(axes, (list, tuple)) else [axes]
    out = tuple(sorted({_axis(x, a) for a in axes}))
    if len(out) != len(axes):
        raise ShapeError(f"axes {list(axes)} repeat an axis of {x.dtype}{list(x.shape)}"
                         + at_user_line())
    return out


def _to_last(x, axes):
    """x with `axes` moved last and merged into one: [kept..., prod(reduced)]."""
    kept = [k for k in range(x.ndim) if k not in axes]
    t = transpose(x, kept + list(axes))
    return reshape(t, tuple(x.shape[k] for k in kept) + (prod(x.shape[a] for a in axes),))


def _reduced_shape(x, axes, keepdims):
    return tuple(1 if k in axes else d for k, d in enumerate(x.shape)) if keepdims else \
        tuple(d for k, d in enumerate(x.shape) if k not in axes)


def mean(x, axes=None, *, keepdims=False):
    """Mean over `axes` (an int, a sequence, or None for all), as torch.mean."""
    ax = _axes(x, axes)
    n = prod(x.shape[a] for a in ax)
    return sum(x, ax, keepdims=keepdims) * (1.0 / n if n else math.nan)


def max(x, axes=None, *, keepdims=False):  # noqa: A001
    """Maximum over `axes` (int, sequence or None), as torch.amax: tied maxima share the
    gradient equally."""
    ax = _axes(x, axes)
    out = max_last(_to_last(x, ax)) if ax else x
    return reshape(out, _reduced_shape(x, ax, keepdims))


def min(x, axes=None, *, keepdims=False):  # noqa: A001
    """Minimum over `axes`, as torch.amin (-max(-x): ties share the gradient)."""
    return -max(-x, axes, keepdims=keepdims)


def logsumexp(x, axes=None, *, keepdims=False):
    """log(sum(exp(x))) over `axes`, shifted by the maximum so that it neither overflows
    nor underflows; as torch.logsumexp (an infinite maximum shifts by 0), and its gradient
    is exactly softmax(x) (the shift is a stop_gradient, not a cancellation)."""
    ax = _axes(x, axes)
    m = max(x, ax, keepdims=True)
    m = stop_gradient(where(equal(abs(m), math.inf), 0.0, m))
    out = log(sum(exp(x - m), ax, keepdims=True)) + m
    return reshape(out, _reduced_shape(x, ax, keepdims))


def argmax(x, axis=None, *, keepdims=False):
    """i32 index of the first maximum along `axis`, as torch.argmax; axis=None: the flat
    index over all elements."""
    if axis is None:
        out = argmax_last(reshape(x, (x.node.size,)))
        return reshape(out, (1,) * x.ndim) if keepdims else out
    a = _axis(x, axis)
    out = argmax_last(_to_last(x, (a,)))
    return reshape(out, _reduced_shape(x, (a,), keepdims))
def softmax_last(x): return bind("softmax_last", x)
def log_softmax_last(x): return bind("log_softmax_last", x)
def layer_norm_last(x, eps: float = 1e-5): return bind("layer_norm_last", x, eps=float(eps))


# ---------------------------------------------------------------- layout

def reshape(x, shape):
    shape = [int(s) for s in shape]
    if shape.count(-1) == 1:
        known = prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = x.node.size // known if known else 0
    shape = tuple(shape)
    return x if shape == x.shape else bind("reshape", x, shape=shape)


def transpose(x, perm=None):
    perm = tuple(reversed(range(x.ndim))) if perm is None else tuple(_axis(x, p) for p in perm)
    return x if perm == tuple(range(x.ndim)) else bind("transpose", x, perm=perm)


def swap_axes(x, a: int, b: int):
    perm = list(range(x.ndim))
    a, b = _axis(x, a), _axis(x, b)
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, perm)


def unsqueeze(x, axis: int):
    axis = axis % (x.ndim + 1)
    return reshape(x, x.shape[:axis] + (1,) + x.shape[axis:])


def broadcast_to(x, shape):
    x = _lift(x)
    shape = tuple(shape)
    return x if x.shape == shape else bind("broadcast_to", x, shape=shape)


def concat(xs, axis: int = -1):
    xs = list(xs)
    if len(xs) == 1:
        return xs[0]
    return bind("concat", *xs, axis=_axis(xs[0], axis))


def slice(x, axis: int, start: int, stop: int):
    axis = _axis(x, axis)
    if (start, stop) == (0, x.shape[axis]):
        return x
    return bind("slice", x, axis=axis, start=int(start), stop=int(stop))


def slice_last_range(x, start: int, stop: int): return slice(x, -1, start, stop)


def pad(x, axis: int, before: int, after: int):
    if before == after == 0:
        return x
    return bind("pad", x, axis=_axis(x, axis), before=int(before), after=int(after))


# ---------------------------------------------------------------- linear algebra

def matmul(a, b):
    """a @ b with batch broadcasting; a 1-D operand is lifted as in numpy."""
    a, b = _pair(a, b)
    if a.ndim == 1 and b.ndim == 1:
        return reshape(matmul(reshape(a, (1, -1)), reshape(b, (-1, 1))), ())
    if a.ndim == 1:
        out = matmul(reshape(a, (1, -1)), b)
        return reshape(out, out.shape[:-2] + out.shape[-1:])
    if b.ndim == 1:
        return reshape(matmul(a, reshape(b, (-1, 1))), a.shape[:-1])
    return bind("matmul", a, b)


matmul_batched = matmul


def dequantize(words, qtype: str, shape):
    """The f32 tensor of `shape` that quantized blocks encode: words is an i32 vector in
    webgrad.quants' word layout of GGUF's blocks of a type in quants.FORMATS (blocks along
    the last axis).
    Not differentiable. On WebGPU it is read in registers by its consumers (a matmul's
    operand, an embedding's rows): the f32 values are never stored."""
    return bind("dequantize", words, qtype=str(qtype), shape=tuple(int(s) for s in shape))


# ---------------------------------------------------------------- indices

def one_hot(idx, n: int): return bind("one_hot", idx, n=int(n))


def arange(n: int, dtype: str = "i32"): return bind("arange", n=int(n), dtype=dtype)


def embedding(table, idx, padding_idx: int | None = None):
    """Rows of table [V, D] picked by i32 indices of any shape -> idx.shape + [D].
    padding_idx: that row gets no gradient (torch's F.embedding(padding_idx=)); the row is
    still read as it is (nn.Embedding starts it at zeros)."""
    rows = bind("gather_rows", table, idx)
    if padding_idx is None:
        return rows
    V = table.shape[0]
    if not -V <= padding_idx < V:
        raise ShapeError(f"embedding: padding_idx {padding_idx} is outside a table of {V} rows"
                         + at_user_line())
    pad = unsqueeze(equal(idx, int(padding_idx) % V), -1)
    return where(pad, stop_gradient(rows), rows)


def gather_rows(table, idx):
    """Rows of table [V, D] by i32 index (embedding without its options)."""
    return bind("gather_rows", table, idx)


def scatter_add_rows(values, idx, n: int): return bind("scatter_add_rows", values, idx, n=int(n))


def write_rows(base, values, start):
    """base with rows start..start+T-1 replaced by values [T, ...]; start is an i32 Tensor (a
    feed: one program serves every position) or an int; rows past either end are dropped.
    Assigned back to a state buffer it is written in place (see webgrad/stateful.py)."""
    if not isinstance(start, Tensor):
        start = constant(int(start), dtype="i32")
    return bind("write_rows", base, values, start)


def take_along_last(x, idx):
    """out[..., k] = x[..., idx[..., k]] for i32 idx; as a one-hot contraction so that its
    gradient needs no scatter."""
    if idx.shape[:-1] != x.shape[:-1]:
        raise ShapeError(f"take_along_last: indices {list(idx.shape)} must match "
                         f"{list(x.shape)} except in the last axis" + at_user_line())
    return sum_last(unsqueeze(x, -2) * one_hot(idx, x.shape[-1]))


# ---------------------------------------------------------------- attention helpers

def causal_mask(t: int, s: int | None = None):
    """f32 [t, s] mask, 1 where key j <= query i (+ offset s - t for a cache)."""
    s = t if s is None else s
    rows = reshape(cast(arange(t), "f32"), (t, 1)) + float(s - t)
    return greater_equal(rows, reshape(cast(arange(s), "f32"), (1, s)))


def where_causal(x, fill: float = -1e9):
    """Keep x[..., i, j] for j <= i, put `fill` above the diagonal."""
    return where(causal_mask(x.shape[-2], x.shape[-1]), x, fill)


def softmax_causal_last(x): return softmax_last(where_causal(x, -1e30))


def rope(x, *, base: float = 10000.0, offset: int = 0):
    """Rotary position embedding on [..., T, D] (D even), rotate-half convention."""
    t, d = x.shape[-2], x.shape[-1]
    if d % 2:
        raise ShapeError(f"rope: the last axis must be even, got {list(x.shape)}")
    half = d // 2
    freqs = [base ** (-2.0 * k / d) for k in range(half)]
    ang = [[(p + offset) * f for f in freqs] for p in range(t)]
    cos_t = constant([[math.cos(a) for a in row] * 2 for row in ang])
    sin_t = constant([[math.sin(a) for a in row] * 2 for row in ang])
    x1, x2 = slice(x, -1, 0, half), slice(x, -1, half, d)
    return x * cos_t + concat([-x2, x1], -1) * sin_t


# ---------------------------------------------------------------- randomness

def _step_counter():
    g = current_graph()
    if "step" not in g.state:
        raise RuntimeError("random ops need the step counter, which compile_module provides")
    return Tensor(g, g.state["step"])


def rand_uniform(shape, *, seed: int = 0):
    """Uniform [0, 1) numbers, new every step (the step counter keys the generator)."""
    g = current_graph()
    # distinct per call site (its position in the graph), per user seed and per compile seed
    salt = (int(seed) * 0x9E3779B1 + g.seed * 0x85EBCA77 + len(g.nodes)) & 0xFFFFFFFF
    return bind("rand_uniform", _step_counter(), shape=tuple(shape), seed=salt)


def dropout(x, p: float, *, seed: int = 0):
    """Inverted dropout: zero each element with probability p, scale the rest by 1/(1-p).
    In training graphs only: compile_forward builds inference graphs, where it is the identity."""
    if not 0 <= p < 1:
        raise ValueError(f"dropout: p must be in [0, 1), got {p}")
    if p == 0 or not current_graph().training:  # inference graphs (compile_forward) keep all
        return x
    keep = greater_equal(rand_uniform(x.shape, seed=seed), p)
    return x * keep * (1.0 / (1.0 - p))


def categorical(logits, *, temperature: float = 1.0, seed: int = 0):
    """Sample i32 indices from softmax(logits / temperature) along the last axis
    (Gumbel-max: argmax(logits / T - log(-log u)))."""
    u = rand_uniform(logits.shape, seed=seed) * (1 - 2 ** -23) + 2 ** -25
    return argmax_last(logits * (1.0 / temperature) - log(-log(u)))


# ---------------------------------------------------------------- convolution

def _two(v):
    return (int(v), int(v)) if isinstance(v, int) else tuple(int(e) for e in v)


def unfold2d(x, *, kernel, stride=1, padding=0, dilation=1, ceil: bool = False,
             pad_value: float = 0.0):
    """Sliding windows [N,C,H,W] -> [N,C,kh*kw,OH*OW] (im2col), pad_value outside."""
    if x.ndim != 4:
        raise ShapeError(f"unfold2d: expects an [N, C, H, W] input, got {x.dtype}{list(x.shape)}"
                         + at_user_line())
    attrs = dict(kernel=_two(kernel), stride=_two(stride), padding=_two(padding),
                 pad_value=float(pad_value))
    if _two(dilation) != (1, 1) or ceil:  # the common case keeps the short IR text
        attrs.update(dilation=_two(dilation), ceil=bool(ceil))
    return bind("unfold2d", x, **attrs)


def fold2d(g, *, size, kernel, stride, padding, dilation=1, ceil: bool = False):
    attrs = dict(size=tuple(size), kernel=_two(kernel), stride=_two(stride),
                 padding=_two(padding))
    if _two(dilation) != (1, 1) or ceil:
        attrs.update(dilation=_two(dilation), ceil=bool(ceil))
    return bind("fold2d", g, **attrs)


def _need_rank(op, x, rank, layout, w=None):
    if not isinstance(x, Tensor) or x.ndim != rank:
        got = f"{x.dtype}{list(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
        raise ShapeError(f"{op}: expects {w or 'an input'} of rank {rank} {layout}, got {got}"
                         + at_user_line())


def conv2d(x, w, b=None, *, stride=1, padding=0, dilation=1, groups: int = 1):
    """x [N,C,H,W] * w [O, C/groups, kh, kw] (+ b [O]) -> [N,O,OH,OW], as im2col + matmul;
    dilation spaces the kernel taps (torch's F.conv2d)."""
    _need_rank("conv2d", x, 4, "[N, C, H, W]")
    _need_rank("conv2d", w, 4, "[O, C/groups, kh, kw]", "a weight")
    N, C, H, W = x.shape
    O, Cg, kh, kw = w.shape
    if C % groups or O % groups or Cg != C // groups:
        raise ShapeError(f"conv2d: input {list(x.shape)} and weight {list(w.shape)} do not "
                         f"agree with groups={groups} (weight axis 1 must be C/groups)"
                         + at_user_line())
    cols = unfold2d(x, kernel=(kh, kw), stride=stride, padding=padding, dilation=dilation)
    P = cols.shape[-1]
    cols = reshape(cols, (N, groups, Cg * kh * kw, P))
    wm = reshape(w, (groups, O // groups, Cg * kh * kw))
    out = matmul(wm, cols)  # [N, G, O/G, P]
    (sh, sw), (ph, pw), (dh, dw) = _two(stride), _two(padding), _two(dilation)
    out = reshape(out, (N, O, conv_out_size(H, kh, sh, ph, dh), conv_out_size(W, kw, sw, pw, dw)))
    return out if b is None else out + reshape(b, (O, 1, 1))


def max_pool2d(x, kernel, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False):
    """torch's F.max_pool2d on [N, C, H, W]. The gradient goes to one maximal element per
    window (the first, in window order), as torch's does, where max(..) would share it
    among ties. return_indices: also the i32 flat index (y * W + x) of each maximum."""
    _need_rank("max_pool2d", x, 4, "[N, C, H, W]")
    N, C, H, W = x.shape
    kh, kw = _two(kernel)
    (sh, sw), (ph, pw) = _two(stride if stride is not None else kernel), _two(padding)
    dh, dw = _two(dilation)
    cols = swap_axes(unfold2d(x, kernel=(kh, kw), stride=(sh, sw), padding=(ph, pw),
                              dilation=(dh, dw), ceil=ceil_mode, pad_value=float("-inf")),
                     -1, -2)  # [N, C, P, k]
    at = argmax_last(cols)   # the first maximum of each window
    out = sum_last(where(one_hot(at, kh * kw), cols, 0.0))  # a select, so -inf * 0 never forms
    oh = conv_out_size(H, kh, sh, ph, dh, ceil_mode)
    ow = conv_out_size(W, kw, sw, pw, dw, ceil_mode)
    out = reshape(out, (N, C, oh, ow))
    if not return_indices:
        return out
    # window tap (i, j) of output (oy, ox) reads pixel (oy*sh + i*dh - ph, ox*sw + j*dw - pw)
    i = div(at, kw)
    j = at - i * kw
    y0 = constant([oy * sh - ph for oy in range(oh) for _ in range(ow)], dtype="i32")
    x0 = constant([ox * sw - pw for _ in range(oh) for ox in range(ow)], dtype="i32")
    flat = (y0 + i * dh) * W + x0 + j * dw
    return out, reshape(flat, (N, C, oh, ow))


# ---------------------------------------------------------------- captures

def capture(name: str, x: Tensor) -> Tensor:
    """Expose an activation: run/step(with_captures=True) return it under `name`."""
    g = current_graph()
    key = f"capture:{name}"
    if key in g.outputs:
        raise ValueError(f"capture name {name!r} is used twice; names must be unique")
    g.outputs[key] = x.id
    return x


__all__ = [n for n in dir() if not n.startswith("_") and n not in (
    "annotations", "builtins", "math", "prod", "Sequence", "Tensor", "bind", "conv_out_size", "current_graph",
    "at_user_line")]
