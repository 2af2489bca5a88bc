#!/usr/bin/env python3
"""Prefill and decode tokens/s of a Llama-3.2-1B-shaped model (random weights): webgrad on
WebGPU (Dawn), F32 and Q4_K_M kept quantized on the GPU, against transformers' generate()
in fp32 and bf16 on the same GPU, in the same run, and (--llama-bench) against llama.cpp's
own CUDA build reading the same Q4_K_M file. Issue 24 ("Speed, in bench/"): the targets are
webgrad >= 2x transformers bf16 at decoding and >= 0.5x llama.cpp's CUDA decode.

    source .device/env.sh; python3 bench/llama_decode.py     # 1B shape, on the GPU machine
    python3 bench/llama_decode.py --small                     # tiny config; CPU executors
                                                              # (torch) where no GPU is
    python3 bench/llama_decode.py --types Q4_K_M --llama-bench /tmp/lc/build/bin/llama-bench
                                   # and llama.cpp's CUDA build on the same Q4_K_M file
                                   # (bench/llama_cpp_cuda.sh builds llama-bench)

The model: hidden 2048, 16 layers, 32 heads (8 K/V heads, head_dim 64), intermediate 8192,
vocab 128256, rope_theta 500000 with llama3 rope scaling, embeddings tied to the head, as
Llama-3.2-1B's config.json. transformers builds it with its own random init (fp32);
webgrad's F32 model loads that state dict (from_hf_state_dict), so both sides hold the
same weights and their greedy tokens can be compared. The bf16 peer is the same module cast
to bfloat16. Q4_K_M: a GGUF file written here with the gguf package in llama.cpp's names
and llama-quantize's Q4_K_M type mix (Q6_K for the tied token table and, in llama.cpp's
"more bits" layers, for attn_v and ffn_down; Q4_K for every other matrix), its k-quant
blocks random bytes with f16 scales of usable size (gguf has no k-quant quantizer), loaded
by Llama.from_gguf: the weights stay as their blocks on the GPU and the matmuls decode them
in registers. Its tokens are not comparable (other weights); its speed is.

Measured, each side warmed up once and then the best of --reps runs:
  decode:  --new tokens (128) generated greedily after a --prompt-token prompt (8);
           tokens/s = new / time of the whole generate call (prefill of the prompt
           included, as bench/gpt2_decode.py counts it);
  prefill: one --prefill-token prompt (512) and one new token; tokens/s = prefill / time.
transformers: generate(do_sample=False, use_cache=True, min_new_tokens = max_new_tokens)
with its default dynamic cache and attention (sdpa), TF32 off, synchronized before the
clock stops. webgrad: Llama.generate(temperature=0): one queue submission per token, the
argmax read back (4 bytes), K/V written in place in a cache of n_ctx rows (the largest
prompt + new of the run) that each step attends over.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pkg"))
sys.path.insert(0, str(ROOT / "bench"))

from gpt2_decode import set_kernel_options, shared_prefix, time_best  # noqa: E402  (GPT-2's timing)

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# Llama-3.2-1B's config.json (the fields that shape the compute)
LLAMA_1B = dict(model_type="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
                rope_theta=500000.0, rope_scaling=LLAMA3_SCALING, tie_word_embeddings=True,
                max_position_embeddings=131072, rms_norm_eps=1e-5, hidden_act="silu",
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
# hidden and intermediate sizes of whole k-quant blocks (256 values)
SMALL = dict(LLAMA_1B, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, intermediate_size=512, vocab_size=1000)


def hf_config(d):
    import transformers
    return transformers.LlamaConfig(**{k: v for k, v in d.items() if k != "model_type"})


def hf_model(d, device):
    """transformers' LlamaForCausalLM with its random init, fp32, built on `device`."""
    import torch
    import transformers
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.LlamaForCausalLM(hf_config(d)).eval()


def hf_runner(model, device, prompt, n):
    import torch

    def run():
        ids = torch.tensor([prompt], device=device)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 use_cache=True, pad_token_id=0, attention_mask=torch.ones_like(ids))
        if device == "cuda":
            torch.cuda.synchronize()
        return out[0, len(prompt):].tolist()
    return run


