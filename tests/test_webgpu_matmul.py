"""The matmul kernels on the WebGPU executor (native adapter: wgpu-py, lavapipe in CI), and
which one codegen picks: the tiled kernel's parts (epilogue loads issued first, the K loop,
vec4 loads), the H200 row's shape classes and split-K choice, the kernel that follows the
adapter (barrier-free on CPU adapters, tiled on GPUs), and the matrix-vector kernel of
decoding's few-row products. Results against torch (the oracle records), the reference
executor or numpy in float64; the oracle table under every matmul kernel is test_webgpu.py.
Skipped cleanly when no adapter exists.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import models
import oracle
from webgpu_helpers import H200_CONFIGS, exe, forward, lowered_kernel_names, require_native_adapter
import webgrad as wg
from webgrad import Module, ops, optim

pytestmark = pytest.mark.webgpu
require_native_adapter()  # skips this module where there is none

from webgrad.backends.webgpu import is_cpu_adapter  # noqa: E402
from webgrad.codegen import KernelOptions  # noqa: E402
from webgrad.codegen import matmul_config as mm  # noqa: E402


EPI_CONFIGS = {"rows1": mm.Config(4, 4, 8, wx=4, wy=4, vload=True, epi_rows=1),
               "rows3_group_scalar": mm.Config(4, 8, 16, wx=4, wy=8, group=2, epi_rows=3)}


@pytest.mark.parametrize("config", list(EPI_CONFIGS))
@pytest.mark.parametrize("name", ["matmul/gelu_mlp_odd", "matmul/aligned_epilogue"])
def test_epilogue_loads_issued_first(name, config):
    """Config.epi_rows: the epilogue's loads (bias, GELU's pre-activation, an operand) of
    several outputs issued before their stores (prefetch_epilogue), on shapes no tile
    divides, against torch; an epilogue with more loads than epi_max_loads keeps them."""
    opts = KernelOptions(force_config=EPI_CONFIGS[config])
    from webgrad.codegen import Limits, lower
    from webgrad.compile import build_train_graph, parse_inputs
    factory, loss_fn, inputs, _ = oracle.build_record(oracle.BY_NAME[name])
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    wgsl = [p["wgsl"] for p in lower(g, Limits(options=opts))[0].plan["pipelines"] if " K=" in p["wgsl"]]
    assert any("fn epi_ld(" in w for w in wgsl)
    oracle.check(oracle.BY_NAME[name], "webgpu", opts)
    opts = replace(opts, epi_max_loads=0)
    wgsl = [p["wgsl"] for p in lower(g, Limits(options=opts))[0].plan["pipelines"] if " K=" in p["wgsl"]]
    assert not any("fn epi_ld(" in w for w in wgsl)


@pytest.mark.parametrize("name", ["matmul/tiles_odd", "matmul/odd_long_k"])
def test_k_loop_in_wgsl(name):
    """The tiled kernel's K step as a WGSL loop (KernelOptions.k_loop) rather than unrolled."""
    opts = KernelOptions(force_config=mm.Config(4, 4, 8, wx=4, wy=4, vload=True), k_loop=1)
    from webgrad.codegen import Limits, lower
    from webgrad.compile import build_train_graph, parse_inputs
    factory, loss_fn, inputs, _ = oracle.build_record(oracle.BY_NAME[name])
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    wgsl = [p["wgsl"] for p in lower(g, Limits(options=opts))[0].plan["pipelines"] if " K=" in p["wgsl"]]
    assert wgsl and all("for (var kk = 0u; kk < 8u; kk++)" in w for w in wgsl)
    oracle.check(oracle.BY_NAME[name], "webgpu", opts)


