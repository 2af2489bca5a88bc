"""Tracing: a Python function over a Module and its feeds becomes IR nodes in a Graph.

`parse_inputs` checks the user's input specs; `trace(graph, factory, fn, inputs, seed)`
builds the module inside the graph (its parameters become `param` leaves), binds the step
counter and one `input` per feed, and runs fn(module, feeds), whose ops append nodes (the op
language: tensor.py, ops.py, primitives/). `build_forward_graph` is the whole forward trace
that compile_forward, CompiledModule.compile_forward and the tests lower. Consumers: the
driver (compile.py, which adds gradients and the optimizer), the runtime objects that trace
new programs over existing parameters (compiled.py, stateful.py).
"""
from __future__ import annotations

import operator

from .dce import cse, dce
from .ir import Graph
from .module import Module, materialize
from .primitives import bind
from .tensor import Tensor, tracing


def parse_inputs(inputs) -> dict[str, tuple[tuple[int, ...], str]]:
    """{"x": ([B, 1], "f32")}, {"x": {"shape": [B, 1], "dtype": "i32"}} or {"x": [B, 1]}."""
    forms = "write inputs={'x': ([B, 1], 'f32')}, {'x': {'shape': [B, 1], 'dtype': 'i32'}} or {'x': [B, 1]}"
    if inputs is not None and not isinstance(inputs, dict):
        raise TypeError(f"inputs must be a dict name -> spec, got {type(inputs).__name__}; {forms}")
    out = {}
    for name, spec in (inputs or {}).items():
        if not isinstance(name, str):
            raise TypeError(f"input names are strings, got {name!r}")
        if isinstance(spec, dict):
            if "shape" not in spec:
                raise ValueError(f"input {name!r}: the spec {spec!r} has no 'shape'; {forms}")
            shape, dtype = spec["shape"], spec.get("dtype", "f32")
        elif isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], str):
            shape, dtype = spec
        else:
            shape, dtype = spec, "f32"
        if dtype not in ("f32", "i32"):
            raise ValueError(f"input {name!r}: dtype must be 'f32' or 'i32', got {dtype!r}")
        out[name] = (_input_shape(name, shape, forms), dtype)
    return out


def _input_shape(name: str, shape, forms: str) -> tuple[int, ...]:
    """A list of whole numbers >= 1 (static shapes: a dimension is fixed at compile time)."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise TypeError(f"input {name!r}: the shape must be a list of sizes, got {shape!r}; {forms}")
    dims = []
    for d in shape:
        try:
            size = None if isinstance(d, bool) else operator.index(d)  # numpy ints too
        except TypeError:
            size = None
        if size is None:
            raise TypeError(f"input {name!r}: shape {list(shape)!r} has {d!r}; sizes are whole "
                            f"numbers (int), fixed at compile time")
        if size < 1:
            raise ValueError(f"input {name!r}: shape {list(shape)!r} has a size {d!r}; every "
                             "size must be at least 1")
        dims.append(size)
    return tuple(dims)


def trace(graph: Graph, factory, fn, inputs, seed: int):
    """Build the module in `graph`, bind the step counter and the inputs (parse_inputs'
    form), and trace fn(module, feeds): (parameter specs, what fn returned)."""
    if isinstance(factory, Module):
        name = type(factory).__name__
        raise TypeError(f"pass the model's class or a function that builds it ({name} or "
                        f"lambda: {name}(...)), not a {name} instance: its parameters are "
                        "created while the step is traced")
    graph.seed = int(seed)
    with tracing(graph):
        module = factory()
        specs = materialize(module)
        bind("state", name="step", shape=(), dtype="f32")
        feeds = {name: bind("input", name=name, shape=shape, dtype=dtype)
                 for name, (shape, dtype) in inputs.items()}
        return specs, fn(module, feeds)


def trace_tensor(graph: Graph, factory, fn, inputs, kind: str, seed: int):
    """trace() of a function that returns one Tensor (a loss, a forward's output); `kind`
    names the caller in the error."""
    specs, out = trace(graph, factory, fn, inputs, seed)
    if not isinstance(out, Tensor):
        raise TypeError(f"{kind}: the function must return a webgrad Tensor, got {type(out).__name__}")
    return specs, out


def refuse_quantized(specs, what: str, why: str) -> None:
    """Raise ValueError naming `what` when a parameter of `specs` is held quantized."""
    q = [(n, s.quant.qtype) for n, s in specs.items() if getattr(s, "quant", None) is not None]
    if q:
        names = ", ".join(f"{n!r} ({t})" for n, t in q[:3]) + (" ..." if len(q) > 3 else "")
        raise ValueError(f"{what}: parameters {names} are held quantized, {why}")


def build_forward_graph(factory, fwd_fn, inputs, seed: int = 0, training: bool = False):
    """(parameter specs, the forward graph of fwd_fn(module, feeds), its output "output"),
    deduplicated and dead code dropped: what compile_forward compiles."""
    g = Graph(training=training)
    specs, out = trace_tensor(g, factory, fwd_fn, inputs, "compile_forward", seed)
    g.outputs["output"] = out.id
    return specs, dce(cse(g))
