"""The bytes a GPT-2 training step's WebGPU plan holds, f32 against precision="mixed" with f16
values in f32 buffers (the fallback: KernelOptions.f16_emulation, or an adapter without
shader-f16) and with f16 storage (an adapter with shader-f16): the plan's buffer sizes, lowered
device-free for the H200's limits (Dawn, shader-f16 offered). Also a GPT-2 decode step (one
token, the cache in f32) held in f16 (GPT2(dtype="f16"), precision="f16") against f32.

    python bench/f16_memory.py                # bench/gpt2_train.py's tiny and small2 rows
    python bench/f16_memory.py --rows gpt2    # GPT-2 124M at 8 x 512 (a minute to lower)
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pkg"))
sys.path.insert(0, str(ROOT / "bench"))

MIB = 1 << 20


def limits(**kw):
    from webgrad.codegen import KernelOptions, Limits
    emulate = kw.pop("emulate", False)
    return Limits(adapter="NVIDIA H200 (DiscreteGPU)", max_storage_buffer_binding_size=(1 << 32) - 4,
                  max_buffer_size=1 << 40, max_compute_workgroup_storage_size=49152,
                  subgroups=True, options=KernelOptions(f16_emulation=emulate), **kw)


def train_graph(row: str, precision: str):
    from gpt2_train import LR, ROWS, WD, webgrad_model
    from webgrad import optim
    from webgrad.compile import build_train_graph, parse_inputs
    d, layers, heads, vocab, context, B, T = ROWS[row]
    factory, loss_fn = webgrad_model(d, layers, heads, vocab, context)
    ins = parse_inputs({"idx": ([B, T], "i32"), "target": ([B, T], "i32")})
    return build_train_graph(factory, loss_fn, ins, optim.AdamW(lr=LR, weight_decay=WD),
                             precision=precision)[1]


def report(graph, lim, half_names=()):
    from webgrad.codegen import lower
    from webgrad.precision import f16_in_f32
    low, _ = lower(f16_in_f32(graph), lim, half_names=half_names)
    return low.report


def row_line(name, r, base):
    return (f"| {name} | {r['planned_bytes'] / MIB:.2f} | {r['pool_bytes'] / MIB:.2f} | "
            f"{r['persistent_bytes'] / MIB:.2f} | {r['planned_bytes'] / base:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="tiny,small2")
    args = ap.parse_args()
    print("| program | planned MiB | pool MiB | persistent MiB | x f32 |")
    print("|---|---|---|---|---|")
    for row in args.rows.split(","):
        f32 = report(train_graph(row, "f32"), limits(shader_f16=True))
        mixed = train_graph(row, "mixed")
        in_f32 = report(mixed, limits(shader_f16=True, emulate=True))
        half = report(mixed, limits(shader_f16=True))
        base = f32["planned_bytes"]
        print(row_line(f"{row} train f32", f32, base))
        print(row_line(f"{row} train mixed, f16 in f32 buffers", in_f32, base))
        print(row_line(f"{row} train mixed, f16 storage", half, base), flush=True)
    from webgrad.models.gpt2 import GPT2, GPT2Config
    decode = {"tiny": GPT2Config(2, 2, 64, 32, 256, 1e-5, 255),
              "gpt2": GPT2Config(12, 12, 768, 1024, 50257, 1e-5, 50256)}
    for row in args.rows.split(","):
        if row not in decode:
            continue
        for dtype, precision in (("f32", "f32"), ("f16", "f16")):
            model = GPT2(decode[row], backend="reference", wte_chunks=1, dtype=dtype)
            model.precision = precision
            g = model._program("step", 1).ir
            halves = [n for n, i in g.params.items() if g[i].dtype == "f16"]
            r = report(g, limits(shader_f16=True), halves)
            if dtype == "f32":
                base = r["planned_bytes"]
            print(row_line(f"{row} decode step, {dtype} weights, precision={precision}", r, base),
                  flush=True)


if __name__ == "__main__":
    main()
