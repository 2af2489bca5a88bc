"""Printed output through the playground's worker: time to print N lines and see them in the page.

Runs `for i in range(N): print(i)` through a BrowserSession for N = 2k, 4k, 8k and 100k, and
waits until the page's console shows the last line. Linear growth is the point (the worker
merges a flood of writes into a message per 40 ms; the console appends once per frame and
keeps its last 4,000 lines).

    python3 bench/output_flood.py
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pkg"))

from webgrad.browser import BrowserSession  # noqa: E402


def main() -> int:
    with BrowserSession() as s:
        s.page.wait_for_function("window.playground && window.playground.state !== 'booting'",
                                 timeout=120_000)
        s.run("1")
        for n in (2000, 4000, 8000, 100_000):
            t0 = time.perf_counter()
            s.run(f"for i in range({n}):\n    print(i)", timeout=600)
            s.page.wait_for_function(
                f"document.querySelector('#console').textContent.endsWith('{n - 1}\\n')",
                timeout=600_000)
            print(f"{n:7d} lines: {time.perf_counter() - t0:6.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
