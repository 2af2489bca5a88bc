#!/usr/bin/env python3
"""GFLOP/s of webgrad's generated f32 matmul against torch's fp32 matmul on the same GPU.

    python3 bench/matmul.py                          # 1024, 2048, 4096 (a GPU machine)
    python3 bench/matmul.py --sizes issue            # issue 11's matmul table: the 64 x 256
                                                     # GPT step's shapes, and 4096
    python3 bench/matmul.py --sizes 128,256 --reps 3 # lavapipe / CPU: small sizes
    python3 bench/matmul.py --configs auto,8x8x8,8x8x16:novec,4x8x8:nopre   # compare tilings

The WebGPU library: $WEBGRAD_WGPU_LIB if set, else wgpudawn (Dawn) where installed, else
wgpu (wgpu-native); the one used is printed. The kernel is exactly what the compiler
emits for an [n, n] @ [n, n] graph (codegen.lower); it is timed with the wall clock around
one submission of --reps back-to-back dispatches and onSubmittedWorkDone (or a 16-byte
read-back where that is broken), after --warmup
such submissions. torch runs with TF32 off (allow_tf32 = False, precision "highest"),
timed with CUDA events on a GPU (wall clock on the CPU). Results are checked against torch
before they are timed (max |err| / (1 + |want|) over sampled rows).
"""
from __future__ import annotations

import argparse
import os
from dataclasses import replace
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pkg"))


def pick_lib() -> str:
    name = os.environ.get("WEBGRAD_WGPU_LIB")
    if name:
        return name
    for cand in ("wgpudawn", "wgpu"):
        try:
            __import__(cand)
            os.environ["WEBGRAD_WGPU_LIB"] = cand
            return cand
        except ImportError:
            continue
    sys.exit("neither wgpudawn nor wgpu is installed: pip install wgpudawn (or wgpu)")


def parse_config(text: str):
    """None (the table's tiling), a dict (the table's tilings with these Config fields:
    "auto:e2"), or a Config."""
    from webgrad.codegen.matmul_config import Config
    if text == "auto":
        return None
    if text.startswith("auto:"):  # the table's tiles with fields set: e<rows>, db
        fields = {}
        for f in text.split(":")[1:]:
            if f[:1] == "e" and f[1:].isdigit():
                fields["epi_rows"] = int(f[1:])
            elif f == "db":
                fields["double"] = True
            elif f == "wt":
                fields["warp_tiles"] = True
            else:
                sys.exit(f"{text}: unknown flag {f} (e<rows>, db, wt)")
        return fields
    shape, *flags = text.split(":")
    tm, tn, bk = (int(v) for v in shape.split("x"))

    def num(prefix, default):  # the value of flag prefix + digits ("s4" -> "4")
        got = [f[len(prefix):] for f in flags
               if f.startswith(prefix) and f[len(prefix):][:1].isdigit()]
        return got[0] if got else default
    wx, wy = (int(v) for v in num("w", "16x16").split("x"))
    return Config(tm, tn, bk, vec="novec" not in flags, prefetch="nopre" not in flags,
                  splits=int(num("s", 1)), double="db" in flags, wx=wx, wy=wy,
                  group=int(num("g", 0)), vload="vl" in flags, epi_rows=int(num("e", 0)),
                  warp_tiles="wt" in flags)


# the matmuls of bench/gpt2_train.py's 64 x 256 row (d 512): name, [batch], M, K, N, and
# which operand the real graph reads transposed (a weight gradient reads x^T, attention k^T)
ISSUE_SHAPES = {
    "wgrad_qkv": ((), 512, 16384, 1536, "ta"),
    "wgrad_mlp": ((), 512, 16384, 2048, "ta"),
    "fwd_qkv": ((), 16384, 512, 1536, ""),
    "scores": ((512,), 256, 64, 256, "tb"),
}


