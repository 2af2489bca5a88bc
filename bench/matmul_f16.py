#!/usr/bin/env python3
"""TFLOP/s of webgrad's subgroup-matrix f16 matmul (codegen/matmul_mma.py: f16 A and B, f32
accumulation) against torch's fp16 and fp32 matmuls on the same GPU, in one run.

    python3 bench/matmul_f16.py                         # 4096^3, the default tilings, Dawn
                                                        # robustness on and off
    python3 bench/matmul_f16.py --size 2048 --tilings 128x128x32:2x2,64x64x32:2x2:db
    python3 bench/matmul_f16.py --robustness off        # only with disable_robustness
    python3 bench/matmul_f16.py --shapes 4096x2304x768,4096x768x3072   # M x N x K each
    python3 bench/matmul_f16.py --sweep                 # SWEEP's variants, 4096^3 and GPT-2's
                                                        # shapes, robustness off, torch fp16
    python3 bench/matmul_f16.py --sweep --dry           # no device: emit + emulate each one

Needs an adapter with shader-f16 and chromium-experimental-subgroup-matrix (Dawn through
wgpudawn; webgpu_device asks for both, with the toggles NVIDIA's Vulkan driver needs); it
says so and stops elsewhere. Tilings: BMxBNxBK:SG_MxSG_N[:field]..., the fields of
matmul_mma.MmaTiling: swG workgroups in bands of G tile rows, n8 the 16x8x16 configuration,
db double buffering, nopre no register prefetch, f16 an f16 C, mx slabs copied with
subgroup-matrix loads and stores, padP P halves of row padding, row the fragments of a row
of products at a time (frag), peel the last K step out of the loop (peel), wW W halves a
copy load (width: 8, 4, 2), oV (with f16) V halves of C a store (out_vec: 2, 4, 8), at / bt
A stored [K, M] / B stored [N, K] (a_t / b_t: the operand uploaded transposed), ax / bx
A's / B's slab transposed by the copy into workgroup memory (a_x / b_x); --set
FIELD=VALUE replaces a field in every tiling. Each kernel is checked against float64
products of the same f16 inputs on sampled rows (max |err| / max |want|), then timed as
bench/matmul.py times kernels: the wall clock around one submission of back-to-back
dispatches (--reps, or more where --reps-ms asks: --sweep's 50 ms of work at 250 TFLOP/s) to
work done, the best of three, after a warm-up submission. torch: CUDA events around as many
products (fp32 with TF32 off); the table gives each kernel's ratio to torch fp16, and the
best variant of each shape.
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
        elif f == "row":   # fragments a row of products at a time (MmaTiling.frag)
            kw["frag"] = "row"
        elif f == "peel":  # the last K step out of the loop (MmaTiling.peel)
            kw["peel"] = True
        elif f in ("at", "bt"):   # A stored [K, M] / B stored [N, K] (MmaTiling.a_t / b_t)
            kw[f[0] + "_t"] = True
        elif f in ("ax", "bx"):   # A's / B's slab transposed by the copy (MmaTiling.a_x / b_x)
            kw[f[0] + "_x"] = True
        elif f in ("o2", "o4", "o8"):   # f16 C: halves a store (MmaTiling.out_vec)
            kw["out_vec"] = int(f[1:])
        elif f.startswith("w"):   # halves per copy load: w8, w4, w2 (MmaTiling.width)
            kw["width"] = int(f[1:])
        else:
            sys.exit(f"--tilings {text}: unknown field {f!r}")
    return MmaTiling(**kw)


# --sweep's variants (MmaTiling, README's "matmul_f16.py" section): today's pick first, then
# the fragment order, K slabs of 64, double buffering (one barrier a K step), more subgroups
# (8: 128x256, 256x128, and 128x128 of 32x64 / 64x32 blocks), a 64x128 block per subgroup,
# row padding, the band walk, the peeled last K step and copies of 8 / 4 bytes a load (fewer
# bank conflicts in their f16 stores); each fits 48 KB of workgroup memory
SWEEP = ("128x128x32:2x2,128x128x32:2x2:row,128x128x16:2x2:row,128x128x64:2x2,"
         "128x128x64:2x2:row,128x128x32:2x2:db,128x128x32:2x2:db:row,128x128x16:2x2:db:row,"
         "128x256x32:2x4,128x256x32:2x4:row,256x128x32:4x2:row,128x128x32:4x2:row,"
         "128x128x32:2x4:row,128x256x32:2x2:row,128x128x32:2x2:row:pad16,"
         "128x128x32:2x2:row:sw8,128x256x32:2x4:row:sw8,128x128x32:2x2:peel,"
         "128x128x32:2x2:row:peel,128x256x32:2x4:row:peel,128x128x32:2x2:w4,128x128x32:2x2:w2,"
         "128x128x32:2x2:row:w2,128x256x32:2x4:row:w2,128x128x32:2x2:db:row:w2")
GPT2_SHAPES = "4096x4096x4096,4096x2304x768,4096x3072x768,4096x768x3072"


def with_sets(t, sets):
    """t with --set FIELD=VALUE's MmaTiling fields replaced (VALUE a Python literal)."""
    import ast
    from dataclasses import replace
    for item in sets:
        name, _, value = item.partition("=")
        t = replace(t, **{name.strip(): ast.literal_eval(value.strip())})
    return t


