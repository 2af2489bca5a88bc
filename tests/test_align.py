"""The alignment pass (codegen/align_match.py): products with a wide, unaligned output are
computed on zero-padded columns and sliced. Forced here on small vocabularies (the H200's
row pads only N >= 8192), against the reference executor, which runs the plain IR."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import webgrad as wg
from webgrad import optim
from dataclasses import replace

from webgrad.codegen import KernelOptions, Limits, lower
from webgrad.compile import build_train_graph, parse_inputs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import gpt2_train  # noqa: E402  (the bench's GPT models: untied head, and GPT2Module's tied one)

B, T = 2, 16


def _model(kind: str, vocab: int):
    """factory, loss_fn and the two feeds' names (tokens, targets)."""
    if kind == "untied":
        return (*gpt2_train.webgrad_model(32, 1, 2, vocab, T), ("idx", "target"))
    return gpt2_train.module_model(32, 1, 2, vocab, T)


def _inputs(names):
    return {n: ([B, T], "i32") for n in names}


def _lowered(g, limits, force, options: KernelOptions = KernelOptions()):
    """lower(g, limits) with the padding rule `force` (KernelOptions.force_align; None: the
    adapter's row) in these options."""
    return lower(g, replace(limits, options=replace(options, force_align=force)))


def _names(kind, vocab, force):
    factory, loss_fn, feeds = _model(kind, vocab)
    g = build_train_graph(factory, loss_fn, parse_inputs(_inputs(feeds)), optim.AdamW(lr=1e-3))[1]
    return _lowered(g, Limits(cpu=False), force)[1]


@pytest.mark.parametrize("kind", ["untied", "tied"])
def test_vocabulary_products_take_padded_columns(kind):
    """37 columns padded to 48 with (16, 16, 1): the logits and the head's weight gradient
    run 48 wide, the input gradient over K = 48; nothing changes without the rule, for N below MIN, or for N a multiple of
    A; with ROWS 64 the logits (32 rows) are left alone, the weight gradient (64) not."""
    plain = _names(kind, 37, None)
    assert not any("x48" in n for n in plain), plain
    names = _names(kind, 37, (16, 16, 1))
    assert f"matmul {B}x{T}x48 K=32" in " ".join(names), names
    assert any(n.startswith("matmul") and ("x48 K=" in n or "48x32" in n or "32x48" in n)
               and f"{B}x{T}x48" not in n for n in names), names  # the weight gradient
    assert f"matmul {B}x{T}x32 K=48" in " ".join(names), names  # the input gradient, K padded
    assert not any("48" in n for n in _names(kind, 37, (16, 64, 1))), "N < MIN was padded"
    assert not any("x48" in n for n in _names(kind, 32, (16, 16, 1))), "an aligned N was padded"
    # the logits have B x T = 32 rows, the weight gradient 32 x 2 (per batch x batch)
    few = _names(kind, 37, (16, 16, 64))
    assert not any(f"{B}x{T}x48" in n for n in few) and any("48" in n for n in few), few


