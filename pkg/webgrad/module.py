"""Module: a tree of parameter declarations.

A Module subclass calls `self.param(shape, init=...)` in `__init__` and holds child modules
as attributes (also in lists, tuples and dicts: `self.blocks = [Block() for _ in range(n)]`
names its params "blocks.0.W", ...). Declaring stores a `ParamSpec`; `materialize` walks
the tree in attribute order, names each spec by its attribute path, adds a `param` leaf to
the graph being traced, and replaces the spec with that Tensor, so the user's forward
function reads `m.W` as a Tensor. A spec held in two places (tied weights) is one parameter.
A spec with `quant` set (a quants.QuantSpec; models/gpt2.py sets it for GGUF weights) is held
quantized: its leaf is an i32 `param` of words, and the forward reads it through
ops.dequantize (transposed when the spec says so), so model code is the same for full and
quantized precision. Such parameters are inference-only (compile.py refuses to train them).
"""
from __future__ import annotations

from dataclasses import dataclass

from . import init as _init
from .primitives import bind


@dataclass
class ParamSpec:
    shape: tuple[int, ...]
    init: _init.Init
    decay: bool | None = None  # None: the init's default (see Init.decays)
    quant: object = None       # a quants.QuantSpec: held as quantized blocks (inference only)
    trainable: bool = True     # False: frozen (no gradient, optimizer state or update)
    dtype: str = "f32"         # "f16": held rounded to f16 (frozen weights: Module.half())

    @property
    def decays(self) -> bool:
        return self.init.decays if self.decay is None else self.decay

    @property
    def held(self) -> tuple[tuple[int, ...], str]:
        """(shape, dtype) of the parameter as a backend holds it: f32 values, or the i32
        words of its blocks when it is held quantized (quants/words.py; written and read
        back as words)."""
        q = self.quant
        return ((q.words,), "i32") if q is not None else (tuple(self.shape), self.dtype)


class Module:
    def __init__(self):
        pass

    def param(self, shape, init=None, *, decay: bool | None = None,
              trainable: bool = True) -> ParamSpec:
        """Declare a parameter. init: "randn" (default, std 0.02), "zeros", "ones", "kaiming",
        or an init.* value; decay overrides whether AdamW/Lion weight decay applies;
        trainable=False freezes it (compile_module gives it no gradient or optimizer state)."""
        shape = tuple(int(s) for s in ([shape] if isinstance(shape, int) else shape))
        if any(s < 0 for s in shape):
            raise ValueError(f"param shape {list(shape)} must have non-negative dims")
        return ParamSpec(shape, _init.as_init(init), decay, trainable=bool(trainable))

    def freeze(self, keep=None) -> "Module":
        """Mark every parameter frozen (trainable=False), except those whose name `keep(name)`
        is true for; returns self, so a factory can be `lambda: Model().freeze()`."""
        for name, spec in self.named_specs():
            spec.trainable = bool(keep is not None and keep(name))
        return self

    def half(self, keep=None) -> "Module":
        """Hold every parameter in f16 (rounded to nearest even), except quantized ones and
        those whose name `keep(name)` is true for; each is frozen (trainable=False: f16
        weights have no f32 master copy to train) and read as f32 by the ops. Returns self,
        so a factory can be `lambda: Model().half()`. docs/precision.md."""
        for name, spec in self.named_specs():
            if spec.quant is None and not (keep is not None and keep(name)):
                spec.dtype, spec.trainable = "f16", False
        return self

    def named_specs(self, prefix: str = "") -> list[tuple[str, ParamSpec]]:
        """Each parameter once, under the first path that reaches it (tied weights: one)."""
        seen: set[int] = set()
        out = []
        for n, s, _, _ in _walk(self, prefix):
            if id(s) not in seen:
                seen.add(id(s))
                out.append((n, s))
        return out


def _children(obj):
    if isinstance(obj, Module):
        return [(k, k, v) for k, v in vars(obj).items()]
    if isinstance(obj, (list, tuple)):
        return [(str(i), i, v) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        return [(str(k), k, v) for k, v in obj.items()]
    return []


def _walk(obj, prefix):
    """Yield (name, spec, container, key) for every ParamSpec under obj."""
    for part, key, v in _children(obj):
        name = f"{prefix}{part}"
        if isinstance(v, ParamSpec):
            yield name, v, obj, key
        elif isinstance(v, (Module, list, tuple, dict)):
            yield from _walk(v, name + ".")


def materialize(module: Module) -> dict[str, ParamSpec]:
    """Replace every ParamSpec in the tree by a `param` Tensor of the current graph."""
    if not isinstance(module, Module):
        raise TypeError(f"the model factory must return a webgrad.Module, got {type(module).__name__}")
    specs = {}
    tied: dict[int, object] = {}  # id(spec) -> its Tensor
    for name, spec, container, key in list(_walk(module, "")):
        # weight tying (`self.out = self.emb.W`): the same spec reached twice is ONE parameter,
        # named by its first path; every use reads it, so its gradient is the sum of the uses'
        t = tied.get(id(spec))
        if t is None:
            t = tied[id(spec)] = (_quantized(name, spec) if spec.quant is not None else
                                  _half(name, spec) if spec.dtype == "f16" else
                                  bind("param", name=name, shape=spec.shape, dtype="f32"))
            specs[name] = spec
        if isinstance(container, Module):
            setattr(container, key, t)
        elif isinstance(container, (list, dict)):
            container[key] = t
        else:
            raise TypeError(f"param {name!r} sits in a tuple; use a list so it can be traced")
    return specs


def _half(name, spec):
    """The f32 Tensor an f16 parameter reads as (a matmul under precision="mixed"/"f16"
    reads the f16 value itself: precision.py)."""
    from . import ops
    if spec.trainable:
        raise ValueError(f"param {name!r} is held in f16 and trainable; f16 weights have no f32 "
                         "master copy to update: freeze it (Module.half() does), or train f32 "
                         "parameters with compile_module(..., precision='mixed')")
    return ops.cast(bind("param", name=name, shape=spec.shape, dtype="f16"), "f32")


def _quantized(name, spec):
    """The f32 Tensor a quantized parameter reads as: its words, dequantized (and transposed
    when the blocks are stored [out, in] for a declared [in, out] weight)."""
    from . import ops
    q = spec.quant
    if q.declared_shape != spec.shape:
        raise ValueError(f"param {name!r}: {q.qtype} blocks of shape {list(q.shape)}"
                         f"{' transposed' if q.transposed else ''} do not give the declared "
                         f"shape {list(spec.shape)}")
    words = bind("param", name=name, shape=(q.words,), dtype="i32", quant=q.qtype)
    x = ops.dequantize(words, q.qtype, q.shape)
    return ops.swap_axes(x, 0, 1) if q.transposed else x
