"""The runtime API of a compiled program: step, run, parameter up/download, reset.

Every method is async-first (`step_async`, ...), because in the browser a GPU read-back
is a Promise; the blocking forms drive the coroutine to completion (blocking.run_blocking).
Bad input is refused before anything runs, so a refused call leaves parameters and optimizer
state exactly as they were.
"""
from __future__ import annotations

import itertools
import weakref
from math import prod

from .arrays import FeedError, HostArray, to_host, to_user
from .backends.gpu_host import DeviceLostError
from .blocking import run_blocking
from .bounds import check_index_feeds, index_checks
from .dce import cse, dce
from .optim import STATE_PREFIX
from .precision import INIT_EXP, SCALE_EXP, apply_precision, check_precision
from .recovery import Guard
from .trace import build_forward_graph, parse_inputs


class DestroyedError(RuntimeError):
    """A method was called on a compiled module (or forward program) after destroy()."""


class Program:
    """One graph prepared on one backend, with its feed contract."""

    def __init__(self, backend, graph, inputs, *, lazy: bool = False, options=None):
        """options: the codegen.KernelOptions the graph is lowered with (None: the backend's)."""
        self.backend, self.graph, self.inputs, self.options = backend, graph, inputs, options
        for n in graph.nodes:
            if n.op in ("param", "state"):
                backend.ensure(n.attrs["name"], n.shape, n.dtype)
        for name, i in graph.writebacks.items():
            backend.ensure(name, graph[i].shape, graph[i].dtype)
        # lazy: prepared on first use (a training step's run() graph, which many programs never
        # run: on a CPU rasterizer its pipelines alone took a second to create; GPT-2 124M's
        # are 12 of its 77 distinct pipelines, bench/README.md's compile_time section)
        self.lazy = lazy
        self._exe = None if lazy else self._prepare()
        self.index_checks = index_checks(graph)  # fed indices: range-checked per step

    @property
    def exe(self):
        if self._exe is None:
            self._exe = self._prepare()
        return self._exe

    def _prepare(self):
        # a backend of the user's own may take no options (Backend.prepare(graph))
        if self.options is None:
            return self.backend.prepare(self.graph)
        return self.backend.prepare(self.graph, self.options)

    def reload(self, backend) -> "Program":
        """The same graph prepared on another backend (recover(): a new device)."""
        return Program(backend, self.graph, self.inputs, lazy=self.lazy and self._exe is None,
                       options=self.options)

    def check_feed(self, feed, method: str, allow_nonfinite: bool = False) -> dict[str, HostArray]:
        if not isinstance(feed, dict):
            raise FeedError(f"{method}(): pass the inputs as a dict name -> array, got {type(feed).__name__}")
        if feed.keys() != self.inputs.keys():  # the message is built only for a bad feed
            declared = ", ".join(f"'{k}' {d}{list(s)}" for k, (s, d) in self.inputs.items()) or "none"
            unknown = sorted(set(feed) - set(self.inputs))
            if unknown:
                raise FeedError(f"{method}(): unknown input {', '.join(map(repr, unknown))}; this "
                                f"program takes {declared}")
            missing = sorted(set(self.inputs) - set(feed))
            raise FeedError(f"{method}(): missing input {', '.join(map(repr, missing))}; this program "
                            f"takes {declared}")
        # NaN and inf are refused where they would land in the persistent state (a training
        # step, unless allow_nonfinite); a forward run computes with them (NaN out, as torch
        # gives) and keeps nothing
        hosts = {k: to_host(feed[k], shape=s, dtype=d, what=f"{method}(): input '{k}'",
                            allow_nonfinite=allow_nonfinite or method == "run")
                 for k, (s, d) in self.inputs.items()}
        check_index_feeds(hosts, self.index_checks, method)
        return hosts

    def captures(self) -> list[str]:
        return [k for k in self.graph.outputs if k.startswith("capture:")]

    @property
    def kernel_count(self) -> int:
        n = getattr(self.exe, "kernel_count", None)
        if n is not None:
            return n
        return sum(1 for n in self.graph.nodes if n.op not in ("input", "param", "state", "const", "reshape"))

    async def profile(self, feed, method: str):
        prof = getattr(self.exe, "profile", None)
        if prof is None:
            raise NotImplementedError(f"{method}(): the profiler times WebGPU kernels; backend "
                                      f"{self.backend.name!r} has none (use backend='webgpu')")
        return await prof(self.check_feed(feed, method))

    async def execute(self, feed, method, main: str, with_captures: bool,
                      allow_nonfinite: bool = False):
        feeds = self.check_feed(feed, method, allow_nonfinite)
        amp = [k for k in self.graph.outputs if k.startswith("amp/")]  # loss scaling's verdict
        fetch = [main] + amp + (self.captures() if with_captures else [])
        out = await self.exe.run(feeds, fetch)
        self.last_amp = {k: float(out[k][0]) for k in amp}
        caps = {k[len("capture:"):]: to_user(v) for k, v in out.items() if k.startswith("capture:")}
        return out[main], caps


