"""Op semantics at the edges, the same on every executor (reference, torch, WebGPU).

The values themselves are checked against torch by the op oracle (tests/oracle.py: NaN and
infinities, ties, dilation/ceil_mode/return_indices, computed out-of-range indices); this
file holds what a record cannot express:
  * fed indices out of range (embedding row 7 of 5, -1, a cross-entropy target 9 of 5
    classes) are refused before the step with a FeedError naming the input, the value, the
    op and the user's line, and parameters, optimizer state and step counter stay as they
    were (checked by downloading them and by the next step equalling a twin's);
  * long i32 reductions (split in two passes on WebGPU) against numpy's exact sums;
  * a tensor of 2**32 elements is a LimitError naming the op, not a WGSL dump;
  * rank errors of conv2d / split_heads / merge_heads / max_pool2d name the op and line;
  * comparison operators (`<=`, `>=`, `==`, `!=`) are elementwise;
  * scatter_add_rows at a 50,000-row vocabulary against numpy's add.at.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import webgrad as wg
from webgrad import FeedError, Module, ShapeError, nn, ops, optim
from backends import WEBGPU, webgpu_available as _webgpu_available

THIS = __file__.rsplit("/", 1)[-1]
BACKENDS = ["reference", "torch", WEBGPU]


def line_of(marker: str) -> int:
    with open(__file__, encoding="utf-8") as f:
        hits = [i for i, ln in enumerate(f, 1) if ln.rstrip().endswith(f"# at:{marker}")]
    assert len(hits) == 1, marker
    return hits[0]


def forward(fn, inputs, backend, options=None):
    return wg.compile_forward(Module, lambda m, i: fn(**i), inputs=inputs, backend=backend,
                              kernel_options=options)


# ---------------------------------------------------------------- fed indices out of range

class Emb(Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.W = self.param([3, 5])


def emb_loss(m, inp):
    h = m.emb(inp["idx"])  # at:embedding
    return nn.cross_entropy_last(h @ m.W, inp["t"])  # at:cross_entropy


EMB_INPUTS = {"idx": ([2, 4], "i32"), "t": ([2, 4], "i32")}


def emb_feed(k=0):
    rng = np.random.default_rng(k)
    return {"idx": rng.integers(0, 5, (2, 4)).astype(np.int32),
            "t": rng.integers(0, 5, (2, 4)).astype(np.int32)}


def _bad(name, value, at):
    def make(feed):
        feed = {k: v.copy() for k, v in feed.items()}
        feed[name].flat[at] = value
        return feed
    return make


# name, bad feed, words the message must contain, marker of the user line named
BAD_INDICES = [
    ("embedding_too_large", _bad("idx", 7, 5),
     ["input 'idx'", "holds 7", "flat index 5", "[0, 5)", "embedding"], "embedding"),
    ("embedding_negative", _bad("idx", -1, 2),
     ["input 'idx'", "holds -1", "flat index 2", "negative indices do not wrap", "embedding"],
     "embedding"),
    ("target_too_large", _bad("t", 9, 0),
     ["input 't'", "holds 9", "[0, 5)", "cross_entropy_last"], "cross_entropy"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,make,words,marker", BAD_INDICES, ids=[b[0] for b in BAD_INDICES])
def test_fed_index_out_of_range_is_refused_and_changes_nothing(name, make, words, marker, backend):
    c = wg.compile_module(Emb, emb_loss, inputs=EMB_INPUTS, optimizer=optim.Adam(lr=0.1),
                          backend=backend, seed=3)
    twin = wg.compile_module(Emb, emb_loss, inputs=EMB_INPUTS, optimizer=optim.Adam(lr=0.1),
                             backend=backend, seed=3)
    for k in range(2):  # nonzero moments and step counter before the bad call
        assert c.step(emb_feed(k)) == twin.step(emb_feed(k))
    before = c.download_params()
    for method in (c.step, c.run):
        with pytest.raises(FeedError) as e:
            method(make(emb_feed(7)))
        msg = str(e.value)
        assert msg.startswith(f"{method.__name__}(): "), msg
        for w in words:
            assert w in msg, (w, msg)
        assert f"{THIS}:{line_of(marker)}" in msg, msg
    for k, v in c.download_params().items():
        np.testing.assert_array_equal(v, before[k])
    # optimizer moments and the step counter too: the next step is the twin's next step
    assert c.step(emb_feed(2)) == twin.step(emb_feed(2))
    for k, v in c.download_params().items():
        np.testing.assert_array_equal(v, twin.download_params()[k])


def test_index_checks_follow_layout_ops_only():
    """A feed reaching an index operand through reshape/transpose/slice is checked (with the
    tightest bound of its uses); one that passes through arithmetic is a computed index."""
    from webgrad.bounds import index_checks
    from webgrad.compile import build_train_graph, parse_inputs

    class T(Module):
        def __init__(self):
            super().__init__()
            self.a = self.param([6, 2])
            self.b = self.param([4, 2])

    def loss(m, inp):
        i = ops.transpose(ops.reshape(inp["i"], (2, 3)))
        return (ops.sum_all(ops.embedding(m.a, i)) + ops.sum_all(ops.embedding(m.b, ops.slice(i, 0, 0, 2)))
                + ops.sum_all(ops.embedding(m.a, inp["j"] + 1)))
    _, g, _ = build_train_graph(T, loss, parse_inputs({"i": ([6], "i32"), "j": ([3], "i32")}), None)
    checks = index_checks(g)
    assert set(checks) == {"i"}
    got = {(b.op, b.n) for b in checks["i"]}  # the gradient's scatter_add_rows reads it too
    assert {("gather_rows", 4), ("gather_rows", 6)} <= got and {n for _, n in got} == {4, 6}
    assert checks["i"][0].n == 4  # the tightest first: it is the one tested


# ---------------------------------------------------------------- reductions of i32


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,axes", [((40000,), None), ((5000, 8), 0), ((3, 70000), 1),
                                         ((4096, 3), (0, 1))])
def test_long_i32_sums_are_exact(shape, axes, backend):
    rng = np.random.default_rng(1)
    x = rng.integers(-1000, 1000, shape).astype(np.int32)
    f = forward(lambda x: ops.sum(x, axes), {"x": (list(shape), "i32")}, backend)
    got = np.asarray(f.run({"x": x}))
    want = x.sum(axis=axes, dtype=np.int64)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.reshape(want.shape), want)


@pytest.mark.webgpu
@pytest.mark.skipif(not _webgpu_available(), reason="no native WebGPU adapter")
def test_virtual_tensor_past_u32_is_a_limit_error():
    from webgrad.codegen import LimitError
    with pytest.raises(LimitError) as e:
        forward(lambda x: ops.sum_all(ops.broadcast_to(x, (70000, 70000))),  # at:huge
                {"x": ([70000], "f32")}, "webgpu")
    msg = str(e.value)
    for w in ("broadcast_to", "4900000000", "sum", "32-bit", f"{THIS}:{line_of('huge')}"):
        assert w in msg, (w, msg)
    assert "@group" not in msg  # no WGSL dump


# ---------------------------------------------------------------- rank errors at trace time

def conv_rank(m, inp):
    return ops.sum_all(ops.conv2d(inp["x"], m.w))  # at:conv_rank


def conv_weight_rank(m, inp):
    return ops.sum_all(ops.conv2d(inp["x4"], inp["x"]))  # at:conv_weight


def split_rank(m, inp):
    return ops.sum_all(nn.split_heads(inp["x"], 2))  # at:split


def split_width(m, inp):
    return ops.sum_all(nn.split_heads(inp["x3"], 4))  # at:split_width


def merge_rank(m, inp):
    return ops.sum_all(nn.merge_heads(inp["x3"]))  # at:merge


def pool_rank(m, inp):
    return ops.sum_all(ops.max_pool2d(inp["x3"], 2))  # at:pool


class CW(Module):
    def __init__(self):
        super().__init__()
        self.w = self.param([2, 3, 3, 3])


RANK_ERRORS = [
    ("conv2d_input", conv_rank, ["conv2d", "rank 4", "[N, C, H, W]", "f32[5, 6]"], "conv_rank"),
    ("conv2d_weight", conv_weight_rank, ["conv2d", "weight", "rank 4", "f32[5, 6]"], "conv_weight"),
    ("split_heads", split_rank, ["split_heads", "rank-3", "f32[5, 6]"], "split"),
    ("split_heads_width", split_width, ["split_heads", "width 6", "4 heads"], "split_width"),
    ("merge_heads", merge_rank, ["merge_heads", "rank-4", "f32[2, 3, 6]"], "merge"),
    ("max_pool2d", pool_rank, ["max_pool2d", "rank 4", "f32[2, 3, 6]"], "pool"),
]


@pytest.mark.parametrize("name,fn,words,marker", RANK_ERRORS, ids=[r[0] for r in RANK_ERRORS])
def test_rank_errors_name_op_and_line(name, fn, words, marker):
    inputs = {"x": [5, 6], "x3": [2, 3, 6], "x4": [1, 3, 5, 5]}
    with pytest.raises(ShapeError) as e:
        wg.compile_module(CW, fn, inputs=inputs)
    msg = str(e.value)
    for w in words:
        assert w in msg, (w, msg)
    assert f"{THIS}:{line_of(marker)}" in msg, msg


# ---------------------------------------------------------------- comparison operators

def test_comparison_operators_are_elementwise():
    seen = {}

    values = [-1.0, 0.0, 0.5, 1.0, float("nan")]  # NaN made in the graph: feeds refuse it

    def fn():
        x = ops.constant(values)
        for name, t in [("le", x <= 0.5), ("ge", x >= 0.5), ("eq", x == 0.0), ("ne", x != 0.0),
                        ("lt", x < 0.5), ("gt", 0.5 < x)]:
            assert isinstance(t, wg.Tensor), (name, t)
            seen[name] = t
        return ops.concat([ops.unsqueeze(seen[k], 0) for k in sorted(seen)], 0)
    f = forward(fn, {}, "reference")
    x = np.array(values, np.float32)
    got = dict(zip(sorted(seen), f.run({})))
    with np.errstate(invalid="ignore"):
        want = {"le": x <= 0.5, "ge": x >= 0.5, "eq": x == 0.0, "ne": x != 0.0, "lt": x < 0.5,
                "gt": x > 0.5}
    for k in want:
        np.testing.assert_array_equal(got[k], want[k].astype(np.float32), err_msg=k)


def test_tensors_stay_hashable():
    def fn(x):
        d = {x: 1}
        assert d[x] == 1 and len({x, x}) == 1
        return x
    forward(fn, {"x": ([2], "f32")}, "reference")


# ---------------------------------------------------------------- scatter at vocabulary size


@pytest.mark.parametrize("backend", BACKENDS)
def test_scatter_add_rows_at_a_50k_vocabulary(backend):
    """The embedding gradient of a 50,000-token vocabulary: many repeated rows (a Zipf-like
    draw), compared with numpy's add.at in float64."""
    _check_scatter_50k(backend)


