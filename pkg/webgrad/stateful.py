"""Programs with several outputs and persistent state written in place (the KV cache's home).

compile_module/compile_forward own the persistent buffers they need (params, optimizer
moments, the step counter). A decoder also needs buffers that live across calls and that a
call updates only in part: a key/value cache gets T new rows per step, at a position known
only at run time, with static shapes throughout. The pieces, all general:

  state(name, shape, dtype)        a persistent buffer of the backend's store read as a
                                   Tensor (created zero-filled by the first program naming it)
  ops.write_rows(base, rows, start)  base with rows start..start+T-1 replaced (a primitive,
                                   primitives/index.py); start is an i32 Tensor, usually a feed, so
                                   ONE program serves every position
  assign(name, value)              the buffer's value after the run (an IR writeback)

`assign(n, ops.write_rows(state(n), rows, pos))` is the in-place update: when nothing else
in the program reads the old value (readers of the new value are fine), the WebGPU back end
writes just the T rows into the persistent buffer (fusion rule 4 + codegen/rows.py); the
CPU executors keep value semantics (the spec). Nothing crosses to the host but the feeds
and the outputs a caller fetches.

`compile_program(backend, factory, fn, inputs)` traces fn(module, feeds) -> {name: Tensor}
over the factory's parameters in `backend`'s store (so it shares parameters with every
other program compiled on that backend: a training step's weights decode without a copy),
and returns a StatefulProgram whose `run(feed, fetch=[...])` reads back only the fetched
outputs. webgrad.models.gpt2 builds its forward, cached-step and surprisal programs here.
"""
from __future__ import annotations

from .arrays import to_user
from .blocking import run_blocking
from .compiled import Program, export_program_async
from .dce import cse, dce
from .ir import Graph
from .precision import apply_precision, check_precision
from .primitives import bind
from .tensor import Tensor, current_graph
from .trace import parse_inputs, trace


def state(name: str, shape, dtype: str = "f32") -> Tensor:
    """The persistent buffer `name` of the program's backend, as read at the start of a run."""
    g = current_graph()
    if name in g.state:
        return Tensor(g, g.state[name])
    return bind("state", name=name, shape=tuple(int(s) for s in shape), dtype=dtype)


def assign(name: str, value: Tensor) -> None:
    """Make `value` the content of persistent buffer `name` after the run."""
    g = current_graph()
    if name in g.writebacks:
        raise ValueError(f"assign: state {name!r} is assigned twice in one program")
    i = g.state.get(name)
    if i is not None and (g[i].shape != value.shape or g[i].dtype != value.dtype):
        raise ValueError(f"assign: state {name!r} is {g[i].type_str}, the value {value.node.type_str}")
    g.writebacks[name] = value.id


class StatefulProgram:
    """One traced graph on one backend: named outputs, persistent state, feeds checked."""

    def __init__(self, program: Program, specs):
        self._prog, self.specs = program, specs

    ir = property(lambda self: self._prog.graph)
    kernel_count = property(lambda self: self._prog.kernel_count)
    outputs = property(lambda self: list(self._prog.graph.outputs))

    async def run_raw_async(self, feed, fetch) -> dict:
        """{name: HostArray} of the fetched outputs (no numpy conversion)."""
        unknown = [k for k in fetch if k not in self._prog.graph.outputs]
        if unknown:
            raise KeyError(f"run(): no output {unknown[0]!r}; this program has {self.outputs}")
        feeds = self._prog.check_feed(feed, "run")
        return await self._prog.exe.run(feeds, list(fetch))

    async def run_async(self, feed, fetch) -> dict:
        return {k: to_user(v) for k, v in (await self.run_raw_async(feed, fetch)).items()}

    def run(self, feed, fetch) -> dict:
        return run_blocking(self.run_async(feed, fetch))

    async def export_onnx_async(self, path=None, *, embed_params: bool = True):
        """This program as an ONNX model: feeds and state (a KV cache) in, the outputs and
        each state's new value (`<name>:new`) out; parameters embedded unless
        embed_params=False (compiled.export_program_async)."""
        return await export_program_async(self._prog, path, embed=embed_params,
                                          doc="webgrad stateful program")

    def export_onnx(self, path=None, *, embed_params=True):
        return run_blocking(self.export_onnx_async(path, embed_params=embed_params))


def compile_program(backend, factory, fn, *, inputs, seed: int = 0,
                    kernel_options=None, precision: str = "f32") -> StatefulProgram:
    """Trace fn(module, feeds) -> {output name: Tensor} into an inference graph over the
    factory's parameters in `backend`'s store (created from their inits if missing).
    precision: "f32", "mixed" or "f16" (precision.py; state written back is rounded where
    the value it takes is)."""
    from .backends import get_backend
    be = get_backend(backend)
    ins = parse_inputs(inputs)
    g = Graph(training=False)
    specs, outs = trace(g, factory, fn, ins, seed)
    if not isinstance(outs, dict) or not all(isinstance(v, Tensor) for v in outs.values()):
        raise TypeError("compile_program: the function must return a dict name -> Tensor")
    for k, v in outs.items():
        g.outputs[k] = v.id
    check_precision(precision, "compile_program")
    g = dce(cse(apply_precision(dce(cse(g)), precision)[0]))
    return StatefulProgram(Program(be, g, ins, options=kernel_options), specs)


__all__ = ["state", "assign", "compile_program", "StatefulProgram"]
