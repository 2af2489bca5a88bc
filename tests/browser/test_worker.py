"""Tests of webgrad's browser half: serve.py, the Pyodide worker, the page API and BrowserSession.

Browser tests (marked ``browser``) run Python inside Pyodide in headless Chromium and share one
session; the serve.py tests talk plain HTTP to a server on a free port.
"""
from __future__ import annotations

import base64
import hashlib
import http.client
import io
import threading
import tomllib
import zipfile
from pathlib import Path

import pytest

from webgrad.browser import BrowserPythonError, BrowserTimeout

REPO = Path(__file__).resolve().parents[2]
browser = pytest.mark.browser


@browser
def test_runs_in_pyodide(browser_session):
    assert browser_session.run("1+2") == 3
    assert browser_session.run("import sys; sys.platform") == "emscripten"
    assert browser_session.info["jspi"] is True


@browser
def test_python_error_carries_traceback(browser_session):
    with pytest.raises(BrowserPythonError) as info:
        browser_session.run("def explode_here():\n    raise KeyError('boom')\n\nexplode_here()")
    error = info.value
    assert error.type == "KeyError" and "boom" in error.message
    assert "explode_here" in error.traceback and "raise KeyError" in error.traceback
    assert "explode_here" in str(error)
    with pytest.raises(BrowserPythonError, match="SyntaxError"):
        browser_session.run("def (:")


@browser
def test_values_round_trip(browser_session):
    s = browser_session
    value = {"a": [1, 2.5, None, True, "x"], "b": b"\x00\xff", "nested": {"t": (1, 2)}}
    assert s.run(repr(value)) == {"a": [1, 2.5, None, True, "x"], "b": b"\x00\xff",
                                 "nested": {"t": [1, 2]}}
    assert s.run("bytearray(b'ab')") == b"ab"
    assert s.run("import array; memoryview(array.array('f', [1.5, 2.0]))") == \
        b"\x00\x00\xc0?\x00\x00\x00@"
    assert s.run("2**70") == 2**70
    assert s.run("object()").startswith("<object object")  # no plain form: repr
    assert s.run("None") is None and s.run("x = 5") is None

    s.run("def echo(*args):\n    return [type(a).__name__ for a in args], list(args)")
    assert s.call("echo", 1, 0.5, "s", b"\x01", [1, {"k": None}]) == [
        ["int", "float", "str", "bytes", "list"], [1, 0.5, "s", b"\x01", [1, {"k": None}]]]
    s.run("async def later(x):\n    import asyncio\n    await asyncio.sleep(0)\n    return x + 1")
    assert s.call("later", 1) == 2
    with pytest.raises(BrowserPythonError, match="NameError"):
        s.call("no_such_function")


@browser
def test_stdout_and_progress(browser_session):
    s = browser_session
    s.run("print('hello from pyodide'); import webgrad_worker; "
          "webgrad_worker.progress({'step': 1}, loss=0.5)")
    assert "hello from pyodide" in s.stdout
    progress = s.page.evaluate("window.webgrad.progress.slice(-1)[0]")
    assert progress == {"type": "progress", "step": 1, "loss": 0.5}


@browser
def test_webgrad_version(browser_session):
    with open(REPO / "pyproject.toml", "rb") as f:
        version = tomllib.load(f)["project"]["version"]
    assert browser_session.info["webgrad_version"] == version
    assert browser_session.run("import webgrad; webgrad.__version__") == version


@browser
def test_webgpu_adapter_from_python(browser_session):
    info = browser_session.run("""
from js import navigator
from pyodide.ffi import run_sync
adapter = run_sync(navigator.gpu.requestAdapter())
limits = adapter.limits
{"maxBufferSize": limits.maxBufferSize,
 "maxComputeWorkgroupSizeX": limits.maxComputeWorkgroupSizeX,
 "maxStorageBufferBindingSize": limits.maxStorageBufferBindingSize}
""")
    assert info["maxComputeWorkgroupSizeX"] >= 64
    assert info["maxStorageBufferBindingSize"] >= 2**20
    # Top-level await works too.
    assert browser_session.run(
        "(await navigator.gpu.requestAdapter()) is not None") is True


@browser
def test_timeout_interrupts_runaway_code(browser_session):
    with pytest.raises(BrowserTimeout, match="KeyboardInterrupt"):
        browser_session.run("while True: pass", timeout=1)
    assert browser_session.run("'still alive'", timeout=10) == "still alive"


@browser
def test_interrupt_reaches_a_call_that_has_not_started(browser_session):
    # the call is queued while the worker boots (on a loaded machine a 1 s timeout can end
    # before the code starts): the interrupt must not be forgotten when its turn comes (the
    # worker resets the interrupt flag at each call's start), or the loop runs forever
    page = browser_session.new_page()  # its own worker, interrupted before its boot ends
    try:
        outcome = page.evaluate("""async () => {
          const api = window.webgrad;
          const hung = new Promise((resolve) => setTimeout(() => resolve("hung"), 30000));
          const first = api.run("while True: pass");
          api.interrupt();
          const got = await Promise.race([first.then(() => "resolved", (e) => e), hung]);
          const later = await Promise.race([api.run("'still alive'").catch((e) => e), hung]);
          return {got, later};
        }""")
    finally:
        page.close()
    assert outcome["got"] != "hung", "the interrupted call never ended"
    assert outcome["got"]["type"] == "KeyboardInterrupt", outcome
    assert outcome["later"] == "still alive", outcome


