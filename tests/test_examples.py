"""The demos in examples/ run unchanged in CPython on backend="webgpu" (wgpu-py; lavapipe in CI).

Each runs a few steps here (full runs are `python3 examples/NAME.py`, figures in bench/README.md):
its losses on native WebGPU equal those of the same steps on the torch executor (same seed,
same batches), and the figures it reports for the playground are well formed. The data each
demo makes is checked against plain arithmetic (sums, the held-out split, the font).
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from webgrad import playground

REPO = Path(__file__).resolve().parents[1]


def _native_webgpu() -> str | None:
    try:
        from webgrad.backends.webgpu_native import NativeHost
        NativeHost()
        return None
    except Exception as e:
        return f"no native WebGPU adapter: {e}"


needs_webgpu = pytest.mark.skipif(_native_webgpu() is not None, reason=str(_native_webgpu()))


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def events():
    got: list[dict] = []
    playground.set_listener(got.append)
    yield got
    playground.set_listener(None)


def _same_losses(webgpu: list, torch: list) -> None:
    assert len(webgpu) == len(torch)
    for a, b in zip(webgpu, torch):
        assert math.isfinite(a) and math.isclose(a, b, rel_tol=2e-3, abs_tol=1e-4), (webgpu, torch)


def test_addition_data_is_right():
    ex = load("transformer_addition")
    pairs, held_out = ex.split()
    assert len(pairs) == 9000 and len(held_out) == 1000 and not set(pairs) & set(held_out)
    for a, b in [(0, 0), (47, 38), (99, 99), (5, 95)]:
        t = ex.tokens(a, b)
        assert t[2] == ex.PLUS and t[5] == ex.EQUALS
        assert 10 * t[0] + t[1] == a and 10 * t[3] + t[4] == b
        assert t[6] + 10 * t[7] + 100 * t[8] == a + b


# The two transformer demos' full training steps compile 90-140 s of kernels on a cold
# lavapipe: slow cases here (the browser suite runs both demos in the page by default,
# tests/browser/test_playground.py)
@pytest.mark.slow
@needs_webgpu
def test_transformer_addition_runs_on_webgpu(events):
    ex = load("transformer_addition")
    runs, accuracy = {}, {}
    for backend in ("webgpu", "torch"):
        c = ex.build(backend, steps=50)
        runs[backend] = ex.train(c, steps=2, log=lambda *_: None, eval_every=0)["losses"]
        ev = ex.Evaluator(c, ex.split()[1][:8])
        accuracy[backend] = ev.accuracy()
        if backend == "webgpu":
            fig = ev.attention(47, 38)
        c.destroy()
    _same_losses(runs["webgpu"], runs["torch"])
    assert accuracy["webgpu"] == accuracy["torch"], accuracy  # the same answers, digit by digit
    assert fig["kind"] == "heatmaps" and len(fig["maps"]) == ex.LAYERS * ex.HEADS
    for m in fig["maps"]:  # causal attention: rows are distributions over keys <= query
        for i, row in enumerate(m["rows"]):
            assert abs(sum(row) - 1) < 1e-4 and all(v < 1e-6 for v in row[i + 1:])
    assert [e["step"] for e in events if "loss" in e][:2] == [0, 1]


@pytest.mark.slow
@needs_webgpu
def test_char_lm_runs_on_webgpu(events):
    ex = load("char_lm")
    data = ex.Data(ex.corpus())
    from pydoc_data.topics import topics
    assert len(data.ids) > 100_000 and "".join(data.chars[i] for i in data.ids[:40]) == \
        "\n\n".join(topics[k] for k in sorted(topics))[:40]
    runs = {}
    for backend in ("webgpu", "torch"):
        c = ex.build(data, backend, steps=50)
        out = ex.train(c, data, steps=2, log=lambda *_: None, sample_every=1, sample_chars=12)
        runs[backend] = out["losses"]
        c.destroy()
    _same_losses(runs["webgpu"], runs["torch"])
    assert abs(runs["webgpu"][0] - math.log(len(data.chars))) < 1.0  # starts near uniform
    texts = [e["figure"] for e in events if "figure" in e]
    assert texts and texts[0]["kind"] == "text" and len(texts[0]["text"]) == len("The ") + 12


@needs_webgpu
def test_digits_convnet_runs_on_webgpu(events):
    ex = load("digits_convnet")
    images, labels = ex.dataset(20, 0)
    assert len(images) == 20 * ex.S * ex.S and all(0 <= v <= 1 for v in images)
    for d in range(10):  # the glyph's ink count shows up in a clean 1x rendering
        assert sum(map(sum, ex.glyph(d))) == "".join(ex.FONT[d]).count("#")
    runs = {}
    for backend in ("webgpu", "torch"):
        c = ex.build(backend)
        out = ex.train(c, steps=2, log=lambda *_: None, eval_every=2, n_train=200, n_test=50)
        runs[backend] = out["losses"]
        c.destroy()
    _same_losses(runs["webgpu"], runs["torch"])
    fig = [e["figure"] for e in events if "figure" in e][0]
    assert fig["kind"] == "matrix" and len(fig["rows"]) == 10
    assert sum(map(sum, fig["rows"])) == 50  # every test image counted once


@needs_webgpu
def test_mlp_sin_reports_curve(events):
    ex = load("mlp_sin")
    import torch
    c = ex.compile_mlp("webgpu")
    losses = ex.fit(c, max_steps=3, target=0.0, log=None, draw_every=2)
    p = {k: torch.tensor(v, dtype=torch.float64) for k, v in c.download_params().items()}
    c.destroy()
    t = ex.compile_mlp("torch")
    _same_losses(losses, ex.fit(t, max_steps=3, target=0.0, log=None))
    figs = [e["figure"] for e in events if "figure" in e]
    assert len(figs) == 2  # steps 0 and 2 (the last)
    assert figs[0]["kind"] == "lines" and len(figs[0]["x"]) == ex.GRID
    sin, mlp = figs[-1]["series"][:2]
    assert all(abs(y - math.sin(x)) < 1e-6 for x, y in zip(figs[-1]["x"], sin["y"]))
    # the drawn fit is the trained MLP's forward over the grid, computed here by torch
    x = torch.tensor(figs[-1]["x"], dtype=torch.float64)[:, None]
    h = torch.relu(torch.relu(x @ p["l1.W"] + p["l1.b"]) @ p["l2.W"] + p["l2.b"])
    want = (h @ p["l3.W"] + p["l3.b"])[:, 0].tolist()
    assert max(abs(a - b) for a, b in zip(mlp["y"], want)) < 1e-5, (mlp["y"][:4], want[:4])
