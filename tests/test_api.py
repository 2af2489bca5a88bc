"""The runtime API of compiled programs (compiled.py), checked against independent results.

The model (`Net`) has params in nested modules, a list of modules and a dict of modules,
so naming is exercised; its forward is re-implemented in numpy (`numpy_net`) and fed the
downloaded parameters, which is what most checks compare with. Covered: naming,
download/upload (partial, full, refused without any change), reset and
reset_optimizer_state (judged by replaying against a fresh compile), sibling and
standalone forward programs, captures, inspection (param_names, output_shape,
kernel_count, the IR text), the async twins, every accepted input format, the HostArray
path without numpy (in a subprocess where numpy cannot import), i32 index feeds, and
dropout's per-step seeding.
"""
from __future__ import annotations

import array
import asyncio
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import webgrad as wg
from webgrad import FeedError, HostArray, Module, capture, init, ops, optim

BACKENDS = ["reference", "torch"]

B, D_IN, D, D_OUT = 5, 3, 4, 2
PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pkg")


class Lin(Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W = self.param([d_in, d_out], init=init.randn(0.5))
        self.b = self.param([d_out], init="zeros")


class Net(Module):
    def __init__(self):
        super().__init__()
        self.stem = Lin(D_IN, D)
        self.blocks = [Lin(D, D), Lin(D, D)]
        self.heads = {"mean": Lin(D, D_OUT), "scale": Lin(D, D_OUT)}
        self.gain = self.param([D_OUT], init="ones")


NAMES = ["stem.W", "stem.b", "blocks.0.W", "blocks.0.b", "blocks.1.W", "blocks.1.b",
         "heads.mean.W", "heads.mean.b", "heads.scale.W", "heads.scale.b", "gain"]


def lin(p, x):
    return x @ p.W + p.b


def net_forward(m, x):
    h = ops.tanh(lin(m.stem, x))
    for blk in m.blocks:
        h = h + ops.tanh(lin(blk, h))
    capture("hidden", h)
    return (lin(m.heads["mean"], h) + lin(m.heads["scale"], h)) * m.gain


def net_loss(m, inp):
    d = net_forward(m, inp["x"]) - inp["y"]
    return ops.mean_all(d * d)


def numpy_net(p: dict, x: np.ndarray):
    """The same forward in numpy, from downloaded params: (output, hidden)."""
    h = np.tanh(x @ p["stem.W"] + p["stem.b"])
    for i in range(2):
        h = h + np.tanh(h @ p[f"blocks.{i}.W"] + p[f"blocks.{i}.b"])
    mean = h @ p["heads.mean.W"] + p["heads.mean.b"]
    scale = h @ p["heads.scale.W"] + p["heads.scale.b"]
    out = (mean + scale) * p["gain"]
    return out, h


INPUTS = {"x": ([B, D_IN], "f32"), "y": ([B, D_OUT], "f32")}


def compile_net(backend="reference", seed=0, optimizer=None, **kw):
    return wg.compile_module(Net, net_loss, inputs=INPUTS, backend=backend, seed=seed,
                             optimizer=optimizer or optim.Adam(lr=0.05), **kw)


def feeds(n, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((B, D_IN)).astype(np.float32),
             "y": rng.standard_normal((B, D_OUT)).astype(np.float32)} for _ in range(n)]


def numpy_loss(p, feed):
    out, _ = numpy_net(p, feed["x"])
    return float(np.mean((out - feed["y"]) ** 2))


def assert_params_equal(a: dict, b: dict, exact=True):
    assert list(a) == list(b)
    for k in a:
        if exact:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        else:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)


# ---------------------------------------------------------------- naming and inspection

def test_param_names_follow_attribute_paths():
    c = compile_net()
    assert c.param_names == NAMES
    assert c.param_shapes["blocks.1.W"] == (D, D)
    assert c.param_shapes["heads.scale.b"] == (D_OUT,)
    assert list(c.download_params()) == NAMES


