"""The compile driver — the table of contents of the pipeline.

compile_module(factory, loss_fn, ...):
  1. module.materialize   the factory's Module tree becomes named `param` leaves
  2. trace                loss_fn(module, inputs) appends the forward nodes (tensor.py, ops.py)
  3. grad.append_grad     reverse-mode gradients of the loss w.r.t. every trainable param
                          (a frozen one, trainable=False, gets no gradient: module.py)
  4. optim                the optimizer's update is appended; new values become writebacks
  5. dce.cse / dce.dce    shared subexpressions merged, dead nodes dropped
  6. backend.prepare      reference/torch interpret the IR; webgpu plans buffers, emits WGSL
                          (backends/webgpu.py -> codegen/) and records the dispatch list
     6a. (webgpu)         pattern passes rewrite the IR into fused kernels first: attention
                          (codegen/attention_match.py -> attention.py's row kernels on
                          CPU adapters, attention_tiled.py's on GPUs), cross entropy and
                          layer-norm backward (codegen/rowfuse_match.py -> rowfuse.py),
                          vocabulary-wide products on padded columns where the adapter's
                          tiling row asks for it (codegen/align_match.py)
     6a'. (webgpu)        fusion (codegen/fusion.py) chooses what is stored and the kernel
                          order; codegen/remat.py leaves unstored the expressions whose
                          buffer would save no memory (GELU's tanh, recomputed in the
                          backward); buffers.py packs the temporaries into a pool
     6b. (webgpu)         quantized weights (quant.py: GGUF blocks, ops.dequantize) are never
                          stored as f32: matmuls and gathers decode them in registers
                          (codegen/quant.py)
  7. init                 parameters get their initial values from one counter-based generator
                          (init.py): numpy on the CPU executors, a device program on webgpu
                          (codegen/initparams.py), the same bits everywhere
  8. bounds.index_checks  which feeds are indices and their ranges: every step checks them
                          on the host before anything runs (compiled.Program)
The result is a CompiledModule (compiled.py), the runtime API users call; its profile(feed)
times every kernel of a step (profile.py: ops covered, bytes, FLOPs, GPU time).
Programs with several outputs and persistent state written in place (a KV cache) are traced
the same way by stateful.compile_program, over the parameters of any program on that backend.
With check_finite or recovery, recovery.py keeps a host copy of a module's last good state.
LoRA (lora.py) is a model factory: adapters on chosen linear layers, the rest frozen (step 3
skips them), the frozen base optionally held quantized (QLoRA).
"""
from __future__ import annotations

import operator

from .compiled import CompiledForward, CompiledModule, Program
from .dce import cse, dce
from .grad import append_grad
from .ir import Graph
from .module import Module, materialize
from .optim import Adam, Optimizer, OptimizerContext, ParamSlot
from .primitives import bind
from .tensor import Tensor, tracing

_DEFAULT = object()


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


def _trace(graph: Graph, factory, fn, inputs, kind: str, seed: int):
    specs, out = trace(graph, factory, fn, inputs, seed)
    if not isinstance(out, Tensor):
        raise TypeError(f"{kind}: the function must return a webgrad Tensor, got {type(out).__name__}")
    return specs, out


def _refuse_quantized(specs, what: str, why: str) -> None:
    q = [(n, s.quant.qtype) for n, s in specs.items() if getattr(s, "quant", None) is not None]
    if q:
        names = ", ".join(f"{n!r} ({t})" for n, t in q[:3]) + (" ..." if len(q) > 3 else "")
        raise ValueError(f"{what}: parameters {names} are held quantized, {why}")