async def export_program_async(program: Program, path=None, *, embed: bool, doc: str = ""):
    """The graph of `program` as an ONNX model (webgrad/onnx), written to `path` if given;
    returns the onnx.Exported (its .model bytes and the map of inputs and outputs).
    embed: the parameters' current values, and those of state the graph reads but never
    writes (the step counter of a forward graph), are initializers (a self-contained file
    for deployment; quantized parameters decoded to f32); else they are inputs, beside the
    state."""
    from .onnx import export_graph
    from .quants import dequantize_words
    g, b = program.graph, program.backend
    values = {}
    if embed:
        for name in [*g.params, *(n for n in g.state if n not in g.writebacks)]:
            values[name] = await b.read(name)

    def decode(name, qtype, shape):
        return dequantize_words(qtype, bytes(memoryview(values[name]).cast("B")), shape)

    ex = export_graph(g, values=values, decode=decode, doc=doc)
    if path is not None:
        ex.save(path)
    return ex


_serials = itertools.count()


class StepLoss(float):
    """A mixed-precision step's loss (a float) with loss scaling's verdict: `skipped` (True
    when a gradient held an inf or NaN, so nothing was updated and the scale halved) and
    `scale` (the loss scale the next step uses)."""
    skipped: bool
    scale: float

    def __new__(cls, loss: float, skipped: bool, scale: float):
        out = super().__new__(cls, loss)
        out.skipped, out.scale = skipped, scale
        return out


