"""Property tests: random op graphs agree on every executor, or fail the same clear way.

Hypothesis draws a small program: f32 parameters of random shapes, then a chain of ops
(elementwise, broadcasting binaries, reductions over random axes, softmax-family rows,
layout ops, matmul) whose operands are drawn from what exists so far. Each program is
compiled with its gradients (optimizer=None) on "reference" (the spec), "torch" and, where
an adapter exists, "webgpu" (lavapipe in CI); the loss, the output and every gradient must
agree with the reference within f32 tolerances (a chain of k ops compounds rounding, so the
bound is looser than the single-op oracle's). Some draws pair operands whose shapes do not
broadcast: then every backend must raise the same ShapeError, naming the op, both shapes
and this file's line. Input values come from a drawn seed (not from Hypothesis' float
strategies), so shrinking simplifies programs, not numbers; the run is derandomized so CI
sees the same examples every time.
"""
from __future__ import annotations

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import webgrad as wg  # noqa: E402
from webgrad import Module, ShapeError, init, ops  # noqa: E402
from backends import webgpu_available as _webgpu_available  # noqa: E402

THIS = __file__.rsplit("/", 1)[-1]


BACKENDS = ["reference", "torch"] + (["webgpu"] if _webgpu_available() else [])

# ops on one tensor: name -> fn (bounded outputs, so chains stay finite)
UNARY = {
    "neg": lambda x: -x, "tanh": ops.tanh, "sigmoid": ops.sigmoid, "relu": ops.relu,
    "abs": ops.abs, "sin": ops.sin, "cos": ops.cos, "erf": ops.erf, "gelu": ops.gelu,
    "silu": ops.silu, "square": lambda x: x * x, "exp_tanh": lambda x: ops.exp(ops.tanh(x)),
    "floor": ops.floor, "round": lambda x: ops.round(x * 2.0), "sign": ops.sign,
    "sqrt_abs": lambda x: ops.sqrt(ops.abs(x) + 0.25), "pow_num": lambda x: ops.pow(ops.abs(x) + 0.5, 1.5),
}
BINARY = {
    "add": ops.add, "sub": ops.sub, "mul": ops.mul, "maximum": ops.maximum, "minimum": ops.minimum,
    "div": lambda a, b: a / (ops.abs(b) + 0.5), "where_gt": lambda a, b: ops.where(a > b, a, b),
    "le_mask": lambda a, b: a * (a <= b), "power": lambda a, b: ops.pow(ops.abs(a) + 0.5, ops.tanh(b)),
}
ROW = {"softmax": ops.softmax_last, "log_softmax": ops.log_softmax_last,
       "layer_norm": ops.layer_norm_last}
REDUCE = {"sum": ops.sum, "mean": ops.mean, "max": ops.max, "logsumexp": ops.logsumexp,
          "min": ops.min}


def _shape(draw, max_rank=3):
    return tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=max_rank)))


@st.composite
def programs(draw):
    """(param shapes, list of steps); a step is (kind, name, operand indices, extra)."""
    n_params = draw(st.integers(1, 2))
    shapes = [_shape(draw) for _ in range(n_params)]
    steps = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "reduce", "row", "layout",
                                     "matmul"]))
        steps.append((kind, draw(st.integers(0, 10 ** 6)), draw(st.integers(0, 10 ** 6))))
    return shapes, steps, draw(st.integers(0, 2 ** 31 - 1))


def build(shapes, steps):
    """The loss function of a drawn program; pool indices and choices come from the step's
    two integers, so the same program traces the same graph on every backend."""
    def loss_fn(m, _):
        pool = [getattr(m, f"p{k}") for k in range(len(shapes))]
        for kind, a, b in steps:
            x = pool[a % len(pool)]
            if kind == "unary":
                y = list(UNARY.values())[b % len(UNARY)](x)
            elif kind == "binary":
                other = pool[b % len(pool)]
                if b % 3 == 0:  # sometimes a broadcast of a reduced operand (always valid)
                    other = ops.sum(x, x.ndim - 1, keepdims=True)
                y = list(BINARY.values())[(a + b) % len(BINARY)](x, other)  # may not broadcast
            elif kind == "reduce":
                axes = [k for k in range(x.ndim) if (b >> k) & 1] or None
                y = list(REDUCE.values())[b % len(REDUCE)](x, axes, keepdims=bool(b & 8))
            elif kind == "row":
                y = list(ROW.values())[b % len(ROW)](x) if x.ndim else x
            elif kind == "layout":
                choice = b % 4
                if choice == 0 and x.ndim >= 2:
                    perm = list(range(x.ndim))
                    perm[0], perm[-1] = perm[-1], perm[0]
                    y = ops.transpose(x, perm)
                elif choice == 1:
                    y = ops.reshape(x, (-1,))
                elif choice == 2:
                    y = ops.concat([x, x * 0.5], -1) if x.ndim else x
                else:
                    y = ops.broadcast_to(x, (2,) + x.shape)
            else:  # matmul with a transposed copy: [.., m, k] @ [.., k, m]
                y = x @ ops.swap_axes(x, -1, -2) if x.ndim >= 2 else x * x
            pool.append(y)
        out = ops.capture("out", pool[-1])
        # fixed weights, so that every gradient is non-trivial
        r = ops.constant([((k * 7919) % 13 - 6) / 6.0 for k in range(out.node.size)], shape=out.shape)
        return ops.sum_all(out * r)
    return loss_fn


