"""What the test modules share about backends: whether this machine has a native WebGPU
adapter (lavapipe in CI), and the "webgpu" parameter that is skipped where it has none."""
from __future__ import annotations

import pytest


def webgpu_available() -> bool:
    try:
        from webgrad.backends.webgpu_native import NativeHost
        NativeHost()
        return True
    except Exception:
        return False


WEBGPU = pytest.param("webgpu", marks=[pytest.mark.webgpu, pytest.mark.skipif(
    not webgpu_available(), reason="no native WebGPU adapter")])


def native_adapter_is_cpu() -> bool:
    """Whether this machine's native adapter is a CPU one (lavapipe): a test form forced to
    what such an adapter runs by default repeats the default case and is left out."""
    try:
        from webgrad.backends.webgpu import is_cpu_adapter
        from webgrad.backends.webgpu_native import NativeHost
        return is_cpu_adapter(str(NativeHost().info))
    except Exception:
        return False
