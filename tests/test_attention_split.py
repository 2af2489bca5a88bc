"""Decoding's attention split over chunks of keys (codegen/attention_split.py), forced on
the native adapter (KernelOptions.attn_split; no adapter takes it by default),
against torch in float64: GQA heads sharing K/V, a runtime cache position that masks the
rows past it (whole chunks too), several query rows, S and Dv that are not multiples of
the chunk, no mask. Also which kernels each adapter gets.
"""
from __future__ import annotations

import numpy as np
import pytest

from webgpu_helpers import forward, require_native_adapter
from webgrad import Module, ops
from webgrad.codegen import KernelOptions, Limits, lower
from webgrad.compile import build_forward_graph

torch = pytest.importorskip("torch")
H200 = Limits(adapter="NVIDIA H200 (DiscreteGPU)", max_compute_workgroup_storage_size=49152)


def _cached(q, k, v, p, scale):
    """Llama's cached step: query i at position p + i sees keys j <= p + i (the rest -1e30)."""
    T, S = q.shape[-2], k.shape[-2]
    qpos = ops.reshape(ops.cast(ops.arange(T) + p, "f32"), (T, 1))
    kpos = ops.reshape(ops.arange(S, dtype="f32"), (1, S))
    s = q @ ops.swap_axes(k, -1, -2) * scale
    return ops.softmax_last(ops.where(ops.greater_equal(qpos, kpos), s, -1e30)) @ v


def _shapes(hkv, rep, T, S, D, Dv):
    return {"q": ([hkv, rep, T, D], "f32"), "k": ([hkv, 1, S, D], "f32"),
            "v": ([hkv, 1, S, Dv], "f32")}


def _want(x, scale, pos=None):
    q, k, v = (torch.tensor(x[n], dtype=torch.float64) for n in "qkv")
    s = q @ k.transpose(-1, -2) * scale
    if pos is not None:
        T, S = q.shape[-2], k.shape[-2]
        s = s.masked_fill(torch.arange(S)[None, :] > torch.arange(T)[:, None] + pos, float("-inf"))
    return (torch.softmax(s, -1) @ v).numpy()


def _names(fn, shapes, limits):
    return lower(build_forward_graph(Module, lambda _, i: fn(**i), shapes)[1], limits)[1]


def test_the_split_is_taken_on_request_only():
    """By default an H200 keeps the tiled kernel for one query row over 513 keys (the split
    measured no quicker there, attention_split.use_split) and a CPU adapter the row kernel;
    KernelOptions.attn_split=True splits it (9 chunks of 64 keys), on either."""
    from dataclasses import replace
    dec = _shapes(8, 4, 1, 513, 64, 64)
    fn = lambda q, k, v, p: _cached(q, k, v, p, 0.125)  # noqa: E731
    dec["p"] = ([1], "i32")
    assert "tiled" in _names(fn, dec, H200)[0]
    assert _names(fn, dec, Limits(cpu=True)) == ["attn_out [8x4] T1 S513 D64"]
    split = ["attn_out [8x4] T1 S513 D64 split 9x64 (pass 1)",
             "attn_out [8x4] T1 S513 D64 split 9x64 (pass 2)"]
    on = KernelOptions(attn_split=True)
    assert _names(fn, dec, replace(H200, options=on)) == split
    assert _names(fn, dec, Limits(cpu=True, options=on)) == split


CASES = [
    # (name, (Hkv, rep, T, S, D, Dv), positions or None: no mask, keys per chunk)
    ("GQA decode S300", (2, 4, 1, 300, 64, 64), (0, 10, 150, 299), 64),
    ("3 rows D24 Dv80, chunks of 32", (1, 3, 3, 200, 24, 80), (0, 100, 197), 32),
    ("no mask S130 D40 Dv8", (2, 2, 2, 130, 40, 8), None, 64),
]


@pytest.mark.webgpu
@pytest.mark.parametrize("name, dims, positions, chunk", CASES, ids=[c[0] for c in CASES])
def test_split_attention_matches_torch(name, dims, positions, chunk):
    """Each case at every position against torch; whole chunks past the position load
    nothing, D 40 is a chunk of 32 columns and one of 8, Dv 80 three columns a thread."""
    require_native_adapter()
    opts = KernelOptions(attn_split=True, attn_split_chunk=chunk)
    hkv, rep, T, S, D, Dv = dims
    scale = D ** -0.5
    shapes = _shapes(*dims)
    rng = np.random.default_rng(len(name))
    x = {n: rng.standard_normal(s).astype(np.float32) for n, (s, _) in shapes.items()}
    # rows of scores far apart (maxima near 0, 180 and -180 for T 3): a row shifted by
    # another's maximum overflows or vanishes
    x["q"] *= np.array([1.0, 60.0, -60.0, 30.0][:T], np.float32).reshape(T, 1)
    if positions is None:
        fn = lambda q, k, v: ops.softmax_last(q @ ops.swap_axes(k, -1, -2) * scale) @ v  # noqa: E731
    else:
        fn = lambda q, k, v, p: _cached(q, k, v, p, scale)  # noqa: E731
        shapes["p"] = ([1], "i32")
    names = _names(fn, shapes, Limits(cpu=True, options=opts))
    assert [n.split(" split")[1][-8:] for n in names] == ["(pass 1)", "(pass 2)"], names
    prog = forward(fn, shapes, options=opts)
    for pos in positions or (None,):
        feeds = dict(x) if pos is None else dict(x, p=np.array([pos], np.int32))
        got = np.asarray(prog.run(feeds))
        np.testing.assert_allclose(got, _want(x, scale, pos), atol=1e-4, rtol=1e-4,  # oracle.MM
                                   err_msg=f"{name} pos {pos}")
