#!/usr/bin/env python3
"""One GPT-style training step: webgrad (WebGPU through Dawn) against PyTorch eager fp32.

    python3 bench/gpt2_train.py                       # every row of the table (a GPU machine)
    python3 bench/gpt2_train.py --rows small2,gpt2    # a subset
    python3 bench/gpt2_train.py --rows tiny --steps 3 # lavapipe / CPU: a toy row
    python3 bench/gpt2_train.py --no-torch --profile 0  # webgrad alone, no kernel table
    python3 bench/gpt2_train.py --model module        # webgrad.models.gpt2.GPT2Module (tied head)
    python3 bench/gpt2_train.py --attention forced,unfused  # fused attention forced on, and off
    python3 bench/gpt2_train.py --set tiled_transpose=False  # a kernel option (codegen/options.py) off
    python3 bench/gpt2_train.py --rows gpt2 --dump out/  # per-kernel dumps of both libraries:
                                                      # bench/step_breakdown.py out/ groups them

Rows (model x batch):
  small2   d 512, 8 layers, 8 heads, vocab 4096, B x T = 2 x 256
  small64  the same model, 64 x 256
  gpt2     GPT-2 124M (d 768, 12 layers, 12 heads, vocab 50257, context 1024), 8 x 512
  gpt2ctx  the same model at its full context: 8 x 1024 (not in the default rows)
  medium   GPT-2 medium (d 1024, 24 layers, 16 heads, 355M params), 8 x 1024 (not in the default rows)
  tiny     d 64, 2 layers, 2 heads, vocab 256, 2 x 32 (smoke test on CPU adapters)

The model is the same in both libraries: learned token and position embeddings, pre-LN
blocks x + attn(ln1 x), x + mlp(ln2 x) with a fused QKV Linear, causal softmax attention,
a GELU (tanh form) MLP of width 4d, a final LayerNorm and an untied LM head, loss
cross-entropy over every position, AdamW(lr 3e-4, weight decay 0.01). Weights start as
N(0, 0.02), biases 0, LayerNorm 1/0 in both.

Per row and library: compile + init (webgrad: compile_module, which traces, differentiates,
plans, emits WGSL, loads pipelines and initialises the parameters; torch: building the
model on the GPU and the optimizer), the first step, then the median wall time of
--steps steps (batch in, loss read back as a float: both libraries do the same work per
step) after --warmup steps and at least 1.5 s of steps (a GPU left idle lowers its clocks), tokens/s, kernels per step (webgrad: dispatches of its plan;
torch: CUDA kernels launched in one profiled step), peak GPU bytes (webgrad: every buffer of
its plans, `memory_report()["planned_bytes"]`, a static figure; torch:
`torch.cuda.max_memory_allocated()` over the timed steps) and the ratios webgrad / torch.
Then webgrad's own profiler (`CompiledModule.profile`) prints the 10 kernels that take
the most GPU time (--profile N to change, 0 for none).

torch runs fp32 with TF32 off (allow_tf32 = False, precision "highest") on the same GPU
in the same process. The WebGPU library: $WEBGRAD_WGPU_LIB, else wgpudawn (Dawn) where
installed, else wgpu (wgpu-native), as bench/matmul.py picks it.
"""
from __future__ import annotations

# codegen switches travel as webgrad.codegen.KernelOptions (--set, attention_options below)
import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pkg"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROWS = {  # name: (d, layers, heads, vocab, context, B, T)
    "small2": (512, 8, 8, 4096, 256, 2, 256),
    "small64": (512, 8, 8, 4096, 256, 64, 256),
    "gpt2": (768, 12, 12, 50257, 1024, 8, 512),
    "gpt2ctx": (768, 12, 12, 50257, 1024, 8, 1024),
    "medium": (1024, 24, 16, 50257, 1024, 8, 1024),
    "tiny": (64, 2, 2, 256, 32, 2, 32),
}
LR, WD = 3e-4, 0.01


# ---------------------------------------------------------------- the model in webgrad

