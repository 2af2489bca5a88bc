"""Soak: many training steps of the small transformer in the browser worker, memory sampled.

The worker (Pyodide in headless Chromium, WebGPU on SwiftShader) compiles
tests/models.py's transformer on backend="webgpu" and steps it on one fixed batch, in chunks
of `--every` steps; after each chunk it samples:

  js_heap     the worker's JS heap in use (Runtime.getHeapUsage through the Chrome DevTools
              Protocol, attached to the worker target; after a GC when --gc)
  wasm_heap   Pyodide's WebAssembly memory (Python's heap lives in it; it never shrinks, so
              any growth shows)
  py_objects  objects tracked by Python's garbage collector (len(gc.get_objects()))
  gpu_buffers live GPUBuffers: createBuffer minus destroy calls, counted by wrapping
              GPUDevice.prototype.createBuffer / GPUBuffer.prototype.destroy before compiling
  js_refs     JS values Python holds (Pyodide's hiwire table: every live JsProxy is one)

and prints one row per sample; --json writes them. A leak of one object, proxy or buffer per
step shows as a column growing by --every per row. Figures: docs/reliability.md.

    python3 bench/soak_browser.py                      # 20,000 steps, a sample every 1,000
    python3 bench/soak_browser.py --steps 2000 --every 200 --json soak.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "pkg"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import models  # noqa: E402

from webgrad.browser import BrowserSession  # noqa: E402

# Installed in the worker before compiling: counts live GPUBuffers.
COUNT_BUFFERS_JS = """() => {
  if (self.__webgradLiveBuffers !== undefined) return;
  self.__webgradLiveBuffers = 0;
  const create = GPUDevice.prototype.createBuffer;
  GPUDevice.prototype.createBuffer = function (...args) {
    const b = create.apply(this, args);
    self.__webgradLiveBuffers += 1;
    const destroy = b.destroy.bind(b);
    let gone = false;
    b.destroy = () => { if (!gone) { gone = true; self.__webgradLiveBuffers -= 1; } destroy(); };
    return b;
  };
}"""

SETUP = """
import gc, sys, time
import js
import pyodide_js
from pyodide.code import run_js
run_js({count!r})()
c = compile_transformer("webgpu")
batch = reversal_batch(0)

def chunk(n):
    t = time.perf_counter()
    for _ in range(n):
        loss = c.step(batch)
    dt = time.perf_counter() - t
    gc.collect()
    return {{"loss": loss, "ms_per_step": 1e3 * dt / n, "wasm_heap": pyodide_js._module.HEAP8.length,
            "py_objects": len(gc.get_objects()), "gpu_buffers": int(js.self.__webgradLiveBuffers),
            "js_refs": int(pyodide_js._module.hiwire.num_keys())}}
"""


class WorkerHeap:
    """Runtime.getHeapUsage of the page's dedicated worker, over a CDP session of the page
    (the worker is a child target: attached without flattening, messages wrapped)."""

    def __init__(self, page):
        self.cdp = page.context.new_cdp_session(page)
        self.session = None
        self.replies: dict[int, dict] = {}
        self.next_id = 1
        self.cdp.on("Target.attachedToTarget", self._attached)
        self.cdp.on("Target.receivedMessageFromTarget", self._message)
        self.cdp.send("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": False,
                                               "flatten": False})
        deadline = time.time() + 10
        while self.session is None and time.time() < deadline:
            page.wait_for_timeout(100)
        if self.session is None:
            raise RuntimeError("no worker target to attach to")
        self.page = page

    def _attached(self, event):
        if event["targetInfo"]["type"] == "worker" and self.session is None:
            self.session = event["sessionId"]

    def _message(self, event):
        if event.get("sessionId") == self.session:
            msg = json.loads(event["message"])
            if "id" in msg:
                self.replies[msg["id"]] = msg

    def call(self, method: str, params: dict | None = None) -> dict:
        i = self.next_id
        self.next_id += 1
        self.cdp.send("Target.sendMessageToTarget", {
            "sessionId": self.session,
            "message": json.dumps({"id": i, "method": method, "params": params or {}})})
        deadline = time.time() + 60
        while i not in self.replies and time.time() < deadline:
            self.page.wait_for_timeout(20)
        reply = self.replies.pop(i, None)
        if reply is None or "error" in reply:
            raise RuntimeError(f"{method}: {reply}")
        return reply["result"]

    def used(self, gc: bool) -> int:
        if gc:
            self.call("HeapProfiler.collectGarbage")
        return int(self.call("Runtime.getHeapUsage")["usedSize"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--every", type=int, default=1_000)
    ap.add_argument("--gc", action=argparse.BooleanOptionalAction, default=True,
                    help="collect JS garbage before each JS heap sample (default on)")
    ap.add_argument("--json", help="write the samples here")
    a = ap.parse_args()

    rows = []
    with BrowserSession() as s:
        s.run(models.source())
        s.run(SETUP.format(count=COUNT_BUFFERS_JS))
        heap = WorkerHeap(s.page)
        cols = ["step", "loss", "ms_per_step", "js_heap", "wasm_heap", "py_objects", "gpu_buffers",
                "js_refs"]
        print(" ".join(f"{c:>12}" for c in cols), flush=True)

        def sample(step, r):
            r = {"step": step, **r, "js_heap": heap.used(a.gc)}
            rows.append(r)
            print(" ".join(f"{r[c]:>12.4g}" if isinstance(r[c], float) else f"{r[c]:>12}"
                           for c in cols), flush=True)
        sample(0, s.run("chunk(1)"))  # after one step: every buffer and pipeline exists
        done = 1
        while done < a.steps:
            n = min(a.every - done % a.every, a.steps - done)
            r = s.run(f"chunk({n})", timeout=3600)
            done += n
            sample(done, r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    later = rows[1:] or rows
    for c in ("js_heap", "wasm_heap", "py_objects", "gpu_buffers", "js_refs"):
        lo, hi = min(r[c] for r in later), max(r[c] for r in later)
        print(f"{c:12} min {lo} max {hi} (spread {hi - lo}) over samples 1..{len(rows) - 1}")


if __name__ == "__main__":
    main()
