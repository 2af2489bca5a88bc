#!/usr/bin/env python3
"""A LoRA training step of a Llama-family model: webgrad (WebGPU, Dawn) against PEFT +
torch fp32 eager on CUDA, same GPU, same run. Issue 24 ("Speed, in bench/"): the target is
webgrad's step time <= 1.0x PEFT's.

    source .device/env.sh; python3 bench/lora_step.py                  # SmolLM2-360M shape, 4 x 512
    python3 bench/lora_step.py --rows 360m,1b                           # and Llama-3.2-1B's shape
    python3 bench/lora_step.py --small                                  # tiny config; CPU executors
                                                                        # (torch) where no GPU is
    python3 bench/lora_step.py --rows 1b --profile 25                   # and where webgrad's time goes
    python3 bench/lora_step.py --rows 1b --set split_thin=0             # a kernel option changed
    python3 bench/lora_step.py --rows 1b --set lowrank_epilogue=False   # K = 16 products as kernels
    python3 bench/lora_step.py --rows 1b --kernels --layers 2           # no device: the step lowered
                                                                        # for an H200, kernels by class

The step, the same on both sides: r = 16 adapters (lora_alpha 32, no dropout) on q, k, v, o,
gate, up and down of every layer, the base frozen; next-token cross entropy over every
position of a [B, T] batch (targets given, already shifted: llama.lm_loss, and
F.cross_entropy over transformers' logits); AdamW(lr 1e-4, weight decay 0.01) over the
adapters only. webgrad: lora.LoRA(lambda: llama.LlamaModule(cfg), ...) through
compile_module (frozen weights get no gradient or optimizer state); its parameters are its
own random init (base N(0, 0.02), adapters as PEFT: A random, B zero) -- the speed does not
depend on the values. PEFT: get_peft_model over transformers' LlamaForCausalLM (its random
init, fp32, sdpa attention, TF32 off), torch.optim.AdamW over the trainable parameters.

Reported per row: ms/step, the median of --steps steps (batch in, loss read back as a float)
after at least --warmup seconds of warm-up steps; webgrad / PEFT time ratio; kernels per
step (webgrad's dispatches); peak memory (webgrad's planned bytes, torch's
max_memory_allocated); compile + first step.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pkg"))
sys.path.insert(0, str(ROOT / "bench"))

from gpt2_decode import set_kernel_options  # noqa: E402  (--set: the WebGPU backends' options)

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LR, WD, R, ALPHA = 1e-4, 0.01, 16, 32

BASE = dict(model_type="llama", hidden_act="silu", rms_norm_eps=1e-5, tie_word_embeddings=True,
            bos_token_id=None, eos_token_id=None, pad_token_id=None)
# name: (config.json fields, batch B, T)
ROWS = {
    # HuggingFaceTB/SmolLM2-360M's config.json
    "360m": (dict(BASE, hidden_size=960, num_hidden_layers=32, num_attention_heads=15,
                  num_key_value_heads=5, head_dim=64, intermediate_size=2560, vocab_size=49152,
                  rope_theta=100000.0, max_position_embeddings=8192), 4, 512),
    # meta-llama/Llama-3.2-1B's config.json
    "1b": (dict(BASE, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
                rope_theta=500000.0, max_position_embeddings=131072,
                rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
           4, 512),
    "small": (dict(BASE, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=1000,
                   rope_theta=10000.0, max_position_embeddings=128), 2, 32),
}


def batch(np, vocab, B, T, seed):
    r = np.random.default_rng(seed)
    seq = r.integers(0, vocab, size=(B, T + 1)).astype(np.int32)
    return seq[:, :T].copy(), seq[:, 1:].copy()


def warm_up(step, n: int, seconds: float) -> None:
    """At least n steps and at least `seconds` of them."""
    t0, s = time.perf_counter(), 0
    while s < n or time.perf_counter() - t0 < seconds:
        step(s)
        s += 1


def timed(step, steps: int) -> float:
    times = []
    for s in range(steps):
        t0 = time.perf_counter()
        step(s)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def run_webgrad(row, args, np):
    import webgrad as wg
    from webgrad import lora, optim
    from webgrad.backends import get_backend
    from webgrad.models import llama
    from webgrad.models.decoding import chunks_for
    cfg_d, B, T = ROWS[row]
    cfg = llama.LlamaConfig.from_hf(cfg_d, n_ctx=T)
    be = get_backend(args.backend)
    chunks = chunks_for(cfg.vocab_size, cfg.hidden_size, be)   # the binding limit's row blocks
    lo = lora.LoRA(lambda: llama.LlamaModule(cfg, chunks), r=R, lora_alpha=ALPHA,
                   lora_dropout=0.0, target_modules=TARGETS)
    t0 = time.perf_counter()
    c = wg.compile_module(lo, llama.lm_loss, backend=be,
                          inputs={"tokens": ([B, T], "i32"), "targets": ([B, T], "i32")},
                          optimizer=optim.AdamW(lr=LR, weight_decay=WD))
    t_compile = time.perf_counter() - t0
    feeds = [dict(zip(("tokens", "targets"), batch(np, cfg.vocab_size, B, T, s))) for s in range(4)]
    t0 = time.perf_counter()
    first_loss = c.step(feeds[0])
    t_first = time.perf_counter() - t0

    def step(s):
        return c.step(feeds[s % 4])
    warm_up(step, 2, args.warmup)
    ms = timed(step, args.steps)
    if args.profile and hasattr(c, "profile"):   # one step kernel by kernel (webgpu)
        from gpt2_train import by_name
        prof = c.profile(feeds[0])
        print(f"  {row} webgrad profile, {len(prof.rows)} kernels, "
              f"{(prof.total_seconds or 0.0) * 1e3:.1f} ms of GPU time:")
        print(prof.text(top=args.profile))
        print(by_name(prof, args.profile), flush=True)
    try:
        planned = c.memory_report()["planned_bytes"]
    except (NotImplementedError, AttributeError, KeyError):
        planned = None
    n_train = sum(math.prod(c.param_shapes[n]) for n in lo.adapter_names)
    n_all = sum(math.prod(s) for s in c.param_shapes.values())
    out = dict(compile=t_compile, first=t_first, ms=ms, kernels=getattr(c, "kernel_count", None),
               bytes=planned, loss=first_loss, trainable=n_train, params=n_all, chunks=chunks,
               info=getattr(getattr(be, "host", None), "info", args.backend))
    del c
    return out


def run_peft(row, args, np, torch):
    import peft
    import transformers
    cfg_d, B, T = ROWS[row]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    F = torch.nn.functional
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(dev):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            **{k: v for k, v in cfg_d.items() if k != "model_type"}))
    model = peft.get_peft_model(model, peft.LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0,
                                                       target_modules=TARGETS)).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=WD)
    if dev == "cuda":
        torch.cuda.synchronize()
    t_compile = time.perf_counter() - t0
    feeds = [tuple(torch.from_numpy(a).long().to(dev) for a in batch(np, cfg_d["vocab_size"], B, T, s))
             for s in range(4)]
    V = cfg_d["vocab_size"]

    def step(s):
        x, y = feeds[s % 4]
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().view(-1, V), y.view(-1))
        loss.backward()
        opt.step()
        return loss.item()   # the loss as a float, as webgrad's step returns it

    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    first_loss = step(0)
    t_first = time.perf_counter() - t0
    warm_up(step, 2, args.warmup)
    kernels = None
    if dev == "cuda":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(0)
        kernels = sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA"
                      and not e.key.startswith("Memcpy") and not e.key.startswith("Memset"))
    ms = timed(step, args.steps)
    peak = torch.cuda.max_memory_allocated() if dev == "cuda" else None
    out = dict(compile=t_compile, first=t_first, ms=ms, kernels=kernels, bytes=peak,
               loss=first_loss, trainable=sum(p.numel() for p in params),
               params=sum(p.numel() for p in model.parameters()))
    del model, opt, feeds
    if dev == "cuda":
        torch.cuda.empty_cache()
    return out


def h200_limits(options=None):
    """Dawn's limits on an H200 (as tests/test_llama.py's device-free lowerings use them)."""
    from webgrad.codegen import KernelOptions, Limits
    return Limits(adapter="NVIDIA H200 (DiscreteGPU)", max_storage_buffer_binding_size=(1 << 32) - 4,
                  max_buffer_size=1 << 40, max_compute_workgroup_storage_size=49152, subgroups=True,
                  max_storage_buffers_per_shader_stage=16, options=options or KernelOptions())


def step_graph(row: str, layers: int | None = None):
    """The LoRA step's IR (trace, gradients, AdamW) of `row`, with `layers` layers if given."""
    from webgrad import lora, optim
    from webgrad.compile import build_train_graph, parse_inputs
    from webgrad.models import llama
    cfg_d, B, T = ROWS[row]
    if layers:
        cfg_d = dict(cfg_d, num_hidden_layers=layers)
    cfg = llama.LlamaConfig.from_hf(cfg_d, n_ctx=T)
    lo = lora.LoRA(lambda: llama.LlamaModule(cfg, 1), r=R, lora_alpha=ALPHA, lora_dropout=0.0,
                   target_modules=TARGETS)
    ins = parse_inputs({"tokens": ([B, T], "i32"), "targets": ([B, T], "i32")})
    return build_train_graph(lo, llama.lm_loss, ins, optim.AdamW(lr=LR, weight_decay=WD))[1]