def test_inspection():
    c = compile_net()
    assert c.output_shape == ()  # a training step returns the scalar loss
    assert c.kernel_count > 0
    text = str(c.ir)
    lines = text.splitlines()
    node = re.compile(r"^%\d+: (f32|i32)\[[\d,]*\] = \w+( %\d+(, %\d+)*)?( \{.*\})?$")
    tail = re.compile(r"^(output|writeback) [\w./:]+ (=|<-) %\d+$")
    assert all(node.match(ln) or tail.match(ln) for ln in lines), \
        [ln for ln in lines if not (node.match(ln) or tail.match(ln))][:5]
    assert any(" = matmul " in ln for ln in lines)
    assert any(ln.startswith("output loss = %") for ln in lines)
    for name in NAMES:  # the optimizer writes every parameter back
        assert any(ln.startswith(f"writeback {name} <- %") for ln in lines), name
    assert "param {name='blocks.0.W'" in text


# ---------------------------------------------------------------- download / upload

def _new_values(shapes: dict, names, offset=1.0) -> dict:
    return {n: (np.arange(np.prod(shapes[n]), dtype=np.float32).reshape(shapes[n]) * 0.1 + offset)
            for n in names}


def test_upload_partial_then_full():
    c = compile_net()
    before = c.download_params()
    part = _new_values(c.param_shapes, ["blocks.1.b", "gain"])
    c.upload_params(part, partial=True)
    after = c.download_params()
    for n in NAMES:
        np.testing.assert_array_equal(after[n], part[n] if n in part else before[n], err_msg=n)
    full = _new_values(c.param_shapes, NAMES, offset=-2.0)
    c.upload_params(full)
    assert_params_equal(c.download_params(), full)
    # and the program computes with them: its loss equals numpy's on the uploaded values
    feed = feeds(1)[0]
    assert c.run(feed) == pytest.approx(numpy_loss(full, feed), rel=1e-5)


# name, upload argument built from the shapes, partial flag, words the error must contain
BAD_UPLOADS = [
    ("unknown_name", lambda s: {"blocks.2.W": np.zeros((D, D), np.float32)}, True,
     ["'blocks.2.W'", "blocks.0.W"]),
    ("wrong_shape", lambda s: {"stem.W": np.zeros((D, D_IN), np.float32)}, True,
     ["'stem.W'", "[3, 4]", "[4, 3]"]),
    ("wrong_size_flat", lambda s: {"gain": [1.0, 2.0, 3.0]}, True, ["'gain'", "[2]"]),
    ("missing_without_partial", lambda s: {"gain": np.ones(D_OUT, np.float32)}, False,
     ["missing", "'stem.W'", "partial=True"]),
    # one good entry and one bad: the good one must not land either
    ("good_and_bad", lambda s: {"gain": np.full(D_OUT, 7.0, np.float32),
                                "stem.b": np.zeros(D + 1, np.float32)}, True, ["'stem.b'", "[4]"]),
    ("not_an_array", lambda s: {"gain": "1,2"}, True, ["'gain'", "str"]),
]


@pytest.mark.parametrize("name,make,partial,words", BAD_UPLOADS, ids=[b[0] for b in BAD_UPLOADS])
def test_bad_upload_is_refused_and_changes_nothing(name, make, partial, words):
    c = compile_net()
    c.step(feeds(1)[0])
    before = c.download_params()
    with pytest.raises(FeedError) as e:
        c.upload_params(make(c.param_shapes), partial=partial)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert_params_equal(c.download_params(), before)


# ---------------------------------------------------------------- reset

@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_restores_init_and_zeros_optimizer_state(backend):
    data = feeds(4)
    c = compile_net(backend, seed=7)
    init_params = c.download_params()
    # the seed's init: a separate compile with the same seed starts from the same values
    assert_params_equal(compile_net(backend, seed=7).download_params(), init_params)
    assert not np.array_equal(compile_net(backend, seed=8).download_params()["stem.W"],
                              init_params["stem.W"])
    first_loss = c.step(data[0])
    assert first_loss == pytest.approx(numpy_loss(init_params, data[0]), rel=1e-5)
    first_params = c.download_params()
    for feed in data[1:]:
        c.step(feed)
    c.reset()
    assert_params_equal(c.download_params(), init_params)
    # Adam's moments and step counter are zero again: the next step is the first step ever
    assert c.step(data[0]) == first_loss
    assert_params_equal(c.download_params(), first_params)


