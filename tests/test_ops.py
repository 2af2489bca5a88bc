"""Every op against an independent oracle, on every CPU executor.

* `test_oracle`: each record of tests/oracle.py (one or more per public op) through the full
  compile path on "reference" and "torch", compared with torch autograd in float64.
* `test_finite_differences`: for ops whose torch counterpart is itself a composite that
  could share a mistake with ours (normalisations, log-softmax, max, the conv windows),
  the compiled gradient graph evaluated in float64 with the numpy `ref` rules is compared
  with central differences of the same graph's loss — no torch involved.
* randomness across steps and executors (dropout masks).
"""
from __future__ import annotations

import numpy as np
import pytest

import oracle
import webgrad as wg
from webgrad import Module, init, ops, optim
from webgrad.primitives import PRIMS

BACKENDS = ["reference", "torch"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("record", oracle.RECORDS, ids=lambda r: r.name)
def test_oracle(record, backend):
    oracle.check(record, backend)


def _f16_params():
    """(backend, record) for every record with an f16 form (oracle.F16_SKIP says which have
    none): all of them on the reference executor (14 s on 2 cores), every fifth on torch by
    default and the others as slow cases."""
    recs = [r for r in oracle.RECORDS if r.name not in oracle.F16_SKIP]
    return ([pytest.param("reference", r, id=f"reference-{r.name}") for r in recs]
            + [pytest.param("torch", r, id=f"torch-{r.name}",
                            marks=[pytest.mark.slow] if k % 5 else []) for k, r in enumerate(recs)])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # f16 overflow in records of big values
@pytest.mark.parametrize("backend,record", _f16_params())
def test_oracle_f16(backend, record):
    """Each record compiled with precision="f16" against torch (float64), f16 tolerances."""
    oracle.check_f16(record, backend)


# ---------------------------------------------------------------- finite differences

FD_RECORDS = [
    "layer_norm_last", "layer_norm_last/eps", "nn.LayerNorm", "nn.RMSNorm",
    "log_softmax_last/2d", "log_softmax_last/wide_range", "softmax_last/3d",
    "softmax_causal_last", "nn.cross_entropy_last", "max_last/2d", "max_pool2d/pad",
    "unfold2d/pad_value", "fold2d", "conv2d/groups", "conv2d/rect", "erf/2d", "gelu/2d",
    "sigmoid/large", "rope", "embedding", "take_along_last", "attention",
]


def _eval64(graph, env: dict, want: list[int]) -> list:
    """Evaluate the nodes that `want` needs with the numpy ref rules, in float64
    (f32 leaves and constants are made float64; ref rules keep their input's dtype)."""
    need = set(want)
    for n in reversed(graph.nodes):
        if n.id in need:
            need.update(n.inputs)
    vals: dict[int, np.ndarray] = {}
    for n in graph.nodes:
        if n.id not in need:
            continue
        if n.op in ("input", "param", "state"):
            vals[n.id] = env[n.attrs["name"]]
        else:
            vals[n.id] = PRIMS[n.op].ref(np, n.attrs, *[vals[i] for i in n.inputs])
            if n.op == "const" and n.dtype == "f32":
                vals[n.id] = np.asarray(n.attrs["value"], np.float64).reshape(n.shape)
    return [vals[i] for i in want]


@pytest.mark.parametrize("name", FD_RECORDS)
def test_finite_differences(name):
    record = oracle.BY_NAME[name]
    c, feed = oracle.compile_record(record, "reference")
    g = c.ir
    env = {"step": np.zeros((), np.float64)}
    for n, a, v in zip(record.arg_names, record.args, oracle.make_inputs(record)):
        env[n] = np.array(v, np.float64 if a.dtype == "f32" else np.int32).reshape(a.shape)
    params = [n for n, a in zip(record.arg_names, record.args) if a.dtype == "f32"]
    analytic = _eval64(g, env, [g.writebacks[f"grad/{n}"] for n in params])
    loss_id = g.outputs["loss"]
    for pname, ana in zip(params, analytic):
        x = env[pname]
        num = np.zeros_like(x)
        for k in range(x.size):
            h = 1e-6 * max(1.0, abs(x.flat[k]))
            saved = x.flat[k]
            x.flat[k] = saved + h
            up = _eval64(g, env, [loss_id])[0]
            x.flat[k] = saved - h
            down = _eval64(g, env, [loss_id])[0]
            x.flat[k] = saved
            num.flat[k] = (up - down) / (2 * h)
        assert ana.dtype == np.float64, f"{name}: gradient graph did not stay in float64"
        np.testing.assert_allclose(
            ana, num, rtol=1e-6, atol=1e-7,
            err_msg=f"{name}: gradient of {pname!r} {list(x.shape)} (ref rules, float64) "
                    f"disagrees with central differences of the loss")


# ---------------------------------------------------------------- randomness over steps


def _dropout_module(backend, seed=0):
    class M(Module):
        def __init__(self):
            super().__init__()
            self.x = self.param([64, 32], init=init.ones())

    def loss_fn(m, _):
        y = ops.capture("y", ops.dropout(m.x, 0.5, seed=seed))
        return ops.sum_all(y)
    return wg.compile_module(M, loss_fn, inputs={}, optimizer=optim.SGD(lr=0.0), backend=backend)


def test_dropout_masks_change_per_step_and_match_across_executors():
    masks = {}
    for backend in BACKENDS:
        c = _dropout_module(backend)
        _, a = c.step({}, with_captures=True)
        _, b = c.step({}, with_captures=True)
        assert set(np.unique(a["y"])) <= {0.0, 2.0}
        assert (a["y"] != b["y"]).mean() > 0.3, f"{backend}: the mask did not change between steps"
        c.reset()
        _, again = c.step({}, with_captures=True)
        np.testing.assert_array_equal(a["y"], again["y"],
                                      err_msg=f"{backend}: not reproducible after reset()")
        masks[backend] = a["y"]
    # rand_uniform is specified bit for bit, so every executor draws the same mask
    np.testing.assert_array_equal(masks["reference"], masks["torch"])
    other_seed = _dropout_module("reference", seed=1)
    _, d = other_seed.step({}, with_captures=True)
    assert (d["y"] != masks["reference"]).mean() > 0.3, "dropout(seed=) did not change the mask"


# ---------------------------------------------------------------- the browser suites' batch helpers


def test_collected_records_fail_with_the_record_name_and_worker_traceback(monkeypatch):
    """oracle.run_records_collect / check_collected (the browser suites' worker loop and host
    check), here in CPython on the reference executor: good records pass; a record that
    raises, one whose result is off, and one missing from the batch each fail, naming it."""
    import dataclasses
    from webgrad.compiled import run_blocking
    names = ["neg/2d", "exp/2d"]
    broken = dataclasses.replace(oracle.BY_NAME["exp/2d"], wg_src="lambda a: ops.no_such_op(a)")
    monkeypatch.setitem(oracle.BY_NAME, "exp/2d", broken)
    results = run_blocking(oracle.run_records_collect(names, "reference"))
    assert results["neg/2d"]["ok"] and not results["exp/2d"]["ok"]
    oracle.check_collected(results, ["neg/2d"], "reference")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)'exp/2d' failed.*no_such_op"):
        oracle.check_collected(results, names, "reference")
    results["neg/2d"]["got"]["out"][0] += 1.0
    with pytest.raises(AssertionError, match=r"'neg/2d'.*output.*differs from torch"):
        oracle.check_collected(results, ["neg/2d"], "reference")
    with pytest.raises(pytest.fail.Exception, match=r"'log/2d': no result"):
        oracle.check_collected(results, ["log/2d"], "reference")
