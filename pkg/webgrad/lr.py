"""Learning-rate schedules as plain data, evaluated inside the compiled program.

A schedule is a frozen dataclass (`to_dict`/`from_dict` carry it across a worker
boundary). `schedule.tensor(t)` traces lr(t) into the IR from the step counter t (the
number of updates done before this one), so the runtime only advances the counter; the
same formula in plain Python (`schedule.value(t)`) documents it and is what tests compare
with torch's schedulers.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from . import ops
from .tensor import at_user_line


class Schedule:
    def __post_init__(self):  # every dataclass below runs this on construction
        if "steps" in self.__dataclass_fields__:
            object.__setattr__(self, "steps", _steps(type(self).__name__, self.steps))
        for name in ("lr", "peak", "final"):
            if name in self.__dataclass_fields__:
                _rate(type(self).__name__, name, getattr(self, name))

    def value(self, t: int) -> float: raise NotImplementedError
    def tensor(self, t): raise NotImplementedError

    def to_dict(self) -> dict:
        d = asdict(self)
        d["kind"] = type(self).__name__
        if isinstance(getattr(self, "after", None), Schedule):
            d["after"] = self.after.to_dict()
        return d


@dataclass(frozen=True)
class Constant(Schedule):
    lr: float

    def value(self, t): return self.lr
    def tensor(self, t): return ops.constant(self.lr)


@dataclass(frozen=True)
class LinearDecay(Schedule):
    """peak -> final linearly over `steps` updates, then final (torch LinearLR)."""
    peak: float
    final: float
    steps: int

    def value(self, t):
        return self.peak + (self.final - self.peak) * min(t, self.steps) / self.steps

    def tensor(self, t):
        return self.peak + (self.final - self.peak) / self.steps * ops.minimum(t, float(self.steps))


@dataclass(frozen=True)
class CosineDecay(Schedule):
    """final + (peak - final) (1 + cos(pi t / steps)) / 2, then final (torch CosineAnnealingLR)."""
    peak: float
    final: float
    steps: int

    def value(self, t):
        return self.final + (self.peak - self.final) * 0.5 * (1 + math.cos(math.pi * min(t, self.steps) / self.steps))

    def tensor(self, t):
        c = ops.cos(ops.minimum(t, float(self.steps)) * (math.pi / self.steps))
        return self.final + (self.peak - self.final) * 0.5 * (1.0 + c)


@dataclass(frozen=True)
class Warmup(Schedule):
    """peak (t + 1) / steps for the first `steps` updates, then `after` from its step 0."""
    peak: float
    steps: int
    after: Schedule

    def value(self, t):
        return self.peak * (t + 1) / self.steps if t < self.steps else self.after.value(t - self.steps)

    def tensor(self, t):
        return ops.where(ops.less(t, float(self.steps)), (t + 1.0) * (self.peak / self.steps),
                         self.after.tensor(t - float(self.steps)))


def _steps(kind: str, steps) -> int:
    # a schedule divides by its step count: 0 would fail deep inside tracing or evaluation
    if isinstance(steps, bool) or not isinstance(steps, (int, float)) or steps != int(steps) or steps < 1:
        raise ValueError(f"lr.{kind}: steps must be a positive whole number of updates, got "
                         f"{steps!r}" + at_user_line())
    return int(steps)


def _rate(kind: str, name: str, v: float) -> None:
    # torch.optim refuses a negative learning rate; NaN or inf would reach every parameter
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"lr.{kind}: {name} must be a finite number >= 0, got {v!r}" + at_user_line())


def constant(lr: float) -> Schedule: return Constant(float(lr))
def linear_decay(*, peak, final, steps) -> Schedule: return LinearDecay(float(peak), float(final), steps)
def cosine_decay(*, peak, final, steps) -> Schedule: return CosineDecay(float(peak), float(final), steps)


def warmup(*, peak, steps, after: Schedule | float | None = None) -> Schedule:
    return Warmup(float(peak), steps, as_schedule(peak if after is None else after))


def as_schedule(lr) -> Schedule:
    if isinstance(lr, Schedule):
        return lr
    if isinstance(lr, dict):
        return from_dict(lr)
    if isinstance(lr, (int, float)) and not isinstance(lr, bool):
        return constant(lr)
    raise TypeError(f"lr must be a number or an lr.* schedule, got {lr!r}")


def from_dict(d: dict) -> Schedule:
    kinds = {c.__name__: c for c in (Constant, LinearDecay, CosineDecay, Warmup)}
    if not isinstance(d, dict) or d.get("kind") not in kinds:
        got = d.get("kind") if isinstance(d, dict) else d
        raise ValueError(f"lr.from_dict: unknown schedule kind {got!r}; the kinds are "
                         f"{', '.join(kinds)} (as written by Schedule.to_dict())" + at_user_line())
    d = dict(d)
    cls = kinds[d.pop("kind")]
    if "after" in d:
        d["after"] = from_dict(d["after"])
    try:
        return cls(**d)
    except TypeError as e:
        raise ValueError(f"lr.from_dict: bad fields for {cls.__name__} ({e})" + at_user_line()) from None
