"""The buffer plan's memory savings, and that they change no result.

Three things cut the GPT bench's planned peak (bench/README.md, memory_plan.py): GELU's tanh
is recomputed by its readers instead of stored (codegen/remat.py), the optimizer's scalars
are scheduled before their first reader so that each weight gradient (and its fused AdamW
update) runs as soon as its inputs exist (fusion_groups._schedule), and the pool is packed largest
tensor first when that is smaller (buffers.plan_pool). Wrong liveness shows as wrong numbers:
the training step is compared bit for bit with the same program given one buffer per
temporary, and against the reference executor.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

import models
from backends import WEBGPU
from webgrad import optim
from webgrad.buffers import END, Live, _plan_in_order, plan_pool
from webgrad.codegen import Limits, lower
from webgrad.codegen import program as program_mod
from webgrad.codegen import remat as remat_mod
from webgrad.compile import build_train_graph, parse_inputs


def _transformer_graph():
    return build_train_graph(models.Transformer, models.transformer_loss,
                             parse_inputs(models.TF_INPUTS), optim.AdamW(lr=1e-3))[1]


# ---------------------------------------------------------------- packing

def test_largest_first_packing_reaches_the_live_peak():
    """A big tensor, a long small one written after it, another big one: in schedule order
    the small one takes the first big buffer and the second big one needs a new buffer
    (200 bytes); largest first puts both big ones in one buffer (110, the most ever live)."""
    lives = [Live("a", 96, 0, 0), Live("b", 16, 1, 5), Live("c", 96, 2, 3)]
    assert sum(_plan_in_order(lives)[0]) == 96 + 96
    slots, a = plan_pool(lives)
    assert sum(slots) == 96 + 16 and a["a"] == a["c"] != a["b"]


def test_pool_with_donors_never_shares_a_buffer_between_live_tensors():
    """Brute force over random lifetimes with donors (as program._donors makes them: a
    tensor read last by the later kernel that writes its heir, each claimed once; and
    some that do not die where their heir is written, which must be ignored): two tensors
    share a buffer only when their steps do not overlap or one hands the buffer to the
    other at the step that writes it; every buffer fits its tensors; the plan is never
    larger than the schedule-order packing."""
    rng = random.Random(1)
    for _ in range(200):
        lives, claimed = [], set()
        for k in range(25):
            first = rng.randrange(20)
            last = END if rng.random() < 0.1 else first + rng.randrange(6)
            size = rng.choice([16, 64, 400, 1000, rng.randrange(1, 5000)])
            donor = None
            if lives and rng.random() < 0.4:
                d = rng.choice(lives)
                if d.first < d.last != END and d.key not in claimed:
                    claimed.add(d.key)
                    donor, first, size = d.key, d.last, d.nbytes
                elif d.last not in (first, END):
                    donor = d.key  # not a hand-over: planners must not share
            lives.append(Live(k, size, first, max(first, last), donor))
        slots, assign = plan_pool(lives)
        assert sum(slots) <= sum(_plan_in_order(lives)[0])
        for t in lives:
            assert slots[assign[t.key]] >= t.nbytes
            for u in lives:
                if t.key >= u.key or assign[t.key] != assign[u.key]:
                    continue
                if t.last < u.first or u.last < t.first:
                    continue
                d, h = (t, u) if u.donor == t.key else (u, t) if t.donor == u.key else (None, None)
                assert d is not None and d.last == h.first, (t, u)


# ---------------------------------------------------------------- what the plan keeps

def test_gelu_tanh_is_recomputed_not_stored(monkeypatch):
    """The transformer's GELU tanh is read by its forward kernel and its backward one, and
    its input (the pre-activation) is kept for the backward anyway: the plan recomputes it
    there and the pool shrinks by the tanh's buffers. Without remat.py the tanh is stored."""
    g = _transformer_graph()

    def stored_ops(low):
        pg = low.pool["graph"]
        return [pg[lv.key[1]].op for lv in low.pool["lives"] if lv.key[0] == "t"]
    low = lower(g, Limits())[0]
    assert "tanh" not in stored_ops(low)
    monkeypatch.setattr(remat_mod, "remat_candidates", lambda fu: frozenset())
    before = lower(g, Limits())[0]
    assert stored_ops(before).count("tanh") == models.N_LAYERS
    assert low.report["pool_bytes"] < before.report["pool_bytes"]


