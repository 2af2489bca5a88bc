#!/usr/bin/env python3
"""Tokens/s of GPT-2 cached greedy decoding: webgrad (WebGPU, Dawn) against transformers'
generate() with its KV cache, fp32 (and bf16), same GPU, same weights, same run.

    source .device/env.sh; python3 bench/gpt2_decode.py        # 124M on the GPU machine
    source .device/env.sh; python3 bench/gpt2_decode.py --dtypes f32,f16 --peers fp32,bf16   # issue 27
    python3 bench/gpt2_decode.py --tiny                          # a small config on lavapipe/CPU
    python3 bench/gpt2_decode.py --browser                       # small config, headless Chromium

Both sides decode --new tokens after a --prompt-token prompt from one random GPT-2
(transformers' init; webgrad loads its state_dict through from_hf_state_dict), greedy, so the
work is the same: one prefill, then one step per token. webgrad's step is one queue
submission that uploads the token id and position (8 bytes) and reads back the argmax token
(computed on the device); the K/V cache stays in device buffers written in place. transformers
runs model.generate(do_sample=False, use_cache=True) on torch's CUDA device (CPU without one),
TF32 off. Each side is warmed up once (webgrad compiles its two programs there), then timed
--reps times; the best run is reported. The two token sequences are compared (greedy on random
weights may part where two logits nearly tie; the shared prefix length is printed).

--browser runs webgrad inside the Pyodide worker of serve.py's page in headless Chromium
(WebGPU on SwiftShader there), small config, with the timing taken in the worker.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pkg"))

TINY = dict(n_layer=2, n_head=2, n_embd=64, n_ctx=128, vocab_size=1000)


def hf_model(cfg, device):
    import torch
    import transformers
    hcfg = transformers.GPT2Config(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                                   n_positions=cfg.n_ctx, vocab_size=cfg.vocab_size,
                                   activation_function="gelu_new", resid_pdrop=0.0,
                                   embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None,
                                   eos_token_id=None)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(hcfg).eval().to(device)


def time_best(fn, reps):
    best, out = float("inf"), None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def shared_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def run_native(args, cfg):
    import torch
    from webgrad.models import gpt2
    from matmul import pick_lib  # bench/ is on sys.path when a bench runs as a script
    lib = pick_lib()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":  # a CPU smoke test: torch's thread pool spins badly on a shared machine
        torch.set_num_threads(1)
    ref = hf_model(cfg, device)
    prompt = [(7 * i + 3) % cfg.vocab_size for i in range(args.prompt)]
    n = args.new

    def hf_runner(model):
        def run():
            ids = torch.tensor([prompt], device=device)
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                     use_cache=True, pad_token_id=0,
                                     attention_mask=torch.ones_like(ids))
            if device == "cuda":
                torch.cuda.synchronize()
            return out[0, len(prompt):].tolist()
        return run

    sd = {k: v.detach().cpu() for k, v in ref.state_dict().items()}
    rows, fp32_toks = [], None   # (name, tokens/s, tokens shared with transformers fp32)
    for peer in args.peers.split(","):
        if peer not in ("fp32", "bf16"):
            raise SystemExit(f"--peers: {peer!r} is not fp32 or bf16")
        run = hf_runner(ref if peer == "fp32" else ref.to(torch.bfloat16))
        run()  # warm-up: the CUDA context and kernels
        t, toks = time_best(run, args.reps)
        fp32_toks = toks if peer == "fp32" else fp32_toks
        rows.append((f"transformers {peer}", n / t, toks))
        if peer == "bf16":
            ref = ref.float()
    kernels = {}
    for dtype in args.dtypes.split(","):
        if dtype not in ("f32", "f16"):
            raise SystemExit(f"--dtypes: {dtype!r} is not f32 or f16")
        m = gpt2.GPT2.from_hf_state_dict(cfg, sd, backend="webgpu", dtype=dtype)
        m.precision = dtype   # f16: the decode programs round where precision='f16' does

        def wg_run():
            return m.generate(prompt, max_new_tokens=n, temperature=0)[len(prompt):]

        wg_run()  # warm-up: compiles the prefill and step programs
        t, toks = time_best(wg_run, args.reps)
        rows.append((f"webgrad {dtype}", n / t, toks))
        kernels[dtype] = m._program("step", 1).kernel_count
        info, chunks = m.backend.host.info, m.wte_chunks
        del m
    dev_name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"config: n_layer={cfg.n_layer} n_embd={cfg.n_embd} n_head={cfg.n_head} "
          f"vocab={cfg.vocab_size} n_ctx={cfg.n_ctx}; prompt {len(prompt)} tokens, {n} new, "
          f"greedy, best of {args.reps}")
    print(f"webgpu: {info} (WEBGRAD_WGPU_LIB={lib}), token table in {chunks} block(s), "
          f"kernels per decode step: {kernels}")
    print(f"torch:  {torch.__version__} on {dev_name} ({torch.get_num_threads()} threads), "
          "transformers generate() with its cache, TF32 off")
    peers = {r[0]: r[1] for r in rows if r[0].startswith("transformers")}
    print("| run | tokens/s | " + " | ".join(f"x {p}" for p in peers) + " | tokens = fp32's |")
    print("|---|---|" + "---|" * len(peers) + "---|")
    for name, rate, toks in rows:
        same = f"{shared_prefix(fp32_toks, toks)}/{n}" if fp32_toks else "-"
        print(f"| {name} | {rate:.1f} | " + " | ".join(f"{rate / r:.2f}" for r in peers.values())
              + f" | {same} |")


BROWSER_CODE = """
import time
from webgrad.models import gpt2
cfg = gpt2.GPT2Config(**{cfg!r})
m = gpt2.GPT2.init_random(cfg, seed=0, backend="webgpu")
prompt = [(7 * i + 3) % cfg.vocab_size for i in range({prompt})]
await m.generate_async(prompt, max_new_tokens={new}, temperature=0)   # warm-up (compiles)
best = 1e9
for _ in range({reps}):
    t = time.perf_counter()
    out = await m.generate_async(prompt, max_new_tokens={new}, temperature=0)
    best = min(best, time.perf_counter() - t)