def wg_runner(m, prompt, n):
    def run():
        return m.generate(prompt, max_new_tokens=n, temperature=0, stop_at_eos=False)[len(prompt):]
    return run


# ---------------------------------------------------------------- the Q4_K_M file

def more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits (llama-quant.cpp): the layers whose attn_v and ffn_down a
    Q4_K_M file holds as Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(gname: str, n_layer: int) -> str:
    if gname == "token_embd.weight" or gname == "output.weight":
        return "Q6_K"
    if gname.startswith("blk.") and (".attn_v." in gname or ".ffn_down." in gname):
        return "Q6_K" if more_bits(int(gname.split(".")[1]), n_layer) else "Q4_K"
    return "Q4_K"


def rope_factors(cfg) -> "np.ndarray":
    """The rope_freqs tensor llama.cpp's converter writes for llama3 scaling: a divisor per
    frequency, the plain inverse frequencies over the scaled ones (LlamaConfig.inv_freq)."""
    import numpy as np
    d = cfg.head_dim
    plain = [1.0 / cfg.rope_theta ** (2 * k / d) for k in range(d // 2)]
    return np.asarray([p / s for p, s in zip(plain, cfg.inv_freq())], np.float32)


# k-quant block bytes and the byte offsets of their f16 scale fields; magnitudes giving
# weights of a few hundredths (as tests/test_llama_gguf.py's random blocks)
KQUANT = {"Q4_K": (144, (0, 2), 2e-4), "Q6_K": (210, (208,), 1e-5)}


def random_kblocks(qtype: str, n_blocks: int, rng):
    import numpy as np
    size, fields, scale = KQUANT[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for at in fields:
        f = rng.uniform(-1, 1, n_blocks) * scale
        if len(fields) == 2:   # d, dmin >= 0, as quantizers write them
            f = np.abs(f)
        raw[:, at:at + 2] = f.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw


def write_q4_k_m(path, cfg_d, n_ctx: int, seed: int = 0) -> dict:
    """A random Q4_K_M GGUF of the config in llama.cpp's llama layout; -> {type: count}."""
    import numpy as np
    import gguf
    from gguf_vocab import spm_vocab
    from webgrad.models import llama, llama_gguf
    rng = np.random.default_rng(seed)
    cfg = llama.LlamaConfig.from_hf(cfg_d, n_ctx=n_ctx)
    L = cfg.num_hidden_layers
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(cfg_d["max_position_embeddings"])
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(L)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg_d["rms_norm_eps"])
    w.add_rope_freq_base(cfg_d["rope_theta"])
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    spm_vocab(w, cfg.vocab_size)   # llama.cpp refuses a file without a tokenizer
    w.add_tensor("rope_freqs.weight", rope_factors(cfg))
    counts = {}
    for hf, shape in llama.param_shapes(cfg).items():
        g = llama_gguf.gguf_name(hf)
        if len(shape) == 1:   # norms stay F32, as llama.cpp keeps them
            w.add_tensor(g, np.ones(shape, np.float32))
            continue
        qt = q4_k_m_type(g, L)
        counts[qt] = counts.get(qt, 0) + 1
        rows, cols = shape
        raw = random_kblocks(qt, rows * cols // 256, rng).reshape(rows, -1)
        w.add_tensor(g, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType[qt])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return counts


# ---------------------------------------------------------------- the run

def kernels_per_step(m):
    try:
        return m._program("step", 1).kernel_count
    except Exception:   # a CPU executor keeps no kernel count
        return None


def kind_of(name: str) -> str:
    """A kernel's class in the profile's summary: matmuls by kernel form, others by name."""
    if name.startswith("matmul"):
        form = ("gemv" if " gemv " in name else "split" if " split " in name
                else "direct" if " direct " in name else "tile")
        return f"matmul ({form})"
    if " K chunks" in name:
        return "split-K sums"
    return name.split()[0]


def llama_bench_row(binary: str, path: str, n: int, P: int, reps: int) -> tuple:
    """llama.cpp's own figures for the same GGUF file: llama-bench (a CUDA build:
    bench/llama_cpp_cuda.sh) with every layer on the GPU, tg = n decode tokens after no prompt,
    pp = a P-token prompt, `reps` repetitions each (its mean). A row for the table."""
    import json
    import subprocess
    cmd = [binary, "-m", path, "-ngl", "99", "-p", str(P), "-n", str(n), "-r", str(reps), "-o", "json"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"llama-bench failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-2000:]}")
    runs = json.loads(done.stdout)
    tg = next(r for r in runs if r["n_gen"] == n and r["n_prompt"] == 0)
    pp = next(r for r in runs if r["n_prompt"] == P and r["n_gen"] == 0)
    where = tg.get("backends") or "?"
    note = (f"llama-bench {tg.get('build_commit', '?')} (build {tg.get('build_number', '?')}), "
            f"backend {where}" + (f" on {tg['gpu_info']}" if tg.get("gpu_info") else "")
            + f", flash_attn {tg.get('flash_attn', '?')}, {reps} reps, "
            f"{time.perf_counter() - t0:.1f} s; tg {n} has no prompt, pp {P} no new token")
    name = f"llama.cpp {where} Q4_K_M"
    print(f"  {name}: decode {tg['avg_ts']:.1f} tok/s, prefill {pp['avg_ts']:.1f} tok/s", flush=True)
    return (name, tg["avg_ts"], pp["avg_ts"], None, note)


def profile_step(m, top: int, pos: int) -> None:
    """One decode step (T = 1, at `pos`) kernel by kernel: the `top` longest and the sums
    per kernel class."""
    from collections import defaultdict
    from webgrad.blocking import run_blocking
    prog = m._program("step", 1)._prog
    prof = run_blocking(prog.profile({"ids": [1], "pos": [pos]}, "profile"))
    print(prof.text(top=top))
    by = defaultdict(lambda: [0, 0.0, 0])
    for r in prof.rows:
        k = by[kind_of(r.name)]
        k[0] += 1
        k[1] += r.seconds or 0.0
        k[2] += r.bytes
    tot = prof.total_seconds or 0.0
    print(f"by class ({len(prof.rows)} commands, {tot * 1e3:.3f} ms of GPU time):")
    for name, (c, t, b) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:<24} {c:>4} kernels {t * 1e3:8.3f} ms  {b / 1e6:9.1f} MB"
              + (f"  {b / t / 1e9:7.0f} GB/s" if t else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="tiny config (hidden 256, 2 layers, vocab 1000)")
    ap.add_argument("--backend", default=None,
                    help="webgrad backend (default webgpu; with --small, torch where torch has no CUDA)")
    ap.add_argument("--prompt", type=int, default=8, help="prompt tokens before decoding")
    ap.add_argument("--new", type=int, default=None, help="tokens to decode (128; 16 small)")
    ap.add_argument("--prefill", type=int, default=None, help="prefill prompt tokens (512; 64 small)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--types", default="F32,Q4_K_M", help="webgrad weight types to run, from F32, "
                    "F16 (weights held in f16, precision='f16': issue 27's decode row) and Q4_K_M")
    ap.add_argument("--no-torch", action="store_true", help="webgrad only")
    ap.add_argument("--llama-bench", default=None, metavar="PATH",
                    help="llama.cpp's llama-bench binary (bench/llama_cpp_cuda.sh builds it): run "
                    "it on the Q4_K_M file too, and print webgrad's ratio to it")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a kernel option of webgrad's programs (codegen/options.py's "
                    "KernelOptions field, a Python literal): --set gemv_rows=0 decodes without "
                    "the matrix-vector kernel")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile one decode step per type: the N longest kernels and the "
                    "sums per kernel class (WebGPU)")
    ap.add_argument("--exact-timestamps", action="store_true",
                    help="Dawn: turn off timestamp quantisation (allow_unsafe_apis, "
                    "-timestamp_quantization in $WEBGRAD_DAWN_TOGGLES) so that short kernels time right")
    args = ap.parse_args()
    if args.exact_timestamps:   # read by webgpu_native when it makes the device
        os.environ["WEBGRAD_DAWN_TOGGLES"] = ",".join(
            t for t in (os.environ.get("WEBGRAD_DAWN_TOGGLES", ""),
                        "allow_unsafe_apis,-timestamp_quantization") if t)
    set_kernel_options(args.set)
    import torch
    from webgrad.models import llama
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    backend = args.backend or ("webgpu" if cuda or not args.small else "torch")
    if backend == "webgpu":
        from matmul import pick_lib
        lib = pick_lib()
    else:
        lib = None
    if not cuda:   # a CPU smoke test: torch's thread pool spins badly on a shared machine
        torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    cfg_d = SMALL if args.small else LLAMA_1B
    n = args.new or (16 if args.small else 128)
    P = args.prefill or (64 if args.small else 512)
    V = cfg_d["vocab_size"]
    prompt = [(7 * i + 3) % V for i in range(args.prompt)]
    long_prompt = [(13 * i + 5) % V for i in range(P)]
    n_ctx = max(P + 1, args.prompt + n)
    types = [t for t in args.types.split(",") if t]
    rows, ref_toks = [], None   # rows: (name, decode tok/s, prefill tok/s, tokens agree, note)

    t0 = time.perf_counter()
    ref = hf_model(cfg_d, device)
    sd = {k: v.detach().to("cpu").numpy() for k, v in ref.state_dict().items()}
    cfg = llama.LlamaConfig.from_hf(ref.config.to_dict(), n_ctx=n_ctx)
    names = llama.param_shapes(cfg)   # transformers' state dict lists the tied head too
    print(f"transformers model built on {device} in {time.perf_counter() - t0:.1f} s; "
          f"{sum(v.size for k, v in sd.items() if k in names) / 1e6:.0f}M parameters")
    if not args.no_torch:
        for dtype in ("fp32", "bf16"):
            if dtype == "bf16":
                ref = ref.to(torch.bfloat16)
            dec, prf = hf_runner(ref, device, prompt, n), hf_runner(ref, device, long_prompt, 1)
            dec(), prf()   # warm-up
            t_dec, toks = time_best(dec, args.reps)
            t_prf, _ = time_best(prf, args.reps)
            if dtype == "fp32":
                ref_toks = toks
            rows.append((f"transformers {dtype}", n / t_dec, P / t_prf,
                         shared_prefix(ref_toks, toks), ""))
            print(f"  {rows[-1][0]}: decode {rows[-1][1]:.1f} tok/s, prefill {rows[-1][2]:.1f} tok/s", flush=True)
    del ref
    if cuda:
        torch.cuda.empty_cache()

    info, kernels = None, {}
    for qt in types:
        t0 = time.perf_counter()
        if qt in ("F32", "F16"):   # F16: the weights held in f16, the programs in precision f16
            m = llama.Llama.from_hf_state_dict(cfg, {k: v for k, v in sd.items() if k in names},
                                               backend=backend, dtype=qt.lower())
            m.precision = "f32" if qt == "F32" else "f16"
            note = ""
        elif qt == "Q4_K_M":
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "llama-q4_k_m.gguf")
                counts = write_q4_k_m(path, cfg_d, n_ctx)
                t_write = time.perf_counter() - t0
                if args.llama_bench:
                    rows.append(llama_bench_row(args.llama_bench, path, n, P, args.reps))
                t0 = time.perf_counter()
                m = llama.Llama.from_gguf(path, backend=backend, n_ctx=n_ctx)
            note = f"{', '.join(f'{c} {t}' for t, c in sorted(counts.items()))} matrices; file written in {t_write:.1f} s"
        else:
            raise SystemExit(f"--types: {qt!r} is not F32, F16 or Q4_K_M")
        t_load = time.perf_counter() - t0
        dec, prf = wg_runner(m, prompt, n), wg_runner(m, long_prompt, 1)
        t0 = time.perf_counter()
        dec(), prf()   # warm-up: compiles the step programs (T = 1, prompt, prefill)
        t_warm = time.perf_counter() - t0
        t_dec, toks = time_best(dec, args.reps)
        t_prf, _ = time_best(prf, args.reps)
        agree = shared_prefix(ref_toks, toks) if (ref_toks and qt == "F32") else None
        mb = m.weight_bytes / 1e6
        rows.append((f"webgrad {qt}", n / t_dec, P / t_prf, agree,
                     f"weights {mb:.0f} MB on the GPU, load {t_load:.1f} s, warm-up {t_warm:.1f} s"
                     + (f"; {note}" if note else "")))
        kernels[qt] = kernels_per_step(m)
        if args.profile and backend == "webgpu":
            print(f"  profile of one decode step, webgrad {qt}:")
            profile_step(m, args.profile, len(prompt) + n)
        info = getattr(getattr(m.backend, "host", None), "info", backend)
        print(f"  {rows[-1][0]}: decode {rows[-1][1]:.1f} tok/s, prefill {rows[-1][2]:.1f} tok/s; {rows[-1][4]}", flush=True)
        del m
    del sd

    dev_name = torch.cuda.get_device_name() if cuda else "CPU"
    print()
    print(f"config: {'small' if args.small else 'Llama-3.2-1B shape'}: hidden {cfg.hidden_size}, "
          f"{cfg.num_hidden_layers} layers, {cfg.num_attention_heads} heads / {cfg.num_key_value_heads} "
          f"K/V, intermediate {cfg.intermediate_size}, vocab {cfg.vocab_size}, tied; n_ctx {n_ctx}")
    print(f"decode: prompt {len(prompt)} tokens, {n} new, greedy; prefill: {P} tokens + 1; best of {args.reps}")
    print(f"webgrad: backend {backend}" + (f" ({info}, WEBGRAD_WGPU_LIB={lib})" if lib else "")
          + (f"; kernels per decode step: {kernels}" if any(kernels.values()) else ""))
    print(f"torch:   {torch.__version__} on {dev_name}, transformers generate() with its cache, TF32 off")
    peers = {r[0]: r for r in rows if r[0].startswith("transformers")}
    bf = peers.get("transformers bf16")
    fp = peers.get("transformers fp32")
    print()
    print("| run | decode tokens/s | prefill tokens/s | decode x bf16 | decode x fp32 | "
          "prefill x bf16 | prefill x fp32 | tokens = fp32's |")
    print("|---|---|---|---|---|---|---|---|")
    for name, d, p, agree, _ in rows:
        rx = lambda peer, i, v: f"{v / peer[i]:.2f}" if peer else "-"   # noqa: E731
        ag = "-" if agree is None else f"{agree}/{n}"
        print(f"| {name} | {d:.1f} | {p:.1f} | {rx(bf, 1, d)} | {rx(fp, 1, d)} | "
              f"{rx(bf, 2, p)} | {rx(fp, 2, p)} | {ag} |")
    for name, _, _, _, note in rows:
        if note:
            print(f"{name}: {note}")
    lc = next((r for r in rows if r[0].startswith("llama.cpp")), None)
    wq = next((r for r in rows if r[0] == "webgrad Q4_K_M"), None)
    if lc and wq:
        print(f"webgrad Q4_K_M / {lc[0]}, same file: decode {wq[1] / lc[1]:.2f}x, "
              f"prefill {wq[2] / lc[2]:.2f}x (target decode 0.5x or better: "
              f"{'meets' if wq[1] >= 0.5 * lc[1] else 'misses'} it)")
    if bf:
        for name, d, *_ in rows:
            if name.startswith("webgrad"):
                ok = "meets" if d >= 2 * bf[1] else "misses"
                print(f"target (decode >= 2x transformers bf16): {name} {d / bf[1]:.2f}x, {ok} it")


if __name__ == "__main__":
    main()
