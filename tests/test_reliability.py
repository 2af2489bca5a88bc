"""Reliability of the runtime API: bad values refused, nothing lost, state recoverable.

Each case runs on reference, torch and native WebGPU (lavapipe) where it touches a backend.
A refused call must say what is wrong (the input, the position, the value) and change
nothing: parameters, optimizer state and step counter are checked by downloading them and
by stepping on beside a twin module that never saw the bad call (equal losses, equal
parameters). The oracles are torch (optimizers, tied weights), numpy (conversions) and the
safetensors package (the checkpoint file). docs/reliability.md states the guarantees.
"""
from __future__ import annotations

import array
import math
import os

import numpy as np
import pytest
import torch

import webgrad as wg
from webgrad import (DestroyedError, DeviceLostError, FeedError, Module, NonFiniteError, capture,
                     lr, nn, ops, optim)

THIS = os.path.basename(__file__)


def _webgpu_reason() -> str | None:
    try:
        from webgrad.backends.webgpu_device import shared_device
        shared_device()
        return None
    except Exception as e:  # no wgpu, no adapter
        return f"no native WebGPU adapter: {e}"


_NO_WEBGPU = _webgpu_reason()
BACKENDS = ["reference", "torch",
            pytest.param("webgpu", marks=pytest.mark.skipif(_NO_WEBGPU is not None,
                                                             reason=str(_NO_WEBGPU)))]


def line_of(marker: str) -> int:
    with open(__file__, encoding="utf-8") as f:
        hits = [i for i, ln in enumerate(f, 1) if ln.rstrip().endswith(f"# at:{marker}")]
    assert len(hits) == 1, marker
    return hits[0]


class Net(Module):
    def __init__(self):
        super().__init__()
        self.W = self.param([4, 3], init="kaiming")
        self.b = self.param([3], init="zeros")
        self.E = self.param([5, 3])


def net_loss(m, inp):
    h = ops.tanh(inp["x"] @ m.W + m.b)
    return ops.mean_all(h * h) + ops.mean_all(ops.embedding(m.E, inp["idx"]) * h)


INPUTS = {"x": ([2, 4], "f32"), "idx": ([2], "i32")}


def feed(k: int) -> dict:
    rng = np.random.default_rng(k)
    return {"x": rng.standard_normal((2, 4)).astype(np.float32), "idx": np.array([k % 5, 3])}


def compile_net(backend, **kw):
    kw.setdefault("optimizer", optim.Adam(lr=0.05))
    return wg.compile_module(Net, net_loss, inputs=INPUTS, backend=backend, seed=3, **kw)


def state_of(c) -> dict:
    """Every persistent value: params, Adam moments, kept grads, the step counter."""
    out = {}
    for n in list(c.param_names) + sorted(c._state_names()):
        h = wg.compiled.run_blocking(c.backend.read(n))
        out[n] = np.array(h, copy=True).reshape(h.shape)
    return out