@pytest.mark.parametrize("config", [mm.Config(2, 1, 64), mm.Config(1, 2, 64)])
@pytest.mark.parametrize("name", ["matmul/tiles_odd", "matmul/odd_long_k"])
def test_thin_tiles_with_a_long_k_step(name, config):
    """The unsplit tiles of a thin product on the H200 (32 x 16 and 16 x 32 at K step 64,
    matmul_config's KernelOptions.split_thin rule) on shapes they do not divide, against torch."""
    oracle.check(oracle.BY_NAME[name], "webgpu", KernelOptions(force_config=config))


@pytest.mark.parametrize("name", ["matmul/tiles_odd", "matmul/odd_long_k"])
def test_k_loop_partly_unrolled(name):
    """The tiled kernel's K step as a WGSL loop over pairs of k (KernelOptions.k_unroll)."""
    opts = KernelOptions(force_config=mm.Config(4, 4, 8, wx=4, wy=4, vload=True), k_unroll=(1, 2))
    from webgrad.codegen import Limits, lower
    from webgrad.compile import build_train_graph, parse_inputs
    factory, loss_fn, inputs, _ = oracle.build_record(oracle.BY_NAME[name])
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    wgsl = [p["wgsl"] for p in lower(g, Limits(options=opts))[0].plan["pipelines"] if " K=" in p["wgsl"]]
    assert wgsl and all("for (var kb = 0u; kb < 8u; kb += 2u)" in w for w in wgsl)
    oracle.check(oracle.BY_NAME[name], "webgpu", opts)


def test_vec4_loads_where_the_layout_allows():
    """vec4 global loads need a stride-1 axis whose size is a multiple of 4 and 4-aligned
    other strides; an epilogue that reads an operand's buffer (a binding has one element
    type) gets scalar loads."""
    from webgrad.codegen import Limits, lower
    from webgrad.ir import Graph
    opts = KernelOptions(force_config=H200_CONFIGS["batched"])

    def bindings(m, k, n, plus_a=False):
        g = Graph()
        a = g.add("input", [], (m, k), "f32", {"name": "a", "shape": (m, k), "dtype": "f32"})
        b = g.add("input", [], (k, n), "f32", {"name": "b", "shape": (k, n), "dtype": "f32"})
        out = g.add("matmul", [a, b], (m, n), "f32")
        if plus_a:
            out = g.add("add", [out, a], (m, n), "f32")
        g.outputs["out"] = out
        low, names = lower(g, Limits(options=opts))
        wgsl = low.plan["pipelines"][0]["wgsl"]
        return [ln.split(": ")[-1] for ln in wgsl.splitlines() if "var<storage" in ln][:2]
    assert bindings(64, 32, 48) == ["array<vec4<f32>>;"] * 2
    # A's rows start 30 floats apart (not 16-byte aligned); B's are 48 apart
    assert bindings(64, 30, 48) == ["array<f32>;", "array<vec4<f32>>;"]
    assert bindings(64, 64, 64, plus_a=True) == ["array<f32>;"] * 2


