"""Errors say what is wrong, where, and what to do; a refused call changes nothing.

Trace-time errors must name the op, the operand shapes and the user's source line (this
file's name and the line number of the offending call, found from `# err:` markers so
the table survives edits). Step-time feed errors must say what the program takes, and
leave parameters, optimizer state and the step counter untouched: after each refused
call the next good step must equal the same step of a twin module that never saw a bad
call. The rest cover misuse outside a graph, configuration mistakes, and uploads.
"""
from __future__ import annotations

import array

import numpy as np
import pytest

import webgrad as wg
from webgrad import FeedError, Module, ShapeError, ops, optim

THIS = __file__.rsplit("/", 1)[-1]


def line_of(marker: str) -> int:
    """The line number in this file that carries `# err:<marker>`."""
    with open(__file__, encoding="utf-8") as f:
        hits = [i for i, ln in enumerate(f, 1) if ln.rstrip().endswith(f"# err:{marker}")]
    assert len(hits) == 1, marker
    return hits[0]


class M(Module):
    def __init__(self):
        super().__init__()
        self.W = self.param([4, 5])
        self.b = self.param([5], init="zeros")


# ---------------------------------------------------------------- trace time

def bad_matmul(m, inp):
    return ops.sum_all(inp["x"] @ m.W)  # err:matmul


def bad_add(m, inp):
    h = inp["x"] @ m.W
    return ops.sum_all(h + inp["y"])  # err:add


def bad_reshape(m, inp):
    return ops.sum_all(ops.reshape(m.W, (3, 7)))  # err:reshape


def int_matmul(m, inp):
    return ops.sum_all(inp["idx"] @ m.W)  # err:int_matmul


def bad_axis(m, inp):
    return ops.sum_all(ops.sum(m.W, 2))  # err:axis


def nonscalar(m, inp):
    return inp["x"] @ m.W + m.b  # err:nonscalar


def int_loss(m, inp):
    return ops.sum_all(inp["idx"])  # err:int_loss


# name, loss fn, inputs, exception, words the message must contain, marker of the line
TRACE_ERRORS = [
    ("matmul", bad_matmul, {"x": [8, 3]}, ShapeError,
     ["matmul", "f32[8,3]", "f32[4,5]", "3 vs 4"], "matmul"),
    ("broadcast", bad_add, {"x": [8, 4], "y": [8, 4]}, ShapeError,
     ["add", "f32[8,5]", "f32[8,4]", "do not broadcast"], "add"),
    ("reshape", bad_reshape, {}, ShapeError, ["reshape", "[4, 5]", "[3, 7]", "20", "21"], "reshape"),
    ("int_matmul", int_matmul, {"idx": ([8, 4], "i32")}, ShapeError,
     ["matmul", "i32[8,4]", "f32"], "int_matmul"),
    ("axis", bad_axis, {}, ShapeError, ["axis 2", "f32[4, 5]"], "axis"),
    ("nonscalar_loss", nonscalar, {"x": [8, 4]}, ValueError,
     ["scalar", "f32[8, 5]", "mean_all", "sum_all"], "nonscalar"),
    ("int_loss", int_loss, {"idx": ([8, 4], "i32")}, ValueError, ["f32", "i32[]"], "int_loss"),
]


@pytest.mark.parametrize("name,fn,inputs,exc,words,marker", TRACE_ERRORS, ids=[t[0] for t in TRACE_ERRORS])
def test_trace_errors_name_op_shapes_and_line(name, fn, inputs, exc, words, marker):
    with pytest.raises(exc) as e:
        wg.compile_module(M, fn, inputs=inputs)
    msg = str(e.value)
    for w in words:
        assert w in msg, (w, msg)
    assert f"{THIS}:{line_of(marker)}" in msg, msg


def test_shape_error_is_a_value_error():
    # so that `except ValueError` in user code also catches it
    assert issubclass(ShapeError, ValueError) and issubclass(FeedError, ValueError)


# ---------------------------------------------------------------- step time

def step_loss(m, inp):
    h = ops.tanh(inp["x"] @ m.W + m.b)
    return ops.mean_all(h * h) + ops.mean_all(ops.embedding(m.W, inp["idx"]))


STEP_INPUTS = {"x": ([8, 4], "f32"), "idx": ([3], "i32")}


def good_feed(k=0):
    rng = np.random.default_rng(k)
    return {"x": rng.standard_normal((8, 4)).astype(np.float32), "idx": np.array([0, 3, 1])}


DECLARED = "'x' f32[8, 4], 'idx' i32[3]"