def build_train_graph(factory, loss_fn, inputs, optimizer: Optimizer | None, *, keep_grads=True,
                      seed: int = 0):
    g = Graph()
    specs, loss = _trace(g, factory, loss_fn, inputs, "compile_module", seed)
    trainable = {n: s for n, s in specs.items() if s.trainable}
    _refuse_quantized(trainable, "compile_module", "and quantized weights are not trainable: "
                      "freeze them (Module.param(..., trainable=False), Module.freeze(); "
                      "LoRA does) or train f32 parameters (e.g. GGUFTensor.dequantize() "
                      "values uploaded into a model without quant specs)")
    if loss.shape != () or loss.dtype != "f32":
        where = f" (built at {loss.node.loc})" if loss.node.loc else ""
        raise ValueError(f"compile_module: the loss must be a rank-0 f32 Tensor (a scalar), got "
                         f"{loss.dtype}{list(loss.shape)}{where}; reduce it with "
                         "ops.mean_all(...) or ops.sum_all(...)")
    g.outputs["loss"] = loss.id
    # run() evaluates this same trace (dropout included), so its loss is the one step() sees
    forward = dce(Graph(list(g.nodes), dict(g.inputs), dict(g.params), dict(g.state), dict(g.outputs),
                        seed=g.seed))
    # frozen parameters are read but not differentiated: the backward still flows through
    # them to what they multiply, but no gradient (nor optimizer state) of theirs is formed
    grads = append_grad(g, loss.id, [g.params[n] for n in trainable])
    with tracing(g):
        step = Tensor(g, g.state["step"])
        slots = [ParamSlot(n, Tensor(g, g.params[n]), grads[g.params[n]], s.decays)
                 for n, s in trainable.items()]
        if keep_grads:
            for s in slots:
                g.writebacks[f"grad/{s.name}"] = s.grad.id
        if optimizer is not None:
            optimizer.append(OptimizerContext(g, slots, step, optimizer.lr))
        g.writebacks["step"] = (step + 1.0).id
        _copy_updated_captures(g)
    return specs, dce(cse(g)), cse(forward)


def _copy_updated_captures(g: Graph) -> None:
    """capture("c", m.w) of a parameter the step also updates returns the value the step
    used, so it must be read before the update lands: capture a copy (x * 1, exact for every
    value including -0 and NaN) instead of the buffer the writeback overwrites."""
    written = {g[i].attrs["name"] for i in (*g.params.values(), *g.state.values())} & set(g.writebacks)
    for key, i in list(g.outputs.items()):
        if key.startswith("capture:") and g[i].op in ("param", "state") and g[i].attrs["name"] in written:
            g.outputs[key] = (Tensor(g, i) * 1.0).id


def build_forward_graph(factory, fwd_fn, inputs, seed: int = 0, training: bool = False):
    g = Graph(training=training)
    specs, out = _trace(g, factory, fwd_fn, inputs, "compile_forward", seed)
    g.outputs["output"] = out.id
    return specs, dce(cse(g))


def compile_module(factory, loss_fn, *, inputs, optimizer=_DEFAULT, backend="reference",
                   seed: int = 0, keep_grads: bool = True, check_finite: bool = False,
                   recovery=None) -> CompiledModule:
    """Trace, differentiate, append the optimizer and compile a whole training step.
    optimizer: an optim.* instance (default Adam(lr=1e-3)); None computes gradients only.
    check_finite: refuse (NonFiniteError, state untouched) a step whose loss or gradients are
    not finite. recovery: "memory" or a checkpoint path keeps the last completed step's state
    so that recover() can continue after a lost device. Both read the whole state back after
    each step (recovery.py says what that costs)."""
    from .backends import get_backend
    if optimizer is _DEFAULT:
        optimizer = Adam()
    if optimizer is not None and not isinstance(optimizer, Optimizer):
        raise TypeError(f"optimizer must be an optim.Optimizer (e.g. optim.Adam(lr=1e-3)) or None, "
                        f"got {optimizer!r}")
    ins = parse_inputs(inputs)
    specs, train, forward = build_train_graph(factory, loss_fn, ins, optimizer, keep_grads=keep_grads,
                                                seed=seed)
    be = get_backend(backend)
    return CompiledModule(be, factory, specs, Program(be, train, ins),
                          Program(be, forward, ins, lazy=True),  # prepared by the first run()
                          seed=seed, check_finite=check_finite, recovery=recovery)


def compile_forward(factory, fwd_fn, *, inputs, backend="reference", seed: int = 0,
                    training: bool = False) -> CompiledForward:
    """A forward-only program with its own parameters (initialised from the factory).
    An inference graph: dropout is the identity unless training=True."""
    from .backends import get_backend
    ins = parse_inputs(inputs)
    specs, g = build_forward_graph(factory, fwd_fn, ins, seed, training)
    be = get_backend(backend)
    owner = CompiledModule(be, factory, specs, None, None, seed=seed)
    return CompiledForward(owner, Program(be, g, ins), owns_owner=True)
