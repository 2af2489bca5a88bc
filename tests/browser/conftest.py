"""Browser tests share the fixtures of tests/conftest.py (one browser, one Pyodide boot).

A test that takes `backend` runs twice: in the session's Chromium, whose pages run on WebGPU,
and in the Chromium without WebGPU, where backend 'auto' picks the CPU backend ('wasm',
onnxruntime-web); `page_session` is the BrowserSession of that browser, booted in set-up.
"""
from __future__ import annotations

import pytest


@pytest.fixture(params=["webgpu", "wasm"])
def backend(request):
    return request.param


@pytest.fixture
def page_session(backend, request):
    return request.getfixturevalue(
        "browser_session" if backend == "webgpu" else "browser_without_webgpu")
