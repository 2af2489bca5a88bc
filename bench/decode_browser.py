#!/usr/bin/env python3
"""decode_cpu.py's measurement in headless Chromium (WebGPU on SwiftShader): greedy decoding
of the SmolLM2-135M-shaped Llama under one or more kernel option sets in one browser run,
tokens/s (median of --reps calls) and one decode step's GPU time per kernel class (each
kernel's median over --reps profiled steps), the sets' runs interleaved. Issue 24: which
decode kernels SwiftShader is slow at (wllama_decode.py compares the whole with wllama).

    python3 bench/decode_browser.py                              # 2 layers, Q8_0 and F32:
                                                                 # defaults against the CPU
                                                                 # form (gemv_cpu=True)
    python3 bench/decode_browser.py --sets ",force_gemv=False;gemv_cpu=False"

Each option set is a list of `NAME=VALUE` KernelOptions fields joined by ";"
(the empty set: the defaults); --sets separates sets by ",". The file is wllama_decode.py's
(random weights of the real shape, `--layers` layers), served from models/ by serve.py.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "pkg"))
sys.path.insert(0, str(REPO / "bench"))

from wllama_decode import MODELS_DIR, prompt_ids, write_smol  # noqa: E402
from webgrad.browser import BrowserSession  # noqa: E402

WORKER_CODE = """
import time
from collections import defaultdict
from statistics import median
from pyodide.http import pyfetch
from webgrad.models import llama
from webgrad.backends.webgpu import WebGPUBackend
from webgrad.codegen.options import KernelOptions, with_setting
blob = await (await pyfetch(URL)).bytes()
models = []
for sets in SETS:
    opts = KernelOptions()
    for item in [i for i in sets.split(";") if i]:
        opts = with_setting(opts, item)
    m = await llama.Llama.from_gguf_async(blob, backend=WebGPUBackend(options=opts), n_ctx=64)
    await m.generate_async(PROMPT, max_new_tokens=NEW, temperature=0, stop_at_eos=False)
    models.append(m)
del blob
times, profs, toks = defaultdict(list), defaultdict(list), {}
for _ in range(REPS):   # the sets interleaved: the shared machine's load moves them alike
    for k, m in enumerate(models):
        t0 = time.perf_counter()
        out = await m.generate_async(PROMPT, max_new_tokens=NEW, temperature=0, stop_at_eos=False)
        times[k].append(time.perf_counter() - t0)
        toks[k] = out[len(PROMPT):]
        prog = m._program("step", 1)._prog
        profs[k].append(await prog.profile({"ids": [1], "pos": [len(PROMPT) + NEW]}, "profile"))
out = []
for k, sets in enumerate(SETS):
    rows = profs[k][0].rows
    ms = [1e3 * median(p.rows[i].seconds or 0.0 for p in profs[k]) for i in range(len(rows))]
    by = defaultdict(lambda: [0, 0.0])
    for r, t in zip(rows, ms):
        name = r.name
        kind = ("matmul " + name.split(" K=")[1].split(" ", 1)[1] if name.startswith("matmul")
                else name.split()[0])
        by[kind][0] += 1
        by[kind][1] += t
    top = sorted(zip(ms, [r.name for r in rows]), reverse=True)[:4]
    out.append({"set": sets, "tokens_per_s": NEW / median(times[k]), "times": times[k],
                "tokens": toks[k], "kernels": len(rows), "timing": profs[k][0].timing,
                "gpu_ms": sum(ms), "by": dict(by), "top": [[n, t] for t, n in top]})
{"runs": out, "host": str(getattr(WebGPUBackend().host, "info", ""))}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--types", default="Q8_0,F32")
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3, help="timed calls and profiled steps per set (medians)")
    ap.add_argument("--sets", default=",gemv_cpu=True",
                    help="option sets separated by ',' (fields within a set by ';')")
    ap.add_argument("--timeout", type=float, default=1200.0)
    args = ap.parse_args()
    MODELS_DIR.mkdir(exist_ok=True)
    prompt = prompt_ids(49152, 8)
    with BrowserSession() as s:
        print(f"browser {s.browser.version}", flush=True)
        for qt in args.types.split(","):
            name = f"bench-decode-smol{args.layers}-{qt}.gguf"
            write_smol(MODELS_DIR / name, qt, args.layers)
            try:
                head = "".join(f"{k} = {v!r}\n" for k, v in dict(
                    URL=f"{s.url.rstrip('/')}/models/{name}", SETS=args.sets.split(","),
                    PROMPT=prompt, NEW=args.new, REPS=args.reps).items())
                t0 = time.perf_counter()
                res = s.run(head + WORKER_CODE, timeout=args.timeout)
            finally:
                (MODELS_DIR / name).unlink(missing_ok=True)
            print(f"{qt}, {args.layers} layers, {args.new} new tokens after 8, median of {args.reps} "
                  f"({res['host']}; {time.perf_counter() - t0:.0f} s):")
            for r in res["runs"]:
                print(f"  [{r['set'] or 'defaults'}] {r['tokens_per_s']:.2f} tokens/s; one step "
                      f"{r['gpu_ms']:.1f} ms of GPU time ({r['timing']}) in {r['kernels']} kernels; "
                      f"tokens {r['tokens'][:6]}")
                for k, (c, t) in sorted(r["by"].items(), key=lambda kv: -kv[1][1]):
                    print(f"      {k:<28} {c:>4} kernels {t:9.2f} ms")
                for n, t in r["top"]:
                    print(f"      top: {t:8.2f} ms  {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
