#!/usr/bin/env python3
"""The compiler's subgroup-matrix products (codegen/matmul_mma.py through matmul._build_mma) on
a GPU that has them, each form against torch.autocast (fp16) and webgrad's reference executor
given the same parameters and inputs. A correctness check, not a benchmark:

    source .device/env.sh; python3 bench/mma_check.py      # the H200 (Dawn)
    python3 bench/mma_check.py --small                     # smaller batches (a CPU adapter)

Forms (precision="mixed", so every product has f16 operands):
  epilogue  gelu(x @ W + b), x [8, 512, 768]: a batch over one weight (one 4096-row product),
            its f16 rounding, bias and GELU in the kernel's epilogue
  residual  x + h @ W: the residual add in the epilogue
  batched   softmax(q @ k), q [96, 512, 64], k [96, 64, 512]: the batch on workgroup_id.z
  train     three AdamW steps of a 2-layer GPT (bench/gpt2_train.py's model, d 128, 4 x 128
            tokens), webgpu against the reference executor: losses (parameters reported)

For each: the kernels that took the subgroup-matrix path, and the largest differences.
Exit status 1 when a form's products did not take it or a difference is out of tolerance.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pkg"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def forward_forms(torch, k: int = 1):
    """{name: (factory, fn, inputs, torch fn)}; k > 1 divides the batch sizes (--small)."""
    from webgrad import Module, ops
    F = torch.nn.functional

    def lin(d_in, d_out, bias):
        class Net(Module):
            def __init__(self):
                super().__init__()
                self.W = self.param([d_in, d_out], init="randn")
                if bias:
                    self.b = self.param([d_out], init="randn")
        return Net
    return {
        "epilogue": (lin(768, 3072, True), lambda m, f: ops.gelu(ops.matmul(f["x"], m.W) + m.b),
                     {"x": [8 // k, 512, 768]},
                     lambda p, f: F.gelu(torch.matmul(f["x"], p["W"]) + p["b"], approximate="tanh")),
        "residual": (lin(3072, 768, False), lambda m, f: f["r"] + ops.matmul(f["x"], m.W),
                     {"x": [8 // k, 512, 3072], "r": [8 // k, 512, 768]},
                     lambda p, f: f["r"] + torch.matmul(f["x"], p["W"])),
        "batched": (Module, lambda m, f: ops.softmax_last(ops.matmul(f["q"], f["k"]) * 0.125),
                    {"q": [96 // k, 512, 64], "k": [96 // k, 64, 512]},
                    lambda p, f: torch.softmax(torch.matmul(f["q"], f["k"]) * 0.125, -1)),
    }


def mma_kernels(prog) -> list[str]:
    return [n for n in prog._prog.exe.kernel_names if " mma " in n]


def main() -> int:
    import numpy as np
    import torch
    import webgrad as wg
    from webgrad import optim
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ok = True
    rng = np.random.default_rng(0)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}")
    small = "--small" in sys.argv   # a CPU adapter: smaller batches (no mma kernel there)
    for name, (factory, fn, inputs, torch_fn) in forward_forms(torch, 8 if small else 1).items():
        feed = {k: (0.5 * rng.standard_normal(s)).astype(np.float32) for k, s in inputs.items()}
        outs = {}
        for backend in ("webgpu", "reference"):
            prog = wg.compile_forward(factory, fn, inputs=inputs, backend=backend, precision="mixed")
            if backend == "webgpu":
                params = prog.download_params()
                names = mma_kernels(prog)
            else:
                prog.upload_params(params)
            outs[backend] = np.asarray(prog.run(feed), np.float64)
            prog.destroy()
        tp = {k: torch.from_numpy(np.asarray(v, np.float32)).to(dev) for k, v in params.items()}
        tf = {k: torch.from_numpy(v).to(dev) for k, v in feed.items()}
        with torch.autocast(dev, dtype=torch.float16):
            want = torch_fn(tp, tf).float().cpu().numpy().astype(np.float64)
        scale = np.abs(want).max()
        d_ref = np.abs(outs["webgpu"] - outs["reference"]).max()
        d_torch = np.abs(outs["webgpu"] - want).max()
        d_ref_torch = np.abs(outs["reference"] - want).max()
        good = bool(names) and d_ref <= 2e-3 * scale and d_torch <= 2e-2 * scale
        ok &= good
        print(f"{name:9} mma kernels {names}  max |out| {scale:.3g}  |webgpu - reference| "
              f"{d_ref:.3g}  |webgpu - torch autocast| {d_torch:.3g}  |reference - torch| "
              f"{d_ref_torch:.3g}  {'ok' if good else 'FAIL'}", flush=True)
    # training: gradients and updates through the same kernels
    from gpt2_train import batch, webgrad_model
    d, layers, heads, vocab, context, B, T = 128, 2, 2, 512, 128, 4, 128
    factory, loss_fn = webgrad_model(d, layers, heads, vocab, context)
    res = {}
    for backend in ("webgpu", "reference"):
        c = wg.compile_module(factory, loss_fn, backend=backend, precision="mixed",
                              inputs={"idx": ([B, T], "i32"), "target": ([B, T], "i32")},
                              optimizer=optim.AdamW(lr=1e-3, weight_decay=0.01))
        if backend == "webgpu":
            p0 = c.download_params()
            names = [n for n in c._train.exe.kernel_names if " mma " in n]
        else:
            c.upload_params(p0)
        losses = []
        for s in range(3):
            idx, tgt = batch(np, vocab, B, T, s)
            losses.append(float(c.step({"idx": idx, "target": tgt})))
        res[backend] = (losses, c.download_params())
        c.destroy()
    dl = max(abs(a - b) for a, b in zip(res["webgpu"][0], res["reference"][0]))
    dp = max(float(np.abs(np.asarray(res["webgpu"][1][k], np.float64) - res["reference"][1][k]).max())
             for k in p0)
    moved = max(float(np.abs(np.asarray(res["reference"][1][k], np.float64) - p0[k]).max()) for k in p0)
    good = dl <= 1e-3   # the parameters: AdamW's m / sqrt(v) turns a rounding tie of a tiny
    ok &= good          # gradient into a whole step of lr, so they are reported, not judged
    print(f"train     losses webgpu {['%.5f' % x for x in res['webgpu'][0]]} reference "
          f"{['%.5f' % x for x in res['reference'][0]]}  max |loss diff| {dl:.3g}  max |param diff| "
          f"after 3 steps {dp:.3g} (largest move {moved:.3g})  mma kernels {len(names)}  {'ok' if good else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
