"""Executors: where a compiled IR runs.

Every backend owns a *store* of persistent buffers (params, optimizer state, the step
counter), shared by all graphs compiled against it (a training step and its sibling
forward graphs), and turns a Graph into an executable whose `run(feeds, fetch)` computes
the requested outputs and then lands the graph's writebacks in the store.

  reference   numpy interpreter, the primitives' `ref` rules: the executable spec
  torch       the same walk with torch ops, on any torch device ("torch:cuda")
  webgpu      WGSL kernels and a buffer plan, on wgpu-py/Dawn or navigator.gpu
  wasm        the graph exported to ONNX, run by ONNX Runtime on the CPU (onnxruntime-web's
              WebAssembly in the browser, the onnxruntime package in CPython)
  auto        webgpu when an adapter exists, else wasm in the browser and reference in
              CPython (said once); device_info() says which and why; a notebook kernel
              (no JSPI) first awaits prepare_async(), which readies the one it will use.
              In the browser a software fallback adapter (SwiftShader: isFallbackAdapter,
              or its description's words) counts as none: wasm decodes 10-14x faster there
              (bench/README.md); globalThis.webgradAuto = "webgpu" in the JS realm that
              runs Pyodide keeps auto on it (webgrad.browser.BrowserSession sets it for
              tests and benches), as backend="webgpu" does for one program. CPython keeps
              a CPU adapter (lavapipe): the native test suite runs WebGPU on it

The Backend base class (base.py) is what they share; get_backend(spec) picks one by name.
"""
from __future__ import annotations

import warnings

from .base import Backend

_auto_said = False
_auto_why = ""  # why the last backend='auto' chose what it chose (device_info)
_no_webgpu = None  # why prepare_async() got no WebGPU device: 'auto' then asks no more
AUTO_GLOBAL = "webgradAuto"  # globalThis[this] = "webgpu": auto keeps a fallback adapter


def _browser_fallback(info: str, fallback: bool) -> bool:
    """In the browser, is the adapter described by `info` a software fallback (`fallback`:
    its isFallbackAdapter, else its description's words)?"""
    from .onnx_runtime import in_pyodide
    from .webgpu import is_cpu_adapter
    return in_pyodide() and (fallback or is_cpu_adapter(info))


def _auto_kept() -> bool:
    """Does globalThis[AUTO_GLOBAL] ask backend='auto' to keep a fallback adapter?"""
    import js
    return str(getattr(js.globalThis, AUTO_GLOBAL, None) or "") == "webgpu"


