"""Hashes of the generated code of a fixed set of programs, lowered device-free.

Prints one line per program: a sha256 over every pipeline's WGSL and the plan's commands and
buffers (webgrad.codegen.lower's plan, backends/gpu_host.py's format), then the kernel count
(--times: and the seconds, under 3 s each on 2 cores, GPT-2 124M too). An edit that should not
alter generated code (issue 23) leaves every hash as in scripts/wgsl_hashes.txt. The plan's
labels name each tensor's source line ("built at FILE:LINE"); the hash leaves those out, so
moving a line of this script or of the models changes no hash.

    python scripts/wgsl_hashes.py                 # every program
    python scripts/wgsl_hashes.py --only mlp,tf   # names containing any of these
    python scripts/wgsl_hashes.py --quick         # skip the GPT-2 124M training steps
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pkg"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

H200 = "NVIDIA H200 (DiscreteGPU)"
SWIFTSHADER = "SwiftShader Device (Subzero)"
LAVAPIPE = "llvmpipe (LLVM 15.0.6, 256 bits) (CPU)"


def limits(kind: str):
    from webgrad.codegen import Limits
    if kind in ("h200", "h200_f16"):  # Dawn on Vulkan, as bench/gpt2_train.py's NativeHost
        # requests them; h200_f16: with shader-f16 (Dawn's f16 toggle), for f16 programs
        return Limits(adapter=H200, max_storage_buffer_binding_size=(1 << 32) - 4,
                      max_buffer_size=1 << 40, max_compute_workgroup_storage_size=49152,
                      subgroups=True, shader_f16=kind == "h200_f16", packed_dot=True)
    if kind == "swiftshader":
        return Limits(adapter=SWIFTSHADER, cpu=True, max_storage_buffer_binding_size=1 << 30,
                      max_buffer_size=1 << 30)
    if kind == "lavapipe":
        return Limits(adapter=LAVAPIPE, cpu=True, max_storage_buffer_binding_size=1 << 31,
                      max_buffer_size=1 << 40)
    if kind == "default":
        return Limits()
    raise AssertionError(kind)


BUILT_AT = re.compile(r" \(built at [^)]*\)")   # codegen/program.py's labels


def digest(plan: dict) -> str:
    h = hashlib.sha256()
    for part in [*plan["pipelines"], plan["commands"], plan["buffers"]]:
        h.update(BUILT_AT.sub("", json.dumps(part, sort_keys=True, default=str)).encode())
    return h.hexdigest()


# ---------------------------------------------------------------- the programs (name -> graph)

def train_row(row: str):
    from gpt2_train import LR, ROWS, WD, webgrad_model
    from webgrad import optim
    from webgrad.compile import build_train_graph, parse_inputs
    d, layers, heads, vocab, context, B, T = ROWS[row]
    factory, loss_fn = webgrad_model(d, layers, heads, vocab, context)
    ins = parse_inputs({"idx": ([B, T], "i32"), "target": ([B, T], "i32")})
    return build_train_graph(factory, loss_fn, ins, optim.AdamW(lr=LR, weight_decay=WD))[1]


def module_row(row: str):
    from gpt2_train import LR, ROWS, WD, module_model
    from webgrad import optim
    from webgrad.compile import build_train_graph, parse_inputs
    d, layers, heads, vocab, context, B, T = ROWS[row]
    factory, loss_fn, (a, b) = module_model(d, layers, heads, vocab, context)
    ins = parse_inputs({a: ([B, T], "i32"), b: ([B, T], "i32")})
    return build_train_graph(factory, loss_fn, ins, optim.AdamW(lr=LR, weight_decay=WD))[1]


def decode(kind: str, T: int, layers: int = 12, dtype: str = "f32"):
    """A GPT-2 124M-shaped decode program (`layers` of its blocks, the whole vocabulary),
    traced on the reference backend (zero weights; only the graph is used); dtype "f16":
    the weights held in f16 and the program in precision="f16"."""
    from webgrad.models.gpt2 import GPT2, GPT2Config
    cfg = GPT2Config(layers, 12, 768, 1024, 50257, 1e-5, 50256)
    model = GPT2(cfg, backend="reference", wte_chunks=1, dtype=dtype)
    model.precision = dtype
    return model._program(kind, T).ir


def llama_decode(dtype: str):
    """A Llama-3.2-1B-shaped decode step (2 of its 16 layers, a 32000-token vocabulary),
    traced as decode() is."""
    from webgrad.models import llama
    cfg = llama.LlamaConfig.from_hf(dict(
        model_type="llama", hidden_size=2048, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=8192, vocab_size=32000,
        max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True))
    model = llama.Llama(cfg, backend="reference", dtype=dtype)
    model.precision = dtype
    return model._program("step", 1).ir


def mixed_train(row: str):
    """train_row's program in precision="mixed"."""
    from gpt2_train import LR, ROWS, WD, webgrad_model
    from webgrad import optim
    from webgrad.compile import build_train_graph, parse_inputs
    d, layers, heads, vocab, context, B, T = ROWS[row]
    factory, loss_fn = webgrad_model(d, layers, heads, vocab, context)
    ins = parse_inputs({"idx": ([B, T], "i32"), "target": ([B, T], "i32")})
    return build_train_graph(factory, loss_fn, ins, optim.AdamW(lr=LR, weight_decay=WD),
                             precision="mixed")[1]


