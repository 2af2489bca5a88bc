"""Subgroup reductions (codegen/wgsl.py, workgroup_reduce; rowfuse.py's one-pass logsumexp)
in headless Chromium, whose SwiftShader adapter has the 'subgroups' feature (subgroups of 4):
the worker's device is requested with it, the cross entropy's logsumexp takes the subgroup form
there by default (KernelOptions.subgroup_default), and with the form forced on (KernelOptions.subgroups) every
workgroup row kernel (softmax, log-softmax, layer norm and its backward, logsumexp) and the
workgroup sums agree with torch, on rows that are not multiples of the workgroup or of the
subgroup (6, 33, 300, 700, 1000, 5003, 20011, 50257). Tint compiles these kernels here;
lavapipe (tests/test_subgroups.py) cannot, and keeps the shared-memory trees.
"""
from __future__ import annotations

import pytest

from test_gpu_host import REPO, needs_webgpu_backend, ship_module

browser = pytest.mark.browser

# records whose steps run workgroup row kernels and workgroup sums, forward and backward
SUBGROUP_RECORDS = (
    "softmax_last/wide_rows", "log_softmax_last/wide_rows", "layer_norm_last/odd_300",
    "nn.LayerNorm/width_768", "nn.LayerNorm", "nn.cross_entropy_last/odd_rows",
    "nn.cross_entropy_last/vocab_50257", "log_softmax_last/long_rows", "i32/sum_wide")


@pytest.fixture(scope="module")
def s(browser_session):
    ship_module(browser_session, "oracle", (REPO / "tests" / "oracle.py").read_text())
    return browser_session


@browser
@needs_webgpu_backend
def test_worker_device_has_subgroups_and_cross_entropy_uses_them(s):
    """The shared device is requested with 'subgroups' where the adapter has it, the
    backend's Limits say so, and by default the cross entropy of a 5000-word vocabulary (a
    row beyond the per-thread loops of CPU adapters) gets its one-pass logsumexp in subgroup
    form (KernelOptions.subgroup_default) while the other reductions keep the tree; the loss and the
    logits' gradient agree with torch."""
    import array
    import random
    import torch
    rng = random.Random(5)
    logits = [[rng.gauss(0.0, 3.0) for _ in range(5000)] for _ in range(4)]
    targets = [rng.randrange(5000) for _ in range(4)]
    blob = array.array("f", [v for row in logits for v in row]).tobytes().hex()
    out = s.run(f"""
import array
import webgrad as wg
from webgrad import nn, Module
from webgrad.backends.webgpu_browser import BrowserHost
import js
adapter = await js.navigator.gpu.requestAdapter()
info = adapter.info
host = BrowserHost()
values = array.array("f", bytes.fromhex("{blob}")).tolist()
def factory():
    m = Module(); m.x = m.param((4, 5000), init=wg.init.literal(values)); return m
def loss_fn(m, feeds):
    return nn.cross_entropy_last(m.x, feeds["t"])
c = wg.compile_module(factory, loss_fn, inputs={{"t": ((4,), "i32")}}, optimizer=None,
                      backend="webgpu")
feed = {{"t": wg.HostArray("i32", {targets!r}, shape=(4,))}}
loss = float(await c.step_async(feed))
grad = (await c.download_param_grads_async())["x"]
exe = c._train.exe
plan = exe.lowered.plan
cmds = [cmd for cmd in plan["commands"] if cmd["op"] == "dispatch"]
texts = {{n: plan["pipelines"][cmd["pipeline"]]["wgsl"] for n, cmd in zip(exe.kernel_names, cmds)}}
res = {{"adapter": adapter.features.has("subgroups"), "host": sorted(host.features),
       "limits": c.backend.limits.subgroups, "loss": loss, "grad": list(grad.tolist()),
       "sub": sorted(n for n, w in texts.items() if "enable subgroups;" in w),
       "sizes": [getattr(info, "subgroupMinSize", None), getattr(info, "subgroupMaxSize", None)]}}
c.destroy()
res
""", timeout=300)
    print(f"\nSwiftShader subgroup sizes (min, max): {out['sizes']}")
    if not out["adapter"]:
        pytest.skip("this Chromium's adapter has no 'subgroups' feature")
    assert "subgroups" in out["host"], out["host"]
    assert out["limits"] is True
    assert out["sub"] == ["logsumexp_last 4x5000"], out
    x = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    want = torch.nn.functional.cross_entropy(x, torch.tensor(targets))
    want.backward()
    assert abs(out["loss"] - want.item()) < 1e-5
    torch.testing.assert_close(torch.tensor(out["grad"], dtype=torch.float64).reshape(4, 5000),
                               x.grad, rtol=1e-4, atol=1e-6)


# the worker's forced forms (as _lowered_texts' in CPython): every reduction in subgroup form,
# the workgroup row kernels
FORCED = "KernelOptions(subgroups=True, row_per_thread=False)"


