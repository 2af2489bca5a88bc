"""What the device allows, on the WebGPU executor (native adapter: wgpu-py, lavapipe in CI):
limits (binding size, workgroups per dimension, bindings per shader, several elements a
thread), a lost device, and every kernel compiled by Chromium's WGSL compiler (Tint), which
accepts other WGSL than naga. Results against numpy, torch (the oracle records) or the
reference executor. Skipped cleanly when no adapter exists.
"""
from __future__ import annotations

import gc
import math
import random
import re

import numpy as np
import pytest

import models
import oracle
from webgpu_helpers import exe, forward, require_native_adapter
import webgrad as wg
from webgrad import Module, ops, optim

pytestmark = pytest.mark.webgpu
require_native_adapter()  # skips this module where there is none

from webgrad.backends.gpu_host import DeviceLostError  # noqa: E402
from webgrad.backends.webgpu import WebGPUBackend  # noqa: E402
from webgrad.backends.webgpu_native import NativeHost  # noqa: E402
from webgrad.codegen import KernelOptions, LimitError  # noqa: E402


# ---------------------------------------------------------------- limits

def test_oversized_tensor_is_refused_naming_it():
    be = WebGPUBackend()
    be.limits.max_storage_buffer_binding_size = 4096
    with pytest.raises(LimitError, match=r"input 'x'.*maxStorageBufferBindingSize"):
        forward(lambda x: x * 2.0, {"x": [2048]}, backend=be)
    be = WebGPUBackend()
    be.limits.max_storage_buffer_binding_size = 4096
    # an intermediate: the message names the op and the user's line that built it
    with pytest.raises(LimitError, match=r"matmul f32\[33,33\].*test_webgpu_limits\.py"):
        forward(lambda a, b: ops.sum_all(a @ b), {"a": [33, 1], "b": [1, 33]}, backend=be)


def test_dispatch_over_65535_workgroups():
    """An elementwise kernel over 65536 * 256 + 37 elements, one a thread, needs 65537
    workgroups of 256: the grid is split in two dimensions and every element is still
    computed once."""
    n = 65536 * 256 + 37
    f = forward(lambda x: x * 0.5 + 1.0, {"x": [n]}, options=KernelOptions(elems=1))
    (cmd,) = [c for c in exe(f).plan["commands"] if c["op"] == "dispatch"]
    x, y, z = cmd["workgroups"]
    assert max(x, y, z) <= 65535 and x * y * z >= 65537 and y > 1
    xs = np.arange(n, dtype=np.float32) % 1024
    np.testing.assert_array_equal(f.run({"x": xs}), xs * np.float32(0.5) + np.float32(1.0))


