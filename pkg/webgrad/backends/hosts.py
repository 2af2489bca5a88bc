"""Which GPUHost a WebGPU program runs on: the browser's navigator.gpu or native wgpu-py.

``WebGPUBackend`` asks ``default_host()`` instead of importing a host itself, so the same backend
code runs unchanged in CPython and in the Pyodide worker.
"""
from __future__ import annotations

import sys

from .gpu_host import GPUHost


def default_host() -> GPUHost:
    """BrowserHost under Pyodide (sys.platform == "emscripten"), NativeHost (wgpu-py) elsewhere."""
    if sys.platform == "emscripten":
        from .webgpu_browser import BrowserHost
        return BrowserHost()
    from .webgpu_native import NativeHost
    return NativeHost()
