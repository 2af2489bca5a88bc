#!/usr/bin/env python3
"""Greedy decoding of the SmolLM2-135M-shaped Llama natively on a CPU adapter (wgpu-py on
lavapipe): tokens/s, kernels per token, GPU time per kernel class and host time per token.
Issue 24: the browser's figure (bench/wllama_decode.py, WebGPU on SwiftShader) is slow to
measure; lavapipe shares SwiftShader's CPU-adapter kernel choices (Limits.cpu), so the
decode kernels are shaped here first.

    python3 bench/decode_cpu.py                       # 2 layers, F32 and Q8_0
    python3 bench/decode_cpu.py --layers 30 --types Q8_0 --new 8
    python3 bench/decode_cpu.py --profile 12 --cprofile   # where one step's time goes
    python3 bench/decode_cpu.py --set force_gemv=False    # a kernel option (KernelOptions)

The model: wllama_decode.py's GGUF file (random N(0, 0.02) weights in SmolLM2-135M's shape,
tied head, `--layers` layers), written to a temporary folder and loaded with
Llama.from_gguf(backend="webgpu") (Q8_0 kept as blocks). Timed: generate(prompt of 8 ids,
--new tokens, temperature 0), one warm-up call, then the best of --reps; tokens/s = new
tokens / wall time of the call (prefill of the prompt included, as wllama_decode.py counts).
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pkg"))
sys.path.insert(0, str(ROOT / "bench"))

from gpt2_decode import set_kernel_options  # noqa: E402
from llama_decode import kind_of  # noqa: E402
from wllama_decode import prompt_ids, write_smol  # noqa: E402


def profile_step(m, top: int, pos: int, reps: int) -> None:
    """One decode step kernel by kernel, each kernel's median time over `reps` profiled
    steps (the shared machine's load moves single samples by 2x)."""
    from statistics import median
    from webgrad.blocking import run_blocking
    prog = m._program("step", 1)._prog
    profs = [run_blocking(prog.profile({"ids": [1], "pos": [pos]}, "profile")) for _ in range(reps)]
    prof = profs[0]
    for k, r in enumerate(prof.rows):
        r.seconds = median(p.rows[k].seconds or 0.0 for p in profs)
    print(prof.text(top=top))
    by = defaultdict(lambda: [0, 0.0])
    for r in prof.rows:
        k = by[kind_of(r.name)]
        k[0] += 1
        k[1] += r.seconds or 0.0
    tot = prof.total_seconds or 0.0
    print(f"by class ({len(prof.rows)} commands, {tot * 1e3:.2f} ms, timing {prof.timing}):")
    for name, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:<24} {c:>4} kernels {t * 1e3:9.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--types", default="F32,Q8_0")
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="profile one decode step: the N longest kernels and sums per class")
    ap.add_argument("--profile-reps", type=int, default=5, help="profiled steps (median per kernel)")
    ap.add_argument("--cprofile", action="store_true", help="host time of one generate call")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a KernelOptions field (codegen/options.py), a Python literal")
    args = ap.parse_args()
    set_kernel_options(args.set)
    from matmul import pick_lib
    lib = pick_lib()
    from webgrad.models import llama
    prompt = prompt_ids(49152, 8)
    for qt in args.types.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"smol-{qt}.gguf"
            t0 = time.perf_counter()
            write_smol(path, qt, args.layers)
            t1 = time.perf_counter()
            m = llama.Llama.from_gguf(str(path), backend="webgpu", n_ctx=64)
        t2 = time.perf_counter()
        run = lambda: m.generate(prompt, max_new_tokens=args.new, temperature=0,  # noqa: E731
                                 stop_at_eos=False)[len(prompt):]
        toks = run()
        t3 = time.perf_counter()
        best = float("inf")
        for _ in range(args.reps):
            t = time.perf_counter()
            again = run()
            best = min(best, time.perf_counter() - t)
            assert again == toks, "greedy tokens differ between calls"
        step = m._program("step", 1)
        info = getattr(getattr(m.backend, "host", None), "info", "")
        print(f"{qt}: {args.layers} layers, {args.new / best:.2f} tokens/s ({best:.2f} s for "
              f"{args.new} new tokens); {step.kernel_count} kernels per decode step; file "
              f"{t1 - t0:.1f} s, load {t2 - t1:.1f} s, warm-up {t3 - t2:.1f} s; tokens "
              f"{toks[:8]}; {info} ({lib}); load average {os.getloadavg()[0]:.1f}", flush=True)
        if args.profile:
            profile_step(m, args.profile, len(prompt) + args.new, args.profile_reps)
        if args.cprofile:
            pr = cProfile.Profile()
            pr.enable()
            run()
            pr.disable()
            pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
        del m


if __name__ == "__main__":
    main()
