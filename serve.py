#!/usr/bin/env python3
"""Serve webgrad's browser app: the page, its Pyodide worker and the wheels it installs.

webgrad's home is the browser: Python runs in Pyodide inside a module Web Worker and drives
``navigator.gpu``. This script is what makes that page work from a source checkout:

1. ``provisioning.provision(root)`` fills ``web/assets/`` (git-ignored) on first use: Pyodide
   and ONNX Runtime Web from npm, the micropip wheel, the webgrad wheel zipped from
   ``pkg/webgrad``, the playground's editor and chart bundle, and ``manifest.json``
   (provisioning.py, beside this file, says what and why; it also builds /lab/).
2. ``make_server(host, port, root)`` serves it all with the headers the page needs
   (cross-origin isolation for SharedArrayBuffer, no caching so edits show up on reload,
   ``nosniff``). After provisioning nothing is fetched from the internet.

URL layout::

    /                      web/index.html (and the rest of web/)
    /worker/...            worker/
    /examples/...          examples/ (the playground's examples menu loads these files)
    /models/...            models/ (git-ignored): weights the surprisal page loads by URL;
                           every file carries an ETag (size and mtime), which keys the
                           browser's model cache (web/modelcache.mjs) without a download
    /assets/pyodide/...    web/assets/npm/node_modules/pyodide/
    /assets/ort/...        web/assets/npm/node_modules/onnxruntime-web/dist/
    /assets/ui/...         web/assets/ui/ (bundle.mjs, uPlot's css)
    /assets/wheels/...     web/assets/wheels/
    /assets/manifest.json  web/assets/manifest.json
    /lab/...               web/assets/lab/site/: the JupyterLite notebook site (scripts/lab.py
                           builds it, from PyPI's jupyterlite packages and the npm Pyodide)

The page fetches nothing but these. Run ``python serve.py --help`` for the options.
"""
from __future__ import annotations

import argparse
import errno
import importlib.util
import io
import json
import socket
import sys
import urllib.parse
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def _load_provisioning():
    """provisioning.py beside this file, loaded by its path: serve.py is itself loaded by path
    (webgrad.browser.load_serve), where a plain import would find another checkout's copy."""
    spec = importlib.util.spec_from_file_location("webgrad_provisioning", ROOT / "provisioning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


provisioning = _load_provisioning()
ProvisionError, layout = provisioning.ProvisionError, provisioning.layout
provision, provision_lab = provisioning.provision, provisioning.provision_lab

MIME_TYPES = {
    ".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm",
    ".whl": "application/octet-stream", ".json": "application/json", ".html": "text/html",
    ".css": "text/css", ".zip": "application/zip", ".tar": "application/x-tar",
    ".py": "text/x-python", ".map": "application/json", ".txt": "text/plain",
}
HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
}

# The notebook site (/lab/) is served without cross-origin isolation. Isolated, JupyterLite's
# Pyodide kernel (jupyterlite-pyodide-kernel 0.8.6) talks to its worker through
# SharedArrayBuffer/Atomics ("coincident") instead of postMessage ("comlink"), and there the
# execute reply of some cells never reaches the page: the cell ran (its output shows), it
# gets no execution count, and "run all" waits forever. webgrad is not involved: cells as
# trivial as `x = 1` lose their replies too (scripts/lab_isolation.py, headless Chromium,
# 2026-11-30: cells 1, 2 and 5 of five `x = k` cells, in every isolated try; every reply
# arrives when not isolated). Rerun that script after upgrading the kernel: once no reply is
# lost, /lab/ can be isolated (drop NOT_ISOLATED).
NOT_ISOLATED = ("Cross-Origin-Opener-Policy", "Cross-Origin-Embedder-Policy")


