#!/usr/bin/env python3
"""webgrad's small transformers (and MLP-sin) trained in headless Chromium beside jax-js and
TensorFlow.js, one run.

    python3 bench/transformer_browser.py                       # mlp, tiny, adder; 40 steps each
    python3 bench/transformer_browser.py --rounds 3            # each library's best of 3 rounds
    python3 bench/transformer_browser.py --models tiny --steps 50 --json /tmp/tf.json

The models (every row: webgrad, jax-js and TensorFlow.js on the same WebGPU adapter of one
Chromium; --cpu: a Chromium with WebGPU off, webgrad on `wasm`, the peers on their
WebAssembly backends):
- mlp:   examples/mlp_sin.py, B 256, 1-64-64-1, Adam lr 0.005 (bench/mlp_browser.py's row; that
         script also runs TF.js);
- tiny:  tests/models.py's Transformer, the test suite's small causal transformer: vocab 12,
         T 8, d 32, 2 layers x 2 heads, B 16, cross entropy on the 4 reversed digits, Adam lr
         0.01; batch i is models.reversal_batch(seed=1000 + i);
- adder: examples/transformer_addition.py, tensorgrad's 3-layer addition transformer: d 64,
         4 heads, B 128, T 8, AdamW (wd 0.01) with its warm-up + cosine schedule; batches
         drawn as its train() draws them.

Equal work: jax-js (bench/peers/jaxjs_transformer.mjs; jaxjs.mjs for the MLP) and TensorFlow.js
(tfjs_transformer.mjs, eager with tf.variableGrads; tfjs.mjs for the MLP) start from
webgrad's own initial parameters (webgrad.init.generate for the seed, by name), train on the
batches webgrad's worker draws (checked by a checksum), with the same optimizer formula and the
same learning rate at every step, so the loss curves agree to float32 rounding (the table
prints each peer's largest relative gap over the first 20 steps). The whole jax-js step is one
jit().

Timing (as bench/mlp_browser.py): wall time of one step() -- host batch in, optimizer update,
loss read back as a number -- median over the steps after --warmup; dispatches: webgrad's
kernel_count, the peers' compute-pass dispatches counted on the last warm-up step. The ratio,
on each peer's row, is webgrad's ms/step over the peer's (issue 25's target without WebGPU:
1.0 or less against both).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "pkg"))
sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import mlp_browser  # noqa: E402  (the shared harness: npm install, peers' server, run_peer)
import models  # noqa: E402  (tests/models.py)
import transformer_addition as adder  # noqa: E402
from webgrad import init as wg_init  # noqa: E402
from webgrad.browser import BrowserSession, load_serve  # noqa: E402

DATA_SEED = 1000  # tiny: batch i is reversal_batch(seed=DATA_SEED + i), fresh digits each step
ADAM = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}  # webgrad's optim.Adam / AdamW defaults

# Per model: the file shipped into the worker (imported under `module`), the webgrad build and
# batch expressions run there, and what the peers' pages need to build the same model.
MODELS = {
    "tiny": {
        "file": REPO / "tests" / "models.py", "module": "models",
        "build": "mod.compile_transformer('webgpu', seed=SEED)",
        "batches": "[mod.reversal_batch(seed=DATA_SEED + i) for i in range(STEPS)]",
        "spec": lambda: models.Transformer(),
        "model": {"kind": "tiny", "B": models.TF_B, "T": models.SEQ, "D": models.D_MODEL,
                  "heads": models.N_HEADS, "layers": models.N_LAYERS, "vocab": models.VOCAB,
                  "answer": [models.SEQ - models.HALF, models.SEQ]},
        "optimizer": {**ADAM, "weight_decay": 0.0, "decoupled": False},  # optim.Adam(lr=0.01)
        "title": (f"tiny transformer (tests/models.py: d {models.D_MODEL}, {models.N_LAYERS} "
                  f"layers x {models.N_HEADS} heads, B {models.TF_B} x T {models.SEQ}, Adam "
                  f"lr 0.01)"),
    },
    "adder": {
        "file": REPO / "examples" / "transformer_addition.py", "module": "transformer_addition",
        "build": "mod.build('webgpu', seed=SEED)",
        "batches": ("(lambda pairs, rng: [mod.batch(rng, pairs) for _ in range(STEPS)])"
                    "(mod.split(SEED)[0], random.Random(SEED + 1))"),
        "spec": lambda: adder.AdderTransformer(),
        "model": {"kind": "adder", "B": adder.B, "T": adder.T, "D": adder.D,
                  "heads": adder.HEADS, "layers": adder.LAYERS, "vocab": adder.VOCAB,
                  "answer": [adder.ANSWER, adder.T]},
        "optimizer": {**ADAM, "weight_decay": 0.01, "decoupled": True},  # optim.AdamW(wd 0.01)
        "title": (f"addition transformer (examples/transformer_addition.py: d {adder.D}, "
                  f"{adder.LAYERS} layers x {adder.HEADS} heads, B {adder.B} x T {adder.T}, "
                  f"AdamW warm-up + cosine)"),
    },
}

# The peers' pages in bench/peers/: [transformer pages, MLP pages] (PEERS[name == "mlp"])
PEERS = ([("jax-js", "jaxjs_transformer.html"), ("TensorFlow.js", "tfjs_transformer.html")],
         [("jax-js", "jaxjs.html"), ("TensorFlow.js", "tfjs.html")])


def batches_here(name: str, steps: int, seed: int) -> list[dict]:
    """The batches the worker's BATCHES expression draws, drawn here for the peers."""
    if name == "tiny":
        return [models.reversal_batch(seed=DATA_SEED + i) for i in range(steps)]
    pairs, rng = adder.split(seed)[0], random.Random(seed + 1)
    return [adder.batch(rng, pairs) for _ in range(steps)]


