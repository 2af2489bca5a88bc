"""The tiled attention kernels in parts (codegen/attention_tiled*.py): its plan, each piece
checked against an independent emulation, and each code path the plan picks run whole.

Device-free: the plan's WGSL index expressions are evaluated in Python (integer arithmetic,
as WGSL's u32 / i32) for every thread and compared with what the kernel needs: each thread
grid covers a block's rows, columns and output columns exactly once, in the vector layout
the products read; the workgroup arrays fit the adapter's workgroup memory and are those
the lowered kernels declare; the streamed range of each causal block holds every key the
causal mask (numpy) keeps for its rows and no block without one, and the score mask equals
numpy's. On the native adapter: for each code path of the plan (row reductions in As read
as vec4 / vec2 / scalars, or in an array of their own; X staged whole; vec4 reads of X; an
epilogue per product of an assembled gradient), a record whose kernels take it, checked
first (the plan says so) and then forward and gradients against torch.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import oracle
from webgrad.codegen import KernelOptions, Limits, lower
from webgrad.codegen.attention_match import ATTN_OPS, rewrite_attention
from webgrad.codegen.attention_tiled_plan import padded, plan_of, plan_tiled, shared_bytes
from webgrad.compile import build_train_graph, parse_inputs

OPS = ("attn_lse", "attn_out", "attn_fwd", "attn_dq", "attn_dv", "attn_dk", "attn_dkv")


def wgsl_int(expr: str, **env):
    """A WGSL expression over u32 / i32 values (literals 3u, 3i; i32(), u32(), clamp, &&),
    evaluated on Python integers or numpy integer arrays (each && term on its own). The
    plan's expressions use + - * and comparisons only."""
    py = re.sub(r"\b(\d+)[ui]\b", r"\1", expr)
    assert "/" not in py and "%" not in py and ">>" not in py, expr
    py = re.sub(r"\b[ui]32\(", "(", py)
    names = {"clamp": np.clip, **env}
    terms = [eval(t, {"__builtins__": {}}, names) for t in py.split("&&")]
    out = terms[0]
    for t in terms[1:]:
        out = out & t
    return out


def _plans():
    """Plans over the ops, extents (odd, one row, long rows, a cache), workgroup memory,
    thread grids and prefetches."""
    extents = [(37, 37, 33, 7), (70, 70, 32, 32), (6, 6, 8, 8), (1, 9, 64, 64),
               (1024, 1024, 64, 64), (5, 70, 80, 80), (20, 75, 16, 5), (128, 128, 128, 128)]
    for op in OPS:
        for T, S, D, Dv in extents:
            for mem in (16384, 49152):
                for threads in (None, (8, 16), (8, 8)):
                    for prefetch in (False, True):
                        opts = KernelOptions(
                            attn_prefetch=prefetch,
                            attn_threads=None if threads is None else {op: threads})
                        lim = Limits(max_compute_workgroup_storage_size=mem, options=opts)
                        yield mem, plan_tiled(op, T=T, S=S, D=D, Dv=Dv, batch=(2, 3),
                                              scale=0.125, offset=S - T if T <= S else 0,
                                              online=op in ("attn_out", "attn_fwd"), limits=lim)


PLANS = list(_plans())


def test_thread_indices_cover_the_tile_once():
    """Every thread grid covers the block's BR rows, BC columns and each product's output
    columns exactly once; a thread's rows a = h WR + i are word i of vector WY h + ty (the
    layout As and Ws are read in), and vec4 output columns start at multiples of 4."""
    for _, p in PLANS:
        rows = [wgsl_int(p.row(a), ty=ty) for ty in range(p.WY) for a in range(p.TR)]
        assert sorted(rows) == list(range(p.BR)), p
        for ty in range(p.WY):
            for a in range(p.TR):
                h, i = divmod(a, p.WR)
                assert wgsl_int(p.row(a), ty=ty) == (p.WY * h + ty) * p.WR + i, (p, a)
        cols = [wgsl_int(p.col(b), tx=tx) for tx in range(p.WX) for b in range(p.TC)]
        assert sorted(cols) == list(range(p.BC)), p
        for width, _, _ in p.prods:
            out = [wgsl_int(c, tx=tx) for tx in range(p.WX) for c in p.out_cols(width)]
            assert sorted(out) == list(range(padded(width, p.WX))), (p, width)
            assert padded(width, p.WX) <= p.EP and set(range(width)) <= set(out)
            if p.XV == 4:
                firsts = [wgsl_int(c, tx=tx) for tx in range(p.WX)
                          for e, c in enumerate(p.out_cols(width)) if e % 4 == 0]
                assert all(f % 4 == 0 for f in firsts), p