def test_gelu_tanh_is_recomputed_under_mixed_precision(monkeypatch):
    """Under precision="mixed" the weight gradient of the layer after a GELU reads an f16
    copy of the GELU's output transposed, cast(transpose(gelu(h))): a reader of the tanh not
    at its own index, but once per element (remat._read_once), so the tanh is recomputed
    there too and not stored (GPT-2 124M's mixed step on the H200's plan: 576 MiB)."""
    from webgrad.precision import f16_in_f32
    g = f16_in_f32(build_train_graph(models.Transformer, models.transformer_loss,
                                     parse_inputs(models.TF_INPUTS), optim.AdamW(lr=1e-3),
                                     precision="mixed")[1])
    limits = Limits(shader_f16=True)

    def stored_ops(low):
        pg = low.pool["graph"]
        return [pg[lv.key[1]].op for lv in low.pool["lives"] if lv.key[0] == "t"]
    low = lower(g, limits)[0]
    assert "tanh" not in stored_ops(low)
    monkeypatch.setattr(remat_mod, "_read_once", lambda fu, gid, e: False)
    before = lower(g, limits)[0]
    assert stored_ops(before).count("tanh") == models.N_LAYERS
    assert low.report["pool_bytes"] < before.report["pool_bytes"]


@pytest.mark.parametrize("adapter", ["", "NVIDIA H200 (DiscreteGPU)"])
def test_weight_gradients_run_inside_the_backward(adapter):
    """The weight gradients' kernels (AdamW fused into them) read scalars the optimizer
    traces after the whole backward pass; scheduled by node order alone they ran after it,
    keeping every activation gradient alive until then (up to 37 of the transformer's 84
    kernels, pool 779328 bytes). Now the logits' gradient dies within a few kernels of
    its writing and no gradient outlives a quarter of the step (16 kernels, 647680)."""
    g = _transformer_graph()
    low = lower(g, Limits(adapter=adapter, max_storage_buffer_binding_size=1 << 31))[0]
    pg, lives, order = low.pool["graph"], low.pool["lives"], low.pool["order"]
    loss = pg.outputs["loss"]
    fwd = pg.ancestors(loss)
    vocab = models.VOCAB
    dlogits = [lv for lv in lives if lv.key[0] == "t" and lv.key[1] not in fwd
               and pg[lv.key[1]].shape[-1:] == (vocab,)]
    assert dlogits and all(lv.last - lv.first <= 4 for lv in dlogits), dlogits
    spans = [lv.last - lv.first for lv in lives if lv.key[0] == "t" and lv.key[1] not in fwd
             and lv.last != END]
    assert max(spans) <= len(order) // 4, (max(spans), len(order))


# ---------------------------------------------------------------- same numbers

def _one_buffer_each(lives):
    return [max(16, -(-lv.nbytes // 16) * 16) for lv in lives], {lv.key: k for k, lv in enumerate(lives)}


@pytest.mark.parametrize("backend", [WEBGPU])
def test_planned_step_equals_unpooled_and_reference(backend, monkeypatch):
    """Three AdamW steps of the test transformer on WebGPU with the planned pool (tanh
    recomputed, weight gradients inside the backward, shared buffers) equal, bit for bit,
    the same kernels with one buffer per temporary (no reuse), and the reference executor
    within f32 rounding."""
    opt = lambda: optim.AdamW(lr=0.01, weight_decay=0.01)  # noqa: E731
    planned = models.compile_transformer(backend, seed=4, optimizer=opt())
    with monkeypatch.context() as m:
        m.setattr(program_mod, "plan_pool", _one_buffer_each)
        unpooled = models.compile_transformer(backend, seed=4, optimizer=opt())
    ref = models.compile_transformer("reference", seed=4, optimizer=opt())
    rp, ru = planned._train.exe.memory_report(), unpooled._train.exe.memory_report()
    assert rp["pool_bytes"] < ru["pool_bytes"] and rp["pool_buffers"] < ru["pool_buffers"]
    for k in range(3):
        b = models.reversal_batch(k)
        lp, lu, lr_ = planned.step(b), unpooled.step(b), ref.step(b)
        assert lp == lu, (k, lp, lu)
        assert abs(lp - lr_) <= 1e-4 * abs(lr_) + 1e-6, (k, lp, lr_)
    pp, pu, pr = planned.download_params(), unpooled.download_params(), ref.download_params()
    gp, gr = planned.download_param_grads(), ref.download_param_grads()
    for name in pr:
        assert np.array_equal(np.asarray(pp[name]), np.asarray(pu[name])), name
        np.testing.assert_allclose(pp[name], pr[name], rtol=1e-3, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(gp[name], gr[name], rtol=1e-3, atol=1e-5, err_msg=name)
    for c in (planned, unpooled):
        c.destroy()
