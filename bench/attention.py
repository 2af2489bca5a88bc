#!/usr/bin/env python3
"""One causal attention training step (forward and the q, k, v gradients): webgrad with
its fused attention kernels, webgrad with them off (matmul + softmax, scores stored), and
torch eager fp32 (TF32 off) on the same GPU.

    python3 bench/attention.py                                  # GPT-2 shapes (a GPU machine)
    python3 bench/attention.py --shapes 1x2x128x64 --reps 3     # lavapipe / CPU: small
    python3 bench/attention.py --rows --profile                 # + the row kernels, kernel times

A shape is BxHxTxD. "fused" forces the fused kernels (tiled on GPUs, attention_tiled.py)
whatever attention_match._fuse_training's policy says; --rows adds the older row kernels.
Each webgrad column gives the step's wall time (which includes uploading the `w` feed
and reading the loss back: 12-34 MB at the default shapes, and noisy) and its GPU time
(the profiler's sum of kernel times over one more step, where the adapter has timestamps).
The step is compile_module(optimizer=None) of
loss = sum(softmax_causal_last(q @ k^T / sqrt(D)) @ v * w), timed with the wall clock
around `step()` (one submission, the loss read back) as the median of --reps after
--warmup steps; kernels per step and planned GPU bytes are the compiler's. torch times
the same loss and autograd with CUDA events (the wall clock on the CPU). The fused and
unfused losses are checked against torch before timing.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pkg"))


def webgrad_step(shape, fused: bool, reps: int, warmup: int, seed: int = 0, tiled=None,
                 profile: bool = False):
    import numpy as np
    import webgrad as wg
    import webgrad.codegen.attention_match as am
    import webgrad.codegen.attention_tiled as at
    import webgrad.codegen.program as program
    from webgrad import Module, ops
    B, H, T, D = shape

    class M(Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (self.param([B, H, T, D], init="zeros") for _ in range(3))

    def loss(m, inp):
        s = m.q @ ops.swap_axes(m.k, -1, -2) * (1 / math.sqrt(D))
        return ops.sum_all((ops.softmax_causal_last(s) @ m.v) * inp["w"])

    saved = program.rewrite_attention, am._fuse_training, at.FORCE_TILED
    if not fused:
        program.rewrite_attention = lambda g, limits: g
    else:  # fused whatever the adapter's policy (attention_match._fuse_training) says
        am._fuse_training = lambda score_bytes, limits: True
        at.FORCE_TILED = tiled
    try:
        c = wg.compile_module(M, loss, inputs={"w": [B, H, T, D]}, optimizer=None, backend="webgpu")
    finally:
        program.rewrite_attention, am._fuse_training, at.FORCE_TILED = saved
    rng = np.random.default_rng(seed)
    vals = {n: rng.standard_normal((B, H, T, D)).astype(np.float32) for n in "qkv"}
    w = rng.standard_normal((B, H, T, D)).astype(np.float32)
    c.upload_params(vals)
    feed = {"w": w}
    first = c.step(feed)
    for _ in range(warmup):
        c.step(feed)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        c.step(feed)
        times.append(time.perf_counter() - t)
    rep = c.memory_report()
    prof = c.profile(feed)  # one more step, each kernel timed on the GPU
    if profile:
        print("\n".join(line for line in prof.text().splitlines()
                        if "attn_" in line or line.lstrip().startswith("#")), flush=True)
    gpu = None if prof.total_seconds is None else prof.total_seconds * 1e3
    out = (first, statistics.median(times) * 1e3, c.kernel_count, rep["planned_bytes"], gpu)
    c.destroy()
    return out, vals, w


def torch_step(vals, w, reps: int, warmup: int):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t = {n: torch.tensor(v, device=dev, requires_grad=True) for n, v in vals.items()}
    wt = torch.tensor(w, device=dev)
    D = w.shape[-1]
    T = w.shape[-2]
    mask = torch.ones(T, T, dtype=torch.bool, device=dev).tril()

    def step():
        s = (t["q"] @ t["k"].transpose(-1, -2)) * (1 / math.sqrt(D))
        s = s.masked_fill(~mask, float("-inf"))
        loss = ((torch.softmax(s, -1) @ t["v"]) * wt).sum()
        loss.backward()
        for x in t.values():
            x.grad = None
        return loss

    first = float(step().detach())
    for _ in range(warmup):
        step()
    times = []
    for _ in range(reps):
        if dev == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    return first, statistics.median(times), dev


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="8x12x512x64,8x12x1024x64,64x8x256x64")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-unfused", action="store_true", help="skip webgrad with fusion off")
    ap.add_argument("--rows", action="store_true",
                    help="also time the fused step with attention.py's row kernels (a thread "
                    "per row) instead of the tiled ones")
    ap.add_argument("--profile", action="store_true",
                    help="print the fused step's attention kernels with their GPU times")
    args = ap.parse_args()
    print(f"{'shape':>16} {'fused ms':>15} {'kern':>4} {'GB':>6} {'rows ms':>15} "
          f"{'unfused ms':>15} {'kern':>4} {'GB':>6} {'torch ms':>9} {'fused/torch':>11}")
    print(f"{'':>16} {'wall / GPU':>15} {'':>4} {'':>6} {'wall / GPU':>15} {'wall / GPU':>15}")

    def ms(wall, gpu):
        return f"{wall:.2f} / {'-' if gpu is None else f'{gpu:.2f}'}"
    for text in args.shapes.split(","):
        shape = tuple(int(v) for v in text.split("x"))
        (lf, ms_f, k_f, b_f, g_f), vals, w = webgrad_step(shape, True, args.reps, args.warmup,
                                                          profile=args.profile)
        lt, ms_t, dev = torch_step(vals, w, args.reps, args.warmup)
        assert abs(lf - lt) <= 1e-3 * abs(lt) + 1e-2, (lf, lt)
        row = [f"{text:>16}", f"{ms(ms_f, g_f):>15}", f"{k_f:4d}", f"{b_f / 1e9:6.2f}"]
        if args.rows:
            (lr, ms_r, _, _, g_r), _, _ = webgrad_step(shape, True, args.reps, args.warmup,
                                                        tiled=False)
            assert abs(lr - lt) <= 1e-3 * abs(lt) + 1e-2, (lr, lt)
            row.append(f"{ms(ms_r, g_r):>15}")
        else:
            row.append(f"{'-':>15}")
        if args.no_unfused:
            row += [f"{'-':>15}", f"{'-':>4}", f"{'-':>6}"]
        else:
            try:
                (lu, ms_u, k_u, b_u, g_u), _, _ = webgrad_step(shape, False, args.reps,
                                                                args.warmup)
                assert abs(lu - lt) <= 1e-3 * abs(lt) + 1e-2, (lu, lt)
                row += [f"{ms(ms_u, g_u):>15}", f"{k_u:4d}", f"{b_u / 1e9:6.2f}"]
            except Exception as e:  # the scores may not fit the device
                row += [f"{type(e).__name__:>15}", f"{'-':>4}", f"{'-':>6}"]
        row += [f"{ms_t:9.2f}", f"{ms_f / ms_t:11.2f}"]
        print(" ".join(row), f"(torch on {dev})", flush=True)


if __name__ == "__main__":
    main()