def make_config(name: str, steps: int, warmup: int, seed: int) -> dict:
    """webgrad's initial parameters, batches and per-step learning rates, for the peers."""
    m = MODELS[name]
    params, shapes, decays = {}, {}, {}
    for pname, spec in m["spec"]().named_specs():
        shapes[pname] = list(spec.shape)
        params[pname] = wg_init.generate(spec.init, spec.shape, seed=seed, name=pname)
        decays[pname] = spec.decays
    batches = batches_here(name, steps, seed)
    flat = lambda key: [v for b in batches for row in b[key] for v in row]  # noqa: E731
    # lr(t) for t = updates done before the step, as webgrad's schedule reads its counter
    lrs = [0.01] * steps if name == "tiny" else [adder.schedule().value(t) for t in range(steps)]
    return {"steps": steps, "warmup": warmup, "params": params, "shapes": shapes,
            "decays": decays, "model": m["model"], "optimizer": m["optimizer"], "lrs": lrs,
            "feeds": {"idx": {"dtype": "i32", "data": flat("idx")},
                      "target": {"dtype": "i32", "data": flat("target")}},
            "checksum": sum(map(sum, batches[0]["idx"])),
            "timeout_s": 300 + 15.0 * steps}  # a loaded 2-core machine: seconds per step


def run_webgrad(s: BrowserSession, name: str, steps: int, warmup: int, seed: int,
                backend: str = "webgpu") -> dict:
    m = MODELS[name]
    code = mlp_browser.worker_code(m["file"], m["module"],
                                   build=m["build"].replace("'webgpu'", repr(backend)),
                                   batches=m["batches"],
                                   checksum='sum(map(sum, batches[0]["idx"]))',
                                   STEPS=steps, WARMUP=warmup, SEED=seed, DATA_SEED=DATA_SEED)
    out = s.run(code, timeout=300 + 15.0 * steps)
    out["version"] = s.info.get("webgrad_version", "?")
    return out


def run_model(s, url: str | None, name: str, args) -> list[dict]:
    """webgrad's then each peer's result for one model; a failure becomes {"library", "error"}."""
    out = []
    backend = "wasm" if args.cpu else "webgpu"
    try:
        if name == "mlp":
            r = mlp_browser.run_webgrad(s, args.steps, args.warmup, args.seed, backend)
        else:
            r = run_webgrad(s, name, args.steps, args.warmup, args.seed, backend)
        out.append(r)
    except Exception as e:  # keep going: the peer's figures are still worth having
        out.append({"library": "webgrad", "error": f"{type(e).__name__}: {e}"})
    if url is not None:
        for library, page in PEERS[name == "mlp"]:
            if library not in args.peers:
                continue
            if name == "mlp":
                config = mlp_browser.make_config(args.steps, args.warmup, args.seed)
            else:
                config = make_config(name, args.steps, args.warmup, args.seed)
                if "checksum" in out[0] and out[0]["checksum"] != config["checksum"]:
                    print(f"warning: {name}: webgrad's worker drew other batches than "
                          f"{library} gets", file=sys.stderr)
            try:
                out.append(mlp_browser.run_peer(
                    s, url + page + ("?device=wasm" if args.cpu else ""), config))
            except Exception as e:
                out.append({"library": library, "error": f"{type(e).__name__}: {e}"})
    return out


def loss_gap(a: dict, b: dict) -> float | None:
    """Largest |a - b| / |a| over the first losses both recorded."""
    la, lb = a.get("first_losses"), b.get("first_losses")
    if not la or not lb:
        return None
    return max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(la, lb))


