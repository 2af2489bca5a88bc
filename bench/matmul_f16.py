#!/usr/bin/env python3
"""TFLOP/s of webgrad's subgroup-matrix f16 matmul (codegen/matmul_mma.py: f16 A and B, f32
accumulation) against torch's fp16 and fp32 matmuls on the same GPU, in one run.

    python3 bench/matmul_f16.py                         # 4096^3, the default tilings, Dawn
                                                        # robustness on and off
    python3 bench/matmul_f16.py --size 2048 --tilings 128x128x32:2x2,64x64x32:2x2:db
    python3 bench/matmul_f16.py --robustness off        # only with disable_robustness
    python3 bench/matmul_f16.py --shapes 4096x2304x768,4096x768x3072   # M x N x K each

Needs an adapter with shader-f16 and chromium-experimental-subgroup-matrix (Dawn through
wgpudawn; webgpu_device asks for both, with the toggles NVIDIA's Vulkan driver needs); it
says so and stops elsewhere. Tilings: BMxBNxBK:SG_MxSG_N[:db][:nopre][:f16][:mx][:padP], the
fields of matmul_mma.MmaTiling (swG workgroups in bands of G tile rows, n8 the 16x8x16 configuration, db double buffering, nopre no register prefetch, f16 an f16
C, mx slabs copied with subgroup-matrix loads and stores, padP P halves of row padding). Each kernel is checked against float64 products of the same f16 inputs on sampled rows
(max |err| / max |want|), then timed as bench/matmul.py times kernels: the wall clock around
one submission of --reps back-to-back dispatches to work done, the best of three, after a
warm-up submission. torch: CUDA events around --reps products (fp32 with TF32 off).
Robustness "on" is Dawn's default (bounds clamping around each access); "off" makes a
second device with the device toggle disable_robustness.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pkg"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_tiling(text: str, cfg):
    from webgrad.codegen.matmul_mma import MmaTiling
    parts = text.split(":")
    bm, bn, bk = (int(v) for v in parts[0].split("x"))
    sgm, sgn = (int(v) for v in parts[1].split("x"))
    kw = dict(bm=bm, bn=bn, bk=bk, sg_m=sgm, sg_n=sgn, m=cfg[0], n=cfg[1], k=cfg[2],
              subgroup_size=cfg[3])
    for f in parts[2:]:
        if f == "db":
            kw["double_buffer"] = True
        elif f == "nopre":
            kw["prefetch"] = False
        elif f == "f16":
            kw["out"] = "f16"
        elif f.startswith("sw"):
            kw["swizzle"] = int(f[2:])
        elif f == "n8":   # the 16x8x16 configuration, where the adapter has it
            kw["n"] = 8
        elif f == "mx":
            kw["copy"] = "matrix"
        elif f.startswith("pad"):
            kw["pad"] = int(f[3:])
        else:
            sys.exit(f"--tilings {text}: unknown field {f!r}")
    return MmaTiling(**kw)


def run_kernel(host, np, A16, B16, want_rows, rows, tiling, reps, shape):
    from matmul import time_webgpu
    from webgrad.codegen.matmul_mma import mma_matmul_wgsl
    M, N, K = shape
    wgsl, groups = mma_matmul_wgsl(M, N, K, tiling, host.limits.get("max_compute_workgroup_storage_size"))
    cbytes = M * N * (2 if tiling.out == "f16" else 4)
    plan = {"buffers": [{"size": A16.nbytes}, {"size": B16.nbytes}, {"size": cbytes}],
            "pipelines": [{"wgsl": wgsl}],
            "commands": [{"op": "dispatch", "pipeline": 0, "bindings": [0, 1, 2],
                          "workgroups": list(groups)}]}
    t0 = time.perf_counter()
    prog = host.load(plan)
    t_compile = time.perf_counter() - t0
    host.write(prog, 0, A16.tobytes())
    host.write(prog, 1, B16.tobytes())
    from webgrad.blocking import run_blocking
    raw = run_blocking(host.run(prog, {}, [2]))[0]
    C = np.frombuffer(raw, dtype=np.float16 if tiling.out == "f16" else np.float32).reshape(M, N)
    got = C[rows].astype(np.float64)
    err = float(np.abs(got - want_rows).max() / np.abs(want_rows).max())
    sec = time_webgpu(host, prog, reps, 1)
    host.unload(prog)
    return 2 * M * N * K / sec / 1e12, err, t_compile


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--shapes", default=None, help="MxNxK,... (C is M x N, K inner); default "
                    "--size cubed")
    ap.add_argument("--tilings", default="128x128x32:2x2,128x128x32:2x2:mx,128x256x32:2x4,"
                    "128x256x32:2x4:mx,256x128x32:4x2,256x128x32:4x2:mx,128x128x32:2x2:db,"
                    "128x128x32:2x2:f16")
    ap.add_argument("--robustness", default="on,off")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    import numpy as np
    from matmul import pick_lib
    lib = pick_lib()
    from webgrad.backends import webgpu_device, webgpu_native as wn
    shapes = ([tuple(int(v) for v in t.split("x")) for t in args.shapes.split(",")]
              if args.shapes else [(args.size,) * 3])
    rng = np.random.default_rng(0)
    data = {}
    for M, N, K in shapes:
        A16 = rng.standard_normal((M, K)).astype(np.float16)
        B16 = rng.standard_normal((K, N)).astype(np.float16)
        rows = np.sort(rng.choice(M, size=min(M, 64), replace=False))
        data[(M, N, K)] = (A16, B16, rows, A16[rows].astype(np.float64) @ B16.astype(np.float64))
    print(f"shapes {shapes}, f16 inputs N(0, 1); library {lib}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    results = []
    for mode in args.robustness.split(","):
        webgpu_device.DEVICE_TOGGLES = ("disable_robustness",) if mode == "off" else ()
        host = wn.NativeHost(private=True)
        print(f"\nrobustness {mode}: {host.info}; features {sorted(host.features)}")
        print(f"  subgroup matrix configs: {[(c['component_type'], c['result_component_type'], c['m'], c['n'], c['k'], c['max_subgroup_size']) for c in host.subgroup_matrix_configs]}")
        from webgrad.codegen.matmul_mma import config_for
        from webgrad.backends.webgpu import WebGPUBackend
        limits = WebGPUBackend(host).limits
        cfg = config_for(limits.subgroup_matrix)
        if not ("shader-f16" in host.features and cfg):
            sys.exit("this adapter offers no f16 subgroup matrices with f32 results: nothing to time")
        for shape in shapes:
            A16, B16, rows, want_rows = data[shape]
            label = "x".join(map(str, shape))
            for text in args.tilings.split(","):
                t = parse_tiling(text, cfg)
                try:
                    tf, err, tc = run_kernel(host, np, A16, B16, want_rows, rows, t, args.reps, shape)
                except Exception as e:
                    print(f"  {label} {text:24} FAILED: {type(e).__name__}: {str(e)[:600]}")
                    continue
                results.append((mode, f"{label} {text}", tf, err))
                print(f"  {label} {text:24} {tf:7.1f} TFLOP/s  rel err {err:.2e}  pipeline {tc:.2f} s", flush=True)
    if not args.no_torch:
        import torch
        from matmul import time_torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        for shape in shapes:
            A16, B16 = data[shape][:2]
            M, N, K = shape
            a, b = torch.from_numpy(A16).to(dev), torch.from_numpy(B16).to(dev)
            for name, (x, y) in (("fp16", (a, b)), ("fp32", (a.float(), b.float()))):
                s = time_torch(torch, x, y, args.reps, 3)
                tf = 2 * M * N * K / s / 1e12
                print(f"torch {name} ({dev}) {'x'.join(map(str, shape))}: {tf:7.1f} TFLOP/s")
                results.append(("torch", f"{'x'.join(map(str, shape))} torch {name}", tf, 0.0))
    print("\n| kernel | robustness | TFLOP/s | rel err |\n|---|---|---|---|")
    for mode, text, tf, err in results:
        print(f"| {text} | {mode if mode != 'torch' else '-'} | {tf:.1f} | {err:.1e} |")


if __name__ == "__main__":
    main()