def make_factory(shapes, seed):
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]

    class P(Module):
        def __init__(self):
            super().__init__()
            for k, (s, v) in enumerate(zip(shapes, values)):
                setattr(self, f"p{k}", self.param(list(s), init=init.literal(v)))
    return P


def run(shapes, steps, seed, backend):
    c = wg.compile_module(make_factory(shapes, seed), build(shapes, steps), inputs={},
                          optimizer=None, backend=backend)
    try:
        loss, caps = c.step({}, with_captures=True)
        return loss, np.asarray(caps["out"]), {k: np.asarray(v) for k, v in c.download_param_grads().items()}
    finally:
        c.destroy()


def _close(what, got, want, backend, program):
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-4, equal_nan=True,
                               err_msg=f"{what} on {backend!r} differs from the reference for {program}")


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_agree_on_every_backend(program):
    shapes, steps, seed = program
    results = {}
    for backend in BACKENDS:
        try:
            results[backend] = run(shapes, steps, seed, backend)
        except ShapeError as e:
            results[backend] = e
    ref = results["reference"]
    hypothesis.event("shape error" if isinstance(ref, ShapeError) else "ran")
    if isinstance(ref, ShapeError):
        msg = str(ref)
        # a clear error: the op, the operand shapes and the line of this file that built it
        assert "do not broadcast" in msg and f"{THIS}:" in msg, msg
        for backend, r in results.items():
            assert isinstance(r, ShapeError) and str(r) == msg, (backend, r, msg)
        return
    loss, out, grads = ref
    for backend, r in results.items():
        assert not isinstance(r, Exception), (backend, r)
        _close("output", r[1], out, backend, program)
        _close("loss", r[0], loss, backend, program)
        for k in grads:
            _close(f"gradient of {k}", r[2][k], grads[k], backend, program)


@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(1, 4), min_size=0, max_size=3), st.lists(st.integers(1, 4), min_size=0, max_size=3),
       st.sampled_from(sorted(BINARY)))
def test_binary_ops_broadcast_or_fail_the_same_clear_way(a, b, name):
    """Two drawn shapes under a binary op: numpy's broadcasting decides, every backend
    follows (values agree), and a mismatch is the same ShapeError everywhere."""
    def loss_fn(m, _):
        return ops.sum_all(BINARY[name](m.p0, m.p1))  # the line errors must name
    shapes = [tuple(a), tuple(b)]
    try:
        np.broadcast_shapes(*shapes)
        ok = True
    except ValueError:
        ok = False
    hypothesis.event("broadcasts" if ok else "does not broadcast")
    results = {}
    for backend in BACKENDS:
        try:
            c = wg.compile_module(make_factory(shapes, 0), loss_fn, inputs={}, optimizer=None,
                                  backend=backend)
            results[backend] = (c.step({}), c.download_param_grads())
            c.destroy()
        except ShapeError as e:
            results[backend] = e
    if not ok:
        msgs = {str(r) for r in results.values()}
        assert all(isinstance(r, ShapeError) for r in results.values()) and len(msgs) == 1, results
        msg = msgs.pop()
        assert "do not broadcast" in msg and str(list(a)) in msg and str(list(b)) in msg, msg
        assert f"{THIS}:" in msg, msg
        return
    loss, grads = results["reference"]
    for backend, r in results.items():
        assert not isinstance(r, Exception), (backend, r)
        _close("loss", r[0], loss, backend, (a, b, name))
        for k in grads:
            _close(f"gradient of {k}", r[1][k], grads[k], backend, (a, b, name))