def reps_for(shape, reps: int, target_ms: float) -> int:
    """Dispatches a timing: at least `reps`, and enough for about target_ms of work at 250
    TFLOP/s (GPT-2's products take 0.1-0.5 ms, where 20 dispatches timed mostly the
    submission), at most 2000."""
    M, N, K = shape
    return max(reps, min(2000, int(target_ms * 1e-3 * 250e12 / (2 * M * N * K)) + 1))


def dry(tilings, shapes, sets, room: int) -> int:
    """Device-free: each tiling's WGSL at every shape (a refusal counts as a failure), and each tiling
    run by tests/test_matmul_mma.py's emulator on a small shape (two tiles by three, three
    K slabs; as many tile rows as a band where swizzle is set) against float64 numpy; the
    number of failures."""
    import numpy as np
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_matmul_mma import emulate
    from webgrad.codegen.matmul_mma import mma_matmul_wgsl
    bad = 0
    for text in tilings:
        t = with_sets(parse_tiling(text, (16, 16, 16, 32)), sets)
        for M, N, K in shapes:
            try:
                wgsl, groups = mma_matmul_wgsl(M, N, K, t, room)
                print(f"  {M}x{N}x{K} {text:28} WGSL {len(wgsl):6} chars, {groups} workgroups, "
                      f"{t.workgroup_bytes()} bytes shared, {t.threads} threads")
            except ValueError as e:   # the sweep would miss this one: a failure
                bad += 1
                print(f"  {M}x{N}x{K} {text:28} REFUSED: {e}")
        M, N, K = max(2, t.swizzle) * t.bm, 3 * t.bn, 3 * t.bk   # the band walk where one is set
        rng = np.random.default_rng(0)
        A16 = rng.standard_normal((M, K)).astype(np.float16)
        B16 = rng.standard_normal((K, N)).astype(np.float16)
        try:
            wgsl, groups = mma_matmul_wgsl(M, N, K, t)
            got = emulate(wgsl, groups, t, *stored(np, t, A16, B16),
                          c_size=M * N).reshape(M, N).astype(np.float64)
            want = A16.astype(np.float64) @ B16.astype(np.float64)
            err = float(np.abs(got - want).max() / np.abs(want).max())
            ok = err < (2e-3 if t.out == "f16" else 1e-5)
        except Exception as e:   # a statement the emulator does not know, a barrier mismatch
            err, ok = f"{type(e).__name__}: {e}", False
        bad += not ok
        print(f"  emulated {M}x{N}x{K} {text:28} rel err {err}  {'ok' if ok else 'FAILED'}")
    return bad


