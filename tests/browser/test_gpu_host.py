"""BrowserHost (navigator.gpu in the Pyodide worker) and webgrad's WebGPU backend in the browser.

Hand-written plans exercise the GPUHost protocol of gpu_host.py (results, one submission per
run, WGSL errors, persistent buffers, device loss); then the whole compile path runs inside the
worker on backend="webgpu": the op oracle table (judged against torch in CPython) and
examples/mlp_sin.py (the same file also runs in CPython on native WebGPU). WebGPU here is
SwiftShader in headless Chromium. Every browser test shares the session's one browser and one
Pyodide boot (``browser_session``).
"""
from __future__ import annotations

import array
import math
import random
import runpy
import struct
from pathlib import Path

import pytest

from webgrad.browser import BrowserPythonError

browser = pytest.mark.browser

# out[i] = a[i] * 2 + 1 over n elements; n need not be a multiple of the workgroup size.
AFFINE_WGSL = """
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&out)) {
        out[i] = a[i] * 2.0 + 1.0;
    }
}
"""

# One invocation adds 1 to x[0]: 300 of them in a row count the dispatches that ran, in order.
INCREMENT_WGSL = """
@group(0) @binding(0) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(1)
fn main() {
    x[0] = x[0] + 1.0;
}
"""

BAD_WGSL = """
@group(0) @binding(0) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(1)
fn main() {
    x[0] = undefined_thing + 1.0;
}
"""

# Runs in the worker before the tests below: a BrowserHost and a helper turning lists of
# floats into f32 bytes without numpy (Pyodide has none).
SETUP = """
import array, time
from webgrad.backends.webgpu_browser import BrowserHost, WGSLError, request_device
from webgrad.backends.gpu_host import DeviceLostError
from webgrad.compiled import run_blocking

def f32(values):
    return array.array("f", values).tobytes()

host = BrowserHost()
"""


def affine_plan(n: int) -> dict:
    groups = (n + 63) // 64
    return {
        "buffers": [{"size": 4 * n, "label": "a"}, {"size": 4 * n, "label": "out"},
                    {"size": 4 * n, "label": "copy_of_out"}],
        "pipelines": [{"wgsl": AFFINE_WGSL}],
        "commands": [
            {"op": "dispatch", "pipeline": 0, "bindings": [0, 1], "workgroups": [groups, 1, 1]},
            {"op": "copy", "src": 1, "dst": 2, "size": 4 * n, "src_offset": 0, "dst_offset": 0},
        ],
    }


def increments_plan(count: int) -> dict:
    return {
        "buffers": [{"size": 4, "label": "counter"}],
        "pipelines": [{"wgsl": INCREMENT_WGSL}],
        "commands": [{"op": "dispatch", "pipeline": 0, "bindings": [0], "workgroups": [1, 1, 1]}
                     for _ in range(count)],
    }


def f32_values(data: bytes) -> list[float]:
    return array.array("f", data).tolist()


def round_f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


@pytest.fixture(scope="module")
def s(browser_session):
    browser_session.run(SETUP)
    return browser_session


@browser
def test_device_has_the_adapters_maximum_limits(s):
    out = s.run("""
adapter = await navigator.gpu.requestAdapter()
[host.limits, adapter.limits.maxStorageBufferBindingSize,
 adapter.limits.maxComputeInvocationsPerWorkgroup, host.info]
""".replace("navigator", "__import__('js').navigator"))
    limits, max_binding, max_invocations, info = out
    for key in ("max_storage_buffer_binding_size", "max_compute_workgroups_per_dimension",
                "max_compute_workgroup_size_x", "max_compute_invocations_per_workgroup"):
        assert isinstance(limits[key], int) and limits[key] > 0, key
    assert limits["max_storage_buffer_binding_size"] == max_binding
    assert limits["max_compute_invocations_per_workgroup"] == max_invocations
    assert info and isinstance(info, str)


