#!/usr/bin/env python3
"""Causal attention's training step in precision="mixed" on a GPU with subgroup matrices:
webgrad's fused kernels on them (codegen/attention_mma.py, the default there), the tiled
fused kernels with f32 maths (attn_mma=False), the unfused program (scores and
probabilities stored in f16, products on the tensor cores) and torch fp16 autocast with
scaled_dot_product_attention (flash attention) on the same GPU. A correctness check and a
benchmark:

    source .device/env.sh; python3 bench/attention_mma.py                 # the H200 (Dawn)
    python3 bench/attention_mma.py --shapes 8x12x512x64,2x4x200x64 --reps 5

A shape is BxHxTxD; loss = sum(softmax_causal_last(q @ k^T / sqrt(D)) @ v * w), q, k, v
parameters (one SGD step of lr 0: the gradients are read back). Per form: the loss and the
q, k, v gradients against the unfused mixed program's (the largest difference over the
largest value), the step's GPU time (the profiler's sum over one step) and its wall time
(median of --reps, the loss read back), the attention kernels' GPU time and planned bytes.
Tolerances as tests/test_precision.py's (loss 1e-4 relative: a sum of 3M terms, dV 1e-3 and dQ / dK 4e-3 of
their largest value); exit status 1 where a fused form is out of them or did not take the
kernels it names.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pkg"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

FORMS = {"mma": dict(attn_mixed=True), "tiled f32 maths": dict(attn_mixed=True, attn_mma=False),
         "unfused": dict(attn_mixed=False)}
TOL = {"loss": 1e-4, "v": 1e-3, "q": 4e-3, "k": 4e-3}


def webgrad_form(shape, opts, vals, w, reps):
    import numpy as np
    import webgrad as wg
    from webgrad import optim
    from webgrad.codegen import KernelOptions
    from attention import attention_model   # bench/attention.py's step, q, k, v parameters
    M, loss = attention_model(shape)
    c = wg.compile_module(M, loss, inputs={"w": list(shape)}, optimizer=optim.SGD(lr=0.0),
                          backend="webgpu", precision="mixed", kernel_options=KernelOptions(**opts))
    c.upload_params(vals)
    feed = {"w": w}
    lv = float(c.step(feed))
    grads = {k: np.asarray(v) for k, v in c.download_param_grads().items()}
    c.step(feed)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        c.step(feed)
        times.append(time.perf_counter() - t)
    prof = c.profile(feed)
    attn = sum(r.seconds for r in prof.rows if r.name.startswith("attn_") and r.seconds)
    names = sorted({r.name for r in prof.rows if r.name.startswith("attn_")})
    out = dict(loss=lv, grads=grads, wall=statistics.median(times) * 1e3,
               gpu=None if prof.total_seconds is None else prof.total_seconds * 1e3,
               attn=attn * 1e3, names=names, bytes=c.memory_report()["planned_bytes"],
               kernels=c.kernel_count)
    c.destroy()
    return out


def torch_flash(vals, w, reps):
    """torch fp16 autocast, scaled_dot_product_attention (is_causal): ms a step (CUDA events)."""
    import torch
    F = torch.nn.functional
    dev = "cuda"
    t = {n: torch.tensor(v, device=dev, requires_grad=True) for n, v in vals.items()}
    wt = torch.tensor(w, device=dev)
    scaler = torch.amp.GradScaler(dev)

    def step():
        with torch.autocast(dev, dtype=torch.float16):
            o = F.scaled_dot_product_attention(t["q"], t["k"], t["v"], is_causal=True)
            loss = (o.float() * wt).sum()
        scaler.scale(loss).backward()
        for x in t.values():
            x.grad = None
    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="8x12x512x64,8x16x1024x64,2x4x200x64")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    import numpy as np
    bad = []
    for text in args.shapes.split(","):
        shape = tuple(int(v) for v in text.split("x"))
        rng = np.random.default_rng(0)
        vals = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
        w = (rng.standard_normal(shape) * 1e-2).astype(np.float32)   # x 2^16: no overflow
        runs = {}
        for name, opts in FORMS.items():
            try:
                runs[name] = webgrad_form(shape, opts, vals, w, args.reps)
            except Exception as e:
                print(f"{text} {name}: {type(e).__name__}: {str(e)[:2000]}", flush=True)
                bad.append((text, name))
        flash = None if args.no_torch else torch_flash(vals, w, args.reps)
        print(f"\n{text}" + ("" if flash is None else f": torch fp16 sdpa step {flash:.3f} ms"))
        print(f"{'form':>16} {'GPU ms':>8} {'attn ms':>8} {'wall ms':>8} {'MiB':>7} {'kernels':>7} "
              f"{'loss err':>9} {'dq err':>8} {'dk err':>8} {'dv err':>8}  attention kernels")
        ref = runs.get("unfused")
        for name, r in runs.items():
            errs = {}
            if ref is not None:
                errs["loss"] = abs(r["loss"] - ref["loss"]) / abs(ref["loss"])
                for k in "qkv":
                    errs[k] = float(np.abs(r["grads"][k] - ref["grads"][k]).max()
                                    / np.abs(ref["grads"][k]).max())
            took = all(" mma " in n for n in r["names"]) if name == "mma" else True
            if name != "unfused" and (not took or any(errs.get(k, 0) > t for k, t in TOL.items())):
                bad.append((text, name))
            gpu = f"{r['gpu']:8.3f}" if r["gpu"] is not None else f"{'-':>8}"
            print(f"{name:>16} {gpu} {r['attn']:8.3f} {r['wall']:8.3f} {r['bytes'] / 2**20:7.1f} "
                  f"{r['kernels']:7d} {errs.get('loss', 0):9.2e} {errs.get('q', 0):8.2e} "
                  f"{errs.get('k', 0):8.2e} {errs.get('v', 0):8.2e}  {'; '.join(r['names'])}"
                  + ("" if took else "  (NOT on subgroup matrices)"), flush=True)
    if bad:
        print(f"\nout of tolerance or not taken: {bad}")
        sys.exit(1)


if __name__ == "__main__":
    main()
