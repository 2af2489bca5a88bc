#!/usr/bin/env python3
"""Decode tokens/s in headless Chromium: webgrad against wllama (npm @wllama/wllama, llama.cpp
compiled to WebAssembly) on the same GGUF file, in the same browser run.

    python3 bench/wllama_decode.py                        # both models, every file type
    python3 bench/wllama_decode.py --models smol --types Q8_0 --layers 4   # a quicker look
    python3 bench/wllama_decode.py --models gpt2 --new 64 --reps 5 --json wllama.json

Models (random weights of the real shape, written here with the gguf package in llama.cpp's
tensor names and metadata, tied embeddings, a SentencePiece vocabulary of made-up pieces that
llama.cpp needs to load a file but no run here uses: every run is fed token ids):
- smol: SmolLM2-135M's shape (30 layers, 576 wide, 9 query and 3 key/value heads of 64, MLP
  1536, 49152 tokens, rope_theta 1e5), files F32 and Q8_0 (576 is not a whole number of
  256-value k-quant blocks, so Q4_K does not apply to most of its matrices).
- gpt2: bench/gpt2_decode.py's tiny GPT-2 (2 layers, 64 wide, 2 heads, 1000 tokens, n_ctx 128),
  files F32 and Q8_0.

webgrad runs each file twice (--backends): backend "wasm" (its programs exported to ONNX and
run by onnxruntime-web, the weights resident in the session) in a second Chromium started
with WebGPU off (BrowserSession.without_webgpu), and on WebGPU (SwiftShader in this headless
Chromium: a software adapter on the same CPU cores; the Q8_0 matrices kept as blocks there,
decoded to f32 once on the host for "wasm").

The "wasm" row runs with onnxruntime-web's default threads (half the cores, as wllama's own
default), and a second "wasm" row in a fresh worker with --ort-threads (default --threads,
wllama's isolated row), so each engine is also compared at equal threads ("same threads").

wllama runs on its CPU backend (n_gpu_layers 0) in pages of its own (bench/peers/wllama.html),
served by a server of this script twice: with cross-origin isolation (COOP/COEP, as serve.py
sends them: SharedArrayBuffer, so llama.cpp's threads; asked for --threads) and without it
(one thread, wllama's fallback). With isolation it also runs with one thread, to separate the
threads' part. The GGUF files lie in models/ (git-ignored), which serve.py serves to webgrad's
worker and this script's servers to wllama's pages: both read the same bytes.

The work is the same for every row: --prompt token ids (deterministic, below the vocabulary
size), then --new tokens greedily (temperature 0; wllama with ignore_eos and top_k 1, webgrad
with stop_at_eos=False), a cache of --n-ctx positions; wllama with cache_prompt false, so no
run reuses the previous one's prefill. --warmup warm-up runs (1; webgrad compiles its programs
in the first; the first rows in a fresh Chromium run WebAssembly that V8 has not yet tiered up,
which took webgrad's "wasm" 2-3 calls of 32 tokens: --warmup 3 measures the steady state),
then --reps timed runs; tokens/s = new / median wall time of one whole generate
call (prefill included, as bench/gpt2_decode.py counts it). Decode-only rates are printed
beside it: wllama's is llama.cpp's own (predicted_per_second: the tokens after the first over
their time), webgrad's the same count over the same span (--reps one-token calls, prefill and
first token, timed after the others; their median subtracted from the whole call's). The
greedy tokens of webgrad and wllama are compared (same file, same arithmetic up to rounding:
on random weights two logits may nearly tie, and llama.cpp's CPU matmuls round the
activations to 8 bits for quantized weights, so Q8_0 tokens may part early; the shared
prefix is printed).

npm: bench/peers/package.json pins @wllama/wllama; `npm install` there runs first (as
bench/mlp_browser.py provisions jax-js and TF.js). Figures vary with machine load.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEERS_DIR = REPO / "bench" / "peers"
MODELS_DIR = REPO / "models"          # git-ignored; serve.py serves it at /models/
sys.path.insert(0, str(REPO / "pkg"))
sys.path.insert(0, str(REPO / "bench"))

from gguf_vocab import PIECE_BASE, spm_vocab  # noqa: E402  (a vocabulary llama.cpp loads)
from mlp_browser import npm_install, run_peer  # noqa: E402  (the npm peers' provisioning, page runner)
from webgrad.browser import BrowserSession, load_serve  # noqa: E402

# SmolLM2-135M's config.json, the fields that shape the compute
SMOL = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
            head_dim=64, intermediate_size=1536, vocab_size=49152, rope_theta=100000.0,
            rms_norm_eps=1e-5, max_position_embeddings=8192)
GPT2_TINY = dict(n_layer=2, n_head=2, n_embd=64, n_ctx=128, vocab_size=1000)   # gpt2_decode.py's TINY
TYPES = ("F32", "Q8_0")


# ---------------------------------------------------------------------------------- the files

def prompt_text(ids) -> str:
    return "".join(chr(PIECE_BASE + i) for i in ids)


def text_ids(text: str) -> list[int] | None:
    """The ids of a generated text (None where a piece is not one of the made-up characters:
    a special token, which renders as nothing)."""
    ids = [ord(ch) - PIECE_BASE for ch in text]
    return ids if all(i >= 3 for i in ids) else None


def add_matrix(w, name: str, v, qtype: str) -> None:
    import gguf
    import numpy as np
    if qtype == "F32":
        w.add_tensor(name, np.ascontiguousarray(v, np.float32))
        return
    q = gguf.quants.quantize(np.ascontiguousarray(v, np.float32), gguf.GGMLQuantizationType[qtype])
    w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType[qtype])


def finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_smol(path: Path, qtype: str, layers: int, seed: int = 0) -> None:
    """SmolLM2-135M's shape in llama.cpp's llama layout (tied head: no output.weight); weights
    N(0, 0.02), norms near 1. Matrices F32 or Q8_0 (the token table too, as llama-quantize's
    Q8_0 does); 1-D tensors F32."""
    import gguf
    import numpy as np
    rng = np.random.default_rng(seed)
    c = dict(SMOL, num_hidden_layers=layers)
    d, hd, nh, nkv, ff = (c["hidden_size"], c["head_dim"], c["num_attention_heads"],
                          c["num_key_value_heads"], c["intermediate_size"])
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_block_count(layers)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(c["vocab_size"])
    spm_vocab(w, c["vocab_size"])

    def normal(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(d, dtype=np.float32)).astype(np.float32)

    add_matrix(w, "token_embd.weight", normal(c["vocab_size"], d), qtype)
    for i in range(layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", norm())
        add_matrix(w, b + "attn_q.weight", normal(nh * hd, d), qtype)
        add_matrix(w, b + "attn_k.weight", normal(nkv * hd, d), qtype)
        add_matrix(w, b + "attn_v.weight", normal(nkv * hd, d), qtype)
        add_matrix(w, b + "attn_output.weight", normal(d, nh * hd), qtype)
        w.add_tensor(b + "ffn_norm.weight", norm())
        add_matrix(w, b + "ffn_gate.weight", normal(ff, d), qtype)
        add_matrix(w, b + "ffn_up.weight", normal(ff, d), qtype)
        add_matrix(w, b + "ffn_down.weight", normal(d, ff), qtype)
    w.add_tensor("output_norm.weight", norm())
    finish(w)


def write_gpt2(path: Path, qtype: str, seed: int = 0) -> None:
    """The tiny GPT-2 in llama.cpp's gpt2 layout (matrices [out, in], tied head); weights
    N(0, 0.1) (0.02 for the embeddings), biases small, norms near 1. With Q8_0 the 2-D
    matrices of the blocks are Q8_0, the token and position tables stay F32."""
    import gguf
    import numpy as np
    rng = np.random.default_rng(seed)
    c = GPT2_TINY
    n, L, V = c["n_embd"], c["n_layer"], c["vocab_size"]
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_context_length(c["n_ctx"])
    w.add_embedding_length(n)
    w.add_feed_forward_length(4 * n)
    w.add_block_count(L)
    w.add_head_count(c["n_head"])
    w.add_layer_norm_eps(1e-5)
    spm_vocab(w, V)

    def normal(*shape, std=0.1):
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)

    def near_one(k):
        return (1.0 + normal(k)).astype(np.float32)

    w.add_tensor("token_embd.weight", normal(V, n, std=0.5))
    w.add_tensor("position_embd.weight", normal(c["n_ctx"], n, std=0.5))
    for i in range(L):
        b = f"blk.{i}."
        for norm_name in ("attn_norm", "ffn_norm"):
            w.add_tensor(b + norm_name + ".weight", near_one(n))
            w.add_tensor(b + norm_name + ".bias", normal(n))
        for name, rows, cols in (("attn_qkv", 3 * n, n), ("attn_output", n, n),
                                 ("ffn_up", 4 * n, n), ("ffn_down", n, 4 * n)):
            add_matrix(w, b + name + ".weight", normal(rows, cols), qtype)
            w.add_tensor(b + name + ".bias", normal(rows, std=0.02))
    w.add_tensor("output_norm.weight", near_one(n))
    w.add_tensor("output_norm.bias", normal(n))
    finish(w)


# ---------------------------------------------------------------------------------- the servers

def peers_server(serve, isolated: bool):
    """bench/peers at /, models/ at /models/, with serve.py's handler; isolated=False leaves out
    the cross-origin isolation headers (COOP/COEP), so the page has no SharedArrayBuffer."""
    attrs = {"mounts": [("/models/", MODELS_DIR.resolve()), ("/", PEERS_DIR.resolve())],
             "quiet": True}
    if not isolated:
        def end_headers(self):
            for key, value in serve.HEADERS.items():
                if key not in serve.NOT_ISOLATED:
                    self.send_header(key, value)
            SimpleHTTPRequestHandler.end_headers(self)
        attrs["end_headers"] = end_headers
    handler = type("WllamaPeersHandler", (serve.Handler,), attrs)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, name="wllama-peers", daemon=True).start()
    return server, serve.server_url(server)


# ---------------------------------------------------------------------------------- the runs

# Runs in webgrad's Pyodide worker: the file from serve.py's /models/, WARMUP warm-ups, REPS timed
# generate calls, the wall time of each.
WORKER_CODE = """
import time
from pyodide.http import pyfetch
from webgrad.models import gpt2, llama
blob = await (await pyfetch(URL)).bytes()
t0 = time.perf_counter()
if KIND == "smol":
    m = await llama.Llama.from_gguf_async(blob, backend=BACKEND, n_ctx=N_CTX)
