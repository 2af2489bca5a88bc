#!/usr/bin/env python3
"""Where a training step's GPU time goes, per category, webgrad against torch.

    python3 bench/gpt2_train.py --rows small64,gpt2 --dump DIR   # on the GPU machine: writes
        DIR/<row>_webgrad.json (every kernel of webgrad's step, GPU times of --dump-reps
        profiled steps) and DIR/<row>_torch.json.gz (torch.profiler's Chrome trace of one
        step: CUDA kernels with the CPU ops that launched them)
    python3 bench/step_breakdown.py DIR [--rows gpt2] [--top 8]   # anywhere: the table
    python3 bench/step_breakdown.py DIR --matmuls   # and every product, by shape, both sides

Both sides are grouped into the same categories, so the table says where webgrad loses:
  forward matmuls, backward matmuls (webgrad's weight gradients carry the AdamW update of
  their weight in the epilogue), LM head products (any product with a vocabulary-sized
  dimension, forward and backward), attention (webgrad's fused kernels; torch's bmm, mask,
  scale and softmax and their backward), layer norm, GELU/elementwise, cross-entropy,
  embedding (gather and its scatter-add gradient), optimizer (webgrad: the AdamW kernels
  not fused into a matmul, with the bias-gradient sums folded into them; torch: the
  foreach AdamW kernels), reductions (torch's bias-gradient sums, other sums), copies
  (torch's layout copies of transposes and the loss read back; webgrad's end-of-step copies).
webgrad's fusion puts work of one category into another's kernel (GELU into the MLP
product, bias adds into the products, AdamW into weight gradients): compare the sums too.

webgrad's kernels are classified from the IR nodes each covers (the dump records them:
a matmul after the loss node is a backward product); torch's from the op stack of the
launching CPU op (autograd's "evaluate_function: XBackward0" frames, the optimizer's
"Optimizer.step" frame) and the input shapes. Dawn quantises timestamps (65.5 us on the
H200 unless the bench turns that off): per-kernel times are then noisy, sums over a
category stay right on average; the dump's webgrad times are means over several steps.
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

CATEGORIES = ("forward matmuls", "backward matmuls", "LM head products", "attention",
              "layer norm", "GELU/elementwise", "cross-entropy", "embedding", "optimizer",
              "reductions", "copies", "other")


# ---------------------------------------------------------------- dumping (GPU machine)

def capture_graphs() -> None:
    """Keep each Lowered's (rewritten) IR graph as `lowered.graph_ir`, so a dump can say
    which nodes each kernel covers. Call before compiling."""
    from webgrad.codegen import program
    if getattr(program._Lowering.build, "_keeps_graph", False):
        return
    orig = program._Lowering.build

    def build(self, *args, **kw):
        low, names = orig(self, *args, **kw)
        low.graph_ir = self.g
        return low, names
    build._keeps_graph = True
    program._Lowering.build = build


def webgrad_dump(c, feed, reps: int, vocab: int) -> dict:
    """Every kernel of a CompiledModule's step: the profile's columns, GPU seconds of
    `reps` profiled steps, and the IR nodes it covers (op, shape, id)."""
    low = c._train.exe.lowered
    g = getattr(low, "graph_ir", None)
    profiles = [c.profile(feed) for _ in range(reps)]
    wb = set(g.writebacks.values()) if g is not None else set()
    kernels = []
    for k, row in enumerate(profiles[0].rows):
        nodes = [[n, g[n].op, list(g[n].shape)] for n in row.nodes] if g is not None else []
        kernels.append({"name": row.name, "ops": row.ops, "workgroups": row.workgroups,
                        "bytes": row.bytes, "flops": row.flops,
                        "seconds": [p.rows[k].seconds for p in profiles],
                        "nodes": nodes, "writeback": any(n in wb for n in row.nodes)})
    return {"kernels": kernels, "loss": g.outputs.get("loss") if g is not None else None,
            "vocab": vocab, "timing": profiles[0].timing, "info": profiles[0].info}


def torch_dump(torch, step, path: Path) -> None:
    """torch.profiler (CPU and CUDA activities, input shapes) around one call of `step`,
    its Chrome trace gzipped to `path`."""
    import os
    import tempfile
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        step()
        torch.cuda.synchronize()
    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        with open(tmp, "rb") as f, gzip.open(path, "wb") as out:
            out.write(f.read())
    finally:
        os.unlink(tmp)


# ---------------------------------------------------------------- classifying

def _matmul_dims(name: str) -> list[int]:
    """The numbers of a webgrad matmul kernel's name: 'matmul 8x512x768 K=50257 ...'."""
    head = name.split(" tile")[0].split(" direct")[0].split(" sum of")[0]
    nums = []
    for part in head.replace("matmul", "").replace("K=", "x").split("x"):
        part = part.strip()
        if part.isdigit():
            nums.append(int(part))
    return nums


