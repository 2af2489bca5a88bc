#!/usr/bin/env python3
"""Does the notebook site (/lab/) work cross-origin isolated? A probe, for serve.py's NOT_ISOLATED.

serve.py serves /lab/ without COOP/COEP because, isolated, JupyterLite's Pyodide kernel runs
on its SharedArrayBuffer transport ("coincident" worker) instead of postMessage ("comlink"),
and there the execute replies of some cells never reach the page. This script serves the site
isolated, opens notebooks/mlp_sin.ipynb in headless Chromium, replaces its code cells with
trivial ones (no webgrad: `x = 1`, or `print(...)` with --print), runs them all and reports,
per try, which cells got their execution count (their reply) once the kernel is idle again.
Run it after upgrading jupyterlite-pyodide-kernel: when every try shows every count, /lab/
can be isolated (drop NOT_ISOLATED).

    python3 scripts/lab_isolation.py [--tries 3] [--print] [--notebook]   # --notebook: the
                                                                          # real cells, webgrad
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pkg"))

_CELLS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const cells = panel.content.model.cells, out = [];
  for (let i = 0; i < cells.length; i++) {
    if (cells.get(i).type === "code") out.push(cells.get(i).executionCount);
  }
  return {counts: out, kernel: panel.sessionContext.session?.kernel?.status ?? null,
          isolated: crossOriginIsolated};
}"""
_IDLE = ("() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel?.status"
         " === 'idle'")
_SET_SOURCES = """(sources) => {
  const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
  let k = 0;
  for (let i = 0; i < cells.length; i++) {
    if (cells.get(i).type === "code") cells.get(i).sharedModel.setSource(sources[k++] ?? "pass");
  }
}"""
_RUN_ALL = """() => { window.labProbe = undefined;
  window.jupyterapp.commands.execute("notebook:run-all-cells").then(
    (ok) => { window.labProbe = ok; }, (e) => { window.labProbe = String(e); }); }"""


def probe_once(browser, url: str, sources: list[str] | None, wait: float) -> dict:
    page = browser.new_page()  # a fresh context each try: no notebook kept in storage
    try:
        page.goto(url + "lab/notebooks/index.html?path=mlp_sin.ipynb")
        page.wait_for_function(_IDLE, timeout=240_000, polling=250)
        if sources is not None:
            page.evaluate(_SET_SOURCES, sources)
        page.evaluate(_RUN_ALL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < wait:
            time.sleep(2)
            state = page.evaluate(_CELLS)
            if page.evaluate("window.labProbe") is not None:
                break
            if state["kernel"] == "idle" and time.monotonic() - t0 > 15:
                break  # idle, yet run-all still waits: a reply is missing
        state = page.evaluate(_CELLS)
        state["run_all_done"] = page.evaluate("window.labProbe") is not None
        state["seconds"] = round(time.monotonic() - t0, 1)
        return state
    finally:
        page.context.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--print", action="store_true", help="cells print a line each")
    ap.add_argument("--notebook", action="store_true", help="the notebook's own cells")
    ap.add_argument("--wait", type=float, default=120.0, help="seconds per try at most")
    ap.add_argument("--not-isolated", action="store_true", help="serve /lab/ as serve.py does")
    args = ap.parse_args(argv)
    from webgrad.browser import CHROMIUM_FLAGS, _chromium_path, load_serve
    serve = load_serve(ROOT)
    serve.provision(ROOT)
    serve.provisioning.load_lab(ROOT).build_lab(ROOT)
    if not args.not_isolated:
        serve.NOT_ISOLATED = ()  # the page handler reads it per response
    server = serve.make_server("127.0.0.1", 0, ROOT)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sources = None if args.notebook else [
        (f'print("cell {k}")' if args.print else f"x = {k}") for k in range(1, 6)]
    from playwright.sync_api import sync_playwright
    bad = 0
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_chromium_path(), headless=True,
                                        args=CHROMIUM_FLAGS)
            for i in range(args.tries):
                s = probe_once(browser, serve.server_url(server), sources, args.wait)
                lost = [k + 1 for k, c in enumerate(s["counts"]) if c is None]
                bad += bool(lost) or not s["run_all_done"]
                print(f"try {i + 1}: isolated={s['isolated']} kernel={s['kernel']} counts="
                      f"{s['counts']} run-all done={s['run_all_done']} after {s['seconds']} s"
                      + (f"; cells without a reply: {lost}" if lost else ""), flush=True)
            browser.close()
    finally:
        server.shutdown()
    print(f"{bad} of {args.tries} tries lost a reply")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