def assert_same_state(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def trained_pair(backend, steps=2, **kw):
    """A module after `steps` steps and its twin, stepped identically."""
    c, twin = compile_net(backend, **kw), compile_net(backend, **kw)
    for k in range(steps):
        assert c.step(feed(k)) == twin.step(feed(k))
    return c, twin


def assert_nothing_changed(c, twin, before):
    assert_same_state(state_of(c), before)
    assert c.step(feed(7)) == twin.step(feed(7))  # the next step is the twin's next step
    assert_same_state(state_of(c), state_of(twin))


# ---------------------------------------------------------------- NaN and bad buffers in feeds

NAN_X = np.ones((2, 4), np.float32)
NAN_X[1, 2] = np.nan


def _nan_forms() -> dict:
    flat = NAN_X.ravel().tolist()
    return {"numpy": NAN_X, "nested_list": NAN_X.tolist(), "array_f": array.array("f", flat),
            "memoryview_f64": memoryview(NAN_X.astype(np.float64)), "bytes": NAN_X.tobytes(),
            "torch": torch.from_numpy(NAN_X)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", list(_nan_forms()))
def test_nan_feed_is_refused_naming_input_and_position(backend, form):
    c, twin = trained_pair(backend)
    before = state_of(c)
    with pytest.raises(FeedError) as e:
        c.step({"x": _nan_forms()[form], "idx": [0, 1]})
    msg = str(e.value)
    assert msg.startswith("step(): input 'x'"), msg
    assert "NaN at index [1, 2]" in msg and "flat position 6" in msg, msg
    assert_nothing_changed(c, twin, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_in_a_forward_run_computes_nan_and_keeps_nothing(backend):
    """run() keeps no state: a NaN input gives the NaN output torch gives, and the
    parameters stay as they were."""
    c, twin = trained_pair(backend)
    before = state_of(c)
    assert math.isnan(c.run({"x": NAN_X, "idx": [0, 1]}))
    f = c.compile_forward(lambda m, inp: ops.tanh(inp["x"] @ m.W), inputs={"x": [2, 4]})
    got = f.run({"x": NAN_X})
    want = torch.tanh(torch.from_numpy(NAN_X) @ torch.from_numpy(c.download_params()["W"]))
    np.testing.assert_array_equal(np.isnan(got), torch.isnan(want).numpy())
    assert_nothing_changed(c, twin, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inf_in_a_feed_is_data_not_an_error(backend):
    """-inf is a legitimate mask value (exp(-inf) = 0); only NaN is refused."""
    f = wg.compile_forward(Net, lambda m, inp: ops.exp(inp["x"]), inputs={"x": [2, 4]},
                           backend=backend)
    x = np.zeros((2, 4), np.float32)
    x[0, 0] = -np.inf
    np.testing.assert_array_equal(f.run({"x": x}), np.exp(x))


# name, feed for input x (f32[2, 4]) or idx (i32[2]), words of the error or the expected values
CONVERTED = [
    ("f64_memoryview_as_f32", "x", memoryview(np.arange(8, dtype=np.float64).reshape(2, 4)),
     np.arange(8, dtype=np.float32).reshape(2, 4)),
    ("f64_array_as_f32", "x", array.array("d", [0.5] * 8), np.full((2, 4), 0.5, np.float32)),
    ("f16_memoryview_as_f32", "x", memoryview(np.full(8, 1.5, np.float16)),
     np.full((2, 4), 1.5, np.float32)),
    ("int16_memoryview_as_i32", "idx", memoryview(np.array([4, 2], np.int16)), np.array([4, 2])),
    ("int64_memoryview_as_i32", "idx", memoryview(np.array([1, 3], np.int64)), np.array([1, 3])),
    ("uint8_array_as_i32", "idx", array.array("B", [2, 0]), np.array([2, 0])),
]


@pytest.mark.parametrize("name,key,value,want", CONVERTED, ids=[c[0] for c in CONVERTED])
def test_typed_buffers_are_converted_by_value(name, key, value, want):
    """Values, not bytes: [1.0, 2.0] as float64 must arrive as 1.0, 2.0 (it once arrived as
    [0, 1.875, 0, 2]); the program's result equals the one for the numpy array."""
    c = compile_net("reference", optimizer=None)
    base = {"x": np.arange(8, dtype=np.float32).reshape(2, 4) / 8, "idx": np.array([1, 2])}
    got = c.run({**base, key: value})
    assert got == c.run({**base, key: want})


BAD_BUFFERS = [
    ("int16_memoryview_for_f32", "x", memoryview(np.ones(8, np.int16)), ["input 'x'", "int16 data"]),
    ("int64_too_big", "idx", np.array([2 ** 32 + 1, 0], np.int64),
     ["input 'idx'", "4294967297", "index [0]", "i32"]),
    ("uint32_too_big", "idx", np.array([0, 2 ** 31], np.uint32), ["input 'idx'", "2147483648", "index [1]"]),
    ("array_q_out_of_range", "idx", array.array("q", [1, -2 ** 40]),
     ["input 'idx'", str(-2 ** 40), "flat position 1", "i32"]),
    ("list_int_out_of_range", "idx", [0, 2 ** 31], ["input 'idx'", "2147483648", "i32"]),
    ("memoryview_q_out_of_range", "idx", memoryview(array.array("q", [5, 2 ** 33])),
     ["input 'idx'", str(2 ** 33)]),
    ("list_with_a_string", "x", [[1.0, 2.0, 3.0, 4.0], [1.0, "2", 3.0, 4.0]],
     ["input 'x'", "str", "'2'", "index [1, 1]"]),
    ("list_with_none", "x", [1.0] * 7 + [None], ["input 'x'", "NoneType", "index 7"]),
    ("bool_indices", "idx", [True, False], ["input 'idx'", "integer", "True"]),
    ("numpy_int_for_f32", "x", np.ones((2, 4), np.int32), ["input 'x'", "int32", "astype"]),
    ("numpy_object", "x", np.array([[1, "a", 2, 3]] * 2, dtype=object), ["input 'x'", "object"]),
]


@pytest.mark.parametrize("name,key,value,words", BAD_BUFFERS, ids=[b[0] for b in BAD_BUFFERS])
def test_bad_buffers_are_refused_clearly(name, key, value, words):
    c, twin = trained_pair("reference")
    before = state_of(c)
    with pytest.raises(FeedError) as e:
        c.step({**feed(0), key: value})
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert_nothing_changed(c, twin, before)


# ---------------------------------------------------------------- upload_params

BAD_UPLOADS = [
    ("nan", {"b": np.array([0.0, np.nan, 1.0], np.float32)}, ["'b'", "NaN at index 1"]),
    ("nan_list", {"W": [[0.0] * 3] * 3 + [[0.0, 0.0, float("nan")]]}, ["'W'", "NaN at index [3, 2]"]),
    ("i32_numpy", {"b": np.array([1, 2, 3], np.int32)}, ["'b'", "int32"]),
    ("i64_numpy", {"b": np.array([1, 2, 3], np.int64)}, ["'b'", "int64"]),
    ("i32_array", {"b": array.array("i", [1, 2, 3])}, ["'b'", "array('i')"]),
    ("i32_memoryview", {"b": memoryview(array.array("i", [1, 2, 3]))}, ["'b'", "i32 data"]),
    ("i32_torch", {"b": torch.tensor([1, 2, 3], dtype=torch.int32)}, ["'b'", "int32"]),
    # the good entry must not land when another is refused
    ("good_then_nan", {"E": np.ones((5, 3), np.float32), "b": [np.nan, 0, 0]}, ["'b'", "NaN"]),
    ("not_a_dict", [np.zeros(3)], ["dict", "list"]),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,params,words", BAD_UPLOADS, ids=[b[0] for b in BAD_UPLOADS])
def test_bad_upload_is_refused_and_changes_nothing(backend, name, params, words):
    c, twin = trained_pair(backend)
    before = state_of(c)
    with pytest.raises(FeedError) as e:
        c.upload_params(params, partial=True)
    msg = str(e.value)
    assert msg.startswith("upload_params(): "), msg
    for w in words:
        assert w in msg, (w, msg)
    assert_nothing_changed(c, twin, before)


# ---------------------------------------------------------------- after destroy()

@pytest.mark.parametrize("backend", BACKENDS)
def test_every_call_after_destroy_raises_clearly(backend):
    c = compile_net(backend)
    fwd = c.compile_forward(lambda m, inp: inp["x"] @ m.W, inputs={"x": [2, 4]})
    c.step(feed(0))
    c.destroy()
    c.destroy()  # twice is harmless
    calls = {"step": lambda: c.step(feed(0)), "run": lambda: c.run(feed(0)),
             "download_params": c.download_params, "download_param_grads": c.download_param_grads,
             "upload_params": lambda: c.upload_params({"b": [1.0, 2.0, 3.0]}, partial=True),
             "reset": c.reset, "reset_optimizer_state": c.reset_optimizer_state,
             "compile_forward": lambda: c.compile_forward(lambda m, inp: m.W, inputs={}),
             "recover": c.recover, "save": lambda: c.save(None),
             "load": lambda: c.load(b"")}
    for method, call in calls.items():
        with pytest.raises(DestroyedError, match=rf"^{method}\(\): this compiled module was destroyed"):
            call()
    # a forward program over the destroyed module's store
    with pytest.raises(DestroyedError, match=r"^run\(\).*destroyed"):
        fwd.run({"x": np.ones((2, 4), np.float32)})


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_program_after_its_own_destroy(backend):
    f = wg.compile_forward(Net, lambda m, inp: inp["x"] @ m.W, inputs={"x": [2, 4]},
                           backend=backend)
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(f.run({"x": x}), x @ f.download_params()["W"], rtol=1e-5)
    f.destroy()
    with pytest.raises(DestroyedError, match=r"^run\(\): this forward program was destroyed"):
        f.run({"x": x})
    with pytest.raises(DestroyedError, match="destroyed"):  # its own store went with it
        f.download_params()
    # a sibling's destroy leaves the training module working
    c = compile_net(backend)
    g = c.compile_forward(lambda m, inp: inp["x"] @ m.W, inputs={"x": [2, 4]})
    g.destroy()
    assert math.isfinite(c.step(feed(0)))


# ---------------------------------------------------------------- capture of an updated parameter

class Vec(Module):
    def __init__(self):
        super().__init__()
        self.w = self.param([3], init=wg.init.literal([0.5, -1.0, 2.0]))


def vec_loss(m, inp):
    capture("w_used", m.w)
    return ops.sum_all(inp["x"] * m.w * m.w)


@pytest.mark.parametrize("backend", BACKENDS)
def test_capture_of_a_parameter_the_step_updates(backend):
    """The capture is the value the step used, before its update (torch: w before opt.step)."""
    c = wg.compile_module(Vec, vec_loss, inputs={"x": [3]}, optimizer=optim.SGD(lr=0.1),
                          backend=backend)
    w = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    x = [1.0, 2.0, 3.0]
    for _ in range(3):
        used = w.detach().clone()
        loss = (torch.tensor(x) * w * w).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        got, caps = c.step({"x": x}, with_captures=True)
        assert got == pytest.approx(loss.item(), rel=1e-6)
        np.testing.assert_allclose(caps["w_used"], used.numpy(), rtol=1e-6)
    np.testing.assert_allclose(c.download_params()["w"], w.detach().numpy(), rtol=1e-6)


# ---------------------------------------------------------------- configuration errors

def test_unknown_schedule_kind_names_kinds_and_line():
    with pytest.raises(ValueError) as e:
        lr.from_dict({"kind": "Exponential", "gamma": 0.9})  # at:kind
    msg = str(e.value)
    assert "lr.from_dict" in msg and "'Exponential'" in msg and "CosineDecay" in msg, msg
    assert f"{THIS}:{line_of('kind')}" in msg, msg


@pytest.mark.parametrize("make,marker", [
    (lambda: lr.cosine_decay(peak=1.0, final=0.0, steps=0), "cos"),  # at:cos
    (lambda: lr.linear_decay(peak=1.0, final=0.0, steps=-3), "lin"),  # at:lin
    (lambda: lr.warmup(peak=1.0, steps=0), "warm"),  # at:warm
    (lambda: lr.from_dict({"kind": "LinearDecay", "peak": 1, "final": 0, "steps": 0}), "dict"),  # at:dict
])
def test_zero_steps_is_refused_at_the_users_line(make, marker):
    with pytest.raises(ValueError) as e:
        make()
    msg = str(e.value)
    assert "steps must be a positive whole number" in msg and f"{THIS}:{line_of(marker)}" in msg, msg


def test_bad_betas_name_the_optimizer_and_line():
    with pytest.raises(ValueError) as e:
        optim.Adam(betas=(1.0, 0.999))  # at:betas
    assert "optim.Adam" in str(e.value) and f"{THIS}:{line_of('betas')}" in str(e.value)


@pytest.mark.parametrize("name,marker,ours,theirs", [
    ("lr", "lr", lambda: optim.Adam(lr=-0.1), lambda p: torch.optim.Adam(p, lr=-0.1)),  # at:lr
    ("eps", "eps", lambda: optim.AdamW(eps=-1e-8), lambda p: torch.optim.AdamW(p, eps=-1e-8)),  # at:eps
    ("weight_decay", "weight_decay", lambda: optim.Adam(weight_decay=-0.1),  # at:weight_decay
     lambda p: torch.optim.Adam(p, weight_decay=-0.1)),
    ("momentum", "momentum", lambda: optim.SGD(lr=0.1, momentum=-0.9),  # at:momentum
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=-0.9)),
    ("nesterov", "nesterov", lambda: optim.SGD(lr=0.1, nesterov=True),  # at:nesterov
     lambda p: torch.optim.SGD(p, lr=0.1, nesterov=True)),
    ("weight_decay", "lion", lambda: optim.Lion(weight_decay=-1.0),  # at:lion
     None),
])
def test_bad_hyperparameters_are_refused_as_torch_refuses_them(name, marker, ours, theirs):
    """Each value torch.optim refuses is refused here too, naming the optimizer, the
    hyper-parameter and the user's line (before: a negative lr trained backwards)."""
    if theirs is not None:
        with pytest.raises(ValueError):
            theirs([torch.zeros(2, requires_grad=True)])
    with pytest.raises(ValueError) as e:
        ours()
    msg = str(e.value)
    assert "optim." in msg and name in msg and f"{THIS}:{line_of(marker)}" in msg, msg
    # torch's accepted edge values stay accepted
    optim.Adam(lr=0.0, eps=0.0, weight_decay=0.0)
    optim.SGD(lr=0.1, momentum=0.9, nesterov=True)


@pytest.mark.parametrize("make", [
    lambda: lr.cosine_decay(peak=-1.0, final=0.0, steps=10),
    lambda: lr.linear_decay(peak=1.0, final=float("nan"), steps=10),
    lambda: lr.warmup(peak=1.0, steps=5, after=-0.5),
    lambda: lr.from_dict({"kind": "Constant", "lr": float("inf")}),
    lambda: optim.SGD(lr=0.1, clip_norm=0.0),
])
def test_negative_or_non_finite_rates_are_refused(make):
    with pytest.raises(ValueError, match="must be a finite number >= 0|clip_norm must be a number > 0"):
        make()


class Lin(Module):
    def __init__(self):
        super().__init__()
        self.W = self.param([3, 2], init=wg.init.literal([[0.3, -0.2], [0.5, 0.1], [-0.4, 0.25]]))


def lin_loss(m, inp):
    d = inp["x"] @ m.W - inp["y"]
    return ops.mean_all(d * d)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,ours,theirs", [
    ("adam", lambda: optim.Adam(lr=0.1, betas=(0.0, 0.999)),
     lambda p: torch.optim.Adam(p, lr=0.1, betas=(0.0, 0.999))),
    ("adamw_b2_0", lambda: optim.AdamW(lr=0.1, betas=(0.0, 0.0), weight_decay=0.1),
     lambda p: torch.optim.AdamW(p, lr=0.1, betas=(0.0, 0.0), weight_decay=0.1)),
])
def test_beta_zero_matches_torch(backend, name, ours, theirs):
    """torch accepts beta1 = 0 (no momentum); math.log(0) used to refuse it."""
    c = wg.compile_module(Lin, lin_loss, inputs={"x": [4, 3], "y": [4, 2]}, optimizer=ours(),
                          backend=backend)
    W = torch.tensor([[0.3, -0.2], [0.5, 0.1], [-0.4, 0.25]], requires_grad=True)
    opt = theirs([W])
    rng = np.random.default_rng(0)
    for _ in range(5):
        x, y = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
        loss = ((torch.from_numpy(x) @ W - torch.from_numpy(y)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        # WebGPU's exp/rsqrt differ from torch's in the last bits; Adam without momentum
        # (beta1 = 0) normalises each step, so a few ulp of gradient move the update a little
        assert c.step({"x": x, "y": y}) == pytest.approx(loss.item(), rel=1e-4)
    np.testing.assert_allclose(c.download_params()["W"], W.detach().numpy(), rtol=1e-3, atol=1e-5)


# ---------------------------------------------------------------- weight tying

class Tied(Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3, init_w=wg.init.randn(0.5))
        self.out = self.emb.W  # the output projection IS the embedding table


def tied_loss(m, inp):
    h = ops.tanh(ops.embedding(m.emb.W, inp["idx"]))   # [4, 3]
    logits = h @ ops.transpose(m.out, (1, 0))          # [4, 5]
    return nn.cross_entropy_last(logits, inp["tgt"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_tied_weights_are_one_parameter(backend):
    c = wg.compile_module(Tied, tied_loss, inputs={"idx": ([4], "i32"), "tgt": ([4], "i32")},
                          optimizer=optim.Adam(lr=0.1), backend=backend)
    assert c.param_names == ["emb.W"]
    E = torch.tensor(c.download_params()["emb.W"], requires_grad=True)
    opt = torch.optim.Adam([E], lr=0.1)
    for k in range(3):
        idx, tgt = [k % 5, 1, 2, 4], [0, 3, (k + 2) % 5, 1]
        logits = torch.tanh(E[torch.tensor(idx)]) @ E.T
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(tgt))
        opt.zero_grad()
        loss.backward()
        grad = E.grad.clone()  # the sum of both uses' gradients
        opt.step()
        assert c.step({"idx": idx, "tgt": tgt}) == pytest.approx(loss.item(), rel=1e-5)
        np.testing.assert_allclose(c.download_param_grads()["emb.W"], grad.numpy(), rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(c.download_params()["emb.W"], E.detach().numpy(), rtol=1e-3, atol=1e-5)


# ---------------------------------------------------------------- rank-0 results

class Scalar(Module):
    def __init__(self):
        super().__init__()
        self.s = self.param([], init=wg.init.literal(1.5))


@pytest.mark.parametrize("backend", BACKENDS)
def test_rank0_results_have_shape_empty(backend):
    f = wg.compile_forward(Scalar, lambda m, inp: ops.sum_all(inp["x"]) * m.s, inputs={"x": [3]},
                           backend=backend)
    out = f.run({"x": [1.0, 2.0, 3.0]})
    assert out.shape == () and float(out) == 9.0  # torch.sum gives shape () too
    c = wg.compile_module(Scalar, lambda m, inp: m.s * m.s, inputs={}, optimizer=None, backend=backend)
    c.step({})
    assert c.download_params()["s"].shape == ()
    assert c.download_param_grads()["s"].shape == () and float(c.download_param_grads()["s"]) == 3.0


def test_one_element_host_arrays_convert_like_numpy():
    """Without numpy (the browser) results are HostArrays: float()/int() of a rank-0 one
    and item() of a one-element one behave as numpy's, and the rest is refused as numpy
    refuses it."""
    h, a = wg.HostArray("f32", [9.5], shape=()), np.array(9.5, np.float32)
    assert (float(h), int(h), h.item()) == (float(a), int(a), a.item())
    for shape, data in (((1,), [-2.0]), ((1, 1), [3.0])):
        h, a = wg.HostArray("f32", data, shape=shape), np.array(data, np.float32).reshape(shape)
        assert h.item() == a.item()
        for conv in (float, int):
            with pytest.raises(TypeError):
                conv(a)
            with pytest.raises(TypeError, match="rank-0"):
                conv(h)
    with pytest.raises(ValueError):
        np.array([1.0, 2.0]).item()
    with pytest.raises(ValueError, match="not one"):
        wg.HostArray("f32", [1.0, 2.0]).item()


# ---------------------------------------------------------------- the finite check

class Root(Module):
    def __init__(self):
        super().__init__()
        self.w = self.param([3], init=wg.init.literal([0.5, 1.0, 2.0]))


def root_loss(m, inp):
    # sqrt(w * x): x < 0 makes the loss NaN; x = 0 a finite loss with a 0/0 gradient
    return ops.sum_all(ops.sqrt(m.w * inp["x"]))


def compile_root(backend, **kw):
    return wg.compile_module(Root, root_loss, inputs={"x": [3]}, optimizer=optim.Adam(lr=0.1),
                             backend=backend, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad,words", [
    ([1.0, -1.0, 1.0], ["the loss is nan"]),
    ([1.0, 0.0, 1.0], ["the gradient of 'w'", "flat position 1"]),
])
def test_check_finite_refuses_the_step_and_keeps_the_state(backend, bad, words):
    c, twin = compile_root(backend, check_finite=True), compile_root(backend)
    good = [1.0, 2.0, 0.5]
    for _ in range(2):
        assert c.step({"x": good}) == twin.step({"x": good})
    before = state_of(c)
    with pytest.raises(NonFiniteError) as e:
        c.step({"x": bad})
    msg = str(e.value)
    for w in words + ["refused", "as before"]:
        assert w in msg, (w, msg)
    assert_same_state(state_of(c), before)
    assert c.step({"x": good}) == twin.step({"x": good})
    assert_same_state(state_of(c), state_of(twin))


def test_check_finite_with_the_copy_kept_in_a_checkpoint_file(tmp_path):
    """recovery=path keeps no second copy in memory: a refused step is undone from the file."""
    path = str(tmp_path / "root.safetensors")
    c = compile_root("torch", check_finite=True, recovery=path)
    twin = compile_root("torch")
    assert c.step({"x": [1.0, 2.0, 0.5]}) == twin.step({"x": [1.0, 2.0, 0.5]})
    assert c._guard.state is None and os.path.exists(path)
    with pytest.raises(NonFiniteError, match="the loss is nan"):
        c.step({"x": [1.0, -1.0, 1.0]})
    assert_same_state(state_of(c), state_of(twin))
    assert c.step({"x": [0.5, 0.5, 0.5]}) == twin.step({"x": [0.5, 0.5, 0.5]})


def test_without_check_finite_a_nan_step_goes_through():
    """The check is what makes the difference (a test that could not fail otherwise)."""
    c = compile_root("reference")
    c.step({"x": [1.0, 0.0, 1.0]})
    assert np.isnan(c.download_params()["w"]).any()


# ---------------------------------------------------------------- device loss and recover()

def _private_webgpu():
    from webgrad.backends.webgpu import WebGPUBackend
    from webgrad.backends.webgpu_native import NativeHost
    host = NativeHost(private=True)
    return WebGPUBackend(host), host


@pytest.mark.skipif(_NO_WEBGPU is not None, reason=str(_NO_WEBGPU))
@pytest.mark.parametrize("where", ["memory", "checkpoint"])
def test_lost_device_then_recover_continues_as_if_nothing_happened(where, tmp_path):
    be, host = _private_webgpu()
    path = str(tmp_path / "state.safetensors")
    c = compile_net(be, recovery="memory" if where == "memory" else path)
    fwd = c.compile_forward(lambda m, inp: inp["x"] @ m.W, inputs={"x": [2, 4]})
    twin = compile_net("webgpu")
    losses = [c.step(feed(k)) for k in range(3)]
    assert losses == [twin.step(feed(k)) for k in range(3)]
    host.destroy_device()
    with pytest.raises(DeviceLostError, match=r"^step\(\): .*lost.*recover\(\)"):
        c.step(feed(3))
    with pytest.raises(DeviceLostError, match="recover"):
        c.download_params()
    assert c.recover() == 3                      # the last completed step
    assert c.backend is not be
    assert_same_state(state_of(c), state_of(twin))
    assert [c.step(feed(k)) for k in range(3, 6)] == [twin.step(feed(k)) for k in range(3, 6)]
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(fwd.run({"x": x}), x @ twin.download_params()["W"], rtol=1e-5)
    if where == "checkpoint":  # a safetensors file: the safetensors package reads it
        from safetensors.numpy import load_file
        saved = load_file(path)
        assert_same_state(saved, state_of(twin))


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_recover_restores_the_last_completed_step_on_cpu_executors(backend):
    c, twin = compile_net(backend, recovery="memory"), compile_net(backend)
    for k in range(2):
        assert c.step(feed(k)) == twin.step(feed(k))
    c.backend.write("W", wg.HostArray("f32", [9.0] * 12, shape=(4, 3)))  # state damaged behind its back
    assert c.recover() == 2
    assert_same_state(state_of(c), state_of(twin))
    assert c.step(feed(2)) == twin.step(feed(2))


def test_recover_after_upload_reset_and_load_restores_what_they_wrote():
    """The host copy follows every write from the host, so recover() never undoes one."""
    c = compile_net("reference", recovery="memory")
    c.step(feed(0))
    blob = c.save(None)
    c.upload_params({"b": [1.0, 2.0, 3.0]}, partial=True)
    want = state_of(c)
    c.backend.write("b", wg.HostArray("f32", [9.0] * 3, shape=(3,)))
    c.recover()
    assert_same_state(state_of(c), want)
    c.step(feed(1))
    c.load(blob)
    want = state_of(c)
    c.backend.write("E", wg.HostArray("f32", [9.0] * 15, shape=(5, 3)))
    c.recover()
    assert_same_state(state_of(c), want)
    c.reset()
    want = state_of(c)
    c.backend.write("W", wg.HostArray("f32", [9.0] * 12, shape=(4, 3)))
    c.recover()
    assert_same_state(state_of(c), want)


def test_recover_without_a_copy_says_how_to_get_one():
    c = compile_net("reference")
    with pytest.raises(RuntimeError, match="recovery='memory'"):
        c.recover()


def test_lost_device_without_recovery_says_what_to_do():
    if _NO_WEBGPU:
        pytest.skip(_NO_WEBGPU)
    be, host = _private_webgpu()
    c = compile_net(be)
    c.step(feed(0))
    host.destroy_device()
    with pytest.raises(DeviceLostError, match="recovery='memory'"):
        c.step(feed(1))


@pytest.mark.parametrize("numpy", [True, False])
def test_index_extent_with_and_without_numpy(monkeypatch, numpy):
    """arrays.extent (the index feeds' range check) through numpy's min and max, and through
    Python's where numpy is absent (the browser): both give the values' own extremes."""
    import random
    import webgrad.arrays as arrays
    if not numpy:
        monkeypatch.setattr(arrays, "numpy_or_none", lambda: None)
    rng = random.Random(3)
    for vals in ([5], [-7, 3, 2**31 - 1, -2**31], [rng.randrange(-50, 4096) for _ in range(999)]):
        h = wg.HostArray("i32", vals, shape=(len(vals),))
        assert arrays.extent(h) == (min(vals), max(vals))


def test_nonfinite_scan_without_numpy(monkeypatch):
    """The browser's path (no numpy): a non-finite float64 sum() flags a NaN or inf, a scan
    finds it; inf and -inf together sum to NaN and are found at their own position."""
    import webgrad.arrays as arrays
    monkeypatch.setattr(arrays, "numpy_or_none", lambda: None)
    h = wg.HostArray("f32", [1.0, 3e38, 3e38, 2.0], shape=(4,))
    assert arrays.first_nonfinite(h) is None            # the float64 sum does not overflow
    h[2] = float("-inf")
    assert arrays.first_nonfinite(h) == 2
    h[1] = float("inf")
    assert arrays.first_nonfinite(h) == 1
    with pytest.raises(FeedError, match=r"input 'x': NaN at index \[1, 2\] \(flat position 6\)"):
        arrays.to_host(NAN_X.tolist(), shape=(2, 4), dtype="f32", what="step(): input 'x'")
