"""The reference executor: numpy, op by op, using each primitive's `ref` rule.

This is the executable specification: every other executor is judged against it. It
needs numpy (a test/optional dependency); the browser, which has none, uses webgpu.
"""
from __future__ import annotations

from ..arrays import HostArray, to_numpy
from ..primitives import NUMPY_DTYPES, PRIMS
from .interpreter import Interpreter


class ReferenceBackend(Interpreter):
    name = "reference"

    def __init__(self):
        try:
            import numpy as np
        except ImportError:
            raise ImportError("backend='reference' needs numpy (pip install numpy); in the "
                              "browser use backend='auto' (WebGPU, or without it the CPU "
                              "backend 'wasm')") from None
        super().__init__()
        self.np = np
        self.impls = {name: (lambda ref: lambda attrs, *xs: ref(np, attrs, *xs))(p.ref)
                      for name, p in PRIMS.items() if p.ref is not None}

    def from_numpy(self, x):
        return x  # the reference store holds numpy arrays: no copy

    def like_held(self, x, held):
        if held is not None and held.dtype == self.np.float16 and x.dtype != held.dtype:
            with self.np.errstate(over="ignore"):
                return x.astype(self.np.float16)
        return x

    def from_host(self, h: HostArray):
        return to_numpy(self.np, h)

    def to_host(self, x, dtype):
        np = self.np
        dtype = "f32" if dtype == "f16" else dtype  # an f16 value reaches the host as f32
        # np.asarray + order="C", not ascontiguousarray: that one turns rank 0 into shape (1,)
        x = np.asarray(x, dtype=np.float32 if dtype == "f32" else np.int32, order="C")
        out = HostArray(dtype, shape=x.shape)
        out.frombytes(x.tobytes())
        return out

    def zeros(self, shape, dtype):
        return self.np.zeros(shape, NUMPY_DTYPES[dtype])