@browser
def test_host_reports_the_browsers_wgsl_language_features(s):
    """BrowserHost.wgsl_features is navigator.gpu.wgslLanguageFeatures (codegen's int8 dot
    products need packed_4x8_integer_dot_product: Limits.packed_dot), as the browser lists it."""
    mine, browsers, packed = s.run("""
import js
from webgrad.backends.webgpu import WebGPUBackend
[sorted(host.wgsl_features), sorted(str(f) for f in js.navigator.gpu.wgslLanguageFeatures),
 WebGPUBackend(host).limits.packed_dot]
""")
    assert mine == browsers and browsers, (mine, browsers)
    assert packed == ("packed_4x8_integer_dot_product" in browsers)


@browser
def test_elementwise_plan_runs_twice(s):
    n = 1000  # not a multiple of 64: the kernel's bounds check matters
    rng = random.Random(0)
    inputs = [[round_f32(rng.uniform(-100, 100)) for _ in range(n)] for _ in range(2)]
    s.run(f"plan = {affine_plan(n)!r}\nprogram = host.load(plan)")
    results = []
    # First run awaited (top-level await in runPythonAsync), second through the blocking API
    # compiled modules use (pyodide.ffi.run_sync under JSPI).
    results.append(s.run(f"await host.run(program, {{0: f32({inputs[0]!r})}}, [1, 2])"))
    results.append(s.run(f"run_blocking(host.run(program, {{0: f32({inputs[1]!r})}}, [2, 1]))"))
    for values, (first, second) in zip(inputs, results):
        expected = [round_f32(v * 2 + 1) for v in values]
        assert f32_values(first) == expected
        assert f32_values(second) == expected
    # read() and write() between runs: write lands before the read-back.
    again = s.run("host.write(program, 0, f32([3.0] * 4), offset=8)\n"
                  "[await host.read(program, 0), run_blocking(host.read(program, 1))]")
    assert f32_values(again[0])[:6] == inputs[1][:2] + [3.0] * 4
    assert f32_values(again[1]) == [round_f32(v * 2 + 1) for v in inputs[1]]
    s.run("host.unload(program)")


@browser
def test_persistent_buffers_are_shared_by_plans_of_one_host(s):
    n = 8
    producer = affine_plan(n)  # writes out[i] = 2 a[i] + 1 into the persistent buffer "y"
    producer["buffers"][1]["persistent"] = "y"
    consumer = {"buffers": [{"size": 4 * n, "label": "y", "persistent": "y"},
                            {"size": 4 * n, "label": "z"}],
                "pipelines": [],
                "commands": [{"op": "copy", "src": 0, "dst": 1, "size": 4 * n,
                              "src_offset": 0, "dst_offset": 0}]}
    out = s.run(f"""
p1, p2 = host.load({producer!r}), host.load({consumer!r})
await host.run(p1, {{0: f32(range({n}))}}, [])
seen = (await host.run(p2, {{}}, [1]))[0]          # the consumer copies what p1 wrote
host.write(p2, 0, f32([7.0] * {n}))                  # written through p2, read through p1
through_p1 = await host.read(p1, 1)
other = BrowserHost()                                # another host: its own "y"
p3 = other.load({consumer!r})
other_y = await other.read(p3, 0)
host.unload(p1)                                      # p2 still holds "y": it survives
kept = await host.read(p2, 0)
host.unload(p2)
p4 = host.load({consumer!r})                         # the last holder went: a fresh, zeroed "y"
fresh = await host.read(p4, 0)
bad = {{**{consumer!r}, "buffers": [{{"size": 8, "label": "y", "persistent": "y"}}]}}
try:
    host.load(bad)
    mismatch = "no error"
except Exception as e:
    mismatch = type(e).__name__ + ": " + str(e)
host.unload(p4); other.unload(p3)
[seen, through_p1, other_y, kept, fresh, mismatch]
""")
    seen, through_p1, other_y, kept, fresh, mismatch = out
    assert f32_values(seen) == [2.0 * i + 1 for i in range(n)]
    assert f32_values(through_p1) == [7.0] * n
    assert f32_values(other_y) == [0.0] * n
    assert f32_values(kept) == [7.0] * n
    assert f32_values(fresh) == [0.0] * n
    assert mismatch.startswith("GPUError") and "persistent buffer" in mismatch, mismatch
    assert "32 bytes" in mismatch and "8 in this plan" in mismatch, mismatch


