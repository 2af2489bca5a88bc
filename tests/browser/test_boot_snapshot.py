"""The worker's Pyodide memory snapshot (worker/worker.mjs): the first boot on an origin makes
one and keeps it in Cache Storage; a page opened later in the same browser context boots from
it, and its Python then behaves like a freshly initialized one (checked against CPython's own
answers, and by compiling and stepping a model on WebGPU against the reference executor in CPython).
The snapshot holds webgrad's compiler already imported; the modules it does not hold still
import from the wheel's files, and the wheel's metadata is there. The playground's status says
what each boot is doing (starting Python, installing the wheels with their size read from the
files served, the snapshot, importing) with the time so far, then how long the boot took.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
REPO = Path(__file__).resolve().parents[2]


def MANIFEST():
    return json.loads((REPO / "web" / "assets" / "manifest.json").read_text())


# every distinct text the playground's #status shows, from the page's first script on
RECORD_STATUS = """
window.bootStatus = [];
new MutationObserver(() => {
  const text = document.getElementById("status")?.textContent;
  if (text && text !== window.bootStatus[window.bootStatus.length - 1]) window.bootStatus.push(text);
}).observe(document, {childList: true, characterData: true, subtree: true});
"""

_CODE = """
import sys, math, json, hashlib, importlib.metadata, webgrad as wg
import webgrad.io.safetensors as st  # not in the snapshot: imported from the unpacked wheel
from webgrad import ops, optim, Module, init
class M(Module):
    def __init__(self):
        super().__init__()
        self.w = self.param([3, 2], init=init.literal([[0.1, -0.2], [0.3, 0.4], [-0.5, 0.6]]))
def loss(m, inp):
    return ops.sum_all((inp["x"] @ m.w) ** 2)
c = wg.compile_module(M, loss, inputs={"x": ([2, 3], "f32")}, optimizer=optim.SGD(lr=0.1),
                      backend="webgpu")
[sys.platform, hashlib.sha256(b"webgrad").hexdigest(), math.lgamma(7.5),
 json.dumps({"a": [1, 2]}), importlib.metadata.version("webgrad"),
 sorted(st.load(st.dumps({"t": ("F32", [2], bytes(8))}))), c.step({"x": [[1, 2, 3], [4, 5, 6]]}),
 c.step({"x": [[1, 2, 3], [4, 5, 6]]})]
"""


def test_second_page_boots_from_snapshot(browser_session):
    import hashlib
    import json
    context = browser_session.browser.new_context()
    context.add_init_script(RECORD_STATUS)
    try:
        infos, results, statuses = [], [], []
        for _ in range(2):
            page = context.new_page()
            page.goto(browser_session.url)
            infos.append(page.evaluate("window.webgrad.ready"))
            page.wait_for_function("window.playground.state !== 'booting'", timeout=60_000)
            statuses.append(page.evaluate("window.bootStatus"))
            results.append(page.evaluate(
                "(code) => window.webgrad.run(code).catch((e) => ({error: e}))", _CODE))
            assert "error" not in results[-1], (infos[-1], results[-1]["error"]["traceback"])
            if not infos[-1]["boot"].get("from_snapshot"):  # storing it is not awaited by boot
                page.wait_for_function("""async () => (await (await caches.open(
                    "webgrad-pyodide-snapshot")).keys()).length > 0""", timeout=60_000)
            page.close()
    finally:
        context.close()
    assert not infos[0]["boot"].get("from_snapshot") and infos[1]["boot"].get("from_snapshot") is True
    assert "snapshot_made" in infos[0]["boot"] and "snapshot_made" not in infos[1]["boot"]
    # the status said what the boot was doing, with the time since the page opened
    kB = round(sum((REPO / "web" / "assets" / "wheels" / w).stat().st_size for w in
                   (MANIFEST()["micropip_wheel"], MANIFEST()["webgrad_wheel"])) / 1024)
    for seen, phases in zip(statuses, [
            ["Starting Python (Pyodide)…", f"Installing webgrad ({kB} kB)…",
             f"Installing webgrad ({kB} kB) and keeping a snapshot of Python for the next visits…",
             "Importing webgrad…"],
            ["Starting Python (Pyodide, from this browser's snapshot)…",
             f"Installing webgrad ({kB} kB)…"]]):
        seen = [t for t in seen if t != "Loading…"]  # the page's text before its script runs
        booting = [t.rsplit(" · ", 1) for t in seen[:-1]]
        assert all(re.fullmatch(r"[\d.]+ s", s) for _, s in booting), seen
        shown = [t for t, _ in booting if t != "Starting Python (Pyodide) in a worker…"]
        assert list(dict.fromkeys(shown)) == phases, seen
        times = [float(s[:-2]) for _, s in booting]
        assert times == sorted(times), seen
        assert re.fullmatch(r"Ready in [\d.]+ s: Python 3[\d.]+, webgrad .*", seen[-1]), seen
    import webgrad as wg
    from webgrad import Module, init, ops, optim

    class M(Module):
        def __init__(self):
            super().__init__()
            self.w = self.param([3, 2], init=init.literal([[0.1, -0.2], [0.3, 0.4], [-0.5, 0.6]]))

    c = wg.compile_module(M, lambda m, inp: ops.sum_all((inp["x"] @ m.w) ** 2),
                          inputs={"x": ([2, 3], "f32")}, optimizer=optim.SGD(lr=0.1),
                          backend="reference")
    feed = {"x": [[1, 2, 3], [4, 5, 6]]}
    expected = ["emscripten", hashlib.sha256(b"webgrad").hexdigest(), math.lgamma(7.5),
                json.dumps({"a": [1, 2]}), wg.__version__, ["t"], c.step(feed), c.step(feed)]
    for got in results:
        assert got[:6] == expected[:6]
        assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(got[6:], expected[6:]))