class Handler(SimpleHTTPRequestHandler):
    """Static files from a few mounted folders; no listings, no escapes, isolation headers."""

    mounts: list[tuple[str, Path]] = []  # (URL prefix ending in '/', folder), longest first
    quiet = True
    manifest_extra: dict = {}  # fields served in /assets/manifest.json beside the file's
    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, **MIME_TYPES}

    def resolve(self, url_path: str) -> Path | None:
        """The file a URL names, or None when it names nothing servable (or tries to escape)."""
        path = urllib.parse.unquote(urllib.parse.urlsplit(url_path).path, errors="strict")
        if not path.startswith("/") or "\\" in path or "\0" in path:
            return None
        for prefix, folder in self.mounts:
            if path == prefix.rstrip("/") or path.startswith(prefix):
                parts = [p for p in path[len(prefix):].split("/") if p]
                if any(p in (".", "..") or ":" in p for p in parts):
                    return None
                target = folder.joinpath(*parts).resolve()
                if target != folder and folder not in target.parents:
                    return None
                if target.is_dir():
                    target = target / "index.html"
                return target if target.is_file() else None  # is_file: False on ELOOP
        return None

    def send_head(self):
        try:
            target = self.resolve(self.path)
        except (UnicodeDecodeError, OSError, RuntimeError, ValueError):
            # a name over the file system's limit (ENAMETOOLONG), a symlink loop (ELOOP,
            # RuntimeError from Path.resolve), an embedded NUL: nothing servable, not a crash
            target = None
        self.etag = None
        if target is None and self.path.split("?")[0] in ("/lab", "/lab/", "/lab/index.html"):
            problem = provisioning.LAB_PROBLEM  # set by provision_lab, read per request
            why = f" This server's build said: {problem}" if problem else ""
            self.send_error(HTTPStatus.NOT_FOUND, "No notebooks here yet",
                            provisioning.LAB_BUILDING if provisioning.LAB_BUSY
                            else provisioning.LAB_HOWTO + why)
            return None
        if target is None:
            self.send_error(HTTPStatus.NOT_FOUND, "Not found")
            return None
        if self.manifest_extra and self.path.split("?")[0] == "/assets/manifest.json":
            return self._manifest(target)
        self.path_resolved = target
        try:  # changes whenever the file is rewritten: the model cache's key for a URL
            st = target.stat()
            self.etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
        except OSError:
            pass
        return super().send_head()

    def _manifest(self, target: Path):
        """The provisioned manifest with this server's manifest_extra merged in."""
        body = json.dumps({**json.loads(target.read_text()), **self.manifest_extra}).encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)

    def translate_path(self, path: str) -> str:
        return str(getattr(self, "path_resolved", "/nonexistent"))

    def list_directory(self, path):  # never reached: resolve() maps folders to index.html
        self.send_error(HTTPStatus.NOT_FOUND, "Not found")
        return None

    def end_headers(self):
        lab = self.path.startswith("/lab/") or self.path == "/lab"
        for key, value in HEADERS.items():
            if not (lab and key in NOT_ISOLATED):
                self.send_header(key, value)
        if getattr(self, "etag", None):
            self.send_header("ETag", self.etag)
        super().end_headers()

    def log_message(self, format, *args):
        if not self.quiet:
            super().log_message(format, *args)


IDLE_TIMEOUT = 30.0  # seconds a connection may sit without sending before it is closed


def make_server(host: str = "127.0.0.1", port: int = 8000, root: Path | str = ROOT, *,
                quiet: bool = True, idle_timeout: float = IDLE_TIMEOUT,
                manifest_extra: dict | None = None) -> ThreadingHTTPServer:
    """A ThreadingHTTPServer for the app (port 0 picks a free port: see ``server_address``).

    Each connection gets a handler thread; a socket timeout of ``idle_timeout`` seconds on
    it closes a connection that sends nothing (or half a request) for that long, so idle
    keep-alive or abandoned connections cannot pin threads for good
    (tests/test_serve_idle.py). It does not provision; call ``provision(root)`` first. Run
    it with ``serve_forever()``. ``manifest_extra``: fields added to the manifest it serves,
    read by every worker it boots (``{"auto": "webgpu"}``: worker/worker.mjs).
    """
    if not (isinstance(idle_timeout, (int, float)) and 0 < idle_timeout < float("inf")):
        raise ValueError(f"make_server: idle_timeout must be a number of seconds > 0, got "
                         f"{idle_timeout!r}")
    paths = layout(root)
    mounts = [("/assets/pyodide/", paths["pyodide"]), ("/assets/ort/", paths["ort"]),
              ("/worker/", paths["worker"]),
              ("/lab/", paths["assets"] / "lab" / "site"),
              ("/examples/", paths["examples"]), ("/models/", paths["models"]), ("/", paths["web"])]
    handler = type("WebgradHandler", (Handler,), {
        "mounts": sorted(((p, f.resolve()) for p, f in mounts), key=lambda m: -len(m[0])),
        "quiet": quiet,
        "manifest_extra": dict(manifest_extra or {}),
        "timeout": float(idle_timeout),   # StreamRequestHandler.setup: settimeout on the socket
    })
    # a listen backlog of 128, not socketserver's 5: a page opening many connections at once
    # (or 60 in tests/test_serve_idle.py) waited seconds on SYN retries
    attrs = {"request_queue_size": 128}
    if _family(host, port) == socket.AF_INET6:
        attrs["address_family"] = socket.AF_INET6
    server_class = type("WebgradHTTPServer", (ThreadingHTTPServer,), attrs)
    return server_class((host, port), partial(handler, directory=str(paths["web"])))