@browser
def test_300_dispatches_one_submission(s):
    runs = 20
    out = s.run(f"""
plan = {increments_plan(300)!r}
program = host.load(plan)
# Count queue.submit calls: the whole step must be one submission.
from pyodide.code import run_js
counter = run_js('''(queue) => {{
  const original = queue.submit.bind(queue);
  const counter = {{calls: 0}};
  queue.submit = (buffers) => {{ counter.calls++; return original(buffers); }};
  counter.restore = () => {{ delete queue.submit; }};
  return counter;
}}''')(host.device.queue)
await host.run(program, {{0: f32([0.0])}}, [0])   # warm-up: pipeline compiled, staging made
stats0 = host._gpu.stats.to_py()
t0 = time.perf_counter()
for _ in range({runs}):
    value = (await host.run(program, {{}}, [0]))[0]
with_read = (time.perf_counter() - t0) / {runs}
t0 = time.perf_counter()
for _ in range({runs}):
    await host.run(program, {{}}, [])
without_read = (time.perf_counter() - t0) / {runs}
final = await host.read(program, 0)
stats = host._gpu.stats.to_py()
encode_ms = (stats["encodeMs"] - stats0["encodeMs"]) / (stats["runs"] - stats0["runs"])
calls = counter.calls
counter.restore()
host.unload(program)
{{"value": value, "final": final, "calls": calls, "with_read_ms": with_read * 1e3,
  "without_read_ms": without_read * 1e3, "encode_ms": encode_ms,
  "dispatches": stats["dispatches"] - stats0["dispatches"]}}
""")
    assert f32_values(out["value"]) == [300.0 * (1 + runs)]
    assert f32_values(out["final"]) == [300.0 * (1 + 2 * runs)]
    # 1 warm-up + 2 * runs runs + 1 read, each exactly one submit.
    assert out["calls"] == 2 + 2 * runs
    assert out["dispatches"] == 300 * 2 * runs
    print(f"\n300 dispatches per run: {out['with_read_ms']:.2f} ms/run with a 4-byte read-back, "
          f"{out['without_read_ms']:.2f} ms/run without; JS encoding {out['encode_ms']:.3f} ms/run")


@browser
def test_bad_wgsl_raises_with_compile_message(s):
    plan = increments_plan(1)
    plan["pipelines"] = [{"wgsl": BAD_WGSL, "label": "bad_kernel"}]
    with pytest.raises(BrowserPythonError) as info:
        s.run(f"host.load({plan!r})")
    error = info.value
    assert error.type == "WGSLError"
    assert "bad_kernel" in error.message and "undefined_thing" in error.message
    assert "6:" in error.message  # the line of the error, quoted with its source
    # Without JSPI (pretended: can_run_sync() says False), load() cannot wait for the compiler;
    # it returns, and the first run raises the same error.
    out = s.run(f"""
import pyodide.ffi
real_can_run_sync = pyodide.ffi.can_run_sync
pyodide.ffi.can_run_sync = lambda: False
try:
    program = host.load({plan!r})
finally:
    pyodide.ffi.can_run_sync = real_can_run_sync
try:
    await host.run(program, {{}}, [0])
    out = "no error"
except WGSLError as e:
    out = "WGSLError: " + str(e)
finally:
    host.unload(program)
out
""")
    assert out.startswith("WGSLError") and "undefined_thing" in out
    # The host still works after the failed load.
    assert f32_values(s.run(f"p = host.load({increments_plan(2)!r}); "
                            "r = await host.run(p, {0: f32([1.0])}, [0]); host.unload(p); r[0]")
                      ) == [3.0]


def _scaled_wgsl(factor: float, workgroup: int = 64) -> str:
    """out[i] = a[i] * factor, with a text no other test made (pipelines are cached by it)."""
    return AFFINE_WGSL.replace("a[i] * 2.0 + 1.0", f"a[i] * {factor!r}").replace(
        "@workgroup_size(64)", f"@workgroup_size({workgroup})") + f"// {random.random()}\n"