@pytest.mark.parametrize("classes", ["wide_group", "as_listed", "thin"])
def test_transformer_training_under_h200_classes(classes):
    """The test transformer's step (merge_heads views, folded weight gradients, fused
    epilogues, attention's batched products) under the H200 row's shape classes, on this
    adapter: "as_listed" is the row itself (its Linears over [16, 8, d] are [128 x d]
    products to the table, too few tiles for any class: the shrinking rule's 32-row tiles,
    not the batched class's 64 x 64 one that a batch element alone would take),
    "wide_group" lowers the row's thresholds so that every product takes the wide class
    with tile rows in runs (its tile made 4 x 4 threads of 4 x 4: lavapipe runs a
    workgroup's threads as fibers, and the 8 x 16 blocks, which the oracle records above
    check, took 17 minutes here); those two without the rank-r products' rules
    (expand_k=0, thin_split=0). "thin": the row with them, their thresholds lowered so that
    the products over K = d = 32 take expand_config's tile (columns apart) and the d-wide
    ones over K >= 32 thin_config's tiles, split over K (chunk sums). 5 Adam steps against
    the reference executor."""
    row = dict(mm.ADAPTER_TILINGS[0][1])
    if classes == "wide_group":
        row.update(slots=1, group=2, wide=replace(row["wide"], tm=4, tn=4, wx=4, wy=4))
        del row["batched"]
    opts = KernelOptions(tiling_row=row, force_direct=False, expand_k=0, thin_split=0)
    if classes == "thin":
        opts = replace(opts, expand_k=32, expand_min_n=0, thin_split=64, thin_chunk=16)
    c, r = models.compile_transformer("webgpu", kernel_options=opts), models.compile_transformer("reference")
    names = [n for n in exe(c).kernel_names if n.startswith("matmul")]
    if classes == "thin":
        assert any(" K=32 tile 8x32x32" in n for n in names), names   # expand_config's
        assert any(" split " in n for n in names), names              # thin_config's
    else:
        assert all(" tile 16x16x" in n for n in names) if classes == "wide_group" else \
            all(" tile 32x" in n for n in names), names
    for k in range(5):
        b = models.reversal_batch(k)
        lw, lr_ = c.step(b), r.step(b)
        assert abs(lw - lr_) <= 1e-3 * abs(lr_) + 1e-6, f"step {k}: webgpu {lw} vs reference {lr_}"
    pw, pr = c.download_params(), r.download_params()
    for name in pr:
        np.testing.assert_allclose(pw[name], pr[name], rtol=2e-2, atol=1e-3, err_msg=name)


def test_h200_shape_classes():
    """Which tiling each class of the GPT step's products gets on the H200 (the table)."""
    a = "NVIDIA H200 (DiscreteGPU) via Vulkan"
    wide, batched = (mm.ADAPTER_TILINGS[0][1][k] for k in ("wide", "batched"))
    assert mm.choose_config(4096, 4096, 4096, 1, adapter=a) == wide
    assert mm.choose_config(2048, 2048, 2048, 1, adapter=a) == wide
    # the logits: a tile row is longer than a wave, so tile rows go in runs
    assert mm.choose_config(4096, 50257, 768, 1, adapter=a).group == 32
    assert mm.choose_config(4096, 4096, 4096, 1, adapter=a).group == 0
    # attention's scores and context products
    assert mm.choose_config(256, 256, 64, 512, adapter=a) == batched
    assert mm.choose_config(512, 64, 512, 96, adapter=a) == batched
    # a batch of small products over a long K (the LM head's input gradient, vocab 4096)
    assert mm.choose_config(256, 512, 4096, 64, adapter=a).wx == wide.wx
    # a weight gradient: split-K with the wide tile
    cfg = mm.choose_config(512, 1536, 16384, 1, adapter=a)
    assert (cfg.splits, cfg.wx, cfg.wy, cfg.tm, cfg.tn, cfg.warp_tiles) == (11, 16, 16, 8, 8, True)
    # the GPT-2 vocabulary's products (N or K = 50257, unaligned rows): the "odd" tile,
    # split where it was split (K chunks of 4096 or more into whole waves: 192 tiles x 11
    # = 8 x 264), in runs of tile rows where they were
    odd = mm.ADAPTER_TILINGS[0][1]["odd"]
    assert mm.choose_config(4096, 768, 50257, 1, adapter=a) == replace(odd, splits=11)
    assert mm.choose_config(4096, 50257, 768, 1, adapter=a) == replace(odd, group=32)
    assert mm.choose_config(768, 50257, 4096, 1, adapter=a) == replace(odd, group=32)
    # ... and on padded columns (codegen/align_match.py): the head's weight gradient takes
    # the 256 x 128 tile, the logits the wide one
    vw = mm.ADAPTER_TILINGS[0][1]["vocab_wgrad"]
    assert (vw.bm, vw.bn) == (256, 128)
    assert mm.choose_config(768, 50304, 4096, 1, adapter=a) == replace(vw, group=32)
    assert mm.choose_config(4096, 50304, 768, 1, adapter=a) == replace(wide, group=32)
    # under 3/4 of a wave of 128 x 128 tiles, a wave of 64 x 64 ones
    assert mm.choose_config(4096, 768, 768, 1, adapter=a) == mm.ADAPTER_TILINGS[0][1]["mid"]
    # a thin C (LoRA's rank-16 factors, x A^T and dA) without thin_config's rule
    # (thin_split=0; its tiles: tests/test_thin_products.py): no split where the shrunk
    # tiles give as many workgroups as the chunks (64 of 32 x 16 against 16 tiles x 4
    # chunks), at a K step 4 times the split tile's (each workgroup runs as many K steps),
    # a split where they do not (K = 8192: 16 chunks, 256 workgroups); split_thin=0 splits
    from webgrad.codegen import KernelOptions
    old = KernelOptions(thin_split=0)
    thin = mm.choose_config(2048, 16, 2048, 1, adapter=a, options=old)
    assert (thin.splits, thin.bm, thin.bn, thin.bk) == (1, 32, 16, 64)
    assert (mm.choose_config(16, 8192, 2048, 1, adapter=a, options=old).splits,
            mm.choose_config(2048, 16, 8192, 1, adapter=a, options=old).splits) == (1, 16)
    assert mm.choose_config(2048, 16, 2048, 1, adapter=a,
                            options=replace(old, split_thin=0)).splits == 4
    # few tiles: the shrinking rule, as on adapters without a row
    assert mm.choose_config(1024, 1024, 1024, 1, adapter=a) == \
        mm.choose_config(1024, 1024, 1024, 1, adapter="some GPU")


