#!/usr/bin/env python3
"""GPT-2 decoding with its weights held quantized on the GPU: GPU bytes of the weights and
greedy decode tokens/s for F32 vs Q8_0 vs Q4_0 vs Q4_K, in one run.

    source .device/env.sh; python3 bench/gpt2_quant.py     # 124M-shaped, native (Dawn on the H200)
    python3 bench/gpt2_quant.py --tiny                     # small config, native (lavapipe here)
    python3 bench/gpt2_quant.py --browser                  # small config, headless Chromium
                                                           # (Pyodide worker, WebGPU on SwiftShader)

One random model (N(0, 0.02) weights, norms 1/0) is written to GGUF by the gguf package in
llama.cpp's gpt2 layout once per type: F32 as it is; Q8_0 and Q4_0 quantized from the same
f32 values by gguf.quants.quantize; Q4_K as random super-blocks of a similar scale (gguf has
no Q4_K quantizer). Every 2-D tensor takes the type, the token and position tables included
(the head is tied to the token table). Each file is loaded by GPT2.from_gguf(backend=
"webgpu") with keep_quantized=True (the default), so the matmuls and the embedding read
the blocks and decode them in registers (codegen/quant.py). Reported per type: the bytes
the weights take on the GPU (GPT2.weight_bytes), the load time (parse + transcode +
upload), decode tokens/s (greedy, --new tokens after a --prompt-token prompt, one queue
submission per token; warmed up once, best of --reps), kernels per decode step, and how
many of the greedy tokens agree with F32's (random weights: near-ties part them early for
the 4-bit types). The ratios are against F32 in the same run.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "pkg"), str(ROOT / "tests")]

TINY = dict(n_layer=2, n_head=2, n_embd=256, n_ctx=128, vocab_size=1000)
TYPES = ("F32", "Q8_0", "Q4_0", "Q4_K")


def write_gguf(path, cfg, qtype: str, seed: int = 0) -> None:
    """A random GPT-2 of cfg in llama.cpp's gpt2 names, 2-D tensors in qtype."""
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as QT
    rng = np.random.default_rng(seed)
    qrng = np.random.default_rng(seed + 1)
    D, V = cfg.n_embd, cfg.vocab_size
    shapes = {"token_embd.weight": (V, D), "position_embd.weight": (cfg.n_ctx, D)}
    for i in range(cfg.n_layer):
        for base, (o, n) in (("attn_qkv", (3 * D, D)), ("attn_output", (D, D)),
                             ("ffn_up", (4 * D, D)), ("ffn_down", (D, 4 * D))):
            shapes[f"blk.{i}.{base}.weight"] = (o, n)
            shapes[f"blk.{i}.{base}.bias"] = (o,)
        for base in ("attn_norm", "ffn_norm"):
            shapes[f"blk.{i}.{base}.weight"] = (D,)
            shapes[f"blk.{i}.{base}.bias"] = (D,)
    shapes["output_norm.weight"] = (D,)
    shapes["output_norm.bias"] = (D,)
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_context_length(cfg.n_ctx); w.add_embedding_length(D); w.add_feed_forward_length(4 * D)
    w.add_block_count(cfg.n_layer); w.add_head_count(cfg.n_head)
    w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    for name, s in shapes.items():
        if len(s) == 1:
            w.add_tensor(name, np.full(s, 1.0 if name.endswith("norm.weight") else 0.0, np.float32))
            continue
        x = rng.standard_normal(s, dtype=np.float32) * np.float32(0.02)
        if qtype == "F32":
            w.add_tensor(name, x)
        elif qtype == "Q4_K":
            nb = s[0] * s[1] // 256
            raw = qrng.integers(0, 256, size=(nb, 144), dtype=np.uint8)
            # d, dmin ~ 0.02 * 3 / (63 * 15) and the 6-bit scales/mins random: values of
            # roughly the f32 model's spread, centred by the mins
            dm = np.abs(qrng.normal(1.0, 0.2, (nb, 2)) * (0.06 / (63 * 15))).astype(np.float16)
            raw[:, :4] = dm.view(np.uint8).reshape(nb, 4)
            w.add_tensor(name, raw.reshape(s[0], -1), raw_shape=(s[0], s[1] // 256 * 144),
                         raw_dtype=QT.Q4_K)
        else:
            q = gguf.quants.quantize(x, QT[qtype])
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=QT[qtype])
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file()
    w.close()


HEADER = ("| type | weights on the GPU, MB | x F32 | load s | decode tokens/s | x F32 | "
          "kernels/step | tokens = F32's |\n|---|---|---|---|---|---|---|---|")


