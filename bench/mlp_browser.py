#!/usr/bin/env python3
"""webgrad's MLP-sin training step in headless Chromium, side by side with npm peers, one run.

    python3 bench/mlp_browser.py                          # 300 steps, peers jaxjs,tfjs
    python3 bench/mlp_browser.py --rounds 3                # each library's best of 3 rounds
    python3 bench/mlp_browser.py --steps 100 --peers jaxjs --json /tmp/mlp.json
    python3 bench/mlp_browser.py --cpu --peers jaxjs       # WebGPU off: webgrad's "wasm" vs
                                                           # jax-js's WebAssembly device

The model is examples/mlp_sin.py's: B=256, 1-64-64-1 with relu, loss sum(d*d)/B, Adam lr
0.005 (betas 0.9/0.999, eps 1e-8). Every library starts from the SAME parameters (webgrad's
kaiming-normal init for seed 0, computed here with webgrad.init) and trains on the SAME batches
(mlp_sin.batch with random.Random(seed), x ~ U(-pi, pi), y = sin x), so final losses compare.

What runs where (one Chromium with webgrad.browser.CHROMIUM_FLAGS, WebGPU on SwiftShader here):
- webgrad: a BrowserSession page; its Pyodide worker imports examples/mlp_sin.py and steps the
  model compiled by `compile_mlp("webgpu")` (the script's `train()` stops at a target loss and
  times batch making too, so the loop here is its loop with per-step timing);
- each peer: bench/peers/<peer>.html in a new page of the same browser, served from bench/peers
  by a second server (serve.py's make_server serves only web/, worker/ and the Pyodide assets;
  this one reuses serve.py's Handler, so the pages get the same cross-origin isolation and hence
  the same performance.now() resolution). bench/peers/common.mjs is their shared harness.

Every library is timed the same way: wall time of one step() (host batch in, Adam update, loss
read back as a number, as webgrad's step returns it), median over the steps after --warmup.
With --cpu the same runs in a second Chromium started without WebGPU
(webgrad.browser.NO_WEBGPU_FLAGS): webgrad compiles with backend "wasm" (its program exported to
ONNX, in onnxruntime-web) and jax-js runs on its "wasm" device (jaxjs.html?device=wasm).
Dispatches per step: webgrad's kernel_count (for wasm: the ONNX graph's nodes); for peers, the compute dispatches counted on the
last warm-up step. Figures vary with machine load; run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEERS_DIR = REPO / "bench" / "peers"
PEERS = {"jaxjs": "jaxjs.html", "tfjs": "tfjs.html"}  # --peers name -> page in bench/peers
sys.path.insert(0, str(REPO / "pkg"))
sys.path.insert(0, str(REPO / "examples"))

import mlp_sin  # noqa: E402  (examples/mlp_sin.py: the model, its batches and compile_mlp)
from webgrad import init as wg_init  # noqa: E402
from webgrad.browser import BrowserSession, load_serve  # noqa: E402

# Runs in webgrad's Pyodide worker: ships a model's file as module MODULE (its text run as
# __main__ would start its own training), builds the model with BUILD, draws the batches with
# BATCHES before timing (as the peers get them), then times STEPS steps as the peers' harness
# does. CHECKSUM of the first batch lets the caller check that the peers got the same data.
# bench/transformer_browser.py fills the same template for its models.
WORKER_CODE = """
import importlib, os, sys, time, random, statistics
folder = "/home/pyodide/webgrad_bench"
os.makedirs(folder, exist_ok=True)
with open(f"{folder}/{MODULE}.py", "w") as f:
    f.write(SOURCE)
if folder not in sys.path:
    sys.path.insert(0, folder)
sys.modules.pop(MODULE, None)
importlib.invalidate_caches()
mod = importlib.import_module(MODULE)

t0 = time.perf_counter()
c = BUILD
setup_ms = 1e3 * (time.perf_counter() - t0)
batches = BATCHES
times, losses = [], []
for feed in batches:
    t0 = time.perf_counter()
    losses.append(float(c.step(feed)))
    times.append(1e3 * (time.perf_counter() - t0))
dispatches = c.kernel_count
c.destroy()
timed = sorted(times[WARMUP:])
{"library": "webgrad", "steps": STEPS, "warmup": WARMUP, "setup_ms": setup_ms,
 "ms_per_step": statistics.median(timed), "ms_p10": timed[round(0.1 * (len(timed) - 1))],
 "ms_p90": timed[round(0.9 * (len(timed) - 1))], "first_step_ms": times[0],
 "dispatches": dispatches, "loss": losses[-1], "first_loss": losses[0], "losses": losses[::10],
 "first_losses": losses[:20], "checksum": CHECKSUM}
