"""Cold start of the playground: page open to the first completed training step.

Opens the playground (`serve.py`'s page) in a fresh headless Chromium page, presses Run the
moment the worker says it is ready (the default example, examples/mlp_sin.py, on WebGPU) and
records, from navigation start (performance.timeOrigin):

    ready       Pyodide booted, micropip and the webgrad wheel installed (the worker's "ready")
    ui          the editor/chart bundle and the example loaded (whichever of the two is later,
                Run is possible)
    worker      the worker's own phases (ms from its start): Pyodide up (from the cached
                memory snapshot or not), wheels unpacked, ready
    warm        the worker's warm-up after ready (compiler imported, GPU device requested)
    first_step  the first progress event: compile + the first step's read-back done
    snapshot    (a boot that found no snapshot) when the worker's idle-time snapshot maker
                stored the Pyodide snapshot the next visit boots from, and its phases

With --phases, the run's own time is split too: the worker wraps the compile stages
(tracing with autograd and the optimizer, lowering to WGSL, loading the plan on the device =
buffers and pipelines, the parameters' init program, the first step, the first forward
run) with timers before Run is pressed, and prints when each began and ended.

Each page is a new browser context (no HTTP cache, no Cache Storage carried over) unless
--warm: then every page after the first reuses one context, as a person reloading the tab
would (revalidated files, 304s, and the Pyodide snapshot the first visit cached: the page
stays open after its run until the worker has stored it, as a person reading the result
would; the worker makes it only once it is idle). Prints one
line per run, the median, and the machine's load average (uptime's three figures) before
and after, since on a shared machine CPU contention dominates every phase.

    python3 bench/cold_start.py --runs 3 [--warm]
    python3 bench/cold_start.py --runs 1 --phases --example char_lm.py   # another example's Run

--example FILE loads that example from the menu (examples/FILE) once the page is ready and
presses Run; first_step is then that example's first progress event (its compile included).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "pkg"))

from webgrad.browser import CHROMIUM_FLAGS, _chromium_path, load_serve  # noqa: E402

# Timers around the compile stages, installed in the worker before Run (--phases): each entry
# of `webgrad_phases` lists [start, end] of each call of the stage (ms on the worker's clock);
# a plan's load also notes its pipeline count.
_WRAP = """
import js, webgrad.compile as _C, webgrad.compiled as _CM
from webgrad.backends import webgpu as _W, webgpu_browser as _B
webgrad_phases = {"request": js.performance.now()}
def _timed(owner, attr, key, is_async=False):
    f = getattr(owner, attr)
    def note(t0, a=()):
        extra = [len(a[1]["pipelines"])] if key == "load" else []
        webgrad_phases.setdefault(key, []).append([t0, js.performance.now()] + extra)
    if is_async:
        async def g(*a, **k):
            t0 = js.performance.now()
            try: return await f(*a, **k)
            finally: note(t0, a)
    else:
        def g(*a, **k):
            t0 = js.performance.now()
            try: return f(*a, **k)
            finally: note(t0, a)
    setattr(owner, attr, g)