def _software_adapter(info: str, fallback: bool) -> str | None:
    """In the browser, `info` (an adapter's description) when that adapter is a software
    fallback (`fallback`: its isFallbackAdapter) that backend='auto' passes over for 'wasm';
    None otherwise: in CPython, or where globalThis[AUTO_GLOBAL] is "webgpu"."""
    if not _browser_fallback(info, fallback) or _auto_kept():
        return None
    return info or "unnamed adapter"


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
        global _auto_said, _auto_why
        try:
            if _no_webgpu is not None:
                raise RuntimeError(_no_webgpu)
            from .webgpu import WebGPUBackend
            b = WebGPUBackend(options=options)
            _auto_why = "a WebGPU adapter is available"
            adapter, fallback = b.limits.adapter, getattr(b.host, "fallback", False)
            software = _software_adapter(adapter, fallback)
            if software is None:
                if _browser_fallback(adapter, fallback):   # kept by the global
                    _auto_why = (f"the WebGPU adapter is a software fallback ({adapter}), kept "
                                 f"by globalThis.{AUTO_GLOBAL} = 'webgpu'")
                return b
            try:
                cpu = get_backend("wasm")
            except Exception as e:  # a notebook kernel without onnxruntime-web: stay
                _auto_why = (f"the WebGPU adapter is a software fallback ({software}), and "
                             f"the CPU backend 'wasm' is not here ({e})")
                return b
            _auto_why = (f"the WebGPU adapter is a software fallback ({software}): the CPU "
                         "backend 'wasm' is faster there; backend='webgpu' asks for it (or "
                         f"globalThis.{AUTO_GLOBAL} = 'webgpu', for every 'auto')")
            if not _auto_said:
                warnings.warn(f"webgrad: {_auto_why}; backend='auto' uses 'wasm'", stacklevel=2)
                _auto_said = True
            return cpu
        except Exception as e:  # no adapter, no wgpu: fall back, but say so once
            from .onnx_runtime import in_pyodide
            _auto_why = f"no WebGPU adapter ({e})"
            fallback = "reference"
            if in_pyodide():  # webgrad's worker has onnxruntime-web (and no numpy)
                try:
                    b = get_backend("wasm")
                    fallback = "wasm"
                except Exception as e2:  # another Pyodide (a notebook kernel): numpy, if any
                    _auto_why += f"; no onnxruntime-web ({e2})"
            if fallback == "reference":
                try:
                    b = get_backend("reference")
                except ImportError:  # a notebook kernel not yet prepared: say how, not numpy
                    if not in_pyodide():
                        raise
                    raise RuntimeError(
                        f"backend='auto' has nothing to run on here: {_auto_why}; and "
                        "'reference' needs numpy, which this Pyodide lacks. Outside webgrad's "
                        "worker (a notebook kernel) set globalThis.webgradReplayURL and "
                        "webgradOrtURL to serve.py's /worker/replay.mjs and /worker/ort.mjs, then "
                        "`await webgrad.backends.prepare_async('auto')` once before compiling "
                        "(notebooks/mlp_sin.ipynb's second cell)") from None
            if not _auto_said:
                warnings.warn(f"webgrad: {_auto_why}; backend='auto' uses {fallback!r}",
                              stacklevel=3)
                _auto_said = True
            return b
    raise ValueError(f"unknown backend {spec!r}: use 'reference', 'torch', 'torch:cuda', "
                     "'webgpu', 'wasm' or 'auto'")


def device_info(spec="auto") -> dict:
    """Which executor `spec` (a name or a Backend) runs programs on here, and why:
    {"backend": its name, "engine": what computes (the adapter, ONNX Runtime's build, numpy,
    torch's device), "reason": why backend='auto' chose it (for other specs: "asked for")}."""
    b = get_backend(spec)
    engine = {"reference": "numpy", "torch": f"torch on {getattr(b, 'device', 'cpu')}"}.get(b.name)
    if b.name == "wasm":
        engine = b.engine
    elif b.name == "webgpu":
        engine = str(getattr(getattr(b, "limits", None), "adapter", "") or "WebGPU")
    return {"backend": b.name, "engine": engine or b.name,
            "reason": _auto_why if spec == "auto" else "asked for"}


async def prepare_async(spec="auto") -> dict:
    """Make `spec` ready for code that cannot wait on the browser (a notebook kernel, where
    Pyodide has no JSPI), then device_info(spec): in Pyodide, request the WebGPU device, and
    where there is none ('auto') or for 'wasm', load onnxruntime-web (backends/onnx_runtime.py).
    A page that is not webgrad's worker first sets where their JS lives (globalThis's
    webgradReplayURL and webgradOrtURL). In CPython it only reports."""
    global _no_webgpu
    from .onnx_runtime import in_pyodide, load_async
    cpu_wanted = spec == "wasm"
    if in_pyodide() and spec in ("auto", "webgpu"):
        from .webgpu_browser import request_device
        try:
            replay = await request_device()
            _no_webgpu = None
            if spec == "auto":  # a software fallback adapter: auto wants wasm (get_backend)
                cpu_wanted = _software_adapter(str(replay.info),
                                               bool(getattr(replay, "fallback", False))) is not None
        except Exception as e:
            if spec == "webgpu":
                raise
            _no_webgpu = str(e)
    if in_pyodide() and (cpu_wanted or (spec == "auto" and _no_webgpu is not None)):
        try:
            await load_async()
        except Exception:
            if spec == "wasm" or _no_webgpu is not None:
                raise
            # a fallback adapter and no onnxruntime-web here: auto stays on WebGPU
    return device_info(spec)


__all__ = ["Backend", "device_info", "get_backend", "prepare_async"]
