"""The compile driver — the table of contents of the pipeline.

compile_module(factory, loss_fn, ...):
  1. module.materialize   the factory's Module tree becomes named `param` leaves
  2. trace                loss_fn(module, inputs) appends the forward nodes (trace.py over
                         tensor.py, ops.py)
  3. grad.append_grad     reverse-mode gradients of the loss w.r.t. every trainable param
                          (a frozen one, trainable=False, gets no gradient: module.py)
  4. optim                the optimizer's update is appended; new values become writebacks
  3'. precision          precision="mixed"/"f16": the forward and backward are rebuilt with
                          their f16 rounding points (matmul operands and results; "f16":
                          every value) and, in mixed training, GradScaler's dynamic loss
                          scale: the gradients are of loss * scale, unscaled before the
                          optimizer, and a step with an inf/nan gradient is skipped
  5. dce.cse / dce.dce    shared subexpressions merged, dead nodes dropped
  6. backend.prepare      reference/torch interpret the IR; webgpu plans buffers, emits WGSL
                          (backends/webgpu.py -> codegen/) and records the dispatch list
     6a. (webgpu)         pattern passes rewrite the IR into fused kernels first: attention
                          (codegen/attention_match.py -> attention.py's row kernels on
                          CPU adapters, attention_tiled.py's on GPUs), cross entropy and
                          layer-norm backward (codegen/rowfuse_match.py -> rowfuse.py),
                          vocabulary-wide products on padded columns where the adapter's
                          tiling row asks for it (codegen/align_match.py), thin weight
                          gradients (LoRA's factors) in their parameter's layout, so that
                          the optimizer joins their products (codegen/thin_grads.py),
                          and thin products of one A (LoRA's x A^T of q, k, v) as one
                          product, read in slices (codegen/thin_siblings.py)
     6a'. (webgpu)        fusion (codegen/fusion.py) chooses what is stored and the kernel
                          order; codegen/remat.py leaves unstored the expressions whose
                          buffer would save no memory (GELU's tanh, recomputed in the
                          backward); buffers.py packs the temporaries into a pool
     6b. (webgpu)         quantized weights (quants/: GGUF blocks, ops.dequantize) are never
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

from .compiled import CompiledForward, CompiledModule, Program
from .dce import cse, dce
from .grad import append_grad
from .init import check_seed
from .ir import Graph
from .optim import Adam, Optimizer, OptimizerContext, ParamSlot
from .precision import (append_loss_scaling, apply_precision, check_precision, loss_scale,
                        unscale)
from .tensor import Tensor, tracing
from .trace import build_forward_graph, parse_inputs, refuse_quantized, trace_tensor

_DEFAULT = object()


def build_train_graph(factory, loss_fn, inputs, optimizer: Optimizer | None, *, keep_grads=True,
                      seed: int = 0, precision: str = "f32", transposed_views: bool | str = False):
    g = Graph()
    specs, loss = trace_tensor(g, factory, loss_fn, inputs, "compile_module", seed)
    trainable = {n: s for n, s in specs.items() if s.trainable}
    refuse_quantized(trainable, "compile_module", "and quantized weights are not trainable: "
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
    forward = apply_precision(forward, precision)[0]
    scaled = precision == "mixed"
    if scaled:  # the gradients are of loss * scale, so that small f16 ones do not flush to 0
        with tracing(g):
            scale = loss_scale(g)
            target = loss * scale
    # frozen parameters are read but not differentiated: the backward still flows through
    # them to what they multiply, but no gradient (nor optimizer state) of theirs is formed
    grads = append_grad(g, (target if scaled else loss).id, [g.params[n] for n in trainable])
    if callable(transposed_views):   # decided once the model has traced (compile_module)
        transposed_views = transposed_views() if precision == "mixed" else False
    old, (g, new_id) = g, apply_precision(g, precision, transposed_views=transposed_views)
    grads = {g.params[n]: Tensor(g, new_id[grads[old.params[n]].id]) for n in trainable}
    with tracing(g):
        if scaled:
            grads, ok = unscale(grads, Tensor(g, new_id[scale.id]))
        step = Tensor(g, g.state["step"])
        slots = [ParamSlot(n, Tensor(g, g.params[n]), grads[g.params[n]], s.decays)
                 for n, s in trainable.items()]
        if keep_grads:
            for s in slots:
                g.writebacks[f"grad/{s.name}"] = s.grad.id
        if optimizer is not None:
            optimizer.append(OptimizerContext(g, slots, step, optimizer.lr))
        g.writebacks["step"] = (step + 1.0).id
        if scaled:
            append_loss_scaling(g, ok, list(trainable))
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


def compile_module(factory, loss_fn, *, inputs, optimizer=_DEFAULT, backend="reference",
                   seed: int = 0, keep_grads: bool = True, check_finite: bool = False,
                   recovery=None, kernel_options=None, precision: str = "f32") -> CompiledModule:
    """Trace, differentiate, append the optimizer and compile a whole training step.
    optimizer: an optim.* instance (default Adam(lr=1e-3)); None computes gradients only.
    check_finite: refuse (NonFiniteError, state untouched) a step whose loss or gradients are
    not finite. recovery: "memory" or a checkpoint path keeps the last completed step's state
    so that recover() can continue after a lost device. Both read the whole state back after
    each step (recovery.py says what that costs). kernel_options: a codegen.KernelOptions
    for the generated kernels (None: the backend's; only kernel-generating backends read it).
    precision: "f32" (the default), "mixed" (f16 matmuls with f32 accumulation, f32 master
    weights and optimizer, dynamic loss scaling: a step with an inf/nan gradient is skipped,
    step() returns a StepLoss whose .skipped says so, loss_scale the scale) or "f16" (every
    value rounded to f16; gradients only, optimizer=None). precision.py has the rules."""
    from .backends import get_backend
    check_precision(precision, "compile_module")
    if precision == "f16" and optimizer is not None:
        raise ValueError("compile_module(precision='f16') computes gradients in half precision "
                         "but keeps no f32 master weights to update: pass optimizer=None, or "
                         "train with precision='mixed'")
    if optimizer is _DEFAULT:
        optimizer = Adam()
    if optimizer is not None and not isinstance(optimizer, Optimizer):
        raise TypeError(f"optimizer must be an optim.Optimizer (e.g. optim.Adam(lr=1e-3)) or None, "
                        f"got {optimizer!r}")
    seed = check_seed(seed, "compile_module")
    ins = parse_inputs(inputs)
    # products that read operands stored transposed (KernelOptions.mma_transposed: the
    # backend decides, from kernel_options or its own): asked once the model has traced,
    # so that a mistake in the model is reported before the backend is looked up
    found = []

    def views():
        found.append(get_backend(backend))
        return found[0].transposed_views(kernel_options)
    specs, train, forward = build_train_graph(factory, loss_fn, ins, optimizer, keep_grads=keep_grads,
                                                seed=seed, precision=precision,
                                                transposed_views=views)
    be = found[0] if found else get_backend(backend)
    return CompiledModule(be, factory, specs, Program(be, train, ins, options=kernel_options),
                          # prepared by the first run()
                          Program(be, forward, ins, lazy=True, options=kernel_options),
                          seed=seed, check_finite=check_finite, recovery=recovery,
                          precision=precision)


def compile_forward(factory, fwd_fn, *, inputs, backend="reference", seed: int = 0,
                    training: bool = False, kernel_options=None,
                    precision: str = "f32") -> CompiledForward:
    """A forward-only program with its own parameters (initialised from the factory).
    An inference graph: dropout is the identity unless training=True. precision: "f32"
    (the default), "mixed" (f16 matmuls) or "f16" (every value rounded to f16): precision.py."""
    from .backends import get_backend
    check_precision(precision, "compile_forward")
    seed = check_seed(seed, "compile_forward")
    ins = parse_inputs(inputs)
    specs, g = build_forward_graph(factory, fwd_fn, ins, seed, training)
    g = dce(cse(apply_precision(g, precision)[0]))
    be = get_backend(backend)
    owner = CompiledModule(be, factory, specs, None, None, seed=seed, precision=precision)
    return CompiledForward(owner, Program(be, g, ins, options=kernel_options), owns_owner=True)
