"""Reductions on the WebGPU executor (native adapter: wgpu-py, lavapipe in CI): every split
strategy of codegen/reduce.py over long axes, column sums in both pass-1 kernels, short
trailing rows several per workgroup or one workgroup each, against numpy in float64 (bounds
stated per test). Skipped cleanly when no adapter exists.
"""
from __future__ import annotations

import numpy as np
import pytest

from webgpu_helpers import forward, require_native_adapter
from webgrad import Module, ops

pytestmark = pytest.mark.webgpu
require_native_adapter()  # skips this module where there is none

from webgrad.codegen import KernelOptions  # noqa: E402


def _shift(x):
    return x - x.max(-1, keepdims=True)


REDUCTIONS = [
    # (name, fn, shape, numpy): every split strategy of codegen/reduce.py
    ("sum_all long (2-pass)", lambda x: ops.sum_all(x), [100_003], lambda x: x.sum()),
    ("sum axis 0 long (2-pass)", lambda x: ops.sum(x, 0), [5000, 7], lambda x: x.sum(0)),
    ("sum middle axis", lambda x: ops.sum(x, 1), [3, 300, 5], lambda x: x.sum(1)),
    ("max_last long (2-pass)", lambda x: ops.max_last(x), [2, 70_001], lambda x: x.max(-1)),
    ("argmax_last long", lambda x: ops.cast(ops.argmax_last(x), "f32"), [3, 5000],
     lambda x: x.argmax(-1)),
    ("softmax_last long", lambda x: ops.softmax_last(x), [3, 3000],
     lambda x: np.exp(_shift(x)) / np.exp(_shift(x)).sum(-1, keepdims=True)),
    ("log_softmax short rows", lambda x: ops.log_softmax_last(x), [300, 7],
     lambda x: _shift(x) - np.log(np.exp(_shift(x)).sum(-1, keepdims=True))),
    ("layer_norm long", lambda x: ops.layer_norm_last(x), [2, 1000],
     lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)),
]


@pytest.mark.parametrize("case", REDUCTIONS, ids=[c[0] for c in REDUCTIONS])
def test_long_reductions(case):
    """Bound: |err| <= 1e-6 * sum|x| (tree/chunked f32 summation) + 1e-5 (1 + |want|)."""
    _check_reduction(case)


def _check_reduction(case, options=None):
    name, fn, shape, ref = case
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    got = forward(fn, {"x": shape}, options=options).run({"x": x})
    want = ref(x.astype(np.float64))
    scale = np.abs(ref(np.abs(x.astype(np.float64)))).sum() * 1e-6
    assert np.all(np.abs(got - want) <= scale + 1e-5 * (1 + np.abs(want))), \
        f"{name}: max err {np.max(np.abs(got - want))}"


# column sums long enough for codegen/reduce.py's col_split: column counts that are not a
# multiple of its 32-column blocks (7: blocks of 8 columns x 32 rows), row counts that end
# a chunk early, an elementwise producer computed in pass 1, two reduced axes, an epilogue
COL_SUMS = [
    ("sum axis 0, 7 columns", lambda x: ops.sum(x, 0), [5000, 7], lambda x: x.sum(0)),
    ("sum of squares axis 0", lambda x: ops.sum(x * x, 0), [4099, 97], lambda x: (x * x).sum(0)),
    ("sum axes 0, 1", lambda x: ops.sum(x, [0, 1]), [3, 1500, 33], lambda x: x.sum((0, 1))),
    ("sum axis 0 of 3-d", lambda x: ops.sum(x, 0), [2049, 40, 3], lambda x: x.sum(0)),
    ("sum axis 0, epilogue", lambda x: ops.exp(ops.sum(x, 0) * 0.01), [2048, 64],
     lambda x: np.exp(x.sum(0) * 0.01)),
]


@pytest.mark.parametrize("tiled", [True, False], ids=["tiled", "per_thread"])
@pytest.mark.parametrize("case", COL_SUMS, ids=[c[0] for c in COL_SUMS])
def test_column_sums(case, tiled):
    """col_split's two pass-1 kernels (the tiled one GPUs run, the per-thread loop CPU
    adapters run) against numpy in float64; same bound as test_long_reductions."""
    _check_reduction(case, KernelOptions(column_tiled=tiled))


