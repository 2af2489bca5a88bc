#!/usr/bin/env python3
"""Serve webgrad's browser app: the page, its Pyodide worker and the wheels it installs.

webgrad's home is the browser: Python runs in Pyodide inside a module Web Worker and drives
``navigator.gpu``. This script is what makes that page work from a source checkout:

1. ``provision(root)`` fills ``web/assets/`` (git-ignored) on first use:
   - Pyodide's core from npm (``npm install pyodide@PYODIDE_VERSION`` into ``web/assets/npm``);
   - ONNX Runtime Web from npm (``onnxruntime-web@ORT_VERSION``, beside it): the WebAssembly
     engine of the CPU backend ``wasm`` (webgrad/backends/onnx_runtime.py, worker/ort.mjs);
   - the micropip wheel from PyPI (``pip download``), which the worker loads to install webgrad;
   - the webgrad wheel, zipped here from ``pkg/webgrad`` (rewritten only when its bytes change);
   - the playground's editor and chart (CodeMirror 6 with its Python mode, uPlot) from npm into
     ``web/assets/ui``, bundled by esbuild (also from npm) into one module ``ui/bundle.mjs``;
   - ``web/assets/manifest.json``, which tells the page the wheel file names and the examples.
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
import ast
import base64
import errno
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tomllib
import urllib.parse
import zipfile
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PYODIDE_VERSION = "314.0.7"
MICROPIP_VERSION = "0.11.1"
ORT_VERSION = "1.30.0"
# ONNX Runtime Web's files the worker loads (the WebAssembly-only build, SIMD and threads)
ORT_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
# The files without which Pyodide cannot boot; checked after npm install.
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip",
                 "pyodide-lock.json")

# The playground's browser libraries (npm), pinned; esbuild bundles web/ui.src.mjs with them.
UI_PACKAGES = {"codemirror": "6.0.2", "@codemirror/lang-python": "6.2.1",
               "@codemirror/language": "6.11.3", "uplot": "1.6.32", "esbuild": "0.28.2"}

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


class ProvisionError(RuntimeError):
    """A browser asset could not be fetched or built; the message says what to install or fix."""


def layout(root: Path | str = ROOT) -> dict[str, Path]:
    """Where everything lives, relative to the repository root."""
    root = Path(root).resolve()
    assets = root / "web" / "assets"
    return {
        "root": root, "web": root / "web", "worker": root / "worker", "assets": assets,
        "npm": assets / "npm", "pyodide": assets / "npm" / "node_modules" / "pyodide",
        "ort": assets / "npm" / "node_modules" / "onnxruntime-web" / "dist",
        "wheels": assets / "wheels", "manifest": assets / "manifest.json",
        "package": root / "pkg" / "webgrad", "ui": assets / "ui",
        "ui_src": root / "web" / "ui.src.mjs", "examples": root / "examples",
        "models": root / "models",
    }


def project_metadata(root: Path | str = ROOT) -> dict:
    """The ``[project]`` table of pyproject.toml (name, version, description, ...)."""
    with open(Path(root) / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


# ---------------------------------------------------------------------------------------------
# Provisioning

def _run(cmd: list[str], what: str, fix: str) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        raise ProvisionError(f"cannot {what}: {cmd[0]!r} is not installed. {fix}") from None
    if done.returncode != 0:
        raise ProvisionError(f"cannot {what}: `{' '.join(cmd)}` exited {done.returncode}.\n"
                             f"{done.stdout[-2000:]}{done.stderr[-2000:]}\n{fix}")


def provision_pyodide(paths: dict[str, Path]) -> Path:
    """Install the npm package ``pyodide`` into web/assets/npm unless that version is there."""
    pkg_json = paths["pyodide"] / "package.json"
    have = json.loads(pkg_json.read_text())["version"] if pkg_json.exists() else None
    if have != PYODIDE_VERSION or not all((paths["pyodide"] / f).exists() for f in PYODIDE_FILES):
        paths["npm"].mkdir(parents=True, exist_ok=True)
        npm = shutil.which("npm") or "npm"
        _run([npm, "install", "--prefix", str(paths["npm"]), "--no-audit", "--no-fund",
              "--loglevel=error", f"pyodide@{PYODIDE_VERSION}"],
             f"install pyodide@{PYODIDE_VERSION} from npm",
             "Install Node.js and npm (Debian: apt-get install npm) and make sure the npm "
             "registry is reachable.")
    missing = [f for f in PYODIDE_FILES if not (paths["pyodide"] / f).exists()]
    if missing:
        raise ProvisionError(f"{paths['pyodide']} lacks {missing}; delete {paths['npm']} and "
                             "run serve.py again.")
    return paths["pyodide"]


def provision_ort(paths: dict[str, Path]) -> Path:
    """Install the npm package ``onnxruntime-web`` into web/assets/npm unless that version is there."""
    pkg_json = paths["ort"].parent / "package.json"
    have = json.loads(pkg_json.read_text()).get("version") if pkg_json.exists() else None
    if have != ORT_VERSION or not all((paths["ort"] / f).exists() for f in ORT_FILES):
        paths["npm"].mkdir(parents=True, exist_ok=True)
        npm = shutil.which("npm") or "npm"
        _run([npm, "install", "--prefix", str(paths["npm"]), "--no-audit", "--no-fund",
              "--loglevel=error", f"onnxruntime-web@{ORT_VERSION}"],
             f"install onnxruntime-web@{ORT_VERSION} from npm",
             "Install Node.js and npm (Debian: apt-get install npm) and make sure the npm "
             "registry is reachable, or copy a web/assets/npm that has it")
    missing = [f for f in ORT_FILES if not (paths["ort"] / f).exists()]
    if missing:
        raise ProvisionError(f"{paths['ort']} lacks {missing}; delete {paths['ort'].parent} and "
                             "provision again")
    return paths["ort"]


def provision_micropip(paths: dict[str, Path]) -> str:
    """Download the micropip wheel from PyPI into web/assets/wheels unless it is there.

    The wheel is chosen for Pyodide's Python (read from pyodide-lock.json), not this one.
    """
    name = f"micropip-{MICROPIP_VERSION}-py3-none-any.whl"
    if not (paths["wheels"] / name).exists():
        paths["wheels"].mkdir(parents=True, exist_ok=True)
        lock = json.loads((paths["pyodide"] / "pyodide-lock.json").read_text())
        py_version = ".".join(lock["info"]["python"].split(".")[:2])
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
              "--no-deps", "--only-binary=:all:", "--python-version", py_version,
              "-d", str(paths["wheels"]), f"micropip=={MICROPIP_VERSION}"],
             f"download micropip=={MICROPIP_VERSION}",
             "Make sure pip works and PyPI is reachable, or put the wheel there by hand.")
        if not (paths["wheels"] / name).exists():
            raise ProvisionError(f"pip download did not produce {paths['wheels'] / name}")
    return name


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _zip_wheel(name: str, version: str, files: list[tuple[str, bytes]], metadata: list[str]
               ) -> tuple[str, bytes]:
    """A py3-none-any wheel of `files` (archive name, bytes); deterministic (sorted entries,
    fixed timestamps), so unchanged sources give byte-identical wheels."""
    dist_info = f"{name}-{version}.dist-info"
    files = list(files)
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *metadata]
    files.append((f"{dist_info}/METADATA", ("\n".join(metadata) + "\n").encode()))
    files.append((f"{dist_info}/WHEEL", (
        "Wheel-Version: 1.0\nGenerator: webgrad serve.py\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n").encode()))
    record = "".join(f"{arc},{_record_hash(data)},{len(data)}\n" for arc, data in files)
    files.append((f"{dist_info}/RECORD", (record + f"{dist_info}/RECORD,,\n").encode()))

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, data in files:
            info = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


def _package_files(folder: Path) -> list[tuple[str, bytes]]:
    return [(path.relative_to(folder.parent).as_posix(), path.read_bytes())
            for path in sorted(folder.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts
            and path.suffix not in (".pyc", ".pyo")]


def wheel_bytes(root: Path | str = ROOT) -> tuple[str, bytes]:
    """Zip pkg/webgrad into a py3-none-any wheel; returns (file name, bytes).

    The zip is deterministic, so ``provision`` can skip rewriting an unchanged wheel.
    """
    paths = layout(root)
    meta = project_metadata(paths["root"])
    files = _package_files(paths["package"]) if paths["package"].is_dir() else []
    metadata = [f"Summary: {meta.get('description', '')}",
                f"Requires-Python: {meta.get('requires-python', '>=3.11')}"]
    metadata += [f"Requires-Dist: {dep}" for dep in meta.get("dependencies", [])]
    return _zip_wheel(meta["name"], meta["version"], files, metadata)


def _write_if_changed(target: Path, data: bytes) -> None:
    if not target.exists() or target.read_bytes() != data:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)


def provision_stdlib_extras(paths: dict[str, Path]) -> dict[str, str]:
    """Wheels of the standard-library modules Pyodide leaves out of its core download and the
    demos use: ``pydoc_data`` (the char-level LM's text), zipped from this CPython's stdlib.
    Returns {module: wheel file}; the worker installs one when code names its module."""
    import pydoc_data
    folder = Path(pydoc_data.__file__).parent
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    name, data = _zip_wheel("pydoc_data", version, _package_files(folder),
                            ["Summary: pydoc_data from the CPython standard library"])
    _write_if_changed(paths["wheels"] / name, data)
    return {"pydoc_data": name, **provision_chat_extras(paths)}


def provision_chat_extras(paths: dict[str, Path]) -> dict[str, str]:
    """jinja2 and markupsafe (pure Python: markupsafe falls back to _native without its C
    speedups), zipped from the Python running serve.py: chat templates (llama.Tokenizer.
    apply_chat_template, the chat page) need them, and the worker cannot reach PyPI. Where
    jinja2 is not installed the chat page says so; install it (pip install jinja2) and rerun."""
    import importlib.metadata
    import importlib.util
    out = {}
    for module in ("jinja2", "markupsafe"):
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            print(f"serve.py: {module} is not installed here, so the chat page cannot render "
                  "chat templates; pip install jinja2 and run serve.py again", file=sys.stderr)
            return {}
        folder = Path(next(iter(spec.submodule_search_locations)))
        files = [(n, b) for n, b in _package_files(folder)
                 if not n.endswith((".so", ".pyd", ".c"))]
        version = importlib.metadata.version(module)
        name, data = _zip_wheel(module, version, files, [f"Summary: {module}, pure Python"])
        _write_if_changed(paths["wheels"] / name, data)
        out[module] = name
    return out


def provision_webgrad(paths: dict[str, Path]) -> str:
    """Write web/assets/wheels/webgrad-*.whl from pkg/webgrad when its contents changed."""
    name, data = wheel_bytes(paths["root"])
    target = paths["wheels"] / name
    if not target.exists() or target.read_bytes() != data:
        for old in paths["wheels"].glob("webgrad-*.whl"):
            old.unlink()
        _write_if_changed(target, data)
    return name


def provision_ui(paths: dict[str, Path]) -> str:
    """npm-install the editor/chart packages into web/assets/ui and bundle them with esbuild.

    Redone only when the pinned versions or web/ui.src.mjs change (a stamp file records both).
    Returns the bundle's URL path under /assets/.
    """
    ui = paths["ui"]
    bundle = ui / "bundle.mjs"
    source = paths["ui_src"].read_bytes()
    stamp = hashlib.sha256(json.dumps(UI_PACKAGES, sort_keys=True).encode() + source).hexdigest()
    stamp_file = ui / "bundle.stamp"
    if bundle.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return "ui/bundle.mjs"
    ui.mkdir(parents=True, exist_ok=True)
    npm = shutil.which("npm") or "npm"
    installed = True
    for name, version in UI_PACKAGES.items():
        pkg_json = ui / "node_modules" / name / "package.json"
        installed &= pkg_json.exists() and json.loads(pkg_json.read_text())["version"] == version
    if not installed:
        _run([npm, "install", "--prefix", str(ui), "--no-audit", "--no-fund", "--loglevel=error",
              *(f"{name}@{version}" for name, version in UI_PACKAGES.items())],
             "install the playground's editor and chart from npm",
             "Install Node.js and npm (Debian: apt-get install npm) and make sure the npm "
             "registry is reachable.")
    esbuild = ui / "node_modules" / ".bin" / "esbuild"
    tmp = ui / "bundle.tmp.mjs"
    entry = ui / "ui.src.mjs"  # next to node_modules, where esbuild resolves the imports
    entry.write_bytes(source)
    _run([str(esbuild), str(entry), "--bundle", "--format=esm", "--minify",
          "--log-level=error", f"--outfile={tmp}"],
         "bundle web/ui.src.mjs with esbuild", f"Delete {ui} and run serve.py again.")
    shutil.copyfile(ui / "node_modules" / "uplot" / "dist" / "uPlot.min.css", ui / "uPlot.min.css")
    os.replace(tmp, bundle)
    stamp_file.write_text(stamp)
    return "ui/bundle.mjs"


def list_examples(paths: dict[str, Path]) -> list[dict]:
    """examples/*.py with the first line of each docstring, for the playground's menu."""
    out = []
    for path in sorted(paths["examples"].glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        except SyntaxError:
            doc = ""
        out.append({"file": path.name, "title": doc.strip().split("\n")[0] or path.stem})
    order = {"mlp_sin.py": 0}  # the first one is what the page opens with
    return sorted(out, key=lambda e: (order.get(e["file"], 1), e["file"]))


def provision(root: Path | str = ROOT) -> dict:
    """Make sure every browser asset exists; returns the manifest (also written to disk)."""
    paths = layout(root)
    provision_pyodide(paths)
    provision_ort(paths)
    manifest = {
        "pyodide_version": PYODIDE_VERSION,
        "ort_version": ORT_VERSION,
        "micropip_wheel": provision_micropip(paths),
        "webgrad_wheel": provision_webgrad(paths),
        "webgrad_version": project_metadata(paths["root"])["version"],
        "ui_bundle": provision_ui(paths),
        "extra_wheels": provision_stdlib_extras(paths),
        "examples": list_examples(paths),
    }
    # Names the worker's cached Pyodide memory snapshot (worker.mjs): it holds the installed
    # wheels' imported modules, so any change to them must make a new one.
    key = hashlib.sha256(PYODIDE_VERSION.encode())
    for wheel in (manifest["micropip_wheel"], manifest["webgrad_wheel"]):
        key.update((paths["wheels"] / wheel).read_bytes())
    manifest["boot_key"] = key.hexdigest()[:20]
    text = json.dumps(manifest, indent=2) + "\n"
    if not paths["manifest"].exists() or paths["manifest"].read_text() != text:
        paths["manifest"].write_text(text)
    return manifest


def load_lab(root: Path | str = ROOT):
    """scripts/lab.py (the JupyterLite site's builder) as a module."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("webgrad_lab", Path(root) / "scripts" / "lab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Why the last provision_lab() built no site (None: it did, or it has not run yet); a visit to
# /lab/ without a site gets a page saying so and what to install. LAB_BUSY: a build is under
# way (the first one may first make the lab extra's private environment, minutes).
LAB_PROBLEM: str | None = None
LAB_BUSY = False
LAB_HOWTO = ("The notebook site is built by scripts/lab.py from jupyterlite-core and "
             "jupyterlite-pyodide-kernel (pyproject's `lab` extra). When the Python running "
             "serve.py lacks them, serve.py installs them once into a private environment, "
             ".cache/lab-env, which needs PyPI and Python's venv module. To install them by "
             "hand instead: `python3 -m venv .venv && .venv/bin/pip install -e \".[lab]\"`, "
             "then start `.venv/bin/python serve.py` (./scripts/test.sh makes that .venv too).")
LAB_BUILDING = ("The notebook site is being built (the first time, serve.py also installs "
                "jupyterlite into .cache/lab-env: a minute or two); its terminal says how far "
                "it got. Reload this page when it says `notebooks: /lab/`.")


def provision_lab(root: Path | str = ROOT) -> Path | None:
    """Build the notebook site served at /lab/ unless it is up to date (scripts/lab.py), in a
    Python that has the lab extra: this one, or the private environment .cache/lab-env that
    lab.lab_python makes on the first run. A failure (no network for that install, no venv
    module) is reported and the playground is served all the same; returns the site, or None."""
    global LAB_PROBLEM, LAB_BUSY
    lab = load_lab(root)
    LAB_BUSY = True
    try:
        site = lab.build_lab(root)
    except lab.LabError as e:
        LAB_PROBLEM = str(e)
        print(f"serve.py: no notebooks at /lab/: {e}", file=sys.stderr)
        return None
    finally:
        LAB_BUSY = False
    LAB_PROBLEM = None
    print(f"notebooks: /lab/ ({site})", flush=True)
    return site


# ---------------------------------------------------------------------------------------------
# Serving

class Handler(SimpleHTTPRequestHandler):
    """Static files from a few mounted folders; no listings, no escapes, isolation headers."""

    mounts: list[tuple[str, Path]] = []  # (URL prefix ending in '/', folder), longest first
    quiet = True
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
            why = f" This server's build said: {LAB_PROBLEM}" if LAB_PROBLEM else ""
            self.send_error(HTTPStatus.NOT_FOUND, "No notebooks here yet",
                            LAB_BUILDING if LAB_BUSY else LAB_HOWTO + why)
            return None
        if target is None:
            self.send_error(HTTPStatus.NOT_FOUND, "Not found")
            return None
        self.path_resolved = target
        try:  # changes whenever the file is rewritten: the model cache's key for a URL
            st = target.stat()
            self.etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
        except OSError:
            pass
        return super().send_head()

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
                quiet: bool = True, idle_timeout: float = IDLE_TIMEOUT) -> ThreadingHTTPServer:
    """A ThreadingHTTPServer for the app (port 0 picks a free port: see ``server_address``).

    Each connection gets a handler thread; a socket timeout of ``idle_timeout`` seconds on
    it closes a connection that sends nothing (or half a request) for that long, so idle
    keep-alive or abandoned connections cannot pin threads for good
    (tests/test_serve_idle.py). It does not provision; call ``provision(root)`` first. Run
    it with ``serve_forever()``.
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
