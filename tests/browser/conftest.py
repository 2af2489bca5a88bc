"""Fixtures for the browser tests: one headless Chromium and one Pyodide boot per test session.

Booting Pyodide and installing webgrad takes seconds, so every browser test shares the session's
page (``browser_session``); tests that break their worker on purpose open a page of their own.
The tests skip, saying why, when Playwright or Chromium is missing.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if importlib.util.find_spec("webgrad") is None:  # not pip-installed: use the checkout
    sys.path.insert(0, str(REPO / "pkg"))


def _missing_browser_tools() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "Playwright is not installed (pip install playwright)"
    chromium = os.environ.get("WEBGRAD_CHROMIUM", "/usr/bin/chromium")
    if not (os.path.isfile(chromium) or shutil.which(chromium)):
        return f"Chromium not found at {chromium} (apt-get install chromium, or set WEBGRAD_CHROMIUM)"
    return None


@pytest.fixture(scope="session")
def serve_module():
    """The checkout's serve.py, imported as a module."""
    from webgrad.browser import find_repo, load_serve
    return load_serve(find_repo())


@pytest.fixture(scope="session")
def browser_session():
    reason = _missing_browser_tools()
    if reason:
        pytest.skip(reason)
    from webgrad.browser import BrowserSession
    with BrowserSession() as session:
        yield session