def test_workgroup_arrays_fit_the_adapter():
    """The declared arrays (words, whole vectors) fit maxComputeWorkgroupStorageSize; without
    X staged whole they are the words choose_blocks counted; staged whole, X and Bs fit in
    As's words."""
    for mem, p in PLANS:
        words = sum(w * n for _, w, n in p.shared_arrays())
        assert 4 * words <= mem, p
        if not p.xw:
            assert 4 * words == shared_bytes(p.op, p.BR, p.BC, p.DK, p.XK, p.EP, p.WX, p.opts), p
        else:
            as_words = dict((n, w * c) for n, w, c in p.shared_arrays())["As"]
            assert p.BC * p.EP <= as_words and p.XK == p.BC, p
            assert p.alias["Bs"][1] + p.DK * p.LDB <= as_words, p


@pytest.mark.parametrize("mem", [16384, 32768, 49152])
def test_lowered_kernels_declare_the_planned_arrays(mem):
    """The kernels lowered for a record declare exactly the plan's workgroup arrays (plus the
    runtime cache position's word), within the adapter's workgroup memory."""
    record = oracle.BY_NAME["attention/cache_position"]
    factory, loss_fn, inputs, _ = oracle.build_record(record)
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    for prefetch in (False, True):
        lim = Limits(adapter="test", max_compute_workgroup_storage_size=mem,
                     options=KernelOptions(attn_tiled=True, attn_prefetch=prefetch))
        fused = rewrite_attention(g, lim)
        plans = {p.name: p for p in (plan_of(n, fused, lim) for n in fused.nodes
                                     if n.op in ATTN_OPS)}
        low, names = lower(g, lim)
        seen = 0
        for pipe, name in zip(low.plan["pipelines"], names):
            if name not in plans:
                continue
            seen += 1
            decls = re.findall(r"var<workgroup> (\w+): array<(f32|vec(\d)<f32>), (\d+)>;",
                               pipe["wgsl"])
            got = [(n, int(w or 1), int(c)) for n, _, w, c in decls]
            assert got == plans[name].shared_arrays(), name
            words = sum(w * c for _, w, c in got) + ("wdyn" in pipe["wgsl"])
            assert 4 * words <= mem, (name, words)
        assert seen == 3, names   # attn_fwd, attn_dq, attn_dkv


def _causal_plans():
    for op in OPS:
        for T, S, off in ((37, 37, 0), (70, 70, 0), (5, 70, 65), (150, 150, 0), (20, 75, 55)):
            for dyn in (False, True):
                for mem in (16384, 49152):
                    lim = Limits(max_compute_workgroup_storage_size=mem)
                    yield plan_tiled(op, T=T, S=S, D=16, Dv=16, offset=off, dyn=dyn,
                                     online=op in ("attn_out", "attn_fwd"), limits=lim)


