#!/usr/bin/env python3
"""The `wasm` backend's decode step in onnxruntime-web under Node: ms a run, two exports
interleaved in one process. The browser's figure (wllama_decode.py) moves by 1.5x between
runs on the shared 2-core machine (its first webgrad row also pays V8's tier-up), too much
to see a lowering change of a few percent; Node runs the same WebAssembly build
(web/assets/npm/node_modules/onnxruntime-web, as serve.py serves it) without the page.

    python3 bench/ort_step_node.py --dump /tmp/after             # this tree's export
    (in another worktree)  python3 bench/ort_step_node.py --dump /tmp/before
    python3 bench/ort_step_node.py --run /tmp/before /tmp/after --reps 150
    python3 bench/ort_step_node.py --dump /tmp/pre --tokens 8    # the 8-id prefill instead
    python3 bench/ort_step_node.py --dump /tmp/long --n-ctx 2048  # a cache of 2048 positions

--dump writes wllama_decode.py's GGUF file (random weights of SmolLM2-135M's shape, F32,
--layers layers), loads it on backend "wasm" in CPython, and saves the program the decode
(or prefill) runs: its model, its resident weights (the external data) and the shapes of
its fed state. --run makes a session of each (graphOptimizationLevel "all", one thread, as
worker/ort.mjs does), runs each 3 times, then --reps times each, alternating, and prints
the median, first quartile and minimum.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORT_WEB = ROOT / "web" / "assets" / "npm" / "node_modules" / "onnxruntime-web" / "dist"

RUNNER = r"""
import fs from "fs";
const [ortDir, reps, ...dirs] = process.argv.slice(2);
const ort = await import(ortDir + "/ort.wasm.min.mjs");
ort.env.wasm.numThreads = 1;
ort.env.wasm.wasmPaths = ortDir + "/";
const runs = [];
for (const dir of dirs) {
  const meta = JSON.parse(fs.readFileSync(dir + "/meta.json"));
  const externalData = meta.external.map((p) => ({ path: p, data: new Uint8Array(fs.readFileSync(dir + "/" + p)) }));
  const session = await ort.InferenceSession.create(fs.readFileSync(dir + "/model.onnx"),
    { executionProviders: ["wasm"], graphOptimizationLevel: "all", logSeverityLevel: 3, externalData });
  const feeds = {};
  for (const [name, [dims, dtype, fill]] of Object.entries(meta.feeds)) {
    const n = dims.reduce((a, b) => a * b, 1);
    feeds[name] = dtype === "f32" ? new ort.Tensor("float32", new Float32Array(n).fill(fill), dims)
                                  : new ort.Tensor("int32", new Int32Array(n).fill(fill), dims);
  }
  runs.push({ dir, session, feeds, ms: [] });
}
for (const r of runs) for (let i = 0; i < 3; i++) await r.session.run(r.feeds);
for (let i = 0; i < Number(reps); i++)
  for (const r of runs) { const t = performance.now(); await r.session.run(r.feeds); r.ms.push(performance.now() - t); }
for (const r of runs) {
  r.ms.sort((a, b) => a - b);
  const q = (f) => r.ms[Math.floor(f * (r.ms.length - 1))].toFixed(2);
  console.log(`${r.dir}: median ${q(0.5)} ms, first quartile ${q(0.25)}, min ${q(0)} (${reps} runs)`);
}
"""


def dump(out: Path, layers: int, tokens: int, n_ctx: int = 64) -> None:
    sys.path.insert(0, str(ROOT / "pkg"))
    sys.path.insert(0, str(ROOT / "bench"))
    import numpy as np
    from wllama_decode import prompt_ids, write_smol
    from webgrad.backends.onnx_runtime import OnnxRuntimeBackend
    from webgrad.models import llama
    from webgrad.models.decoding import step_kind
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "smol-F32.gguf"
        write_smol(path, "F32", layers)
        m = llama.Llama.from_gguf(str(path), backend=OnnxRuntimeBackend(), n_ctx=n_ctx)
    m.generate(prompt_ids(49152, tokens), max_new_tokens=2, temperature=0, stop_at_eos=False)
    run = m._program(step_kind(tokens, ["next"]), tokens)._prog.exe   # generate's program
    b, ex = m.backend, run.ex
    (out / "model.onnx").write_bytes(ex.model)
    for loc, (_, name, qtype, shape) in ex.resident.items():
        value = b.store[name] if qtype is None else b.decoded(name, qtype, shape)
        np.ascontiguousarray(value, dtype=np.float32).tofile(out / loc)
    feeds = {"ids": [[tokens], "i32", 5], "pos": [[1], "i32", 9 if tokens == 1 else 0]}
    for k in ex.persistent:
        a = np.asarray(b.store[k])
        feeds[k] = [list(a.shape), "f32" if a.dtype == np.float32 else "i32", 0.01]
    for k, (buf, _) in ex.row_reads.items():   # a cache by rows: those below pos
        feeds[k] = [[feeds["pos"][2], b.shapes[buf][1]], "f32", 0.01]
    (out / "meta.json").write_text(json.dumps({"external": list(ex.resident), "feeds": feeds}))
    print(f"{out}: {ex.n_nodes} nodes, {len(ex.resident)} resident weights, "
          f"{len(ex.persistent)} fed buffers, {len(ex.row_reads)} caches by rows "
          f"({layers} layers, {tokens} ids a run, n_ctx {n_ctx})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dump", type=Path, help="write this tree's export here")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=1, help="ids a run: 1 the decode step, 8 the prefill")
    ap.add_argument("--n-ctx", type=int, default=64, help="the cache's positions (wllama_decode.py's "
                    "default; models load with min(max_position_embeddings, 2048))")
    ap.add_argument("--run", type=Path, nargs="+", help="exports to time, interleaved")
    ap.add_argument("--reps", type=int, default=100)
    args = ap.parse_args()
    if args.dump:
        dump(args.dump, args.layers, args.tokens, args.n_ctx)
    if args.run:
        node = shutil.which("node")
        if node is None or not ORT_WEB.is_dir():
            sys.exit("needs node and onnxruntime-web in web/assets/npm (scripts that provision web/assets)")
        with tempfile.TemporaryDirectory() as tmp:
            runner = Path(tmp) / "runner.mjs"
            runner.write_text(RUNNER)
            subprocess.run([node, str(runner), str(ORT_WEB), str(args.reps),
                            *[str(d.resolve()) for d in args.run]], check=True)


if __name__ == "__main__":
    main()
