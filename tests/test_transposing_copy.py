"""Copies through a transpose of the last two axes, tiled through workgroup memory on GPU
adapters (codegen/elementwise.py, build_transposing_copy): the tied LM head's pad(wte^T).
The kernel is forced onto lavapipe here and judged against torch through the oracle's
whole compile path (forward and gradients; the gradient of pad(x^T) is the transpose of
a slice, a transposing copy too): shapes that do not divide the 32 x 32 tile, a batch of
matrices, a pad and a slice along either axis, and a transpose that an elementwise op reads,
which fusion stores (fusion_storage._transposed_reads) so that this kernel writes it."""
from __future__ import annotations

import pytest

import backends

import oracle
from backends import WEBGPU
from oracle import Record, f32
from webgrad.codegen import KernelOptions, Limits, lower
from webgrad.codegen import fusion
from webgrad.compile import build_train_graph, parse_inputs


def _t_pad(x, widths):
    """torch's pad: widths (last axis before, after, next-to-last before, after)."""
    import torch
    return torch.nn.functional.pad(x, widths)


RECORDS = [
    Record("transpose_copy/pad_tied_head", "lambda w: ops.pad(ops.swap_axes(w, 0, 1), 1, 0, 11)",
           lambda w: _t_pad(w.T, (0, 11)), (f32(37, 70),)),
    Record("transpose_copy/batched_odd", "lambda x: ops.pad(ops.swap_axes(x, 1, 2), 2, 0, 3)",
           lambda x: _t_pad(x.transpose(1, 2), (0, 3)), (f32(3, 45, 33),)),
    # read by an elementwise op: stored by fusion_storage._transposed_reads (its size threshold
    # lowered below), then added along its rows
    Record("transpose_copy/read_by_an_add", "lambda x, z: ops.swap_axes(x, 0, 1) * 2.0 + z",
           lambda x, z: x.T * 2.0 + z, (f32(70, 37), f32(37, 70))),
    Record("transpose_copy/slice_then_pad_rows",
           "lambda x: ops.pad(ops.swap_axes(ops.slice(x, 0, 2, 66), 0, 1), 0, 3, 1)",
           lambda x: _t_pad(x[2:66].T, (0, 0, 3, 1)),
           (f32(67, 40),)),
]


def _names(record, limits):
    factory, loss_fn, inputs, _ = oracle.build_record(record)
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    return lower(g, limits)[1]


@pytest.mark.parametrize("record", RECORDS, ids=[r.name for r in RECORDS])
def test_transposing_copies_are_tiled_on_gpu_adapters_only(record):
    opts = KernelOptions(transposed_read_min=1)
    gpu = _names(record, Limits(cpu=False, options=opts))
    assert any(n.startswith("transposing_copy") for n in gpu), gpu
    cpu = _names(record, Limits(adapter="llvmpipe (LLVM 15.0.6, 256 bits) (CPU)", cpu=True, options=opts))
    assert not any(n.startswith("transposing_copy") for n in cpu), cpu


@pytest.mark.parametrize("backend", [WEBGPU])
@pytest.mark.parametrize("record", RECORDS, ids=[r.name for r in RECORDS])
def test_tiled_transposing_copies_match_torch(record, backend):
    oracle.check(record, backend, KernelOptions(force_tiled_transpose=True, transposed_read_min=1))


def _stored_transposes(record, limits):
    """The transposes fusion_storage._transposed_reads stores in the record's training graph."""
    factory, loss_fn, inputs, _ = oracle.build_record(record)
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    return [g[n].shape for n in fusion.Fusion(g, limits).transposed]


def test_only_tile_sized_transposes_read_elementwise_are_stored():
    """A transpose with an axis shorter than a tile stays an expression of its reader (the
    flat kernel reads it as well as a copy would), as do a transpose read by a matmul (its
    kernel takes strides), one below the size threshold, and any on a CPU adapter."""
    opts = KernelOptions(transposed_read_min=1)
    gpu = Limits(cpu=False, options=opts)
    assert _stored_transposes(RECORDS[2], gpu) == [(37, 70)]
    assert _stored_transposes(RECORDS[2], Limits(cpu=True, options=opts)) == []
    narrow = Record("narrow", "lambda x, z: ops.swap_axes(x, 0, 1) * 2.0 + z",
                    lambda x, z: x.T * 2.0 + z, (f32(70, 4), f32(4, 70)))
    product = Record("product", "lambda x, w: ops.matmul(ops.swap_axes(x, 0, 1), w)",
                     lambda x, w: x.T @ w, (f32(70, 37), f32(70, 33)))
    assert _stored_transposes(narrow, gpu) == [] and _stored_transposes(product, gpu) == []
    gpu = Limits(cpu=False, options=KernelOptions(transposed_read_min=70 * 37 + 1))
    assert _stored_transposes(RECORDS[2], gpu) == []


@pytest.mark.webgpu
@pytest.mark.skipif(not backends.webgpu_available(), reason="no native WebGPU adapter")
def test_a_rounded_transpose_is_one_tiled_copy_that_rounds():
    """In a mixed step, dW2 = h^T dY reads the f16 rounding of h's transpose (h = tanh(x
    W1), whose f32 value tanh's backward keeps, so mma_transposed does not view it): the tiled
    transposing copy rounds as it stores, one kernel for what was a copy and a rounding,
    and two SGD steps on this machine's adapter give the reference executor's losses
    and parameters (the same f16 rounding points; the products' sums in another order)."""
    import numpy as np
    import webgrad as wg
    from webgrad import Module, ops, optim

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.W1 = self.param([48, 64])
            self.W2 = self.param([64, 40])

    def loss(m, f):
        h = ops.tanh(ops.matmul(f["x"], m.W1))
        return ops.mean_all((ops.matmul(h, m.W2) - f["y"]) ** 2.0)

    rng = np.random.default_rng(8)
    feed = {"x": rng.standard_normal((64, 48)).astype(np.float32),
            "y": rng.standard_normal((64, 40)).astype(np.float32)}
    host = wg.backends.get_backend("webgpu").host
    if "shader-f16" not in (getattr(host, "features", None) or ()):
        pytest.skip("this adapter has no shader-f16")
    runs = {}
    for be in ("reference", "webgpu"):
        opts = KernelOptions(force_tiled_transpose=True, transposed_read_min=1) if be == "webgpu" else None
        c = wg.compile_module(Net, loss, inputs={"x": [64, 48], "y": [64, 40]},
                              optimizer=optim.SGD(lr=0.1), backend=be, precision="mixed",
                              seed=5, **({"kernel_options": opts} if opts else {}))
        losses = [float(c.step(feed)) for _ in range(2)]
        runs[be] = (losses, {k: np.asarray(v) for k, v in c.download_params().items()}, c)
    (l0, p0, _), (l1, p1, c) = runs["reference"], runs["webgpu"]
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    for k in p0:
        np.testing.assert_allclose(p1[k], p0[k], rtol=1e-5, atol=1e-6)
    copies = [p["wgsl"] for p in c._train.exe.plan["pipelines"]
              if "transposing_copy" in p.get("name", "") or "var<workgroup> tile" in p["wgsl"]]
    assert copies and any("f16(" in w for w in copies), copies
