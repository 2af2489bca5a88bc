#!/usr/bin/env python3
"""Loading a GPT-2 in the browser worker the first time (download, parse, keep the GPU image
in IndexedDB) against the second time (the image from IndexedDB, uploaded), same file, same run.

    python3 bench/model_cache.py                      # 4 layers x 256, GPT-2's 50257 tokens
    python3 bench/model_cache.py --layers 12 --embd 768 --ctx 1024   # the 124M shapes

serve.py's page runs in headless Chromium (WebGPU on SwiftShader); the files are written into
models/ (served with an ETag) and removed afterwards: F32 and F16 safetensors (the safetensors
library) and a Q8_0 GGUF (the gguf package), all of one random GPT-2. Each is loaded by URL
through webgrad.models.gpt2_cache.load_gpt2_async, twice, from an empty cache; the times are taken
in the worker, with the phases of each load, and then once more to the first logits (a forward
of one token: the program compiles, and the weights that a load left on the host reach the GPU).
A warm-up load and forward of the same file comes first, so both measured loads find the
compiler imported and its pipelines built.
"""
from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pkg"))
sys.path.insert(0, str(ROOT / "tests"))

CODE = """
import time
from webgrad.io import modelcache
from webgrad.models import gpt2_cache
async def bench_load(url):
    out = []
    m, _ = await gpt2_cache.load_gpt2_async(url)    # warm-up: the compiler, the pipelines
    await m.forward_async([1])
    m.backend.destroy()
    await modelcache.clear_async()
    for _ in range(2):
        t0 = time.perf_counter()
        m, info = await gpt2_cache.load_gpt2_async(url)
        await m.forward_async([1])
        info["to_logits"] = time.perf_counter() - t0
        m.backend.destroy()
        out.append(info)
    await modelcache.clear_async()
    return out
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--embd", type=int, default=256)
    parser.add_argument("--ctx", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=50257)
    args = parser.parse_args()

    import safetensors.numpy
    from gguf import GGMLQuantizationType as QT
    from test_modelcache import gguf_of
    from webgrad.browser import BrowserSession
    from webgrad.models import gpt2

    cfg = gpt2.GPT2Config(args.layers, max(1, args.embd // 64), args.embd, args.ctx, args.vocab)
    model = gpt2.GPT2(cfg, "reference")
    rng = np.random.default_rng(0)
    model.load_state_dict({n: (rng.standard_normal(s) * 0.02).astype(np.float32)
                           for n, s in gpt2.param_shapes(cfg).items()})
    sd = {k: np.asarray(v) for k, v in model.state_dict().items()}
    folder = ROOT / "models"
    folder.mkdir(exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    files = {"safetensors F32": folder / f"bench-{tag}-f32.safetensors",
             "safetensors F16": folder / f"bench-{tag}-f16.safetensors",
             "GGUF Q8_0": folder / f"bench-{tag}-q8_0.gguf"}
    try:
        model.save_safetensors(files["safetensors F32"])
        safetensors.numpy.save_file({k: v.astype(np.float16) for k, v in sd.items()},
                                    str(files["safetensors F16"]))
        gguf_of(files["GGUF Q8_0"], model, qtype=QT.Q8_0)
        n_params = sum(v.size for v in sd.values())
        print(f"GPT-2 {cfg.n_layer} layers x {cfg.n_embd}, vocab {cfg.vocab_size}, ctx {cfg.n_ctx}: "
              f"{n_params / 1e6:.1f}M parameters, image {4 * n_params / 1e6:.0f} MB")
        with BrowserSession() as s:
            s.run(CODE)
            print(f"{'file':16} {'MB':>6} {'first s':>8} {'second s':>9} {'ratio':>6} "
                  f"{'first to logits':>16} {'second':>7}   phases (first | second)")
            for label, path in files.items():
                first, second = s.call("bench_load", f"{s.url}models/{path.name}", timeout=1800)
                assert not first["cached"] and second["cached"], (first, second)
                phases = [" ".join(f"{k} {v:.2f}" for k, v in i["phases"].items()) for i in (first, second)]
                print(f"{label:16} {path.stat().st_size / 1e6:6.1f} {first['seconds']:8.2f} "
                      f"{second['seconds']:9.2f} {first['seconds'] / second['seconds']:6.1f} "
                      f"{first['to_logits']:16.2f} {second['to_logits']:7.2f}   "
                      f"{phases[0]} | {phases[1]}")
    finally:
        for path in files.values():
            path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