def models_train(which: str):
    import models
    from webgrad import optim
    from webgrad.compile import build_train_graph, parse_inputs
    if which == "mlp":
        return build_train_graph(models.MLP, models.mlp_loss, parse_inputs(models.MLP_INPUTS),
                                 optim.Adam(lr=0.005))[1]
    return build_train_graph(models.Transformer, models.transformer_loss,
                             parse_inputs(models.TF_INPUTS), optim.Adam(lr=0.01))[1]


def oracle_record(name: str):
    import oracle
    from webgrad.compile import build_train_graph, parse_inputs
    factory, loss_fn, inputs, _ = oracle.build_record(oracle.BY_NAME[name])
    return build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]


def lora_train():
    """bench/lora_step.py's LoRA step (r = 16 on q, k, v, o, gate, up, down) at the
    Llama-3.2-1B shape, 4 x 512, with 2 of its 16 layers."""
    import lora_step
    return lora_step.step_graph("1b", 2)


ORACLE = ("matmul/2d", "matmul/odd_long_k", "matmul/batched_odd", "matmul/gelu_mlp_odd",
          "softmax_last/wide_rows", "log_softmax_last/long_rows", "layer_norm_last/odd_300",
          "softmax_causal_last", "sum/axes", "sum_all/2d", "gather_rows/repeats",
          "scatter_add_rows/many_rows", "one_hot", "transpose/perm")


def programs(quick: bool):
    """[(name, limits kind, graph factory)]"""
    out = []
    if not quick:
        out += [("gpt2_train/h200", "h200", lambda: train_row("gpt2")),
                ("gpt2_module/h200", "h200", lambda: module_row("gpt2"))]
    out += [("small64_train/h200", "h200", lambda: train_row("small64")),
            ("small64_train/lavapipe", "lavapipe", lambda: train_row("small64")),
            ("tiny_train/swiftshader", "swiftshader", lambda: train_row("tiny"))]
    out.append(("lora_1b2_train/h200", "h200", lora_train))
    for kind, T in (("step", 1), ("full", 64), ("surprisal", 32), ("score", 8)):
        out.append((f"gpt2_decode_{kind}{T}/h200", "h200", lambda k=kind, t=T: decode(k, t)))
    out.append(("gpt2_decode_step1/lavapipe", "lavapipe", lambda: decode("step", 1, 2)))
    out.append(("gpt2_decode_step1_f16/h200", "h200_f16", lambda: decode("step", 1, dtype="f16")))
    out.append(("llama_decode_step1_f32/h200", "h200", lambda: llama_decode("f32")))
    out.append(("llama_decode_step1_f16/h200", "h200_f16", lambda: llama_decode("f16")))
    out.append(("small64_train_mixed/h200", "h200_f16", lambda: mixed_train("small64")))
    for which in ("mlp", "tf"):
        for kind in ("swiftshader", "lavapipe", "h200"):
            out.append((f"models_{which}/{kind}", kind, lambda w=which: models_train(w)))
    for name in ORACLE:
        for kind in ("default", "swiftshader", "lavapipe", "h200"):
            out.append((f"oracle:{name}/{kind}", kind, lambda n=name: oracle_record(n)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated substrings of program names")
    ap.add_argument("--quick", action="store_true", help="skip the GPT-2 124M training steps")
    ap.add_argument("--times", action="store_true", help="append each lowering's seconds")
    args = ap.parse_args()
    from webgrad.codegen import lower
    from webgrad.precision import f16_in_f32
    only = [s for s in args.only.split(",") if s]
    for name, kind, make in programs(args.quick):
        if only and not any(s in name for s in only):
            continue
        t0 = time.perf_counter()
        g = make()
        # f16 values as the WebGPU backend lowers them: f32 nodes whose casts round, the
        # f16 parameters in f16 buffers (backends/webgpu.py's prepare)
        half = [n for n, i in g.params.items() if g[i].dtype == "f16"]
        if kind == "h200_f16":
            g = f16_in_f32(g)
        low, names = lower(g, limits(kind), half_names=half)
        dt = time.perf_counter() - t0
        tail = f"  ({dt:.1f} s)" if args.times else ""
        print(f"{digest(low.plan)}  {name}  kernels={len(names)}{tail}", flush=True)


if __name__ == "__main__":
    main()