def stored(np, t, A16, B16):
    """A and B as the tiling reads them from storage: transposed where a_t / b_t say."""
    return (np.ascontiguousarray(A16.T) if t.a_t else A16,
            np.ascontiguousarray(B16.T) if t.b_t else B16)


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
    a, b = stored(np, tiling, A16, B16)
    host.write(prog, 0, a.tobytes())
    host.write(prog, 1, b.tobytes())
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
                    "--size cubed (--sweep: 4096^3 and GPT-2's products)")
    ap.add_argument("--tilings", default=None, help="BMxBNxBK:SG_MxSG_N[:fields],... (default: "
                    "eight measured tilings; --sweep: the SWEEP variants)")
    ap.add_argument("--sweep", action="store_true", help="the SWEEP variants on 4096^3 and "
                    "GPT-2's shapes, robustness off, --reps-ms of work a timing")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="replace an MmaTiling field in every tiling (repeatable)")
    ap.add_argument("--dry", action="store_true", help="no device: emit every tiling's WGSL at "
                    "every shape and run each through the emulator on a small shape")
    ap.add_argument("--robustness", default=None, help="on,off (default; --sweep: off)")
    ap.add_argument("--reps", type=int, default=20, help="dispatches a timing, at least")
    ap.add_argument("--reps-ms", type=float, default=None, help="more dispatches where a "
                    "shape is small: about this much work a timing (default 0; --sweep 50)")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    tilings = (args.tilings or (SWEEP if args.sweep else "128x128x32:2x2,128x128x32:2x2:mx,"
               "128x256x32:2x4,128x256x32:2x4:mx,256x128x32:4x2,256x128x32:4x2:mx,"
               "128x128x32:2x2:db,128x128x32:2x2:f16")).split(",")
    shape_text = args.shapes or (GPT2_SHAPES if args.sweep else None)
    shapes = ([tuple(int(v) for v in t.split("x")) for t in shape_text.split(",")]
              if shape_text else [(args.size,) * 3])
    robustness = args.robustness or ("off" if args.sweep else "on,off")
    reps_ms = args.reps_ms if args.reps_ms is not None else (50.0 if args.sweep else 0.0)
    if args.dry:
        bad = dry(tilings, shapes, args.set, 49152)   # the H200's workgroup memory (Dawn)
        print(f"{len(tilings)} tilings, {bad} failed")
        sys.exit(1 if bad else 0)
    import numpy as np
    from matmul import pick_lib
    lib = pick_lib()
    from webgrad.backends import webgpu_device, webgpu_native as wn
    rng = np.random.default_rng(0)
    data = {}
    for M, N, K in shapes:
        A16 = rng.standard_normal((M, K)).astype(np.float16)
        B16 = rng.standard_normal((K, N)).astype(np.float16)
        rows = np.sort(rng.choice(M, size=min(M, 64), replace=False))
        data[(M, N, K)] = (A16, B16, rows, A16[rows].astype(np.float64) @ B16.astype(np.float64))
    print(f"shapes {shapes}, f16 inputs N(0, 1); library {lib}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    results = []
    for mode in robustness.split(","):
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
            reps = reps_for(shape, args.reps, reps_ms)
            for text in tilings:
                t = with_sets(parse_tiling(text, cfg), args.set)
                try:
                    tf, err, tc = run_kernel(host, np, A16, B16, want_rows, rows, t, reps, shape)
                except Exception as e:
                    print(f"  {label} {text:28} FAILED: {type(e).__name__}: {str(e)[:600]}")
                    continue
                results.append((mode, f"{label} {text}", tf, err))
                print(f"  {label} {text:28} {tf:7.1f} TFLOP/s  rel err {err:.2e}  "
                      f"pipeline {tc:.2f} s  ({reps} dispatches a timing)", flush=True)
    torch_tf = {}
    if not args.no_torch:   # after Dawn's runs, as measured before
        import torch
        from matmul import time_torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        for shape in shapes:
            A16, B16 = data[shape][:2]
            M, N, K = shape
            reps = reps_for(shape, args.reps, reps_ms)
            a, b = torch.from_numpy(A16).to(dev), torch.from_numpy(B16).to(dev)
            for name, (x, y) in (("fp16", (a, b)), ("fp32", (a.float(), b.float()))):
                s = time_torch(torch, x, y, reps, 3)
                tf = 2 * M * N * K / s / 1e12
                torch_tf.setdefault(shape, tf)   # fp16's
                label = "x".join(map(str, shape))
                print(f"torch {name} ({dev}) {label}: {tf:7.1f} TFLOP/s  ({reps} products a timing)")
                results.append(("torch", f"{label} torch {name}", tf, 0.0))
    print("\n| kernel | robustness | TFLOP/s | x torch fp16 | rel err |\n|---|---|---|---|---|")
    for mode, text, tf, err in results:
        shape = tuple(int(v) for v in text.split()[0].split("x"))
        ratio = f"{tf / torch_tf[shape]:.2f}" if shape in torch_tf else "-"
        print(f"| {text} | {mode if mode != 'torch' else '-'} | {tf:.1f} | {ratio} | {err:.1e} |")
    for shape in shapes:   # the best variant of each shape and robustness
        label = "x".join(map(str, shape))
        for mode in robustness.split(","):
            mine = [(tf, text) for m, text, tf, _ in results if m == mode and text.startswith(label + " ")]
            if mine:
                tf, text = max(mine)
                ratio = f" = {tf / torch_tf[shape]:.2f}x torch fp16" if shape in torch_tf else ""
                print(f"best {label} robustness {mode}: {text.split()[1]} {tf:.1f} TFLOP/s{ratio}")


if __name__ == "__main__":
    main()