"""


def worker_code(path: Path, module: str, build: str, batches: str, checksum: str,
                **constants) -> str:
    """WORKER_CODE for the model file at path, with constants (STEPS, WARMUP, SEED, ...)."""
    head = f"SOURCE = {path.read_text()!r}\nMODULE = {module!r}\n"
    head += "".join(f"{k} = {v!r}\n" for k, v in constants.items())
    return head + (WORKER_CODE.replace("BUILD", build).replace("BATCHES", batches)
                   .replace("CHECKSUM", checksum))


# Runs in a peer page: window.peerBench.run(config) with a deadline, errors as {error}.
PEER_RUN_JS = """async ([config, timeoutMs]) => {
  let timer;
  const deadline = new Promise((resolve) => { timer = setTimeout(
    () => resolve({ error: `no result after ${timeoutMs / 1000} s` }), timeoutMs); });
  try { return await Promise.race([window.peerBench.run(config), deadline]); }
  finally { clearTimeout(timer); }
}"""


def make_config(steps: int, warmup: int, seed: int) -> dict:
    """webgrad's initial parameters and the batches webgrad's worker will draw, for the peers."""
    params, shapes = {}, {}
    for name, spec in mlp_sin.MLP().named_specs():
        shapes[name] = list(spec.shape)
        params[name] = wg_init.generate(spec.init, spec.shape, seed=seed, name=name)
    rng = random.Random(seed)
    xs, ys = [], []
    for _ in range(steps):
        feed = mlp_sin.batch(rng)
        xs.extend(feed["x"])
        ys.extend(feed["y"])
    return {"steps": steps, "warmup": warmup, "batch": mlp_sin.B, "lr": 0.005,
            "params": params, "shapes": shapes, "xs": xs, "ys": ys}


def npm_install() -> str | None:
    """`npm install` in bench/peers; returns None, or why the peers cannot run."""
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not installed (Debian: apt-get install npm)"
    done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
                          cwd=PEERS_DIR, capture_output=True, text=True)
    if done.returncode != 0:
        return (f"`npm install` in {PEERS_DIR} exited {done.returncode}:\n"
                f"{done.stdout[-1500:]}{done.stderr[-1500:]}")
    return None


def peers_server(serve):
    """A second server for bench/peers, with serve.py's handler (isolation headers, no listing)."""
    handler = type("PeersHandler", (serve.Handler,), {
        "mounts": [("/", PEERS_DIR.resolve())], "quiet": True})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, name="peers-serve", daemon=True).start()
    return server, serve.server_url(server)


def run_webgrad(s: BrowserSession, steps: int, warmup: int, seed: int,
                backend: str = "webgpu") -> dict:
    code = worker_code(REPO / "examples" / "mlp_sin.py", "mlp_sin",
                       build=f"mod.compile_mlp({backend!r}, seed=SEED)",
                       batches="(lambda rng: [mod.batch(rng) for _ in range(STEPS)])"
                               "(random.Random(SEED))",
                       checksum='sum(batches[0]["x"])', STEPS=steps, WARMUP=warmup, SEED=seed)
    out = s.run(code, timeout=120 + 2.0 * steps)
    out["version"] = s.info.get("webgrad_version", "?")
    return out


def run_peer(s: BrowserSession, url: str, config: dict) -> dict:
    """Open one peer page in the session's browser and run the harness; the page is closed after."""
    page = s.browser.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    try:
        response = page.goto(url)
        if response is not None and not response.ok:
            raise RuntimeError(f"{url} answered HTTP {response.status}")
        try:
            page.wait_for_function("() => window.peerBench !== undefined", timeout=60_000)
        except Exception:
            raise RuntimeError("the page did not register window.peerBench within 60 s "
                               "(a module failed to load?)\n" + "\n".join(console[-10:])) from None
        limit = config.get("timeout_s", 120 + 2.0 * config["steps"])  # seconds, whole run
        out = page.evaluate(PEER_RUN_JS, [config, int(1000 * limit)])
        if "error" in out:
            raise RuntimeError(f"{out['error']}\n{out.get('stack', '')}\n"
                               + "\n".join(console[-10:]))
        return out
    finally:
        page.close()


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(results: list[dict], steps: int, warmup: int, rounds: int) -> None:
    what = f"median of the last {steps - warmup}" + (
        f", lowest of {rounds} rounds" if rounds > 1 else "")
    print(f"\nMLP-sin training step (B={mlp_sin.B}, 1-64-64-1 relu, Adam lr 0.005), {steps} steps;"
          f" ms/step = {what} (p10-p90 of that round):")
    base = next((r["ms_per_step"] for r in results
                 if r["library"] == "webgrad" and "error" not in r), None)
    head = (f"{'library':<14} {'version':<9} {'ms/step':>8} {'p10-p90':>13} {'dispatches':>10} "
            f"{'final loss':>11} {'vs webgrad':>10}")
    head += "  every round's median" if rounds > 1 else ""
    print(head)
    print("-" * len(head))
    for r in results:
        if "error" in r:
            print(f"{r['library']:<14} FAILED: {r['error'].splitlines()[0]}")
            continue
        ratio = f"{r['ms_per_step'] / base:.2f}x" if base else "-"
        spread = f"{r['ms_p10']:.1f}-{r['ms_p90']:.1f}"
        each = ("  " + " / ".join(fmt(m, ".1f") for m in r.get("round_medians", []))
                if rounds > 1 else "")
        print(f"{r['library']:<14} {r.get('version', '?'):<9} {r['ms_per_step']:>8.2f} "
              f"{spread:>13} "
              f"{fmt(r.get('dispatches'), 'd'):>10} {r['loss']:>11.3e} {ratio:>10}{each}")
    print("vs webgrad: the library's ms/step divided by webgrad's (below 1 = faster than webgrad).")


