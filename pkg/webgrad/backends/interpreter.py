"""A node-by-node interpreter of the IR, shared by the reference (numpy) and torch backends.

Subclasses give the per-op implementation table and the conversions between HostArrays
and their array type; the walk, the persistent store and the writeback rule live here.
Leaves that read nothing (constants, aranges) are built once, when a graph is prepared.
"""
from __future__ import annotations

from ..arrays import HostArray
from .base import Backend


class Interpreter(Backend):
    impls: dict  # op name -> fn(attrs, *arrays)

    def __init__(self):
        self.store: dict[str, object] = {}

    # conversions, per array library
    def from_host(self, h: HostArray): raise NotImplementedError
    def to_host(self, x, dtype: str) -> HostArray: raise NotImplementedError
    def zeros(self, shape, dtype): raise NotImplementedError

    def from_numpy(self, x):
        """A float32 numpy array as this executor's array (init_params' fast path)."""
        from ..arrays import HostArray
        h = HostArray("f32", shape=x.shape)
        h.frombytes(x.tobytes())
        return self.from_host(h)

    def init_params(self, items, *, seed: int) -> None:
        """numpy's values straight into the store: GPT-2's 124M values otherwise went
        through three copies (bytes, HostArray, numpy again)."""
        try:
            import numpy as np
        except ImportError:
            return super().init_params(items, seed=seed)
        from ..init import values_numpy
        for name, spec, shape in items:
            x = self.from_numpy(values_numpy(np, spec, shape, seed=seed, name=name))
            self.store[name] = self.like_held(x, self.store.get(name))

    def like_held(self, x, held):
        """x in the dtype of the array it replaces (an f16 parameter stays f16: its values
        are rounded); subclasses convert, per array library."""
        return x

    def ensure(self, name, shape, dtype):
        if name in self.store:
            return False
        self.store[name] = self.zeros(tuple(shape), dtype)
        return True

    def write(self, name, host):
        self.store[name] = self.like_held(self.from_host(host), self.store.get(name))

    async def read(self, name):
        x = self.store[name]
        return self.to_host(x, "i32" if "int" in str(x.dtype) else "f32")

    def prepare(self, graph, options=None):  # options: no kernels here to generate
        missing = sorted({n.op for n in graph.nodes} - set(self.impls) - set(_READ_LEAVES))
        if missing:
            raise NotImplementedError(f"backend {self.name!r} has no implementation of {missing}")
        return _Run(self, graph)


_READ_LEAVES = ("input", "param", "state")  # read per step; every other leaf is fixed


class _Run:
    def __init__(self, backend: Interpreter, graph):
        self.b, self.g = backend, graph
        # constants and aranges are the same every step: built once here (rope tables, loss
        # weights); no implementation writes into its operands, so sharing them is safe
        self.fixed = {n.id: backend.impls[n.op](n.attrs) for n in graph.nodes
                      if not n.inputs and n.op not in _READ_LEAVES}

    async def run(self, feeds: dict[str, HostArray], fetch: list[str]) -> dict[str, HostArray]:
        b, g = self.b, self.g
        vals: list = [None] * len(g.nodes)
        for n in g.nodes:
            if n.op == "input":
                vals[n.id] = b.from_host(feeds[n.attrs["name"]])
            elif n.op in ("param", "state"):
                vals[n.id] = b.store[n.attrs["name"]]
            elif n.inputs:
                vals[n.id] = b.impls[n.op](n.attrs, *[vals[i] for i in n.inputs])
            else:
                vals[n.id] = self.fixed[n.id]
        out = {k: b.to_host(vals[g.outputs[k]], g[g.outputs[k]].dtype) for k in fetch}
        for name, i in g.writebacks.items():  # after every read: a step sees old values
            b.store[name] = vals[i]
        return out
