"""ONNX export: a webgrad graph (a training step or a forward program) as an ONNX model.

Every primitive of the registry (webgrad.primitives) is lowered to standard ONNX operators of
one opset, OPSET (lower.py's LOWERINGS; docs/onnx.md lists which). The model's inputs are
the graph's feeds and persistent buffers (parameters, optimizer state, the step counter);
its outputs are the graph's outputs (loss or output, captures) and, for a training step,
the new value of every persistent buffer it writes (`<name>:new`), so a runtime that feeds
those back each step trains exactly as webgrad's executors do. Forward programs may embed
their parameters instead (initializers), which makes a self-contained file for deployment.

The file is written in pure Python (proto.py: the protobuf wire format), so the same code
exports in CPython and in Pyodide, where the browser's CPU backend (backends/onnx_runtime.py,
ONNX Runtime Web's WebAssembly) runs what it writes. Consumers: CompiledModule.export_onnx,
CompiledForward.export_onnx and that backend.
"""
from __future__ import annotations

from .lower import IR_VERSION, LOWERINGS, OPSET, Exported, export_graph

__all__ = ["IR_VERSION", "LOWERINGS", "OPSET", "Exported", "export_graph"]
