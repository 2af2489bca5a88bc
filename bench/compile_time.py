#!/usr/bin/env python3
"""Where compile + init time goes, for one row of bench/gpt2_train.py (cProfile).

    python3 bench/compile_time.py --row gpt2 --backend webgpu      # Dawn on a GPU machine
    python3 bench/compile_time.py --row gpt2 --backend reference   # numpy, any machine
    python3 bench/compile_time.py --row gpt2 --model module        # webgrad.models.gpt2
    python3 bench/compile_time.py --row gpt2 --no-profile          # the plain wall time

Prints the wall time of compile_module (trace, grad, optimizer, lowering and pipeline
creation for the step and the forward program, parameter init) and the 20 functions with
the most cumulative time.
"""
from __future__ import annotations

import argparse
import cProfile
import math
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pkg"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", default="gpt2")
    ap.add_argument("--backend", default="webgpu")
    ap.add_argument("--model", default="bench", choices=("bench", "module"))
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--no-profile", action="store_true",
                    help="time without cProfile (whose overhead inflates the Python stages)")
    args = ap.parse_args()
    import webgrad as wg
    from webgrad import optim
    from gpt2_train import ROWS, module_model, webgrad_model
    d, layers, heads, vocab, context, B, T = ROWS[args.row]
    if args.model == "module":
        factory, loss_fn, names = module_model(d, layers, heads, vocab, context)
    else:
        (factory, loss_fn), names = webgrad_model(d, layers, heads, vocab, context), ("idx", "target")
    if args.backend == "webgpu":
        from webgrad.backends.webgpu_native import NativeHost
        print("webgpu:", NativeHost().info)  # the device is made before the clock starts
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    if not args.no_profile:
        prof.enable()
    c = wg.compile_module(factory, loss_fn, backend=args.backend,
                          inputs={names[0]: ([B, T], "i32"), names[1]: ([B, T], "i32")},
                          optimizer=optim.AdamW(lr=3e-4))
    prof.disable()
    dt = time.perf_counter() - t0
    n = sum(math.prod(s) for s in c.param_shapes.values())
    how = "without cProfile" if args.no_profile else "under cProfile"
    print(f"{args.row} ({args.model}, {n / 1e6:.1f}M params) on {args.backend}: compile+init "
          f"{dt:.2f} s ({how}), {c.kernel_count} kernels")
    if args.backend == "webgpu":
        from webgrad.backends.webgpu_native import shared_device
        print(f"{len(shared_device().pipelines)} distinct compute pipelines on the device")
    if not args.no_profile:
        pstats.Stats(prof).sort_stats("cumtime").print_stats(args.top)


if __name__ == "__main__":
    main()