class CompiledModule:
    """A compiled training step (from compile_module) and the parameters it owns."""

    def __init__(self, backend, factory, specs, train, forward, *, seed: int,
                 check_finite: bool = False, recovery=None, precision: str = "f32"):
        self.backend, self._factory, self._specs, self.seed = backend, factory, specs, seed
        self.precision = precision  # compile_module's: where its programs round to f16
        self._train, self._forward = train, forward
        self._destroyed = False
        self.last_feed = None  # the feed of the last successful step()
        # loss scaling (precision="mixed"): did the last step skip, and the next step's scale
        # (GradScaler's initial 2^16 until a step says otherwise; None without loss scaling)
        self.last_step_skipped = None
        self.loss_scale = (65536.0 if train is not None and any(
            k.startswith("amp/") for k in train.graph.outputs) else None)
        self.serial = next(_serials)  # creation order: "the newest model" (the playground's Save)
        self._siblings = weakref.WeakSet()  # forward programs over this store (recover() reloads them)
        self._guard = (Guard(self, check_finite=check_finite, recovery=recovery)
                       if check_finite or recovery is not None else None)
        for name, spec in specs.items():
            backend.ensure(name, *spec.held)
        self.backend.ensure("step", (), "f32")
        self._init_params()

    # -- inspection
    @property
    def param_names(self) -> list[str]: return list(self._specs)
    @property
    def param_shapes(self) -> dict[str, tuple[int, ...]]: return {n: s.shape for n, s in self._specs.items()}
    @property
    def trainable_names(self) -> list[str]:
        """The parameters a step updates (the others are frozen: trainable=False)."""
        return [n for n, s in self._specs.items() if getattr(s, "trainable", True)]
    @property
    def ir(self): return self._train.graph
    @property
    def kernel_count(self) -> int: return self._train.kernel_count
    @property
    def output_shape(self) -> tuple[int, ...]: return ()
    @property
    def input_specs(self): return dict(self._train.inputs)

    def memory_report(self) -> dict:
        rep = getattr(self._train.exe, "memory_report", None)
        if rep is None:
            raise NotImplementedError(f"backend {self.backend.name!r} does not plan buffers")
        return rep()

    # -- state
    def _init_params(self):
        # a parameter held quantized (a frozen base: QLoRA) has no init; its blocks are written
        self.backend.init_params([(n, s.init, s.shape) for n, s in self._specs.items()
                                  if getattr(s, "quant", None) is None], seed=self.seed)

    def _zero_state(self, optimizer_only: bool):
        for name in list(self._state_names()):
            if name == "step" or name.startswith(STATE_PREFIX) or (not optimizer_only and name.startswith("grad/")):
                shape = self._state_shape(name)
                self.backend.write(name, HostArray("f32", [0.0] * prod(shape), shape=shape))

    def _state_names(self):
        names = {"step"}
        if self._train is not None:
            g = self._train.graph
            names |= set(g.state) | set(g.writebacks)
        return names - set(self._specs)

    def _state_shape(self, name):
        g = self._train.graph if self._train is not None else None
        if g is None or name == "step":
            return ()
        i = g.state.get(name, g.writebacks.get(name))
        return g[i].shape

    @property
    def held_params(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """name -> (shape, dtype) of each parameter as the backend holds it (ParamSpec.held:
        a quantized one as its i32 words): what a checkpoint stores."""
        return {n: s.held for n, s in self._specs.items()}

    def state_shapes(self, method: str) -> dict[str, tuple[int, ...]]:
        """name -> shape of the training graph's optimizer buffers (sorted by name), then of
        the step counter: what a checkpoint keeps beside the parameters (io/checkpoint.py).
        Raises, naming `method`, when this module has no training graph."""
        self._need_train(method)
        names = sorted(n for n in self._state_names() if n.startswith(STATE_PREFIX)) + ["step"]
        return {n: tuple(self._state_shape(n)) for n in names}

    async def write_state_async(self, hosts: dict[str, HostArray], *, method: str) -> None:
        """Write parameters and optimizer state already checked against this module (name ->
        HostArray of the right shape: upload_params, checkpoint.load_async), then update
        recovery's host copy. Errors name `method` (a lost device says what to do next)."""
        self.check_alive(method)
        async with self._lost(method):
            for n, h in hosts.items():
                self.backend.write(n, h)
        if self._guard is not None:
            self._guard.update(hosts)

    # -- the async API
    async def step_async(self, feed, *, with_captures: bool = False,
                         allow_nonfinite: bool = False):
        """One training step. A NaN or inf in an f32 feed is refused (FeedError, nothing
        changed) unless allow_nonfinite=True (a -inf mask the loss handles)."""
        self._need_train("step")
        async with self._lost("step"):
            if self._guard is not None:
                await self._guard.ensure_copy()
            loss, caps = await self._train.execute(feed, "step", "loss", with_captures,
                                                   allow_nonfinite)
            self.last_feed = feed  # what the playground's kernel timing profiles
            loss = float(loss[0])
            amp = self._train.last_amp
            if amp:
                self.last_step_skipped = amp["amp/skipped"] != 0.0
                self.loss_scale = amp["amp/scale"]
                loss = StepLoss(loss, self.last_step_skipped, self.loss_scale)
            if self._guard is not None:
                await self._guard.after_step(loss, skipped=bool(amp) and self.last_step_skipped)
        return (loss, caps) if with_captures else loss

    async def run_async(self, feed, *, with_captures: bool = False):
        self._need_train("run")
        async with self._lost("run"):
            loss, caps = await self._forward.execute(feed, "run", "loss", with_captures)
        out = float(loss[0])
        return (out, caps) if with_captures else out

    async def profile_async(self, feed):
        """Run one training step (it trains, as step() does) timing every kernel: a
        profile.Profile whose text() is a per-kernel table (see profile.py)."""
        self._need_train("profile")
        return await self._train.profile(feed, "profile")

    async def download_params_async(self) -> dict:
        self.check_alive("download_params")
        async with self._lost("download_params"):
            return {n: to_user(await self.backend.read(n)) for n in self._specs}

    async def download_param_grads_async(self) -> dict:
        self._need_train("download_param_grads")
        if not any(k.startswith("grad/") for k in self._train.graph.writebacks):
            raise RuntimeError("this module was compiled with keep_grads=False")
        async with self._lost("download_param_grads"):
            return {n: to_user(await self.backend.read(f"grad/{n}")) for n in self.trainable_names}

    async def upload_params_async(self, params: dict, *, partial: bool = False,
                                  allow_nonfinite: bool = False) -> None:
        """Write parameters (name -> array); every entry is checked (arrays.to_host: shape,
        dtype, NaN/inf unless allow_nonfinite=True) before any is written."""
        await self._upload_params(params, partial, "upload_params", "partial=True",
                                  allow_nonfinite)

    async def _upload_params(self, params, partial: bool, method: str, partial_kw: str,
                             allow_nonfinite: bool = False) -> None:
        """upload_params, its errors naming `method` and its keyword for a partial upload
        (load_state_dict: strict=False)."""
        self.check_alive(method)
        if not isinstance(params, dict):
            raise FeedError(f"{method}(): pass a dict name -> array, got {type(params).__name__}")
        unknown = sorted(set(params) - set(self._specs))
        if unknown:
            raise FeedError(f"{method}(): unknown parameter {', '.join(map(repr, unknown))}; "
                            f"the parameters are {', '.join(self._specs)}")
        missing = [n for n in self._specs if n not in params]
        if missing and not partial:
            raise FeedError(f"{method}(): missing {', '.join(map(repr, missing))}; pass all "
                            f"parameters or {partial_kw}")
        # an f16 parameter takes f32 values, rounded where it is held
        hosts = {n: to_host(v, shape=self._specs[n].held[0],
                            dtype={"f16": "f32"}.get(self._specs[n].held[1], self._specs[n].held[1]),
                            what=f"{method}(): '{n}'", allow_nonfinite=allow_nonfinite)
                 for n, v in params.items()}  # every check before any write
        await self.write_state_async(hosts, method=method)

    async def reset_async(self) -> None:
        self.check_alive("reset")
        async with self._lost("reset"):
            self._init_params()
            self._zero_state(optimizer_only=False)
            await self._recopy()
            await self._reread_loss_scale()

    async def reset_optimizer_state_async(self) -> None:
        self.check_alive("reset_optimizer_state")
        async with self._lost("reset_optimizer_state"):
            self._zero_state(optimizer_only=True)
            await self._recopy()
            await self._reread_loss_scale()

    async def _recopy(self) -> None:
        if self._guard is not None and self._guard.has_copy:
            self._guard.commit(await self._guard.read())

    async def recover_async(self) -> int:
        """After DeviceLostError: rebuild every program of this module (the training step, its
        run() graph, forward programs made by compile_forward) on a new device and write back
        the last completed step's parameters, optimizer state and step counter. Returns that
        step counter. Needs compile_module(..., recovery="memory" or a checkpoint path)."""
        self.check_alive("recover")
        if self._guard is None or not self._guard.recovery:
            raise RuntimeError("recover(): this module keeps no copy of its state; compile it "
                               "with recovery='memory' (or recovery='file.safetensors')")
        state = self._guard.last()
        old, new = self.backend, self.backend.renewed()
        try:
            old.destroy()
        except Exception:  # a lost device may refuse even the release; its objects are dropped
            pass
        self.backend = new
        for name, spec in self._specs.items():
            new.ensure(name, *spec.held)
        new.ensure("step", (), "f32")
        for attr in ("_train", "_forward"):
            p = getattr(self, attr)
            if p is not None:
                setattr(self, attr, p.reload(new))
        for fwd in list(self._siblings):
            if fwd._prog is not None:
                fwd._prog = fwd._prog.reload(new)
        self._guard.restore(state)
        self._guard.commit(state)
        return int(state["step"][0]) if "step" in state else 0

    # -- checkpoints: safetensors files of params (+ optimizer state, step); io/checkpoint.py
    async def save_async(self, dst=None, *, optimizer: bool = True):
        from .io import checkpoint
        self.check_alive("save")
        return await checkpoint.save_async(self, dst, optimizer=optimizer)

    async def load_async(self, src, *, optimizer: bool | None = None,
                         allow_nonfinite: bool = False) -> None:
        from .io import checkpoint
        self.check_alive("load")
        await checkpoint.load_async(self, src, optimizer=optimizer,
                                    allow_nonfinite=allow_nonfinite)
        await self._recopy()  # recover() must not undo a load
        await self._reread_loss_scale()

    async def _reread_loss_scale(self) -> None:
        """loss_scale from the state (after a reset or a load); None without loss scaling."""
        if self.loss_scale is not None:
            exp = (await self.backend.read(SCALE_EXP))[0]
            self.loss_scale, self.last_step_skipped = 2.0 ** (INIT_EXP + exp), None

    # -- ONNX: the training step (or its forward) as an ONNX model; webgrad/onnx, docs/onnx.md
    async def export_onnx_async(self, path=None, *, program: str = "step"):
        """Write the training step as an ONNX model: feeds, parameters and optimizer state
        (and the step counter) in; loss, captures and the new value of every parameter and
        state buffer (`<name>:new`) out. program="run": the loss without the update, with
        the parameters embedded. Returns the onnx.Exported (bytes and the name map)."""
        self._need_train("export_onnx")
        if program not in ("step", "run"):
            raise ValueError(f"export_onnx(): program must be 'step' or 'run', got {program!r}")
        prog = self._train if program == "step" else self._forward
        return await export_program_async(prog, path, embed=program == "run",
                                          doc=f"webgrad training {program}")

    def export_onnx(self, path=None, *, program="step"): return run_blocking(self.export_onnx_async(path, program=program))

    # -- PyTorch: the loss graph as a torch.nn.Module, state dicts back; io/torch_interop.py
    async def to_torch_async(self):
        from .io import torch_interop
        self._need_train("to_torch")
        return await torch_interop.to_torch_async(self, self._forward.graph, "loss")

    async def load_state_dict_async(self, state_dict, *, strict: bool = True,
                                    allow_nonfinite: bool = False) -> None:
        from .io import torch_interop
        await torch_interop.load_state_dict_async(self, state_dict, strict=strict,
                                                  allow_nonfinite=allow_nonfinite)

    # -- blocking forms
    def to_torch(self): return run_blocking(self.to_torch_async())
    def load_state_dict(self, state_dict, *, strict=True, allow_nonfinite=False): return run_blocking(self.load_state_dict_async(state_dict, strict=strict, allow_nonfinite=allow_nonfinite))
    def save(self, dst=None, *, optimizer=True): return run_blocking(self.save_async(dst, optimizer=optimizer))
    def load(self, src, *, optimizer=None, allow_nonfinite=False): return run_blocking(self.load_async(src, optimizer=optimizer, allow_nonfinite=allow_nonfinite))
    def step(self, feed, *, with_captures=False, allow_nonfinite=False): return run_blocking(self.step_async(feed, with_captures=with_captures, allow_nonfinite=allow_nonfinite))
    def run(self, feed, *, with_captures=False): return run_blocking(self.run_async(feed, with_captures=with_captures))
    def download_params(self): return run_blocking(self.download_params_async())
    def profile(self, feed): return run_blocking(self.profile_async(feed))
    def download_param_grads(self): return run_blocking(self.download_param_grads_async())
    def upload_params(self, params, *, partial=False, allow_nonfinite=False): return run_blocking(self.upload_params_async(params, partial=partial, allow_nonfinite=allow_nonfinite))
    def reset(self): return run_blocking(self.reset_async())
    def reset_optimizer_state(self): return run_blocking(self.reset_optimizer_state_async())
    def recover(self) -> int: return run_blocking(self.recover_async())

    def destroy(self) -> None:
        """Release the programs and GPU buffers; every later call raises DestroyedError."""
        if not self._destroyed:
            self._destroyed = True
            self.backend.destroy()
            self._train = self._forward = None

    def compile_forward(self, fwd_fn, *, inputs, training: bool = False,
                        precision: str | None = None) -> "CompiledForward":
        """A forward graph over the SAME parameters (and backend store) as this module.
        An inference graph: dropout is the identity unless training=True. precision: None
        (this module's: a precision="mixed" module's forward rounds as its training step
        does), or "f32" / "mixed" / "f16" (precision.py)."""
        self.check_alive("compile_forward")
        precision = check_precision(self.precision if precision is None else precision,
                                    "compile_forward")
        ins = parse_inputs(inputs)
        specs, g = build_forward_graph(self._factory, fwd_fn, ins, self.seed, training)
        g = dce(cse(apply_precision(g, precision)[0]))
        if {n: s.shape for n, s in specs.items()} != self.param_shapes:
            raise ValueError("compile_forward: the factory built a model with different parameters")
        fwd = CompiledForward(self, Program(self.backend, g, ins,
                                            options=getattr(self._train, "options", None)))
        self._siblings.add(fwd)
        return fwd

    def check_alive(self, method: str) -> None:
        """Raise DestroyedError, naming `method`, after destroy()."""
        if self._destroyed:
            raise DestroyedError(f"{method}(): this compiled module was destroyed (destroy() "
                                 "released its programs and buffers); compile it again")

    def _need_train(self, method):
        self.check_alive(method)
        if self._train is None:
            raise RuntimeError(f"{method}(): this module has no training graph (it was made by "
                               "compile_forward)")

    def _lost(self, method: str):
        return _LostDevice(self, method)


class _LostDevice:
    """Adds what to do next to a DeviceLostError raised inside `async with`."""

    def __init__(self, module, method):
        self.module, self.method = module, method

    async def __aenter__(self):
        return self

    async def __aexit__(self, kind, e, tb):
        if kind is not None and issubclass(kind, DeviceLostError) and "recover()" not in str(e):
            g = self.module._guard
            hint = ("call recover() to continue from the last completed step on a new device"
                    if g is not None and g.recovery else
                    "compile with recovery='memory' to be able to recover() from this")
            raise DeviceLostError(f"{self.method}(): {e}; {hint}") from None
        return False


class CompiledForward:
    """A forward-only program; shares parameters with the CompiledModule that made it."""

    def __init__(self, owner: CompiledModule, program: Program, *, owns_owner: bool = False):
        self.owner, self._prog = owner, program
        self._owns_owner = owns_owner  # compile_forward's own store: destroyed with this program

    param_names = property(lambda self: self.owner.param_names)
    ir = property(lambda self: self._prog.graph)
    kernel_count = property(lambda self: self._prog.kernel_count)
    output_shape = property(lambda self: self._prog.graph[self._prog.graph.outputs["output"]].shape)

    async def run_async(self, feed, *, with_captures: bool = False):
        self.check_alive("run")
        async with self.owner._lost("run"):
            out, caps = await self._prog.execute(feed, "run", "output", with_captures)
        out = to_user(out)
        return (out, caps) if with_captures else out

    def run(self, feed, *, with_captures=False):
        return run_blocking(self.run_async(feed, with_captures=with_captures))

    async def profile_async(self, feed):
        """One forward run timing every kernel (profile.py)."""
        return await self._prog.profile(feed, "profile")

    def profile(self, feed): return run_blocking(self.profile_async(feed))

    async def to_torch_async(self):
        """This forward graph as a torch.nn.Module (io/torch_interop.py), output as forward's."""
        from .io import torch_interop
        return await torch_interop.to_torch_async(self.owner, self._prog.graph, "output")

    def to_torch(self): return run_blocking(self.to_torch_async())

    async def export_onnx_async(self, path=None, *, embed_params: bool = True):
        """This forward program as an ONNX model (feeds in, output and captures out), its
        parameters embedded (embed_params=False: model inputs named as the parameters)."""
        self.check_alive("export_onnx")
        return await export_program_async(self._prog, path, embed=embed_params,
                                          doc="webgrad forward program")

    def export_onnx(self, path=None, *, embed_params=True): return run_blocking(self.export_onnx_async(path, embed_params=embed_params))

    # parameter access goes to the owner, whose store this program reads
    def download_params(self): return self.owner.download_params()
    async def download_params_async(self): return await self.owner.download_params_async()
    def upload_params(self, params, *, partial=False, allow_nonfinite=False):
        return self.owner.upload_params(params, partial=partial, allow_nonfinite=allow_nonfinite)

    async def upload_params_async(self, params, *, partial=False, allow_nonfinite=False):
        return await self.owner.upload_params_async(params, partial=partial,
                                                    allow_nonfinite=allow_nonfinite)
    def reset(self): return self.owner.reset()

    def destroy(self) -> None:
        """Release this program; every later run raises DestroyedError."""
        prog, self._prog = self._prog, None
        if prog is not None and self._owns_owner:
            self.owner.destroy()

    def check_alive(self, method: str) -> None:
        """Raise DestroyedError, naming `method`, after this program's or its owner's destroy()."""
        if self._prog is None:
            raise DestroyedError(f"{method}(): this forward program was destroyed; compile it again")
        self.owner.check_alive(method)
