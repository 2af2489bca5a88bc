"""The CPU backend in a browser without WebGPU: headless Chromium with WebGPU turned off
(browser.NO_WEBGPU_FLAGS), its worker running webgrad's programs exported to ONNX in
onnxruntime-web (WebAssembly), judged in CPython against the reference executor.

* device_info() says backend='auto' runs on 'wasm' there and why; the MLP trains for a few
  steps on backend='auto' and its losses and parameters equal the reference's from the same
  initial weights and batches;
* the playground's MLP example trains to its target there (the page says it runs on the CPU),
  and Stop keeps the last completed step's parameters (the reference's, replayed);
* the convnet, transformer and char LM demos, a few steps each, run in the
  page there with the losses of the same source on the reference executor in CPython;
* a forward program of the MLP between training steps and after an upload equals the
  reference (the weights it only reads are resident in onnxruntime-web's session, made
  again from the store when they change);
* one oracle record per primitive (so every lowering runs in the WebAssembly engine) and
  GPT-2 tiny's logits and cached decode (the KV cache as the program's state) equal the
  reference executor's in CPython (a slow case: --run-slow).
"""
from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

from playground_stop import stop_long_mlp_run, twin_errors
from test_gpu_host import ship_module
from test_worker_interrupts import _reference_params

browser = pytest.mark.browser
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s(browser_without_webgpu):
    import models
    ship_module(browser_without_webgpu, "models", models.source())
    ship_module(browser_without_webgpu, "oracle", (REPO / "tests" / "oracle.py").read_text())
    return browser_without_webgpu


@browser
def test_mlp_trains_on_the_cpu_backend(s):
    import models
    info = s.run("import webgrad as wg\nwg.device_info('auto')")
    assert info["backend"] == "wasm", info
    assert "no WebGPU adapter" in info["reason"] and "onnxruntime-web" in info["engine"], info
    got = s.run("""
import random, models
c = models.compile_mlp("auto", seed=0)
rng = random.Random(1)
losses = [c.step(models.sin_batch(rng)) for _ in range(4)]
p = c.download_params()
[c.backend.name, losses, {k: v.tolist() for k, v in p.items()}]
""", timeout=60)
    ref = models.compile_mlp("reference", seed=0)
    rng = random.Random(1)
    want = [ref.step(models.sin_batch(rng)) for _ in range(4)]
    assert got[0] == "wasm"
    np.testing.assert_allclose(got[1], want, rtol=1e-5)
    for name, v in ref.download_params().items():
        np.testing.assert_allclose(np.asarray(got[2][name]), v, rtol=1e-4, atol=1e-6, err_msg=name)



@browser
def test_auto_prefers_wasm_on_a_software_adapter(browser_session):
    """In the WebGPU Chromium the only adapter is SwiftShader, a software fallback: without
    the session's override (BrowserSession serves {"auto": "webgpu"}, which the worker puts at
    globalThis.webgradAuto) backend='auto' picks 'wasm' and says why; with it, 'webgpu'.
    The MLP's first losses are the reference executor's on both (same seed and batches)."""
    import models
    s = browser_session
    ship_module(s, "models", models.source())
    got = s.run("""
import js, random, models
import webgrad as wg

def run_mlp():
    c = models.compile_mlp("auto", seed=0)
    rng = random.Random(1)
    out = [c.backend.name, [c.step(models.sin_batch(rng)) for _ in range(3)]]
    c.destroy()
    return out

kept = js.globalThis.webgradAuto
try:
    js.Reflect.deleteProperty(js.globalThis, "webgradAuto")
    off = [wg.device_info("auto"), run_mlp()]
finally:
    js.globalThis.webgradAuto = kept
[kept, off, [wg.device_info("auto"), run_mlp()]]
""", timeout=180)
    kept, (info_off, run_off), (info_on, run_on) = got
    assert kept == "webgpu", kept
    assert info_off["backend"] == "wasm" and "onnxruntime-web" in info_off["engine"], info_off
    assert "software fallback" in info_off["reason"] and "swiftshader" in info_off["reason"].lower()
    assert "backend='webgpu'" in info_off["reason"], info_off
    assert info_on["backend"] == "webgpu" and "swiftshader" in info_on["engine"].lower(), info_on
    assert "software fallback" in info_on["reason"] and "webgradAuto" in info_on["reason"], info_on
    ref = models.compile_mlp("reference", seed=0)
    rng = random.Random(1)
    want = [ref.step(models.sin_batch(rng)) for _ in range(3)]
    assert run_off[0] == "wasm" and run_on[0] == "webgpu", (run_off, run_on)
    np.testing.assert_allclose(run_off[1], want, rtol=1e-5)
    np.testing.assert_allclose(run_on[1], want, rtol=1e-4)