def test_reset_optimizer_state_keeps_params():
    data = feeds(6)
    c = compile_net(seed=1)
    for feed in data[:3]:
        c.step(feed)
    trained = c.download_params()
    # a reference run: a fresh module given these params, so its optimizer state is new
    fresh = compile_net(seed=2)
    fresh.upload_params(trained)
    c.reset_optimizer_state()
    assert_params_equal(c.download_params(), trained)
    for feed in data[3:]:
        assert c.step(feed) == fresh.step(feed)
    assert_params_equal(c.download_params(), fresh.download_params())
    # negative control: keeping the moments gives a different update
    kept = compile_net(seed=1)
    for feed in data[:4]:
        kept.step(feed)
    fresh2 = compile_net(seed=2)
    fresh2.upload_params(trained)
    fresh2.step(data[3])
    assert not np.array_equal(kept.download_params()["stem.W"], fresh2.download_params()["stem.W"])


def test_keep_grads_match_finite_differences():
    """download_param_grads returns the last step's gradient (before the update), checked
    against central differences of numpy_loss."""
    c = compile_net(optimizer=optim.SGD(lr=0.1), seed=4)
    p = c.download_params()
    feed = feeds(1)[0]
    c.step(feed)
    grads = c.download_param_grads()
    eps = 1e-3
    for name in ("stem.W", "blocks.1.b", "gain"):
        p64 = {k: v.astype(np.float64) for k, v in p.items()}
        for i in range(min(p[name].size, 4)):
            plus, minus = {**p64, name: p64[name].copy()}, {**p64, name: p64[name].copy()}
            plus[name].flat[i] += eps
            minus[name].flat[i] -= eps
            fd = (numpy_loss(plus, feed) - numpy_loss(minus, feed)) / (2 * eps)
            assert grads[name].flat[i] == pytest.approx(fd, rel=1e-3, abs=1e-5), (name, i)


# ---------------------------------------------------------------- forward programs

@pytest.mark.parametrize("backend", BACKENDS)
def test_sibling_forward_sees_the_same_params(backend):
    c = compile_net(backend)
    f = c.compile_forward(lambda m, inp: net_forward(m, inp["x"]), inputs={"x": INPUTS["x"]})
    assert f.output_shape == (B, D_OUT)
    assert f.param_names == NAMES
    data = feeds(4)
    for feed in data[:3]:
        c.step(feed)
    x = data[3]["x"]
    want, _ = numpy_net(c.download_params(), x)
    np.testing.assert_allclose(f.run({"x": x}), want, rtol=1e-5, atol=1e-6)
    # an upload through either handle is seen by both programs
    new = _new_values(c.param_shapes, NAMES, offset=0.5)
    f.upload_params(new)
    assert_params_equal(c.download_params(), new)
    np.testing.assert_allclose(f.run({"x": x}), numpy_net(new, x)[0], rtol=1e-5, atol=1e-6)


def test_sibling_forward_refuses_a_different_model():
    """The sibling re-runs the factory; if that now builds other params (here: a config
    changed in between), sharing the store would be wrong, so it is refused."""
    config = {"width": 3}

    class Sized(Module):
        def __init__(self):
            super().__init__()
            self.W = self.param([2, config["width"]])
    c = wg.compile_module(Sized, lambda m, inp: ops.sum_all(inp["x"] @ m.W), inputs={"x": [2, 2]})
    config["width"] = 4
    with pytest.raises(ValueError, match="different parameters"):
        c.compile_forward(lambda m, inp: inp["x"] @ m.W, inputs={"x": [2, 2]})


def test_standalone_compile_forward():
    f = wg.compile_forward(Net, lambda m, inp: net_forward(m, inp["x"]), inputs={"x": INPUTS["x"]},
                           backend="reference", seed=5)
    p = f.download_params()
    assert_params_equal(p, compile_net(seed=5).download_params())  # same seed, same init
    x = feeds(1)[0]["x"]
    np.testing.assert_allclose(f.run({"x": x}), numpy_net(p, x)[0], rtol=1e-5, atol=1e-6)
    assert f.output_shape == (B, D_OUT) and f.kernel_count > 0