def test_h200_batch_against_one_weight_is_one_product():
    """[64, 256, 1536] @ [1536, 512] (a Linear's input gradient over [B, T, C]) is one
    [16384 x 1536] @ [1536 x 512] product to the table: the wide tile, not the "batched"
    one of attention's small products (each batch element alone is 256 x 512), in the
    kernel the compiler emits as in the table's answer; a batched B keeps "batched"."""
    from webgrad.codegen import lower
    from webgrad.codegen.wgsl import Limits
    from webgrad.compile import build_forward_graph
    a = "NVIDIA H200 (DiscreteGPU) via Vulkan"
    limits = Limits(adapter=a, max_compute_workgroup_storage_size=49152,
                    max_storage_buffer_binding_size=1 << 30, max_buffer_size=1 << 30)
    wide, batched = (mm.ADAPTER_TILINGS[0][1][k] for k in ("wide", "batched"))
    assert mm.group_config(limits, 256, 1536, 512, 64, shared_b=True) == wide
    assert mm.group_config(limits, 256, 1536, 512, 64, shared_b=False) == batched
    for bshape, tile in (((1536, 512), f"tile {wide.bm}x{wide.bn}x"),
                         ((64, 1536, 512), f"tile {batched.bm}x{batched.bn}x")):
        ins = {"x": ((64, 256, 1536), "f32"), "w": (bshape, "f32")}
        graph = build_forward_graph(lambda: Module(), lambda _, i: ops.matmul(i["x"], i["w"]), ins)[1]
        names = [n for n in lower(graph, limits)[1] if n.startswith("matmul")]
        assert names and all(tile in n for n in names), (bshape, names)


