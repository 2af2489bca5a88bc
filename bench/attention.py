#!/usr/bin/env python3
"""One causal attention training step (forward and the q, k, v gradients): webgrad with
its fused attention kernels, webgrad with them off (matmul + softmax, scores stored), and
torch eager fp32 (TF32 off) on the same GPU.

    python3 bench/attention.py                                  # GPT-2 shapes (a GPU machine)
    python3 bench/attention.py --shapes 1x2x128x64 --reps 3     # lavapipe / CPU: small
    python3 bench/attention.py --rows --profile                 # + the row kernels, kernel times
    python3 bench/attention.py --variants all --profiles 7      # tiled block shapes / options

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

--variants compares the tiled kernels' block shapes and code options (VARIANTS:
KernelOptions.attn_blocks and attn_opts, codegen/options.py) side by side: per shape and variant, the median over
--profiles profiled steps of each attention kernel's GPU time, their total and TFLOP/s
(the causal half's FLOPs: 4 BHT^2D/2 forward, 10 backward with the recomputed scores),
next to torch's whole step. Set WEBGRAD_DAWN_TOGGLES=allow_unsafe_apis,-timestamp_quantization
for unquantised timestamps.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pkg"))


def attention_model(shape):
    """(Module class, loss) of the benched step: q, k, v parameters of [B, H, T, D] and
    loss = sum(softmax_causal_last(q @ k^T / sqrt(D)) @ v * w)."""
    from webgrad import Module, ops
    B, H, T, D = shape

    class M(Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (self.param([B, H, T, D], init="zeros") for _ in range(3))

    def loss(m, inp):
        s = m.q @ ops.swap_axes(m.k, -1, -2) * (1 / math.sqrt(D))
        return ops.sum_all((ops.softmax_causal_last(s) @ m.v) * inp["w"])
    return M, loss


def webgrad_step(shape, fused: bool, reps: int, warmup: int, seed: int = 0, tiled=None,
                 profile: bool = False):
    import numpy as np
    import webgrad as wg
    from webgrad.codegen import KernelOptions
    B, H, T, D = shape

    M, loss = attention_model(shape)

    # fused whatever the adapter's policy (attention_match._fuse_training) says, or not at all
    opts = KernelOptions(fuse_attention=True, attn_tiled=tiled) if fused else KernelOptions(fuse_attention=False)
    c = wg.compile_module(M, loss, inputs={"w": [B, H, T, D]}, optimizer=None, backend="webgpu",
                          kernel_options=opts)
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


NONE = frozenset()
ALL_OFF = {"heavy_first": False, "red_in_as": False, "ws_vec": False, "exact": False,
           "prefetch_d": NONE, "prefetch_x": NONE}
# name: (blocks forced for every attention op or None for choose_blocks', options changed)
VARIANTS = {
    "64x64 options off": ((64, 64, 32, 16), ALL_OFF),
    "default": (None, {}),
    "default -heavy_first": (None, {"heavy_first": False}),
    "default -prefetch_d": (None, {"prefetch_d": NONE}),
    "default -prefetch_x": (None, {"prefetch_x": NONE}),
    "default -prefetch": (None, {"prefetch_d": NONE, "prefetch_x": NONE}),
    "default, x fwd only": (None, {"prefetch_x": frozenset({"attn_fwd"})}),
    "default -ws_vec": (None, {"ws_vec": False}),
    "default -exact": (None, {"exact": False}),
    "default -x_whole": (None, {"x_whole": False}),
    "default -warp_tiles": (None, {"warp_tiles": False}),
    "128x64": ((128, 64, 16, 8), {}),
    "128x32": ((128, 32, 16, 8), {}),
    "64x128": ((64, 128, 8, 8), {}),
    "32x64": ((32, 64, 32, 16), {}),
    # (blocks, options, thread grid (WY, WX) of every op)
    "8 x 16 threads": (None, {}, (8, 16)),
    "16 x 8 threads": (None, {}, (16, 8)),
    "8 x 8 threads": (None, {}, (8, 8)),
}


def variant_times(shape, name, profiles: int):
    """{kernel op: median GPU ms} of one variant's step, and the loss."""
    import numpy as np
    import webgrad as wg
    import webgrad.codegen.attention_match as am
    from webgrad.codegen import KernelOptions
    B, H, T, D = shape
    blocks, code, *threads = VARIANTS[name]

    M, loss = attention_model(shape)

    kernel_options = KernelOptions(
        fuse_attention=True, attn_tiled=True,
        attn_blocks=None if blocks is None else {op: blocks for op in am.ATTN_OPS},
        attn_threads={op: threads[0] for op in am.ATTN_OPS} if threads else None,
    ).with_attn_opts(**code)
    c = wg.compile_module(M, loss, inputs={"w": [B, H, T, D]}, optimizer=None, backend="webgpu",
                          kernel_options=kernel_options)
    rng = np.random.default_rng(0)
    c.upload_params({n: rng.standard_normal((B, H, T, D)).astype(np.float32) for n in "qkv"})
    feed = {"w": rng.standard_normal((B, H, T, D)).astype(np.float32)}
    lossv = c.step(feed)
    c.step(feed)
    per: dict[str, list[float]] = {}
    for _ in range(profiles):
        for r in c.profile(feed).rows:
            if r.name.startswith("attn_") and r.seconds is not None:
                per.setdefault(r.name.split()[0], []).append(r.seconds * 1e3)
    c.destroy()
    return {k: statistics.median(v) for k, v in per.items()}, lossv


def run_variants(args):
    import numpy as np
    names = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    for text in args.shapes.split(","):
        shape = tuple(int(v) for v in text.split("x"))
        B, H, T, D = shape
        rng = np.random.default_rng(0)
        vals = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
        w = rng.standard_normal(shape).astype(np.float32)
        lt, ms_t, dev = torch_step(vals, w, args.reps, args.warmup)
        half = B * H * T * T * D / 2
        print(f"\n{text}: torch step {ms_t:.3f} ms ({dev})")
        print(f"{'variant':>22} {'attn_fwd':>9} {'attn_dkv':>9} {'attn_dq':>9} {'total':>8} "
              f"{'fwd TF/s':>8} {'bwd TF/s':>8} {'x torch':>7}")
        for name in names:
            try:
                t, lv = variant_times(shape, name, args.profiles)
            except Exception as e:  # a block that does not fit the device, say
                print(f"{name:>22} {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            ok = abs(lv - lt) <= 1e-3 * abs(lt) + 1e-2
            f, k, q = t.get("attn_fwd", 0), t.get("attn_dkv", 0), t.get("attn_dq", 0)
            tot = f + k + q
            print(f"{name:>22} {f:9.3f} {k:9.3f} {q:9.3f} {tot:8.3f} "
                  f"{4 * half / f / 1e9 if f else 0:8.1f} "
                  f"{10 * half / (k + q) / 1e9 if k + q else 0:8.1f} {tot / ms_t:7.2f}"
                  + ("" if ok else f"  LOSS MISMATCH {lv} vs {lt}"), flush=True)


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
    ap.add_argument("--variants", default=None,
                    help="'all' or comma-separated VARIANTS names: compare tiled block shapes")
    ap.add_argument("--profiles", type=int, default=5, help="profiled steps per variant")
    args = ap.parse_args()
    if args.variants:
        return run_variants(args)
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
