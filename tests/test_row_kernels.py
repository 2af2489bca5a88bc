"""Row kernels (softmax, log-softmax, layer norm and its backward, logsumexp) in both code
shapes: a workgroup per row with a shared-memory tree on GPUs, a plain loop per thread on
CPU adapters (codegen/reduce.py, codegen/rowfuse.py). The native adapter here is lavapipe,
a CPU, so its default is the loop: each oracle record with a row kernel runs under both
forms against torch (tests/oracle.py), and the lowering is checked for barriers."""
from __future__ import annotations

import re

import pytest

import oracle
from backends import native_adapter_is_cpu
from webgrad.codegen import Limits, lower
from webgrad.compile import build_train_graph, parse_inputs

ROW_KERNELS = ("softmax_last", "log_softmax_last", "layer_norm_last", "layer_norm_grad",
               "logsumexp_last")


def _lowered(record, limits):
    factory, loss_fn, inputs, _ = oracle.build_record(record)
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    low, names = lower(g, limits)
    cmds = [c for c in low.plan["commands"] if c["op"] == "dispatch"]
    return [(n, low.plan["pipelines"][c["pipeline"]]["wgsl"]) for n, c in zip(names, cmds)]


def _row_kernels(record, limits):
    return [(n, w) for n, w in _lowered(record, limits) if n.startswith(ROW_KERNELS)]


ROW_RECORDS = [r for r in oracle.RECORDS if _row_kernels(r, Limits())]


def test_the_records_cover_every_row_kernel():
    seen = {n.split(" ")[0] for r in ROW_RECORDS for n, _ in _row_kernels(r, Limits())}
    assert seen == set(ROW_KERNELS), seen


def _row_length(name: str, wgsl: str = "") -> int | None:
    """D of a kernel named "op RxD..."; the row ops of reduce.py carry no shape: the bound
    of their loop over the row (`j < Du`) in `wgsl`."""
    parts = name.split(" ")
    if len(parts) > 1 and "x" in parts[1]:
        return int(parts[1].split("x")[1])
    m = re.search(r"\bj < (\d+)u", wgsl)
    return int(m.group(1)) if m else None


@pytest.mark.parametrize("record", ROW_RECORDS, ids=[r.name for r in ROW_RECORDS])
def test_cpu_adapters_get_row_kernels_without_barriers(record):
    from webgrad.codegen.reduce import CPU_ROW_MAX
    for cpu in (True, False):
        for name, wgsl in _row_kernels(record, Limits(cpu=cpu)):
            D = _row_length(name, wgsl)
            looped = "workgroupBarrier" not in wgsl and "var<workgroup>" not in wgsl
            if cpu and (D is None or D <= CPU_ROW_MAX):
                assert looped, name
            elif cpu:  # long rows keep the tree (lavapipe's 65535-iteration cap)
                assert not looped, name
            elif looped:  # short rows take a thread each on GPUs too
                assert "for (var j = 0u;" in wgsl, name


def test_a_long_row_keeps_the_tree_on_cpu_adapters():
    """The record with a 50257-long row (the GPT-2 vocabulary) is in the set above."""
    from webgrad.codegen.reduce import CPU_ROW_MAX
    lengths = [_row_length(n) for r in ROW_RECORDS for n, _ in _row_kernels(r, Limits(cpu=True))]
    assert any(D and D > CPU_ROW_MAX for D in lengths), lengths


@pytest.mark.webgpu
@pytest.mark.parametrize("form", ["tree"] if native_adapter_is_cpu() else ["tree", "loop"])
@pytest.mark.parametrize("record", ROW_RECORDS, ids=[r.name for r in ROW_RECORDS])
def test_records_in_both_forms(record, form):
    """Each record with a row kernel in both forms; the loop is a CPU adapter's default, which
    test_webgpu.py's test_oracle runs there."""
    try:
        from webgrad.backends.webgpu import WebGPUBackend
        be = WebGPUBackend()
    except Exception as e:
        pytest.skip(f"no native WebGPU adapter: {e}")
    be.limits.cpu = form == "loop"
    oracle.check(record, be)


@pytest.mark.webgpu
@pytest.mark.parametrize("D", [3, 1000, 5003])
def test_one_pass_logsumexp_against_torch(D):
    """The GPU form of logsumexp_last (one pass: running max and rescaled sum per thread,
    (m, s) pairs combined in the tree) against torch.logsumexp in float64, on rows shorter
    and longer than the workgroup and rows with +inf (once, twice), all -inf, a NaN."""
    import numpy as np
    import torch
    try:
        from webgrad.backends.webgpu_native import NativeHost
        host = NativeHost()
    except Exception as e:
        pytest.skip(f"no native WebGPU adapter: {e}")
    from webgrad.compiled import run_blocking
    from webgrad.ir import Graph
    x = (np.random.default_rng(D).standard_normal((6, D)) * 20).astype(np.float32)
    x[1, 5 % D] = np.inf
    x[2, :] = -np.inf
    x[3, 1 % D] = np.nan
    x[4, :2] = np.inf
    x[5, 0] = -np.inf
    g = Graph()
    xi = g.add("input", [], (6, D), "f32", {"name": "x", "shape": (6, D), "dtype": "f32"})
    g.outputs["out"] = g.add("logsumexp_last", [xi], (6,), "f32", {})
    low, names = lower(g, Limits(cpu=False))
    assert names == [f"logsumexp_last 6x{D}"]
    prog = host.load(low.plan)
    host.write(prog, low.feeds["x"], x.tobytes())
    got = np.frombuffer(run_blocking(host.run(prog, {}, [low.outputs["out"][0]]))[0], np.float32, 6)
    host.unload(prog)
    want = torch.logsumexp(torch.from_numpy(x).double(), -1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