def _one_record_per_primitive() -> list[str]:
    """The first record that uses each primitive (the IR of each record's training step)."""
    import oracle
    names, seen = [], set()
    for r in oracle.RECORDS:
        c, _ = oracle.compile_record(r, "reference")
        ops = {n.op for n in c.ir.nodes} - seen
        c.destroy()
        if ops:
            names.append(r.name)
            seen |= ops
    return names


@browser
@pytest.mark.slow  # 17 s: the default run keeps the MLP above; CPython's tests/test_onnx.py runs every record
def test_oracle_records_and_gpt2_on_the_cpu_backend(s):
    import oracle
    from webgrad.models import gpt2
    names = _one_record_per_primitive()
    got = s.run(f"import oracle\nawait oracle.run_records_collect({names!r}, 'wasm')", timeout=60)
    for name in names:
        assert got[name]["ok"], got[name].get("error")
        g, want = got[name]["got"], oracle.run_webgrad(oracle.BY_NAME[name], "reference")
        r = oracle.BY_NAME[name]
        for key in ("out", "out_run"):
            if g["out_dtype"] == "i32":
                assert g[key] == want[key], name
            else:
                np.testing.assert_allclose(np.asarray(g[key], np.float64), want[key], equal_nan=True,
                                           rtol=max(r.rtol, 1e-5), atol=max(r.atol, 1e-6), err_msg=name)
        for p, v in want["grads"].items():
            np.testing.assert_allclose(np.asarray(g["grads"][p], np.float64), v, equal_nan=True,
                                       rtol=max(r.rtol, 1e-5), atol=max(r.atol, 1e-6), err_msg=f"{name} {p}")
    ids = [1, 5, 2, 7, 3, 3, 9, 0]
    out = s.run(f"""
from webgrad.models import gpt2
cfg = gpt2.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=32, vocab_size=11, layer_norm_epsilon=1e-5)
m = gpt2.GPT2.init_random(cfg, seed=3, backend="wasm")
ids = {ids!r}
full = m.forward(ids).tolist()
c = m.new_cache()
rows = m.logits_all_step(ids[:3], c).tolist() + [m.logits_step([t], c).tolist() for t in ids[3:]]
[full, rows]
""", timeout=60)
    cfg = gpt2.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=32, vocab_size=11, layer_norm_epsilon=1e-5)
    want = np.asarray(gpt2.GPT2.init_random(cfg, seed=3, backend="reference").forward(ids))
    np.testing.assert_allclose(out[0], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out[1], want, rtol=1e-4, atol=1e-5)


@browser
def test_gpt2_gguf_loads_on_the_cpu_backend(s, tmp_path):
    """A GGUF file's weights go into the wasm backend's store (ort.Tensor there, which names
    its shape `dims`): F32 and Q8_0 files, logits equal the reference executor's on the same
    file in CPython."""
    from tiny_files import gpt2_gguf
    from webgrad.models import gpt2
    ids = [1, 5, 2, 7, 3, 3, 9, 0]
    s.run("""
from webgrad.models import gpt2 as _gpt2
async def gguf_logits_wasm(blob, ids):
    m = await _gpt2.GPT2.from_gguf_async(blob, backend="wasm")
    out = (await m.forward_async(ids)).tolist()
    return [out, m.weight_bytes]
""")
    for q8 in (False, True):
        blob = gpt2_gguf(tmp_path / f"tiny-{q8}.gguf", q8=q8)
        got, nbytes = s.call("gguf_logits_wasm", blob, ids, timeout=60)
        ref = gpt2.GPT2.from_gguf(blob, backend="reference")
        np.testing.assert_allclose(got, np.asarray(ref.forward(ids)), rtol=1e-4, atol=1e-5,
                                   err_msg=f"q8={q8}")
        assert nbytes == ref.weight_bytes


