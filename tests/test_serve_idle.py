"""serve.py closes idle connections: 50 connections that send nothing, and 10 that send half
a request line, are each closed by the server after its idle timeout, their handler threads
end, and a request made while they are open, and one after, is answered.

Before, a handler waited on its socket with no timeout, so each abandoned connection held a
thread for good. In-process, on a free loopback port, with a 1 s timeout; no browser, no
provisioning (web/index.html is served from the checkout as it is).
"""
from __future__ import annotations

import http.client
import importlib.util
import socket
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def serve():
    spec = importlib.util.spec_from_file_location("webgrad_serve_idle", REPO / "serve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _get(address, path="/index.html"):
    conn = http.client.HTTPConnection(*address[:2], timeout=10)
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


def _handler_threads(server_thread) -> int:
    return sum(1 for t in threading.enumerate() if t is not server_thread
               and t is not threading.main_thread() and t.name.startswith("Thread-"))


@pytest.mark.timeout(60)
def test_idle_connections_time_out_and_the_server_still_answers(serve):
    srv = serve.make_server("127.0.0.1", 0, REPO, idle_timeout=1.0)
    runner = threading.Thread(target=srv.serve_forever, name="serve_forever", daemon=True)
    runner.start()
    idle = []
    try:
        before = _handler_threads(runner)
        for i in range(60):
            s = socket.create_connection(srv.server_address[:2], timeout=10)
            if i >= 50:
                s.sendall(b"GET /index.html HT")          # half a request line, then nothing
            idle.append(s)
        status, body = _get(srv.server_address)           # answered while 60 sit idle
        assert status == 200 and b"<html" in body.lower()
        t0 = time.monotonic()
        for s in idle:                                    # each closed by the server
            s.settimeout(10)
            rest = b""
            while chunk := s.recv(4096):                  # b"" = the server closed it
                rest += chunk
            assert rest == b"" or rest.startswith(b"HTTP/1.")   # a 408 for half a request
        waited = time.monotonic() - t0
        assert waited < 8, f"idle connections took {waited:.1f} s to close (timeout 1 s)"
        deadline = time.monotonic() + 5
        while _handler_threads(runner) > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _handler_threads(runner) <= before, "handler threads outlived their connections"
        status, _ = _get(srv.server_address)
        assert status == 200
    finally:
        for s in idle:
            s.close()
        srv.shutdown()
        srv.server_close()


def test_idle_timeout_is_checked(serve):
    with pytest.raises(ValueError, match="idle_timeout must be a number of seconds > 0"):
        serve.make_server("127.0.0.1", 0, REPO, idle_timeout=0)
    assert serve.IDLE_TIMEOUT == 30.0