@browser
def test_pipelines_of_a_plan_compile_together_and_a_failure_names_its_kernel(s):
    """replay.mjs creates a plan's pipelines with createComputePipelineAsync, all of them
    before waiting for any (the blocking createComputePipeline is never called). A kernel
    that parses but fails pipeline creation (a workgroup over the device's invocation
    limit), among good ones, raises WGSLError naming it; the good ones then load and
    compute (against a[i] * factor in Python)."""
    n = 8
    factors = [3.0, 0.5, -2.0]
    good = [_scaled_wgsl(f) for f in factors]
    too_big = _scaled_wgsl(1.0, workgroup=100000)

    def plan(wgsls, labels):
        return {"buffers": [{"size": 4 * n, "label": "a"}]
                           + [{"size": 4 * n, "label": f"out{k}"} for k in range(len(wgsls))],
                "pipelines": [{"wgsl": w, "label": lab} for w, lab in zip(wgsls, labels)],
                "commands": [{"op": "dispatch", "pipeline": k, "bindings": [0, k + 1],
                              "workgroups": [1, 1, 1]} for k in range(len(wgsls))]}
    out = s.run(f"""
from pyodide.code import run_js
h = BrowserHost()  # the shared device (a new one if an earlier test lost it)
counts = run_js('''(device) => {{
  const counts = {{ blocking: 0, promised: 0 }};
  const sync = device.createComputePipeline.bind(device);
  const made = device.createComputePipelineAsync.bind(device);
  device.createComputePipeline = (d) => {{ counts.blocking++; return sync(d); }};
  device.createComputePipelineAsync = (d) => {{ counts.promised++; return made(d); }};
  counts.restore = () => {{ device.createComputePipeline = sync;
                           device.createComputePipelineAsync = made; }};
  return counts;
}}''')(h.device)
try:
    try:
        h.load({plan(good[:1] + [too_big] + good[1:], ["first", "too_big", "second", "third"])!r})
        error = "no error"
    except WGSLError as e:
        error = str(e)
    p = h.load({plan(good, ["first", "second", "third"])!r})
    values = await h.run(p, {{0: f32([float(i) - 3.5 for i in range({n})])}}, [1, 2, 3])
    h.unload(p)
finally:
    counts.restore()
[error, values, counts.blocking, counts.promised]
""")
    error, values, sync_calls, async_calls = out
    assert "too_big" in error and "first" not in error, error
    assert sync_calls == 0 and async_calls == 4  # the good ones are cached after the failure
    xs = [float(i) - 3.5 for i in range(n)]
    for got, f in zip(values, factors):
        assert f32_values(got) == [round_f32(x * f) for x in xs]


@browser
def test_device_loss_raises_device_lost_error(s):
    out = s.run(f"""
lost_host = BrowserHost(await request_device(new=True))   # its own device: the shared one lives
program = lost_host.load({affine_plan(8)!r})
ok = await lost_host.run(program, {{0: f32([1.0] * 8)}}, [1])
lost_host.device.destroy()
errors = []
try:
    await lost_host.run(program, {{0: f32([1.0] * 8)}}, [1])
except DeviceLostError as e:
    errors.append(str(e))
for attempt in (lambda: lost_host.write(program, 0, f32([0.0])),
                lambda: lost_host.load({affine_plan(8)!r}),
                lambda: run_blocking(lost_host.read(program, 1))):
    try:
        attempt()
    except DeviceLostError as e:
        errors.append(str(e))
# the shared device is unaffected
fine = await host.run(p2 := host.load({affine_plan(8)!r}), {{0: f32([2.0] * 8)}}, [1])
host.unload(p2)
[ok[0], errors, fine[0]]
""")
    ok, errors, fine = out
    assert f32_values(ok) == [3.0] * 8
    assert len(errors) == 4, errors
    assert all("device was lost" in e and "destroyed" in e for e in errors), errors
    assert f32_values(fine) == [5.0] * 8