def test_h200_step_takes_sums_in_its_products():
    """The GPT bench's step lowered for an H200 (64 x 256, d 128, 2 layers): every bias
    gradient is summed by its weight gradient's kernel and every layer norm's weight and
    bias gradients by the epilogue of the next Linear's input gradient (unsplit there), so
    no sum keeps a first pass; the QKV gradient has no kernel of its own (the attention
    backward writes it). With those rules off, the step has those kernels back."""
    import sys
    from pathlib import Path
    from webgrad.codegen import lower
    from webgrad.codegen.wgsl import Limits
    from webgrad.compile import build_train_graph, parse_inputs
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import gpt2_train
    factory, loss_fn = gpt2_train.webgrad_model(128, 2, 2, 256, 256)
    graph = build_train_graph(factory, loss_fn, parse_inputs(
        {"idx": ([64, 256], "i32"), "target": ([64, 256], "i32")}), wg.optim.AdamW(lr=3e-4))[1]
    limits = Limits(adapter="NVIDIA H200 (DiscreteGPU) via Vulkan",
                    max_compute_workgroup_storage_size=49152,
                    max_storage_buffer_binding_size=1 << 30, max_buffer_size=1 << 30)
    names = lower(graph, limits)[1]
    assert not any(n.startswith("sum (pass 1)") for n in names), names
    # per layer 4 biases and 2 layer norms' 2 parameters, and the final layer norm's 2
    assert sum(n.startswith("sum (pass 2)") for n in names) == 2 * 8 + 2, names
    plain = lower(graph, replace(limits, options=KernelOptions(operand_sums=False, assemble=False)))[1]
    assert sum(n.startswith("sum (pass 1)") for n in plain) == 2 * 8 + 2, plain
    assert len(plain) == len(names) + 2 * 8 + 2 + 2, (len(plain), len(names))


@pytest.mark.parametrize("M,K,N,nb,splits", [
    (4096, 50304, 768, 1, 11),   # GPT-2's LM head input gradient: long chunks, whole waves
    (4096, 3072, 768, 1, 4),     # its MLP's: short chunks keep the per-chunk penalty
    (512, 16384, 1536, 1, 11),   # the QKV weight gradient of the 64 x 256 GPT step
    (512, 16384, 2048, 1, 4),    # the MLP up-projection's
    (16384, 512, 1536, 1, 1),    # enough tiles: no split
    (1024, 1024, 1024, 1, 1),    # K too short to split: smaller tiles instead
])
def test_split_k_is_chosen_for_long_k_and_few_tiles(M, K, N, nb, splits):
    cfg = mm.choose_config(M, N, K, nb, adapter="NVIDIA H200 (DiscreteGPU) via Vulkan")
    assert cfg.splits == splits, cfg
    if splits > 1:
        assert (cfg.bm, cfg.bn) == (128, 128)
    assert not cfg.double  # measured slower on the H200 (ADAPTER_TILINGS)
    # an adapter with no row in the table never splits
    assert mm.choose_config(M, N, K, nb, adapter="some GPU").splits == 1


def _mlp_matmul_kernels(limits) -> list[tuple[str, str]]:
    """(name, WGSL) of the MLP training step's matmul kernels lowered for `limits`."""
    from webgrad.codegen import lower
    from webgrad.compile import build_train_graph, parse_inputs
    g = build_train_graph(models.MLP, models.mlp_loss, parse_inputs(models.MLP_INPUTS),
                          optim.Adam(lr=0.005))[1]
    low, names = lower(g, limits)
    dispatches = [q for q in low.plan["commands"] if q["op"] == "dispatch"]
    return [(n, low.plan["pipelines"][d["pipeline"]]["wgsl"])
            for n, d in zip(names, dispatches) if n.startswith("matmul")]


@pytest.mark.parametrize("cpu", [True, False])
def test_matmul_kernel_follows_the_adapter(cpu):
    """On a CPU adapter (Limits.cpu) every matmul of the MLP step is barrier-free (no shared
    memory, no workgroupBarrier: 4-15x faster on SwiftShader/lavapipe); on a GPU the tiled
    kernel. Both kernels' results are compared with torch/the reference executor by
    test_oracle_under_both_matmul_kernels and test_training_matches_reference."""
    from webgrad.codegen import Limits
    kernels = _mlp_matmul_kernels(Limits(cpu=cpu))
    assert kernels
    for name, wgsl in kernels:
        assert (" direct " in name) == cpu, name
        assert ("workgroupBarrier" in wgsl) != cpu and ("var<workgroup>" in wgsl) != cpu, wgsl