def webgrad_category(k: dict, loss: int | None, vocab: int) -> str:
    name, ops = k["name"], k["ops"]
    opset = set(ops.split("+"))
    if ops == "copy" or name.startswith("copy"):
        return "copies"
    if name.startswith("attn") or any(o.startswith("attn_") for o in opset):
        return "attention"
    if "matmul" in opset or name.startswith("matmul"):
        # the vocabulary, or its padded width (codegen/align_match.py: 50257 -> 50304)
        if any(vocab <= d < vocab + 128 for d in _matmul_dims(name)):
            return "LM head products"
        mm = [n for n, op, _ in k["nodes"] if op == "matmul"]
        if mm and loss is not None and max(mm) > loss:
            return "backward matmuls"
        return "forward matmuls"
    if opset & {"logsumexp_last", "one_hot", "pick_last"} or "cross" in name:
        return "cross-entropy"
    if any(o.startswith("layer_norm") for o in opset) or name.startswith("layer_norm"):
        return "layer norm"
    if opset & {"gather_rows", "scatter_add_rows"}:
        return "embedding"
    if k["writeback"]:
        return "optimizer"
    if name.startswith("sum") or "sum" in opset:
        return "reductions"
    return "GELU/elementwise"


def webgrad_rows(dump: dict) -> list[tuple[str, str, float]]:
    """(category, kernel name [ops], mean GPU ms) per kernel."""
    out = []
    for k in dump["kernels"]:
        ts = [t for t in k["seconds"] if t is not None]
        ms = 1e3 * statistics.fmean(ts) if ts else 0.0
        out.append((webgrad_category(k, dump["loss"], dump["vocab"]), f"{k['name']} [{k['ops']}]", ms))
    return out


_GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")
_ATTN = ("aten::_softmax", "aten::softmax", "aten::masked_fill", "aten::triu", "aten::ones",
         "SoftmaxBackward", "MaskedFillBackward", "BmmBackward", "aten::_softmax_backward_data")


