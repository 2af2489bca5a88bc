"""Parameter initialisation as a device program: init.py's generator in WGSL.

`init_plan(items, limits, persist_key)` returns a Plan (backends/gpu_host.py) with one
dispatch per parameter that fills the parameter's *persistent* buffer in place, from the
stream key and f32 multiplier that `init.recipe` computed on the host. Loaded on the same
host as the training program, the plan names the same persistent keys, so it writes the
very buffers the step reads: nothing crosses the bus but 16 bytes of arguments per
parameter (GPT-2's 124M values were generated in pure Python and uploaded before). The
arithmetic is init.py's, operation for operation (u32 hashes, one f32 product), so the
device's values are bit-identical to the CPU executors'.

Each kernel is a grid-stride loop over the parameter; its arguments (n, key, multiplier
bits, the grid's stride) sit in a small storage buffer, so there is one pipeline per init
kind (zeros, ones, uniform, randn), not one per parameter.
"""
from __future__ import annotations

import struct
from math import prod

from ..buffers import align
from .random import HASH_WGSL
from .wgsl import Kernel, Limits

WG = 256
MAX_GROUPS = 4096  # enough to fill any GPU; more only adds loop-free workgroups

_BODY = {
    "zeros": "0.0f",
    "ones": "1.0f",
    # init.py: (int(H(key + i) >> 8) - 2^23) * mul
    "uniform": "f32(i32(lowbias32(key + i) >> 8u) - 8388608) * mul",
    # init.py: the four 16-bit halves of H(key + 2i), H(key + 2i + 1), centred, times mul
    "randn": None,
}


def _kernel(kind: str, limits: Limits) -> str:
    k = Kernel(limits, f"init {kind}")
    out = k.binding(0, "f32", write=True, what="the parameter")
    args = k.binding(1, "i32", what="init arguments")
    lines = [f"  let n = u32({args}[0]);",
             f"  let key = bitcast<u32>({args}[1]);",
             f"  let mul = bitcast<f32>({args}[2]);",
             f"  let stride = u32({args}[3]);",
             f"  for (var i = wid.x * {WG}u + lid; i < n; i += stride) {{"]
    if kind == "randn":
        k.helper("lowbias32", HASH_WGSL)
        lines += ["    let a = lowbias32(key + 2u * i);",
                  "    let b = lowbias32(key + 2u * i + 1u);",
                  "    let s = i32((a & 0xFFFFu) + (a >> 16u) + (b & 0xFFFFu) + (b >> 16u)) - 131070;",
                  f"    {out}[i] = f32(s) * mul;"]
    else:
        if kind == "uniform":
            k.helper("lowbias32", HASH_WGSL)
        lines.append(f"    {out}[i] = {_BODY[kind]};")
    lines.append("  }")
    # keep every argument used (an unused binding would drop out of the auto layout)
    lines.append(f"  if (n == 0u && key == 1u && mul == 2.0f) {{ {out}[0] = 0.0f; }}")
    return k.source(lines, workgroup_size=WG)


def init_plan(items, limits: Limits, persist_key) -> tuple[dict, list[tuple[int, bytes]]]:
    """items: [(persistent name, shape, (kind, key, mul))] with kind zeros/ones/uniform/randn.
    Returns (plan, [(buffer id, bytes to write before running)])."""
    buffers, pipelines, commands, writes = [], [], [], []
    pipe_of: dict[str, int] = {}
    for name, shape, (kind, key, mul) in items:
        n = prod(shape)
        groups = max(1, min(-(-n // WG), MAX_GROUPS, limits.max_compute_workgroups_per_dimension))
        buffers.append({"size": align(4 * n), "label": name, "persistent": persist_key(name)})
        buffers.append({"size": 16, "label": f"init args of {name}"})
        writes.append((len(buffers) - 1, struct.pack("<iIfi", n, key, mul, groups * WG)))
        if kind not in pipe_of:
            pipe_of[kind] = len(pipelines)
            pipelines.append({"wgsl": _kernel(kind, limits)})
        commands.append({"op": "dispatch", "pipeline": pipe_of[kind],
                         "bindings": [len(buffers) - 2, len(buffers) - 1],
                         "workgroups": [groups, 1, 1]})
    return {"buffers": buffers, "pipelines": pipelines, "commands": commands}, writes


__all__ = ["init_plan"]
