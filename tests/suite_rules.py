"""The suite's own rules, a pytest plugin (tests/conftest.py loads it; docs/testing.md).

scripts/test.sh, and so CI, turns them on with WEBGRAD_STRICT=1:
- no test takes more than WEBGRAD_TEST_LIMIT_S seconds (default 60), set-up, call and
  tear-down together: a slow case fails the run, named with its time;
- no test skips but for a reason in ALLOWED_SKIPS: a missing lavapipe, Chromium or library
  turns about half the suite into skips, and a green run must not hide that.
"""
from __future__ import annotations

import os

# Skip reasons a run may have (a substring of the reason, and why it is allowed)
ALLOWED_SKIPS = {
    "WEBGRAD_SCREENSHOTS": "the playground screenshots for docs/ are made on request",
    "no IPv6 loopback": "a machine without ::1 cannot serve on it",
    "has 'subgroups'": "the fallback without subgroups is tested where the adapter lacks them",
    "has no 'subgroups' feature": "the subgroup kernels are tested where the adapter has them",
    "has no 'timestamp-query'": "timestamps are an optional WebGPU feature",
    "needs CUDA": "runs on a machine with an NVIDIA GPU (bench/, the device)",
}

_durations: dict[str, float] = {}
_skips: dict[str, str] = {}


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
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
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _strict():
        for line in _broken_rules():
            terminalreporter.write_line(line, red=True)


def pytest_sessionfinish(session, exitstatus):
    if _strict() and exitstatus == 0 and _broken_rules():
        session.exitstatus = 1