@browser
def test_killed_worker_rejects_pending_calls(browser_session):
    page = browser_session.new_page()  # its own worker: the shared one stays healthy
    try:
        outcome = page.evaluate("""async () => {
          const api = window.webgrad;
          await api.ready;
          const pending = api.run("while True: pass");
          await new Promise((resolve) => setTimeout(resolve, 300));
          api._terminate();
          const first = await pending.then(() => "resolved", (e) => e);
          const later = await api.run("1").then(() => "resolved", (e) => e);
          return {first, later};
        }""")
    finally:
        page.close()
    assert outcome["first"]["type"] == "WorkerTerminated"
    assert outcome["later"]["type"] == "WorkerTerminated"


@browser
def test_worker_that_dies_silently_fails_pending_calls(browser_session):
    # close() ends the worker with no `error` event; the page learns of it from the Web Lock the
    # worker held while alive, so the pending call fails instead of waiting forever
    page = browser_session.new_page()
    try:
        outcome = page.evaluate("""async () => {
          const api = window.webgrad;
          await api.ready;
          const pending = api.run("import js, asyncio\\njs.close()\\nawait asyncio.sleep(3600)");
          const settle = (p) => Promise.race([p.then(() => "resolved", (e) => e),
            new Promise((resolve) => setTimeout(() => resolve("hung"), 30000))]);
          const first = await settle(pending);
          const later = await settle(api.run("1"));
          return {first, later};
        }""")
    finally:
        page.close()
    assert outcome["first"] != "hung", "a pending call waited on a dead worker"
    assert outcome["first"]["type"] == "WorkerDied", outcome
    assert "reload the page" in outcome["first"]["message"]
    assert outcome["later"]["type"] == "WorkerDied"


# --- serve.py, over plain HTTP ---------------------------------------------------------------

@pytest.fixture(scope="module")
def server(serve_module):
    serve_module.provision(REPO)
    srv = serve_module.make_server("127.0.0.1", 0, REPO)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[:2]
    srv.shutdown()
    srv.server_close()


def _get(address, path, method="GET"):
    conn = http.client.HTTPConnection(*address, timeout=10)
    conn.request(method, path)  # http.client sends the path as given: no normalization
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response, body


@pytest.mark.parametrize("path", [
    "/../pyproject.toml", "/%2e%2e/pyproject.toml", "/%2E%2E/serve.py", "/worker/../serve.py",
    "/worker/..%2f..%2fpyproject.toml", "/assets/pyodide/../../../../../pyproject.toml",
    "//etc/passwd", "/%2fetc/passwd", "/..\\serve.py", "/assets/", "/worker/",
])
def test_serve_refuses_escapes_and_listings(server, path):
    response, body = _get(server, path)
    assert response.status in (403, 404), (path, body[:200])
    assert b"[project]" not in body and b"root:" not in body


def test_serve_headers_and_mime_types(server):
    response, body = _get(server, "/")
    assert response.status == 200 and b'src="main.mjs"' in body
    assert response.headers["Cross-Origin-Opener-Policy"] == "same-origin"
    assert response.headers["Cross-Origin-Embedder-Policy"] == "require-corp"
    assert response.headers["Cross-Origin-Resource-Policy"] == "same-origin"
    assert response.headers["Cache-Control"] == "no-cache"
    for path, mime in [("/assets/pyodide/pyodide.asm.wasm", "application/wasm"),
                       ("/assets/pyodide/pyodide.mjs", "text/javascript"),
                       ("/worker/worker.mjs", "text/javascript"),
                       ("/main.mjs", "text/javascript"),
                       ("/assets/manifest.json", "application/json")]:
        response, _ = _get(server, path, "HEAD")
        assert response.status == 200, path
        assert response.headers["Content-Type"] == mime, path


def test_webgrad_wheel_is_valid(serve_module):
    name, data = serve_module.provisioning.wheel_bytes(REPO)
    assert name.endswith("-py3-none-any.whl")
    assert serve_module.provisioning.wheel_bytes(REPO)[1] == data  # deterministic: rebuilt only on change
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = zf.namelist()
        dist_info = name.split("-py3")[0] + ".dist-info"
        assert "Tag: py3-none-any" in zf.read(f"{dist_info}/WHEEL").decode()
        assert "Name: webgrad" in zf.read(f"{dist_info}/METADATA").decode()
        for line in zf.read(f"{dist_info}/RECORD").decode().splitlines():
            path, digest, size = line.split(",")
            if path.endswith("RECORD"):
                continue
            content = zf.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=")
            assert digest == "sha256=" + expected.decode() and int(size) == len(content)
        assert "webgrad/browser.py" in names


@browser
def test_failed_boot_rejects_ready_and_calls(browser_session):
    page = browser_session.browser.new_page()
    try:
        page.route("**/assets/manifest.json", lambda route: route.fulfill(status=404))
        page.goto(browser_session.url)
        outcome = page.evaluate("""async () => {
          const api = window.webgrad;
          const call = api.run("1").then(() => "resolved", (e) => e);
          const ready = await api.ready.then(() => "resolved", (e) => e);
          return {ready, call: await call};
        }""")
    finally:
        page.close()
    assert "manifest.json: HTTP 404" in outcome["ready"]["message"]
    assert outcome["call"]["message"] == outcome["ready"]["message"]
