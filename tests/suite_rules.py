"""The suite's own rules, a pytest plugin (tests/conftest.py loads it; docs/testing.md).

scripts/test.sh, and so CI, turns them on with WEBGRAD_STRICT=1:
- no test takes more than WEBGRAD_TEST_LIMIT_S seconds (default 60), set-up, call and
  tear-down together: a slow case fails the run, named with its time;
- no test skips but for a reason in ALLOWED_SKIPS: a missing lavapipe, Chromium or library
  turns about half the suite into skips, and a green run must not hide that;
- on a CPU adapter (lavapipe), no test outside the `slow` marker compiles a kernel of more
  than KERNEL_CAP characters of WGSL. llvmpipe compiles a kernel at its first dispatch, in
  time that grows faster than the square of its length (an attention kernel of 210 K
  characters took 26 s with an empty shader cache, one of 420 K 155 s), and a machine
  whose Mesa cache is warm hides that: this rule holds on any machine.

Cases marked `slow` are left out unless `--run-slow` is given; `--slow-shard K/N` runs the
K-th of N slices of them (CI runs one slice per landing, .ci/run).

With pytest-xdist (scripts/test.sh runs a worker per core), the browser tests stay together
on one worker, in file order: they share one Chromium and one Pyodide boot, and some build on
the test before them (the playground's trained model). Every other file runs whole on one
worker, in file order, as it does without xdist. The grouping is this plugin's scheduler
(`pytest_xdist_make_scheduler`, `scope_of`), not xdist's `xdist_group` marker: pytest 9 keeps
a node's id where xdist 3.8 no longer writes the group into it, so `--dist loadgroup` split
the browser tests over both workers and the playground's tests after the training one found
no model.
"""
from __future__ import annotations

import os
import sys

import pytest

# Skip reasons a run may have (a substring of the reason, and why it is allowed)
ALLOWED_SKIPS = {
    "WEBGRAD_SCREENSHOTS": "the playground screenshots for docs/ are made on request",
    "no IPv6 loopback": "a machine without ::1 cannot serve on it",
    "has 'subgroups'": "the fallback without subgroups is tested where the adapter lacks them",
    "has no 'subgroups' feature": "the subgroup kernels are tested where the adapter has them",
    "has no 'timestamp-query'": "timestamps are an optional WebGPU feature",
    "needs CUDA": "runs on a machine with an NVIDIA GPU (bench/, the device)",
}

KERNEL_CAP = 100_000  # characters of one kernel's WGSL (see the module docstring)

_durations: dict[str, float] = {}
_skips: dict[str, str] = {}
_big_kernels: dict[str, int] = {}  # test -> the longest kernel it compiled, over KERNEL_CAP


def pytest_addoption(parser):
    group = parser.getgroup("webgrad")
    group.addoption("--run-slow", action="store_true",
                    help="also run the cases marked slow (kernels no adapter picks by default)")
    group.addoption("--slow-shard", default=None, metavar="K/N",
                    help="run only the K-th (0-based) of N slices of the slow cases")


BROWSER_GROUP = "browser"   # scope_of's one scope for every test under tests/browser/


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to under xdist: a worker runs a unit whole, in
    collection order. The browser tests are one unit; any other test's unit is its file."""
    path = nodeid.split("::", 1)[0]
    return BROWSER_GROUP if path.startswith("tests/browser/") else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):
        """xdist's scope scheduling with scope_of's units (the largest units go first)."""

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ByScope(config, log)


def pytest_collection_modifyitems(config, items):
    shard = config.getoption("--slow-shard")
    if shard:
        try:
            k, n = (int(v) for v in shard.split("/"))
            assert 0 <= k < n
        except (ValueError, AssertionError):
            raise pytest.UsageError(f"--slow-shard {shard!r}: give K/N with 0 <= K < N, e.g. 0/4")
        keep = [it for it in items if it.get_closest_marker("slow")][k::n]
    elif config.getoption("--run-slow"):
        return
    else:
        keep = [it for it in items if not it.get_closest_marker("slow")]
    kept = {id(it) for it in keep}
    drop = [it for it in items if id(it) not in kept]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _native_pipelines():
    """The WGSL texts the process's shared native device has compiled, and whether it is a
    CPU adapter (None: no native device made yet)."""
    native = sys.modules.get("webgrad.backends.webgpu_device")
    dev = getattr(native, "_shared", None) if native else None
    if dev is None:
        return None, False
    info = dev.info.lower()
    return set(dev.pipelines), any(w in info for w in ("llvmpipe", "lavapipe", "swiftshader", "cpu"))


@pytest.fixture(autouse=True)
def _kernel_sizes(request):
    before, _ = _native_pipelines()
    yield
    after, cpu = _native_pipelines()
    if after is None or not cpu or request.node.get_closest_marker("slow"):
        return
    new = [len(w) for w in after - (before or set())]
    longest = max(new, default=0)
    log = os.environ.get("WEBGRAD_KERNEL_LOG")  # a file: one line per test, for the suite's budget
    if log and new:
        with open(log, "a") as f:
            f.write(f"{request.node.nodeid}\t{len(new)}\t{sum(new)}\t{longest}\n")
    if longest > KERNEL_CAP:  # read back by pytest_runtest_logreport (with xdist, on the controller)
        request.node.user_properties.append(("longest_cpu_kernel", longest))


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    for key, value in report.user_properties:  # set on the worker that ran the test
        if key == "longest_cpu_kernel":
            _big_kernels[report.nodeid] = value
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skips[report.nodeid] = reason.removeprefix("Skipped: ")


def _strict() -> bool:
    return os.environ.get("WEBGRAD_STRICT") == "1"


def _broken_rules() -> list[str]:
    limit = float(os.environ.get("WEBGRAD_TEST_LIMIT_S", "60"))
    slow = sorted(((d, n) for n, d in _durations.items() if d > limit), reverse=True)
    lines = [f"{d:.1f} s  {n}" for d, n in slow]
    if lines:
        lines.insert(0, f"{len(slow)} test(s) took longer than {limit:g} s (WEBGRAD_TEST_LIMIT_S): "
                        "shrink them, or move them to the `slow` marker (docs/testing.md)")
    bad = {n: r for n, r in _skips.items() if not any(a in r for a in ALLOWED_SKIPS)}
    if bad:
        lines.append(f"{len(bad)} test(s) skipped for a reason not in conftest.ALLOWED_SKIPS "
                     "(install what they need: ./scripts/install.sh; or document the reason):")
        lines += [f"  {n}: {r}" for n, r in sorted(bad.items())]
    if _big_kernels:
        lines.append(f"{len(_big_kernels)} test(s) outside the `slow` marker compiled a kernel of "
                     f"more than {KERNEL_CAP} characters on a CPU adapter (minutes with a cold "
                     "shader cache): shrink the shapes, or mark them slow")
        lines += [f"  {n}: {c} characters" for n, c in sorted(_big_kernels.items())]
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _strict():
        for line in _broken_rules():
            terminalreporter.write_line(line, red=True)


def pytest_sessionfinish(session, exitstatus):
    if _strict() and exitstatus == 0 and _broken_rules():
        session.exitstatus = 1