@browser
def test_without_jspi_the_device_is_requested_first(s):
    out = s.run("""
import pyodide.ffi
import webgrad.backends.webgpu_browser as wb
saved, real_can_run_sync = wb._shared, pyodide.ffi.can_run_sync
wb._shared = None                                   # as if no device had been requested yet
pyodide.ffi.can_run_sync = lambda: False            # as if this stack could not block (no JSPI)
try:
    try:
        BrowserHost()
        refused = "no error"
    except RuntimeError as e:
        refused = str(e)
    h = BrowserHost(await request_device(new=True))  # the async way needs no blocking
    p = h.load(plan := {"buffers": [{"size": 4, "label": "x"}], "pipelines": [], "commands": []})
    h.write(p, 0, f32([4.5]))
    value = await h.read(p, 0)
    h.close()
finally:
    wb._shared, pyodide.ffi.can_run_sync = saved, real_can_run_sync
[refused, value]
""")
    refused, value = out
    assert "request_device()" in refused and "JSPI" in refused, refused
    assert f32_values(value) == [4.5]


# ---------------------------------------------------------------- webgrad on WebGPU in the worker
#
# The whole compile path (trace, autograd, WebGPU plan) runs inside Pyodide and the plan runs
# on navigator.gpu through BrowserHost; the answers come back to CPython and are judged there,
# against torch (the op oracle) or against math.sin (the MLP).

REPO = Path(__file__).resolve().parents[2]
needs_webgpu_backend = pytest.mark.skipif(
    not (REPO / "pkg" / "webgrad" / "backends" / "webgpu.py").exists(),
    reason="webgrad.backends.webgpu (the Graph -> Plan compiler) is not written yet")
ORACLE_CHUNK = 12  # records per s.run call: few round trips, and each chunk well inside a test's time


def ship_module(s, name: str, source: str) -> None:
    """Make `import name` in the worker load `source` (a fresh copy, even if imported before)."""
    s.run(f"""
import importlib, os, sys
os.makedirs("/home/pyodide/webgrad_tests", exist_ok=True)
with open("/home/pyodide/webgrad_tests/{name}.py", "w") as f:
    f.write({source!r})
if "/home/pyodide/webgrad_tests" not in sys.path:
    sys.path.insert(0, "/home/pyodide/webgrad_tests")
sys.modules.pop({name!r}, None)
importlib.invalidate_caches()
""")


@pytest.fixture(scope="module")
def oracle_results(s):
    """Every oracle record run through webgrad on WebGPU in the worker, a chunk at a time on
    first use: name -> result (each chunk's cost lands on its first test, not on one
    fixture that runs them all)."""
    import oracle
    ship_module(s, "oracle", (REPO / "tests" / "oracle.py").read_text())
    names = [r.name for r in oracle.RECORDS]
    results: dict = {}

    def result_of(name: str) -> dict:
        if name not in results:
            k = names.index(name) // ORACLE_CHUNK * ORACLE_CHUNK
            chunk = names[k:k + ORACLE_CHUNK]
            # The *_async API (awaited), where the MLP test below uses the blocking one (JSPI).
            results.update(s.run(f"""
import oracle
await oracle.run_records_collect({chunk!r}, "webgpu")
""", timeout=600))
        return results
    return result_of


def _oracle_names():
    try:
        import oracle
    except Exception:  # collected without tests/ on the path: the fixture would say why
        return []
    return [r.name for r in oracle.RECORDS]


@browser
@needs_webgpu_backend
@pytest.mark.parametrize("name", _oracle_names())
def test_oracle_record_in_browser(oracle_results, name):
    import oracle
    oracle.check_collected(oracle_results(name), [name], "webgpu (browser, SwiftShader)")


TILED_IN_BROWSER = ["attention/qkv_slices_T70_D32", "attention/tiled_odd_T37_D33_Dv7",
                    "attention/cache_position"]


# The kinds of GPU tiling in codegen/matmul_config.py's ADAPTER_TILINGS (thread grids other than
# 16 x 16, vec4 global loads with bounds tests, tile rows in runs, split-K), forced on the
# matmul records in the worker: SwiftShader would otherwise run the barrier-free kernel, and
# Tint (not naga) compiles these kernels here. Small blocks per thread: SwiftShader runs a
# workgroup's threads as fibers, and 8 x 16 blocks take minutes there. (A 4 x 8 block on 4 x 8
# threads, K step 16, ran past 90 s on matmul/tiles_odd in SwiftShader while lavapipe runs it
# in seconds: not understood yet; CPU adapters use the barrier-free kernel.)
H200_TILINGS = {
    "group": "mm.Config(4, 4, 8, wx=4, wy=4, group=3, vload=True, epi_rows=1)",
}
H200_RECORDS = ("matmul/tiles_odd", "matmul/batched_odd", "matmul/aligned_epilogue",
                "matmul/wgrad_odd")


