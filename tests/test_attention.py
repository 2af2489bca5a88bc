"""Fused attention (codegen/attention_match.py, codegen/attention.py).

Device-free: which spellings of `softmax(mask(scale * q @ k^T)) @ v` the WebGPU lowering
fuses (scale and causal offset read from the graph are compared with the values the test
wrote), which it must leave alone (a mask that is not causal, dropout on the
probabilities, a captured probability tensor), and that every `attention*` record of the
op oracle is fused forward and backward with no [.., T, S] tensor left in the graph. The
values are checked against torch by the oracle records themselves (tests/test_webgpu.py,
the browser suite) and, at GPT-2 size (T = 1024, 12 heads), by the last test here on the
native adapter against torch in float64.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import models
import oracle
from backends import native_adapter_is_cpu
from webgrad import Module, init, ops, optim
from webgrad.codegen import Limits, lower
from webgrad.codegen.attention_match import ATTN_OPS, find_matches, rewrite_attention
from webgrad.compile import build_forward_graph, build_train_graph, parse_inputs


def _graph(fn, shapes, optimizer=None):
    """The training graph of loss = sum(fn(q, k, v) * w) with q, k, v parameters."""
    class M(Module):
        def __init__(self):
            super().__init__()
            for name, shape in shapes.items():
                setattr(self, name, self.param(list(shape), init=init.randn(1.0)))

    def loss(m, inp):
        y = fn(*[getattr(m, n) for n in shapes])
        return ops.sum_all(y * ops.constant([0.5 + 0.01 * i for i in range(y.node.size)],
                                            shape=y.shape))
    return build_train_graph(M, loss, {}, optimizer)[1]


QKV = {"q": (2, 2, 6, 8), "k": (2, 2, 6, 8), "v": (2, 2, 6, 8)}
# a training step's attention kernels: a GPU's one-pass forms (attention_tiled.py), a CPU
# adapter's row kernels (attention.py)
GPU_KERNELS = ("attn_fwd", "attn_dq", "attn_dkv")
CPU_KERNELS = ("attn_lse", "attn_out", "attn_dq", "attn_dk", "attn_dv")


def kT(k):
    return ops.swap_axes(k, -1, -2)


SPELLINGS = [
    # (name, fn, shapes, scale, offset)
    ("softmax_causal_last after scale", lambda q, k, v: ops.softmax_causal_last(q @ kT(k) * 0.5) @ v,
     QKV, 0.5, 0),
    ("scale after where_causal", lambda q, k, v: ops.softmax_last(ops.where_causal(q @ kT(k)) * 0.5) @ v,
     QKV, 0.5, 0),
    ("divide by sqrt(d)", lambda q, k, v: ops.softmax_causal_last(q @ kT(k) / math.sqrt(8)) @ v,
     QKV, 1 / math.sqrt(8), 0),
    ("constant times scores", lambda q, k, v: ops.softmax_causal_last(0.25 * (q @ kT(k))) @ v,
     QKV, 0.25, 0),
    ("scale on q", lambda q, k, v: ops.softmax_causal_last((q * 0.5) @ kT(k)) @ v, QKV, 1.0, 0),
    ("additive -inf from where", lambda q, k, v: ops.softmax_last(
        q @ kT(k) + ops.where(ops.causal_mask(6), 0.0, float("-inf"))) @ v, QKV, 1.0, 0),
    ("additive (1 - mask) * -1e9", lambda q, k, v: ops.softmax_last(
        q @ kT(k) * 0.5 + (1.0 - ops.causal_mask(6)) * -1e9) @ v, QKV, 0.5, 0),
    ("subtracted mask * 1e4", lambda q, k, v: ops.softmax_last(
        q @ kT(k) - ops.less(ops.reshape(ops.arange(6, "f32"), (6, 1)),
                             ops.reshape(ops.arange(6, "f32"), (1, 6))) * 1e4) @ v, QKV, 1.0, 0),
    ("mask == 0 to -inf (minGPT)", lambda q, k, v: ops.softmax_last(ops.where(
        ops.equal(ops.causal_mask(6), 0.0), float("-inf"), q @ kT(k) * 0.5)) @ v, QKV, 0.5, 0),
    ("hand-written cols <= rows", lambda q, k, v: ops.softmax_last(ops.where(
        ops.less_equal(ops.reshape(ops.cast(ops.arange(6), "f32"), (1, 6)),
                       ops.reshape(ops.cast(ops.arange(6), "f32"), (6, 1))),
        q @ kT(k), -1e30)) @ v, QKV, 1.0, 0),
    ("hand-written cols < rows + 1 (strict)", lambda q, k, v: ops.softmax_last(ops.where(
        ops.less(ops.reshape(ops.arange(6, "f32"), (1, 6)), ops.reshape(ops.arange(6, "f32"), (6, 1)) + 1.0),
        q @ kT(k), -1e9)) @ v, QKV, 1.0, 0),
    ("strict, a cache offset of 2.5 (j <= i + 2)", lambda q, k, v: ops.softmax_last(ops.where(
        ops.less(ops.reshape(ops.arange(7, "f32"), (1, 7)), ops.reshape(ops.arange(3, "f32"), (3, 1)) + 2.5),
        q @ kT(k), -1e9)) @ v, {"q": (1, 3, 8), "k": (1, 7, 8), "v": (1, 7, 5)}, 1.0, 2),
    ("a triangle table", lambda q, k, v: ops.softmax_last(ops.where(
        ops.constant([[float(j <= i) for j in range(6)] for i in range(6)]), q @ kT(k), -1e9)) @ v,
     QKV, 1.0, 0),
    ("a query block at the end of a cache", lambda q, k, v: ops.softmax_last(ops.where_causal(
        q @ kT(k))) @ v, {"q": (1, 3, 8), "k": (1, 7, 8), "v": (1, 7, 5)}, 1.0, 4),
    ("one query, a cache of 7", lambda q, k, v: ops.softmax_causal_last(q @ kT(k)) @ v,
     {"q": (2, 1, 8), "k": (2, 7, 8), "v": (2, 7, 8)}, 1.0, None),
    ("no mask, rank 2", lambda q, k, v: ops.softmax_last(q @ kT(k) * 0.1) @ v,
     {"q": (5, 4), "k": (9, 4), "v": (9, 3)}, 0.1, None),
]


@pytest.mark.parametrize("case", SPELLINGS, ids=[c[0] for c in SPELLINGS])
def test_spellings_are_matched_forward_and_backward(case):
    name, fn, shapes, scale, offset = case
    (m,) = find_matches(_graph(fn, shapes))
    assert math.isclose(m.scale, scale, rel_tol=1e-12) and m.offset == offset, (m.scale, m.offset)
    assert None not in (m.g, m.gv, m.ga, m.gb), m  # q, k and v all get fused gradients
    for limits, kernels in ((Limits(), GPU_KERNELS), (Limits(cpu=True), CPU_KERNELS)):
        g2 = rewrite_attention(_graph(fn, shapes), limits)
        ops_ = {n.op for n in g2.nodes}
        assert set(kernels) == {op for op in ops_ if op.startswith("attn_")}, (limits.cpu, ops_)
        assert "softmax_last" not in ops_


NOT_ATTENTION = [
    ("keeps the future (j >= i)", lambda q, k, v: ops.softmax_last(ops.where(
        ops.less_equal(ops.reshape(ops.arange(6, "f32"), (6, 1)), ops.reshape(ops.arange(6, "f32"), (1, 6))),
        q @ kT(k), -1e9)) @ v),
    ("strictly below the diagonal (j < i: query 0 keeps no key)", lambda q, k, v: ops.softmax_last(ops.where(
        ops.less(ops.reshape(ops.arange(6, "f32"), (1, 6)), ops.reshape(ops.arange(6, "f32"), (6, 1))),
        q @ kT(k), -1e9)) @ v),
    ("a band, not a triangle", lambda q, k, v: ops.softmax_last(ops.where(
        ops.constant([[float(i - 2 <= j <= i) for j in range(6)] for i in range(6)]), q @ kT(k), -1e9)) @ v),
    ("a mild fill (-10)", lambda q, k, v: ops.softmax_last(ops.where_causal(q @ kT(k), -10.0)) @ v),
    ("a negative scale", lambda q, k, v: ops.softmax_causal_last(q @ kT(k) * -1.0) @ v),
    ("a mask that differs per batch", lambda q, k, v: ops.softmax_last(ops.where(
        ops.less(ops.reshape(ops.arange(2, "f32"), (2, 1, 1, 1)), ops.causal_mask(6) + 0.5),
        q @ kT(k), -1e9)) @ v),
    ("a score-dependent term", lambda q, k, v: ops.softmax_last(q @ kT(k) + q @ kT(v)) @ v),
    ("dropout on the probabilities", lambda q, k, v: ops.dropout(ops.softmax_causal_last(q @ kT(k)), 0.1) @ v),
]


@pytest.mark.parametrize("case", NOT_ATTENTION, ids=[c[0] for c in NOT_ATTENTION])
def test_other_graphs_are_left_alone(case):
    name, fn = case
    g = _graph(fn, QKV)
    assert not find_matches(g)
    assert rewrite_attention(g, Limits()) is g


def test_a_runtime_cache_position_is_read_as_an_offset():
    """GPT-2's cached step masks key j <= i + pos with pos an i32 feed: the offset is 0 plus
    that feed, read by the kernels at run time (the record runs it against torch)."""
    factory, loss_fn, inputs, _ = oracle.build_record(oracle.BY_NAME["attention/cache_position"])
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    (m,) = find_matches(g)
    assert (m.offset, m.dyn) == (0, g.inputs["d"])
    assert all(n.inputs[-1] == rewrite_attention(g, Limits()).inputs["d"]
               for n in rewrite_attention(g, Limits()).nodes if n.op.startswith("attn_"))


@pytest.mark.webgpu
def test_gpt2_cached_steps_are_fused():
    """webgrad.models.gpt2 decodes 1, 3 and 8 tokens against its 32-row cache at runtime
    positions with attn_out, and the logits equal its full forward's (tests/test_gpt2.py
    checks the same against transformers)."""
    try:
        from webgrad.backends.webgpu import WebGPUBackend
        WebGPUBackend()
    except Exception as e:
        pytest.skip(f"no native WebGPU adapter: {e}")
    from webgrad.models import gpt2
    cfg = gpt2.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=32, vocab_size=50)
    m = gpt2.GPT2.init_random(cfg, seed=1, backend="webgpu")
    ids = [1, 4, 4, 9, 2, 7, 0, 3, 5, 5, 10, 6]
    full = np.asarray(m.forward(ids))
    c = m.new_cache()
    rows = [m.logits_all_step(ids[a:b], c) for a, b in ((0, 1), (1, 4), (4, 12))]
    np.testing.assert_allclose(np.concatenate(rows), full, atol=2e-5, rtol=0)
    for T in (1, 3, 8):
        names = m._programs[("step", T)]._prog.exe.kernel_names
        assert sum(n.startswith("attn_out") for n in names) == cfg.n_layer, names
        assert not any(n.startswith("softmax") for n in names), names


def test_a_captured_probability_keeps_the_graph_unfused():
    """The probabilities are read by the host: nothing may be fused away."""
    def fn(q, k, v):
        return ops.capture("p", ops.softmax_causal_last(q @ kT(k))) @ v
    g = _graph(fn, QKV)
    assert find_matches(g)  # the pattern is there, but its P must stay
    assert rewrite_attention(g, Limits()) is g


def test_too_few_bindings_keep_the_graph_unfused():
    """attn_dq / attn_dk bind 7 buffers: a device with fewer keeps matmul + softmax."""
    g = _graph(SPELLINGS[0][1], QKV)
    assert rewrite_attention(g, Limits(max_storage_buffers_per_shader_stage=6)) is g
    assert rewrite_attention(g, Limits(max_storage_buffers_per_shader_stage=7)) is not g


ATTN_RECORDS = [r for r in oracle.RECORDS if r.name.startswith("attention")]


@pytest.mark.parametrize("record", ATTN_RECORDS, ids=[r.name for r in ATTN_RECORDS])
def test_attention_records_are_fused(record):
    """Their webgpu lowering has the attention kernels (a GPU's: O and lse from one, dK and
    dV from one; a CPU adapter's five row kernels) and no softmax or score matmul."""
    factory, loss_fn, inputs, _ = oracle.build_record(record)
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    assert len(find_matches(g)) == 1
    for limits, kernels in ((Limits(), GPU_KERNELS), (Limits(cpu=True), CPU_KERNELS)):
        names = lower(g, limits)[1]
        for k in kernels:
            assert sum(n.startswith(k + " ") for n in names) == 1, (k, names)
        assert sum(n.startswith("attn_") for n in names) == len(kernels), names
        assert not any(n.startswith("softmax") for n in names), names
        # the records are attention alone, but for a QKV Linear's product and its gradients
        linear = "qkv_linear" in record.name
        assert sum(n.startswith("matmul") for n in names) == 3 * linear, names
    g2 = rewrite_attention(g, Limits())  # no score remains
    assert "softmax_last" not in {n.op for n in g2.nodes}, str(g2)
    assert sum(n.op == "matmul" for n in g2.nodes) == 3 * linear, str(g2)


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu", "cpu"])
def test_qkv_gradient_is_written_in_place(cpu):
    """The QKV Linear's output gradient (dQ, dK, dV padded into [B, T, 3C] and added) is
    written by the attention backward kernels into its buffer: no kernel adds the pads
    (fusion_sums._assemble), and the pieces get no buffer."""
    from webgrad.codegen import KernelOptions
    factory, loss_fn, inputs, _ = oracle.build_record(oracle.BY_NAME["attention/qkv_linear_T37_D16"])
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    low, names = lower(g, Limits(cpu=cpu))
    low2, names2 = lower(g, Limits(cpu=cpu, options=KernelOptions(assemble=False)))
    assert len(names2) == len(names) + 1, (names, names2)
    # dQ and dKV (a CPU adapter's dQ, dK, dV) are temporaries no more
    assert low2.report["temporaries"] - low.report["temporaries"] == (3 if cpu else 2)


def test_transformer_kernel_count():
    """The test transformer (tests/models.py, 2 layers): its attention (score matmul, softmax,
    P @ V; 5 backward kernels) becomes attn_fwd and the row term, attn_dq, attn_dkv per
    layer on a GPU (attn_lse + attn_out and attn_dq, attn_dk, attn_dv on a CPU adapter)."""
    from webgrad.codegen import KernelOptions
    g = build_train_graph(models.Transformer, models.transformer_loss,
                          parse_inputs(models.TF_INPUTS), optim.Adam(lr=0.01))[1]
    fused = lower(g, Limits())[1]
    plain = lower(g, Limits(options=KernelOptions(fuse_attention=False)))[1]
    print(f"transformer step: {len(plain)} kernels unfused, {len(fused)} with fused attention")
    # per layer: 3-4 forward kernels become 2, 6 backward kernels become 4
    assert len(plain) - len(fused) >= 3 * models.N_LAYERS, (len(plain), len(fused))
    assert sum(n.startswith("attn_") for n in fused) == 3 * models.N_LAYERS
    cpu = lower(g, Limits(cpu=True))[1]
    assert sum(n.startswith("attn_") for n in cpu) == 5 * models.N_LAYERS


def test_inference_attention_is_one_kernel():
    """With nothing to differentiate, attn_out runs the softmax online: no lse kernel."""
    from webgrad.compile import build_forward_graph
    g = build_forward_graph(Module, lambda m, i: ops.softmax_causal_last(i["q"] @ kT(i["k"])) @ i["v"],
                            {k: (s, "f32") for k, s in QKV.items()})[1]
    assert lower(g, Limits())[1] == ["attn_out [2x2] T6 S6 D8 tiled 16x16"]
    assert lower(g, Limits(cpu=True))[1] == ["attn_out [2x2] T6 S6 D8"]


@pytest.mark.parametrize("name, cpu, shape", [
    ("attention/qkv_slices_T70_D32", False, "tiled"), ("attention/qkv_slices_T70_D32", True, "loops"),
    ("attention/div_scale_D128", False, "tiled"), ("attention/div_scale_D128", True, "loops")])
def test_code_shape_follows_the_adapter(name, cpu, shape):
    """GPUs get the tiled kernels (workgroup memory, barriers), CPU adapters the row kernels
    with the head dim as a loop over vec4 arrays."""
    factory, loss_fn, inputs, _ = oracle.build_record(oracle.BY_NAME[name])
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    low, names = lower(g, Limits(cpu=cpu))
    cmds = [c for c in low.plan["commands"] if c["op"] == "dispatch"]
    for n, c in zip(names, cmds):
        if n.startswith("attn_"):
            wgsl = low.plan["pipelines"][c["pipeline"]]["wgsl"]
            assert ("tiled" in n) == (shape == "tiled"), n
            assert ("workgroupBarrier" in wgsl) == (shape == "tiled"), n
            if shape != "tiled":
                assert ("array<vec4<f32>," in wgsl) == (shape == "loops"), n


def test_tiles_follow_the_workgroup_memory():
    """64-row blocks where the device gives 32 KiB of workgroup memory, 32 at WebGPU's
    default 16 KiB (attn_lse, with no output tile, 64 in both); a short side gets blocks of at least 16 rows; every choice fits."""
    from webgrad.codegen.attention_tiled_plan import choose_blocks, shared_bytes
    for op in ("attn_lse", "attn_out", "attn_fwd", "attn_dq", "attn_dk", "attn_dv", "attn_dkv"):
        for E in (0 if op == "attn_lse" else 64, 80, 256):
            for limit in (16384, 32768):
                BR, BC, DK, XK = choose_blocks(op, 512, 512, E, limit)
                assert shared_bytes(op, BR, BC, DK, XK, 16 * -(-E // 16)) <= limit
                if op == "attn_lse":  # no output tile: 64 rows fit even 16 KiB
                    assert (BR, BC) == (64, 64), (op, limit)
                elif E <= 80:
                    assert (BR, BC) == ((64, 64) if limit == 32768 else (32, 32)), (op, E, limit)
    assert choose_blocks("attn_out", 1, 1024, 64, 32768)[:2] == (16, 64)  # decoding
    # 48 KiB (the H200's Dawn adapter) and rows of 1024: 128-row blocks for the query kernels
    for op, br in (("attn_fwd", 128), ("attn_dq", 128), ("attn_dkv", 64)):
        blocks = choose_blocks(op, 1024, 1024, 64, 49152)
        assert blocks[:2] == (br, 64) and shared_bytes(op, *blocks, 64) <= 49152, (op, blocks)


ATTN_NAMES = [r.name for r in ATTN_RECORDS]
ROWS_FORMS = ["attention", "attention/qkv_slices_T70_D32", "attention/cache_block_T3_S9",
              "attention/cross_shared_kv_Dv12", "attention/cache_position"]
SMALL_SHARED = ["attention/qkv_slices_T70_D32", "attention/tiled_T70_D80",
                "attention/tiled_cache_T5_S70", "attention/cache_position"]
# The H200's prefetching kernels are about twice as long: those over 100 K characters of
# WGSL (D 33 and up with several blocks; D 128, whose D loop runs past PREFETCH_D_MAX, took
# 66 s) take minutes to compile on a cold lavapipe and run in the slow slices
# (tests/suite_rules.py); the rest of the records cover the prefetches of every op and
# several streamed blocks.
BIG_PREFETCHED = {"attention/qkv_slices_T70_D32", "attention/additive_mask_T33_D64", "attention/div_scale_D128",
                  "attention/tiled_T70_D80", "attention/tiled_odd_T37_D33_Dv7",
                  "attention/tiled_T128_D64", "attention/tiled_T150_D64"}
ROWS_SHAPES = ("rows unrolled",) if native_adapter_is_cpu() else ("rows unrolled", "rows loops")


def _form(name, form):
    slow = form == "tiled prefetch" and name in BIG_PREFETCHED
    return pytest.param(name, form, id=f"{name}-{form}", marks=[pytest.mark.slow] if slow else [])


FORMS = ([_form(n, "tiled") for n in ATTN_NAMES] + [_form(n, "tiled prefetch") for n in ATTN_NAMES]
         + [_form(n, "tiled 16 KiB") for n in SMALL_SHARED]
         + [_form(n, f) for n in ROWS_FORMS for f in ROWS_SHAPES])


@pytest.mark.webgpu
@pytest.mark.parametrize("name, form", FORMS)
def test_records_in_every_code_shape(name, form):
    """Every attention record through the tiled kernels (GPUs' code, attention_tiled.py),
    with and without the H200's prefetches, also with 16 KiB of workgroup memory (32-row
    blocks) for those with several blocks, and some through the row kernels in both of their
    shapes (head dim unrolled into registers, or a loop: a CPU adapter's default, left out
    where the adapter is one): forward (inference and training) and gradients against torch
    on the native adapter. (Each record also runs in the adapter's own code shape in
    test_webgpu.py.)"""
    from webgrad.codegen import KernelOptions
    try:
        from webgrad.backends.webgpu import WebGPUBackend
        be = WebGPUBackend()
    except Exception as e:
        pytest.skip(f"no native WebGPU adapter: {e}")
    opts = KernelOptions(attn_tiled=form.startswith("tiled"), attn_prefetch=form == "tiled prefetch")
    be.limits.cpu = form == "rows loops"
    if form == "tiled 16 KiB":
        be.limits.max_compute_workgroup_storage_size = 16384
    oracle.check(oracle.BY_NAME[name], be, opts)


# block shapes other than the default (bench/attention.py --variants measures them): 8 rows
# or 8 columns per thread, and the code options off; those that fit lavapipe's 32 KiB
# (blocks or None: choose_blocks', options, thread grid (WY, WX) or None: the default).
# No adapter picks these, so each runs by default on three records whose kernels stay
# short (odd head dims, a runtime cache offset, no mask over a ragged S), and on the other
# five in the slow slices; without the prefetches (test_records_in_every_code_shape has them).
BLOCK_FORMS = {"128x32": ((128, 32, 16, 8), {}, None), "32x128": ((32, 128, 8, 4), {}, None),
               "64x64 options off": ((64, 64, 32, 16), {"heavy_first": False, "red_in_as": False,
                                                        "ws_vec": False, "exact": False,
                                                        "prefetch_d": frozenset(),
                                                        "prefetch_x": frozenset()}, None),
               "8 x 16 threads": (None, {}, (8, 16)), "16 x 8 threads": (None, {}, (16, 8)),
               "8 x 8 threads, 32x64": ((32, 64, 16, 8), {}, (8, 8))}
BLOCK_RECORDS = ["attention/tiled_odd_T37_D33_Dv7", "attention/cache_position",
                 "attention/tiled_nomask_T20_S75_Dv5"]
BLOCK_RECORDS_SLOW = ["attention/tiled_T128_D64", "attention/tiled_T150_D64",
                      "attention/tiled_T70_D80", "attention/qkv_linear_T37_D16",
                      "attention/tiled_cache_T5_S70"]
BLOCK_CASES = [pytest.param(n, f, id=f"{n}-{f}", marks=[pytest.mark.slow] if n in BLOCK_RECORDS_SLOW else [])
               for n in BLOCK_RECORDS + BLOCK_RECORDS_SLOW for f in BLOCK_FORMS]


@pytest.mark.webgpu
@pytest.mark.parametrize("name, form", BLOCK_CASES)
def test_records_in_other_block_shapes(name, form):
    """The tiled kernels with the block shapes, code options and thread grids forced (every
    op): forward and gradients against torch on the native adapter."""
    from webgrad.codegen import KernelOptions
    try:
        from webgrad.backends.webgpu import WebGPUBackend
        be = WebGPUBackend()
    except Exception as e:
        pytest.skip(f"no native WebGPU adapter: {e}")
    blocks, code, threads = BLOCK_FORMS[form]
    opts = KernelOptions(
        attn_tiled=True, attn_prefetch=False,
        attn_blocks=None if blocks is None else {op: blocks for op in ATTN_OPS},
        attn_threads=None if threads is None else {op: threads for op in ATTN_OPS},
    ).with_attn_opts(**code)
    oracle.check(oracle.BY_NAME[name], be, opts)


def test_prefetches_follow_the_adapter():
    """The tiled kernels' prefetches only where they were measured (an H200): SwiftShader lost
    its device creating them, and the WGSL of the same kernel is about twice as long."""
    from webgrad.codegen import Limits, lower
    from webgrad.compile import build_train_graph, parse_inputs
    record = oracle.BY_NAME["attention/tiled_odd_T37_D33_Dv7"]
    factory, loss_fn, inputs, _ = oracle.build_record(record)
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    sizes = {}
    for adapter in ("NVIDIA H200 (DiscreteGPU) via Vulkan", "SwiftShader Device (Subzero)", ""):
        low, names = lower(g, Limits(adapter=adapter))
        sizes[adapter] = sum(len(p["wgsl"]) for p, n in zip(low.plan["pipelines"], names)
                             if n.startswith("attn_"))
    assert sizes["SwiftShader Device (Subzero)"] == sizes[""]
    assert sizes["NVIDIA H200 (DiscreteGPU) via Vulkan"] > 1.5 * sizes[""], sizes


# ---------------------------------------------------------------- GPT-2 size

def _sdpa_module(shape):
    class M(Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (self.param(list(shape), init="zeros") for _ in range(3))

    def loss(m, inp):
        o = ops.softmax_causal_last(m.q @ kT(m.k) * (1 / math.sqrt(shape[-1]))) @ m.v
        return ops.sum_all(o * inp["w"])
    return M, loss


def test_gpt2_124m_attention_plan_has_no_scores():
    """GPT-2 124M's attention at B 8, T 1024 (12 heads of 64): the training step's plan
    has no buffer near the size of the scores (8 x 12 x 1024 x 1024 f32 = 384 MiB, more
    than WebGPU's default maxStorageBufferBindingSize): it fits. The largest buffer is
    attn_dkv's [8, 12, 1024, 64 + 64]."""
    shape = (8, 12, 1024, 64)
    M, loss = _sdpa_module(shape)
    g = build_train_graph(M, loss, parse_inputs({"w": list(shape)}), optim.AdamW(lr=3e-4))[1]
    low, names = lower(g, Limits())
    assert sum(n.startswith("attn_") for n in names) == 3, names
    assert max(b["size"] for b in low.plan["buffers"]) <= 2 * 4 * 8 * 12 * 1024 * 64


def test_training_attention_is_fused_on_every_adapter():
    """A named GPU adapter fuses a training step's attention at GPT-2's T 512 as well as past
    the binding limit (T 1024): the tiled kernels run it as fast as the plain matmuls + row
    softmax on the H200 with less memory (bench/README.md); CPU adapters fuse with their
    row kernels; forward graphs fuse."""
    gpu = Limits(adapter="NVIDIA H200 (DiscreteGPU)", max_storage_buffer_binding_size=1 << 31,
                 max_compute_workgroup_storage_size=49152)
    cpu = Limits(adapter="llvmpipe (LLVM 15.0.6, 256 bits) (CPU)", cpu=True)

    def kernels(shape, limits):
        M, loss = _sdpa_module(shape)
        g = build_train_graph(M, loss, parse_inputs({"w": list(shape)}), optim.AdamW(lr=3e-4))[1]
        return sorted(n.split(" ")[0] for n in lower(g, limits)[1] if n.startswith("attn_"))

    assert kernels((8, 12, 512, 64), gpu) == sorted(GPU_KERNELS)   # 96 MiB of scores
    assert kernels((8, 12, 1024, 64), gpu) == sorted(GPU_KERNELS)  # 384 MiB: past a binding
    assert kernels((1, 2, 16, 8), cpu) == sorted(CPU_KERNELS)
    M, _ = _sdpa_module((8, 12, 512, 64))
    fwd = build_forward_graph(M, lambda m, inp: ops.softmax_causal_last(m.q @ kT(m.k)) @ m.v,
                              {})[1]
    assert any(n.op == "attn_out" for n in rewrite_attention(fwd, gpu).nodes)


@pytest.mark.webgpu
def test_long_attention_matches_torch():
    """T 1024 (GPT-2's context), a head of 64, forward and the three gradients on the
    native adapter against torch autograd in float64 (scaled_dot_product_attention);
    fused whatever the adapter's training policy says."""
    torch = pytest.importorskip("torch")
    try:
        from webgrad.backends.webgpu_native import NativeHost
        NativeHost()
    except Exception as e:
        pytest.skip(f"no native WebGPU adapter: {e}")
    import webgrad as wg
    shape = (1, 1, 1024, 64)
    M, loss = _sdpa_module(shape)
    from webgrad.codegen import KernelOptions
    c = wg.compile_module(M, loss, inputs={"w": list(shape)}, optimizer=None, backend="webgpu",
                          kernel_options=KernelOptions(fuse_attention=True))
    assert sum(n.startswith("attn_") for n in c._train.exe.kernel_names) in (3, 5)
    rng = np.random.default_rng(0)
    vals = {n: rng.standard_normal(shape).astype(np.float32) for n in ("q", "k", "v")}
    w = rng.standard_normal(shape).astype(np.float32)
    c.upload_params(vals)
    got = c.step({"w": w})
    grads = c.download_param_grads()
    t = {n: torch.tensor(v, dtype=torch.float64, requires_grad=True) for n, v in vals.items()}
    o = torch.nn.functional.scaled_dot_product_attention(t["q"], t["k"], t["v"], is_causal=True)
    want = (o * torch.tensor(w, dtype=torch.float64)).sum()
    want.backward()
    assert abs(got - want.item()) <= 1e-4 * abs(want.item()) + 1e-2
    for n in ("q", "k", "v"):
        np.testing.assert_allclose(grads[n], t[n].grad.numpy(), rtol=1e-3, atol=2e-4, err_msg=n)


# ---------------------------------------------------------------- precision="mixed"

GPU_MIXED_KERNELS = ("attn_lse", "attn_out", "attn_dq", "attn_dkv")  # lse first: P is rounded


@pytest.mark.parametrize("record", ATTN_RECORDS, ids=[r.name for r in ATTN_RECORDS])
def test_mixed_attention_records_are_fused(record):
    """Under precision="mixed" (f16 casts of q, k^T, v, the scores, P, G, gP and gS) every
    attention record is still matched forward and backward, as mixed, and lowered to the
    two-pass forward (attn_lse, attn_out: the probabilities are rounded normalized) with no
    softmax and no score matmul left, by default on a CPU adapter, with
    KernelOptions(attn_mixed=True) on a GPU; KernelOptions(attn_mixed=False) leaves it
    unfused, and so does a GPU by default (the tensor cores: options.py)."""
    from webgrad.codegen import KernelOptions
    from webgrad.precision import f16_in_f32
    factory, loss_fn, inputs, _ = oracle.build_record(record)
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None, precision="mixed")[1]
    (m,) = find_matches(g)
    assert m.mixed and None not in (m.g, m.gv, m.ga, m.gb), m
    gpu = Limits(options=KernelOptions(attn_mixed=True))
    for graph in (g, f16_in_f32(g)):  # f16 nodes (device-free), the WebGPU backend's form
        for limits, kernels in ((gpu, GPU_MIXED_KERNELS), (Limits(cpu=True), CPU_KERNELS)):
            names = lower(graph, limits)[1]
            assert sorted(n.split(" ")[0] for n in names if n.startswith("attn_")) == \
                sorted(kernels), names
            assert not any(n.startswith("softmax") for n in names), names
        g2 = rewrite_attention(graph, gpu)
        assert "softmax_last" not in {n.op for n in g2.nodes}, str(g2)
        assert all(n.attrs.get("mixed") for n in g2.nodes if n.op in ATTN_OPS)
    for limits in (Limits(options=KernelOptions(attn_mixed=False)), Limits()):
        plain = lower(g, limits)[1]
        assert not any(n.startswith("attn_") for n in plain), plain
    f32 = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    assert not any(n.attrs.get("mixed") for n in rewrite_attention(f32, Limits()).nodes)


def _mixed_lm(model: str, T: int):
    """(factory, loss, query heads) of a small GPT-2 or Llama (GQA: 4 query heads on 2 K/V
    heads; head dims 16 and 8)."""
    from webgrad.models import gpt2, llama
    if model == "gpt2":
        cfg = gpt2.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_ctx=T, vocab_size=64)
        return (lambda: gpt2.GPT2Module(cfg)), gpt2.lm_loss, 2
    cfg = llama.LlamaConfig.from_hf(dict(
        model_type="llama", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, vocab_size=64,
        max_position_embeddings=T, rms_norm_eps=1e-5, tie_word_embeddings=True))
    return (lambda: llama.LlamaModule(cfg)), llama.lm_loss, 4


def _mixed_lm_graph(model: str, B: int, T: int):
    """Its training step under precision="mixed", as the WebGPU backend lowers it (f16 values
    held in f32 nodes), and its [B, heads, T, T] element count."""
    from webgrad.precision import f16_in_f32
    factory, loss, heads = _mixed_lm(model, T)
    ins = parse_inputs({"tokens": ([B, T], "i32"), "targets": ([B, T], "i32")})
    g = build_train_graph(factory, loss, ins, optim.AdamW(lr=1e-3), precision="mixed")[1]
    return f16_in_f32(g), B * heads * T * T


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_mixed_lm_step_stores_no_scores(model):
    """A mixed GPT-2 / Llama training step (T 24, head dim 16 / 8) fuses every layer's
    attention forward and backward: after the attention pass no [.., T, T] tensor of the
    scores' size is left in the graph (so none is stored), on a CPU adapter's limits and on a
    GPU's with KernelOptions(attn_mixed=True); with attn_mixed=False, and on a GPU by
    default, the scores and probabilities remain."""
    from webgrad.codegen import KernelOptions
    B, T, layers = 2, 24, 2
    g, scores = _mixed_lm_graph(model, B, T)

    def tt(graph):
        return [n for n in graph.nodes if tuple(n.shape[-2:]) == (T, T) and n.size >= scores]
    gpu = Limits(options=KernelOptions(attn_mixed=True))
    for limits, per_layer in ((gpu, GPU_MIXED_KERNELS), (Limits(cpu=True), CPU_KERNELS)):
        assert tt(rewrite_attention(g, limits)) == []
        names = lower(g, limits)[1]
        assert sum(n.startswith("attn_") for n in names) == len(per_layer) * layers, names
        assert not any(n.startswith("softmax") for n in names), names
    assert len(tt(rewrite_attention(g, Limits(options=KernelOptions(attn_mixed=False))))) > 0
    assert len(tt(rewrite_attention(g, Limits()))) > 0


@pytest.mark.webgpu
@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_mixed_lm_trains_with_fused_attention(model):
    """Five Adam steps of the small GPT-2 / Llama in precision="mixed" on the native adapter,
    attention fused (5 row kernels a layer on a CPU adapter, 4 tiled ones elsewhere), give
    the unfused program's and the reference executor's losses within 3e-5 relative (3e-6
    measured on lavapipe, 2026-12-03)."""
    from backends import webgpu_available
    from webgrad.codegen import KernelOptions
    if not webgpu_available():
        pytest.skip("no native WebGPU adapter")
    from webgpu_helpers import mixed_runs
    B, T = 2, 24
    factory, loss, _ = _mixed_lm(model, T)
    runs = mixed_runs(factory, loss, (("ref", "reference", None),
                                      ("unfused", "webgpu", KernelOptions(attn_mixed=False)),
                                      ("fused", "webgpu", KernelOptions(attn_mixed=True))),
                      B=B, T=T, vocab=64, steps=5, seed=4)
    per_layer = 5 if native_adapter_is_cpu() else 4
    assert len(runs["unfused"][2]) == 0 and len(runs["fused"][2]) == 2 * per_layer
    runs = {name: run[0] for name, run in runs.items()}
    np.testing.assert_allclose(runs["fused"], runs["unfused"], rtol=3e-5)
    np.testing.assert_allclose(runs["fused"], runs["ref"], rtol=3e-5)


@pytest.mark.webgpu
def test_mixed_llama_trains_on_subgroup_matrices():
    """The attention kernels on subgroup matrices (attention_mma.py), run in plain WGSL here
    (KernelOptions.mma_emulate: lavapipe has none), in a mixed Llama step with GQA (4 query
    heads on 2 K/V heads, head dim 16) at T 72: two query blocks of 64 rows, causal key
    blocks skipped past the diagonal, rows past T masked. Three Adam steps give the losses
    of the unfused program and of the reference executor within 3e-5 relative (1e-6
    measured at T 80 on lavapipe, 2026-12-04)."""
    from backends import webgpu_available
    from webgrad.codegen import KernelOptions
    from webgrad.models import llama
    if not webgpu_available():
        pytest.skip("no native WebGPU adapter")
    from webgpu_helpers import mixed_runs
    B, T = 2, 72
    cfg = llama.LlamaConfig.from_hf(dict(
        model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, vocab_size=64,
        max_position_embeddings=T, rms_norm_eps=1e-5, tie_word_embeddings=True))
    runs = mixed_runs(lambda: llama.LlamaModule(cfg), llama.lm_loss, (
        ("ref", "reference", None), ("unfused", "webgpu", KernelOptions(attn_mixed=False)),
        ("mma", "webgpu", KernelOptions(attn_mixed=True, attn_tiled=True, mma_emulate=True))),
        B=B, T=T, vocab=64, steps=3, seed=4)
    names = runs["mma"][2]
    assert sorted({n.split(" ")[0] for n in names}) == sorted(GPU_MIXED_KERNELS), names
    assert len(names) == 2 * len(GPU_MIXED_KERNELS) and all(" mma " in n for n in names), names
    np.testing.assert_allclose(runs["mma"][0], runs["unfused"][0], rtol=3e-5)
    np.testing.assert_allclose(runs["mma"][0], runs["ref"][0], rtol=3e-5)


def test_half_precision_inference_attention_is_fused():
    """A forward-only attention under precision="mixed" and "f16" (which also rounds the
    scaled scores, the mask's values and positions) is matched and lowered to attn_lse +
    attn_out, round_x set for "f16" only; at T 2050 "f16" rounds the positions the causal
    mask compares (2049 is not an f16), so the mask is not read as causal: unfused."""
    from webgrad.compile import build_forward_graph
    from webgrad.precision import apply_precision

    def graph(T, precision):
        shapes = {k: ((1, 1, T, 8), "f32") for k in "qkv"}
        g = build_forward_graph(Module, lambda m, i: ops.softmax_causal_last(
            i["q"] @ kT(i["k"]) * 0.3) @ i["v"], shapes)[1]
        return apply_precision(g, precision)[0]
    for precision in ("mixed", "f16"):
        g = graph(6, precision)
        (m,) = find_matches(g)
        assert m.mixed and m.round_x == (precision == "f16") and m.offset == 0
        for limits in (Limits(), Limits(cpu=True)):
            assert [n.split(" ")[0] for n in lower(g, limits)[1] if n.startswith("attn_")] == \
                ["attn_lse", "attn_out"]
    assert find_matches(graph(2049, "f16")) and not find_matches(graph(2050, "f16"))
