"""The profiler (profile.py) on lavapipe: per-kernel bytes and FLOPs against counts made
independently (by hand from the shapes, and torch's FlopCounterMode for a training step),
GPU times present, and profiling a step trains exactly as step() does."""
from __future__ import annotations

import random

import numpy as np
import pytest

import models
import webgrad as wg
from webgrad import Module, nn, ops, optim

pytestmark = pytest.mark.webgpu

try:
    from webgrad.backends.webgpu_native import NativeHost
    NativeHost()
except Exception as e:  # no wgpu, no adapter
    pytest.skip(f"no native WebGPU adapter: {e}", allow_module_level=True)


def _forward(fn, inputs):
    class Empty(Module):
        pass
    return wg.compile_forward(Empty, lambda m, x: fn(x), inputs=inputs, backend="webgpu")


def _rows(c, feed):
    prof = c.profile(feed)
    assert prof.timing in ("timestamp", "wall")
    return prof, [r for r in prof.rows if r.workgroups]


def test_matmul_with_epilogue():
    B, K, N = 24, 40, 36

    class Lin(Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(K, N)

    c = wg.compile_forward(Lin, lambda m, x: ops.relu(m.l(x["x"])), inputs={"x": [B, K]},
                           backend="webgpu")
    prof, rows = _rows(c, {"x": np.ones((B, K), np.float32)})
    (r,) = rows
    assert r.ops == "matmul+add+relu"
    assert r.flops == 2 * B * K * N + B * N + B * N       # products and sums, bias, relu
    assert r.bytes == 4 * (B * K + K * N + N + B * N)     # x, W, b read once; y written
    assert r.seconds is not None and r.seconds > 0
    assert r.gbps == pytest.approx(r.bytes / r.seconds / 1e9)
    text = prof.text(top=5)
    assert "matmul+add+relu" in text and "GFLOP/s" in text


def test_row_op_and_a_sliced_read():
    R, C = 8, 16
    c = _forward(lambda x: ops.softmax_last(x["x"]), {"x": [R, C]})
    (r,) = _rows(c, {"x": np.zeros((R, C), np.float32)})[1]
    assert r.flops == 5 * R * C and r.bytes == 4 * 2 * R * C
    # a reduction of a slice reads only the sliced elements
    c = _forward(lambda x: ops.sum_all(ops.slice(x["x"], -1, 0, 4) * 2.0), {"x": [R, C]})
    rows = _rows(c, {"x": np.zeros((R, C), np.float32)})[1]
    assert sum(r.bytes for r in rows) == 4 * (R * 4 + 1)
    assert sum(r.flops for r in rows) == R * 4 + R * 4  # the product, then the sum


def test_training_step_matmul_flops_match_torch_flop_counter():
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode
    c = models.compile_mlp("webgpu")
    batch = models.sin_batch(random.Random(0))
    prof = c.profile(batch)
    g = c.ir
    ours = 0
    for r in prof.rows:
        for n in r.nodes:
            node = g[n]
            if node.op == "matmul":
                ours += 2 * node.size * g[node.inputs[0]].shape[-1]
    # the same model in torch, forward + backward, counted by torch
    lin = [torch.nn.Linear(a, b) for a, b in ((1, 64), (64, 64), (64, 1))]
    x = torch.tensor(batch["x"])
    with FlopCounterMode(display=False) as fc:
        h = torch.relu(lin[0](x))
        h = torch.relu(lin[1](h))
        (lin[2](h) - torch.tensor(batch["y"])).pow(2).sum().backward()
    assert ours == fc.get_total_flops()
    # every kernel of the step is a row, with a time
    assert len([r for r in prof.rows if r.workgroups]) == c.kernel_count
    assert all(r.seconds is not None for r in prof.rows if r.workgroups)


def test_profile_trains_like_step():
    a, b = models.compile_mlp("webgpu"), models.compile_mlp("webgpu")
    batch = models.sin_batch(random.Random(1))
    a.profile(batch)
    b.step(batch)
    pa, pb = a.download_params(), b.download_params()
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k])
    assert a.step(batch) == b.step(batch)


def test_profile_needs_webgpu():
    c = models.compile_mlp("reference")
    with pytest.raises(NotImplementedError, match="backend='webgpu'"):
        c.profile(models.sin_batch(random.Random(0)))


def test_a_host_without_timing_still_gives_the_static_columns(monkeypatch):
    """The browser's host has no profile() yet: the table keeps ops, bytes and FLOPs, times
    are None, and the step still runs (it trains, as step() does)."""
    a, b = models.compile_mlp("webgpu"), models.compile_mlp("webgpu")
    batch = models.sin_batch(random.Random(2))
    timed = a.profile(batch)
    monkeypatch.delattr(NativeHost, "profile")
    bare = b.profile(batch)
    assert bare.timing == "none" and all(r.seconds is None for r in bare.rows)
    assert [(r.name, r.ops, r.bytes, r.flops) for r in bare.rows] == \
        [(r.name, r.ops, r.bytes, r.flops) for r in timed.rows]
    assert "GPU time -" in bare.text()
    np.testing.assert_array_equal(a.download_params()["l1.W"], b.download_params()["l1.W"])


def test_a_step_of_more_dispatches_than_one_query_set_holds(monkeypatch):
    """A query set holds 4096 timestamps (GPT-2 medium's step has 2135 dispatches, two
    timestamps each): the host times the step over several sets. With sets of 3 dispatches,
    every kernel of the MLP's step still gets a time, and the rows are the one-set profile's."""
    from webgrad.backends import webgpu_native
    c = models.compile_mlp("webgpu")
    batch = models.sin_batch(random.Random(3))
    whole = c.profile(batch)
    if whole.timing != "timestamp":
        pytest.skip("this adapter has no timestamp-query")
    monkeypatch.setattr(webgpu_native, "_PROFILE_SET", 3)
    split = c.profile(batch)
    assert c.kernel_count > 3 * 2
    assert split.timing == "timestamp"
    assert [r.name for r in split.rows] == [r.name for r in whole.rows]
    assert all(r.seconds is not None and r.seconds >= 0 for r in split.rows if r.workgroups)
    assert sum(r.seconds > 0 for r in split.rows if r.workgroups) > c.kernel_count // 2
