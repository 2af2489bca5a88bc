#!/usr/bin/env python3
"""A SmolLM2-360M-shaped Q4_K_M GGUF (bench/llama_load.py's file, random blocks, about
270 MB) loaded in the browser worker: from serve.py's models/ folder, then from the model
cache (IndexedDB), same file, same run.

    python3 bench/llama_load_browser.py               # the 32 layers
    python3 bench/llama_load_browser.py --layers 4    # a quicker look
    python3 bench/llama_load_browser.py --profile 15  # cProfile of a load from the cache, in the worker

serve.py's page runs in headless Chromium (WebGPU on SwiftShader). The file is written into
models/ (served with an ETag) and removed afterwards. In the worker, from an empty cache:
fetch the file (pyfetch), Llama.from_gguf_async (parse, blocks transcoded and uploaded,
kept quantized), wait for the GPU (one weight read back); then keep it in the cache
(llama_cache.store_async, as the chat page does: the image is the GPU's words, read back,
and the file's metadata) and load it back by key (llama_cache.load_key_async: the words
uploaded as they are), again up to the GPU's work done, and time the parse of the kept
metadata that Chat.tokenizer() starts with. A warm-up load of the same
file comes first (Pyodide's imports, the device). Times are taken in the worker.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pkg"))
sys.path.insert(0, str(ROOT / "bench"))

CODE = """
import time
from pyodide.http import pyfetch
from webgrad.io import gguf, modelcache
from webgrad.models import llama, llama_cache

async def _done(m):
    await m.backend.read(next(iter(m.shapes)))      # waits for the queue's work

async def bench_llama(url, profile):
    await modelcache.clear_async()
    blob = await (await pyfetch(url)).bytes()        # warm-up: imports, the device
    m = await llama.Llama.from_gguf_async(blob, backend="webgpu")
    await _done(m)
    m.backend.destroy()
    del blob, m
    out = {}
    t0 = time.perf_counter()
    blob = await (await pyfetch(url)).bytes()
    out["fetch"] = time.perf_counter() - t0
    t = time.perf_counter()
    m = await llama.Llama.from_gguf_async(blob, backend="webgpu")
    out["from_gguf"] = time.perf_counter() - t
    t = time.perf_counter()
    await _done(m)
    out["gpu"] = time.perf_counter() - t
    out["first"] = time.perf_counter() - t0
    t = time.perf_counter()
    info = await llama_cache.store_async(llama_cache.Chat(m, b"", {}, gguf=blob), name="bench")
    out["store"] = time.perf_counter() - t
    m.backend.destroy()
    del blob, m
    prof = None
    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    t = time.perf_counter()
    item, got = await llama_cache.load_key_async(info["key"], backend="webgpu")
    t1 = time.perf_counter()
    await _done(item.model)
    out["cached_gpu"] = time.perf_counter() - t1
    out["cached"] = time.perf_counter() - t
    out["cached_phases"] = dict(got.get("phases") or {})
    t = time.perf_counter()      # what Chat.tokenizer() parses first (this file has no
    gguf.load(item.gguf)         # tokenizer model to build): the kept metadata
    out["tokenizer_metadata"] = time.perf_counter() - t
    item.model.backend.destroy()
    if prof is not None:
        import io, pstats
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(profile)
        out["profile"] = s.getvalue()
    await modelcache.clear_async()
    return out
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the real shape")
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    args = parser.parse_args()
    import llama_load
    from webgrad.browser import BrowserSession
    src = llama_load.gguf_file(args.layers or llama_load.SMOL360["num_hidden_layers"])
    folder = ROOT / "models"
    folder.mkdir(exist_ok=True)
    dst = folder / f"bench-{uuid.uuid4().hex[:8]}-{src.name}"
    try:
        shutil.copyfile(src, dst)
        print(f"{src.name}: {dst.stat().st_size / 1e6:.0f} MB")
        with BrowserSession() as s:
            s.run(CODE, timeout=600)
            r = s.call("bench_llama", f"{s.url}models/{dst.name}", args.profile, timeout=1800)
        print(f"from serve.py: {r['first']:.2f} s (fetch {r['fetch']:.2f} s, from_gguf_async "
              f"{r['from_gguf']:.2f} s, then the GPU's work {r['gpu']:.2f} s); keeping it in the cache {r['store']:.2f} s")
        phases = " ".join(f"{k} {v:.2f}" for k, v in r["cached_phases"].items())
        print(f"from the cache: {r['cached']:.2f} s ({phases}, then the GPU's work "
              f"{r['cached_gpu']:.2f} s); its tokenizer's metadata parsed in "
              f"{r['tokenizer_metadata']:.2f} s")
        if r.get("profile"):
            print(r["profile"])
    finally:
        dst.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