def print_table(results: dict[str, list[dict]], args) -> None:
    what = f"median of the last {args.steps - args.warmup} of {args.steps} steps" + (
        f", lowest of {args.rounds} rounds" if args.rounds > 1 else "")
    print(f"\nms/step = {what}; ratio (on each peer's row) = webgrad's ms/step / the peer's")
    head = (f"{'model':<7} {'library':<13} {'version':<8} {'ms/step':>8} {'p10-p90':>13} "
            f"{'dispatches':>10} {'loss@1':>9} {'loss@end':>9} {'ratio':>6}")
    print(head)
    print("-" * len(head))
    for name, rows in results.items():
        base = next((r for r in rows if r["library"] == "webgrad" and "error" not in r), None)
        for r in rows:
            if "error" in r:
                print(f"{name:<7} {r['library']:<13} FAILED: {r['error'].splitlines()[0]}")
                continue
            ratio = (f"{base['ms_per_step'] / r['ms_per_step']:.2f}"
                     if base and r is not base else "")
            spread = f"{r['ms_p10']:.1f}-{r['ms_p90']:.1f}"
            each = ("  rounds: " + " / ".join(mlp_browser.fmt(x, ".1f")
                                              for x in r.get("round_medians", []))
                    if args.rounds > 1 else "")
            print(f"{name:<7} {r['library']:<13} {r.get('version', '?'):<8} "
                  f"{r['ms_per_step']:>8.2f} {spread:>13} "
                  f"{mlp_browser.fmt(r.get('dispatches'), 'd'):>10} {r['first_loss']:>9.4f} "
                  f"{r['loss']:>9.4f} {ratio:>6}{each}")
        for peer in (r for r in rows if base and r is not base and "error" not in r):
            gap = loss_gap(base, peer)
            if gap is not None:
                print(f"{'':<7} {peer['library']}'s losses over the first {min(20, args.steps)} "
                      f"steps agree with webgrad's to {gap:.1e} (largest relative gap)")
    for name in results:
        title = (MODELS[name]["title"] if name in MODELS else
                 f"MLP-sin (examples/mlp_sin.py: B {mlp_browser.mlp_sin.B}, 1-64-64-1, Adam "
                 f"lr 0.005)")
        print(f"  {name}: {title}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,tiny,adder", help="comma-separated, from "
                        "mlp,tiny,adder")
    parser.add_argument("--steps", type=int, default=40, help="training steps per library "
                        "(the addition step takes seconds on SwiftShader)")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of the median")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run everything this many times (same browser); report each "
                             "library's lowest median")
    parser.add_argument("--no-peer", action="store_true", help="webgrad alone (no npm install)")
    parser.add_argument("--peers", default="jax-js,TensorFlow.js",
                        help="comma-separated, from jax-js,TensorFlow.js")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu", action="store_true",
                        help="a Chromium without WebGPU: webgrad on 'wasm', the peers on WebAssembly")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in ("mlp", *MODELS)]
    if unknown or not names:
        parser.error(f"unknown model(s) {unknown}; choose from mlp,{','.join(MODELS)}")
    if not 0 < args.warmup < args.steps or args.steps < 20:
        parser.error("need 0 < --warmup < --steps and --steps >= 20")
    if args.rounds < 1:
        parser.error("need --rounds >= 1")
    args.peers = [p for p in args.peers.split(",") if p]
    if not set(args.peers) <= {"jax-js", "TensorFlow.js"}:
        parser.error("--peers: choose from jax-js,TensorFlow.js")

    install_error = None if args.no_peer else mlp_browser.npm_install()
    if install_error:
        print(f"the peers cannot run: {install_error}", file=sys.stderr)
    t0 = time.perf_counter()
    print("starting headless Chromium and webgrad's Pyodide worker...", flush=True)
    rounds: list[dict[str, list[dict]]] = []
    with BrowserSession() as main_session:
        s = main_session.without_webgpu() if args.cpu else main_session
        print(f"browser {s.browser.version}; webgrad {s.info.get('webgrad_version')}"
              + (" (WebGPU off)" if args.cpu else ""), flush=True)
        use_peer = not args.no_peer and not install_error
        server, url = (mlp_browser.peers_server(load_serve(REPO)) if use_peer else (None, None))
        try:
            for i in range(args.rounds):
                this = {}
                for name in names:
                    this[name] = run_model(s, url, name, args)
                    print(f"  round {i + 1}: {name} done ({time.perf_counter() - t0:.0f} s)",
                          flush=True)
                rounds.append(this)
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()

    results = {n: mlp_browser.best_of([r[n] for r in rounds]) for n in names}
    if install_error:
        for n in names:
            results[n].extend({"library": p, "error": install_error} for p in args.peers)
    for n, rows in results.items():
        for r in rows:
            if "error" in r:
                print(f"\n{n} / {r['library']} failed:\n{r['error']}", file=sys.stderr)
    print_table(results, args)
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "args": {
            k: str(v) for k, v in vars(args).items()}, "results": results,
            "rounds": rounds}, indent=1) + "\n")
    return 1 if any("error" in r for rows in results.values() for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
