"""Executors: where a compiled IR runs.

Every backend owns a *store* of persistent buffers (params, optimizer state, the step
counter), shared by all graphs compiled against it (a training step and its sibling
forward graphs), and turns a Graph into an executable whose `run(feeds, fetch)` computes
the requested outputs and then lands the graph's writebacks in the store.

  reference   numpy interpreter, primitives.py's `ref` rules: the executable spec
  torch       the same walk with torch ops, on any torch device ("torch:cuda")
  webgpu      WGSL kernels and a buffer plan, on wgpu-py/Dawn or navigator.gpu
  wasm        the graph exported to ONNX, run by ONNX Runtime on the CPU (onnxruntime-web's
              WebAssembly in the browser, the onnxruntime package in CPython)
  auto        webgpu when an adapter exists, else reference (said once)

The Backend base class (base.py) is what they share; get_backend(spec) picks one by name.
"""
from __future__ import annotations

import warnings

from .base import Backend

_auto_said = False


def get_backend(spec, *, options=None) -> Backend:
    """options: the codegen.KernelOptions of a new WebGPU backend (webgpu, auto)."""
    if isinstance(spec, Backend):
        return spec
    name, colon, device = str(spec).partition(":")
    if colon and name != "torch":  # only torch takes a device ("torch:cuda:1")
        raise ValueError(f"backend {spec!r}: only 'torch' takes a device after ':' "
                         f"('torch:cuda'); use {name!r}")
    if name == "reference":
        from .reference import ReferenceBackend
        return ReferenceBackend()
    if name == "torch":
        from .torch_backend import TorchBackend
        return TorchBackend(device or "cpu")
    if name == "webgpu":
        from .webgpu import WebGPUBackend
        return WebGPUBackend(options=options)
    if name == "wasm":
        from .onnx_runtime import OnnxRuntimeBackend
        return OnnxRuntimeBackend()
    if name == "auto":
        global _auto_said
        try:
            from .webgpu import WebGPUBackend
            return WebGPUBackend(options=options)
        except Exception as e:  # no adapter, no wgpu: fall back, but say so once
            if not _auto_said:
                warnings.warn(f"webgrad: no WebGPU adapter ({e}); backend='auto' uses 'reference'",
                              stacklevel=3)
                _auto_said = True
            from .reference import ReferenceBackend
            return ReferenceBackend()
    raise ValueError(f"unknown backend {spec!r}: use 'reference', 'torch', 'torch:cuda', "
                     "'webgpu', 'wasm' or 'auto'")


__all__ = ["Backend", "get_backend"]
