"""The executor interface: a store of persistent buffers, and graphs prepared to run on it.

Every backend (reference.py, torch_backend.py, webgpu.py) subclasses Backend: the methods the
runtime API (compiled.py) calls on any executor. It has a module of its own, apart from the
package's get_backend (which imports every executor), so that executors import it without a
cycle.
"""
from __future__ import annotations


class Backend:
    name = "?"
    # whether run_into_async runs WebGPU plans (backends/gpu_host.py's format) on this
    # backend's device: io/gpu_dequant.py decodes on the device there, elsewhere on the host
    runs_plans = False

    def ensure(self, name: str, shape, dtype: str) -> bool:
        """Create persistent buffer `name` if missing (zero-filled); True if created."""
        raise NotImplementedError

    def write(self, name: str, host) -> None:
        raise NotImplementedError

    async def read(self, name: str):
        raise NotImplementedError

    def shape_of(self, name: str) -> tuple | None:
        """The shape of persistent buffer `name` (None if there is none). Executors whose
        store holds arrays without a `.shape` (the wasm backend's ort.Tensor) override it."""
        slot = self.store.get(name)
        return None if slot is None else tuple(slot.shape)

    def prepare(self, graph, options=None):
        """An executable of `graph`. options: the codegen.KernelOptions of a backend that
        generates kernels (None: the backend's own); executors that generate none ignore it."""
        raise NotImplementedError

    def transposed_views(self, options=None) -> bool | str:
        """The precision pass's transposed_views for a mixed program compiled for this
        backend with kernel options `options` (codegen KernelOptions.mma_transposed): False
        for executors whose kernels read no operand stored transposed."""
        return False

    def init_params(self, items, *, seed: int) -> None:
        """Write the initial value of every (name, Init, shape) in `items` (init.py's
        generator: the same bits on every backend). Here on the host, with numpy where it
        imports; the WebGPU backend computes them on the device instead."""
        from ..arrays import HostArray
        from ..init import generate, values_numpy
        try:
            import numpy as np
        except ImportError:
            np = None
        for name, spec, shape in items:
            h = HostArray("f32", shape=shape)
            if np is not None:
                h.frombytes(values_numpy(np, spec, shape, seed=seed, name=name).tobytes())
            else:
                h.extend(generate(spec, shape, seed=seed, name=name))
            self.write(name, h)

    async def run_into_async(self, name: str, plan: dict, *, buffer: int, writes: dict) -> None:
        """Run a one-off `plan` whose buffer number `buffer` is persistent buffer `name`
        (runs_plans backends only: the WebGPU one)."""
        raise NotImplementedError(f"backend {self.name!r} runs no WebGPU plans; check "
                                  "backend.runs_plans and write host values instead")

    def destroy(self) -> None:
        pass

    def renewed(self) -> "Backend":
        """A backend of the same kind on a working device, for recover() after a lost one.
        CPU executors never lose theirs: they return themselves."""
        return self