# short trailing rows, several per workgroup (codegen/reduce.py, _wg_rows): row counts
# that are not a multiple of a workgroup's rows, rows that are not a multiple of its lanes,
# a producer computed on the way in (attention's rowsum(dO * O)), two reduced axes, max
# (NaN propagates), an epilogue
ROW_REDUCTIONS = [
    ("sum last, 64", lambda x: ops.sum(x, -1), [3, 7, 64], lambda x: x.sum(-1)),
    ("sum of products last, 64", lambda x: ops.sum(x * ops.exp(x * 0.5), -1), [5, 13, 64],
     lambda x: (x * np.exp(x * 0.5)).sum(-1)),
    ("sum last 2 axes, 7 x 19", lambda x: ops.sum(x, [1, 2]), [33, 7, 19],
     lambda x: x.sum((1, 2))),
    ("max last, 100", lambda x: ops.max(x, -1), [37, 100], lambda x: x.max(-1)),
    ("max last, 512, epilogue", lambda x: ops.exp(ops.max(x, -1) * 0.1), [9, 512],
     lambda x: np.exp(x.max(-1) * 0.1)),
]


@pytest.mark.parametrize("tiled", [True, False], ids=["rows_per_wg", "wg_per_row"])
@pytest.mark.parametrize("case", ROW_REDUCTIONS, ids=[c[0] for c in ROW_REDUCTIONS])
def test_short_row_reductions(case, tiled):
    """_wg_rows (GPUs) and the workgroup per row (CPU adapters), forced either way on this
    adapter, against numpy in float64; the lowered kernel is the one forced."""
    from webgrad.codegen import Limits, lower
    from webgrad.compile import build_forward_graph
    opts = KernelOptions(rows_tiled=tiled)
    name, fn, shape, _ = case
    g = build_forward_graph(Module, lambda _, i: fn(i["x"]), {"x": (tuple(shape), "f32")})[1]
    wgsl = [p["wgsl"] for p in lower(g, Limits(cpu=True, options=opts))[0].plan["pipelines"]]
    assert any("let lane = " in w for w in wgsl) == tiled, name
    _check_reduction(case, opts)


def test_short_row_reduction_propagates_nan():
    x = np.random.default_rng(2).standard_normal((11, 96)).astype(np.float32)
    x[3, 50] = np.nan
    got = forward(lambda x: ops.max(x, -1), {"x": [11, 96]},
                  options=KernelOptions(rows_tiled=True)).run({"x": x})
    assert np.isnan(got[3]) and not np.isnan(np.delete(got, 3)).any()
    np.testing.assert_array_equal(np.delete(got, 3), np.delete(x.max(-1), 3))


def _argmax_rows(n: int) -> np.ndarray:
    """Rows for the split argmax: random; equal maxima in several chunks (and twice in one);
    NaNs after a first NaN (numpy and torch pick the first); all -inf (index 0); the
    maximum in the short last chunk."""
    x = np.random.default_rng(3).standard_normal((6, n)).astype(np.float32)
    x[1, [60_000, 3000, 3001, 40_000]] = 9.0
    x[2, [50_000, 20_000, 20_001]] = np.nan
    x[2, 100] = 9.0
    x[3] = -np.inf
    x[4, n - 1] = 9.0
    x[5, [2047, 2048, 1024, 1023]] = 9.0  # at chunk edges
    return x


@pytest.mark.parametrize("split, chunk", [(True, 1024), (True, 64), (False, 1024)],
                         ids=["split", "split_1024_chunks", "one_wg"])
def test_long_argmax_split(split, chunk):
    """argmax_last over rows of 70001 (not a multiple of the chunk) in both forms, forced on
    this adapter, against numpy's argmax: ties to the lowest index, the first NaN; the
    lowered kernels are the ones forced. Chunks of 64 are 1024 of 69 elements: pass 2's
    threads then take 4 partials each."""
    from webgrad.codegen import Limits, lower
    from webgrad.compile import build_forward_graph
    n = 70_001
    opts = KernelOptions(argmax_split=split, argmax_chunk=chunk)
    fn = lambda x: ops.cast(ops.argmax_last(x), "f32") + 1.0  # noqa: E731 (an epilogue)
    g = build_forward_graph(Module, lambda _, i: fn(i["x"]), {"x": ((6, n), "f32")})[1]
    names = lower(g, Limits(cpu=True, options=opts))[1]
    assert any("(pass 1)" in k for k in names) == split, names
    x = _argmax_rows(n)
    got = forward(fn, {"x": [6, n]}, options=opts).run({"x": x})
    np.testing.assert_array_equal(got, np.argmax(x, -1).astype(np.float32) + 1.0)
