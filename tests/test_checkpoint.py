"""Checkpoints (CompiledModule.save/load, webgrad.io.checkpoint): resuming continues the loss
curve bit for bit on every backend, and the files interoperate with safetensors and torch.

The model has what makes resuming hard to fake: AdamW moments, a warmup + cosine learning
rate and dropout (both driven by the step counter), LayerNorm, and gradient clipping. The
uninterrupted run is the oracle: a resumed run in a fresh module (compiled from scratch,
with other initial weights) must reproduce its losses exactly.
"""
from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch

import safetensors.torch
import webgrad as wg
from webgrad import Module, lr, nn, ops, optim
from webgrad.io.checkpoint import CheckpointError
from webgrad.io.safetensors import SafetensorsError

B, D_IN, D_H = 8, 5, 16


class Net(Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(D_IN, D_H)
        self.ln = nn.LayerNorm(D_H)
        self.l2 = nn.Linear(D_H, 1)


def loss_fn(m, inp):
    h = ops.dropout(ops.gelu(m.ln.fwd(m.l1.fwd(inp["x"]))), 0.2)
    d = m.l2.fwd(h) - inp["y"]
    return ops.mean_all(d * d)


def compile_net(backend, seed=0, optimizer="adamw"):
    sched = lr.warmup(peak=0.02, steps=3, after=lr.cosine_decay(peak=0.02, final=0.001, steps=20))
    opt = {"adamw": optim.AdamW(lr=sched, weight_decay=0.1, clip_norm=1.0),
           "sgd": optim.SGD(lr=0.01, momentum=0.9)}[optimizer]
    return wg.compile_module(Net, loss_fn, inputs={"x": [B, D_IN], "y": [B, 1]}, optimizer=opt,
                             backend=backend, seed=seed)


def batch(i):
    rng = random.Random(i)
    xs = [[rng.uniform(-1, 1) for _ in range(D_IN)] for _ in range(B)]
    return {"x": xs, "y": [[sum(x) ** 2 - x[0]] for x in xs]}


def _webgpu():
    try:
        from webgrad.backends.webgpu_native import NativeHost
        NativeHost()
        return None
    except Exception as e:
        return f"no native WebGPU adapter: {e}"


BACKENDS = ["reference", "torch",
            pytest.param("webgpu", marks=[pytest.mark.webgpu,
                                          pytest.mark.skipif(bool(_webgpu()), reason=str(_webgpu()))])]


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_continues_the_loss_curve_exactly(backend, tmp_path):
    n, k = 10, 4
    whole = compile_net(backend)
    want = [whole.step(batch(i)) for i in range(n)]

    first = compile_net(backend)
    got = [first.step(batch(i)) for i in range(k)]
    path = tmp_path / "ck.safetensors"
    first.save(path)
    first.destroy()

    # same compile (the seed also keys the dropout masks), then made to differ in every
    # piece of state -- weights, moments, step -- so the load must overwrite them all
    resumed = compile_net(backend)
    resumed.step(batch(99))
    resumed.load(path)
    got += [resumed.step(batch(i)) for i in range(k, n)]
    assert got == want
    final = resumed.download_params()
    for name, w in whole.download_params().items():
        assert np.array_equal(final[name], w), name

    # parameters only: the step counter and moments start over, so the curve differs
    fresh = compile_net(backend)
    fresh.load(path, optimizer=False)
    assert fresh.step(batch(k)) != want[k]


def test_file_reads_in_safetensors_and_torch(tmp_path):
    c = compile_net("reference")
    for i in range(3):
        c.step(batch(i))
    path = tmp_path / "ck.safetensors"
    c.save(path)
    theirs = safetensors.torch.load_file(str(path))
    params = c.download_params()
    assert set(theirs) == set(params) | {"step"} | {k for k in theirs if k.startswith("opt/")}
    assert any(k.startswith("opt/") for k in theirs)
    assert theirs["step"].item() == 3.0
    for k, v in params.items():
        assert theirs[k].dtype == torch.float32 and np.array_equal(theirs[k].numpy(), v), k
    with safetensors.safe_open(str(path), "pt") as f:
        assert f.metadata() == {"format": "pt", "webgrad": "checkpoint", "step": "3", "seed": "0"}
    # params only, and bytes when no destination is given
    blob = c.save(optimizer=False)
    assert set(safetensors.torch.load(blob)) == set(params)


def test_torch_written_state_dict_loads(tmp_path):
    """A state dict made in torch (F32 and BF16, a [1]-shaped scalar) loads into webgrad."""
    c = compile_net("reference")
    g = torch.Generator().manual_seed(0)
    sd = {k: torch.randn(v, generator=g) for k, v in c.param_shapes.items()}
    sd["l1.b"] = sd["l1.b"].bfloat16()
    path = tmp_path / "theirs.safetensors"
    safetensors.torch.save_file(sd, str(path))
    c.load(path)
    got = c.download_params()
    for k, v in sd.items():
        assert np.array_equal(got[k], v.float().numpy()), k
    # with optimizer state written by torch too: shapes from the module, step as [1]
    c2 = compile_net("reference")
    c2.step(batch(0))
    full = {k: torch.from_numpy(np.asarray(v)) for k, v in
            safetensors.torch.load(c2.save()).items()}
    full["step"] = torch.tensor([7.0])
    c.load(safetensors.torch.save(full))
    assert c.save(optimizer=True) and safetensors.torch.load(c.save())["step"].item() == 7.0


def test_refused_load_changes_nothing(tmp_path):
    c = compile_net("reference")
    for i in range(2):
        c.step(batch(i))
    before = c.save()
    good = safetensors.torch.load(before)

    def refused(tensors, match, **kw):
        with pytest.raises((CheckpointError, SafetensorsError), match=match):
            c.load(safetensors.torch.save(tensors) if isinstance(tensors, dict) else tensors, **kw)
        assert c.save() == before

    refused({k: v for k, v in good.items() if k != "l2.W"}, "missing 'l2.W'")
    refused(good | {"l3.W": torch.zeros(2)}, "unknown tensor 'l3.W'.*parameters are l1.W")
    refused(good | {"l1.W": torch.zeros(3, 3)}, "'l1.W' has shape \\[3, 3\\], the module's is \\[5, 16\\]")
    refused(good | {"l1.b": torch.zeros(16, dtype=torch.int32)}, "'l1.b' has dtype I32")
    refused({k: v for k, v in good.items() if not k.startswith("opt/") and k != "step"},
            "optimizer=True but the file holds no optimizer state", optimizer=True)
    refused(before[:-3], "safetensors file <bytes>: data buffer|beyond the data buffer")
    # another optimizer's state: named, with the way out
    sgd = compile_net("reference", optimizer="sgd")
    with pytest.raises(CheckpointError, match="different optimizer.*optimizer=False"):
        sgd.load(before)
    sgd.load(before, optimizer=False)
    assert np.array_equal(sgd.download_params()["l1.W"], c.download_params()["l1.W"])


def test_file_objects():
    c = compile_net("reference")
    c.step(batch(0))
    buf = io.BytesIO()
    c.save(buf)
    c2 = compile_net("reference")
    c2.step(batch(7))
    c2.load(io.BytesIO(buf.getvalue()))
    assert c2.step(batch(1)) == c.step(batch(1))
