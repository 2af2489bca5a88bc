"""Optimizers, appended into the IR after the backward pass.

An optimizer is plain data (hyper-parameters and schedules) with one method,
`apply(ctx)`, that traces the update with webgrad.ops. This is the extension point for
user optimizers (see RMSProp in tests/test_optim.py):

    class RMSProp(optim.Optimizer):
        def __init__(self, lr=0.01, alpha=0.99, eps=1e-8):
            super().__init__(lr); self.alpha, self.eps = alpha, eps
        def apply(self, ctx):
            lr = ctx.lr()                          # lr(t) as a scalar Tensor
            for p in ctx.params:                   # p.name, p.value, p.grad, p.decays
                v = ctx.state(f"v.{p.name}", p.value.shape)   # persistent, starts at 0
                v2 = self.alpha * v + (1 - self.alpha) * p.grad * p.grad
                ctx.assign(v, v2)                  # written back after the step
                ctx.assign(p.value, p.value - lr * p.grad / (ops.sqrt(v2) + self.eps))

`ctx.step` is the number of updates done before this one (an f32 scalar Tensor). Every
update reads the values from before the step; assignments land after the whole graph ran.
Gradient clipping by global norm (`clip_norm=`) is applied by the base class before `apply`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import ops
from .ir import Graph
from .lr import Schedule, as_schedule
from .primitives import bind
from .tensor import at_user_line
from .tensor import Tensor

STATE_PREFIX = "opt/"


@dataclass
class ParamSlot:
    name: str
    value: Tensor
    grad: Tensor
    decays: bool


class OptimizerContext:
    def __init__(self, graph: Graph, params: list[ParamSlot], step: Tensor, schedule: Schedule):
        self.graph, self.params, self.step, self._schedule = graph, params, step, schedule

    def lr(self, schedule=None) -> Tensor:
        return as_schedule(schedule if schedule is not None else self._schedule).tensor(self.step)

    def state(self, name: str, shape) -> Tensor:
        """A persistent f32 buffer owned by the optimizer, zero at start and after
        reset_optimizer_state()."""
        return bind("state", name=STATE_PREFIX + name, shape=tuple(shape), dtype="f32")

    def assign(self, target: Tensor, value: Tensor) -> None:
        node = target.node
        if node.op not in ("param", "state"):
            raise ValueError("assign() targets a parameter (p.value) or a ctx.state() buffer")
        value = ops.broadcast_to(value, node.shape)
        name = node.attrs["name"]
        if name in self.graph.writebacks:
            raise ValueError(f"{name!r} is assigned twice in one step")
        self.graph.writebacks[name] = value.id


def _check_nonnegative(kind: str, **values) -> None:
    """torch.optim's rule for eps, weight_decay, momentum, dampening: a number >= 0."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
            raise ValueError(f"optim.{kind}: {name} must be a finite number >= 0, got {v!r}"
                             + at_user_line())


class Optimizer:
    def __init__(self, lr=1e-3, *, clip_norm: float | None = None):
        if isinstance(lr, (int, float)):
            _check_nonnegative(type(self).__name__, lr=lr)
        self.lr = as_schedule(lr)
        if clip_norm is not None and (isinstance(clip_norm, bool) or not isinstance(clip_norm, (int, float))
                                      or not (math.isfinite(clip_norm) and clip_norm > 0)):
            raise ValueError(f"optim.{type(self).__name__}: clip_norm must be a number > 0 (or None), "
                             f"got {clip_norm!r}" + at_user_line())
        self.clip_norm = clip_norm

    def apply(self, ctx: OptimizerContext) -> None:
        raise NotImplementedError("an optimizer overrides apply(ctx)")

    def append(self, ctx: OptimizerContext) -> None:
        if self.clip_norm is not None:
            clip_by_global_norm(ctx.params, self.clip_norm)
        self.apply(ctx)


def clip_by_global_norm(params: list[ParamSlot], max_norm: float) -> Tensor:
    """Scale all gradients by min(1, max_norm / (||g||_2 + 1e-6)) (torch's clip_grad_norm_)."""
    total = None
    for p in params:
        s = ops.sum_all(p.grad * p.grad)
        total = s if total is None else total + s
    coef = ops.minimum(max_norm / (ops.sqrt(total) + 1e-6), 1.0)
    for p in params:
        p.grad = p.grad * coef
    return coef


def _power(b: float, t):
    """b^t for a traced step count t >= 1, as exp(t log b); b = 0 (torch accepts beta1 = 0:
    no momentum) has no logarithm, and 0^t = 0 for every t >= 1."""
    return ops.exp(t * math.log(b)) if b > 0 else t * 0.0


