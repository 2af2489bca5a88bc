"""The worker's Pyodide memory snapshot (worker/worker.mjs, worker/snapshot.mjs): the first boot
on an origin goes ready without one; once the worker is idle, a worker of its own makes one and
keeps it in Cache Storage; a page opened later in the same browser context boots from it, and
its Python then behaves like a freshly initialized one (checked against CPython's own answers,
and by compiling and stepping a model on WebGPU against the reference executor in CPython).
The maker never runs beside a request (not started while one runs, terminated when one comes),
and one page of the origin makes it at a time (a Web Lock).
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


# the URLs of the snapshots this origin keeps (one at most)
_SNAPSHOT_KEYS = """async () => (await (await caches.open("webgrad-pyodide-snapshot")).keys())
    .map((r) => r.url)"""
# sets window.snapshotStored when the worker says it has stored one (its cache.put is done)
_SNAPSHOT_STORED = """() => window.webgrad.onEvent((m) => {
  if (m.type === "snapshot" && m.state === "stored") window.snapshotStored = true;
})"""


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
            if not infos[-1]["boot"].get("from_snapshot"):  # none was made during the boot
                assert page.evaluate(_SNAPSHOT_KEYS) == [], infos[-1]
                page.evaluate(_SNAPSHOT_STORED)
            page.wait_for_function("window.playground.state !== 'booting'", timeout=60_000)
            statuses.append(page.evaluate("window.bootStatus"))
            results.append(page.evaluate(
                "(code) => window.webgrad.run(code).catch((e) => ({error: e}))", _CODE))
            assert "error" not in results[-1], (infos[-1], results[-1]["error"]["traceback"])
            if not infos[-1]["boot"].get("from_snapshot"):  # made once the worker is idle
                page.wait_for_function("window.snapshotStored", timeout=60_000)
                assert len(page.evaluate(_SNAPSHOT_KEYS)) == 1
            page.close()
    finally:
        context.close()
    assert not infos[0]["boot"].get("from_snapshot") and infos[1]["boot"].get("from_snapshot") is True
    assert not any("snapshot" in phase for info in infos for phase in info["boot"]
                   if phase != "from_snapshot"), infos
    # the status said what the boot was doing, with the time since the page opened
    kB = round(sum((REPO / "web" / "assets" / "wheels" / w).stat().st_size for w in
                   (MANIFEST()["micropip_wheel"], MANIFEST()["webgrad_wheel"])) / 1024)
    for seen, phases in zip(statuses, [
            ["Starting Python (Pyodide)…", f"Installing webgrad ({kB} kB)…",
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


# The worker's snapshot events in order, with the page's own marks between them. The page holds
# the makers' Web Lock from its start, as another page of the origin making one would, and lets
# it go when a maker has found it taken (no maker runs then: the next starts after an idle wait).
_WATCH = """async () => {
  window.snapshotLog = [];
  window.webgrad.onEvent((m) => {
    if (m.type !== "snapshot") return;
    window.snapshotLog.push(m.state + (m.reason ? ": " + m.reason : ""));
    if (m.state === "skipped") window.releaseSnapshotLock();
  });
  await window.webgrad.ready;
  // longer than the worker's idle wait (SNAPSHOT_IDLE_MS): a maker started by the clock alone
  // would start during it
  await window.webgrad.run("import asyncio\\nawait asyncio.sleep(3.5)");
  window.snapshotLog.push("run 1 done");
}"""
_HOLD_LOCK = """navigator.locks.request("webgrad-pyodide-snapshot",
    () => new Promise((release) => { window.releaseSnapshotLock = release; }));"""


def test_snapshot_maker_waits_for_idle(browser_session):
    context = browser_session.browser.new_context()
    context.add_init_script(_HOLD_LOCK)
    try:
        page = context.new_page()
        page.goto(browser_session.url)
        page.wait_for_function(
            "window.webgrad !== undefined && typeof window.releaseSnapshotLock === 'function'")
        page.evaluate(_WATCH)
        # the lock was held: a maker started once the worker was idle, found it taken and
        # stopped; the next one starts after another idle wait
        page.wait_for_function("window.snapshotLog.filter((s) => s === 'making').length === 2",
                               timeout=30_000)
        # a request that comes while it works terminates it; it starts again once idle
        assert page.evaluate("""async () => {
          const value = await window.webgrad.run("6 * 7");
          window.snapshotLog.push("run 2 done");
          return value;
        }""") == 42
        page.wait_for_function("window.snapshotLog.includes('stored')", timeout=60_000)
        seen = page.evaluate("window.snapshotLog")
        keys = page.evaluate(_SNAPSHOT_KEYS)
        page.close()
    finally:
        context.close()
    # nothing happened while the first run ran, though it outlasted the idle wait
    assert seen == ["run 1 done", "making", "skipped: another page is making one", "making",
                    "stopped", "run 2 done", "making", "stored"], seen
    # stored under this boot's key: the next boot finds it (test_second_page_boots_from_snapshot)
    assert len(keys) == 1 and MANIFEST()["boot_key"] in keys[0], keys