def test_the_streamed_range_holds_every_kept_key():
    """Each block's [cbeg, cend), stepped BC at a time, visits every streamed row the causal
    mask keeps for one of its own rows (numpy), and no streamed block in which it keeps
    none; the kept() condition is the mask itself (and the streamed extent)."""
    for p in _causal_plans():
        for dyn in ((0, 3, 40) if p.dyn else (0,)):
            i = np.arange(p.T)[:, None]
            j = np.arange(p.S)[None, :]
            mask = j <= i + p.off + dyn                 # [T, S]: key j kept for query i
            own_mask = mask.T if p.per_key else mask    # [own, streamed]
            cbeg_e, cend_e = p.streamed_range()
            for blk in range(p.nblk):
                r0 = blk * p.BR
                cbeg = wgsl_int(cbeg_e, r0=r0, dyn=dyn)
                cend = wgsl_int(cend_e, r0=r0, dyn=dyn)
                own = own_mask[r0:r0 + p.BR]
                kept_cols = np.nonzero(own.any(axis=0))[0]
                visited = [c0 for c0 in range(cbeg, cend, p.BC)]
                if kept_cols.size:
                    assert cbeg <= kept_cols[0] and kept_cols[-1] < cend, (p, blk, dyn)
                for c0 in visited:
                    assert own[:, c0:c0 + p.BC].any(), (p, blk, dyn, c0)
            r = np.arange(p.NR)[:, None]
            c = np.arange(p.NC + 3)[None, :]      # rows past the extent too
            got = np.broadcast_to(wgsl_int(p.kept("r", "c"), r=r, c=c, dyn=dyn),
                                  (p.NR, p.NC + 3))
            want = np.zeros_like(got, dtype=bool)
            want[:, :p.NC] = own_mask
            assert (got == want).all(), (p, dyn)


# ---------------------------------------------------------------- each code path, whole

# (record, options, what the plan must pick for its kernels: {field: value} for all three)
PATHS = {
    "reductions in red": ("attention", dict(red_in_as=False), None,
                          {"red_in_as": False, "WR": 1}),
    "reductions in As, vec2; X rows ragged": ("attention/tiled_nomask_T20_S75_Dv5", {}, 16384,
                                              {"attn_fwd": {"red_in_as": True, "WR": 2},
                                               "attn_dkv": {"WR": 4, "XV": 1}}),
    "X staged whole, a runtime offset": ("attention/cache_position", "prefetch", None,
                                         {"xw": True, "dyn": True}),
    "vec4 reads of X": ("attention/div_scale_D128", {}, None, {"XV": 4}),
    "an epilogue per product": ("attention/qkv_linear_T37_D16", {}, 16384,
                                {"attn_fwd": {"red_in_as": True, "WR": 2}}),
}


@pytest.mark.webgpu
@pytest.mark.parametrize("path", list(PATHS))
def test_each_code_path_against_torch(path):
    """The record's tiled kernels take the path (their plans say so; under 100 K characters
    of WGSL, for a cold lavapipe), then forward and gradients match torch on the native
    adapter."""
    try:
        from webgrad.backends.webgpu import WebGPUBackend
        be = WebGPUBackend()
    except Exception as e:
        pytest.skip(f"no native WebGPU adapter: {e}")
    name, code, mem, want = PATHS[path]
    opts = KernelOptions(attn_tiled=True, attn_prefetch=code == "prefetch")
    if isinstance(code, dict):
        opts = opts.with_attn_opts(**code)
    if mem is not None:
        be.limits.max_compute_workgroup_storage_size = mem
    lim = dataclasses.replace(be.limits, options=opts)
    record = oracle.BY_NAME[name]
    factory, loss_fn, inputs, _ = oracle.build_record(record)
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    fused = rewrite_attention(g, lim)
    plans = {n.op: plan_of(n, fused, lim) for n in fused.nodes if n.op in ATTN_OPS}
    assert set(plans) == {"attn_fwd", "attn_dq", "attn_dkv"}, plans
    for op, p in plans.items():
        fields = want.get(op, {}) if any(k in OPS for k in want) else want
        for k, v in fields.items():
            assert getattr(p, k) == v, (path, op, k, getattr(p, k))
    if path == "an epilogue per product":
        low, names = lower(g, lim)
        dkv = [pipe["wgsl"] for pipe, n in zip(low.plan["pipelines"], names) if n.startswith("attn_dkv")]
        assert len(dkv) == 1 and len(re.findall(r"fn epi_\d+_\d+\(", dkv[0])) == 2, \
            "attn_dkv of an assembled QKV gradient: one epilogue per product (dK, dV)"
    low, names = lower(g, lim)
    sizes = [len(pipe["wgsl"]) for pipe, n in zip(low.plan["pipelines"], names) if n.startswith("attn")]
    assert sizes and max(sizes) < 100_000, sizes
    oracle.check(record, be, opts)