@pytest.mark.webgpu
@pytest.mark.skipif(not _webgpu_available(), reason="no native WebGPU adapter")
@pytest.mark.parametrize("tiled", [True, False])
def test_scatter_add_rows_scans_on_webgpu(tiled):
    """Both forms of scatter_add_rows' scan of the row counts (codegen/index.py): tiles in
    shared memory (GPUs; 50000 rows are 25 tiles of 2048, carried from tile to tile) and a
    chunk of rows per thread (CPU adapters, lavapipe's default), forced either way."""
    from webgrad.codegen import KernelOptions
    _check_scatter_50k("webgpu", KernelOptions(scan_tiled=tiled))


def _check_scatter_50k(backend, options=None):
    V, D, N = 50000, 8, 4096
    rng = np.random.default_rng(4)
    idx = np.minimum(rng.zipf(1.3, N) - 1, V - 1).astype(np.int32)
    vals = rng.standard_normal((N, D)).astype(np.float32)
    f = forward(lambda v, i: ops.scatter_add_rows(v, i, V), {"v": ([N, D], "f32"), "i": ([N], "i32")},
                backend, options)
    got = np.asarray(f.run({"v": vals, "i": idx}))
    want = np.zeros((V, D))
    np.add.at(want, idx, vals.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)
    if backend != "torch":  # torch's index_add_ picks its own order
        # deterministic: each row summed in index order, so bit-equal to numpy's float32 add.at
        exact = np.zeros((V, D), np.float32)
        np.add.at(exact, idx, vals)
        np.testing.assert_array_equal(got, exact)
        np.testing.assert_array_equal(np.asarray(f.run({"v": vals, "i": idx})), got)