# name, bad feed from a good one, words the message must contain
BAD_FEEDS = [
    ("missing", lambda f: {"x": f["x"]}, ["missing input 'idx'", DECLARED]),
    ("unknown", lambda f: {**f, "z": f["x"]}, ["unknown input 'z'", DECLARED]),
    ("misspelled", lambda f: {"X": f["x"], "idx": f["idx"]}, ["'X'", DECLARED]),
    ("transposed", lambda f: {**f, "x": f["x"].T.copy()}, ["input 'x'", "[8, 4]", "[4, 8]"]),
    ("extra_axis", lambda f: {**f, "x": f["x"][..., None]}, ["input 'x'", "[8, 4, 1]"]),
    ("too_few_values", lambda f: {**f, "x": f["x"].ravel()[:20].tolist()},
     ["input 'x'", "[8, 4]", "got shape [20]"]),
    ("float_indices", lambda f: {**f, "idx": f["idx"].astype(np.float32)},
     ["input 'idx'", "integer", "float32"]),
    ("float_list_indices", lambda f: {**f, "idx": [0.0, 1.5, 2.0]}, ["input 'idx'", "integer"]),
    ("int_data_for_f32", lambda f: {**f, "x": array.array("i", [1] * 32)},
     ["input 'x'", "f32", "array('i')"]),
    ("i32_bytes_for_f32", lambda f: {**f, "x": memoryview(np.ones(32, np.int32))}, ["input 'x'", "i32 data"]),
    ("wrong_byte_count", lambda f: {**f, "x": b"\0" * 12}, ["input 'x'", "128 bytes", "12 bytes"]),
    ("a_string", lambda f: {**f, "x": "1,2,3"}, ["input 'x'", "str", "numpy array"]),
    ("not_a_dict", lambda f: [f["x"], f["idx"]], ["dict", "list"]),
]


@pytest.mark.parametrize("name,make,words", BAD_FEEDS, ids=[b[0] for b in BAD_FEEDS])
def test_bad_feed_is_refused_and_changes_nothing(name, make, words):
    c = wg.compile_module(M, step_loss, inputs=STEP_INPUTS, optimizer=optim.Adam(lr=0.1), seed=2)
    twin = wg.compile_module(M, step_loss, inputs=STEP_INPUTS, optimizer=optim.Adam(lr=0.1), seed=2)
    for k in range(2):  # nonzero moments and step counter before the bad call
        assert c.step(good_feed(k)) == twin.step(good_feed(k))
    before = c.download_params()
    for method in (c.step, c.run):
        with pytest.raises(FeedError) as e:
            method(make(good_feed(5)))
        msg = str(e.value)
        assert msg.startswith(f"{method.__name__}(): "), msg
        for w in words:
            assert w in msg, (w, msg)
    after = c.download_params()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
    # the optimizer state and step counter too: the next step is the twin's next step
    assert c.step(good_feed(2)) == twin.step(good_feed(2))
    for k, v in c.download_params().items():
        np.testing.assert_array_equal(v, twin.download_params()[k])


def test_upload_of_wrong_shape():
    c = wg.compile_module(M, step_loss, inputs=STEP_INPUTS)
    before = c.download_params()
    with pytest.raises(FeedError, match=r"upload_params\(\): 'W': expects shape \[4, 5\].*\[5, 4\]"):
        c.upload_params({"W": np.zeros((5, 4), np.float32)}, partial=True)
    np.testing.assert_array_equal(c.download_params()["W"], before["W"])


# ---------------------------------------------------------------- misuse of Tensors

def test_tensor_used_outside_tracing():
    leaked = []

    def keep(m, inp):
        leaked.append(m.W)
        return ops.sum_all(m.W)
    wg.compile_module(M, keep, inputs={})
    with pytest.raises(RuntimeError) as e:
        leaked[0] + 1.0  # err:outside
    assert "only work while tracing" in str(e.value)
    assert f"{THIS}:{line_of('outside')}" in str(e.value)
    assert "compile_module" in str(e.value)
    with pytest.raises(RuntimeError, match="only work while tracing"):
        ops.relu(leaked[0])


def test_tensor_from_another_compile():
    leaked = []

    def keep(m, inp):
        leaked.append(m.W)
        return ops.sum_all(m.W)
    wg.compile_module(M, keep, inputs={})

    def reuse(m, inp):
        return ops.sum_all(m.W * leaked[0])  # err:reuse
    with pytest.raises(ValueError) as e:
        wg.compile_module(M, reuse, inputs={})
    assert "another traced graph" in str(e.value) and "mul" in str(e.value)
    assert f"{THIS}:{line_of('reuse')}" in str(e.value)