def webgrad_model(d, layers, heads, vocab, context):
    """(factory, loss_fn) of the GPT-style model for webgrad.compile_module."""
    from webgrad import Module, init, nn, ops

    class Block(Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d, init_w=init.randn(0.02))
            self.proj = nn.Linear(d, d, init_w=init.randn(0.02))
            self.fc = nn.Linear(d, 4 * d, init_w=init.randn(0.02))
            self.out = nn.Linear(4 * d, d, init_w=init.randn(0.02))

    class GPT(Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, d, init_w=init.randn(0.02))
            self.wpe = self.param([context, d], init=init.randn(0.02))
            self.blocks = [Block() for _ in range(layers)]
            self.ln_f = nn.LayerNorm(d)
            self.head = self.param([d, vocab], init=init.randn(0.02))

    def attention(p, x):
        qkv = p.qkv(x)
        q, k, v = (nn.split_heads(ops.slice(qkv, -1, i * d, (i + 1) * d), heads) for i in range(3))
        s = (q @ ops.swap_axes(k, -1, -2)) * (1.0 / math.sqrt(d // heads))
        return p.proj(nn.merge_heads(ops.softmax_causal_last(s) @ v))

    def loss_fn(m, inp):
        idx = inp["idx"]
        T = idx.shape[1]
        pos = m.wpe if T == context else ops.slice(m.wpe, 0, 0, T)
        x = m.wte(idx) + pos
        for p in m.blocks:
            x = x + attention(p, p.ln1(x))
            x = x + p.out(ops.gelu(p.fc(p.ln2(x))))
        return nn.cross_entropy_last(m.ln_f(x) @ m.head, inp["target"])

    return GPT, loss_fn


# ---------------------------------------------------------------- the same model in torch

def torch_model(torch, d, layers, heads, vocab, context, sdpa=False):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (t.view(B, T, heads, d // heads).transpose(1, 2) for t in (q, k, v))
            if sdpa:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d // heads))
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
                a = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
            x = x + self.proj(a.transpose(1, 2).reshape(B, T, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, d)
            self.wpe = nn.Parameter(torch.zeros(context, d))
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    nn.init.normal_(p, 0.0, 0.02)
                elif "ln" not in name:
                    nn.init.zeros_(p)

        def forward(self, idx, target):
            T = idx.shape[1]
            x = self.wte(idx) + self.wpe[:T]
            for b in self.blocks:
                x = b(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, vocab), target.reshape(-1))

    return GPT()


# ---------------------------------------------------------------- timing

def batch(np, vocab, B, T, seed):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, vocab, size=(B, T + 1), dtype=np.int32)
    return idx[:, :T].copy(), idx[:, 1:].copy()


def warm_up(step, n: int, seconds: float = 1.5) -> None:
    """At least n steps and `seconds` of them: a GPU left idle drops its clocks, and short
    steps (2 x 256) measured 12 to 37 ms/step after 2 warm-up steps, depending on what ran
    before them."""
    t0, s = time.perf_counter(), 0
    while s < n or time.perf_counter() - t0 < seconds:
        step(s)
        s += 1


def module_model(d, layers, heads, vocab, context):
    """(factory, loss_fn, input names) of webgrad.models.gpt2.GPT2Module (--model module):
    the same blocks, but its LM head is tied to the token table, as GPT-2's is."""
    from webgrad.models.gpt2 import GPT2Config, GPT2Module, lm_loss
    cfg = GPT2Config(layers, heads, d, context, vocab)
    return (lambda: GPT2Module(cfg)), lm_loss, ("tokens", "targets")


ATTENTION_MODES = ("fused", "forced", "unfused", "rows")


def attention_options(mode: str, options):
    """The KernelOptions of one --attention mode (see main's help) over `options`."""
    from dataclasses import replace
    if mode == "unfused":  # the graph as traced: matmuls and a row softmax
        return replace(options, fuse_attention=False)
    if mode == "forced":
        return replace(options, fuse_attention=True)
    if mode == "rows":
        return replace(options, fuse_attention=True, attn_tiled=False)
    return options


def run_webgrad(row, args, np, kernel_options=None, precision="f32"):
    import webgrad as wg
    from webgrad import optim
    d, layers, heads, vocab, context, B, T = ROWS[row]
    if args.model == "module":
        factory, loss_fn, names = module_model(d, layers, heads, vocab, context)
    else:
        (factory, loss_fn), names = webgrad_model(d, layers, heads, vocab, context), ("idx", "target")
    t0 = time.perf_counter()
    c = wg.compile_module(factory, loss_fn, backend=args.backend,
                          inputs={names[0]: ([B, T], "i32"), names[1]: ([B, T], "i32")},
                          optimizer=optim.AdamW(lr=LR, weight_decay=WD), kernel_options=kernel_options,
                          precision=precision)
    t_compile = time.perf_counter() - t0
    feeds = [dict(zip(names, batch(np, vocab, B, T, s))) for s in range(4)]
    t0 = time.perf_counter()
    first_loss = c.step(feeds[0])
    t_first = time.perf_counter() - t0
    losses = [first_loss] + [c.step(feeds[s % 4]) for s in range(1, args.track)]
    warm_up(lambda s: c.step(feeds[s % 4]), args.warmup)
    times = []
    for s in range(args.steps):
        t0 = time.perf_counter()
        c.step(feeds[s % 4])
        times.append(time.perf_counter() - t0)
    try:
        planned = c.memory_report()["planned_bytes"]
    except NotImplementedError:
        planned = None
    prof = None
    if args.dump:
        import json
        from step_breakdown import webgrad_dump
        dump = webgrad_dump(c, feeds[0], args.dump_reps, vocab)
        (Path(args.dump) / f"{row}_webgrad.json").write_text(json.dumps(dump))
    if args.profile and hasattr(c, "profile"):
        try:
            prof = c.profile(feeds[0])
        except NotImplementedError as e:
            prof = f"(no profile: {e})"
    skipped = sum(bool(getattr(x, "skipped", False)) for x in losses)
    return dict(compile=t_compile, first=t_first, ms=1e3 * statistics.median(times),
                kernels=c.kernel_count, bytes=planned, loss=first_loss, profile=prof,
                params=sum(math.prod(s) for s in c.param_shapes.values()), c=c,
                losses=[float(x) for x in losses], skipped=skipped)


# torch peers (--peers): fp32 (TF32 off), autocast to bf16, autocast to fp16 with a GradScaler;
# "-sdpa" after one: its attention through F.scaled_dot_product_attention(is_causal=True)
PEERS = ("fp32", "bf16", "fp16", "fp32-sdpa", "bf16-sdpa", "fp16-sdpa")


def run_torch(row, args, np, torch, peer="fp32"):
    d, layers, heads, vocab, context, B, T = ROWS[row]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    if dev == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    dtype, _, attn = peer.partition("-")
    model = torch_model(torch, d, layers, heads, vocab, context, sdpa=attn == "sdpa")
    if args.model == "module":  # GPT2Module ties the head to the token table
        model.head.weight = model.wte.weight
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    if dev == "cuda":
        torch.cuda.synchronize()
    t_compile = time.perf_counter() - t0
    feeds = [tuple(torch.from_numpy(a).long().to(dev) for a in batch(np, vocab, B, T, s))
             for s in range(4)]

    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype)
    scaler = torch.amp.GradScaler(dev) if dtype == "fp16" else None

    def step(f):
        opt.zero_grad(set_to_none=True)
        if amp is None:
            loss = model(*f)
        else:  # torch.amp as people train: autocast the forward, the backward follows it
            with torch.autocast(dev, dtype=amp):
                loss = model(*f)
        if scaler is None:
            loss.backward()
            opt.step()
        else:   # GradScaler: the loss scaled by 2^16, a step with an inf/nan gradient skipped
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss.item()  # the loss as a float, as webgrad's step returns it

    t0 = time.perf_counter()
    first_loss = step(feeds[0])
    t_first = time.perf_counter() - t0
    losses = [first_loss] + [step(feeds[s % 4]) for s in range(1, args.track)]
    warm_up(lambda s: step(feeds[s % 4]), args.warmup)
    kernels = None
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(feeds[0])
        kernels = sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA"
                      and not e.key.startswith("Memcpy") and not e.key.startswith("Memset"))
    if args.dump and dev == "cuda":
        from step_breakdown import torch_dump
        torch_dump(torch, lambda: step(feeds[0]), Path(args.dump) / f"{row}_torch.json.gz")
    times = []
    for s in range(args.steps):
        t0 = time.perf_counter()
        step(feeds[s % 4])
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if dev == "cuda" else None
    out = dict(compile=t_compile, first=t_first, ms=1e3 * statistics.median(times),
               kernels=kernels, bytes=peak, loss=first_loss, losses=losses)
    del model, opt, feeds
    if dev == "cuda":
        torch.cuda.empty_cache()
    return out


def _mb(b):
    return "-" if b is None else f"{b / 2**20:.0f} MiB"


def by_name(prof, top: int) -> str:
    """A profile's GPU time summed over the kernels of each name, the `top` largest."""
    sums: dict[str, list] = {}
    for row in prof.rows:
        acc = sums.setdefault(row.name, [0, 0.0])
        acc[0] += 1
        acc[1] += row.seconds or 0.0
    lines = ["    ms   count  kernel name (summed)"]
    for n, (c, sec) in sorted(sums.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"  {sec * 1e3:8.3f} {c:5d}  {n}")
    return "\n".join(lines)


def apply_setting(item: str, options):
    """--set NAME=VALUE: a KernelOptions field (codegen/options.py; the old module attribute
    of one, webgrad.codegen.elementwise.TILED_TRANSPOSE, means its field) gives new options;
    another MODULE.ATTR (a runtime setting: webgrad.backends.webgpu_device.PIPELINE_THREADS)
    is set on its module and must exist (a typo fails, not a silent no-op)."""
    import ast
    import importlib
    from webgrad.codegen.options import field_for, with_setting
    lhs, eq, rhs = item.partition("=")
    try:
        field_for(lhs.strip())
        out = with_setting(options, item)
        print(f"kernel option {field_for(lhs.strip())} = {getattr(out, field_for(lhs.strip()))!r}")
        return out
    except KeyError:
        pass
    mod, dot, attr = lhs.strip().rpartition(".")
    if not (eq and dot):
        raise SystemExit(f"--set {item}: write FIELD=VALUE (a KernelOptions field) or MODULE.ATTR=VALUE")
    m = importlib.import_module(mod)
    if not hasattr(m, attr):
        raise SystemExit(f"--set {item}: {mod} has no attribute {attr!r}")
    setattr(m, attr, ast.literal_eval(rhs.strip()))
    print(f"set {mod}.{attr} = {getattr(m, attr)!r}")
    return options


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="small2,small64,gpt2", help=f"comma-separated: {', '.join(ROWS)}")
    ap.add_argument("--steps", type=int, default=8, help="timed steps (median)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--backend", default="webgpu")
    ap.add_argument("--attention", default="fused",
                    help="comma-separated, each timed against the same torch run: fused (the "
                    "default policy, attention_match._fuse_training), forced (training "
                    "attention always fused), unfused (no attention pass: matmuls and a row "
                    "softmax), rows (forced, with attention.py's row kernels instead of the "
                    "tiled ones)")
    ap.add_argument("--model", default="bench", choices=("bench", "module"),
                    help="bench: the model defined here (untied head, issue 11's table); "
                    "module: webgrad.models.gpt2.GPT2Module (head tied to wte), torch tied too")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--profile", type=int, default=10, help="top-N kernels of webgrad's profile")
    ap.add_argument("--by-name", action="store_true",
                    help="with --profile: also the GPU time summed over the kernels of each name "
                    "(the top --profile names)")
    ap.add_argument("--dump", default=None, metavar="DIR",
                    help="write DIR/<row>_webgrad.json and DIR/<row>_torch.json.gz, every kernel "
                    "of a step with its GPU time, for bench/step_breakdown.py")
    ap.add_argument("--dump-reps", type=int, default=3, help="profiled webgrad steps per dump (mean)")
    ap.add_argument("--exact-timestamps", action="store_true",
                    help="Dawn: turn off timestamp quantisation (toggles allow_unsafe_apis, "
                    "-timestamp_quantization, added to $WEBGRAD_DAWN_TOGGLES) so that short "
                    "kernels time right")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a kernel option (codegen/options.py's KernelOptions field, a Python "
                    "literal) to time a codegen switch: --set tiled_transpose=False (the old "
                    "spelling webgrad.codegen.elementwise.TILED_TRANSPOSE=False means the same); "
                    "or a runtime MODULE.ATTR: --set webgrad.backends.webgpu_native.PREFETCH=False")
    ap.add_argument("--precision", default="f32",
                    help="comma-separated webgrad precisions (compile_module's precision=): f32, "
                    "mixed (f16 products with f32 accumulation, loss scaling in the program)")
    ap.add_argument("--peers", default="fp32",
                    help=f"comma-separated torch peers, each its own run: {', '.join(PEERS)} (bf16 and "
                    "fp16 under torch.autocast, fp16 with a GradScaler; -sdpa: attention through "
                    "scaled_dot_product_attention)")
    ap.add_argument("--track", type=int, default=1,
                    help="print the losses of the first N steps of every run (same batches)")
    args = ap.parse_args()
    precisions, peers = args.precision.split(","), args.peers.split(",")
    if set(precisions) - {"f32", "mixed"}:
        ap.error(f"--precision: choose from f32, mixed (got {args.precision})")
    if set(peers) - set(PEERS):
        ap.error(f"--peers: unknown {sorted(set(peers) - set(PEERS))}; choose from {', '.join(PEERS)}")
    from webgrad.codegen import KernelOptions
    args.kernel_options = KernelOptions()
    for item in args.set:
        args.kernel_options = apply_setting(item, args.kernel_options)
    modes = args.attention.split(",")
    bad = set(modes) - set(ATTENTION_MODES)
    if bad:
        ap.error(f"--attention: unknown {sorted(bad)}; choose from {', '.join(ATTENTION_MODES)}")
    import numpy as np
    if args.dump:
        Path(args.dump).mkdir(parents=True, exist_ok=True)
        from step_breakdown import capture_graphs
        capture_graphs()
    if args.backend == "webgpu":
        from matmul import pick_lib
        lib = pick_lib()
        if args.exact_timestamps:  # read by webgpu_native when it makes the device
            import os
            extra = "allow_unsafe_apis,-timestamp_quantization"
            os.environ["WEBGRAD_DAWN_TOGGLES"] = ",".join(
                t for t in (os.environ.get("WEBGRAD_DAWN_TOGGLES", ""), extra) if t)
        from webgrad.backends.webgpu_native import NativeHost
        import os
        host = NativeHost()
        print(f"webgpu: {host.info}  (library {lib}; Dawn toggles "
              f"{os.environ.get('WEBGRAD_DAWN_TOGGLES', 'default') if lib == 'wgpudawn' else '-'}; device "
              f"toggles {','.join(host.device_toggles) or 'none'})")
    torch = None
    if not args.no_torch:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        print(f"torch {torch.__version__} on "
              f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}, peers {args.peers}, "
              "TF32 off")
    table = []
    variants = [(p, m) for p in precisions for m in modes]
    for row in args.rows.split(","):
        d, layers, heads, vocab, context, B, T = ROWS[row]
        ws = {}
        for prec, mode in variants:
            ws[prec, mode] = run_webgrad(row, args, np, attention_options(mode, args.kernel_options),
                                         precision=prec)
            ws[prec, mode]["c"].destroy()
        ts = {p: run_torch(row, args, np, torch, p) for p in peers} if torch is not None else {}
        w = ws[variants[0]]
        print(f"\n== {row}: d {d}, {layers} layers, {heads} heads, vocab {vocab}, B x T = {B} x {T}, "
              f"{w['params'] / 1e6:.1f}M params")
        named = [(" ".join(["webgrad"] + ([p] if len(precisions) > 1 else []) + ([m] if len(modes) > 1 else [])),
                  ws[p, m]) for p, m in variants]
        peer_named = [(f"torch {p}" if len(peers) > 1 else "torch", ts[p]) for p in ts]
        for name, r in named + peer_named:
            print(f"  {name:14} {r['ms']:9.2f} ms/step  {B * T / r['ms'] * 1e3:10.0f} tok/s  "
                  f"kernels {r['kernels'] if r['kernels'] is not None else '-':>5}  "
                  f"peak {_mb(r['bytes']):>10}  compile+init {r['compile']:6.2f} s  "
                  f"first step {r['first']:6.2f} s  loss0 {r['loss']:.4f}"
                  + (f"  skipped {r['skipped']}" if r.get("skipped") else ""), flush=True)
            if args.track > 1:
                print("    losses " + " ".join(f"{x:.5f}" for x in r["losses"]))
        for pname, t in peer_named:
            for name, r in named:
                mem = (r["bytes"] / t["bytes"]) if r["bytes"] and t["bytes"] else None
                print(f"  ratio {name} / {pname}: time {r['ms'] / t['ms']:.2f}x"
                      + (f"  memory {mem:.2f}x" if mem else ""))
        for name, r in named:
            label = name[len("webgrad "):] if name != "webgrad" else ""
            table.append((row, label, r, peer_named))
            if isinstance(r["profile"], str):
                print("  " + r["profile"])
            elif r["profile"] is not None:
                print(f"  {name}: " + r["profile"].text(top=args.profile))
                if args.by_name:
                    print(by_name(r["profile"], args.profile))
    print("\n| row | B x T | webgrad | ms | kernels | peer | peer ms | kernels | time ratio | webgrad peak "
          "| peer peak | memory ratio | webgrad compile+init s | peer init s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row, label, w, peer_named in table:
        d, layers, heads, vocab, context, B, T = ROWS[row]
        for pname, t in peer_named or [("-", {})]:
            ratio = f"{w['ms'] / t['ms']:.2f}" if t else "-"
            mem = f"{w['bytes'] / t['bytes']:.2f}" if t and w["bytes"] and t.get("bytes") else "-"
            print(f"| {row} | {B} x {T} | {label or '-'} | {w['ms']:.1f} | {w['kernels']} | {pname} | "
                  f"{t.get('ms', float('nan')):.1f} | {t.get('kernels', '-')} | {ratio} | {_mb(w['bytes'])} | "
                  f"{_mb(t.get('bytes'))} | {mem} | {w['compile']:.1f} | {t.get('compile', float('nan')):.2f} |")


if __name__ == "__main__":
    main()
