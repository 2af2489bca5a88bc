#!/usr/bin/env python3
"""What webgrad's buffer plan holds at its peak, for bench/gpt2_train.py's rows, on any machine.

    python3 bench/memory_plan.py                          # small2, small64, gpt2 planned for an H200
    python3 bench/memory_plan.py --rows tiny --adapter lavapipe
    python3 bench/memory_plan.py --rows small2 --top 20   # the 20 largest buffers live at the peak
    python3 bench/memory_plan.py --rows gpt2 --precision mixed --set mma_transposed=True

The plan is static: codegen.lower() needs only the adapter's description and limits, not the
adapter, so this runs on a CPU. `--adapter h200` plans with the words and limits that pick the
H200's row of codegen/matmul_config.ADAPTER_TILINGS (split-K scratch depends on it), the limits the
bench's Dawn device reported; its planned_bytes equal the "peak webgrad" figures that
bench/gpt2_train.py printed on the H200 (680 / 6791 / 7151 MiB before this script's
changes, bench/README.md). `--adapter lavapipe` plans as on a CPU adapter (no split-K, the
barrier-free matmul).

Printed per row: planned bytes (the sum of every buffer, what gpt2_train.py reports as
webgrad's peak) against torch's max_memory_allocated on the H200 (TORCH_PEAK_MIB, measured by
gpt2_train.py), split into persistent buffers (parameters, optimizer state, the gradients
compile_module keeps), feeds and the pool of temporaries; then the step at which the
temporaries' live bytes peak, and what is live there by kind:
  activations kept    forward tensors the backward pass reads
  logits / dlogits    tensors whose last axis is the vocabulary
  backward            gradients and the optimizer's temporaries
  forward transient   forward tensors dead before the backward
  split-K scratch     partial sums of split matmuls; other scratch (reductions, scatter)
"""
from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pkg"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpt2_train import LR, ROWS, WD, webgrad_model  # noqa: E402

# torch.cuda.max_memory_allocated over gpt2_train.py's timed steps, NVIDIA H200, torch 2.11
# cu130 fp32 (bench/README.md, gpt2_train section, 2026-11-30)
TORCH_PEAK_MIB = {"small2": 647, "small64": 6362, "gpt2": 7780}


def adapter_limits(name: str, precision: str = "f32", options=None):
    """The adapter's limits; precision "mixed" on the H200 also with what Dawn offers there
    under webgrad's toggles (shader-f16, subgroups, the f16 16x16x16 subgroup matrices)."""
    from webgrad.codegen import KernelOptions
    from webgrad.codegen.wgsl import Limits
    opts = options or KernelOptions()
    if name == "h200":  # Dawn on Vulkan, as gpt2_train.py's NativeHost requested them
        half = dict(shader_f16=True, subgroups=True,
                    subgroup_matrix=(("f16", "f32", 16, 16, 16, 32, 32),)) if precision == "mixed" else {}
        return Limits(adapter="NVIDIA H200 (DiscreteGPU)", max_storage_buffer_binding_size=(1 << 32) - 4,
                      max_buffer_size=1 << 40, max_compute_workgroup_storage_size=49152,
                      options=opts, **half)
    if name == "lavapipe":
        return Limits(adapter="llvmpipe (LLVM 15.0.6, 256 bits) (CPU)", cpu=True,
                      max_storage_buffer_binding_size=(1 << 31), max_buffer_size=1 << 40,
                      options=opts)
    raise SystemExit(f"--adapter: h200 or lavapipe, got {name!r}")


def plan(row: str, limits, precision: str = "f32"):
    from webgrad import optim
    from webgrad.codegen import lower
    from webgrad.compile import build_train_graph, parse_inputs
    from webgrad.precision import f16_in_f32
    d, layers, heads, vocab, context, B, T = ROWS[row]
    factory, loss_fn = webgrad_model(d, layers, heads, vocab, context)
    ins = parse_inputs({"idx": ([B, T], "i32"), "target": ([B, T], "i32")})
    from webgrad.codegen.matmul_mma import transposed_views_for
    views = transposed_views_for(limits) if precision == "mixed" else False
    graph = build_train_graph(factory, loss_fn, ins, optim.AdamW(lr=LR, weight_decay=WD),
                              precision=precision, transposed_views=views)[1]
    return lower(f16_in_f32(graph), limits)[0], vocab