def _check_betas(kind: str, betas) -> tuple[float, float]:
    """torch's rule: 0 <= beta < 1 for each; said at the user's line, not deep in tracing."""
    try:
        b = tuple(float(x) for x in betas)
    except (TypeError, ValueError):
        b = ()
    if len(b) != 2 or not all(0.0 <= x < 1.0 for x in b):
        raise ValueError(f"optim.{kind}: betas must be two numbers in [0, 1), got {betas!r}"
                         + at_user_line())
    return b


class Adam(Optimizer):
    """Adam with bias correction. weight_decay adds wd * p to the gradient of decaying
    params (torch.optim.Adam's L2 form); AdamW decouples it."""

    decoupled = False

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, clip_norm=None):
        super().__init__(lr, clip_norm=clip_norm)
        self.betas = _check_betas(type(self).__name__, betas)
        _check_nonnegative(type(self).__name__, eps=eps, weight_decay=weight_decay)
        self.eps, self.weight_decay = float(eps), float(weight_decay)

    def apply(self, ctx):
        b1, b2 = self.betas
        lr = ctx.lr()
        t1 = ctx.step + 1.0
        bc1 = 1.0 - _power(b1, t1)  # 1 - b1^t
        bc2 = 1.0 - _power(b2, t1)
        step_size = lr / bc1
        inv_sqrt_bc2 = ops.rsqrt(bc2)
        for p in ctx.params:
            g, w = p.grad, p.value
            wd = self.weight_decay if p.decays else 0.0
            if wd and not self.decoupled:
                g = g + wd * w
            if wd and self.decoupled:
                w = w * (1.0 - lr * wd)
            m = ctx.state(f"adam.m.{p.name}", w.shape)
            v = ctx.state(f"adam.v.{p.name}", w.shape)
            m2 = b1 * m + (1 - b1) * g
            v2 = b2 * v + (1 - b2) * g * g
            ctx.assign(m, m2)
            ctx.assign(v, v2)
            ctx.assign(p.value, w - step_size * m2 / (ops.sqrt(v2) * inv_sqrt_bc2 + self.eps))


class AdamW(Adam):
    """Adam with decoupled weight decay: p <- p (1 - lr wd) before the Adam step."""

    decoupled = True

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, *, clip_norm=None):
        super().__init__(lr, betas, eps, weight_decay, clip_norm=clip_norm)


class SGD(Optimizer):
    """SGD with optional momentum, dampening, Nesterov and L2 weight decay (torch.optim.SGD)."""

    def __init__(self, lr=1e-2, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0,
                 *, clip_norm=None):
        super().__init__(lr, clip_norm=clip_norm)
        _check_nonnegative("SGD", momentum=momentum, dampening=dampening, weight_decay=weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("optim.SGD: nesterov=True needs momentum > 0 and dampening 0 (as "
                             f"torch.optim.SGD), got momentum={momentum!r}, dampening={dampening!r}"
                             + at_user_line())
        self.momentum, self.dampening, self.nesterov = float(momentum), float(dampening), nesterov
        self.weight_decay = float(weight_decay)

    def apply(self, ctx):
        lr = ctx.lr()
        for p in ctx.params:
            g = p.grad
            if self.weight_decay and p.decays:
                g = g + self.weight_decay * p.value
            if self.momentum:
                buf = ctx.state(f"sgd.buf.{p.name}", p.value.shape)
                b2 = self.momentum * buf + (1 - self.dampening) * g
                if self.dampening:  # torch starts the buffer at g itself, undamped
                    b2 = ops.where(ops.equal(ctx.step, 0.0), g, b2)
                ctx.assign(buf, b2)
                g = g + self.momentum * b2 if self.nesterov else b2
            ctx.assign(p.value, p.value - lr * g)


class Lion(Optimizer):
    """Lion: p <- p (1 - lr wd) - lr sign(b1 m + (1 - b1) g);  m <- b2 m + (1 - b2) g."""

    def __init__(self, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, *, clip_norm=None):
        super().__init__(lr, clip_norm=clip_norm)
        _check_nonnegative("Lion", weight_decay=weight_decay)
        self.betas, self.weight_decay = _check_betas("Lion", betas), float(weight_decay)

    def apply(self, ctx):
        b1, b2 = self.betas
        lr = ctx.lr()
        for p in ctx.params:
            w = p.value
            if self.weight_decay and p.decays:
                w = w * (1.0 - lr * self.weight_decay)
            m = ctx.state(f"lion.m.{p.name}", w.shape)
            ctx.assign(p.value, w - lr * ops.sign(b1 * m + (1 - b1) * p.grad))
            ctx.assign(m, b2 * m + (1 - b2) * p.grad)
