"""The reliability guarantees of tests/test_reliability.py, inside the browser worker.

Pyodide has no numpy, so here the NaN scan takes its pure-Python path and results come
back as HostArrays. The same model runs in CPython on the reference backend as the oracle:
a refused call must leave the worker's module stepping exactly like a twin that never saw
it, and after a lost device (GPUDevice.destroy()) recover() must continue with the losses
the CPython reference computes for the same steps.
"""
from __future__ import annotations

import pytest


browser = pytest.mark.browser

MODEL = '''
import array, math
import webgrad as wg
from webgrad import Module, ops, optim

class Net(Module):
    def __init__(self):
        super().__init__()
        self.W = self.param([4, 3], init="kaiming")
        self.b = self.param([3], init="zeros")

def net_loss(m, inp):
    h = ops.tanh(inp["x"] @ m.W + m.b)
    return ops.mean_all(h * h)

def feed(k):
    return {"x": [[math.sin(k + 4 * i + j) for j in range(4)] for i in range(2)]}

def compile_net(backend="webgpu", **kw):
    return wg.compile_module(Net, net_loss, inputs={"x": [2, 4]}, optimizer=optim.Adam(lr=0.05),
                             backend=backend, seed=3, **kw)

def params(c):
    return {k: v.tolist() for k, v in c.download_params().items()}
'''
exec(MODEL)  # the same definitions in CPython: the oracle runs them on the reference backend


@pytest.fixture(scope="module")
def s(browser_session):
    if not browser_session.run("import js; bool(getattr(js.navigator, 'gpu', None))"):
        pytest.skip("this Chromium has no WebGPU")
    browser_session.run(MODEL)
    return browser_session


def reference_losses(steps) -> list[float]:
    c = compile_net("reference")
    return [c.step(feed(k)) for k in steps]


@browser
def test_refused_feeds_and_uploads_change_nothing_in_the_browser(s):
    out = s.run('''
c, twin = compile_net(), compile_net()
same = [c.step(feed(k)) == twin.step(feed(k)) for k in range(2)]
before = params(c)
errors = []
nan_x = [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, float("nan"), 1.0]]
for call in (lambda: c.step({"x": nan_x}),
             lambda: c.step({"x": array.array("f", sum(nan_x, []))}),
             lambda: c.step({"x": memoryview(array.array("d", sum(nan_x, [])))}),
             lambda: c.upload_params({"b": [0.0, float("nan"), 1.0]}, partial=True),
             lambda: c.upload_params({"b": array.array("i", [1, 2, 3])}, partial=True),
             lambda: c.step({"x": [[1.0, "2", 3.0, 4.0], [1.0] * 4]})):
    try:
        call()
        errors.append("accepted")
    except wg.FeedError as e:
        errors.append(str(e))
[same, before == params(c), errors, c.step(feed(5)) == twin.step(feed(5)), params(c) == params(twin)]
''')
    same, unchanged, errors, next_same, params_same = out
    assert same == [True, True] and unchanged and next_same and params_same
    for e in errors[:3]:
        assert "input 'x': NaN at index [1, 2] (flat position 6)" in e, e
    assert "'b': NaN at index 1" in errors[3], errors[3]
    assert "'b'" in errors[4] and "array('i')" in errors[4], errors[4]
    assert "input 'x'" in errors[5] and "'2'" in errors[5] and "index [0, 1]" in errors[5], errors[5]


@browser
def test_destroy_then_every_call_raises_in_the_browser(s):
    out = s.run('''
c = compile_net()
f = c.compile_forward(lambda m, inp: inp["x"] @ m.W, inputs={"x": [2, 4]})
c.step(feed(0))
c.destroy()
msgs = []
for call in (lambda: c.step(feed(0)), c.download_params, c.reset,
             lambda: c.upload_params({"b": [1.0, 2.0, 3.0]}, partial=True),
             lambda: f.run(feed(0))):
    try:
        call()
        msgs.append("no error")
    except wg.DestroyedError as e:
        msgs.append(str(e))
msgs
''')
    assert len(out) == 5 and all("destroyed" in m for m in out), out
    assert out[1].startswith("download_params(): "), out[1]


@browser
def test_check_finite_in_the_browser(s):
    out = s.run('''
class Root(Module):
    def __init__(self):
        super().__init__()
        self.w = self.param([3], init=wg.init.literal([0.5, 1.0, 2.0]))

def compile_root(**kw):
    return wg.compile_module(Root, lambda m, inp: ops.sum_all(ops.sqrt(m.w * inp["x"])),
                             inputs={"x": [3]}, optimizer=optim.Adam(lr=0.1), backend="webgpu", **kw)

c, twin = compile_root(check_finite=True), compile_root()
c.step({"x": [1.0, 2.0, 0.5]}); twin.step({"x": [1.0, 2.0, 0.5]})
before = params(c)
try:
    c.step({"x": [1.0, -1.0, 1.0]})
    msg = "accepted"
except wg.NonFiniteError as e:
    msg = str(e)
[msg, before == params(c), c.step({"x": [1.0, 2.0, 0.5]}) == twin.step({"x": [1.0, 2.0, 0.5]}),
 params(c) == params(twin)]
''')
    msg, unchanged, next_same, params_same = out
    assert "the loss is nan" in msg and "refused" in msg, msg
    assert unchanged and next_same and params_same


@browser
@pytest.mark.parametrize("recovery", ["memory", "/tmp/recovery.safetensors"])
def test_lost_device_then_recover_in_the_browser(s, recovery):
    """recovery="memory", or a checkpoint file in Pyodide's file system."""
    want = reference_losses(range(6))
    out = s.run(f'''
from webgrad.backends.webgpu import WebGPUBackend
from webgrad.backends.webgpu_browser import BrowserHost, request_device
host = BrowserHost(await request_device(new=True))     # a device of its own: the shared one lives
c = compile_net(WebGPUBackend(host), recovery={recovery!r})
losses = [c.step(feed(k)) for k in range(3)]
host.device.destroy()
try:
    c.step(feed(3))
    lost = "no error"
except wg.DeviceLostError as e:
    lost = str(e)
restored = c.recover()
losses += [c.step(feed(k)) for k in range(3, 6)]
[losses, lost, restored, c.backend.host._gpu is not host._gpu]
''')
    losses, lost, restored, new_device = out
    assert "lost" in lost and "recover()" in lost, lost
    assert restored == 3 and new_device
    assert losses == pytest.approx(want, rel=1e-5)  # WebGPU vs the numpy reference
