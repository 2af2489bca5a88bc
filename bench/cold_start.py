"""Cold start of the playground: page open to the first completed training step.

Opens the playground (`serve.py`'s page) in a fresh headless Chromium page, presses Run the
moment the worker says it is ready (the default example, examples/mlp_sin.py, on WebGPU) and
records, from navigation start (performance.timeOrigin):

    ready       Pyodide booted, micropip and the webgrad wheel installed (the worker's "ready")
    ui          the editor/chart bundle and the example loaded (whichever of the two is later,
                Run is possible)
    worker      the worker's own phases (ms from its start): Pyodide up (from the cached
                memory snapshot or not), wheels unpacked, ready
    first_step  the first progress event: compile + the first step's read-back done

Each page is a new browser context (no HTTP cache, no Cache Storage carried over) unless
--warm: then every page after the first reuses one context, as a person reloading the tab
would (revalidated files, 304s, and the Pyodide snapshot the first boot cached). Prints one
line per run, the median, and the machine's load average (uptime's three figures) before
and after, since on a shared machine CPU contention dominates every phase.

    python3 bench/cold_start.py --runs 3 [--warm]
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

# Collects the timestamps in the page; the Run click happens as soon as Run is enabled.
_MEASURE = """async () => {
  const t = {};
  const api = window.webgrad;
  api.ready.then((info) => { t.ready = performance.now(); t.boot = info.boot; });
  await new Promise((resolve) => {
    const off = api.onEvent((m) => {
      if (m.type === "progress" && t.first_step === undefined) {
        t.first_step = performance.now(); off(); resolve();
      }
    });
    const poll = () => {
      const run = document.querySelector("#run");
      if (run && !run.disabled && window.playground.code.includes("def fit(")) {
        t.ui = performance.now(); run.click();
      } else setTimeout(poll, 5);
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
            t = page.evaluate(_MEASURE)
            page.wait_for_function("window.playground.state !== 'running' && "
                                   "window.playground.state !== 'stopping'", timeout=120_000)
            page.close()
            if context is None:
                ctx.close()
            rows.append(t)
            boot = t.get("boot") or {}
            phases = ", ".join(f"{k} {v / 1e3:.2f}" for k, v in boot.items() if k != "from_snapshot")
            print(f"run {i + 1}: ready {t['ready'] / 1e3:.2f} s, ui {t['ui'] / 1e3:.2f} s, "
                  f"first step {t['first_step'] / 1e3:.2f} s  (worker: {phases} s; "
                  f"{'from the cached snapshot' if boot.get('from_snapshot') else 'no snapshot'})",
                  flush=True)
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