def parse_shape(text: str):
    """"4096" (square), a name of ISSUE_SHAPES, or "[Bx]MxKxN[:ta][:tb][:bias|gelu|geluback]"."""
    if text in ISSUE_SHAPES:
        return (text,) + ISSUE_SHAPES[text]
    dims, *flags = text.split(":")
    d = [int(v) for v in dims.split("x")]
    if len(d) == 1:
        d = [d[0]] * 3
    batch, (m, k, n) = tuple(d[:-3]), d[-3:]
    return (text, batch, m, k, n, ":".join(flags))


EPILOGUES = ("bias", "gelu", "geluback")
GELU_C = (2 / 3.141592653589793) ** 0.5


def epilogue_graph(batch, m, k, n, flags):
    """The product with the GPT MLP's fused epilogues, traced from webgrad ops: "bias"
    (a @ b + bias, the QKV Linear), "gelu" (the up-projection: stores a @ b and
    gelu(a @ b + bias), as the training step keeps the product for the backward pass),
    "geluback" (its backward twin: (a @ b) * gelu'(pre + bias), reading the stored
    [m, n] product `pre`). Both operands are stored as they are read (no :ta / :tb)."""
    from webgrad import Module, ops
    from webgrad.compile import build_forward_graph
    kind = next(f for f in EPILOGUES[::-1] if f in flags.split(":"))
    inputs = {"a": (batch + (m, k), "f32"), "b": (batch + (k, n), "f32"), "bias": ((n,), "f32")}
    if kind == "geluback":
        inputs["pre"] = (batch + (m, n), "f32")
    keep = {}

    def fwd(_, i):
        y = ops.matmul(i["a"], i["b"])
        if kind == "bias":
            return y + i["bias"]
        if kind == "gelu":
            keep["pre"] = y
            return ops.gelu(y + i["bias"])
        # gelu'(x) = (1 + t) / 2 + x (1 - t^2) c (1 + 3 a x^2) / 2, t = tanh(c (x + a x^3)).
        # Each tanh is read once: one read twice would be stored by fusion's cost rule (in
        # the training step remat.py keeps it unstored), and so would z, so t^2 =
        # tanh(z') tanh(z'') with z', z'' the same value written differently (not merged
        # by cse): three tanh where the step's kernel has one
        x = i["pre"] + i["bias"]
        x2 = x * x
        z = GELU_C * (x + 0.044715 * (x2 * x))
        z2 = GELU_C * x + (GELU_C * 0.044715) * (x * x2)
        z3 = (GELU_C * x) * (1.0 + 0.044715 * x2)
        d = (0.5 * (1.0 + ops.tanh(z)) + 0.5 * x * (1.0 - ops.tanh(z2) * ops.tanh(z3))
             * GELU_C * (1.0 + 3 * 0.044715 * x2))
        return y * d
    _, g = build_forward_graph(Module, fwd, inputs)
    g.outputs = {"out": g.outputs["output"]}
    if "pre" in keep:
        g.outputs["pre"] = keep["pre"].id
    return g


def epilogue_want(kind, A, B, bias, pre):
    """float64 reference of epilogue_graph's "out" (rows of A given)."""
    import numpy as np
    y = A.astype(np.float64) @ B.astype(np.float64)
    if kind == "bias":
        return y + bias
    if kind == "gelu":
        x = y + bias
        return 0.5 * x * (1 + np.tanh(GELU_C * (x + 0.044715 * x ** 3)))
    x = pre.astype(np.float64) + bias
    t = np.tanh(GELU_C * (x + 0.044715 * x ** 3))
    return y * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_C * (1 + 3 * 0.044715 * x * x))


def table_variant(adapter: str, fields: dict | None):
    """KernelOptions whose tiling_row is the adapter's row of codegen/matmul_config.py's
    ADAPTER_TILINGS with `fields` set on every tile (None: the row as it is)."""
    from webgrad.codegen import KernelOptions
    from webgrad.codegen import matmul_config as mm
    row = mm.adapter_tiling(adapter)
    if fields:
        row = {k: replace(v, **fields) if isinstance(v, mm.Config) else v for k, v in row.items()}
    return KernelOptions(tiling_row=row)


