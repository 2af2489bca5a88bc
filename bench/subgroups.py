#!/usr/bin/env python3
"""Row reductions through subgroup operations against codegen's shared-memory trees.

    python3 bench/subgroups.py                 # a GPU whose adapter has 'subgroups'

webgrad's row kernels (layer norm, softmax, log-softmax: codegen/reduce.py) give a row to a
workgroup of 256 threads, each thread strides over the row, and a shared-memory tree adds
(or maxes) the 256 partials: 8 steps, 9 barriers, per reduction. With subgroups, each
subgroup of 32 lanes reduces in registers (subgroupAdd / subgroupMax), one partial per
subgroup goes to shared memory, and one more subgroup operation finishes: 3 barriers. This
bench takes the WGSL codegen emits for a row op, rewrites each tree into that form (the
rest of the kernel is unchanged), checks that both give the same result, and times both
(wall clock around --reps back-to-back dispatches in one submission, best of 3, as
bench/matmul.py). It decides whether codegen should emit subgroup reductions: see
bench/README.md and codegen/matmul.py's header for the figures.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pkg"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CASES = {  # name: (op, rows, row length)
    "layer_norm 16384x512": ("layer_norm_last", 16384, 512),
    "layer_norm 4096x768": ("layer_norm_last", 4096, 768),
    "log_softmax 4096x50257": ("log_softmax_last", 4096, 50257),
    "softmax 49152x512": ("softmax_last", 49152, 512),
}

_TREE_HEAD = re.compile(r"^(\s*)red\[lid\] = (.+);$")
_TREE_STEP = re.compile(r"^\s*if \(lid < (\d+)u\) \{ red\[lid\] = (.+); \}$")


def subgroup_rewrite(wgsl: str, wgs: int = 256) -> str:
    """Each shared-memory tree `red[lid] = x; barrier; if (lid < 128u) {...} ... barrier;`
    becomes a subgroup reduction of x, one partial per subgroup in red, and a subgroup
    reduction of those partials into red[0] (what the code after a tree reads)."""
    lines = wgsl.splitlines()
    out, k, trees = [], 0, 0
    while k < len(lines):
        m = _TREE_HEAD.match(lines[k])
        steps = []
        j = k + 1
        while m and j + 1 < len(lines) and lines[j].strip() == "workgroupBarrier();" \
                and _TREE_STEP.match(lines[j + 1]):
            steps.append(_TREE_STEP.match(lines[j + 1]))
            j += 2
        if not m or not steps or steps[-1].group(1) != "1":
            out.append(lines[k])
            k += 1
            continue
        ind, x = m.group(1), m.group(2)
        op, ident = ("subgroupMax", "bitcast<f32>(wg_ninf_bits)") if "max(" in steps[0].group(2) \
            else ("subgroupAdd", "0.0f")
        out += [f"{ind}{{ let sv = {op}({x}); if (sgi == 0u) {{ red[lid / sgs] = sv; }} }}",
                f"{ind}workgroupBarrier();",
                f"{ind}{{ let st = {op}(select({ident}, red[sgi], sgi < {wgs}u / sgs));",
                f"{ind}  workgroupBarrier();",
                f"{ind}  if (lid == 0u) {{ red[0] = st; }} }}"]
        trees += 1
        k = j  # the tree's last barrier is kept (next line)
    assert trees, "no shared-memory tree found"
    text = "\n".join(out)
    text = text.replace("@builtin(local_invocation_index) lid: u32)",
                        "@builtin(local_invocation_index) lid: u32, "
                        "@builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32)")
    return "enable subgroups;\n" + text


def build(host, op, rows, d):
    from webgrad.codegen import Limits, lower
    from webgrad.ir import Graph
    g = Graph()
    x = g.add("input", [], (rows, d), "f32", {"name": "x", "shape": (rows, d), "dtype": "f32"})
    attrs = {"eps": 1e-5} if op == "layer_norm_last" else {}
    g.outputs["out"] = g.add(op, [x], (rows, d), "f32", attrs)
    limits = Limits.from_host(host.limits)
    limits.adapter = host.info
    low, names = lower(g, limits)
    return low


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    from matmul import pick_lib, time_webgpu
    lib = pick_lib()
    import numpy as np
    import webgrad.backends.webgpu_native as wn
    wn._WANTED_FEATURES = tuple(wn._WANTED_FEATURES) + ("subgroups",)
    from webgrad.backends.webgpu_native import NativeHost
    from webgrad.compiled import run_blocking
    host = NativeHost()
    print(f"webgpu: {host.info}  (library {lib})")
    if "subgroups" not in host._dev.features:
        sys.exit("this adapter has no 'subgroups' feature")
    print(f"{'case':>24} {'tree ms':>9} {'subgroup ms':>12} {'ratio':>6}  GB/s tree/subgroup  max diff")
    rng = np.random.default_rng(0)
    for name in args.cases.split(","):
        op, rows, d = CASES[name]
        x = rng.standard_normal((rows, d), dtype=np.float32)
        low = build(host, op, rows, d)
        res = []
        for variant in ("tree", "subgroup"):
            plan = dict(low.plan)
            if variant == "subgroup":
                plan["pipelines"] = [dict(p, wgsl=subgroup_rewrite(p["wgsl"])) for p in plan["pipelines"]]
            prog = host.load(plan)
            host.write(prog, low.feeds["x"], x.tobytes())
            out = run_blocking(host.run(prog, {}, [low.outputs["out"][0]]))[0]
            y = np.frombuffer(out, np.float32, rows * d)
            t = time_webgpu(host, prog, args.reps, 2)
            host.unload(prog)
            res.append((t, y))
        (ta, ya), (tb, yb) = res
        gb = 2 * 4 * rows * d / 1e9  # read once, write once (at least)
        print(f"{name:>24} {ta * 1e3:>9.4f} {tb * 1e3:>12.4f} {tb / ta:>6.2f}  "
              f"{gb / ta:>6.0f} / {gb / tb:<6.0f}  {np.max(np.abs(ya - yb)):.1e}", flush=True)


if __name__ == "__main__":
    main()
