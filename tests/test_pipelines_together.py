"""A plan's pipelines created together (NativeHost: on a pool of threads, each making one with
the synchronous call, started while lowering emits the kernels; or every missing one issued
with create_compute_pipeline_async, then all waited for).

Checked against independent things: numpy for a small plan's results, the reference
executor for training steps, and a sequential creation path (an API without the async
call, no threads) for bit-identical losses. Device proxies stand in for what lavapipe does
not show: Dawn's deferred promises (wgpu-native resolves the async call at once), creation
that overlaps in time, and an error raised in another thread than the failing text's.
"""
from __future__ import annotations

import os
import random
import threading
import time

import numpy as np
import pytest

import models
from backends import webgpu_available

pytestmark = [pytest.mark.webgpu,
              pytest.mark.skipif(not webgpu_available(), reason="no native WebGPU adapter")]

_KERNEL = """// webgrad test: {name}
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3u) {{
  if (g.x < arrayLength(&y)) {{ y[g.x] = {expr}; }}
}}
"""
_BAD = """// webgrad test: {name}
@compute @workgroup_size(64)
fn main() {{ let v: f32 = 1u; }}
"""


def _kernels(tag: str, exprs: list[str]) -> list[str]:
    """Kernels with texts no other test made (the shared cache keys on the text)."""
    return [_KERNEL.format(name=f"{tag} {k}", expr=e) for k, e in enumerate(exprs)]


