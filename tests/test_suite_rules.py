"""The suite's own rules (tests/suite_rules.py) fail a run as they say: a test over the time
limit, and a skip for a reason not in ALLOWED_SKIPS; an allowed skip and fast tests pass.
Each case runs a small suite of its own in a subprocess (pytest's pytester)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent)  # where the subprocess finds suite_rules
pytest_plugins = ["pytester"]

SUITE = """
import time, pytest
def test_fast():
    pass
def test_allowed_skip():
    pytest.skip("this adapter has no 'timestamp-query'")
"""


@pytest.fixture(autouse=True)
def _plugin_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))


def _run(pytester, extra: str, monkeypatch, limit: str = "60"):
    monkeypatch.setenv("WEBGRAD_STRICT", "1")
    monkeypatch.setenv("WEBGRAD_TEST_LIMIT_S", limit)
    pytester.makepyfile(test_small=SUITE + extra)
    return pytester.runpytest_subprocess("-p", "suite_rules", "-q")


def test_fast_tests_and_allowed_skips_pass(pytester, monkeypatch):
    assert _run(pytester, "", monkeypatch).ret == 0


def test_an_undocumented_skip_fails_the_run(pytester, monkeypatch):
    res = _run(pytester, "def test_gpu():\n    pytest.skip('no native WebGPU adapter')\n", monkeypatch)
    assert res.ret == 1
    res.stdout.fnmatch_lines(["*1 test(s) skipped for a reason not in conftest.ALLOWED_SKIPS*",
                              "*test_gpu: no native WebGPU adapter*"])


def test_a_slow_test_fails_the_run(pytester, monkeypatch):
    res = _run(pytester, "def test_slow():\n    time.sleep(0.6)\n", monkeypatch, limit="0.5")
    assert res.ret == 1
    res.stdout.fnmatch_lines(["*1 test(s) took longer than 0.5 s*", "*s  test_small.py::test_slow"])


def test_without_strict_the_rules_only_watch(pytester, monkeypatch):
    monkeypatch.delenv("WEBGRAD_STRICT", raising=False)
    pytester.makepyfile(test_small=SUITE + "def test_gpu():\n    pytest.skip('no adapter')\n")
    assert pytester.runpytest_subprocess("-p", "suite_rules", "-q").ret == 0
