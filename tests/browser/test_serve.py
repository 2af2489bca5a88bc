"""serve.py as a dev server that holds: odd paths get 404 (never a dropped connection), a busy
port or a wildcard host get plain words, IPv6 works, every response says nosniff.

These talk plain HTTP (http.client) to servers on free ports, or run serve.py's main() with its
output captured; no browser is involved.
"""
from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served(serve_module):
    """serve.py's server over this checkout, on a free port."""
    serve_module.provision(REPO)
    srv = serve_module.make_server("127.0.0.1", 0, REPO)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _get(address, path, method="GET"):
    conn = http.client.HTTPConnection(*address[:2], timeout=10)
    conn.request(method, path)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response, body


def test_overlong_path_component_is_404(served):
    for path in ["/" + "a" * 300, "/worker/" + "b" * 256 + ".mjs", "/examples/" + "%41" * 400]:
        response, _ = _get(served.server_address, path)  # a dropped connection raises here
        assert response.status == 404, path


def test_symlink_loop_is_404(served):
    loop = REPO / "web" / "assets" / "loop-test"
    other = REPO / "web" / "assets" / "loop-test-2"
    for link, target in ((loop, other), (other, loop)):
        if link.is_symlink():
            link.unlink()
        link.symlink_to(target.name)
    try:
        for path in ["/assets/loop-test", "/assets/loop-test/x.js"]:
            response, _ = _get(served.server_address, path)
            assert response.status == 404, path
    finally:
        loop.unlink()
        other.unlink()


def test_nosniff_and_examples_served(served):
    response, body = _get(served.server_address, "/")
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    response, body = _get(served.server_address, "/examples/mlp_sin.py")
    assert response.status == 200 and body == (REPO / "examples" / "mlp_sin.py").read_bytes()
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    response, body = _get(served.server_address, "/assets/ui/bundle.mjs", "HEAD")
    assert response.status == 200 and response.headers["Content-Type"] == "text/javascript"



def test_manifest_extra_is_served_beside_the_manifest(served, serve_module):
    """make_server(manifest_extra=...) adds fields to /assets/manifest.json (BrowserSession's
    {"auto": "webgpu"}, which worker.mjs reads); without it the file is served as it is."""
    import json
    on_disk = json.loads((REPO / "web" / "assets" / "manifest.json").read_text())
    response, body = _get(served.server_address, "/assets/manifest.json")
    assert response.status == 200 and json.loads(body) == on_disk
    srv = serve_module.make_server("127.0.0.1", 0, REPO, manifest_extra={"auto": "webgpu"})
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        response, body = _get(srv.server_address, "/assets/manifest.json?v=1")
        assert response.status == 200 and json.loads(body) == {**on_disk, "auto": "webgpu"}
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["Content-Type"] == "application/json"
        response, _ = _get(srv.server_address, "/assets/manifest.json", "HEAD")
        assert response.status == 200
    finally:
        srv.shutdown()
        srv.server_close()

def _has_ipv6() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6(), reason="no IPv6 loopback on this machine")
def test_ipv6_host(serve_module):
    srv = serve_module.make_server("::1", 0, REPO)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert serve_module.server_url(srv).startswith("http://[::1]:")
        conn = http.client.HTTPConnection("::1", srv.server_address[1], timeout=10)
        conn.request("GET", "/")
        response = conn.getresponse()
        assert response.status == 200 and b"main.mjs" in response.read()
        conn.close()
    finally:
        srv.shutdown()
        srv.server_close()


def _serve(*args, timeout=20):
    """Run serve.py as a person would; returns (exit code or None if still serving, output)."""
    proc = subprocess.Popen([sys.executable, str(REPO / "serve.py"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
        return None, out


def test_busy_port_says_so_without_traceback():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, out = _serve("--port", str(port))
    assert code == 1, out
    assert f"port {port}" in out and "already in use" in out and "--port" in out, out
    assert "Traceback" not in out


def test_wildcard_host_warns_and_prints_usable_urls():
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out = _serve("--host", "0.0.0.0", "--port", str(port), timeout=15)
    assert code is None, out  # it was serving until stopped
    assert "EVERY network interface" in out, out
    assert f"http://127.0.0.1:{port}/" in out  # a URL that works here, not http://0.0.0.0
    assert f"http://0.0.0.0:{port}" not in out
    assert "ssh -L" in out  # and how to reach it from elsewhere with WebGPU (secure context)


def test_models_are_served_with_an_etag_that_follows_the_file(served):
    """models/ is where the surprisal page loads weights by URL; the ETag keys its cache."""
    import os
    import uuid
    path = REPO / "models" / f"etag-test-{uuid.uuid4().hex[:8]}.bin"
    path.parent.mkdir(exist_ok=True)
    try:
        path.write_bytes(b"x" * 100)
        head, body = _get(served.server_address, f"/models/{path.name}", "HEAD")
        get, data = _get(served.server_address, f"/models/{path.name}")
        assert head.status == get.status == 200 and data == b"x" * 100 and body == b""
        tag = head.getheader("ETag")
        assert tag and tag == get.getheader("ETag") and head.getheader("Content-Length") == "100"
        path.write_bytes(b"y" * 101)
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        assert _get(served.server_address, f"/models/{path.name}", "HEAD")[0].getheader("ETag") != tag
        assert _get(served.server_address, "/models/missing.safetensors")[0].status == 404
    finally:
        path.unlink(missing_ok=True)


def test_lab_without_a_site_says_what_to_install(serve_module, tmp_path, monkeypatch):
    """Plain `python3 serve.py` (no jupyterlite installed) serves no notebook site: /lab/ then
    answers with a page naming what to install and the build's own reason, not a bare 404."""
    monkeypatch.setattr(serve_module.provisioning, "LAB_PROBLEM", "the notebook site needs jupyterlite-core")
    srv = serve_module.make_server("127.0.0.1", 0, REPO)
    handler = srv.RequestHandlerClass.func
    handler.mounts = [(p, tmp_path / "no-site" if p == "/lab/" else f) for p, f in handler.mounts]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        for path in ("/lab/", "/lab"):
            response, body = _get(srv.server_address, path)
            text = body.decode()
            assert response.status == 404, path
            assert ".[lab]" in text and "venv" in text and "needs jupyterlite-core" in text, text
        response, body = _get(srv.server_address, "/lab/no-such-file.js")
        assert response.status == 404 and b".[lab]" not in body   # other files: a plain 404
        response, _ = _get(srv.server_address, "/index.html")
        assert response.status == 200
    finally:
        srv.shutdown()
        srv.server_close()