@pytest.mark.webgpu
@pytest.mark.parametrize("kind,tiled", [("untied", None), ("tied", None), ("tied", True)])
def test_padded_training_steps_match_the_reference(kind, tiled):
    """Three AdamW steps with the pass forced on WebGPU (lavapipe) against the reference
    executor: the losses, every parameter and every gradient. tiled: the GPU adapters'
    tiled transposing copies (elementwise.py) forced, for the tied head's pad(wte^T) and
    for its weight gradient, stored transposed for the token table's update (fusion's
    _transposed_reads, its size threshold lowered to this small model)."""
    try:
        from webgrad.backends.webgpu import WebGPUBackend
        WebGPUBackend()
    except Exception as e:
        pytest.skip(f"no native WebGPU adapter: {e}")
    opts = KernelOptions(force_align=(16, 16, 1), force_tiled_transpose=tiled, transposed_read_min=1)
    if tiled:
        factory, loss_fn, names = _model(kind, 37)
        g = build_train_graph(factory, loss_fn, parse_inputs(_inputs(names)), optim.AdamW(lr=1e-3))[1]
        kernels = _lowered(g, Limits(cpu=True), (16, 16, 1), opts)[1]
        assert kernels.count("transposing_copy") == 2, kernels
    V = 37
    factory, loss_fn, names = _model(kind, V)
    rng = np.random.default_rng(0)
    feeds = [{n: rng.integers(0, V, (B, T)).astype(np.int32) for n in names} for _ in range(3)]
    got = {}
    for backend in ("reference", "webgpu"):
        c = wg.compile_module(factory, loss_fn, backend=backend, inputs=_inputs(names),
                              optimizer=optim.AdamW(lr=1e-2, weight_decay=0.01), kernel_options=opts)
        got[backend] = ([c.step(f) for f in feeds], c.download_params(), c.download_param_grads())
    (l_ref, p_ref, g_ref), (l_gpu, p_gpu, g_gpu) = got["reference"], got["webgpu"]
    np.testing.assert_allclose(l_gpu, l_ref, rtol=1e-5)
    for name in p_ref:
        np.testing.assert_allclose(p_gpu[name], p_ref[name], rtol=1e-3, atol=3e-4, err_msg=name)
        np.testing.assert_allclose(g_gpu[name], g_ref[name], rtol=1e-3, atol=1e-4, err_msg=name)


def test_quantized_weights_are_not_padded():
    """A product whose B is read through dequantize (quantized weights, decoded in
    registers) keeps its width: a padded copy would store the weights as f32."""
    from webgrad import Module, ops
    from webgrad.codegen.align_match import align_products
    from webgrad.compile import build_forward_graph
    words = 315  # Q8_0 [37, 32]: 37 blocks of 32 values, 8.5 words each (34 bytes)
    for quantized in (True, False):
        def fwd(_, i):
            w = (ops.dequantize(i["w"], "Q8_0", (37, 32)) if quantized
                 else ops.reshape(i["v"], (37, 32)))
            return ops.matmul(i["x"], ops.swap_axes(w, 0, 1))
        g = build_forward_graph(Module, fwd, parse_inputs(
            {"x": ((4, 32), "f32"), "w": ((words,), "i32"), "v": ((37 * 32,), "f32")}))[1]
        limits = Limits(cpu=False, options=KernelOptions(force_align=(16, 16, 1)))
        ops_after = [n.op for n in align_products(g, limits).nodes]
        assert ("pad" in ops_after) is not quantized, ops_after


def test_padded_gpt2_step_stores_no_second_logits():
    """At GPT-2 size with the H200's rule (the adapter's row): the padded logit gradient is
    computed inside its pad's kernel (a pad reads each element once, so fusion.py does not
    store its input) and takes the padded logits' buffer (a read through pad(slice(x)) is
    at the kernel's own index), so the step's pool grows by the head's padded copies at
    most, not by a [4096, 50304] tensor (824 MB)."""
    factory, loss_fn = gpt2_train.webgrad_model(768, 12, 12, 50257, 1024)
    g = build_train_graph(factory, loss_fn, parse_inputs({"idx": ([8, 512], "i32"),
                                                          "target": ([8, 512], "i32")}),
                          optim.AdamW(lr=3e-4))[1]
    limits = Limits(cpu=False, adapter="NVIDIA H200 (DiscreteGPU)")
    limits.max_storage_buffer_binding_size = limits.max_buffer_size = 1 << 34
    pools = {}
    for force in ((128, 1 << 40, 1), None):  # off, then the table's rule
        low, names = _lowered(g, limits, force)
        pools[force is None] = low.report["pool_bytes"]
    assert "matmul 8x512x50304 K=768" in " ".join(names), names
    assert pools[True] <= pools[False] + 2 * 768 * 50304 * 4, pools