def adapter_kernel(name: str) -> bool:
    """Is this kernel one of the adapters' rank-R products (a side or K of R; its chunk sums)?"""
    if not name.startswith("matmul "):
        return False
    dims = name.split(" ")[1].split("x")
    return str(R) in dims or f" K={R} " in name + " "


def kernel_classes(names) -> tuple[int, dict]:
    """(adapter kernels, {kernel class: count}) of a lowered step's kernel names; a class is
    a name without its tile (`matmul 4x512x16 K=2048`, `... split 4`, `... sum of 4 K chunks`)."""
    import re
    from collections import Counter
    c = Counter(re.sub(r" tile \S+", "", n) if n.startswith("matmul ") else n.split(" ")[0]
                for n in names)
    return sum(v for k, v in c.items() if adapter_kernel(k)), dict(sorted(c.items()))


def print_kernels(row: str, layers: int | None, options) -> None:
    """The step lowered for an H200 without a device: its kernels by class."""
    from webgrad.codegen import lower
    names = lower(step_graph(row, layers), h200_limits(options))[1]
    n_adapter, classes = kernel_classes(names)
    print(f"{row}, {layers or ROWS[row][0]['num_hidden_layers']} layers, lowered for an H200: "
          f"{len(names)} kernels, {n_adapter} of them the adapters' rank-{R} products")
    for k, v in classes.items():
        print(f"{v:6d}  {'*' if adapter_kernel(k) else ' '} {k}")