_timed(_C, "build_train_graph", "trace")
_timed(_C, "build_forward_graph", "trace_forward")
_timed(_CM, "build_forward_graph", "trace_forward")   # CompiledModule.compile_forward
_timed(_W, "lower", "lower")
_timed(_B.BrowserHost, "load", "load")
_timed(_W.WebGPUBackend, "init_params", "init")
_timed(_CM.CompiledModule, "step_async", "step", True)
_timed(_CM.CompiledForward, "run_async", "forward_run", True)
"""

# Collects the timestamps in the page; the Run click happens as soon as Run is enabled.
_MEASURE = """async ([wrap, example]) => {
  const t = {};
  const api = window.webgrad;
  window.snapshotEvents = [];
  api.onEvent((m) => {
    if (m.type === "snapshot") window.snapshotEvents.push({ ...m, page_ms: performance.now() });
  });
  api.ready.then((info) => {
    t.ready = performance.now(); t.boot = info.boot;
    if (wrap) api.run(wrap).catch((e) => { t.wrap_error = e; });
  });
  await new Promise((resolve) => {
    const off = api.onEvent((m) => {
      if (m.type === "warm") { t.warm = performance.now(); t.boot = m.boot; }
      if (m.type === "progress" && t.first_step === undefined) {
        t.first_step = performance.now(); off(); resolve();
      }
    });
    let loading = false;
    const poll = () => {
      const run = document.querySelector("#run");
      if (example && !loading && run && !run.disabled) {
        loading = true;
        window.playground.load(example).then(() => { t.ui = performance.now(); run.click(); });
      } else if (!example && run && !run.disabled && window.playground.code.includes("def fit(")) {
        t.ui = performance.now(); run.click();
      } else if (!loading) setTimeout(poll, 5);
    };
    poll();
  });
  window.playground.stop();
  return t;
}"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warm", action="store_true", help="reuse one browser context (HTTP cache)")
    parser.add_argument("--phases", action="store_true", help="time the compile stages of the run")
    parser.add_argument("--example", default=None,
                        help="run this file of examples/ instead of the default example")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    serve = load_serve(REPO)
    serve.provision(REPO)
    server = serve.make_server("127.0.0.1", 0, REPO)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = serve.server_url(server)
    from playwright.sync_api import sync_playwright
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium_path(), headless=True,
                                    args=CHROMIUM_FLAGS)
        context = browser.new_context() if args.warm else None
        for i in range(args.runs):
            ctx = context or browser.new_context()
            page = ctx.new_page()
            page.goto(url)
            t = page.evaluate(_MEASURE, [_WRAP if args.phases else None, args.example])
            page.wait_for_function("window.playground.state !== 'running' && "
                                   "window.playground.state !== 'stopping'", timeout=120_000)
            if args.phases:
                t["phases"] = page.evaluate("window.webgrad.run('webgrad_phases')")
            if args.warm and not (t.get("boot") or {}).get("from_snapshot"):
                page.wait_for_function("""window.snapshotEvents.some((m) =>
                    ["stored", "skipped", "failed"].includes(m.state))""", timeout=120_000)
                t["snapshot"] = page.evaluate("window.snapshotEvents")
            page.close()
            if context is None:
                ctx.close()
            rows.append(t)
            boot = t.get("boot") or {}
            phases = ", ".join(f"{k} {v / 1e3:.2f}" for k, v in boot.items()
                               if k not in ("from_snapshot", "prewarmed"))
            if boot.get("prewarmed"):
                phases += f" ({boot['prewarmed']} pipelines prewarmed)"
            warm = f"warm {t['warm'] / 1e3:.2f} s, " if "warm" in t else ""
            print(f"run {i + 1}: ready {t['ready'] / 1e3:.2f} s, ui {t['ui'] / 1e3:.2f} s, {warm}"
                  f"first step {t['first_step'] / 1e3:.2f} s  (worker: {phases} s; "
                  f"{'from the cached snapshot' if boot.get('from_snapshot') else 'no snapshot'})",
                  flush=True)
            for m in t.get("snapshot", []):
                if m["state"] in ("stored", "skipped", "failed"):
                    ms = ", ".join(f"{k} {v / 1e3:.2f}" for k, v in (m.get("ms") or {}).items())
                    print(f"  snapshot {m['state']} at {m['page_ms'] / 1e3:.2f} s "
                          f"({m.get('reason') or m.get('error') or f'maker: {ms} s'}; "
                          f"{sum(e['state'] == 'stopped' for e in t['snapshot'])} stopped by requests)",
                          flush=True)
            if t.get("wrap_error"):
                print("  phases not measured:", t["wrap_error"].get("message"))
            if t.get("phases"):
                ph = t["phases"]
                calls = sorted((c[0], c[1], k, c[2:]) for k, v in ph.items() if k != "request"
                               for c in v)
                print("  run (worker clock, s): request " + f"{ph['request'] / 1e3:.2f}; " + "; ".join(
                    f"{k}{f'({x[0]} pipelines)' if x else ''} {a / 1e3:.2f}-{b / 1e3:.2f} "
                    f"({b - a:.0f} ms)" for a, b, k, x in calls), flush=True)
        browser.close()
    server.shutdown()
    med = {k: statistics.median(r[k] for r in rows) / 1e3 for k in ("ready", "ui", "first_step")}
    print(f"median of {len(rows)} ({'warm' if args.warm else 'cold'} cache): ready "
          f"{med['ready']:.2f} s, first step {med['first_step']:.2f} s (target < 4 s)")
    print("load average before: %.2f %.2f %.2f, after: %.2f %.2f %.2f"
          % (*load_before, *os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