@pytest.mark.parametrize("m, k", [(37, 3), (257, 129), (5, 1)])
def test_elementwise_several_elements_a_thread(m, k):
    """A large elementwise kernel gives each thread KernelOptions.elems elements t, t + T, ...
    with every load before any store; where the last ones run past the end their index is
    clamped and their stores guarded. Forced on small odd sizes (elems_min 0) through a transpose
    and a broadcast, against numpy: 111 elements (T = 28: the 4th element exists for 27
    threads of 28), 33153, and 5 (fewer than 2 x elems: one a thread)."""
    opts = KernelOptions(elems_min=0)
    f = forward(lambda x, y, b: ops.tanh(x + ops.swap_axes(y, 0, 1)) * b - 1.0,
                {"x": [m, k], "y": [k, m], "b": [k]}, options=opts)
    (cmd,) = [c for c in exe(f).plan["commands"] if c["op"] == "dispatch"]
    wgsl = exe(f).plan["pipelines"][cmd["pipeline"]]
    wgsl = wgsl if isinstance(wgsl, str) else wgsl["wgsl"]
    V = opts.elems if m * k >= 2 * opts.elems else 1
    assert len(re.findall(r"let i\d+ = ", wgsl)) == (V if V > 1 else 0), wgsl
    rng = np.random.default_rng(m)
    x, y, b = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, m), (k,)))
    np.testing.assert_allclose(f.run({"x": x, "y": y, "b": b}),
                               np.tanh(x + y.T) * b - 1.0, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("limit", [8, 5])
def test_binding_limit_is_obeyed(limit):
    """maxStorageBuffersPerShaderStage is 8 by WebGPU's default (browsers may give 8-10):
    fusion stores intermediates and refuses merges so that no kernel binds more, and the
    transformer still trains like the reference executor (3 steps, as
    test_webgpu_programs.py's test_training_matches_reference)."""
    be = WebGPUBackend()
    be.limits.max_storage_buffers_per_shader_stage = limit
    c, r = models.compile_transformer(be), models.compile_transformer("reference")
    worst = max(len(cmd["bindings"]) for cmd in exe(c).plan["commands"] if cmd["op"] == "dispatch")
    assert worst <= limit
    b = models.reversal_batch(0)
    for _ in range(3):
        lw, lr_ = c.step(b), r.step(b)
        assert abs(lw - lr_) <= 1e-3 * abs(lr_)


def test_concat_of_more_inputs_than_bindings():
    """9 inputs under a 4-buffer limit: one dispatch per input writes its slab."""
    be = WebGPUBackend()
    be.limits.max_storage_buffers_per_shader_stage = 4
    shapes = {f"x{k}": [2, k + 1, 3] for k in range(9)}
    f = wg.compile_forward(Module, lambda m, i: ops.exp(ops.concat([i[k] * 2.0 for k in shapes], 1)),
                           inputs=shapes, backend=be)
    rng = np.random.default_rng(0)
    feed = {k: rng.uniform(-1, 1, s).astype(np.float32) for k, s in shapes.items()}
    want = np.exp(np.concatenate([feed[k].astype(np.float64) * 2 for k in shapes], 1))
    np.testing.assert_allclose(f.run(feed), want, rtol=1e-5)
    assert max(len(c["bindings"]) for c in exe(f).plan["commands"]) <= 4


@pytest.mark.parametrize("name", ["softmax_last/3d", "sum/axes", "matmul/batch_bcast",
                                  "argmax_last", "scatter_add_rows", "fold2d", "embedding",
                                  "layer_norm_last"])
def test_split_grids_with_a_tiny_dimension_limit(name):
    """With maxComputeWorkgroupsPerDimension forced to 2, every kernel kind runs on a
    split 2-D/3-D grid (with workgroups past the end that must do nothing)."""
    be = WebGPUBackend()
    be.limits.max_compute_workgroups_per_dimension = 2
    oracle.check(oracle.BY_NAME[name], be)


# ---------------------------------------------------------------- device loss

def test_device_loss_raises_instead_of_hanging():
    host = NativeHost(private=True)
    c = models.compile_mlp(WebGPUBackend(host))
    b = models.sin_batch(random.Random(0))
    assert math.isfinite(c.step(b))
    host.destroy_device()
    with pytest.raises(DeviceLostError, match="lost"):
        c.step(b)
    with pytest.raises(DeviceLostError):
        c.download_params()
    del c
    gc.collect()  # releasing a lost device's objects must not crash (wgpudawn did)
    # the shared device of every other compile is untouched
    assert math.isfinite(models.compile_mlp("webgpu").step(b))


# ---------------------------------------------------------------- Tint (Chromium) accepts the WGSL

_TINT_JS = """async (shaders) => {
  const adapter = await navigator.gpu.requestAdapter();
  const device = await adapter.requestDevice();  // WebGPU's default limits
  const bad = [];
  for (let i = 0; i < shaders.length; i++) {
    device.pushErrorScope("validation");
    const module = device.createShaderModule({code: shaders[i]});
    const msgs = (await module.getCompilationInfo()).messages
      .filter((m) => m.type === "error").map((m) => `${m.lineNum}:${m.linePos} ${m.message}`);
    try {
      await device.createComputePipelineAsync({layout: "auto", compute: {module, entryPoint: "main"}});
    } catch (e) { msgs.push(e.message); }
    const err = await device.popErrorScope();
    if (err) msgs.push(err.message);
    if (msgs.length) bad.push([i, msgs.join("; ")]);
  }
  return bad;
}"""


@pytest.fixture(scope="module")
def every_kernel():
    """Every distinct kernel of the oracle table and both models, lowered for WebGPU's
    default limits (8 storage buffers, 16 KiB of workgroup memory) with either matmul kernel."""
    from webgrad.codegen import Limits, lower
    from webgrad.compile import build_train_graph, parse_inputs
    graphs = []
    for r in oracle.RECORDS:
        factory, loss_fn, inputs, _ = oracle.build_record(r)
        graphs.append(build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1])
    graphs.append(build_train_graph(models.MLP, models.mlp_loss, parse_inputs(models.MLP_INPUTS),
                                    optim.Adam(lr=0.005))[1])
    graphs.append(build_train_graph(models.Transformer, models.transformer_loss,
                                    parse_inputs(models.TF_INPUTS), optim.Adam(lr=0.01))[1])
    shaders = {}
    for force in (True, False):  # both matmul kernels (barrier-free, tiled)
        for g in graphs:
            low, _ = lower(g, Limits(options=KernelOptions(force_direct=force)))
            for p in low.plan["pipelines"]:
                shaders.setdefault(p["wgsl"], None)
    return list(shaders)


# SwiftShader compiles each pipeline in Chrome's GPU process: about a thousand kernels take
# minutes, so they go in slices, each a test well inside the suite's per-test limit
TINT_SLICES = 12


@pytest.mark.browser
@pytest.mark.parametrize("part", range(TINT_SLICES))
def test_every_kernel_compiles_in_chromium(browser_session, every_kernel, part):
    """naga (wgpu-native, these tests) and Tint (Chrome's compiler, the browser worker) do
    not accept the same WGSL (e.g. Tint refuses a constant that evaluates to inf): every
    kernel of `every_kernel` (this test's slice of them) compiles in headless Chromium."""
    shaders = every_kernel[part::TINT_SLICES]
    page = browser_session.browser.new_page()  # the session's Chromium; a page of its own
    try:
        page.route("https://webgrad.test/**",  # a secure context, with no server
                   lambda route: route.fulfill(body="<html></html>", content_type="text/html"))
        page.goto("https://webgrad.test/")
        assert page.evaluate("() => !!navigator.gpu"), "this Chromium has no WebGPU"
        bad = page.evaluate(_TINT_JS, shaders)
    finally:
        page.close()
    assert not bad, f"{len(bad)} of {len(shaders)} kernels rejected by Tint; first: " + \
        f"{bad[0][1]}\n{shaders[bad[0][0]]}"