def build(host, shape, config):
    from webgrad.codegen import KernelOptions, Limits, lower
    from webgrad.ir import Graph
    _, batch, m, k, n, flags = shape
    if any(f in EPILOGUES for f in flags.split(":")):
        if "ta" in flags.split(":") or "tb" in flags.split(":"):
            sys.exit(f"{shape[0]}: the epilogue shapes take no :ta / :tb")
        g = epilogue_graph(batch, m, k, n, flags)
        limits = Limits.from_host(host.limits)
        limits.adapter = host.info
        limits.options = (table_variant(host.info, config) if isinstance(config, dict)
                          else KernelOptions(force_config=config))
        low, names = lower(g, limits)
        return low, next(nm for nm in names if nm.startswith("matmul") and " K=" in nm)
    g = Graph()

    def operand(name, rows, cols, transposed):
        sh = batch + ((cols, rows) if transposed else (rows, cols))
        x = g.add("input", [], sh, "f32", {"name": name, "shape": sh, "dtype": "f32"})
        if transposed:
            perm = tuple(range(len(batch))) + (len(batch) + 1, len(batch))
            x = g.add("transpose", [x], batch + (rows, cols), "f32", {"perm": perm})
        return x
    a = operand("a", m, k, "ta" in flags)
    b = operand("b", k, n, "tb" in flags)
    g.outputs["out"] = g.add("matmul", [a, b], batch + (m, n), "f32")
    limits = Limits.from_host(host.limits)
    limits.adapter = host.info  # the adapter's row of matmul_config.ADAPTER_TILINGS, as the backend does
    limits.options = (table_variant(host.info, config) if isinstance(config, dict)  # the tiling
                      else KernelOptions(force_config=config))                    # compared
    low, names = lower(g, limits)
    return low, names[0]


def time_webgpu(host, program: int, reps: int, warmup: int) -> float:
    """Seconds per matmul: `reps` dispatches in one submission, wall clock to work done."""
    p = host._programs[program]
    dispatches = [c[1:] for c in p.commands if c[0] == "dispatch"]  # split-K: two kernels
    dev = host.device
    probe = p.buffers[0]

    def wait():
        try:
            dev.queue.on_submitted_work_done_sync()
        except TypeError:  # wgpu-py 0.32 on some wgpu-native builds: read a few bytes instead
            dev.queue.read_buffer(probe, 0, 16)

    def submit():
        enc = dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        for _ in range(reps):
            for pipe, bg, wg in dispatches:
                cp.set_pipeline(pipe)
                cp.set_bind_group(0, bg)
                cp.dispatch_workgroups(*wg)
        cp.end()
        t0 = time.perf_counter()
        dev.queue.submit([enc.finish()])
        wait()
        return time.perf_counter() - t0
    for _ in range(warmup):
        submit()
    return min(submit() for _ in range(3)) / reps


