"""Dawn's toggles as webgpu_device asks for them: the native device drops robustness clamping
by default (measured faster on the H200, bench/README.md) and the environment takes it back;
wgpu-native, which has no toggles, reports none. Checked against the rule the module
docstring states (names enable, -names disable, a capability toggle can be dropped) and
against a real lavapipe device made through wgpu-native."""
from __future__ import annotations

import pytest

from backends import webgpu_available
from webgrad.backends import webgpu_device as wd


def test_the_native_default_drops_robustness_and_the_environment_restores_it(monkeypatch):
    monkeypatch.delenv("WEBGRAD_DAWN_DEVICE_TOGGLES", raising=False)
    assert wd._toggle_lists((), "WEBGRAD_DAWN_DEVICE_TOGGLES", wd.DEVICE_TOGGLES) == \
        (["disable_robustness"], [])
    monkeypatch.setenv("WEBGRAD_DAWN_DEVICE_TOGGLES", "-disable_robustness")
    assert wd._toggle_lists((), "WEBGRAD_DAWN_DEVICE_TOGGLES", wd.DEVICE_TOGGLES) == \
        ([], ["disable_robustness"])
    monkeypatch.setenv("WEBGRAD_DAWN_DEVICE_TOGGLES", "")  # set but empty: no device toggle
    assert wd._toggle_lists((), "WEBGRAD_DAWN_DEVICE_TOGGLES", wd.DEVICE_TOGGLES) == ([], [])
    monkeypatch.setenv("WEBGRAD_DAWN_TOGGLES", "-allow_unsafe_apis,dump_shaders")
    assert wd._toggle_lists(wd.CAPABILITY_TOGGLES, "WEBGRAD_DAWN_TOGGLES", wd.DAWN_TOGGLES) == \
        (["vulkan_enable_f16_on_nvidia", "dump_shaders"], ["allow_unsafe_apis"])


@pytest.mark.webgpu
@pytest.mark.skipif(not webgpu_available(), reason="no native WebGPU adapter")
def test_wgpu_native_reports_no_device_toggles():
    import wgpu
    dev = wd.Device(lib=wgpu)
    assert dev.device_toggles == ()
    assert dev.device.create_buffer(size=16, usage=wgpu.BufferUsage.STORAGE) is not None
    dev.device.destroy()