def _mib(b):
    return "-" if b is None else f"{b / 2**20:.0f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="360m", help=f"comma-separated, of {', '.join(ROWS)}")
    ap.add_argument("--small", action="store_true", help="the small row (a smoke test)")
    ap.add_argument("--backend", default=None,
                    help="webgrad backend (default webgpu; with --small, torch where torch has no CUDA)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (10; 3 small)")
    ap.add_argument("--warmup", type=float, default=None, help="warm-up seconds (1.5; 0 small)")
    ap.add_argument("--no-torch", action="store_true", help="webgrad only")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="print webgrad's N longest kernels of one step and its GPU time per "
                    "kernel name (webgpu)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a kernel option of webgrad's programs (codegen/options.py's "
                    "KernelOptions field, a Python literal): --set split_thin=0 splits the "
                    "adapters' thin products over K again, --set thin_grads=False leaves their "
                    "gradients in the traced layout")
    ap.add_argument("--kernels", action="store_true",
                    help="no device: lower each row's step for an H200 and print its kernels by "
                    "class (the adapters' products starred)")
    ap.add_argument("--layers", type=int, default=None, help="with --kernels: this many layers")
    args = ap.parse_args()
    if args.kernels:
        from webgrad.codegen import KernelOptions
        from webgrad.codegen.options import with_setting
        opts = KernelOptions()
        for item in args.set:
            opts = with_setting(opts, item)
        for r in (["small"] if args.small else [r for r in args.rows.split(",") if r]):
            print_kernels(r, args.layers, opts)
        return
    set_kernel_options(args.set)
    import numpy as np
    import torch
    cuda = torch.cuda.is_available()
    rows = ["small"] if args.small else [r for r in args.rows.split(",") if r]
    for r in rows:
        if r not in ROWS:
            raise SystemExit(f"--rows: {r!r} is not one of {', '.join(ROWS)}")
    args.backend = args.backend or ("webgpu" if cuda or not args.small else "torch")
    args.steps = args.steps or (3 if args.small else 10)
    args.warmup = 0.0 if args.warmup is None and args.small else (1.5 if args.warmup is None else args.warmup)
    lib = None
    if args.backend == "webgpu":
        from matmul import pick_lib
        lib = pick_lib()
    if not cuda:   # a CPU smoke test: torch's thread pool spins badly on a shared machine
        torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    import peft
    import transformers
    results = []
    for r in rows:
        wg = run_webgrad(r, args, np)
        print(f"  {r} webgrad: {wg['ms']:.1f} ms/step, first loss {wg['loss']:.4f}", flush=True)
        pt = None if args.no_torch else run_peft(r, args, np, torch)
        if pt:
            print(f"  {r} peft:    {pt['ms']:.1f} ms/step, first loss {pt['loss']:.4f}", flush=True)
        results.append((r, wg, pt))
    dev_name = torch.cuda.get_device_name() if cuda else "CPU"
    print()
    print(f"webgrad: backend {args.backend}" + (f" ({results[0][1]['info']}, WEBGRAD_WGPU_LIB={lib})" if lib else ""))
    print(f"peer:    peft {peft.__version__} + transformers {transformers.__version__} + torch "
          f"{torch.__version__} fp32 eager on {dev_name}, TF32 off")
    print(f"LoRA r={R}, alpha {ALPHA}, no dropout, on {', '.join(TARGETS)}; AdamW(lr {LR}, wd {WD}); "
          f"median of {args.steps} steps after >= {args.warmup} s of warm-up")
    print()
    print("| row | B x T | params / trainable | webgrad ms, kernels | peft ms, kernels | time ratio | "
          "peak webgrad / peft | compile + first step webgrad / peft | first loss webgrad / peft |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r, wg, pt in results:
        cfg_d, B, T = ROWS[r]
        ratio = f"**{wg['ms'] / pt['ms']:.2f}**" if pt else "-"
        pms = f"{pt['ms']:.1f}, {pt['kernels']}" if pt else "-"
        peak = f"{_mib(wg['bytes'])} / {_mib(pt['bytes']) if pt else '-'}"
        cf = f"{wg['compile'] + wg['first']:.1f} s / " + (f"{pt['compile'] + pt['first']:.1f} s" if pt else "-")
        loss = f"{wg['loss']:.4f} / " + (f"{pt['loss']:.4f}" if pt else "-")
        print(f"| {r} (hidden {cfg_d['hidden_size']}, {cfg_d['num_hidden_layers']} layers, vocab "
              f"{cfg_d['vocab_size']}) | {B} x {T} | {wg['params'] / 1e6:.1f}M / {wg['trainable'] / 1e6:.2f}M "
              f"| {wg['ms']:.1f}, {wg['kernels']} | {pms} | {ratio} | {peak} | {cf} | {loss} |")
    for r, wg, pt in results:
        if pt and pt["trainable"] != wg["trainable"]:
            print(f"note: {r}: trainable parameters differ: webgrad {wg['trainable']}, peft {pt['trainable']}")
        if pt:
            print(f"target (webgrad <= 1.0x peft): {r} {wg['ms'] / pt['ms']:.2f}x, "
                  f"{'meets' if wg['ms'] <= pt['ms'] else 'misses'} it"
                  + (f" (token table in {wg['chunks']} row blocks)" if wg['chunks'] > 1 else ""))


if __name__ == "__main__":
    main()
