#!/usr/bin/env python3
"""The LoRA step's rank-r products, one at a time: webgrad's kernel for each KernelOptions
variant against torch.matmul (fp32, TF32 off) on the same GPU, in one process.

    source .device/env.sh; python3 bench/thin_products.py           # every shape, the variants
    python3 bench/thin_products.py --shapes uBT_8192,xAT_2048 --variant "bk128 thin_bk=128"
    python3 bench/thin_products.py --dry                            # lavapipe: correctness only

The shapes are the Llama-1B LoRA step's (bench/lora_step.py --rows 1b: T = 4 x 512 tokens,
hidden 2048, MLP 8192, r 16), as its profile names them (bench/README.md, "The H200 round of
2026-12-04"), with the operands stored as the step stores them: a factor read through a
transpose (x A^T of A [r, in]: B stored [N, K], "tb"), an activation gradient's transpose
(dA = du^T x: A stored [K, M], "ta"); ":add" adds a stored [M, N] tensor in the product's
epilogue (the forward's base + (x A^T) B^T: one more read of C's size). Variants (--variant
"NAME SET SET..", each SET a KernelOptions NAME=VALUE as bench/lora_step.py's --set takes;
repeatable; the defaults are VARIANTS): the first is the baseline of the "x" column. Each
kernel's result is checked against float64 torch on sampled rows before it is timed
(wall clock around --reps back-to-back dispatches in one submission, bench/matmul.py's
time_webgpu; torch with CUDA events). "GB/s": the operands' and C's bytes (and the added
tensor's) over the time. --dry: the H200's row of codegen/matmul_config.py on this adapter
with the tiled kernel forced (lavapipe: the same kernels as on the H200), the shapes'
large sides divided by --scale, one rep: correctness, not speed.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pkg"))
sys.path.insert(0, str(ROOT / "bench"))

# name: (M, K, N, stored transposed: "ta" / "tb" / "", what it is in the step)
SHAPES = {
    "uBT_8192": (2048, 16, 8192, "tb", "(x A^T) B^T of gate, up"),
    "uBT_8192:add": (2048, 16, 8192, "tb", "... + the base product"),
    "uBT_2048": (2048, 16, 2048, "tb", "(x A^T) B^T of q, o, down"),
    "uA_2048": (2048, 16, 2048, "", "(dY B) A of q, k, v, o, gate, up"),
    "uA_8192": (2048, 16, 8192, "", "(dY B) A of down"),
    "uBT_512": (2048, 16, 512, "tb", "(x A^T) B^T of k, v"),
    "xAT_2048": (2048, 2048, 16, "tb", "x A^T of o; dY B of q, o"),
    "xAT_8192": (2048, 8192, 16, "tb", "x A^T of down; dY B of gate, up"),
    "dyB_512": (2048, 512, 16, "", "dY B of k, v"),
    "xAT_48": (2048, 2048, 48, "tb", "x A^T of q, k, v (thin_siblings)"),
    "xAT_32": (2048, 2048, 32, "tb", "x A^T of gate, up (thin_siblings)"),
    "dA_2048": (16, 2048, 2048, "ta", "dA = du^T x of q, k, v, o, gate, up"),
    "dA_8192": (16, 2048, 8192, "ta", "dA of down"),
    "dB_2048": (2048, 2048, 16, "ta", "dB = dY^T u of q, o, down"),
    "dB_8192": (8192, 2048, 16, "ta", "dB of gate, up"),
    "dB_512": (512, 2048, 16, "ta", "dB of k, v"),
}
# name and KernelOptions settings; the first is the "x" column's baseline
VARIANTS = [
    "old expand_k=0 thin_split=0",           # the table's tiles (before these rules)
    "default",                               # expand_config / thin_config as they are
    "thin512 thin_split=512",                # fewer K chunks (fewer chunk sums' bytes)
    "thin_bk128 thin_bk=128",                # longer K steps
    "expand_8rows expand_tile=(8,4,32,8,512)",
    "expand_2rows expand_tile=(2,4,32,8,2048)",
]


def parse_variant(text: str, base):
    from webgrad.codegen.options import with_setting
    name, *sets = text.split()
    opts = base
    for item in sets:
        opts = with_setting(opts, item)
    return name, opts


def build_graph(M: int, K: int, N: int, how: str, add: bool):
    """[M, K] @ [K, N] (+ c) with a stored [K, M] read transposed ("ta") or [N, K] ("tb")."""
    from webgrad.ir import Graph
    g = Graph()

    def operand(name, rows, cols, transposed):
        sh = (cols, rows) if transposed else (rows, cols)
        x = g.add("input", [], sh, "f32", {"name": name, "shape": sh, "dtype": "f32"})
        return g.add("transpose", [x], (rows, cols), "f32", {"perm": (1, 0)}) if transposed else x
    a = operand("a", M, K, how == "ta")
    b = operand("b", K, N, how == "tb")
    out = g.add("matmul", [a, b], (M, N), "f32")
    if add:
        c = g.add("input", [], (M, N), "f32", {"name": "c", "shape": (M, N), "dtype": "f32"})
        out = g.add("add", [out, c], (M, N), "f32")
    g.outputs["out"] = out
    return g


def time_torch(torch, fn, reps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1000 / reps)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--variant", action="append", default=None, metavar='"NAME SET.."',
                    help="a KernelOptions variant (repeatable; default: VARIANTS)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dry", action="store_true",
                    help="this adapter (lavapipe) with the H200's row and the tiled kernel: correctness only")
    ap.add_argument("--scale", type=int, default=None, help="divide the shapes' sides above 64 by this "
                    "(default 8 with --dry, else 1)")
    args = ap.parse_args()
    from matmul import pick_lib, time_webgpu
    lib = pick_lib()
    import numpy as np
    import torch
    from webgrad.backends.webgpu_native import NativeHost
    from webgrad.codegen import KernelOptions, Limits, lower
    from webgrad.codegen import matmul_config as mm
    from webgrad.compiled import run_blocking
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    host = NativeHost()
    base = KernelOptions()
    scale = args.scale or (8 if args.dry else 1)
    if args.dry:   # the H200's kernels on this adapter
        base = KernelOptions(tiling_row=mm.ADAPTER_TILINGS[0][1], force_direct=False, force_gemv=False)
        args.reps, args.warmup = 1, 0
    variants = [parse_variant(v, base) for v in (args.variant or VARIANTS)]
    print(f"webgpu: {host.info} (library {lib}); torch {torch.__version__} on "
          f"{torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}, fp32, TF32 off"
          + (f"; --dry: the H200 row, sides / {scale}, correctness only" if args.dry else ""))
    print(f"{'shape':>13} {'variant':>14} {'kernel(s)':>40} {'us':>8} {'GB/s':>6} {'x':>5} "
          f"{'torch us':>8} {'ratio':>5}  max err")
    rng = np.random.default_rng(0)
    wrong = 0
    for key in [s for s in args.shapes.split(",") if s]:
        if key not in SHAPES:
            raise SystemExit(f"--shapes: {key!r} is not one of {', '.join(SHAPES)}")
        M, K, N, how, _what = SHAPES[key]
        M, K, N = (d // scale if d > 64 else d for d in (M, K, N))
        add = key.endswith(":add")
        A = rng.standard_normal((M, K), dtype=np.float32)
        B = rng.standard_normal((K, N), dtype=np.float32)
        C = rng.standard_normal((M, N), dtype=np.float32) if add else None
        Ain = np.ascontiguousarray(A.T) if how == "ta" else A
        Bin = np.ascontiguousarray(B.T) if how == "tb" else B
        tA, tB = torch.from_numpy(Ain).to(dev), torch.from_numpy(Bin).to(dev)
        tA, tB = (tA.T if how == "ta" else tA), (tB.T if how == "tb" else tB)
        tC = torch.from_numpy(C).to(dev) if add else None
        t_torch = time_torch(torch, (lambda: torch.matmul(tA, tB) + tC) if add else
                             (lambda: torch.matmul(tA, tB)), args.reps, args.warmup)
        rows = np.unique(np.linspace(0, M - 1, 16).astype(int))
        want = A[rows].astype(np.float64) @ B.astype(np.float64) + (C[rows] if add else 0.0)
        nbytes = 4 * (M * K + K * N + M * N * (2 if add else 1))
        first = None
        for vname, opts in variants:
            limits = Limits.from_host(host.limits)
            limits.adapter = host.info
            limits.options = opts
            low, names = lower(build_graph(M, K, N, how, add), limits)
            prog = host.load(low.plan)
            host.write(prog, low.feeds["a"], Ain.tobytes())
            host.write(prog, low.feeds["b"], Bin.tobytes())
            if add:
                host.write(prog, low.feeds["c"], C.tobytes())
            out = run_blocking(host.run(prog, {}, [low.outputs["out"][0]]))[0]
            got = np.frombuffer(out, np.float32, M * N).reshape(M, N)[rows]
            err = float(np.max(np.abs(got - want) / (1 + np.abs(want))))
            wrong += err > 1e-3
            t = time_webgpu(host, prog, args.reps, args.warmup)
            host.unload(prog)
            first = first or t
            kern = " + ".join(n.split(" K=")[-1].split(" ", 1)[-1] if " K=" in n else
                              "sum" if " K chunks" in n else n.split(" ", 2)[-1] for n in names)
            print(f"{key:>13} {vname:>14} {kern[:40]:>40} {t * 1e6:>8.1f} {nbytes / t / 1e9:>6.0f} "
                  f"{first / t:>5.2f} {t_torch * 1e6:>8.1f} {t_torch / t:>5.2f}  {err:.1e}"
                  + ("  WRONG" if err > 1e-3 else ""), flush=True)
    if wrong:
        raise SystemExit(f"{wrong} results differ from torch's")


if __name__ == "__main__":
    main()
