"""The sibling pass (codegen/thin_siblings.py): thin products that read the same A are one
product against their B's concatenated, read in slices. Device-free on the IR (the
rewritten graph evaluated by the primitives' reference rules, against numpy) and on the
kernel list, then forced on WebGPU (lavapipe) against numpy."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from webgrad import Module, ops
from webgrad.codegen import KernelOptions, Limits, lower
from webgrad.codegen.thin_siblings import thin_siblings
from webgrad.compile import build_forward_graph, parse_inputs
from webgrad.primitives import PRIMS

B, T, D, R = 2, 8, 32, 4
SHAPES = {"x": ((B, T, D), "f32"), "a1": ((R, D), "f32"), "a2": ((R, D), "f32"),
          "a3": ((R, D), "f32"), "w": ((R, R), "f32"), "wide": ((15 * R, D), "f32")}


def _fn(x, a1, a2, a3, w, wide):
    """Three thin products of x (merged), one whose B is a product of the first (kept
    apart: it cannot be computed where the first sibling is) and one too wide to be thin."""
    t = lambda a: ops.swap_axes(a, 0, 1)  # noqa: E731
    y1 = ops.matmul(x, t(a1))
    y2 = ops.matmul(x, t(a2))
    y3 = ops.relu(ops.matmul(x, t(a3)))
    dep = ops.matmul(x, t(ops.matmul(w, ops.reshape(ops.sum(y1, axes=(0, 1)), (R, 1)) * a1)))
    return ops.concat([y1 * 2.0 + y2, y3, dep, ops.matmul(x, t(wide))], axis=-1)


def _numpy(f):
    x, a1, a2, a3, w, wide = (f[k] for k in SHAPES)
    y1 = x @ a1.T
    dep = x @ (w @ (y1.sum((0, 1)).reshape(R, 1) * a1)).T
    return np.concatenate([y1 * 2 + x @ a2.T, np.maximum(x @ a3.T, 0), dep, x @ wide.T], -1)


def _feeds(seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, (s, _) in SHAPES.items()}


def _graph():
    return build_forward_graph(Module, lambda m, i: _fn(**i), parse_inputs(SHAPES))[1]


def _evaluate(g, feeds):
    """Every output of g by the primitives' reference rules (the reference executor's)."""
    vals = {}
    for n in g.nodes:
        if n.op in ("input", "state"):   # the state: a forward's step counter, unread
            vals[n.id] = feeds.get(n.attrs["name"], np.zeros(n.shape, np.float32))
        else:
            vals[n.id] = np.asarray(PRIMS[n.op].ref(np, n.attrs, *(vals[i] for i in n.inputs)))
    (out,) = g.outputs.values()
    return vals[out]


def _on(flag):
    return Limits(cpu=True, options=KernelOptions(thin_siblings=flag))


def test_siblings_become_one_product_with_the_same_values():
    g = _graph()
    merged = thin_siblings(g, _on(True))
    mm = [n for n in merged.nodes if n.op == "matmul"]
    # x @ [a1 a2 a3]^T once; the dependent product, its B's product and the wide one kept
    assert sorted(n.shape[-1] for n in mm) == [R, 3 * R, D, 15 * R], [n.shape for n in mm]
    assert [n.op for n in merged.nodes].count("slice") == 3
    assert thin_siblings(g, _on(False)) is g and thin_siblings(g, _on(None)) is g  # a CPU
    assert thin_siblings(g, Limits(cpu=False)) is not g                            # a GPU
    feeds = _feeds()
    want = _numpy(feeds)
    for graph in (g, merged):
        np.testing.assert_allclose(_evaluate(graph, feeds), want, rtol=1e-5, atol=1e-5)


def test_the_merged_products_take_fewer_kernels():
    """Three products become the concatenation's copy and one product: one kernel fewer."""
    names = {f: lower(_graph(), _on(f))[1] for f in (False, True)}
    assert len(names[True]) == len(names[False]) - 1, names
    assert any(n.startswith(f"matmul {B}x{T}x{3 * R} K={D}") for n in names[True]), names
    assert not any(f"x{3 * R} K=" in n for n in names[False]), names
    # off without thin products (split_thin 0), as thin_grads
    assert lower(_graph(), replace(_on(True), options=KernelOptions(thin_siblings=True,
                                                                     split_thin=0)))[1] \
        == lower(_graph(), replace(_on(False), options=KernelOptions(split_thin=0)))[1]


@pytest.mark.webgpu
def test_merged_products_on_webgpu_equal_numpy():
    from webgpu_helpers import exe, forward
    try:
        from webgrad.backends.webgpu import WebGPUBackend
        WebGPUBackend()
    except Exception as e:
        pytest.skip(f"no native WebGPU adapter: {e}")
    c = forward(_fn, SHAPES, options=KernelOptions(thin_siblings=True))
    assert any(n.startswith(f"matmul {B}x{T}x{3 * R} K={D}") for n in exe(c).kernel_names)
    feeds = _feeds(1)
    np.testing.assert_allclose(np.asarray(c.run(feeds)), _numpy(feeds), rtol=1e-4, atol=1e-4)
