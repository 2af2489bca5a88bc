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


SLOW = """
import pytest
@pytest.mark.slow
@pytest.mark.parametrize("i", range(5))
def test_big(i):
    pass
def test_small():
    pass
"""


@pytest.mark.parametrize("args, ran", [((), 1), (("--run-slow",), 6), (("--slow-shard", "1/2"), 2),
                                       (("--slow-shard", "0/2"), 3)])
def test_slow_cases_run_on_request_or_by_slice(pytester, args, ran):
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(test_small=SLOW)
    res = pytester.runpytest_subprocess("-p", "suite_rules", "-q", *args)
    res.assert_outcomes(passed=ran)


FAKE_DEVICE = """
import sys, types
native = types.ModuleType("webgrad.backends.webgpu_device")
native._shared = types.SimpleNamespace(info="llvmpipe (LLVM 15.0.6, 256 bits) [wgpu]", pipelines={})
sys.modules[native.__name__] = native
"""
BIG_KERNEL = """
import sys, pytest
def _compile(n):
    sys.modules["webgrad.backends.webgpu_device"]._shared.pipelines["x" * n] = object()
def test_small_kernel():
    _compile(1000)
def test_big_kernel():
    _compile(150_000)
@pytest.mark.slow
def test_big_but_slow():
    _compile(200_000)
"""


def test_a_big_kernel_on_a_cpu_adapter_fails_the_run_unless_slow(pytester, monkeypatch):
    """The rule reads what the shared native device compiled during each test (a stand-in
    device here, so the case needs no adapter)."""
    monkeypatch.setenv("WEBGRAD_STRICT", "1")
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makeconftest(FAKE_DEVICE)
    pytester.makepyfile(test_small=BIG_KERNEL)
    res = pytester.runpytest_subprocess("-p", "suite_rules", "-q", "--run-slow")
    assert res.ret == 1
    res.stdout.fnmatch_lines(["*1 test(s) outside the `slow` marker compiled a kernel*",
                              "*test_small.py::test_big_kernel: 150000 characters"])


RECORD = """
import os
def _note(name):
    with open(os.environ["ORDER_LOG"], "a") as f:
        f.write(f"{os.environ.get('PYTEST_XDIST_WORKER', '-')} {name}\\n")
"""


def test_xdist_keeps_the_browser_tests_together_in_file_order(pytester, monkeypatch, tmp_path):
    """Under two xdist workers (scripts/test.sh), every test under tests/browser/ runs on
    one worker, in collection order, and each other file whole on one worker (scope_of),
    so a browser test can build on the one before it. Without the plugin's scheduler xdist
    spreads them over both workers (pytest 9 with xdist's `loadgroup`)."""
    pytest.importorskip("xdist")
    log = tmp_path / "order.txt"
    monkeypatch.setenv("ORDER_LOG", str(log))
    body = RECORD + "".join(f"def test_{i}():\n    _note(__name__ + '.{i}')\n" for i in range(6))
    pytester.makepyfile(**{"tests/browser/test_a": body, "tests/browser/test_b": body,
                           "tests/test_c": body, "tests/test_d": body})
    res = pytester.runpytest_subprocess("-p", "suite_rules", "-q", "-n", "2",
                                        "--dist", "loadscope", "tests")
    assert res.ret == 0, res.stdout.str()
    runs = [line.split() for line in log.read_text().splitlines()]
    assert len(runs) == 24 and {w for w, _ in runs} == {"gw0", "gw1"}
    for group in (("test_a", "test_b"), ("test_c",), ("test_d",)):
        mine = [(w, name) for w, name in runs if name.split(".")[0] in group]
        assert len({w for w, _ in mine}) == 1, mine          # one worker
        expect = [f"{m}.{i}" for m in group for i in range(6)]
        assert [name for _, name in mine] == expect          # in collection order
