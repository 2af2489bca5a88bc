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


SEMANTICS = '''
from webgrad import nn, capture

class Emb(Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.W = self.param([3, 5])

def emb_loss(m, inp):
    h = m.emb(inp["idx"])
    return nn.cross_entropy_last(h @ m.W, inp["t"])

class Tied(Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3, init_w=wg.init.randn(0.5))
        self.out = self.emb.W  # the output projection IS the embedding table

def tied_loss(m, inp):
    h = ops.tanh(ops.embedding(m.emb.W, inp["idx"]))
    return nn.cross_entropy_last(h @ ops.transpose(m.out, (1, 0)), inp["tgt"])

class Vec(Module):
    def __init__(self):
        super().__init__()
        self.w = self.param([3], init=wg.init.literal([0.5, -1.0, 2.0]))

def vec_loss(m, inp):
    capture("w_used", m.w)
    return ops.sum_all(inp["x"] * m.w * m.w)

class Scalar(Module):
    def __init__(self):
        super().__init__()
        self.s = self.param([], init=wg.init.literal(1.5))

EMB_FEEDS = [{"idx": [[(3 * k + i + 4 * j) % 5 for j in range(4)] for i in range(2)],
              "t": [[(k + 2 * i + j) % 5 for j in range(4)] for i in range(2)]} for k in range(3)]

def semantics(backend):
    """Each case of tests/test_semantics.py / test_reliability.py that touches the executor,
    as plain values: the worker's WebGPU answers are compared with CPython's reference."""
    out = {}
    c = wg.compile_module(Emb, emb_loss, inputs={"idx": ([2, 4], "i32"), "t": ([2, 4], "i32")},
                          optimizer=optim.Adam(lr=0.1), backend=backend, seed=3)
    losses = [c.step(EMB_FEEDS[k]) for k in range(2)]
    before = params(c)
    refusals = []
    for name, value in (("idx", 7), ("idx", -1), ("t", 9)):
        bad = {k: [row[:] for row in v] for k, v in EMB_FEEDS[2].items()}
        bad[name][1][1] = value
        try:
            c.step(bad)
            refusals.append("accepted")
        except wg.FeedError as e:
            refusals.append(str(e))
    out["refusals"] = refusals
    out["unchanged"] = before == params(c)
    out["emb_losses"] = losses + [c.step(EMB_FEEDS[2])]  # the step after: as if never refused
    t = wg.compile_module(Tied, tied_loss, inputs={"idx": ([4], "i32"), "tgt": ([4], "i32")},
                          optimizer=optim.Adam(lr=0.1), backend=backend, seed=1)
    out["tied_names"] = t.param_names
    out["tied_losses"] = [t.step({"idx": [k % 5, 1, 2, 4], "tgt": [0, 3, (k + 2) % 5, 1]})
                          for k in range(3)]
    v = wg.compile_module(Vec, vec_loss, inputs={"x": [3]}, optimizer=optim.SGD(lr=0.1),
                          backend=backend)
    out["captures"] = [v.step({"x": [1.0, 2.0, 3.0]}, with_captures=True)[1]["w_used"].tolist()
                       for _ in range(3)]
    f = wg.compile_forward(Scalar, lambda m, inp: ops.sum_all(inp["x"]) * m.s,
                           inputs={"x": [3]}, backend=backend)
    r = f.run({"x": [1.0, 2.0, 3.0]})
    out["rank0"] = [tuple(r.shape), float(r)]
    s = wg.compile_forward(Module, lambda m, inp: ops.sum(inp["x"], 0),
                           inputs={"x": ([5000, 8], "i32")}, backend=backend)
    out["i32_sum"] = s.run({"x": [[(7 * i + j) % 2001 - 1000 for j in range(8)]
                                  for i in range(5000)]}).tolist()
    return out
'''
exec(SEMANTICS)


@browser
def test_semantics_cases_in_the_browser(s):
    """Out-of-range fed indices refused (nothing changed), tied weights as one parameter, the
    capture of an updated parameter, rank-0 results and a long i32 sum: the worker's WebGPU
    gives what CPython's reference executor gives."""
    s.run(SEMANTICS)
    got = s.run('semantics("webgpu")')
    want = semantics("reference")
    for msg, words in zip(got["refusals"], (["input 'idx'", "holds 7", "[0, 5)", "embedding"],
                                            ["input 'idx'", "holds -1", "negative indices"],
                                            ["input 't'", "holds 9", "cross_entropy_last"])):
        for w in words:
            assert w in msg, (w, msg)
    assert got["unchanged"]
    assert got["emb_losses"] == pytest.approx(want["emb_losses"], rel=1e-5)
    assert got["tied_names"] == ["emb.W"] == want["tied_names"]
    assert got["tied_losses"] == pytest.approx(want["tied_losses"], rel=1e-5)
    for g, w in zip(got["captures"], want["captures"]):
        assert g == pytest.approx(w, rel=1e-6)
    assert want["captures"][0] == [0.5, -1.0, 2.0] and want["captures"][1] != want["captures"][0]
    assert tuple(got["rank0"][0]) == () == tuple(want["rank0"][0]) and got["rank0"][1] == 9.0
    exact = [sum((7 * i + j) % 2001 - 1000 for i in range(5000)) for j in range(8)]
    assert got["i32_sum"] == exact == want["i32_sum"]