def row(r, f32) -> str:
    from gpt2_decode import shared_prefix  # bench/ is on sys.path when a bench runs as a script
    return (f"| {r['type']} | {r['bytes'] / 1e6:.1f} | {r['bytes'] / f32['bytes']:.3f} | "
            f"{r['load']:.1f} | {r['tps']:.1f} | {r['tps'] / f32['tps']:.2f} | "
            f"{r['kernels']} | {shared_prefix(r['tokens'], f32['tokens'])}/{len(f32['tokens'])} |")


def run_native(args, cfg):
    from webgrad.models import gpt2
    from matmul import pick_lib  # bench/ is on sys.path when a bench runs as a script
    lib = pick_lib()
    prompt = [(7 * i + 3) % cfg.vocab_size for i in range(args.prompt)]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for qtype in args.types.split(","):
            path = Path(d) / f"{qtype}.gguf"
            t0 = time.perf_counter()
            write_gguf(path, cfg, qtype)
            t_write = time.perf_counter() - t0
            t0 = time.perf_counter()
            m = gpt2.GPT2.from_gguf(path, backend="webgpu")
            t_load = time.perf_counter() - t0
            run = lambda: m.generate(prompt, max_new_tokens=args.new, temperature=0)[len(prompt):]  # noqa: E731
            toks = run()                                    # warm-up: compiles the programs
            best = float("inf")
            for _ in range(args.reps):
                t0 = time.perf_counter()
                toks = run()
                best = min(best, time.perf_counter() - t0)
            rows.append({"type": qtype, "bytes": m.weight_bytes, "load": t_load, "tps": args.new / best,
                         "kernels": m._program("step", 1).kernel_count, "tokens": toks})
            if len(rows) == 1:
                print(f"webgpu: {m.backend.host.info} (WEBGRAD_WGPU_LIB={lib}); config: "
                      f"n_layer={cfg.n_layer} n_embd={cfg.n_embd} n_head={cfg.n_head} "
                      f"vocab={cfg.vocab_size} n_ctx={cfg.n_ctx}; prompt {len(prompt)} tokens, "
                      f"{args.new} new, greedy, best of {args.reps}\n{HEADER}")
            print(row(rows[-1], rows[0]) + f"  <- file written in {t_write:.1f} s "
                  f"({path.stat().st_size / 1e6:.0f} MB), token table in {m.wte_chunks} block(s)",
                  flush=True)
            m.backend.destroy()
            path.unlink()


BROWSER_CODE = """
import time
from webgrad.models import gpt2
async def quant_bench(blob, qtype, prompt, new, reps):
    t0 = time.perf_counter()
    m = gpt2.GPT2.from_gguf(blob, backend="webgpu")
    load = time.perf_counter() - t0
    toks = (await m.generate_async(prompt, max_new_tokens=new, temperature=0))[len(prompt):]
    best = 1e9
    for _ in range(reps):
        t = time.perf_counter()
        toks = (await m.generate_async(prompt, max_new_tokens=new, temperature=0))[len(prompt):]
        best = min(best, time.perf_counter() - t)
    out = {"type": qtype, "bytes": m.weight_bytes, "load": load, "tps": new / best,
           "kernels": m._program("step", 1).kernel_count, "tokens": toks,
           "info": getattr(m.backend.host, "info", "?")}
    m.backend.destroy()
    return out
"""


def run_browser(args, cfg):
    from webgrad.browser import BrowserSession
    prompt = [(7 * i + 3) % cfg.vocab_size for i in range(args.prompt)]
    rows = []
    with tempfile.TemporaryDirectory() as d, BrowserSession() as s:
        s.run(BROWSER_CODE)
        for qtype in args.types.split(","):
            path = Path(d) / f"{qtype}.gguf"
            write_gguf(path, cfg, qtype)
            rows.append(s.call("quant_bench", path.read_bytes(), qtype, prompt, args.new, args.reps,
                               timeout=900))
    print(f"config: {TINY}; prompt {len(prompt)} tokens, {args.new} new, greedy, best of {args.reps}")
    print(f"headless Chromium, Pyodide worker, WebGPU adapter: {rows[0]['info']}\n{HEADER}")
    for r in rows:
        print(row(r, rows[0]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help=f"small config {TINY}")
    ap.add_argument("--browser", action="store_true", help="headless Chromium (small config)")
    ap.add_argument("--types", default=",".join(TYPES), help="F32 first: the ratios' peer")
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--new", type=int, default=None, help="tokens to generate (128; 32 small)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from webgrad.models import gpt2
    small = args.tiny or args.browser
    args.new = args.new or (32 if small else 128)
    cfg = gpt2.GPT2Config(**TINY) if small else gpt2.GPT2Config.small()
    (run_browser if args.browser else run_native)(args, cfg)


if __name__ == "__main__":
    main()