# ---------------------------------------------------------------- captures

def test_captures_in_step_and_run():
    c = compile_net()
    feed = feeds(1)[0]
    before = c.download_params()
    loss, caps = c.step(feed, with_captures=True)
    # the step's activations come from the params before its update
    out, hidden = numpy_net(before, feed["x"])
    assert loss == pytest.approx(float(np.mean((out - feed["y"]) ** 2)), rel=1e-5)
    assert set(caps) == {"hidden"}
    np.testing.assert_allclose(caps["hidden"], hidden, rtol=1e-5, atol=1e-6)
    after = c.download_params()
    loss2, caps2 = c.run(feed, with_captures=True)
    np.testing.assert_allclose(caps2["hidden"], numpy_net(after, feed["x"])[1], rtol=1e-5, atol=1e-6)
    assert loss2 == pytest.approx(numpy_loss(after, feed), rel=1e-5)
    assert isinstance(c.run(feed), float)  # without with_captures: just the value
    f = c.compile_forward(lambda m, inp: net_forward(m, inp["x"]), inputs={"x": INPUTS["x"]})
    out3, caps3 = f.run({"x": feed["x"]}, with_captures=True)
    np.testing.assert_allclose(caps3["hidden"], caps2["hidden"], rtol=1e-6)


# ---------------------------------------------------------------- async twins