[{new} / best, m.backend.host.info if hasattr(m.backend.host, "info") else "?"]
"""


def run_browser(args, cfg_kw):
    from webgrad.browser import BrowserSession
    with BrowserSession() as s:
        code = BROWSER_CODE.format(cfg=cfg_kw, prompt=args.prompt, new=args.new, reps=args.reps)
        tps, info = s.run(code, timeout=600)
    print(f"config: {cfg_kw}; prompt {args.prompt} tokens, {args.new} new, greedy")
    print(f"headless Chromium, Pyodide worker, WebGPU adapter: {info}")
    print(f"webgrad tokens/s: {tps:.1f}")


def set_kernel_options(items) -> None:
    """Make `items` ("NAME=VALUE") the default kernel options of native WebGPU backends
    created from here on (before the first program: the backend is made once)."""
    if not items:
        return
    from webgrad.backends import webgpu
    from webgrad.codegen.options import with_setting
    for item in items:
        webgpu.DEFAULT_OPTIONS = with_setting(webgpu.DEFAULT_OPTIONS, item)
    print(f"kernel options: {', '.join(items)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help=f"small config {TINY} (CPU/lavapipe)")
    ap.add_argument("--browser", action="store_true", help="webgrad in headless Chromium (small config)")
    ap.add_argument("--prompt", type=int, default=8, help="prompt tokens")
    ap.add_argument("--new", type=int, default=None, help="tokens to generate (128; 32 with --tiny/--browser)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtypes", default="f32", help="webgrad rows: f32, f16 (weights held in f16, "
                    "programs in precision='f16': issue 27's decode row), or both: f32,f16")
    ap.add_argument("--peers", default="fp32", help="transformers rows: fp32, bf16 or fp32,bf16")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a kernel option of webgrad's WebGPU programs (codegen/options.py's "
                    "KernelOptions field, a Python literal): --set gemv_rows=0 decodes without "
                    "the matrix-vector kernel")
    args = ap.parse_args()
    set_kernel_options(args.set)
    small = args.tiny or args.browser
    args.new = args.new or (32 if small else 128)
    if args.browser:
        return run_browser(args, TINY)
    from webgrad.models import gpt2
    cfg = gpt2.GPT2Config(**TINY) if args.tiny else gpt2.GPT2Config.small()
    run_native(args, cfg)


if __name__ == "__main__":
    main()