def _lowered_texts(record_name: str) -> list[tuple[str, str]]:
    """(kernel name, WGSL) of a record's gradient step as the worker lowers it below (CPU
    adapter with subgroups, the workgroup row kernels forced): the same code, in CPython."""
    import oracle
    from webgrad.codegen import KernelOptions, Limits, lower
    from webgrad.compile import build_train_graph, parse_inputs
    factory, loss_fn, inputs, _ = oracle.build_record(oracle.BY_NAME[record_name])
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    low, names = lower(g, Limits(cpu=True, subgroups=True, options=KernelOptions(subgroups=True, row_per_thread=False)))
    cmds = [c for c in low.plan["commands"] if c["op"] == "dispatch"]
    return [(n, low.plan["pipelines"][c["pipeline"]]["wgsl"]) for n, c in zip(names, cmds)]


@browser
@needs_webgpu_backend
def test_row_kernels_and_sums_with_subgroups_forced_in_browser(s):
    import oracle
    for name in SUBGROUP_RECORDS:  # every record runs at least one kernel in subgroup form
        texts = _lowered_texts(name)
        assert any("enable subgroups;" in w for _, w in texts), (name, [n for n, _ in texts])
    out = s.run(f"""
import oracle
from webgrad.codegen import KernelOptions
await oracle.run_records_collect({SUBGROUP_RECORDS!r}, "webgpu", {FORCED})
""", timeout=600)
    oracle.check_collected(out, SUBGROUP_RECORDS, "webgpu (browser, subgroup reductions)")


@browser
@needs_webgpu_backend
@pytest.mark.parametrize("op,D", [(op, D) for op in ("logsumexp_last", "softmax_last",
                                                      "log_softmax_last", "layer_norm_last")
                                   for D in (33, 1000, 5003)] + [("logsumexp_last", 3)])
def test_special_rows_with_subgroups_against_torch(s, op, D):
    """Each row kernel in subgroup form against torch in float64, on rows shorter and longer
    than the workgroup, with values far apart (exp would overflow without the max) and -inf
    entries; for logsumexp (the one-pass (m, s) pairs combined by subgroupMax and
    subgroupAdd) also rows with +inf (once, twice) and all -inf. No NaN: SwiftShader's
    arithmetic does not keep it (the tree form loses it there too; WGSL allows that), and
    test_row_kernels.py checks NaN rows on lavapipe."""
    import array
    import random
    import torch
    rng = random.Random(D)
    x = [[rng.gauss(0.0, 20.0) * (1 + 4 * (r == 4)) for _ in range(D)] for r in range(6)]
    inf = float("inf")
    x[1][5 % D] = x[3][2 % D] = x[3][D // 2] = x[5][0] = -inf
    if op == "logsumexp_last":
        x[1][5 % D] = inf
        x[2] = [-inf] * D
        x[4][0] = x[4][1 % D] = inf
    elif op == "layer_norm_last":  # finite rows
        x = [[v if abs(v) != inf else 7.0 for v in row] for row in x]
    blob = array.array("f", [v for row in x for v in row]).tobytes().hex()
    out_shape = (6,) if op == "logsumexp_last" else (6, D)
    attrs = {"eps": 1e-5} if op == "layer_norm_last" else {}
    got = s.run(f"""
import array
from webgrad.backends.webgpu_browser import BrowserHost
from webgrad.codegen import KernelOptions, Limits, lower
from webgrad.ir import Graph
host = BrowserHost()
g = Graph()
xi = g.add("input", [], (6, {D}), "f32", {{"name": "x", "shape": (6, {D}), "dtype": "f32"}})
g.outputs["out"] = g.add({op!r}, [xi], {out_shape!r}, "f32", {attrs!r})
low, names = lower(g, Limits(cpu=True, subgroups=True, options={FORCED}))
wgsl = low.plan["pipelines"][0]["wgsl"]
assert "enable subgroups;" in wgsl and "workgroupBarrier" in wgsl, names
prog = host.load(low.plan)
host.write(prog, low.feeds["x"], bytes.fromhex("{blob}"))
out = (await host.run(prog, {{}}, [low.outputs["out"][0]]))[0]
host.unload(prog)
array.array("f", bytes(out)).tolist()[:{6 if op == "logsumexp_last" else 6 * D}]
""", timeout=300)
    t = torch.tensor(x, dtype=torch.float64)
    want = {"logsumexp_last": lambda: torch.logsumexp(t, -1),
            "softmax_last": lambda: torch.softmax(t, -1),
            "log_softmax_last": lambda: torch.log_softmax(t, -1),
            "layer_norm_last": lambda: torch.nn.functional.layer_norm(t, (D,), eps=1e-5)}[op]()
    # float32 rounding of the row's log-sum (magnitude ~ max |x|) in the log outputs
    big = max(abs(v) for row in x for v in row if abs(v) != inf)
    atol = 1e-5 + (4e-7 * big if op in ("logsumexp_last", "log_softmax_last") else 0.0)
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64).reshape(want.shape), want,
                               rtol=1e-5, atol=atol)
