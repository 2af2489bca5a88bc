"""Optimizers, gradient clipping and learning-rate schedules, judged against torch.optim.

Every optimizer runs in-graph (the update is part of the compiled step), so the check is
end to end: the same initial values and the same 20 batches go through a webgrad compiled
step and through torch.optim (or, for Lion, which torch lacks, a hand-written torch
reference), and the parameters must agree after every step. The model has one parameter
per weight-decay case (literal -> decays, zeros -> no decay, ones with decay=True,
randn with decay=False), mirrored in torch by two param groups.

Schedules are read back from the compiled program itself: a parameter whose gradient is
exactly 1 under plain SGD moves by -lr(t) at step t, which is compared with torch's
schedulers. The last test is a user optimizer written against optim.py's extension point.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import webgrad as wg
from webgrad import Module, init, lr, ops, optim

BACKENDS = ["reference", "torch"]

STEPS = 20
B, D_IN, D_OUT = 8, 3, 4
W0 = [[0.3, -0.2, 0.5, 0.1], [-0.4, 0.25, 0.05, -0.3], [0.2, 0.6, -0.1, 0.35]]


class Small(Module):
    """One param for each weight-decay rule (see init.Init.decays and Module.param)."""

    def __init__(self):
        super().__init__()
        self.W = self.param([D_IN, D_OUT], init=init.literal(W0))           # decays
        self.b = self.param([D_OUT], init="zeros")                          # no decay
        self.g = self.param([D_OUT], init="ones", decay=True)               # forced on
        self.s = self.param([D_OUT], init=init.randn(0.5), decay=False)     # forced off


DECAYS = {"W": True, "b": False, "g": True, "s": False}


def small_loss(m, inp):
    h = ops.tanh(inp["x"] @ m.W + m.b) * m.g + m.s
    d = h - inp["y"]
    return ops.mean_all(d * d)


def torch_small_loss(p, x, y):
    h = torch.tanh(x @ p["W"] + p["b"]) * p["g"] + p["s"]
    return ((h - y) ** 2).mean()


def batches(n=STEPS, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((B, D_IN)).astype(np.float32),
             "y": rng.standard_normal((B, D_OUT)).astype(np.float32)} for _ in range(n)]


# ---------------------------------------------------------------- torch references

class TorchLion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, Algorithm 2), written by hand: torch has none.
    c = b1 m + (1 - b1) g;  p <- p (1 - lr wd) - lr sign(c);  m <- b2 m + (1 - b2) g."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                m = self.state[p].setdefault("m", torch.zeros_like(p))
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(b1 * m + (1 - b1) * p.grad), alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


class RMSProp(optim.Optimizer):
    """A user optimizer written against the extension point in optim.py's header:
    v <- alpha v + (1 - alpha) g^2;  p <- p - lr g / (sqrt(v) + eps)."""

    def __init__(self, lr=0.01, alpha=0.99, eps=1e-8):
        super().__init__(lr)
        self.alpha, self.eps = alpha, eps

    def apply(self, ctx):
        lr_t = ctx.lr()
        for p in ctx.params:
            v = ctx.state(f"rmsprop.v.{p.name}", p.value.shape)
            v2 = self.alpha * v + (1 - self.alpha) * p.grad * p.grad
            ctx.assign(v, v2)
            ctx.assign(p.value, p.value - lr_t * p.grad / (ops.sqrt(v2) + self.eps))


def groups(params: dict, wd: float) -> list[dict]:
    """torch param groups mirroring webgrad's decay rule."""
    return [{"params": [params[n] for n in DECAYS if DECAYS[n]], "weight_decay": wd},
            {"params": [params[n] for n in DECAYS if not DECAYS[n]], "weight_decay": 0.0}]


