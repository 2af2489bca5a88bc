#!/usr/bin/env python3
"""Where compile + init time goes, for one row of bench/gpt2_train.py (cProfile).

    python3 bench/compile_time.py --row gpt2 --backend webgpu      # Dawn on a GPU machine
    python3 bench/compile_time.py --row gpt2 --backend reference   # numpy, any machine
    python3 bench/compile_time.py --row gpt2 --model module        # webgrad.models.gpt2
    python3 bench/compile_time.py --row gpt2 --no-profile          # the plain wall time
    python3 bench/compile_time.py --row gpt2 --model module --lower-only   # any machine
    python3 bench/compile_time.py --row gpt2 --model module --no-profile --pipeline-threads 0

--pipeline-threads N sets webgpu_device.PIPELINE_THREADS (0: createComputePipelineAsync,
Dawn's two worker threads), --no-prefetch leaves pipeline creation to load() instead of
starting each kernel as lowering emits it; the run prints the seconds spent lowering and
waiting for pipelines.

--lower-only times codegen.lower of the training step alone (best of 3, no GPU), under the
limits and adapter name of an H200 through Dawn (so its plan takes the H200's kernels), and
prints a digest of the plan: a change meant to speed up lowering must leave it unchanged
(buffer labels name the user's line that built a tensor, which may be a line of this file:
the digest leaves the " (built at ...)" part out, so editing this file does not change it).

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
    ap.add_argument("--lower-only", action="store_true",
                    help="time lowering the step under an H200's limits (no GPU needed)")
    ap.add_argument("--pipeline-threads", type=int, default=None,
                    help="threads creating pipelines (default: webgpu_device's choice)")
    ap.add_argument("--no-prefetch", action="store_true",
                    help="create pipelines at load, not while lowering emits them")
    args = ap.parse_args()
    import webgrad as wg
    from webgrad import optim
    from gpt2_train import ROWS, module_model, webgrad_model
    d, layers, heads, vocab, context, B, T = ROWS[args.row]
    if args.model == "module":
        factory, loss_fn, names = module_model(d, layers, heads, vocab, context)
    else:
        (factory, loss_fn), names = webgrad_model(d, layers, heads, vocab, context), ("idx", "target")
    if args.lower_only:
        return lower_only(factory, loss_fn, names, B, T)
    if args.backend == "webgpu":
        from webgrad.backends import webgpu_device, webgpu_native
        webgpu_native.PREFETCH = not args.no_prefetch
        if args.pipeline_threads is not None:
            webgpu_device.PIPELINE_THREADS = args.pipeline_threads
        host = webgpu_native.NativeHost()  # the device is made before the clock starts
        print(f"webgpu: {host.info}; {host._dev.threads} pipeline threads, prefetch "
              f"{webgpu_native.PREFETCH}")
        spent = _time_phases()
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
        print(f"{len(shared_device().pipelines)} distinct compute pipelines on the device; "
              f"lowering {spent['lower']:.2f} s, waiting for pipelines "
              f"{spent['pipelines']:.2f} s")
    if not args.no_profile:
        pstats.Stats(prof).sort_stats("cumtime").print_stats(args.top)


def _time_phases() -> dict:
    """Wall seconds spent in lowering and in waiting for pipelines (pipelines_for), summed
    over the programs compile_module makes."""
    from webgrad.backends import webgpu, webgpu_device
    spent = {"lower": 0.0, "pipelines": 0.0}

    def timed(fn, key):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[key] += time.perf_counter() - t0
        return wrapper
    webgpu.lower = timed(webgpu.lower, "lower")
    webgpu_device.Device.pipelines_for = timed(webgpu_device.Device.pipelines_for, "pipelines")
    return spent


# what codegen reads of an H200's Dawn device (Limits and the adapter's description)
H200 = dict(max_storage_buffer_binding_size=4294967292, max_buffer_size=4294967292,
            max_compute_invocations_per_workgroup=1024, max_compute_workgroup_size_x=1024,
            max_compute_workgroup_storage_size=32768, max_storage_buffers_per_shader_stage=16)
H200_ADAPTER = "NVIDIA H200 (DiscreteGPU) via Vulkan [wgpudawn]"


def lower_only(factory, loss_fn, names, B, T) -> None:
    import hashlib
    import json
    import re
    from webgrad import optim
    from webgrad.codegen import Limits, lower
    from webgrad.compile import build_train_graph, parse_inputs
    ins = parse_inputs({names[0]: ([B, T], "i32"), names[1]: ([B, T], "i32")})
    _, train, _ = build_train_graph(factory, loss_fn, ins, optim.AdamW(lr=3e-4),
                                    keep_grads=True, seed=0)
    limits = Limits.from_host(H200)
    limits.adapter = H200_ADAPTER
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        lowered, _ = lower(train, limits, lambda name: f"p:{name}")
        times.append(time.perf_counter() - t0)
    text = re.sub(r" \(built at [^)]*\)", "", json.dumps(lowered.plan, sort_keys=True))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    print(f"lowering the step: best {min(times):.2f} s of {', '.join(f'{t:.2f}' for t in times)}; "
          f"{len(lowered.plan['pipelines'])} pipelines; plan sha256 {digest}")


if __name__ == "__main__":
    main()
