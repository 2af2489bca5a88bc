"""c.profile() in the browser worker (BrowserHost over worker/replay.mjs's `profile`): GPU
times per kernel from timestamp queries where the device has 'timestamp-query' (headless
Chromium's SwiftShader adapter does), else the wall time of each kernel submitted alone.

The times are judged against the wall clock of the same worker: every dispatch has a time,
none is negative, the timestamp sum fits inside the profiled call's own wall time, and it
is a fair part of an ordinary step's (the step is mostly GPU work on SwiftShader). The
static columns (bytes, FLOPs) are the same code as natively, checked in tests/test_profile.py.
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
REPO = Path(__file__).resolve().parents[2]

# Runs in the worker: the test suite's small transformer, a few steps timed by the wall
# clock, then one profiled step, on the device `host` (None: the shared one).
PROFILE = """
import importlib, os, sys, time
os.makedirs("/home/pyodide/webgrad_tests", exist_ok=True)
with open("/home/pyodide/webgrad_tests/models.py", "w") as f:
    f.write(SOURCE)
if "/home/pyodide/webgrad_tests" not in sys.path:
    sys.path.insert(0, "/home/pyodide/webgrad_tests")
sys.modules.pop("models", None)
importlib.invalidate_caches()
import models
from webgrad.backends.webgpu import WebGPUBackend
from webgrad.backends.webgpu_browser import BrowserHost, request_device
if FEATURES is None:
    backend = "webgpu"
else:
    backend = WebGPUBackend(BrowserHost(await request_device(new=True, features=FEATURES)))
c = models.compile_transformer(backend, seed=0)
feed = models.reversal_batch(0)
walls = []
for _ in range(4):
    t0 = time.perf_counter()
    c.step(feed)
    walls.append(time.perf_counter() - t0)
t0 = time.perf_counter()
prof = await c.profile_async(feed)
profile_wall = time.perf_counter() - t0
plan_ops = [cmd["op"] for cmd in c._train.exe.plan["commands"]]
out = {"timing": prof.timing, "info": prof.info, "seconds": [r.seconds for r in prof.rows],
       "ops": plan_ops, "walls": walls[1:], "profile_wall": profile_wall,
       "text": prof.text(top=5), "kernel_count": c.kernel_count,
       "features": sorted(c.backend.host._gpu.features.to_py())}
c.destroy()
out
"""


def _profile(s, features):
    code = (f"SOURCE = {(REPO / 'tests' / 'models.py').read_text()!r}\n"
            f"FEATURES = {features!r}\n" + PROFILE)
    out = s.run(code, timeout=300)
    assert len(out["seconds"]) == len(out["ops"])  # a row per plan command, in order
    dispatch_times = [t for t, op in zip(out["seconds"], out["ops"]) if op == "dispatch"]
    assert len(dispatch_times) == out["kernel_count"]
    assert all(t is not None and t >= 0 for t in dispatch_times), dispatch_times
    assert all(t is None for t, op in zip(out["seconds"], out["ops"]) if op != "dispatch")
    return out, dispatch_times


def test_gpu_times_from_timestamps(browser_session):
    out, times = _profile(browser_session, None)
    if "timestamp-query" not in out["features"]:
        pytest.skip(f"this adapter ({out['info']}) has no 'timestamp-query'")
    assert out["timing"] == "timestamp"
    total = sum(times)
    # most kernels take measurable time (Chromium may quantise timestamps to 100 us)
    assert sum(t > 0 for t in times) >= len(times) // 2, times
    # inside the profiled call's own wall time, and a fair part of an ordinary step's
    assert 0 < total <= out["profile_wall"], (total, out["profile_wall"])
    assert total >= 0.2 * min(out["walls"]), (total, out["walls"])
    assert "(timestamp)" in out["text"] and "GFLOP/s" in out["text"]


def test_wall_times_without_timestamps(browser_session):
    """A device requested without 'timestamp-query': each kernel submitted and waited for
    alone, so every time is positive and the sum is at least the GPU work of one step."""
    out, times = _profile(browser_session, [])
    assert "timestamp-query" not in out["features"]
    assert out["timing"] == "wall"
    assert all(t > 0 for t in times), times
    assert sum(times) <= out["profile_wall"]
    assert "(wall)" in out["text"]