@browser
def test_resident_weights_see_uploads_and_training_in_the_browser(s):
    """onnxruntime-web holds the parameters a program only reads in its session (external
    data, handed over from the store's ort.Tensors): a forward program of the MLP between
    training steps, and after an upload, gives the reference executor's outputs."""
    import models
    import random
    x = [[v] for v in np.linspace(-3, 3, models.MLP_B).tolist()]
    new_l2 = (0.1 * np.random.default_rng(0).standard_normal((64, 64))).astype(np.float32)
    code = f"""
import random, models
c = models.compile_mlp("wasm", seed=1)
fwd = c.compile_forward(lambda m, f: models.mlp_forward(m, f["x"]), inputs={{"x": ([models.MLP_B, 1], "f32")}})
x = {x!r}
outs = [fwd.run({{"x": x}}).tolist()]
rng = random.Random(2)
for _ in range(3):
    c.step(models.sin_batch(rng))
    outs.append(fwd.run({{"x": x}}).tolist())
fwd.upload_params({{"l2.W": {new_l2.tolist()!r}}}, partial=True)
outs.append(fwd.run({{"x": x}}).tolist())
outs
"""
    got = s.run(code, timeout=120)
    c = models.compile_mlp("reference", seed=1)
    fwd = c.compile_forward(lambda m, f: models.mlp_forward(m, f["x"]),
                            inputs={"x": ([models.MLP_B, 1], "f32")})
    assert "l2.W" in fwd.param_names
    want = [fwd.run({"x": x})]
    rng = random.Random(2)
    for _ in range(3):
        c.step(models.sin_batch(rng))
        want.append(fwd.run({"x": x}))
    fwd.upload_params({"l2.W": new_l2}, partial=True)
    want.append(fwd.run({"x": x}))
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5, err_msg=f"run {k}")


@browser
def test_playground_mlp_example_runs_without_webgpu(s):
    page = s.page
    page.wait_for_function("window.playground && !['booting'].includes(window.playground.state)",
                           timeout=60_000)
    page.wait_for_selector("#nogpu:not([hidden])", timeout=30_000)  # set once requestAdapter answers
    banner = page.eval_on_selector("#nogpu", "e => e.textContent")
    assert "WebGPU is unavailable" in banner and 'backend="wasm"' in banner, banner
    # Stop mid-run: the parameters are those after a completed step, bit for bit those of a
    # twin stepped as often on this backend, and the reference's (a step or two more than the
    # page counted if the stop came between a step and its report reaching the page)
    reported, params = stop_long_mlp_run(page, s, started_ms=30_000)
    twins = twin_errors(s, params, reported, extra=2)
    assert min(twins.values()) == 0, twins
    errors = {}
    for k in (reported, reported + 1, reported + 2):
        ref = _reference_params(k, 0)
        errors[k] = max(float(np.max(np.abs(np.asarray(params[n]) - ref[n]))) for n in ref)
    assert min(errors.values()) < 1e-4, errors
    # then the example as it is, to its target
    page.select_option("#examples", "mlp_sin.py")
    page.wait_for_function("!window.playground.code.includes('10**6')")
    page.click("#run")
    page.wait_for_function("['done', 'error', 'stopped', 'dead'].includes(window.playground.state)",
                           timeout=50_000)
    console = page.eval_on_selector("#console", "e => e.textContent")
    assert page.evaluate("window.playground.state") == "done", console
    assert "compiled on wasm" in console and "reached loss" in console, console
    losses = page.evaluate("window.playground.losses")
    assert losses[-1] < 1e-3 < losses[0] / 100, losses[:3] + losses[-3:]
    # the trained model (the worker's global `c`) predicts sin
    xs = [-2.5 + 0.25 * k for k in range(21)]
    pred = s.run("f = c.compile_forward(lambda m, inp: forward(m, inp['x']), inputs={'x': ([21, 1], 'f32')})\n"
                 f"f.run({{'x': [[x] for x in {xs!r}]}}).tolist()")
    for x, (p,) in zip(xs, pred):
        assert abs(p - math.sin(x)) < 0.1, (x, p)