@browser
@needs_webgpu_backend
@pytest.mark.slow   # 76 s on a slower machine with a cold cache (the suite's limit is 60 s)
def test_tiled_attention_in_browser(s):
    """The GPU attention kernels (codegen/attention_tiled.py: workgroup memory, barriers,
    workgroupUniformLoad of a runtime cache position) forced on in the worker, whose
    SwiftShader adapter would get the row kernels: Chromium's WGSL compiler (Tint) takes
    them, and the forward and gradients agree with torch."""
    import oracle
    ship_module(s, "oracle", (REPO / "tests" / "oracle.py").read_text())
    out = s.run(f"""
import oracle
from webgrad.codegen import KernelOptions, Limits, lower
from webgrad.compile import build_train_graph, parse_inputs
opts = KernelOptions(attn_tiled=True)
factory, loss_fn, inputs, _ = oracle.build_record(oracle.BY_NAME[{TILED_IN_BROWSER[0]!r}])
g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
kernels = [n for n in lower(g, Limits(cpu=True, options=opts))[1] if n.startswith("attn_")]
results = await oracle.run_records_collect({TILED_IN_BROWSER!r}, "webgpu", opts)
{{"kernels": kernels, "results": results}}
""", timeout=600)
    assert out["kernels"] and all(" tiled " in n for n in out["kernels"]), out["kernels"]
    oracle.check_collected(out["results"], TILED_IN_BROWSER, "webgpu (browser, tiled attention)")


# records whose steps have column sums (bias and LayerNorm gradients) and cross-entropy's
# logsumexp: run with the GPU forms of those kernels forced on in the worker (SwiftShader
# would take the per-thread loops): reduce.py's tiled col_split (even for short columns)
# and the workgroup-per-row kernels, logsumexp_last in one pass
GPU_ROW_RECORDS = ("nn.Linear", "nn.LayerNorm", "sum/axes", "matmul/batch_bcast",
                   "nn.cross_entropy_last", "nn.cross_entropy_last/NCd4")


@browser
@needs_webgpu_backend
def test_gpu_column_sums_and_logsumexp_in_browser(s):
    import oracle
    ship_module(s, "oracle", (REPO / "tests" / "oracle.py").read_text())
    out = s.run(f"""
import oracle
from webgrad.codegen import KernelOptions, Limits, lower
from webgrad.compile import build_train_graph, parse_inputs
opts = KernelOptions(column_tiled=True, col_split_min_r=1, row_per_thread=False)
kernels = []
for name in ("nn.Linear", "nn.cross_entropy_last"):
    factory, loss_fn, inputs, _ = oracle.build_record(oracle.BY_NAME[name])
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    kernels += lower(g, Limits(cpu=True, options=opts))[1]
results = await oracle.run_records_collect({GPU_ROW_RECORDS!r}, "webgpu", opts)
{{"kernels": kernels, "results": results}}
""", timeout=600)
    assert "sum (pass 1)" in out["kernels"], out["kernels"]
    assert any(k.startswith("logsumexp_last") and not k.endswith(" thread")
               for k in out["kernels"]), out["kernels"]
    oracle.check_collected(out["results"], GPU_ROW_RECORDS, "webgpu (browser, GPU row kernels)")


@browser
@needs_webgpu_backend
def test_matmul_records_under_gpu_tilings_in_browser(s):
    import oracle
    ship_module(s, "oracle", (REPO / "tests" / "oracle.py").read_text())
    got = s.run(f"""
import oracle
from webgrad.codegen import KernelOptions, matmul_config as mm
results = {{}}
for tag, cfg in {H200_TILINGS!r}.items():
    opts = KernelOptions(force_config=eval(cfg))
    results[tag] = await oracle.run_records_collect({H200_RECORDS!r}, "webgpu", opts)
results
""", timeout=600)
    assert sorted(got) == sorted(H200_TILINGS), sorted(got)
    for tag in H200_TILINGS:
        oracle.check_collected(got[tag], H200_RECORDS, f"webgpu (browser, SwiftShader), tiling {tag}")


