"""Parameter initialisers, as plain data (they cross the worker boundary like schedules).

`Module.param(shape, init=...)` takes one of these, or the strings "randn", "zeros",
"ones". Values are generated on the host with Python's `random` (no numpy needed), from a
generator keyed by the compile seed and the parameter's name, so a given seed always gives
the same model and `reset()` restores it exactly.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from math import prod

from .arrays import _flat_list


@dataclass(frozen=True)
class Init:
    kind: str                  # randn | kaiming | zeros | ones | literal | uniform
    scale: float = 0.02        # randn std, or kaiming gain, or uniform bound
    data: tuple | None = None  # literal values, flat
    zero_rows: tuple[int, ...] = ()  # rows (along axis 0) set to zero after drawing

    @property
    def decays(self) -> bool:
        """tensorgrad's rule: weight decay applies to randn/kaiming/literal params only."""
        return self.kind not in ("zeros", "ones")


def randn(scale: float = 0.02) -> Init: return Init("randn", float(scale))
def kaiming(gain: float = math.sqrt(2.0)) -> Init: return Init("kaiming", float(gain))
def uniform(bound: float) -> Init: return Init("uniform", float(bound))
def zeros() -> Init: return Init("zeros")
def ones() -> Init: return Init("ones")


def literal(values) -> Init:
    """Exact initial values: a flat or nested list, array.array, numpy array, memoryview."""
    if hasattr(values, "tolist"):  # numpy, array.array, memoryview
        values = values.tolist()
    flat: list = []
    _flat_list(values, flat)
    return Init("literal", data=tuple(float(v) for v in flat))


def with_zero_rows(spec, rows) -> Init:
    """`spec` with the given rows (axis 0) zeroed: an embedding's padding row, as torch's
    nn.Embedding(padding_idx=) starts it."""
    import dataclasses
    return dataclasses.replace(as_init(spec), zero_rows=tuple(int(r) for r in rows))


def as_init(spec) -> Init:
    if isinstance(spec, Init):
        return spec
    if spec in ("randn", None):
        return randn()
    if spec in ("zeros", "ones", "kaiming"):
        return {"zeros": zeros, "ones": ones, "kaiming": kaiming}[spec]()
    raise ValueError(f"unknown init {spec!r}: use 'randn', 'zeros', 'ones' or an init.* "
                     "constructor (init.kaiming(), init.randn(scale=...), init.literal(values))")


def fan_in(shape) -> int:
    """[d_in, d_out] weights (x @ W) have fan-in d_in; conv weights [O, C, kh, kw] C*kh*kw."""
    if len(shape) <= 1:
        return max(prod(shape), 1)
    return shape[0] if len(shape) == 2 else prod(shape[1:])


def generate(spec: Init, shape, *, seed: int, name: str) -> list[float]:
    vals = _draw(spec, shape, seed=seed, name=name)
    if spec.zero_rows and shape:
        width = prod(shape[1:])
        for r in spec.zero_rows:
            vals[(r % shape[0]) * width:(r % shape[0] + 1) * width] = [0.0] * width
    return vals


def _draw(spec: Init, shape, *, seed: int, name: str) -> list[float]:
    n = prod(shape)
    if spec.kind == "zeros":
        return [0.0] * n
    if spec.kind == "ones":
        return [1.0] * n
    if spec.kind == "literal":
        if len(spec.data) != n:
            raise ValueError(f"param {name!r}: init.literal has {len(spec.data)} values, "
                             f"shape {list(shape)} needs {n}")
        return list(spec.data)
    rng = random.Random(f"{seed}:{name}")
    if spec.kind == "uniform":
        return [rng.uniform(-spec.scale, spec.scale) for _ in range(n)]
    std = spec.scale if spec.kind == "randn" else spec.scale / math.sqrt(fan_in(shape))
    return [rng.gauss(0.0, std) for _ in range(n)]