def test_this_adapter_gets_its_matmul_kernel():
    """The backend flags the adapter it runs on (lavapipe in CI: a CPU) and codegen follows."""
    c = models.compile_mlp("webgpu")
    be = exe(c).backend
    assert be.limits.cpu == is_cpu_adapter(be.host.info), be.host.info
    names = [n for n in exe(c).kernel_names if n.startswith("matmul")]
    assert names and all((" direct " in n) == be.limits.cpu for n in names), names


CPU_ADAPTERS = [  # (adapter description as a host gives it, a CPU rasterizer?)
    ("llvmpipe (LLVM 15.0.6, 256 bits) (CPU) via Vulkan", True),  # wgpu-py summary, lavapipe
    ("google swiftshader", True),                                  # Chromium's BrowserHost
    ("NVIDIA H200 (DiscreteGPU) via Vulkan [wgpudawn]", False),
    ("apple metal-3 (Apple M2)", False),
]


@pytest.mark.parametrize("info, cpu", CPU_ADAPTERS)
def test_cpu_adapters_are_recognised(info, cpu):
    assert is_cpu_adapter(info) == cpu


# ---------------------------------------------------------------- the matrix-vector kernel

GEMV = KernelOptions(force_gemv=True, gemv_n_fast=True)
# (x shape, w shape, how w is read, bias): C = x @ B + bias. "t": B = swap_axes(w) of a
# [N, K] weight (K of stride 1: 32 lanes per column, vec4 where K % 4 == 0); "n": B = w of
# [K, N] (N of stride 1: 32 adjacent columns per workgroup); N divides no workgroup's columns
GEMV_CASES = {
    "row_wT_vec4": ([1, 96], [20, 96], "t", True),
    "rows3_wT_scalar": ([3, 50], [13, 50], "t", False),
    "rows2_w": ([2, 64], [64, 40], "n", True),
    "batch2_wT": ([2, 1, 64], [24, 64], "t", True),
    "row_long_k": ([1, 1000], [9, 1000], "t", False),
}


# the matrix-vector kernel's CPU form (matmul_gemv_cpu.py: a thread per 8 columns, no barrier)
GEMV_CPU = KernelOptions(force_gemv=True, gemv_n_fast=True, gemv_cpu=True)