def _asyncio_run(coro):
    """asyncio.run in a thread of its own: while a browser test's Playwright session lives,
    the main thread already runs an asyncio loop (Playwright's sync API), which refuses it."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def test_async_twins_equal_blocking():
    data = feeds(3)
    sync, asy = compile_net(seed=3), compile_net(seed=3)

    async def drive():
        losses = [await asy.step_async(feed) for feed in data]
        loss_c, caps = await asy.step_async(data[0], with_captures=True)
        run = await asy.run_async(data[1])
        params = await asy.download_params_async()
        grads = await asy.download_param_grads_async()
        return losses, loss_c, caps, run, params, grads

    losses, loss_c, caps, run, params, grads = _asyncio_run(drive())
    assert losses == [sync.step(feed) for feed in data]
    loss_s, caps_s = sync.step(data[0], with_captures=True)
    assert loss_c == loss_s
    np.testing.assert_array_equal(caps["hidden"], caps_s["hidden"])
    assert run == sync.run(data[1])
    assert_params_equal(params, sync.download_params())
    assert_params_equal(grads, sync.download_param_grads())

    new = _new_values(sync.param_shapes, ["gain"])
    _asyncio_run(asy.upload_params_async(new, partial=True))
    np.testing.assert_array_equal(asy.download_params()["gain"], new["gain"])
    _asyncio_run(asy.reset_async())
    assert_params_equal(asy.download_params(), compile_net(seed=3).download_params())
    # the optimizer's state after steps, then reset: the next step updates the parameters as
    # a fresh module's first step does (Adam's moments and step count back to zero)
    asy.step(data[0])
    fresh = compile_net(seed=3)
    _asyncio_run(asy.upload_params_async(fresh.download_params()))
    _asyncio_run(asy.reset_optimizer_state_async())
    assert asy.step(data[1]) == fresh.step(data[1])
    assert_params_equal(asy.download_params(), fresh.download_params())


# ---------------------------------------------------------------- input formats

def _f32_forms(a: np.ndarray) -> dict:
    return {"numpy": a, "numpy_f64": a.astype(np.float64), "array_f": array.array("f", a.ravel()),
            "array_d": array.array("d", a.ravel().astype(np.float64)),
            "memoryview": memoryview(np.ascontiguousarray(a)), "bytes": a.tobytes(),
            "bytearray": bytearray(a.tobytes()), "nested_list": a.tolist(),
            "flat_list": a.ravel().tolist(), "hostarray": HostArray("f32", a.ravel().tolist(), shape=a.shape)}


@pytest.mark.parametrize("form", list(_f32_forms(np.zeros((1, 1), np.float32))))
def test_f32_input_formats(form):
    c = compile_net()
    feed = feeds(1)[0]
    want = c.run(feed)
    assert want == pytest.approx(numpy_loss(c.download_params(), feed), rel=1e-5)
    got = c.run({"x": _f32_forms(feed["x"])[form], "y": _f32_forms(feed["y"])[form]})
    assert got == want


class Table(Module):
    def __init__(self):
        super().__init__()
        self.E = self.param([6, 3], init=init.randn(1.0))


def table_loss(m, inp):
    rows = ops.embedding(m.E, inp["idx"])             # [2, 4, 3]
    return ops.sum_all(rows * inp["w"])


IDX = [[0, 5, 5, 2], [2, 2, 1, 0]]


def _i32_forms(a: np.ndarray) -> dict:
    return {"numpy_i32": a.astype(np.int32), "numpy_i64": a.astype(np.int64),
            "array_i": array.array("i", a.ravel().tolist()), "array_q": array.array("q", a.ravel().tolist()),
            "bytes": a.astype(np.int32).tobytes(), "memoryview": memoryview(a.astype(np.int32)),
            "nested_list": a.tolist()}


@pytest.mark.parametrize("form", list(_i32_forms(np.zeros(1, np.int32))))
def test_i32_index_inputs(form):
    """Embedding lookups with i32 indices; the table's gradient sums repeated rows."""
    c = wg.compile_module(Table, table_loss, inputs={"idx": ([2, 4], "i32"), "w": [2, 4, 3]},
                          optimizer=None, seed=1)
    w = np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)
    idx = np.array(IDX)
    E = c.download_params()["E"]
    loss = c.step({"idx": _i32_forms(idx)[form], "w": w})
    assert loss == pytest.approx(float(np.sum(E[idx] * w)), rel=1e-5)
    want = np.zeros_like(E)
    np.add.at(want, idx.ravel(), w.reshape(-1, 3))
    np.testing.assert_allclose(c.download_param_grads()["E"], want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- without numpy

NO_NUMPY_SCRIPT = textwrap.dedent("""
    import array, json, sys
    sys.modules["numpy"] = None          # `import numpy` now raises ImportError
    sys.path.insert(0, sys.argv[1])
    import webgrad as wg
    from math import prod
    from webgrad import HostArray, Module, init, ops, optim
    from webgrad.backends.interpreter import Interpreter

    class Lin(Module):
        def __init__(self):
            super().__init__()
            self.W = self.param([3, 4], init=init.randn(0.5))
            self.b = self.param([4], init="zeros")

    def loss_fn(m, inp):
        return ops.mean_all(ops.tanh(inp["x"] @ m.W + m.b))

    class SumX:
        # stands in for a GPU program: "computes" sum(x), which is enough to see the
        # feed conversion and the step plumbing work without numpy
        async def run(self, feeds, fetch):
            return {"loss": HostArray("f32", [sum(feeds["x"])], shape=())}

    class Store(Interpreter):
        name = "store"
        impls = {}
        def from_host(self, h): return h
        def to_host(self, x, dtype): return x
        def zeros(self, shape, dtype): return HostArray(dtype, [0] * prod(shape), shape=shape)
        def prepare(self, graph): return SumX()

    out = {}
    try:
        wg.compile_module(Lin, loss_fn, inputs={"x": [2, 3]}, backend="reference")
    except ImportError as e:
        out["reference_error"] = str(e)
    c = wg.compile_module(Lin, loss_fn, inputs={"x": [2, 3]}, optimizer=optim.Adam(),
                          backend=Store(), seed=11)
    out["ir_has_matmul"] = " = matmul " in str(c.ir)
    p = c.download_params()
    h = p["W"]
    out["type"] = type(h).__name__
    out["shape"] = list(h.shape)
    out["W"] = h.tolist()
    mv = memoryview(h)
    out["buffer"] = [mv.format, mv.nbytes]
    x = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]]
    flat = [v for row in x for v in row]
    out["losses"] = [c.step({"x": x}), c.step({"x": array.array("f", flat)}),
                     c.step({"x": memoryview(array.array("f", flat))}),
                     c.step({"x": array.array("f", flat).tobytes()})]
    c.upload_params({"b": [0.5, 1.5, 2.5, 3.5]}, partial=True)
    out["b"] = c.download_params()["b"].tolist()
    out["numpy_absent"] = sys.modules["numpy"] is None
    print(json.dumps(out))
""")


def test_works_without_numpy():
    r = subprocess.run([sys.executable, "-c", NO_NUMPY_SCRIPT, PKG], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "numpy" in out["reference_error"] and "backend='auto'" in out["reference_error"]
    assert out["ir_has_matmul"] and out["numpy_absent"]
    assert out["type"] == "HostArray" and out["shape"] == [3, 4]
    assert out["buffer"] == ["f", 48]
    assert out["losses"] == [pytest.approx(21.5)] * 4
    assert out["b"] == [0.5, 1.5, 2.5, 3.5]

    # the init drawn without numpy is the one the reference backend gets for this seed
    class Lin(Module):
        def __init__(self):
            super().__init__()
            self.W = self.param([3, 4], init=init.randn(0.5))
            self.b = self.param([4], init="zeros")
    ref = wg.compile_module(Lin, lambda m, inp: ops.mean_all(ops.tanh(inp["x"] @ m.W + m.b)),
                            inputs={"x": [2, 3]}, seed=11).download_params()
    np.testing.assert_array_equal(np.array(out["W"], np.float32), ref["W"])


def test_hostarray_behaves_like_an_array():
    h = HostArray("f32", [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], shape=(2, 3))
    assert h.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    np.testing.assert_array_equal(np.asarray(memoryview(h)).reshape(h.shape),
                                  np.arange(1, 7, dtype=np.float32).reshape(2, 3))
    assert HostArray("i32", [7], shape=()).tolist() == 7


# ---------------------------------------------------------------- dropout seeding

class Gate(Module):
    def __init__(self):
        super().__init__()
        self.w = self.param([64], init="ones")


def gate_loss(m, inp):
    y = ops.dropout(inp["x"] * m.w, 0.5)
    capture("y", y)
    return ops.mean_all(y)


def test_dropout_is_seeded_per_step():
    def run(n):
        c = wg.compile_module(Gate, gate_loss, inputs={"x": [16, 64]}, optimizer=optim.SGD(lr=0.0))
        return [c.step({"x": np.ones((16, 64), np.float32)}, with_captures=True) for _ in range(n)]
    a, b = run(3), run(3)
    masks = [caps["y"] for _, caps in a]
    # same program, same steps: the same masks and losses
    assert [loss for loss, _ in a] == [loss for loss, _ in b]
    for (_, ca), (_, cb) in zip(a, b):
        np.testing.assert_array_equal(ca["y"], cb["y"])
    # inverted dropout: kept entries are scaled by 1/(1-p), about half are kept
    for m in masks:
        assert set(np.unique(m)) <= {0.0, 2.0}
        assert 0.4 < np.mean(m == 2.0) < 0.6
        assert a[0][0] == pytest.approx(float(np.mean(masks[0])), rel=1e-6)
    # a new step draws a new mask
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_compile_forward_is_an_inference_graph(backend):
    # dropout keeps everything in compile_forward's graphs (sibling or standalone), unless
    # training=True asks for the training behaviour
    x = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    c = wg.compile_module(Gate, gate_loss, inputs={"x": [16, 64]}, optimizer=optim.SGD(lr=0.0),
                          backend=backend)
    fwd = lambda m, inp: ops.dropout(inp["x"] * m.w, 0.5)  # noqa: E731
    infer = c.compile_forward(fwd, inputs={"x": [16, 64]})
    np.testing.assert_array_equal(infer.run({"x": x}), x)
    alone = wg.compile_forward(Gate, fwd, inputs={"x": [16, 64]}, backend=backend)
    np.testing.assert_array_equal(alone.run({"x": x}), x)
    train = c.compile_forward(fwd, inputs={"x": [16, 64]}, training=True)
    y = train.run({"x": x})
    kept = y != 0
    assert 0.4 < kept.mean() < 0.6
    np.testing.assert_allclose(y[kept], 2 * x[kept], rtol=1e-6)
    assert not any(n.op == "rand_uniform" for n in infer.ir.nodes)