def time_torch(torch, A, B, reps: int, warmup: int) -> float:
    for _ in range(warmup):
        torch.matmul(A, B)
    if A.is_cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        best = float("inf")
        for _ in range(3):
            start.record()
            for _ in range(reps):
                torch.matmul(A, B)
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end) / 1000 / reps)
        return best
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.matmul(A, B)
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,2048,4096",
                    help="comma-separated: n (square), a name of ISSUE_SHAPES ("
                    + ", ".join(ISSUE_SHAPES) + "), or [Bx]MxKxN[:ta][:tb] (operand stored "
                    "transposed); 'issue' = every ISSUE_SHAPES row and 4096")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--configs", default="auto",
                    help="comma-separated tilings: auto | auto[:eE][:db] (the table's, with "
                    "epi_rows E / double-buffered tiles) | "
                    "TMxTNxBK[:novec][:nopre][:sN][:db][:wXxY][:gG][:vl][:eE][:wt] (N K chunks; db: double-buffered shared memory; X x Y threads (N x M); wt: each warp a 4 x 8 patch of them; "
                    "tile order in runs of G tile rows; vl: vec4 global loads; E: rows of epilogue loads issued together)")
    args = ap.parse_args()
    lib = pick_lib()
    import numpy as np
    import torch
    from webgrad.backends.webgpu_native import NativeHost
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    host = NativeHost()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"webgpu: {host.info}  (library {lib}; Dawn toggles "
          f"{os.environ.get('WEBGRAD_DAWN_TOGGLES', 'default') if lib == 'wgpudawn' else '-'}; device "
              f"toggles {','.join(host.device_toggles) or 'none'})")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}, "
          "fp32, TF32 off")
    print(f"{'shape':>16} {'kernel':>34} {'webgrad ms':>10} {'GFLOP/s':>8} {'torch ms':>9} "
          f"{'GFLOP/s':>8} {'ratio':>6}  max err")
    rng = np.random.default_rng(0)
    sizes = args.sizes.replace("issue", ",".join(list(ISSUE_SHAPES) + ["4096"]))
    from webgrad.compiled import run_blocking
    for text in sizes.split(","):
        shape = parse_shape(text)
        label, batch, m, k, n, flags = shape
        A = rng.standard_normal(batch + (m, k), dtype=np.float32)
        B = rng.standard_normal(batch + (k, n), dtype=np.float32)
        # what the graph's inputs hold: the stored (maybe transposed) operands
        Ain = np.ascontiguousarray(np.swapaxes(A, -1, -2)) if "ta" in flags else A
        Bin = np.ascontiguousarray(np.swapaxes(B, -1, -2)) if "tb" in flags else B
        tA, tB = torch.from_numpy(Ain).to(dev), torch.from_numpy(Bin).to(dev)
        if "ta" in flags:
            tA = tA.transpose(-1, -2)
        if "tb" in flags:
            tB = tB.transpose(-1, -2)
        t_torch = time_torch(torch, tA, tB, args.reps, args.warmup)
        rows = np.unique(np.linspace(0, m - 1, 8).astype(int))
        want = (torch.from_numpy(np.ascontiguousarray(A[..., rows, :])).double()
                @ torch.from_numpy(B).double()).numpy()
        extra = {}
        kind = next((f for f in EPILOGUES[::-1] if f in flags.split(":")), None)
        if kind:  # the epilogue's inputs, and its float64 result on the sampled rows
            extra["bias"] = rng.standard_normal(n, dtype=np.float32)
            if kind == "geluback":
                extra["pre"] = rng.standard_normal(batch + (m, n), dtype=np.float32)
            want = epilogue_want(kind, A[..., rows, :], B, extra["bias"],
                                 extra["pre"][..., rows, :] if "pre" in extra else None)
        for ctext in args.configs.split(","):
            low, name = build(host, shape, parse_config(ctext))
            prog = host.load(low.plan)
            host.write(prog, low.feeds["a"], Ain.tobytes())
            host.write(prog, low.feeds["b"], Bin.tobytes())
            for nm, arr in extra.items():
                if nm in low.feeds:
                    host.write(prog, low.feeds[nm], arr.tobytes())
            buf = low.outputs["out"][0]
            out = run_blocking(host.run(prog, {}, [buf]))[0]
            C = np.frombuffer(out, np.float32, len(out) // 4)[:int(np.prod(batch + (m, n)))]
            C = C.reshape(batch + (m, n))
            err = float(np.max(np.abs(C[..., rows, :] - want) / (1 + np.abs(want))))
            t = time_webgpu(host, prog, args.reps, args.warmup)
            host.unload(prog)
            flop = 2.0 * int(np.prod(batch or (1,))) * m * n * k
            tiling = name.split(" K=")[-1].split(" ", 1)[-1] + ("" if ctext == "auto" else f" ({ctext})")
            print(f"{label:>16} {tiling:>34} {t * 1e3:>10.3f} {flop / t / 1e9:>8.0f} "
                  f"{t_torch * 1e3:>9.3f} {flop / t_torch / 1e9:>8.0f} {t_torch / t:>6.2f}  "
                  f"{err:.1e}" + ("  WRONG" if err > 1e-3 else ""), flush=True)


if __name__ == "__main__":
    main()
