"""webgrad: Python that trains and runs neural networks on the GPU inside a web page.

Declare a Module, write a loss function, and `compile_module` traces it into a static-shape
IR, appends gradients and the optimizer to the same IR, and runs each training step as one
compiled program on "reference" (numpy), "torch", "webgpu", or "wasm" (the graph exported to
ONNX, run by ONNX Runtime: onnxruntime-web on the CPU where a page has no WebGPU). See compile.py for the
pipeline, primitives/ for the op registry, docs/architecture.md for the layers (data and
specs, file formats, the op language, modules and autodiff, tracing, lowering, executors, the
runtime API, the driver, models): a module imports only its own layer and those below
(tests/test_layers.py).
"""
from . import init, lora, lr, nn, ops, optim
from .arrays import FeedError, HostArray
from .compile import compile_forward, compile_module
from .backends import device_info
from .backends.gpu_host import DeviceLostError
from .compiled import CompiledForward, CompiledModule, DestroyedError
from .io.torch_interop import from_torch_state_dict
from .ir import Graph, Node
from .module import Module
from .ops import capture
from .primitives import ShapeError
from .recovery import NonFiniteError
from .tensor import Tensor

__version__ = "0.1.0"

__all__ = ["Module", "Tensor", "ops", "nn", "lr", "init", "optim", "lora", "capture", "compile_module",
           "compile_forward", "CompiledModule", "CompiledForward", "Graph", "Node", "HostArray",
           "FeedError", "ShapeError", "DestroyedError", "DeviceLostError", "NonFiniteError",
           "from_torch_state_dict", "device_info", "__version__"]