def run_round(s: BrowserSession, url: str | None, peers: list[str], config: dict,
              args: argparse.Namespace, t0: float) -> list[dict]:
    """webgrad, then each peer, once; a failure becomes {"library", "error"} and the rest run."""
    out = []
    try:
        r = run_webgrad(s, args.steps, args.warmup, args.seed, "wasm" if args.cpu else "webgpu")
        if abs(r["checksum"] - sum(config["xs"][:mlp_sin.B])) > 1e-3:
            print("warning: webgrad's worker drew other batches than the peers get",
                  file=sys.stderr)
        out.append(r)
    except Exception as e:  # keep going: the peers' figures are still worth having
        out.append({"library": "webgrad", "error": f"{type(e).__name__}: {e}"})
    print(f"  webgrad done ({time.perf_counter() - t0:.0f} s)", flush=True)
    for name in peers:
        try:
            out.append(run_peer(s, url + PEERS[name] + ("?device=wasm" if args.cpu else ""), config))
        except Exception as e:
            out.append({"library": name, "error": f"{type(e).__name__}: {e}"})
        print(f"  {name} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


def best_of(rounds: list[list[dict]]) -> list[dict]:
    """Per library, the round with the lowest median (load only ever adds time), with every
    round's median in "round_medians"; a library that failed in every round keeps its error."""
    merged = []
    for i in range(len(rounds[0])):
        runs = [r[i] for r in rounds]
        ok = [r for r in runs if "error" not in r]
        if not ok:
            merged.append(runs[-1])
            continue
        best = dict(min(ok, key=lambda r: r["ms_per_step"]))
        best["round_medians"] = [r.get("ms_per_step") for r in runs]
        merged.append(best)
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps per library")
    parser.add_argument("--warmup", type=int, default=10, help="first steps left out of the median")
    parser.add_argument("--peers", default="jaxjs,tfjs",
                        help=f"comma-separated, from {','.join(PEERS)}; empty: webgrad only")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run everything this many times (same browser); report each "
                             "library's lowest median")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu", action="store_true",
                        help="a Chromium without WebGPU: webgrad on 'wasm', jax-js on 'wasm'")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    peers = [p for p in args.peers.split(",") if p]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        parser.error(f"unknown peer(s) {unknown}; choose from {list(PEERS)}")
    if not 0 < args.warmup < args.steps:
        parser.error("need 0 < --warmup < --steps")
    if args.rounds < 1:
        parser.error("need --rounds >= 1")

    install_error = npm_install() if peers else None
    if install_error:
        print(f"peers cannot run: {install_error}", file=sys.stderr)
    failed_install = ([{"library": p, "error": install_error} for p in peers]
                      if install_error else [])
    peers = [] if install_error else peers
    config = make_config(args.steps, args.warmup, args.seed)

    t0 = time.perf_counter()
    print("starting headless Chromium and webgrad's Pyodide worker...", flush=True)
    rounds: list[list[dict]] = []
    with BrowserSession() as main_session:
        s = main_session.without_webgpu() if args.cpu else main_session
        print(f"browser {s.browser.version}; webgrad {s.info.get('webgrad_version')}"
              + (" (WebGPU off)" if args.cpu else ""), flush=True)
        server, url = peers_server(load_serve(REPO)) if peers else (None, None)
        try:
            for i in range(args.rounds):
                print(f"round {i + 1} of {args.rounds}", flush=True)
                rounds.append(run_round(s, url, peers, config, args, t0))
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()

    results = best_of(rounds) + failed_install
    for r in results:
        if "error" in r:
            print(f"\n{r['library']} failed:\n{r['error']}", file=sys.stderr)
    print_table(results, args.steps, args.warmup, args.rounds)
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "args": {
            k: str(v) for k, v in vars(args).items()}, "results": results,
            "rounds": rounds}, indent=1) + "\n")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