# ---------------------------------------------------------------- embedding padding row


@pytest.mark.parametrize("backend", BACKENDS)
def test_embedding_padding_row_starts_at_zero_and_never_trains(backend):
    class E(Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(6, 4, padding_idx=1)

    def loss(m, inp):
        return ops.sum_all(ops.tanh(m.emb(inp["i"])) * inp["y"])
    c = wg.compile_module(E, loss, inputs={"i": ([8], "i32"), "y": [8, 4]},
                          optimizer=optim.SGD(lr=0.5), backend=backend)
    w0 = c.download_params()["emb.W"]
    np.testing.assert_array_equal(w0[1], 0.0)
    assert np.abs(np.delete(w0, 1, axis=0)).min() > 0
    rng = np.random.default_rng(0)
    for _ in range(3):
        c.step({"i": np.array([1, 1, 0, 2, 3, 1, 5, 4], np.int32),
                "y": rng.standard_normal((8, 4)).astype(np.float32)})
    w = c.download_params()["emb.W"]
    np.testing.assert_array_equal(w[1], 0.0)  # read 3 times per step, never updated
    assert (np.abs(w - w0)[[0, 2, 3, 4, 5]] > 0).all()


# ---------------------------------------------------------------- sin/cos range reduction


def test_two_over_pi_table_matches_the_digits():
    mpmath = pytest.importorskip("mpmath")
    from webgrad.codegen.elementwise import TWO_OVER_PI_WORDS
    mpmath.mp.prec = 400
    bits = int(mpmath.floor(2 / mpmath.pi * mpmath.mpf(2) ** 256))
    want = [0] + [(bits >> (32 * (7 - k))) & 0xFFFFFFFF for k in range(8)]
    assert list(TWO_OVER_PI_WORDS) == want


@pytest.mark.webgpu
@pytest.mark.skipif(not _webgpu_available(), reason="no native WebGPU adapter")
def test_sin_cos_keep_f32_accuracy_at_any_magnitude():
    """Up to 3.4e38: within 2e-7 of the true value of the f32 argument (numpy's float64
    sin reduces exactly), where a three-part Cody-Waite reduction alone drifts to 1e-2."""
    rng = np.random.default_rng(5)
    x = (rng.uniform(-1, 1, 3000) * 10.0 ** rng.uniform(-2, 38.5, 3000)).astype(np.float32)
    x[:5] = [8192.0, 8192.5, 1e5, 3.4e38, -3.4e38]
    f = forward(lambda x: ops.concat([ops.sin(x), ops.cos(x)], 0), {"x": ([3000], "f32")}, "webgpu")
    got = np.asarray(f.run({"x": x}), np.float64)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(got, np.concatenate([np.sin(x64), np.cos(x64)]), rtol=0, atol=2e-7)
    f1 = forward(lambda x: ops.sin(x * ops.constant([math.inf, -math.inf, math.nan])),
                 {"x": ([3], "f32")}, "webgpu")  # NaN made in the graph: feeds refuse it
    assert np.isnan(f1.run({"x": np.ones(3, np.float32)})).all()
