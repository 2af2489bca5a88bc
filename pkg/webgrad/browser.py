"""Drive webgrad's browser app from CPython: Python code runs in Pyodide in headless Chromium.

``BrowserSession`` starts serve.py's server on a free port in a background thread, opens the page in
headless Chromium through Playwright (WebGPU on SwiftShader), waits for the Pyodide worker to boot
and then runs code there::

    with BrowserSession() as s:
        s.run("import sys; sys.platform")       # -> 'emscripten'
        s.run("def f(x): return x * 2")
        s.call("f", 21)                         # -> 42

Results come back as None/bool/int/float/str/list/dict/bytes; a Python error in the worker raises
``BrowserPythonError`` carrying the worker's traceback. It needs a source checkout (serve.py at the
repository root, or ``WEBGRAD_REPO`` naming one), Playwright (``pip install playwright``) and a
Chromium with WebGPU (``/usr/bin/chromium`` or ``WEBGRAD_CHROMIUM``). Playwright is imported only
when a session starts, so ``import webgrad`` never needs it.
"""
from __future__ import annotations

import base64
import importlib.util
import os
import shutil
import threading
from pathlib import Path

CHROMIUM_FLAGS = [
    "--enable-unsafe-webgpu", "--enable-unsafe-swiftshader", "--no-sandbox", "--disable-quic",
    "--no-first-run", "--disable-background-networking", "--disable-component-update",
    "--disable-sync",
]
# A Chromium without WebGPU (the CPU backend's tests): no unsafe-WebGPU or SwiftShader flags,
# and the feature turned off, so navigator.gpu offers no adapter
NO_WEBGPU_FLAGS = [f for f in CHROMIUM_FLAGS if "webgpu" not in f and "swiftshader" not in f] + [
    "--disable-features=WebGPU,WebGPUService", "--disable-gpu"]
DEFAULT_CHROMIUM = "/usr/bin/chromium"

# Runs in the page: awaits a window.webgrad promise with a deadline and returns a tagged result,
# encoding what Playwright cannot carry (bytes, BigInt) so that nothing is lost on the way.
_CALL_JS = """async ([method, args, timeoutMs]) => {
  const encode = (v) => {
    if (ArrayBuffer.isView(v)) {
      const bytes = new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
      let s = ""; for (let i = 0; i < bytes.length; i += 0x8000)
        s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
      return { __webgrad_bytes__: btoa(s) };
    }
    if (typeof v === "bigint") return { __webgrad_int__: v.toString() };
    if (Array.isArray(v)) return v.map(encode);
    if (v && typeof v === "object") return Object.fromEntries(
      Object.entries(v).map(([k, x]) => [k, encode(x)]));
    return v;
  };
  const decode = (v) => {
    if (Array.isArray(v)) return v.map(decode);
    if (v && typeof v === "object") {
      if ("__webgrad_bytes__" in v)
        return Uint8Array.from(atob(v.__webgrad_bytes__), (c) => c.charCodeAt(0));
      return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, decode(x)]));
    }
    return v;
  };
  const api = window.webgrad;
  const work = method === "ready" ? api.ready : api[method](...decode(args));
  let timer;
  const deadline = new Promise((resolve) => {
    timer = setTimeout(() => resolve({ status: "timeout" }), timeoutMs);
  });
  try {
    return await Promise.race([
      work.then((value) => ({ status: "ok", value: encode(value) }),
                (error) => ({ status: "error", error: encode(error) })),
      deadline]);
  } finally { clearTimeout(timer); }
}"""


class BrowserError(RuntimeError):
    """The browser side failed: no Chromium/Playwright, the worker did not boot or died."""


class BrowserTimeout(BrowserError, TimeoutError):
    """A request did not finish in time (the worker may still be running it)."""


class BrowserPythonError(BrowserError):
    """Python code in the worker raised; ``traceback`` is the worker-side traceback text."""

    def __init__(self, type: str, message: str, traceback: str = ""):
        self.type, self.message, self.traceback = type, message, traceback
        super().__init__(f"{type}: {message}\n\nTraceback in the browser worker:\n{traceback}"
                         if traceback else f"{type}: {message}")


