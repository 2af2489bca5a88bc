"""End-to-end training on the reference executor, with the shared models of tests/models.py.

  * tensorgrad's MLP fits sin(x) below a loss of 1e-3 within 1000 Adam steps; the trained
    weights are then checked with a numpy forward pass on a grid webgrad never saw.
  * the tiny causal transformer's loss and every parameter gradient at init equal a torch
    implementation of the same model, loaded with the downloaded parameters;
  * the transformer overfits a fixed batch of the reversal task, and its greedy answers
    (argmax of the logits, from a sibling forward program) are the reversed digits.
"""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import models

BACKENDS = ["reference", "torch"]


def numpy_mlp(p: dict, x: np.ndarray) -> np.ndarray:
    h = np.maximum(x @ p["l1.W"] + p["l1.b"], 0)
    h = np.maximum(h @ p["l2.W"] + p["l2.b"], 0)
    return h @ p["l3.W"] + p["l3.b"]


def test_mlp_fits_sin():
    c = models.compile_mlp("reference", seed=0)
    rng = random.Random(0)
    losses = []
    for _ in range(1000):
        losses.append(c.step(models.sin_batch(rng)))
        if losses[-1] < 1e-3:
            break  # reached: the rest of the budget would only cost time
    assert losses[-1] < 1e-3, f"loss after {len(losses)} steps: {losses[-1]:.2e}"
    assert losses[0] > 0.1  # it started far away, so getting here was learning
    # independent check of what was learned: numpy forward on an unseen grid
    grid = np.linspace(-math.pi + 0.05, math.pi - 0.05, 301, dtype=np.float32)[:, None]
    err = np.mean((numpy_mlp(c.download_params(), grid) - np.sin(grid)) ** 2)
    assert err < 5e-3, err


# ---------------------------------------------------------------- transformer vs torch

def torch_transformer_loss(p: dict, idx: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The same model as models.Transformer, written with torch.nn.functional."""
    d, H = models.D_MODEL, models.N_HEADS
    x = p["tok.W"][idx] + p["pos"]
    B, T, _ = x.shape
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(models.N_LAYERS):
        q_ = f"blocks.{i}."
        h = F.layer_norm(x, (d,), p[q_ + "ln1.weight"], p[q_ + "ln1.bias"], eps=1e-5)
        q, k, v = ((h @ p[q_ + w]).view(B, T, H, d // H).transpose(1, 2) for w in ("Wq", "Wk", "Wv"))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(d // H)
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + (att @ v).transpose(1, 2).reshape(B, T, d) @ p[q_ + "Wo"]
        h = F.layer_norm(x, (d,), p[q_ + "ln2.weight"], p[q_ + "ln2.bias"], eps=1e-5)
        x = x + F.gelu(h @ p[q_ + "W1"] + p[q_ + "b1"], approximate="tanh") @ p[q_ + "W2"] + p[q_ + "b2"]
    logits = F.layer_norm(x, (d,), p["ln_f.weight"], p["ln_f.bias"], eps=1e-5) @ p["head"]
    answer = logits[:, models.SEQ - models.HALF:]
    return F.cross_entropy(answer.reshape(-1, models.VOCAB), target.reshape(-1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_transformer_loss_and_grads_match_torch_at_init(backend):
    c = models.compile_transformer(backend, seed=1, optimizer=None)  # gradients only
    feed = models.reversal_batch(seed=2)
    assert c.param_names[:3] == ["tok.W", "pos", "blocks.0.ln1.weight"]
    loss = c.step(feed)
    grads = c.download_param_grads()
    params = c.download_params()
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    tl = torch_transformer_loss(tp, torch.tensor(feed["idx"]), torch.tensor(feed["target"]))
    tl.backward()
    assert loss == pytest.approx(tl.item(), rel=1e-5)
    assert set(grads) == set(tp)
    for k, g in grads.items():
        want = tp[k].grad.numpy()
        scale = max(float(np.max(np.abs(want))), 1e-3)
        err = float(np.max(np.abs(g - want)))
        assert err <= 2e-5 * scale, f"grad of {k}: max error {err:.2e} (scale {scale:.2e})"
    # optimizer=None computes gradients only: the parameters did not move
    for k, v in c.download_params().items():
        np.testing.assert_array_equal(v, params[k])


def test_transformer_overfits_reversal():
    c = models.compile_transformer("reference", seed=0)
    feed = models.reversal_batch(seed=0)
    losses = []
    for _ in range(300):
        losses.append(c.step(feed))
        if losses[-1] < 0.01:
            break
    assert losses[0] > 1.5, losses[0]  # ~log(12) at init: nothing known yet
    assert losses[-1] < 0.01, f"loss after {len(losses)} steps: {losses[-1]:.3f}"
    # the answers themselves: greedy predictions on the answer half are the reversed digits
    fwd = c.compile_forward(lambda m, inp: models.transformer_logits(m, inp["idx"]),
                            inputs={"idx": models.TF_INPUTS["idx"]})
    logits = fwd.run({"idx": feed["idx"]})
    assert logits.shape == (models.TF_B, models.SEQ, models.VOCAB)
    pred = logits[:, models.SEQ - models.HALF:].argmax(-1)
    np.testing.assert_array_equal(pred, np.array(feed["target"]))


def test_models_source_is_plain_webgrad():
    """The browser suite ships models.source() into Pyodide, which has no numpy or torch."""
    src = models.source()
    imports = {line.split()[1].split(".")[0] for line in src.splitlines()
               if line.startswith(("import ", "from "))}
    assert imports == {"__future__", "math", "random", "webgrad"}, imports
    namespace: dict = {}
    exec(compile(src, "models.py", "exec"), namespace)  # self-contained: runs on its own
    assert "Transformer" in namespace and "MLP" in namespace
