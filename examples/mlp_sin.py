"""Fit sin(x) on [-pi, pi] with a small MLP (tensorgrad's classic first test), on WebGPU.

The same file runs unchanged in CPython (native WebGPU through wgpu-py) and in the browser's
Pyodide worker (navigator.gpu), so it needs nothing but webgrad and the standard library: the
batches are drawn with `random` and `math` into `array.array`, never numpy.

    python3 examples/mlp_sin.py                  # webgpu; or: ... reference | torch | auto

In the playground (`python3 serve.py`, examples menu) the file runs as it is: the bottom of
the file compiles the model into the global `c` and trains it, and `webgrad.playground.report`
sends the loss and the fitted curve over the batch to the page while it trains. Elsewhere in
the worker, run the file's text and call `train()` (it blocks on the GPU through JSPI, which
the webgrad worker provides), or await `train_async()`.
"""
from __future__ import annotations

import array
import math
import random
import time

import webgrad as wg
from webgrad import Module, init, ops, optim, playground

B = 256  # batch size


class Linear(Module):
    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.W = self.param([d_in, d_out], init=init.kaiming())
        self.b = self.param([d_out], init="zeros")


class MLP(Module):
    """1 -> 64 -> 64 -> 1, relu between."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = Linear(1, 64), Linear(64, 64), Linear(64, 1)


def forward(m: MLP, x):
    h = ops.relu(x @ m.l1.W + m.l1.b)
    h = ops.relu(h @ m.l2.W + m.l2.b)
    return h @ m.l3.W + m.l3.b


def loss_fn(m: MLP, inputs):
    d = forward(m, inputs["x"]) - inputs["y"]
    return ops.sum_all(d * d) / B


def batch(rng: random.Random) -> dict:
    """x ~ U(-pi, pi), y = sin(x), as f32 array.arrays of B values (shape [B, 1])."""
    x = array.array("f", (rng.uniform(-math.pi, math.pi) for _ in range(B)))
    return {"x": x, "y": array.array("f", (math.sin(v) for v in x))}


def compile_mlp(backend: str = "webgpu", seed: int = 0):
    return wg.compile_module(MLP, loss_fn, inputs={"x": ([B, 1], "f32"), "y": ([B, 1], "f32")},
                             optimizer=optim.Adam(lr=0.005), backend=backend, seed=seed)


def _report(c, losses: list[float], seconds: float, target: float) -> dict:
    steps = len(losses)
    return {"steps": steps, "loss": losses[-1], "first_loss": losses[0],
            "reached": losses[-1] < target, "ms_per_step": 1e3 * seconds / max(steps, 1),
            "dispatches": c.kernel_count, "losses": losses[::10]}


GRID = 121  # points of the fitted curve drawn while training


def fit(c, max_steps: int = 1000, target: float = 1e-3, seed: int = 0, log=print,
        log_every: int = 100, draw_every: int = 0) -> list[float]:
    """Step `c` until the batch loss drops below `target` or `max_steps` steps ran; returns
    the losses. Every step's loss goes to `playground.report` (the page's chart); every
    `draw_every` steps (0: never) so does the fitted curve over the current batch."""
    rng = random.Random(seed)
    predict = None
    if draw_every:
        predict = c.compile_forward(lambda m, inp: forward(m, inp["x"]),
                                    inputs={"x": ([GRID, 1], "f32")})
        grid = [-math.pi + 2 * math.pi * k / (GRID - 1) for k in range(GRID)]
    losses: list[float] = []
    for step in range(max_steps):
        feed = batch(rng)
        losses.append(c.step(feed))
        figure = None
        done = losses[-1] < target or step == max_steps - 1
        if predict is not None and (step % draw_every == 0 or done):
            curve = _flat(predict.run({"x": grid}))
            order = sorted(range(64), key=lambda k: feed["x"][k])
            figure = playground.lines(
                f"fit after {step + 1} steps", grid,
                {"sin(x)": [math.sin(v) for v in grid], "MLP": curve}) | {
                "scatter": {"x": [feed["x"][k] for k in order], "y": [feed["y"][k] for k in order],
                            "name": "batch"}}
        playground.report(step=step, loss=losses[-1], figure=figure, total=max_steps)
        if log and step % log_every == 0:
            log(f"step {step:4d}  loss {losses[-1]:.6f}")
        if done:
            break
    return losses


def train(backend: str = "webgpu", max_steps: int = 1000, target: float = 1e-3, seed: int = 0,
          log=print, log_every: int = 100) -> dict:
    """Train until the batch loss drops below `target` or `max_steps` steps ran.

    Returns {"steps", "loss", "reached", "ms_per_step", "dispatches", "params", ...}.
    """
    c = compile_mlp(backend, seed)
    t0 = time.perf_counter()
    losses = fit(c, max_steps, target, seed, log, log_every)
    out = _report(c, losses, time.perf_counter() - t0, target)
    out["params"] = {k: [float(v) for v in _flat(p)] for k, p in c.download_params().items()}
    c.destroy()
    return out


async def train_async(backend: str = "webgpu", max_steps: int = 1000, target: float = 1e-3,
                      seed: int = 0, log=print, log_every: int = 100) -> dict:
    """`train` through the *_async API: no blocking, for code that awaits."""
    c = compile_mlp(backend, seed)
    rng = random.Random(seed)
    losses: list[float] = []
    t0 = time.perf_counter()
    for step in range(max_steps):
        losses.append(await c.step_async(batch(rng)))
        if log and step % log_every == 0:
            log(f"step {step:4d}  loss {losses[-1]:.6f}")
        if losses[-1] < target:
            break
    out = _report(c, losses, time.perf_counter() - t0, target)
    params = await c.download_params_async()
    out["params"] = {k: [float(v) for v in _flat(p)] for k, p in params.items()}
    c.destroy()
    return out


def _flat(value) -> list:
    """numpy array (CPython) or HostArray (Pyodide) -> flat list of floats."""
    return value.reshape(-1).tolist() if hasattr(value, "reshape") else list(value)


if __name__ == "__main__":
    backend = playground.example_backend()  # the page: "auto" (WebGPU, else the CPU's "wasm")
    c = compile_mlp(backend)  # a global: the page's weights buttons and kernel panel find it
    print(f"compiled on {c.backend.name}: {c.kernel_count} kernels per training step")
    t0 = time.perf_counter()
    losses = fit(c, draw_every=25)
    result = _report(c, losses, time.perf_counter() - t0, 1e-3)
    print(f"{'reached' if result['reached'] else 'did NOT reach'} loss {result['loss']:.2e} in "
          f"{result['steps']} steps, {result['ms_per_step']:.2f} ms/step, "
          f"{result['dispatches']} kernels per step")