@pytest.mark.parametrize("form", ["workgroup", "cpu"])
@pytest.mark.parametrize("case", list(GEMV_CASES))
def test_gemv_kernel_matches_numpy(case, form):
    """Products of a few rows of C (decoding's Linear layers) through the matrix-vector
    kernel, forced onto this adapter in either form: equal float64 numpy's, epilogue (a
    bias) included."""
    xs, ws, how, bias = GEMV_CASES[case]
    rng = np.random.default_rng(len(case))
    N = ws[0] if how == "t" else ws[1]
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)

    def fn(x, w, b):
        y = x @ (ops.swap_axes(w, 0, 1) if how == "t" else w)
        return y + b if bias else y
    f = forward(fn, {"x": xs, "w": ws, "b": [N]}, options=GEMV if form == "workgroup" else GEMV_CPU)
    names = [n for n in exe(f).kernel_names if n.startswith("matmul")]
    assert len(names) == 1 and " gemv " in names[0], exe(f).kernel_names
    assert (" gemv cpu " in names[0]) == (form == "cpu"), names
    assert (" vec4" in names[0]) == (how == "t" and xs[-1] % 4 == 0)
    got = f.run({"x": x, "w": w, "b": b})
    B = w.T if how == "t" else w
    want = x.astype(np.float64) @ B.astype(np.float64) + (b if bias else 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_gemv_kernel_takes_only_few_rows():
    """More rows of C than KernelOptions.gemv_rows keep the adapter's kernel; gemv_rows
    0 turns the form off; a B whose N axis has stride 1 takes it only with gemv_n_fast."""
    n_fast_off = KernelOptions(force_gemv=True)
    for xs, opts, want, how in (([5, 32], GEMV, False, "n"), ([4, 32], GEMV, True, "n"),
                                ([1, 32], KernelOptions(force_gemv=True, gemv_rows=0), False, "t"),
                                ([1, 32], n_fast_off, False, "n"), ([1, 32], n_fast_off, True, "t")):
        f = forward((lambda x, w: x @ w) if how == "n" else (lambda x, w: x @ ops.swap_axes(w, 0, 1)),
                    {"x": xs, "w": [32, 8] if how == "n" else [8, 32]}, options=opts)
        names = [n for n in exe(f).kernel_names if n.startswith("matmul")]
        assert any(" gemv " in n for n in names) == want, (xs, names)


def test_gemv_kernel_in_a_training_step():
    """The oracle's matmul/2d record (C of 3 rows) with its gradients, the products of few
    rows through the matrix-vector kernel (N of stride 1 too): equal to the oracle's."""
    record = oracle.BY_NAME["matmul/2d"]
    names = [n for n in lowered_kernel_names(record, GEMV) if n.startswith("matmul")]
    assert any(" gemv " in n for n in names), names
    oracle.check(record, "webgpu", GEMV)


# y = x W^T + s (x A^T) B^T: the rank-r product computed in the base product's epilogue
# (codegen/lowrank.py), under each kernel form this adapter can be made to run
LOWRANK_FORMS = {
    "default": {},
    "tiled": {"force_config": mm.Config(4, 4, 8, wx=4, wy=4)},
    "h200_wide": {"force_config": H200_CONFIGS["wide"]},         # T = 2048 rows on the H200
    "h200_split": {"force_config": H200_CONFIGS["split_group"]},  # the chunk sum's epilogue
    "gemv": {"force_gemv": True, "gemv_n_fast": True},
}


LOWRANK_CASES = [((3, 37, 29), 43, 5, f) for f in LOWRANK_FORMS if f != "gemv"] + [
    ((2, 19, 33), 21, 16, "tiled"),   # r = 16, the limit (lavapipe's own barrier-free form
    # with 16 terms inlined at each of a thread's 64 outputs: about a minute of LLVM cold)
    ((1, 3, 29), 43, 7, "default"), ((1, 3, 29), 43, 7, "gemv")]  # a few rows: gemv cpu, gemv


@pytest.mark.parametrize("xs,out,r,form", LOWRANK_CASES)
def test_lowrank_product_in_the_base_products_epilogue(xs, out, r, form):
    """With KernelOptions.lowrank_epilogue forced, (x A^T) B^T (K = r <= 16) is no kernel
    of its own: the base product's epilogue sums it, and the result equals float64 numpy's;
    without it, the K = r product is a kernel of its own."""
    rng = np.random.default_rng(r + xs[1])
    inn = xs[-1]
    x, w, a, b = (rng.standard_normal(s).astype(np.float32)
                  for s in (xs, (out, inn), (r, inn), (out, r)))

    def fn(x, w, a, b):
        t = ops.swap_axes
        return x @ t(w, 0, 1) + ((x @ t(a, 0, 1)) @ t(b, 0, 1)) * 2.0
    specs = {"x": list(xs), "w": [out, inn], "a": [r, inn], "b": [out, r]}
    want = x.astype(np.float64) @ w.T.astype(np.float64) + 2.0 * (
        (x.astype(np.float64) @ a.T.astype(np.float64)) @ b.T.astype(np.float64))
    for on in (True, False):
        f = forward(fn, specs, options=KernelOptions(lowrank_epilogue=on, **LOWRANK_FORMS[form]))
        names = [n for n in exe(f).kernel_names if n.startswith("matmul")]
        assert any(f" K={r}" in n for n in names) != on, names
        assert any(" sum of " in n for n in names) == (form == "h200_split"), names
        assert any(" gemv " in n and " cpu " not in n for n in names) == (form == "gemv"), names
        got = f.run({"x": x, "w": w, "a": a, "b": b})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
