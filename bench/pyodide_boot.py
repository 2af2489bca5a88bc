"""What `_makeSnapshot: true` costs Pyodide's boot: loadPyodide with and without it, alternating.

The worker (worker/worker.mjs) boots a first visit's Pyodide without `_makeSnapshot` and leaves
the snapshot to a worker of its own (worker/snapshot.mjs) started once it is idle. This times,
in fresh module workers of one headless Chromium page (serve.py's origin, so the files come
from the HTTP cache after the first), `loadPyodide({indexURL})` against
`loadPyodide({indexURL, _makeSnapshot: true})`, in turns, plus (for the latter) what the maker
then does: unpacking the wheels, webgrad's imports (snapshot.mjs is handed the worker's
SNAPSHOT_IMPORTS; here a shorter list of the same kind) and makeMemorySnapshot. Prints one
line per worker, the medians and the machine's load average before and after.

    python3 bench/pyodide_boot.py --runs 4
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

# one boot in a fresh module worker; ms from the worker's start at the end of each phase
_BOOT = """async ([make, wheels]) => {
  const indexURL = new URL("/assets/pyodide/", location.href).href;
  const source = `
    const t0 = performance.now();
    self.onmessage = async ({data: [make, indexURL, wheels]}) => {
      const ms = {};
      const { loadPyodide } = await import(indexURL + "pyodide.mjs");
      const py = await loadPyodide({ indexURL, _makeSnapshot: make });
      ms.pyodide = performance.now() - t0;
      if (make) {
        const site = py.runPython("import sysconfig; sysconfig.get_path('purelib')");
        for (const url of wheels) {
          const bytes = await (await fetch(url)).arrayBuffer();
          py.unpackArchive(bytes, "wheel", { extractDir: site });
        }
        ms.wheels = performance.now() - t0;
        py.runPython("import json, re, asyncio, webgrad, webgrad.compile, webgrad.backends.webgpu");
        ms.imported = performance.now() - t0;
        ms.bytes = py.makeMemorySnapshot().byteLength;
        ms.made = performance.now() - t0;
      }
      self.postMessage(ms);
    };`;
  const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  const worker = new Worker(url, { type: "module" });
  const ms = await new Promise((resolve, reject) => {
    worker.onmessage = ({ data }) => resolve(data);
    worker.onerror = (e) => reject(new Error(e.message));
    worker.postMessage([make, indexURL, wheels.map((w) => new URL(w, location.href).href)]);
  });
  worker.terminate();
  return ms;
}"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="boots of each kind")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    serve = load_serve(REPO)
    manifest = serve.provision(REPO)
    wheels = [f"/assets/wheels/{manifest[k]}" for k in ("micropip_wheel", "webgrad_wheel")]
    server = serve.make_server("127.0.0.1", 0, REPO)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    from playwright.sync_api import sync_playwright
    times = {False: [], True: []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium_path(), headless=True,
                                    args=CHROMIUM_FLAGS)
        page = browser.new_page()
        page.goto(serve.server_url(server) + "assets/manifest.json")  # the origin, no app
        page.evaluate(_BOOT, [False, wheels])  # fills the HTTP cache; not counted
        for i in range(args.runs):
            for make in (False, True) if i % 2 == 0 else (True, False):
                ms = page.evaluate(_BOOT, [make, wheels])
                times[make].append(ms["pyodide"])
                rest = (f", wheels {ms['wheels'] / 1e3:.2f}, imports {ms['imported'] / 1e3:.2f}, "
                        f"snapshot made {ms['made'] / 1e3:.2f} s ({ms['bytes'] / 2**20:.1f} MiB)"
                        if make else "")
                print(f"_makeSnapshot {str(make).lower():5}: loadPyodide {ms['pyodide'] / 1e3:.2f} s"
                      + rest, flush=True)
        browser.close()
    server.shutdown()
    plain, making = (statistics.median(times[k]) / 1e3 for k in (False, True))
    print(f"median of {args.runs}: loadPyodide {plain:.2f} s, with _makeSnapshot {making:.2f} s "
          f"(ratio {making / plain:.2f})")
    print("load average before: %.2f %.2f %.2f, after: %.2f %.2f %.2f"
          % (*load_before, *os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