def torch_mlp_mse(params: dict) -> float:
    """Mean squared error against sin of the trained MLP on a grid it never saw, in torch."""
    import torch
    p = {k: torch.tensor(v, dtype=torch.float64) for k, v in params.items()}
    x = torch.linspace(-math.pi + 0.05, math.pi - 0.05, 301, dtype=torch.float64)[:, None]
    h = torch.relu(x @ p["l1.W"].reshape(1, 64) + p["l1.b"])
    h = torch.relu(h @ p["l2.W"].reshape(64, 64) + p["l2.b"])
    y = h @ p["l3.W"].reshape(64, 1) + p["l3.b"]
    return float(((y - torch.sin(x)) ** 2).mean())


def load_example():
    return runpy.run_path(str(REPO / "examples" / "mlp_sin.py"), run_name="mlp_sin")


@browser
@needs_webgpu_backend
def test_mlp_sin_trains_in_browser(s):
    ship_module(s, "mlp_sin", (REPO / "examples" / "mlp_sin.py").read_text())
    out = s.run("import mlp_sin\nmlp_sin.train('webgpu', log=None)", timeout=600)
    assert out["reached"], f"loss {out['loss']:.2e} after {out['steps']} steps"
    assert out["first_loss"] > 0.1  # it started far away: getting below 1e-3 was learning
    # Same script, same seed on the reference executor (numpy, CPython): the first step agrees.
    reference = load_example()["train"]("reference", max_steps=1, log=None)
    assert math.isclose(out["first_loss"], reference["first_loss"], rel_tol=1e-4)
    assert torch_mlp_mse(out["params"]) < 5e-3
    print(f"\nMLP-sin in the browser (WebGPU on SwiftShader): loss {out['loss']:.2e} after "
          f"{out['steps']} steps, {out['ms_per_step']:.2f} ms/step, {out['dispatches']} "
          "dispatches per step")


def _native_adapter() -> bool:
    try:
        import wgpu
        return wgpu.gpu.request_adapter_sync() is not None
    except Exception:
        return False


@pytest.mark.webgpu
@needs_webgpu_backend
def test_mlp_sin_same_script_native():
    """examples/mlp_sin.py unchanged in CPython, on native WebGPU (wgpu-py)."""
    if not _native_adapter():
        pytest.skip("no native WebGPU adapter (wgpu-py with lavapipe or a GPU)")
    out = load_example()["train"]("webgpu", log=None)
    assert out["reached"], f"loss {out['loss']:.2e} after {out['steps']} steps"
    assert torch_mlp_mse(out["params"]) < 5e-3
    print(f"\nMLP-sin natively on WebGPU: {out['steps']} steps, {out['ms_per_step']:.2f} ms/step")


@browser
@needs_webgpu_backend
def test_lost_device_then_compile_again(s):
    """Runs last: it destroys the worker's shared device (a fresh one replaces it)."""
    out = s.run("""
import webgrad as wg
from webgrad import Module, init, ops

class Affine(Module):
    def __init__(self):
        super().__init__()
        self.w = self.param([3], init=init.literal([1.0, 2.0, 3.0]))

def loss_fn(m, inp):
    return ops.sum_all(inp["x"] * m.w)

def compile_affine():
    return wg.compile_module(Affine, loss_fn, inputs={"x": ([3], "f32")}, optimizer=None,
                             backend="webgpu")

c = compile_affine()
before = c.step({"x": [1.0, 1.0, 1.0]})
c.backend.host.device.destroy()
try:
    c.step({"x": [1.0, 1.0, 1.0]})
    lost = "no error"
except DeviceLostError as e:
    lost = str(e)
c2 = compile_affine()                               # a new device: training can go on
after = await c2.step_async({"x": [1.0, 0.0, 2.0]})
[before, lost, after, c2.backend.host._gpu is not c.backend.host._gpu]
""")
    before, lost, after, new_device = out
    assert before == 6.0 and after == 7.0 and new_device
    assert "device was lost" in lost and "Compile the module again" in lost, lost

