#!/usr/bin/env python3
"""Greedy decoding of the SmolLM2-135M-shaped Llama natively on a CPU adapter (wgpu-py on
lavapipe): tokens/s, kernels per token, GPU time per kernel class and host time per token.
Issue 24: the browser's figure (bench/wllama_decode.py, WebGPU on SwiftShader) is slow to
measure; lavapipe shares SwiftShader's CPU-adapter kernel choices (Limits.cpu), so the
decode kernels are shaped here first.

    python3 bench/decode_cpu.py                       # 2 layers, F32 and Q8_0
    python3 bench/decode_cpu.py --layers 30 --types Q8_0 --new 8
    python3 bench/decode_cpu.py --profile 12 --cprofile   # where one step's time goes
    python3 bench/decode_cpu.py --sets ",force_gemv=False" --profile 6   # defaults against
                                                      # the barrier-free kernel, interleaved

The model: wllama_decode.py's GGUF file (random N(0, 0.02) weights in SmolLM2-135M's shape,
tied head, `--layers` layers), written to a temporary folder and loaded with
Llama.from_gguf on a WebGPU backend per kernel option set (Q8_0 kept as blocks). Timed:
generate(prompt of 8 ids, --new tokens, temperature 0), one warm-up call, then the best of
--reps, the sets' calls interleaved; tokens/s = new tokens / wall time of the call (prefill
of the prompt included, as wllama_decode.py counts). Profiles: each kernel's median over
--profile-reps steps, interleaved likewise.
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

from llama_decode import kind_of  # noqa: E402
from wllama_decode import prompt_ids, write_smol  # noqa: E402


def profiles(m, pos: int) -> "Profile":
    from webgrad.blocking import run_blocking
    return run_blocking(m._program("step", 1)._prog.profile({"ids": [1], "pos": [pos]}, "profile"))


def report(profs, top: int) -> None:
    """Each kernel's median time over the profiled steps `profs` (the shared machine's load
    moves single samples by 2x): the `top` longest and the sums per kernel class."""
    from statistics import median
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
    ap.add_argument("--reps", type=int, default=2, help="timed calls per set (the best)")
    ap.add_argument("--sets", default="", help="kernel option sets to compare, separated by "
                    "',' (fields within one by ';'; the empty set: the defaults): "
                    "--sets ',force_gemv=False' against the barrier-free kernel")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="profile decode steps: the N longest kernels and sums per class")
    ap.add_argument("--profile-reps", type=int, default=5, help="profiled steps (median per kernel)")
    ap.add_argument("--cprofile", action="store_true", help="host time of one generate call")
    args = ap.parse_args()
    from matmul import pick_lib
    lib = pick_lib()
    from webgrad.backends.webgpu import WebGPUBackend
    from webgrad.codegen.options import KernelOptions, with_setting
    from webgrad.models import llama
    prompt = prompt_ids(49152, 8)
    sets = args.sets.split(",")
    for qt in args.types.split(","):
        models = []
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"smol-{qt}.gguf"
            t0 = time.perf_counter()
            write_smol(path, qt, args.layers)
            t_file = time.perf_counter() - t0
            for st in sets:
                opts = KernelOptions()
                for item in [i for i in st.split(";") if i]:
                    opts = with_setting(opts, item)
                t0 = time.perf_counter()
                m = llama.Llama.from_gguf(str(path), backend=WebGPUBackend(options=opts), n_ctx=64)
                t1 = time.perf_counter()
                models.append((st or "defaults", m, t1 - t0))
        run = lambda m: m.generate(prompt, max_new_tokens=args.new, temperature=0,  # noqa: E731
                                   stop_at_eos=False)[len(prompt):]
        warm = []
        for _, m, _ in models:
            t0 = time.perf_counter()
            warm.append((run(m), time.perf_counter() - t0))
        best = [float("inf")] * len(models)
        for _ in range(args.reps):   # the sets interleaved: the load moves them alike
            for k, (_, m, _) in enumerate(models):
                t = time.perf_counter()
                again = run(m)
                best[k] = min(best[k], time.perf_counter() - t)
                assert again == warm[k][0], "greedy tokens differ between calls"
        profs = [[] for _ in models]
        for _ in range(args.profile_reps if args.profile else 0):
            for k, (_, m, _) in enumerate(models):
                profs[k].append(profiles(m, len(prompt) + args.new))
        for k, (name, m, t_load) in enumerate(models):
            toks, t_warm = warm[k]
            info = getattr(getattr(m.backend, "host", None), "info", "")
            print(f"{qt} [{name}]: {args.layers} layers, {args.new / best[k]:.2f} tokens/s "
                  f"({best[k]:.2f} s for {args.new} new tokens); "
                  f"{m._program('step', 1).kernel_count} kernels per decode step; file "
                  f"{t_file:.1f} s, load {t_load:.1f} s, warm-up {t_warm:.1f} s; tokens "
                  f"{toks[:6]}; {info} ({lib}); load average {os.getloadavg()[0]:.1f}", flush=True)
            if args.profile:
                report(profs[k], args.profile)
            if args.cprofile:
                pr = cProfile.Profile()
                pr.enable()
                run(m)
                pr.disable()
                pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
        del models


if __name__ == "__main__":
    main()
