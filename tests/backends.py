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