def find_repo() -> Path:
    """The webgrad source checkout holding serve.py (``WEBGRAD_REPO`` or above this file)."""
    if os.environ.get("WEBGRAD_REPO"):
        candidates = [Path(os.environ["WEBGRAD_REPO"])]
    else:
        candidates = list(Path(__file__).resolve().parents)
    for folder in candidates:
        if (folder / "serve.py").is_file() and (folder / "web" / "index.html").is_file():
            return folder
    raise BrowserError(
        "BrowserSession needs webgrad's source checkout (serve.py, web/, worker/), and none was "
        f"found above {Path(__file__).resolve().parent}. Run from a git checkout "
        "(pip install -e .) or set WEBGRAD_REPO to the checkout's path.")


def load_serve(repo: Path):
    """Import the checkout's serve.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("webgrad_serve", repo / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _chromium_path() -> str:
    path = os.environ.get("WEBGRAD_CHROMIUM") or DEFAULT_CHROMIUM
    found = path if os.path.isfile(path) else shutil.which(path)
    if not found:
        raise BrowserError(f"Chromium not found at {path!r}. Install it (Debian: apt-get install "
                           "chromium) or set WEBGRAD_CHROMIUM to a Chromium with WebGPU.")
    return found


def _decode(value):
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if "__webgrad_bytes__" in value:
            return base64.b64decode(value["__webgrad_bytes__"])
        if "__webgrad_int__" in value:
            return int(value["__webgrad_int__"])
        return {k: _decode(v) for k, v in value.items()}
    return value


def _encode(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"__webgrad_bytes__": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    return value


class BrowserSession:
    """One server, one headless Chromium, one page with one booted Pyodide worker.

    Starts everything on construction; ``close()`` (or leaving a ``with`` block) stops it all.
    Requests run one at a time, in order. On a timeout the running code gets a KeyboardInterrupt
    (Pyodide checks for it between bytecodes, so code blocked waiting on a promise sees it only
    when that wait ends) and ``BrowserTimeout`` is raised.
    """

    def __init__(self, *, boot_timeout: float = 120.0, headless: bool = True,
                 chromium: str | None = None, auto_webgpu: bool = True):
        """auto_webgpu: backend='auto' in this session's workers keeps WebGPU on the
        SwiftShader adapter (its server's manifest says {"auto": "webgpu"}, which the worker
        puts at globalThis.webgradAuto), where a user's browser would pick the faster CPU
        backend 'wasm': the tests and benches measure WebGPU. False: the user's choice."""
        self._auto_webgpu = auto_webgpu
        self._playwright = self.browser = self.page = self.server = None
        self.console: list[str] = []  # the page's console messages, for diagnosing failures
        try:
            self._start(boot_timeout, headless, chromium)
        except BaseException:
            self.close()
            raise

    def _start(self, boot_timeout, headless, chromium):
        repo = find_repo()
        serve = load_serve(repo)
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            raise BrowserError("BrowserSession needs Playwright: pip install playwright "
                               "(its own browser download is not needed)") from None
        executable = self._executable = chromium or _chromium_path()
        self.manifest = serve.provision(repo)
        self.server = serve.make_server(
            "127.0.0.1", 0, repo, manifest_extra={"auto": "webgpu"} if self._auto_webgpu else None)
        threading.Thread(target=self.server.serve_forever, name="webgrad-serve",
                         daemon=True).start()
        self.url = serve.server_url(self.server)

        self._playwright = sync_playwright().start()
        self.browser = self._playwright.chromium.launch(
            executable_path=executable, headless=headless, args=CHROMIUM_FLAGS)
        self.page = self.new_page()
        self.info = self._request(self.page, "ready", [], boot_timeout, "booting the worker")

    def without_webgpu(self, *, boot_timeout: float = 120.0) -> "BrowserSession":
        """A second headless Chromium with WebGPU turned off (NO_WEBGPU_FLAGS), on this
        session's Playwright and server, with its own booted worker: the same run()/call().
        Its close() closes only that browser."""
        s = object.__new__(BrowserSession)
        s._playwright = s.server = None  # shared: stopped by this session's close()
        s.console, s.url, s.manifest = [], self.url, self.manifest
        s.browser = self._playwright.chromium.launch(
            executable_path=self._executable, headless=True, args=NO_WEBGPU_FLAGS)
        try:
            s.page = s.new_page()
            s.info = s._request(s.page, "ready", [], boot_timeout, "booting the worker")
        except BaseException:
            s.close()
            raise
        return s

    def new_page(self):
        """A fresh page of the app with its own worker (booting; await window.webgrad.ready)."""
        page = self.browser.new_page()
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        page.goto(self.url)
        page.wait_for_function("() => window.webgrad !== undefined", timeout=30_000)
        return page

    def another_worker(self, boot_timeout: float = 120.0) -> "WorkerPage":
        """A second page of the app in this browser, with a worker of its own, booted: for
        code that needs a fresh worker (one whose onnxruntime-web has not loaded yet, say).
        Its run() is this session's; close() closes the page."""
        page = self.new_page()
        try:
            info = self._request(page, "ready", [], boot_timeout, "booting a second worker")
        except BaseException:
            page.close()
            raise
        return WorkerPage(self, page, info)

    def _request(self, page, method: str, args: list, timeout: float, what: str):
        if page is None:
            raise BrowserError("this BrowserSession is closed")
        reply = page.evaluate(_CALL_JS, [method, _encode(args), int(timeout * 1000)])
        if reply["status"] == "ok":
            return _decode(reply["value"])
        if reply["status"] == "timeout":
            interrupted = method != "ready" and page.evaluate("window.webgrad.interrupt()")
            raise BrowserTimeout(f"{what} took longer than {timeout:g} s" + (
                "; the worker's Python got a KeyboardInterrupt" if interrupted else ""))
        error = _decode(reply["error"]) or {}
        if not isinstance(error, dict):
            error = {"type": "Error", "message": str(error)}
        if error.get("type") in ("WorkerError", "WorkerTerminated", "WorkerDied", "MessageError") or (
                method == "ready"):
            console = "\n".join(self.console[-20:])
            raise BrowserError(f"{what} failed: {error.get('type')}: {error.get('message')}\n"
                               f"{error.get('traceback', '')}\npage console:\n{console}")
        raise BrowserPythonError(error.get("type", "Error"), error.get("message", ""),
                                 error.get("traceback", ""))

    def run(self, code: str, timeout: float = 300.0):
        """Run Python source in the worker's ``__main__``; returns its last expression's value."""
        return self._request(self.page, "run", [code], timeout, "running code")

    def call(self, name: str, *args, timeout: float = 300.0):
        """Call the worker's global Python function ``name`` (defined by an earlier ``run``)."""
        return self._request(self.page, "call", [name, list(args)], timeout, f"calling {name}")

    @property
    def stdout(self) -> list[str]:
        """The worker's stdout lines so far: the last 10,000 or more (older ones are dropped;
        a line without its newline yet shows up when its request ends)."""
        return self.page.evaluate("window.webgrad.stdout.slice()") if self.page else []

    @property
    def stderr(self) -> list[str]:
        return self.page.evaluate("window.webgrad.stderr.slice()") if self.page else []

    def close(self) -> None:
        """Close the browser, stop Playwright and the server; safe to call more than once."""
        for stop in (lambda: self.browser and self.browser.close(),
                     lambda: self._playwright and self._playwright.stop()):
            try:
                stop()
            except Exception:
                pass
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        self._playwright = self.browser = self.page = self.server = None

    def __enter__(self) -> "BrowserSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class WorkerPage:
    """A page of a BrowserSession's browser with its own worker (BrowserSession.another_worker)."""

    def __init__(self, session: BrowserSession, page, info: dict):
        self.session, self.page, self.info, self.url = session, page, info, session.url

    def run(self, code: str, timeout: float = 300.0):
        """Run Python source in this page's worker; returns its last expression's value."""
        return self.session._request(self.page, "run", [code], timeout, "running code")

    def close(self) -> None:
        if self.page is not None:
            self.page.close()
            self.page = None

    def __enter__(self) -> "WorkerPage":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