def mib(b: float) -> str:
    return f"{b / 2**20:9.1f} MiB"


def report(row: str, low, vocab: int, top: int) -> None:
    from webgrad.buffers import END
    rep, pool = low.report, low.pool
    g, lives, order = pool["graph"], pool["lives"], pool["order"]
    bufs = low.plan["buffers"]
    print(f"\n== {row}: planned {mib(rep['planned_bytes'])}", end="")
    if row in TORCH_PEAK_MIB:
        t = TORCH_PEAK_MIB[row]
        print(f"  (torch {t} MiB: {rep['planned_bytes'] / 2**20 / t:.3f}x)", end="")
    print(f", {rep['kernels']} kernels")
    persist = defaultdict(int)
    for name, b in low.persistent.items():
        kind = ("gradients" if name.startswith("grad/") else "optimizer state" if name.startswith("opt/")
                else "parameters" if name in g.params else "other state")
        persist[kind] += bufs[b]["size"]
    for kind, b in sorted(persist.items(), key=lambda x: -x[1]):
        print(f"  persistent {kind:18} {mib(b)}")
    print(f"  feeds + outputs + consts      {mib(rep['planned_bytes'] - rep['persistent_bytes'] - rep['pool_bytes'])}")
    print(f"  pool ({rep['pool_buffers']} buffers)            {mib(rep['pool_bytes'])}")

    # the forward: ancestors of the loss; the backward starts after the loss's kernel
    loss = g.outputs["loss"]
    fwd = g.ancestors(loss)
    steps = len(order)
    live = [0] * (steps + 1)
    for lv in lives:  # a donor and its heir share step `first`: count the buffer once there
        lo = lv.first + (1 if lv.donor is not None else 0)
        for t in range(lo, min(lv.last, steps) + 1):
            live[t] += lv.nbytes
    peak = max(range(steps + 1), key=live.__getitem__)
    loss_step = max((lv.first for lv in lives if lv.key[0] == "t" and lv.key[1] in fwd), default=0)

    def kind(lv) -> str:
        k, key = lv.key
        if k == "s":
            return "split-K scratch" if key[0] in pool["split_k"] else "other scratch"
        if g[key].shape and g[key].shape[-1] == vocab:
            return "logits / dlogits"
        if key in fwd:
            return "activations kept" if lv.last > loss_step else "forward transient"
        return "backward"
    at = [lv for lv in lives if lv.first <= peak <= min(lv.last, steps)]
    print(f"  temporaries peak at step {peak} of {steps} (loss at {loss_step}): {mib(live[peak])} live")
    by = defaultdict(lambda: [0, 0])
    for lv in at:
        by[kind(lv)][0] += lv.nbytes
        by[kind(lv)][1] += 1
    for k, (b, c) in sorted(by.items(), key=lambda x: -x[1][0]):
        print(f"    {k:20} {mib(b)}  {c:4} tensors")
    if top:
        print(f"  the {top} largest live at the peak:")
        for lv in sorted(at, key=lambda lv: -lv.nbytes)[:top]:
            k, key = lv.key
            what = f"%{key} {g[key].op}{list(g[key].shape)}" if k == "t" else f"scratch {key}"
            last = "end" if lv.last >= END else lv.last
            print(f"    {mib(lv.nbytes)}  {kind(lv):18} {what}  steps {lv.first}..{last}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="small2,small64,gpt2", help=f"comma-separated: {', '.join(ROWS)}")
    ap.add_argument("--adapter", default="h200", help="h200 or lavapipe")
    ap.add_argument("--top", type=int, default=0, help="list the N largest buffers live at the peak")
    ap.add_argument("--precision", default="f32", help="f32 or mixed (compile_module's precision)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="a KernelOptions field (a Python literal), as gpt2_train.py's --set")
    args = ap.parse_args()
    from webgrad.codegen import KernelOptions
    opts = KernelOptions()
    for item in args.set:
        field, eq, value = item.partition("=")
        if not eq or not hasattr(opts, field.strip()):
            raise SystemExit(f"--set {item}: write FIELD=VALUE with a KernelOptions field")
        opts = replace(opts, **{field.strip(): ast.literal_eval(value.strip())})
    limits = adapter_limits(args.adapter, args.precision, opts)
    for row in args.rows.split(","):
        low, vocab = plan(row, limits, args.precision)
        report(row, low, vocab, args.top)


if __name__ == "__main__":
    main()