# name, webgrad optimizer, torch optimizer over torch params, clip norm used on the torch side
CASES = [
    ("adam", optim.Adam(lr=0.01), lambda p: torch.optim.Adam(list(p.values()), lr=0.01), None),
    ("adam_betas_eps", optim.Adam(lr=0.02, betas=(0.8, 0.9), eps=1e-6),
     lambda p: torch.optim.Adam(list(p.values()), lr=0.02, betas=(0.8, 0.9), eps=1e-6), None),
    ("adam_l2", optim.Adam(lr=0.01, weight_decay=0.1),
     lambda p: torch.optim.Adam(groups(p, 0.1), lr=0.01), None),
    ("adamw", optim.AdamW(lr=0.01, weight_decay=0.1),
     lambda p: torch.optim.AdamW(groups(p, 0.1), lr=0.01), None),
    ("sgd", optim.SGD(lr=0.1), lambda p: torch.optim.SGD(list(p.values()), lr=0.1), None),
    ("sgd_momentum", optim.SGD(lr=0.1, momentum=0.9),
     lambda p: torch.optim.SGD(list(p.values()), lr=0.1, momentum=0.9), None),
    ("sgd_nesterov", optim.SGD(lr=0.1, momentum=0.9, nesterov=True),
     lambda p: torch.optim.SGD(list(p.values()), lr=0.1, momentum=0.9, nesterov=True), None),
    ("sgd_dampening", optim.SGD(lr=0.1, momentum=0.9, dampening=0.5),
     lambda p: torch.optim.SGD(list(p.values()), lr=0.1, momentum=0.9, dampening=0.5), None),
    ("sgd_weight_decay", optim.SGD(lr=0.1, momentum=0.5, weight_decay=0.2),
     lambda p: torch.optim.SGD(groups(p, 0.2), lr=0.1, momentum=0.5), None),
    ("lion", optim.Lion(lr=0.01, weight_decay=0.5),
     lambda p: TorchLion(groups(p, 0.5), lr=0.01), None),
    ("lion_betas", optim.Lion(lr=0.005, betas=(0.8, 0.95)),
     lambda p: TorchLion(list(p.values()), lr=0.005, betas=(0.8, 0.95)), None),
    # Adam is nearly invariant to a gradient scale, so clipping is checked on SGD, where
    # it shows in every update; 0.05 is below the gradient norm for most of these batches
    ("sgd_clip", optim.SGD(lr=0.5, clip_norm=0.05),
     lambda p: torch.optim.SGD(list(p.values()), lr=0.5), 0.05),
    ("adamw_clip", optim.AdamW(lr=0.01, weight_decay=0.1, clip_norm=0.05),
     lambda p: torch.optim.AdamW(groups(p, 0.1), lr=0.01), 0.05),
    ("user_rmsprop", RMSProp(lr=0.01, alpha=0.9, eps=1e-8),
     lambda p: torch.optim.RMSprop(list(p.values()), lr=0.01, alpha=0.9, eps=1e-8), None),
]


def train_both(wg_opt, make_torch_opt, clip, backend):
    """Run both sides over the same batches; yield (step, webgrad params, torch params,
    torch's pre-clip gradient norm) after every step."""
    c = wg.compile_module(Small, small_loss, inputs={"x": [B, D_IN], "y": [B, D_OUT]},
                          optimizer=wg_opt, backend=backend, seed=3)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in c.download_params().items()}
    topt = make_torch_opt(tp)
    for t, feed in enumerate(batches()):
        wl = c.step(feed)
        topt.zero_grad()
        tl = torch_small_loss(tp, torch.from_numpy(feed["x"]), torch.from_numpy(feed["y"]))
        tl.backward()
        norm = torch.sqrt(sum((p.grad ** 2).sum() for p in tp.values())).item()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(list(tp.values()), clip)
        topt.step()
        assert wl == pytest.approx(tl.item(), rel=1e-5, abs=1e-6), f"loss at step {t}"
        yield t, c.download_params(), {k: v.detach().numpy() for k, v in tp.items()}, norm


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,wg_opt,make_torch_opt,clip", CASES, ids=[c[0] for c in CASES])
def test_optimizer_matches_torch(name, wg_opt, make_torch_opt, clip, backend):
    norms = []
    for t, got, want, norm in train_both(wg_opt, make_torch_opt, clip, backend):
        norms.append(norm)
        for k in want:
            err = float(np.max(np.abs(got[k] - want[k])))
            assert err < 1e-5, f"{name}: param {k} differs by {err:.2e} after step {t + 1}"
    if clip is not None:  # otherwise the clipping case would not have tested clipping
        assert sum(n > clip for n in norms) >= STEPS // 2, norms


# ---------------------------------------------------------------- schedules

