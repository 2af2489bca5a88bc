"""Test setup: import webgrad from the checkout's pkg/ directory when it is not installed."""
from __future__ import annotations

import sys
from pathlib import Path

PKG = str(Path(__file__).resolve().parents[1] / "pkg")
if PKG not in sys.path:
    sys.path.insert(0, PKG)
