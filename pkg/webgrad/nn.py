"""Ready-made modules and losses, written with webgrad.ops.

Leaf modules expose `.fwd(x)` (also callable as `m(x)`), as tensorgrad's do; a model's own
blocks are usually free functions `block(p, x)` over their Module.
"""
from __future__ import annotations

from . import init, ops
from .module import Module
from .primitives import ShapeError
from .tensor import Tensor, at_user_line


class Linear(Module):
    """y = x @ W + b with W [d_in, d_out] (kaiming init, as tensorgrad's samples use)."""

    def __init__(self, d_in: int, d_out: int, *, bias: bool = True, init_w=None):
        super().__init__()
        self.W = self.param([d_in, d_out], init=init_w or init.kaiming())
        self.b = self.param([d_out], init="zeros") if bias else None

    def fwd(self, x):
        y = ops.matmul(x, self.W)
        return y if self.b is None else y + self.b

    __call__ = fwd


class LayerNorm(Module):
    def __init__(self, dim: int, *, eps: float = 1e-5, affine: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = self.param([dim], init="ones") if affine else None
        self.bias = self.param([dim], init="zeros") if affine else None

    def fwd(self, x):
        y = ops.layer_norm_last(x, self.eps)
        return y if self.weight is None else y * self.weight + self.bias

    __call__ = fwd


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) * weight."""

    def __init__(self, dim: int, *, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = self.param([dim], init="ones")

    def fwd(self, x):
        return x * ops.rsqrt(ops.mean_last(x * x, keepdims=True) + self.eps) * self.weight

    __call__ = fwd


class Embedding(Module):
    """Rows of W [n, dim] by i32 index. padding_idx: that row starts at zeros and gets no
    gradient (torch's nn.Embedding(padding_idx=))."""

    def __init__(self, n: int, dim: int, *, padding_idx: int | None = None, init_w=None):
        super().__init__()
        if padding_idx is not None and not -n <= padding_idx < n:
            raise ValueError(f"Embedding: padding_idx {padding_idx} is outside [-{n}, {n})")
        self.padding_idx = padding_idx
        w_init = init_w or init.randn(0.02)
        if padding_idx is not None:
            w_init = init.with_zero_rows(w_init, [padding_idx])
        self.W = self.param([n, dim], init=w_init)

    def fwd(self, idx):
        return ops.embedding(self.W, idx, padding_idx=self.padding_idx)

    __call__ = fwd


class Conv2d(Module):
    """[N, C, H, W] -> [N, O, OH, OW]; weight [O, C/groups, k, k] (torch's layout)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, *, stride=1, padding=0, dilation=1,
                 groups=1, bias: bool = True):
        super().__init__()
        k = (kernel, kernel) if isinstance(kernel, int) else tuple(kernel)
        self.stride, self.padding, self.groups = stride, padding, groups
        self.dilation = dilation
        self.weight = self.param([c_out, c_in // groups, *k], init=init.kaiming())
        self.bias = self.param([c_out], init="zeros") if bias else None

    def fwd(self, x):
        return ops.conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding,
                          dilation=self.dilation, groups=self.groups)

    __call__ = fwd


def _rank(op, x, rank, layout):
    if not isinstance(x, Tensor) or x.ndim != rank:
        got = f"{x.dtype}{list(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
        raise ShapeError(f"{op}: expects a rank-{rank} {layout} input, got {got}" + at_user_line())


def split_heads(x, n_heads: int):
    """[B, T, D] -> [B, H, T, D/H]."""
    _rank("split_heads", x, 3, "[B, T, D]")
    B, T, D = x.shape
    if D % n_heads:
        raise ShapeError(f"split_heads: width {D} of {x.dtype}{list(x.shape)} is not divisible "
                         f"by {n_heads} heads" + at_user_line())
    return ops.transpose(ops.reshape(x, (B, T, n_heads, D // n_heads)), (0, 2, 1, 3))


def merge_heads(x):
    """[B, H, T, Dh] -> [B, T, H*Dh]."""
    _rank("merge_heads", x, 4, "[B, H, T, Dh]")
    B, H, T, Dh = x.shape
    return ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (B, T, H * Dh))


def cross_entropy_last(logits, targets):
    """Mean over positions of -log softmax(logits)[target]; targets are i32, logits [..., V]."""
    logp = ops.log_softmax_last(logits)
    picked = ops.take_along_last(logp, ops.unsqueeze(targets, -1))
    return -ops.mean_all(picked)


def mse(pred, target):
    d = pred - target
    return ops.mean_all(d * d)