def torch_rows(trace: dict, vocab: int) -> list[tuple[str, str, float]]:
    """(category, kernel name, GPU ms) per CUDA kernel (and memcpy/memset) of the trace."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    host = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    by_ext: dict[int, dict] = {}
    for e in host:
        x = e.get("args", {}).get("External id")
        if x is not None and e.get("cat") == "cpu_op":
            if x not in by_ext or e["dur"] < by_ext[x]["dur"]:
                by_ext[x] = e
    by_thread = defaultdict(list)
    for e in host:
        by_thread[(e["pid"], e["tid"])].append(e)
    # annotations on the GPU's timeline ("gpu_user_annotation") are no kernels
    dev = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    out = []
    for e in dev:
        name = e["name"]
        ms = e["dur"] / 1e3
        if e["cat"] != "kernel":
            out.append(("copies", name, ms))
            continue
        op = by_ext.get(e.get("args", {}).get("External id"))
        stack: list[dict] = []
        if op is not None:
            t0, t1 = op["ts"], op["ts"] + op["dur"]
            stack = sorted((h for h in by_thread[(op["pid"], op["tid"])]
                            if h["ts"] <= t0 and h["ts"] + h["dur"] >= t1), key=lambda h: -h["dur"])
        out.append((torch_category(name, op, stack, vocab), name, ms))
    return out


def _dims(op) -> list[int]:
    dims = (op or {}).get("args", {}).get("Input Dims") or []
    flat = []
    for d in dims:
        if isinstance(d, list):
            flat += [v for v in d if isinstance(v, int)]
    return flat


def torch_category(kname: str, op, stack: list[dict], vocab: int) -> str:
    names = [h["name"] for h in stack]
    joined = " | ".join(names)
    if "Optimizer.step" in joined or "_foreach" in joined or "multi_tensor_apply" in kname:
        return "optimizer"
    opname = op["name"] if op else ""
    gemm = any(k in kname.lower() for k in ("gemm", "cutlass", "xmma", "nvjet", "cublas")) \
        or (opname in _GEMM_OPS and "reduce" not in kname.lower())
    backward = "Backward" in joined or "evaluate_function" in joined
    if any(a in joined for a in _ATTN) or (gemm and "bmm" in joined):
        return "attention"
    if gemm:
        if vocab in _dims(op) or any(vocab in _dims(h) for h in stack):
            return "LM head products"
        return "backward matmuls" if backward else "forward matmuls"
    if "layer_norm" in joined or "LayerNorm" in joined:
        return "layer norm"
    if any(k in joined for k in ("log_softmax", "nll_loss", "LogSoftmax", "NllLoss", "cross_entropy")):
        return "cross-entropy"
    if "embedding" in joined.lower():
        return "embedding"
    if "gelu" in joined.lower():
        return "GELU/elementwise"
    if "aten::mul" in joined or "MulBackward" in joined:  # the score scale
        return "attention"
    if any(k in joined for k in ("aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy")):
        return "copies"
    if "aten::sum" in joined or "reduce" in kname.lower():
        return "reductions"
    if any(k in joined for k in ("aten::add", "aten::fill_", "aten::zero", "aten::zeros")):
        return "GELU/elementwise"
    return "other"


# ---------------------------------------------------------------- the table

def table(w_rows, t_rows, top: int = 0) -> str:
    w, t = defaultdict(float), defaultdict(float)
    wn, tn = defaultdict(int), defaultdict(int)
    for c, _, ms in w_rows:
        w[c] += ms
        wn[c] += 1
    for c, _, ms in t_rows:
        t[c] += ms
        tn[c] += 1
    lines = ["| category | webgrad ms (kernels) | torch ms (kernels) | webgrad - torch ms | ratio |",
             "|---|---|---|---|---|"]
    for c in CATEGORIES:
        if not (wn[c] or tn[c]):
            continue
        ratio = f"{w[c] / t[c]:.2f}" if t[c] else "-"
        lines.append(f"| {c} | {w[c]:.2f} ({wn[c]}) | {t[c]:.2f} ({tn[c]}) | {w[c] - t[c]:+.2f} | {ratio} |")
    W, T = sum(w.values()), sum(t.values())
    lines.append(f"| total GPU time | {W:.2f} ({sum(wn.values())}) | {T:.2f} ({sum(tn.values())}) "
                 f"| {W - T:+.2f} | {W / T if T else float('nan'):.2f} |")
    if top:
        for who, rows in (("webgrad", w_rows), ("torch", t_rows)):
            for c in CATEGORIES:
                mine = sorted((r for r in rows if r[0] == c), key=lambda r: -r[2])[:top]
                if mine:
                    lines.append(f"\n{who}, {c}: " + "; ".join(f"{ms:.3f} {n[:90]}" for _, n, ms in mine))
    return "\n".join(lines)


def matmul_lines(dump: dict, trace: dict | None) -> str:
    """Both sides' products by shape: count x mean ms, total, TFLOP/s (webgrad: the
    kernel's name and ops; torch: the aten op and its input shapes, the kernel)."""
    agg = defaultdict(lambda: [0, 0.0, 0])
    for k in dump["kernels"]:
        if k["name"].startswith("matmul"):
            ts = [t for t in k["seconds"] if t is not None]
            a = agg[(k["name"], k["ops"][:40])]
            a[0] += 1
            a[1] += 1e3 * statistics.fmean(ts) if ts else 0.0
            a[2] = max(a[2], k["flops"])
    lines = ["webgrad products: n x ms, total ms, TFLOP/s, kernel [ops]"]
    for (name, ops), (n, ms, fl) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        tf = fl / (ms / n) / 1e9 if ms else 0.0
        lines.append(f"  {n:3d} x {ms / n:7.4f} {ms:7.2f} {tf:6.1f}  {name} [{ops}]")
    if trace is None:
        return "\n".join(lines)
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    by_ext: dict[int, dict] = {}
    for e in events:
        x = e.get("args", {}).get("External id")
        if e.get("cat") == "cpu_op" and x is not None and (x not in by_ext or e["dur"] < by_ext[x]["dur"]):
            by_ext[x] = e
    tagg = defaultdict(lambda: [0, 0.0])
    for e in events:
        op = by_ext.get(e.get("args", {}).get("External id")) if e.get("cat") == "kernel" else None
        if op is not None and op["name"] in ("aten::mm", "aten::addmm", "aten::bmm"):
            a = tagg[(op["name"], str(op["args"].get("Input Dims")), e["name"][:50])]
            a[0] += 1
            a[1] += e["dur"] / 1e3
    lines.append("torch products: n x ms, total ms, op [input dims] kernel")
    for (op, dims, kname), (n, ms) in sorted(tagg.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"  {n:3d} x {ms / n:7.4f} {ms:7.2f}  {op} {dims} {kname}")
    return "\n".join(lines)


def load(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--rows", default=None, help="comma-separated rows (default: every dump)")
    ap.add_argument("--top", type=int, default=0, help="list each category's N longest kernels")
    ap.add_argument("--matmuls", action="store_true", help="list both sides' products by shape")
    args = ap.parse_args()
    rows = args.rows.split(",") if args.rows else sorted(
        p.name[:-len("_webgrad.json")] for p in args.dir.glob("*_webgrad.json"))
    for row in rows:
        wd = load(args.dir / f"{row}_webgrad.json")
        tp = args.dir / f"{row}_torch.json.gz"
        trace = load(tp) if tp.exists() else None
        t_rows = torch_rows(trace, wd["vocab"]) if trace is not None else []
        print(f"\n### {row} ({wd['timing']} timing, {wd['info']})\n")
        print(table(webgrad_rows(wd), t_rows, args.top))
        if args.matmuls:
            print("\n" + matmul_lines(wd, trace))


if __name__ == "__main__":
    sys.exit(main())
