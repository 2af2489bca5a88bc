"""Blocking calls into async code: `run_blocking(coro)` drives a coroutine to completion.

Everything that touches a GPU host is async, because in the browser a read-back is a
Promise. The blocking forms of the API (CompiledModule.step, GPT2.forward, gpu_dequant.write,
a WebGPU backend's parameter init) drive the coroutine directly when it never suspends
(reference, torch, native WebGPU), and through `pyodide.ffi.run_sync` (JSPI) in the browser
worker. It sits at the bottom of the package (docs/architecture.md) so that executors and
file formats can block without importing the runtime API.
"""
from __future__ import annotations

import sys


def run_blocking(coro):
    """Run a coroutine to completion from synchronous code."""
    if sys.platform == "emscripten":
        from pyodide.ffi import can_run_sync, run_sync
        if can_run_sync():
            return run_sync(coro)
        coro.close()
        raise RuntimeError("the blocking API needs JSPI (run the code with runPythonAsync in a "
                           "browser that supports it); otherwise await the *_async methods")
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("this backend suspends on the GPU: await the *_async method instead")


__all__ = ["run_blocking"]