class Scalar(Module):
    def __init__(self):
        super().__init__()
        self.p = self.param([1], init="zeros")


def lr_trace(schedule, steps: int, backend: str = "reference") -> list[float]:
    """lr(t) as the compiled program applies it: loss = p, so dloss/dp = 1 and plain SGD
    moves p by exactly -lr(t) at step t."""
    c = wg.compile_module(Scalar, lambda m, inp: ops.sum_all(m.p), inputs={},
                          optimizer=optim.SGD(lr=schedule), backend=backend)
    out, prev = [], 0.0
    for _ in range(steps):
        c.step({})
        p = float(c.download_params()["p"][0])
        out.append(prev - p)
        prev = p
    return out


def torch_lr_trace(make_sched, base_lr: float, steps: int) -> list[float]:
    """The lr torch's scheduler gives the optimizer for each of `steps` updates."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base_lr)
    sched = make_sched(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def _warmup_then(opt, steps, after):
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / steps, end_factor=1.0,
                                             total_iters=steps - 1)
    return torch.optim.lr_scheduler.SequentialLR(opt, [warm, after(opt)], milestones=[steps])


TL = torch.optim.lr_scheduler
SCHEDULES = [
    ("constant", lr.constant(0.03), 0.03, lambda o: TL.ConstantLR(o, factor=1.0)),
    ("linear_decay", lr.linear_decay(peak=0.05, final=0.01, steps=12), 0.05,
     lambda o: TL.LinearLR(o, start_factor=1.0, end_factor=0.2, total_iters=12)),
    ("cosine_decay", lr.cosine_decay(peak=0.05, final=0.005, steps=20), 0.05,
     lambda o: TL.CosineAnnealingLR(o, T_max=20, eta_min=0.005)),
    ("warmup_constant", lr.warmup(peak=0.04, steps=5), 0.04,
     lambda o: _warmup_then(o, 5, lambda o: TL.ConstantLR(o, factor=1.0))),
    ("warmup_cosine", lr.warmup(peak=0.04, steps=4, after=lr.cosine_decay(peak=0.04, final=0.004, steps=16)),
     0.04, lambda o: _warmup_then(o, 4, lambda o: TL.CosineAnnealingLR(o, T_max=16, eta_min=0.004))),
    ("warmup_linear", lr.warmup(peak=0.02, steps=3, after=lr.linear_decay(peak=0.02, final=0.0, steps=10)),
     0.02, lambda o: _warmup_then(o, 3, lambda o: TL.LinearLR(o, 1.0, 0.0, total_iters=10))),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,schedule,base_lr,make_sched", SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_schedule_matches_torch(name, schedule, base_lr, make_sched, backend):
    got = lr_trace(schedule, STEPS, backend)
    want = torch_lr_trace(make_sched, base_lr, STEPS)
    for t, (g, w) in enumerate(zip(got, want)):
        assert g == pytest.approx(w, rel=1e-4, abs=1e-7), f"{name}: lr at step {t}: {got} vs {want}"
    # the Python formula that documents the schedule is the one the program runs
    assert [schedule.value(t) for t in range(STEPS)] == pytest.approx(want, rel=1e-6, abs=1e-9)


def test_schedules_hold_final_value_after_their_steps():
    """lr.py's decays stop at `final` (torch's CosineAnnealingLR would rise again)."""
    got = lr_trace(lr.cosine_decay(peak=0.05, final=0.01, steps=6), 12)
    assert got[6:] == pytest.approx([0.01] * 6, rel=1e-5)
    got = lr_trace(lr.linear_decay(peak=0.05, final=0.01, steps=6), 12)
    assert got[6:] == pytest.approx([0.01] * 6, rel=1e-5)


@pytest.mark.parametrize("name,schedule", [(s[0], s[1]) for s in SCHEDULES], ids=[s[0] for s in SCHEDULES])
def test_schedule_round_trips_as_plain_data(name, schedule):
    d = schedule.to_dict()
    back = lr.from_dict(json.loads(json.dumps(d)))  # plain data: survives JSON
    assert back == schedule
    assert [back.value(t) for t in range(STEPS)] == [schedule.value(t) for t in range(STEPS)]
    # an optimizer also takes the dict form
    assert lr_trace(d, 3) == pytest.approx([schedule.value(t) for t in range(3)], rel=1e-5)


def test_nested_warmup_round_trips():
    s = lr.warmup(peak=1.0, steps=2, after=lr.warmup(peak=0.5, steps=3, after=lr.constant(0.1)))
    assert lr.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert [s.value(t) for t in range(7)] == pytest.approx([0.5, 1.0, 0.5 / 3, 1 / 3, 0.5, 0.1, 0.1])



# ---------------------------------------------------------------- the default decay rule

# Which params weight decay touches when Module.param is given no decay=: tensorgrad's rule,
# written out here independently of init.Init.decays (weights decay, biases and gains do not).
DEFAULT_DECAY = {"randn": True, "kaiming": True, "uniform": True, "literal": True,
                 "zeros": False, "ones": False}


class Kinds(Module):
    """One param of each init kind, all with the default decay rule, plus the two overrides."""

    def __init__(self):
        super().__init__()
        self.randn = self.param([D_IN, D_OUT], init="randn")
        self.kaiming = self.param([D_IN, D_OUT], init="kaiming")
        self.uniform = self.param([D_OUT], init=init.uniform(0.5))
        self.literal = self.param([D_OUT], init=init.literal([0.1, -0.2, 0.3, 0.4]))
        self.zeros = self.param([D_OUT], init="zeros")
        self.ones = self.param([D_OUT], init="ones")
        self.ones_on = self.param([D_OUT], init="ones", decay=True)
        self.randn_off = self.param([D_OUT], init="randn", decay=False)


KIND_DECAYS = {**DEFAULT_DECAY, "ones_on": True, "randn_off": False}


def kinds_loss(m, inp):
    h = ops.tanh(inp["x"] @ (m.randn + m.kaiming) + m.uniform + m.literal + m.zeros)
    return ops.mean_all((h * m.ones * m.ones_on + m.randn_off - inp["y"]) ** 2)


def torch_kinds_loss(p, x, y):
    h = torch.tanh(x @ (p["randn"] + p["kaiming"]) + p["uniform"] + p["literal"] + p["zeros"])
    return ((h * p["ones"] * p["ones_on"] + p["randn_off"] - y) ** 2).mean()


def test_default_decay_rule_per_init_kind():
    specs = dict(Kinds().named_specs())
    assert {n: s.decays for n, s in specs.items()} == KIND_DECAYS


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,wg_opt,make_torch_opt", [
    ("adamw", optim.AdamW(lr=0.01, weight_decay=0.5),
     lambda g: torch.optim.AdamW(g(0.5), lr=0.01)),
    ("adam_l2", optim.Adam(lr=0.01, weight_decay=0.5), lambda g: torch.optim.Adam(g(0.5), lr=0.01)),
    ("sgd", optim.SGD(lr=0.1, weight_decay=0.5), lambda g: torch.optim.SGD(g(0.5), lr=0.1)),
    ("lion", optim.Lion(lr=0.01, weight_decay=0.5), lambda g: TorchLion(g(0.5), lr=0.01)),
])
def test_weight_decay_follows_the_rule_for_every_init_kind(name, wg_opt, make_torch_opt, backend):
    """A large decay (0.5) on every kind of param: turning decay off for a randn/kaiming
    param, or on for a ones/zeros one, moves that param visibly away from torch's."""
    c = wg.compile_module(Kinds, kinds_loss, inputs={"x": [B, D_IN], "y": [B, D_OUT]},
                          optimizer=wg_opt, backend=backend, seed=5)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in c.download_params().items()}
    assert tp.keys() == KIND_DECAYS.keys()

    def torch_groups(wd):
        return [{"params": [tp[n] for n, d in KIND_DECAYS.items() if d], "weight_decay": wd},
                {"params": [tp[n] for n, d in KIND_DECAYS.items() if not d], "weight_decay": 0.0}]
    topt = make_torch_opt(torch_groups)
    for feed in batches(5, seed=1):
        c.step(feed)
        topt.zero_grad()
        torch_kinds_loss(tp, torch.from_numpy(feed["x"]), torch.from_numpy(feed["y"])).backward()
        topt.step()
    got = c.download_params()
    for k, v in tp.items():
        np.testing.assert_allclose(got[k], v.detach().numpy(), atol=2e-5, err_msg=f"{name}: {k}")