def test_tensor_in_python_if():
    def branchy(m, inp):
        return ops.sum_all(m.W) if ops.sum_all(m.W) > 0 else ops.sum_all(-m.W)
    with pytest.raises(TypeError, match=r"ops\.where"):
        wg.compile_module(M, branchy, inputs={})


@pytest.mark.parametrize("use,words", [
    (lambda t: float(t), "float() cannot read it"),  # err:float
    (lambda t: int(t), "int() cannot read it"),  # err:int
    (lambda t: range(t), "Python index or size"),  # err:range
    (lambda t: t[0], "not indexed with []"),  # err:getitem
    (lambda t: [v for v in t], "cannot be iterated"),  # err:iter
], ids=["float", "int", "range", "getitem", "iter"])
def test_reading_a_traced_tensor_in_python_names_the_way_out(use, words, request):
    """Python conversions of a traced Tensor say why there is no value and where; before,
    float() and t[0] raised Python's bare TypeErrors."""
    def fn(m, inp):
        use(ops.sum_all(m.W))
        return ops.sum_all(m.W)
    with pytest.raises(TypeError) as e:
        wg.compile_module(M, fn, inputs={})
    msg = str(e.value)
    marker = request.node.callspec.id
    assert words in msg and f"{THIS}:{line_of(marker)}" in msg, msg


# ---------------------------------------------------------------- configuration

class BadInit(Module):
    def __init__(self):
        super().__init__()
        self.W = self.param([4, 5], init="xavier")


class BadShape(Module):
    def __init__(self):
        super().__init__()
        self.W = self.param([4, -1])


def _sum_w(m, inp):
    return ops.sum_all(m.W)


# name, compile_module kwargs (factory and fn default to M and _sum_w), exception, words
CONFIG_ERRORS = [
    ("unknown_backend", {"backend": "cuda"}, ValueError, ["'cuda'", "reference", "torch", "webgpu"]),
    ("device_on_a_backend_without_devices", {"backend": "webgpu:1"}, ValueError,
     ["'webgpu:1'", "only 'torch' takes a device", "use 'webgpu'"]),
    ("bad_init_name", {"factory": BadInit}, ValueError, ["unknown init 'xavier'", "init.kaiming()"]),
    ("negative_dim_param", {"factory": BadShape}, ValueError, ["[4, -1]", "non-negative"]),
    ("bad_input_dtype", {"inputs": {"x": ([2], "f64")}}, ValueError, ["'x'", "'f64'", "'f32' or 'i32'"]),
    ("optimizer_class", {"optimizer": optim.Adam}, TypeError, ["optim.Adam(lr=1e-3)"]),
    ("factory_not_module", {"factory": lambda: 3}, TypeError, ["webgrad.Module", "int"]),
    ("factory_an_instance", {"factory": M()}, TypeError, ["class", "lambda: M(...)", "not a M instance"]),
    ("loss_not_tensor", {"fn": lambda m, inp: 1.0}, TypeError, ["must return a webgrad Tensor", "float"]),
    ("bad_lr", {"optimizer": "sgd"}, TypeError, ["optim.Optimizer"]),
    # input specs: sizes are whole numbers >= 1 (3.5 was truncated to 3, "f32" read as a shape)
    ("fractional_input_size", {"inputs": {"x": [2, 3.5]}}, TypeError, ["'x'", "[2, 3.5]", "whole numbers"]),
    ("zero_input_size", {"inputs": {"x": ([0, 3], "f32")}}, ValueError, ["'x'", "[0, 3]", "at least 1"]),
    ("dtype_as_spec", {"inputs": {"x": "f32"}}, TypeError, ["'x'", "'f32'", "([B, 1], 'f32')"]),
    ("spec_without_shape", {"inputs": {"x": {"dtype": "i32"}}}, ValueError, ["'x'", "no 'shape'"]),
    ("inputs_not_a_dict", {"inputs": [([2], "f32")]}, TypeError, ["dict name -> spec", "list"]),
]


@pytest.mark.parametrize("name,kw,exc,words", CONFIG_ERRORS, ids=[c[0] for c in CONFIG_ERRORS])
def test_configuration_errors(name, kw, exc, words):
    kw = dict(kw)
    factory, fn = kw.pop("factory", M), kw.pop("fn", _sum_w)
    kw.setdefault("inputs", {})
    with pytest.raises(exc) as e:
        wg.compile_module(factory, fn, **kw)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_bad_schedule_and_dropout_arguments():
    with pytest.raises(TypeError, match="lr must be a number or an lr"):
        optim.SGD(lr="fast")

    def drop(m, inp):
        return ops.sum_all(ops.dropout(m.W, 1.0))
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\)"):
        wg.compile_module(M, drop, inputs={})