else:
    m = await gpt2.GPT2.from_gguf_async(blob, backend=BACKEND)
del blob
load_ms = 1e3 * (time.perf_counter() - t0)
for _ in range(WARMUP):
    await m.generate_async(PROMPT, max_new_tokens=NEW, temperature=0, stop_at_eos=False)
times = []
for _ in range(REPS):
    t0 = time.perf_counter()
    out = await m.generate_async(PROMPT, max_new_tokens=NEW, temperature=0, stop_at_eos=False)
    times.append(1e3 * (time.perf_counter() - t0))
first = []   # the prefill and the first token alone: the decode-only rate is the rest
for _ in range(REPS):
    t0 = time.perf_counter()
    await m.generate_async(PROMPT, max_new_tokens=1, temperature=0, stop_at_eos=False)
    first.append(1e3 * (time.perf_counter() - t0))
host = getattr(getattr(m.backend, "host", None), "info", None)
{"load_ms": load_ms, "times_ms": times, "first_ms": first, "tokens": out[len(PROMPT):], "n_ctx": m.cfg.n_ctx,
 "host": str(host) if host else getattr(m.backend, "engine", type(m.backend).__name__)}
"""


def run_webgrad(s: BrowserSession, kind: str, fname: str, backend: str, prompt, args) -> dict:
    head = "".join(f"{k} = {v!r}\n" for k, v in dict(
        URL=f"{s.url.rstrip('/')}/models/{fname}", KIND=kind, BACKEND=backend, N_CTX=args.n_ctx,
        PROMPT=prompt, NEW=args.new, REPS=args.reps, WARMUP=args.warmup).items())
    out = s.run(head + WORKER_CODE, timeout=args.timeout)
    out["library"] = f"webgrad ({backend})"
    return out


def prompt_ids(vocab: int, n: int) -> list[int]:
    return [3 + (7919 * i + 301) % (vocab - 3) for i in range(n)]


def shared_prefix(a, b) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def summarize(r: dict, new: int) -> dict:
    if "error" in r:
        return r
    ms = statistics.median(r["times_ms"])
    r["ms"], r["tokens_per_s"] = ms, 1e3 * new / ms
    timings = [t for t in r.get("timings") or [] if t]
    if timings:
        r["decode_only_per_s"] = statistics.median(t["predicted_per_second"] for t in timings)
    if r.get("first_ms") and new > 1:
        # webgrad's counterpart of llama.cpp's predicted_per_second: the new - 1 tokens after
        # the first, timed as a whole call less a one-token call (prefill and first token)
        rest = ms - statistics.median(r["first_ms"])
        if rest > 0:
            r["decode_only_per_s"] = 1e3 * (new - 1) / rest
    return r


def print_table(title: str, rows: list[dict], new: int) -> None:
    print(f"\n{title}")
    base = next((r for r in rows if r["library"].startswith("webgrad") and "error" not in r), None)
    head = (f"{'row':<34} {'tokens/s':>9} {'ms/call':>9} {'decode-only/s':>20} "
            f"{'webgrad / this':>14} {'tokens = webgrad':>16}")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['row']:<34} FAILED: {r['error'].splitlines()[0][:200]}")
            continue
        ratio = f"{base['tokens_per_s'] / r['tokens_per_s']:.2f}x" if base else "-"
        dec = f"{r['decode_only_per_s']:.1f}" if "decode_only_per_s" in r else "-"
        same = (f"{shared_prefix(base['tokens'], r['tokens'])}/{new}"
                if base and r.get("tokens") is not None else "-")
        print(f"{r['row']:<34} {r['tokens_per_s']:>9.2f} {r['ms']:>9.1f} {dec:>20} {ratio:>14} "
              f"{same:>16}")
    ok = [r for r in rows if "error" not in r]
    peer = max((r for r in ok if r["library"] == "wllama"), key=lambda r: r["tokens_per_s"],
               default=None)
    for r in ok:
        if r["library"].startswith("webgrad") and peer is not None:
            print(f"ratio {r['row']} / fastest wllama row ({peer['row']}): "
                  f"{r['tokens_per_s'] / peer['tokens_per_s']:.2f}x (target 1.0x or better)")
    for r in ok:   # at equal threads: each webgrad row against wllama's isolated row of its count
        if not r["library"].startswith("webgrad") or "threads" not in r:
            continue
        same = next((w for w in ok if w["library"] == "wllama" and w.get("isolated")
                     and w.get("threads") == r["threads"]), None)
        if same is not None:
            print(f"same threads: {r['row']} / {same['row']}: "
                  f"{r['tokens_per_s'] / same['tokens_per_s']:.2f}x")
    dec_peer = max((r for r in ok if r["library"] == "wllama" and "decode_only_per_s" in r),
                   key=lambda r: r["decode_only_per_s"], default=None)
    for r in ok:
        if r["library"].startswith("webgrad") and dec_peer is not None and "decode_only_per_s" in r:
            print(f"decode-only ratio {r['row']} / fastest wllama row ({dec_peer['row']}): "
                  f"{r['decode_only_per_s'] / dec_peer['decode_only_per_s']:.2f}x")


def wllama_rows(s, urls: dict, fname: str, prompt, args) -> list[dict]:
    out = []
    variants = [("isolated", args.threads), ("isolated", 1), ("not isolated", args.threads)]
    for where, threads in variants:
        config = {"url": f"{urls[where]}models/{fname}", "prompt": prompt_text(prompt),
                  "prompt_ids": len(prompt), "new": args.new,
                  "reps": args.reps, "warmup": args.warmup, "threads": threads, "n_ctx": args.n_ctx,
                  "timeout_s": args.timeout, "steps": 0}
        try:
            r = run_peer(s, urls[where] + "wllama.html", config)
            r["tokens"] = text_ids(r.pop("text")) if r.get("text") is not None else None
            r["isolated"] = where == "isolated"
            r["row"] = (f"wllama {r['version']}, {where}, {r['threads']} thread"
                        + ("s" if r["threads"] != 1 else ""))
        except Exception as e:
            r = {"library": "wllama", "row": f"wllama, {where}, {threads} asked",
                 "error": f"{type(e).__name__}: {e}"}
        out.append(summarize(r, args.new))
        print(f"  {out[-1]['row']}: {out[-1].get('tokens_per_s', 'failed')}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smol,gpt2", help="comma-separated, from smol,gpt2")
    ap.add_argument("--types", default=",".join(TYPES), help="GGUF file types, from F32,Q8_0")
    ap.add_argument("--layers", type=int, default=SMOL["num_hidden_layers"],
                    help="smol's layers (30 as SmolLM2-135M; fewer for a quick look)")
    ap.add_argument("--prompt", type=int, default=8, help="prompt tokens")
    ap.add_argument("--new", type=int, default=32, help="tokens generated per call")
    ap.add_argument("--n-ctx", type=int, default=64, help="cache length, both sides")
    ap.add_argument("--reps", type=int, default=3, help="timed calls after the warm-up")
    ap.add_argument("--warmup", type=int, default=1, help="untimed calls first (webgrad and wllama)")
    ap.add_argument("--backends", default="wasm,webgpu", help="webgrad's rows, from wasm,webgpu")
    ap.add_argument("--ort-threads", type=int, default=None, metavar="N",
                    help="also a webgrad wasm row with onnxruntime-web on N threads (a fresh "
                    "worker of the isolated page; its default is half the cores, as "
                    "wllama's); default: --threads, wllama's isolated row; 0: none")
    ap.add_argument("--threads", type=int, default=2, help="wllama's threads where isolated")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per library run")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    if args.ort_threads is None:
        args.ort_threads = args.threads
    models = [m for m in args.models.split(",") if m]
    types = [t for t in args.types.split(",") if t]
    backends = [b for b in args.backends.split(",") if b]
    if not set(models) <= {"smol", "gpt2"} or not set(types) <= set(TYPES) or not set(
            backends) <= {"wasm", "webgpu"}:
        ap.error("--models from smol,gpt2; --types from F32,Q8_0; --backends from wasm,webgpu")
    if args.prompt + args.new > min(args.n_ctx, GPT2_TINY["n_ctx"]):
        ap.error("need --prompt + --new <= --n-ctx (and <= the tiny GPT-2's 128)")

    install_error = npm_install()
    if install_error:
        print(f"wllama cannot run: {install_error}", file=sys.stderr)
        return 1
    MODELS_DIR.mkdir(exist_ok=True)
    files = []   # (kind, type, file name)
    for kind in models:
        for qt in types:
            name = f"bench-wllama-{kind}{args.layers if kind == 'smol' else ''}-{qt}.gguf"
            t0 = time.perf_counter()
            (write_smol(MODELS_DIR / name, qt, args.layers) if kind == "smol"
             else write_gpt2(MODELS_DIR / name, qt))
            mb = (MODELS_DIR / name).stat().st_size / 2**20
            print(f"wrote models/{name} ({mb:.1f} MiB, {time.perf_counter() - t0:.0f} s)", flush=True)
            files.append((kind, qt, name))

    results = {}
    serve = load_serve(REPO)
    servers = {}
    try:
        with BrowserSession() as s:
            print(f"browser {s.browser.version}; webgrad {s.info.get('webgrad_version')}", flush=True)
            for where in ("isolated", "not isolated"):
                servers[where] = peers_server(serve, where == "isolated")
            urls = {k: v[1] for k, v in servers.items()}
            cpu = s.without_webgpu() if "wasm" in backends or "gpt2" in models else None
            try:
                for kind, qt, name in files:
                    vocab = SMOL["vocab_size"] if kind == "smol" else GPT2_TINY["vocab_size"]
                    prompt = prompt_ids(vocab, args.prompt)
                    rows = []
                    plan = [("wasm", cpu, None), ("webgpu", s, None)]
                    if args.ort_threads > 1:   # a fresh worker asks onnxruntime-web for them
                        plan.insert(1, ("wasm", cpu, args.ort_threads))
                    for backend, sess, threads in plan:
                        if backend not in backends:
                            continue
                        try:
                            if threads is None:
                                r = run_webgrad(sess, kind, name, backend, prompt, args)
                            else:
                                with sess.another_worker() as w:
                                    w.run("from webgrad.backends import onnx_runtime\n"
                                          f"onnx_runtime.set_threads({threads})")
                                    r = run_webgrad(w, kind, name, backend, prompt, args)
                            got = re.search(r"(\d+) threads?\b", str(r.get("host", "")))
                            if backend == "wasm" and got:   # onnxruntime-web's, from engine()
                                r["threads"] = int(got.group(1))
                            r["row"] = f"webgrad {backend}" + (" (WebGPU off)" if backend == "wasm" else "") + (
                                f", {threads} threads" if threads else "")
                        except Exception as e:
                            r = {"library": f"webgrad ({backend})", "row": f"webgrad {backend}",
                                 "error": f"{type(e).__name__}: {e}"}
                        rows.append(summarize(r, args.new))
                        print(f"  {kind} {qt} {rows[-1]['row']}: "
                              f"{rows[-1].get('tokens_per_s', 'failed')} ({r.get('host', '?')})", flush=True)
                    # GPT-2 (issue 25's comparison) in the Chromium without WebGPU, as webgrad's wasm row
                    rows += wllama_rows(cpu if kind == "gpt2" else s, urls, name, prompt, args)
                    results[f"{kind} {qt}"] = rows
            finally:
                if cpu is not None:
                    cpu.close()
    finally:
        for server, _ in servers.values():
            server.shutdown()
            server.server_close()
        for _, _, name in files:
            (MODELS_DIR / name).unlink(missing_ok=True)

    for key, rows in results.items():
        kind, qt = key.split()
        shape = (f"SmolLM2-135M shape, {args.layers} layers" if kind == "smol"
                 else "tiny GPT-2 (2 layers, 64 wide, 1000 tokens)")
        print_table(f"{shape}, {qt} GGUF; prompt {args.prompt} ids, {args.new} new tokens greedy, "
                    f"n_ctx {args.n_ctx}; median of {args.reps} calls after {args.warmup} warm-up",
                    rows, args.new)
        for r in rows:
            if "error" in r:
                print(f"\n{r['row']} failed:\n{r['error']}", file=sys.stderr)
    print("\nwebgrad / this: webgrad's first row's tokens/s over this row's (above 1: webgrad "
          "faster). tokens = webgrad: greedy tokens shared with that row, from the start.")
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "args": {
            k: str(v) for k, v in vars(args).items()}, "results": results}, indent=1) + "\n")
    return 1 if any("error" in r for rows in results.values() for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
