"""Test setup: import webgrad from the checkout's pkg/ directory when it is not installed."""
from __future__ import annotations

import sys
from pathlib import Path

PKG = str(Path(__file__).resolve().parents[1] / "pkg")
if PKG not in sys.path:
    sys.path.insert(0, PKG)
# tests/ itself, so suites in subfolders (tests/browser, tests/webgpu) can `import oracle`
TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