DEMOS = {  # example -> (steps of the short run, its edits: the STEPS line first)
    "transformer_addition.py": (3, [("STEPS = 1500", "STEPS = 3")]),
    # a smaller batch and a short sample (one forward run per character) keep it brief
    "char_lm.py": (2, [("STEPS = 3000", "STEPS = 2"), ("B = 32", "B = 4"),
                       ("sample_chars: int = 240", "sample_chars: int = 24")]),
    "digits_convnet.py": (3, [("STEPS = 600", "STEPS = 3")]),
}


def _reference_run(source: str) -> tuple[list[float], str]:
    """The example's __main__ run in CPython on the reference executor: its reported losses
    and what it printed."""
    import contextlib
    import io
    import sys
    from webgrad import playground
    got: list[dict] = []
    argv, sys.argv = sys.argv, ["example", "reference"]
    playground.set_listener(got.append)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(source, "example", "exec"), {"__name__": "__main__"})
    finally:
        playground.set_listener(None)
        sys.argv = argv
    return [e["loss"] for e in got if e.get("loss") is not None], out.getvalue()


@browser
@pytest.mark.parametrize("example", sorted(DEMOS))
def test_demo_runs_without_webgpu(s, example):
    """Each demo, shortened to a few steps, runs in the page on the CPU backend; its losses
    are those of the same source on the reference executor in CPython, and the char LM's
    sampled text (a forward program sharing the trained parameters) is the reference's."""
    page = s.page
    page.wait_for_function("window.playground && !['booting', 'running'].includes(window.playground.state)",
                           timeout=60_000)
    steps, edits = DEMOS[example]
    page.select_option("#examples", example)
    page.wait_for_function(f"window.playground.code.includes({edits[0][0]!r})")
    source = page.evaluate("window.playground.code")
    for old, new in edits:
        assert source.count(old) == 1, (example, old)
        source = source.replace(old, new)
    page.evaluate("(t) => { window.playground.code = t; }", source)
    page.click("#run")
    page.wait_for_function("['done', 'error', 'stopped', 'dead'].includes(window.playground.state)",
                           timeout=50_000)
    console = page.eval_on_selector("#console", "e => e.textContent")
    assert page.evaluate("window.playground.state") == "done", console
    assert "compiled on wasm" in console, console
    losses = page.evaluate("window.playground.losses")
    want, printed = _reference_run(source)
    assert len(losses) == len(want) == steps
    np.testing.assert_allclose(losses, want, rtol=1e-4, atol=1e-5)
    if example == "char_lm.py":
        lines = printed.splitlines()
        sample = lines[next(k for k, line in enumerate(lines) if line.startswith("step ")) + 1]
        assert sample.startswith("The ") and len(sample) == 4 + 24, printed
        assert sample in console, (sample, console)


@browser
def test_onnxruntime_threads_are_asked_before_it_loads(s):
    """onnx_runtime.set_threads(2) in a fresh worker of the (cross-origin isolated) page gives
    onnxruntime-web two threads where it would take one on this machine's default (half the
    cores); the MLP's steps on two threads equal the reference's; asking again once it is
    loaded, or for a bad count, is refused with a message."""
    import models
    with s.another_worker() as w:
        ship_module(w, "models", models.source())
        got = w.run("""
import random, js, models
from webgrad.backends import onnx_runtime as ort
errors = []
for bad in (0, 1.5, True):
    try:
        ort.set_threads(bad)
    except ValueError as e:
        errors.append(str(e))
ort.set_threads(2)
c = models.compile_mlp("wasm", seed=0)
rng = random.Random(1)
losses = [c.step(models.sin_batch(rng)) for _ in range(3)]
try:
    ort.set_threads(1)
except RuntimeError as e:
    errors.append(str(e))
[bool(js.crossOriginIsolated), c.backend.engine, losses, errors]
""", timeout=60)
    isolated, engine, losses, errors = got
    assert isolated and "2 threads" in engine, engine
    ref = models.compile_mlp("reference", seed=0)
    rng = random.Random(1)
    np.testing.assert_allclose(losses, [ref.step(models.sin_batch(rng)) for _ in range(3)], rtol=1e-5)
    assert len(errors) == 4 and all("set_threads" in e for e in errors), errors
    assert "loaded already" in errors[-1], errors