def _plan(wgsls: list[str], n: int = 100) -> dict:
    """x -> each kernel in turn (y = f(x)), each into its own output buffer."""
    return {"buffers": [{"size": 4 * n, "label": "x"}]
                       + [{"size": 4 * n, "label": f"y{k}"} for k in range(len(wgsls))],
            "pipelines": [{"wgsl": w} for w in wgsls],
            "commands": [{"op": "dispatch", "pipeline": k, "bindings": [0, k + 1],
                          "workgroups": [-(-n // 64), 1, 1]} for k in range(len(wgsls))]}


def test_a_bad_kernel_among_several_names_itself_and_the_rest_still_work():
    from webgrad.backends.webgpu_native import NativeHost
    from webgrad.compiled import run_blocking
    host = NativeHost()
    good = _kernels(f"good {random.random()}", ["x[g.x] * 2.0", "x[g.x] + 1.0", "-x[g.x]"])
    bad = _BAD.format(name=f"bad {random.random()}")
    with pytest.raises(RuntimeError, match=r"WGSL kernel '// webgrad test: bad .*' failed "
                                           r"to compile") as err:
        host.load(_plan([good[0], good[1], bad, good[2]]))
    message = str(err.value)
    assert bad in message and good[0] not in message  # the failing kernel's WGSL, shown
    assert good[0] in host._dev.pipelines and bad not in host._dev.pipelines
    # the host is untouched: the good kernels load and compute
    n = 100
    x = np.linspace(-3, 3, n, dtype=np.float32)
    program = host.load(_plan(good, n))
    ys = run_blocking(host.run(program, {0: x.tobytes()}, [1, 2, 3]))
    host.unload(program)
    got = [np.frombuffer(bytes(y), np.float32) for y in ys]
    for y, want in zip(got, [x * 2, x + 1, -x]):
        np.testing.assert_array_equal(y, want)


class _Deferred:
    """A device proxy whose create_compute_pipeline_async returns a promise that creates the
    pipeline on the real device only when waited for (as Dawn's resolve later), and rejects
    for the texts in `reject` (as Dawn reports a pipeline that fails validation)."""

    def __init__(self, device, reject=()):
        self._device, self._reject, self.log = device, set(reject), []

    def __getattr__(self, name):
        return getattr(self._device, name)

    def create_compute_pipeline_async(self, *, layout, compute):
        wgsl = self._wgsl[id(compute["module"])]
        self.log.append(("issue", wgsl))
        proxy = self

        class Promise:
            def sync_wait(self):
                proxy.log.append(("wait", wgsl))
                if wgsl in proxy._reject:
                    raise RuntimeError("create_compute_pipeline failed (ValidationError): "
                                       "a test's rejected pipeline")
                return proxy._device.create_compute_pipeline(layout=layout, compute=compute)
        return Promise()

    def create_shader_module(self, *, code):
        module = self._device.create_shader_module(code=code)
        self._wgsl = getattr(self, "_wgsl", {})
        self._wgsl[id(module)] = code
        self._keep = getattr(self, "_keep", []) + [module]  # ids stay unique while held
        return module


def test_all_are_issued_before_any_is_waited_for_and_a_rejection_names_its_kernel():
    from webgrad.backends.webgpu_device import Device
    dev = Device()
    dev.threads = 0  # the create_compute_pipeline_async path
    texts = _kernels(f"deferred {random.random()}", ["x[g.x]", "x[g.x] * 3.0", "x[g.x] - 2.0",
                                                     "x[g.x] * x[g.x]"])
    dev.device = _Deferred(dev.device, reject={texts[2]})
    with pytest.raises(RuntimeError, match=r"WGSL kernel '// webgrad test: deferred .* 2' "
                                           r"failed to compile: .*rejected") as err:
        dev.pipelines_for(texts + [texts[0]])  # a repeated text is created once
    assert texts[2] in str(err.value)
    kinds = [k for k, _ in dev.device.log]
    assert kinds == ["issue"] * 4 + ["wait"] * 4, kinds
    assert [w for k, w in dev.device.log if k == "issue"] == texts
    # the others were waited for and cached; a later call creates nothing again
    assert {w for w in texts if w in dev.pipelines} == {texts[0], texts[1], texts[3]}
    dev.device._reject.clear()
    dev.device.log.clear()
    pipes = dev.pipelines_for([texts[3], texts[2], texts[0]])
    assert dev.device.log == [("issue", texts[2]), ("wait", texts[2])]  # tried afresh
    assert pipes == [dev.pipelines[w] for w in (texts[3], texts[2], texts[0])]


class _SyncOnly:
    """A device proxy without create_compute_pipeline_async: the one-at-a-time path."""

    def __init__(self, device):
        self._device = device

    def __getattr__(self, name):
        if name == "create_compute_pipeline_async":
            raise AttributeError(name)
        return getattr(self._device, name)


def _losses(backend, steps: int = 3) -> list[float]:
    c = models.compile_mlp(backend)
    rng = random.Random(7)
    return [c.step(models.sin_batch(rng)) for _ in range(steps)]


def test_training_is_the_same_whether_pipelines_are_made_together_or_one_by_one():
    from webgrad.backends.webgpu import WebGPUBackend
    from webgrad.backends.webgpu_native import NativeHost
    together, alone = NativeHost(private=True), NativeHost(private=True)
    alone._dev.device = _SyncOnly(alone._dev.device)  # pipelines only: buffers use the real one
    alone._dev.threads = 0  # one at a time, in the caller's thread
    assert together._dev.threads > 1 or (os.cpu_count() or 1) == 1  # on the thread pool
    a = _losses(WebGPUBackend(together))
    b = _losses(WebGPUBackend(alone))
    assert len(together._dev.pipelines) > 1  # a fresh device: every pipeline was made here
    assert len(alone._dev.pipelines) == len(together._dev.pipelines)
    assert a == b  # the same WGSL, so the same kernels: bit for bit
    # against the numpy executor: f32 noise, test_webgpu_programs.py's standard for training steps
    # (Adam's first steps amplify the rounding of near-zero gradients)
    np.testing.assert_allclose(a, _losses("reference"), rtol=1e-3, atol=1e-6)


def test_compile_module_raises_for_a_kernel_of_its_step_that_does_not_compile(monkeypatch):
    """A broken kernel among the step's pipelines (created together) raises the clear
    error from compile_module itself."""
    import webgrad.backends.webgpu as wgb
    lower = wgb.lower
    broken = {}

    def lower_with_a_broken_kernel(graph, limits, key, **kw):
        lowered, names = lower(graph, limits, key, **kw)
        if not broken:  # the step's plan (lowered first): break one kernel in the middle
            k = len(lowered.plan["pipelines"]) // 2
            text = lowered.plan["pipelines"][k]["wgsl"]
            broken["head"] = text.splitlines()[0]
            lowered.plan["pipelines"][k]["wgsl"] = text.replace(
                "fn main(", f"fn unused_{random.randrange(10**9)}() {{ let v: f32 = 1u; }}\nfn main(", 1)
        return lowered, names

    monkeypatch.setattr(wgb, "lower", lower_with_a_broken_kernel)
    with pytest.raises(RuntimeError, match="failed to compile") as err:
        models.compile_mlp("webgpu")
    assert f"WGSL kernel {broken['head']!r}" in str(err.value)
    assert "let v: f32 = 1u;" in str(err.value)  # the WGSL is shown


def test_the_run_graph_is_prepared_on_the_first_run():
    """compile_module loads the training step only; run() prepares its own program the
    first time, over the same parameters (its loss equals the reference executor's)."""
    c, r = models.compile_mlp("webgpu"), models.compile_mlp("reference")
    assert len(c.backend.programs) == 1  # the step (the init program is gone already)
    rng = random.Random(5)
    for _ in range(2):
        b = models.sin_batch(rng)
        c.step(b), r.step(b)
    b = models.sin_batch(rng)
    assert abs(c.run(b) - r.run(b)) <= 1e-4 * abs(r.run(b)) + 1e-6
    assert len(c.backend.programs) == 2
    assert abs(c.run(b) - r.run(b)) <= 1e-4 * abs(r.run(b)) + 1e-6  # prepared once
    assert len(c.backend.programs) == 2


class _Overlapping:
    """A device proxy whose synchronous create_compute_pipeline records how many calls run
    at once (each waits a little, so calls on different threads overlap). A text in `swap`
    is invalid, and its error goes to one list of pending errors that every call checks
    when it ends, as the bindings' error handler does: the first call to end raises it.
    Alone, that is the invalid text's own call; among overlapping calls, a shorter valid
    one ends first and raises it, while the invalid one returns an (unusable) pipeline,
    here made from the valid `stand_in` text."""

    def __init__(self, device, swap=(), stand_in=None):
        self._device, self._swap, self._stand_in = device, set(swap), stand_in
        self._lock = threading.Lock()
        self.running = self.most = 0
        self.threads, self.made, self._pending = set(), [], []

    def __getattr__(self, name):
        return getattr(self._device, name)

    def create_shader_module(self, *, code):
        module = self._device.create_shader_module(code=code)
        module._webgrad_test_text = code
        return module

    def create_compute_pipeline(self, *, layout, compute):
        wgsl = compute["module"]._webgrad_test_text
        invalid = wgsl in self._swap
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.threads.add(threading.get_ident())
            if invalid:
                self._pending.append("a test's invalid kernel")
        try:
            time.sleep(0.2 if invalid else 0.05)
            with self._lock:
                error = self._pending.pop() if self._pending else None
            if error is not None:
                raise RuntimeError(f"Validation error: {error}")
            if invalid:
                compute = {"module": self._device.create_shader_module(code=self._stand_in),
                           "entry_point": "main"}
            else:
                self.made.append(wgsl)
            return self._device.create_compute_pipeline(layout=layout, compute=compute)
        finally:
            with self._lock:
                self.running -= 1


def _proxied_host(threads: int, proxy, **kw):
    """A NativeHost of its own whose pipelines go through `proxy` (buffers do not)."""
    from webgrad.backends.webgpu_native import NativeHost
    host = NativeHost(private=True)
    host._dev.threads = threads
    host._dev.device = proxy(host._dev.device, **kw)
    return host, host._dev


def _run_kernels(host, texts: list[str], x: np.ndarray) -> list[np.ndarray]:
    """Each text's output for input x, loaded on `host`."""
    from webgrad.compiled import run_blocking
    program = host.load(_plan(texts, len(x)))
    ys = run_blocking(host.run(program, {0: x.tobytes()}, list(range(1, len(texts) + 1))))
    host.unload(program)
    return [np.frombuffer(bytes(y), np.float32) for y in ys]


def test_pipelines_are_made_on_several_threads_at_once_and_compute_right():
    host, dev = _proxied_host(4, _Overlapping)
    exprs = ["x[g.x] * 2.0", "x[g.x] + 1.0", "-x[g.x]", "x[g.x] * x[g.x]", "abs(x[g.x])",
             "x[g.x] - 0.5"]
    texts = _kernels(f"threads {random.random()}", exprs)
    x = np.linspace(-3, 3, 100, dtype=np.float32)
    got = _run_kernels(host, texts, x)
    assert dev.device.most > 1 and len(dev.device.threads) > 1  # overlapping calls
    assert threading.get_ident() not in dev.device.threads  # none on the caller's thread
    assert sorted(dev.device.made) == sorted(texts)  # each made once
    for y, want in zip(got, [x * 2, x + 1, -x, x * x, np.abs(x), x - 0.5]):
        np.testing.assert_array_equal(y, want)


def test_an_error_raised_in_another_threads_call_still_names_the_failing_kernel():
    """A bad text whose error surfaces in a good text's call: the batch is made again one
    at a time, so the error names the bad kernel and the good ones compute right."""
    texts = _kernels(f"swapped {random.random()}", ["x[g.x] * 2.0", "x[g.x] + 1.0",
                                                    "x[g.x] - 2.0", "-x[g.x]"])
    bad = texts[2]
    host, dev = _proxied_host(4, _Overlapping, swap={bad}, stand_in=texts[0])
    with pytest.raises(RuntimeError, match=r"WGSL kernel '// webgrad test: swapped .* 2' "
                                           r"failed to compile") as err:
        dev.pipelines_for(texts)
    assert bad in str(err.value) and texts[0] not in str(err.value)
    assert bad not in dev.pipelines  # not cached: the next call that names it tries again
    assert {w for w in texts if w in dev.pipelines} == {texts[0], texts[1], texts[3]}
    x = np.linspace(-3, 3, 100, dtype=np.float32)
    good = [texts[0], texts[1], texts[3]]
    for y, want in zip(_run_kernels(host, good, x), [x * 2, x + 1, -x]):
        np.testing.assert_array_equal(y, want)


def test_lowering_starts_each_kernel_before_the_plan_is_loaded(monkeypatch):
    """NativeHost.prefetch gets every pipeline of the step's plan while it is lowered (the
    driver compiles while Python lowers), and training matches the reference executor."""
    from webgrad.backends.webgpu import WebGPUBackend
    from webgrad.backends.webgpu_native import NativeHost
    host = NativeHost(private=True)
    log = []
    prefetch, load = host.prefetch, host.load
    monkeypatch.setattr(host, "prefetch", lambda w: (log.append(("prefetch", w)), prefetch(w)))
    monkeypatch.setattr(host, "load", lambda plan: (log.append(("load", plan)), load(plan))[1])
    losses = _losses(WebGPUBackend(host))
    first = next(k for k, (kind, _) in enumerate(log) if kind == "load")
    step_plan = log[first][1]
    issued = [w for kind, w in log[:first] if kind == "prefetch"]
    assert issued == [q["wgsl"] for q in step_plan["pipelines"]]  # all, in plan order
    assert not host._dev._making  # all collected by load
    np.testing.assert_allclose(losses, _losses("reference"), rtol=1e-3, atol=1e-6)