def _family(host: str, port: int) -> int:
    """AF_INET6 for an IPv6 host ("::1", "::", a name resolving only to IPv6), else AF_INET."""
    if ":" in host:
        return socket.AF_INET6
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return socket.AF_INET  # let bind() report the bad name
    families = [info[0] for info in infos]
    return socket.AF_INET if socket.AF_INET in families or not families else families[0]


WILDCARDS = ("", "0.0.0.0", "::")


def server_url(server: ThreadingHTTPServer) -> str:
    """A URL that reaches the server from this machine (a wildcard address becomes loopback)."""
    host, port = server.server_address[:2]
    if host in WILDCARDS:
        host = "::1" if server.address_family == socket.AF_INET6 else "127.0.0.1"
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"


def network_urls(server: ThreadingHTTPServer) -> list[str]:
    """URLs other machines could use when the server listens on every interface."""
    port = server.server_address[1]
    hosts = []
    try:  # the address this machine would use to reach the network (no packet is sent)
        family = server.address_family
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(("2001:db8::1" if family == socket.AF_INET6 else "192.0.2.1", 9))
            hosts.append(probe.getsockname()[0])
    except OSError:
        pass
    hosts.append(socket.gethostname())
    return [f"http://{'[' + h + ']' if ':' in h else h}:{port}/" for h in dict.fromkeys(hosts)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only; "
                             "0.0.0.0 or :: listens on every interface); IPv6 works: --host ::1")
    parser.add_argument("--no-browser-assets-check", action="store_true",
                        help="serve web/assets as it is, without fetching or rebuilding anything")
    parser.add_argument("--provision-only", action="store_true",
                        help="fetch and build the browser assets, then exit (used by the tests)")
    parser.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT,
                        help=f"close a connection idle this many seconds (default {IDLE_TIMEOUT:g})")
    parser.add_argument("--no-lab", action="store_true",
                        help="do not build the JupyterLite notebook site served at /lab/")
    args = parser.parse_args(argv)
    if not args.no_browser_assets_check:
        try:
            manifest = provision(ROOT)
        except ProvisionError as e:
            print(f"serve.py: {e}", file=sys.stderr)
            return 1
        print(f"assets: pyodide {manifest['pyodide_version']}, {manifest['micropip_wheel']}, "
              f"{manifest['webgrad_wheel']}")
    build_lab = not (args.no_lab or args.no_browser_assets_check)
    if args.provision_only:
        if build_lab:
            provision_lab(ROOT)
        return 0
    try:
        server = make_server(args.host, args.port, ROOT, quiet=False,
                             idle_timeout=args.idle_timeout)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            print(f"serve.py: port {args.port} on {args.host} is already in use (another "
                  "serve.py?). Stop that program, or pick another port: --port 8001 "
                  "(--port 0 picks a free one).", file=sys.stderr)
        elif e.errno == errno.EACCES:
            print(f"serve.py: not allowed to listen on port {args.port} (ports below 1024 "
                  "need root); use --port 8000 or --port 0.", file=sys.stderr)
        else:
            print(f"serve.py: cannot listen on {args.host!r} port {args.port}: "
                  f"{e.strerror or e}. Check --host (an address of this machine, e.g. "
                  "127.0.0.1 or ::1).", file=sys.stderr)
        return 1
    if args.host in WILDCARDS:
        print(f"serve.py: WARNING: --host {args.host!r} listens on EVERY network interface: "
              "anyone who can reach this machine can open the page and run Python in it. "
              "Use the default (127.0.0.1) unless you mean that.", file=sys.stderr)
        print("webgrad: reachable from other machines at " + "  ".join(network_urls(server)) +
              "\n  (browsers give WebGPU only to https or localhost pages: from another machine "
              f"tunnel instead, `ssh -L {server.server_address[1]}:localhost:"
              f"{server.server_address[1]} THIS_HOST`, and open {server_url(server)})")
    print(f"webgrad: serving on {server_url(server)}  (Ctrl-C stops)", flush=True)
    if build_lab:  # built (or checked) while the playground is already served
        import threading
        threading.Thread(target=provision_lab, args=(ROOT,), daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
