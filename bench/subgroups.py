#!/usr/bin/env python3
"""Row reductions through subgroup operations against codegen's shared-memory trees.

    python3 bench/subgroups.py                 # a GPU whose adapter has 'subgroups'

webgrad's row kernels (layer norm and its backward, softmax, log-softmax, the one-pass
logsumexp of cross entropy: codegen/reduce.py, codegen/rowfuse.py) give a row to a workgroup
(of about a thread per 8 elements, at most 256: KernelOptions.row_elems); each thread strides over
the row, then the workgroup combines the threads' partials. The tree form adds (or maxes)
them in shared memory: log2(threads) steps, a barrier each. The subgroup form
(codegen/wgsl.py, workgroup_reduce, emitted where the device has 'subgroups'): each
subgroup reduces in registers, one lane per subgroup writes its total (every other lane
the identity: no slot assumes how invocations form subgroups), one barrier, and each lane
folds every n-th slot before one more subgroup operation. This bench
lowers each case both ways (KernelOptions(subgroups=False / True)) in one process, plus
"dense": the tree text rewritten so that subgroup k writes slot k, which assumes subgroups
are runs of local_invocation_index (true on the GPUs at hand, promised by no API: what the
robust form's extra reads cost). It checks the forms agree and times each (wall clock
around --reps back-to-back dispatches in one submission, best of 3, as bench/matmul.py).
The GPT-2 124M step at 8 x 512 runs 25 layer norms and 25 layer-norm backwards over
[4096, 768] and one logsumexp over [4096, 50257]: the last line sums those.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pkg"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CASES = {  # name: (op, rows, row length, count in the GPT-2 step)
    "layer_norm 4096x768": ("layer_norm_last", 4096, 768, 25),
    "layer_norm_grad 4096x768": ("layer_norm_grad", 4096, 768, 25),
    "logsumexp 4096x50257": ("logsumexp_last", 4096, 50257, 1),
    "log_softmax 4096x50257": ("log_softmax_last", 4096, 50257, 0),
    "softmax 49152x512": ("softmax_last", 49152, 512, 0),
    "layer_norm 16384x512": ("layer_norm_last", 16384, 512, 0),
}

_TREE_HEAD = re.compile(r"^(\s*)red\[lid\] = (.+);$")
_TREE_STEP = re.compile(r"^\s*if \(lid < (\d+)u\) \{ red\[lid\] = (.+); \}$")


def dense_rewrite(wgsl: str, wgs: int = 256) -> str | None:
    """Each shared-memory tree `red[lid] = x; barrier; if (lid < 128u) {...} ... barrier;`
    becomes a subgroup reduction of x, subgroup lid / size's total in red[lid / size], and a
    subgroup reduction of those into red[0] (assumes subgroups are runs of lid and size^2 >=
    wgs). None where the kernel has no such tree (logsumexp's pair tree)."""
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
    if not trees:
        return None
    text = "\n".join(out)
    text = text.replace("@builtin(local_invocation_index) lid: u32)",
                        "@builtin(local_invocation_index) lid: u32, "
                        "@builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32)")
    return "enable subgroups;\n" + text


def build(limits, op, rows, d, subgroups: bool):
    from dataclasses import replace

    from webgrad.codegen import KernelOptions, lower
    from webgrad.ir import Graph
    g = Graph()
    ins = [g.add("input", [], (rows, d), "f32", {"name": n, "shape": (rows, d), "dtype": "f32"})
           for n in (("x", "g") if op == "layer_norm_grad" else ("x",))]
    attrs = {"eps": 1e-5} if op in ("layer_norm_last", "layer_norm_grad") else {}
    shape = (rows,) if op == "logsumexp_last" else (rows, d)
    g.outputs["out"] = g.add(op, ins, shape, "f32", attrs)
    return lower(g, replace(limits, options=KernelOptions(subgroups=subgroups)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rows", type=int, default=0, help="override every case's row count")
    args = ap.parse_args()
    from matmul import pick_lib, time_webgpu
    lib = pick_lib()
    import numpy as np
    from webgrad.backends.webgpu import WebGPUBackend
    from webgrad.backends.webgpu_native import NativeHost
    from webgrad.compiled import run_blocking
    host = NativeHost()
    limits = WebGPUBackend(host).limits  # the backend's own: cpu, adapter, subgroups
    print(f"webgpu: {host.info}  (library {lib}); device features: {sorted(host.features)}")
    have = "subgroups" in host.features
    if not have:
        print("this device has no 'subgroups': the tree form only")
    print(f"{'case':>26} {'tree ms':>9} {'subgroups':>10} {'ratio':>6} {'dense':>8} {'ratio':>6}"
          f"  {'kernel':<28} max diff")
    rng = np.random.default_rng(0)
    step = {"tree": 0.0, "subgroups": 0.0}
    for name in args.cases.split(","):
        op, rows, d, count = CASES[name]
        rows = args.rows or rows
        feeds = {}
        times, outs = {}, {}
        for variant in ("tree", "subgroups", "dense") if have else ("tree",):
            low, names = build(limits, op, rows, d, variant == "subgroups")
            plan = dict(low.plan)
            if variant == "dense":
                texts = [dense_rewrite(p["wgsl"], int(re.search(r"@workgroup_size\((\d+)",
                                                                p["wgsl"]).group(1)))
                         for p in plan["pipelines"]]
                if None in texts:
                    continue
                plan["pipelines"] = [dict(p, wgsl=t) for p, t in zip(plan["pipelines"], texts)]
            wg_text = plan["pipelines"][0]["wgsl"]
            assert ("subgroup" in wg_text) == (variant != "tree"), (variant, names)
            try:
                prog = host.load(plan)
            except Exception as e:  # one form failing to compile still leaves the others
                print(f"{name}: {variant} failed: {str(e)[:400]}", flush=True)
                continue
            for f in low.feeds:
                if f not in feeds:
                    feeds[f] = rng.standard_normal((rows, d), dtype=np.float32)
                host.write(prog, low.feeds[f], feeds[f].tobytes())
            n_out = rows if op == "logsumexp_last" else rows * d
            out = run_blocking(host.run(prog, {}, [low.outputs["out"][0]]))[0]
            outs[variant] = np.frombuffer(out, np.float32, n_out).copy()
            times[variant] = time_webgpu(host, prog, args.reps, 2)
            host.unload(prog)
        ta = times["tree"]
        tb = times.get("subgroups", float("nan"))
        tc = times.get("dense", float("nan"))
        diff = max((float(np.max(np.abs(outs[v] - outs["tree"]))) for v in outs if v != "tree"),
                   default=0.0)
        print(f"{name:>26} {ta * 1e3:>9.4f} {tb * 1e3:>10.4f} {tb / ta:>6.2f} {tc * 1e3:>8.4f} "
              f"{tc / ta:>6.2f}  {names[0]:<28} {diff:.1e}", flush=True)
        step["tree"] += count * ta
        step["subgroups"] += count * tb
    if step["tree"]:
        print(f"GPT-2 step's row kernels (25 layer norms + 25 backwards + logsumexp): tree "
              f"{step['tree'] * 1e3:.2f} ms, subgroups {step['subgroups'] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
