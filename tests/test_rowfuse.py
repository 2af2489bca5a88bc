"""The row-fusion pass (codegen/rowfuse_match.py, codegen/rowfuse.py), device-free.

Which graphs are rewritten: cross entropy keeps no [N, V] log-probabilities and picks the
target instead of scanning the vocabulary; layer_norm_last's gradient is one
layer_norm_grad kernel; a log_softmax that is itself an output stays. The values are
checked against torch by the oracle records (nn.cross_entropy_last/*, nn.LayerNorm/*,
layer_norm_last/*, take_along_last/*) on every executor, lavapipe and the browser, and the
whole test transformer against the reference executor (tests/test_webgpu_programs.py).
"""
from __future__ import annotations

import pytest

import models
import oracle
from webgrad import optim, ops
from webgrad.codegen import Limits, lower
from webgrad.codegen.rowfuse_match import rewrite_rows
from webgrad.compile import build_train_graph, build_forward_graph, parse_inputs


def _record_graph(name):
    factory, loss_fn, inputs, _ = oracle.build_record(oracle.BY_NAME[name])
    return build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]


@pytest.mark.parametrize("name", ["nn.cross_entropy_last", "nn.cross_entropy_last/vocab_50257",
                                  "nn.cross_entropy_last/odd_rows"])
def test_cross_entropy_stores_only_the_logits(name):
    """No [N, V] tensor but the logits' gradient: log-probabilities are logits - lse, the
    target's is picked; the one-hot of the backward is computed where it is read."""
    g = _record_graph(name)
    V = g[g.params["a"]].shape[-1]
    g2 = rewrite_rows(g)
    ops_ = {n.op for n in g2.nodes}
    assert {"logsumexp_last", "pick_last"} <= ops_ and "log_softmax_last" not in ops_
    low, names = lower(g, Limits())
    big = [b for b in low.plan["buffers"] if b["size"] >= 4 * V * (g[g.params["a"]].size // V)]
    # the logits (a parameter here) and their gradient (kept as grad/a): nothing else
    assert len(big) == 2, big
    assert names.count("logsumexp_last " + f"{g[g.params['a']].size // V}x{V}") == 1, names


def test_layer_norm_backward_is_one_kernel():
    g = _record_graph("nn.LayerNorm/width_768")
    g2 = rewrite_rows(g)
    assert sum(n.op == "layer_norm_grad" for n in g2.nodes) == 1
    assert sum(n.op == "sum" for n in g2.nodes) == 3  # loss, dweight, dbias
    _, names = lower(g, Limits())
    assert names == ["layer_norm_last", "sum", "sum", "sum", "layer_norm_grad 3x768", "elementwise"]


def test_log_softmax_output_is_left_alone():
    g = build_forward_graph(lambda: __import__("webgrad").Module(),
                            lambda m, i: ops.log_softmax_last(i["x"]), {"x": ((4, 9), "f32")})[1]
    assert rewrite_rows(g) is g


def test_transformer_kernel_count():
    """tests/models.py's transformer step, kernels per step with each pass on or off."""
    from webgrad.codegen import KernelOptions
    g = build_train_graph(models.Transformer, models.transformer_loss,
                          parse_inputs(models.TF_INPUTS), optim.Adam(lr=0.01))[1]
    counts = {}
    for attn in (False, True):
        for rows in (False, True):
            opts = KernelOptions(fuse_attention=None if attn else False, fuse_rows=rows)
            counts[(attn, rows)] = len(lower(g, Limits(options=opts))[1])
    print(f"transformer step kernels: plain {counts[(False, False)]}, attention "
          f"{counts[(True, False)]}, rows {counts[(False, True)]}, both {counts[(True, True)]}")
    # per layer norm (5): 4 row sums + the elementwise rest -> 1; cross entropy: -1
    assert counts[(False, True)] <= counts[(False, False)] - 3 * 5
    assert counts[(True, True)] < counts[(True, False)] < counts[(False, False)]


def test_logit_gradient_takes_over_the_logits_buffer():
    """h @ W -> cross entropy over 1000 classes: the logits' gradient is written in place of
    the logits (buffers.Live.donor), so the step holds one [N, V] temporary, not two."""
    from webgrad import Module, init, nn

    N, d, V = 64, 16, 1000

    class Head(Module):
        def __init__(self):
            super().__init__()
            self.h = self.param([N, d], init=init.randn(1.0))
            self.W = self.param([d, V], init=init.randn(0.1))

    def loss(m, inp):
        return nn.cross_entropy_last(m.h @ m.W, inp["t"])
    g = build_train_graph(Head, loss, parse_inputs({"t": ([N], "i32")}), None)[1]
    low, _ = lower(g, Limits())
    pool = [b for b in low.plan["buffers"] if b["label"].startswith("pool")]
    assert sum(b["size"] >= 4 * N * V for b in pool) == 1, pool


def test_donor_shares_only_in_the_writing_step():
    """plan_pool: a tensor may take its donor's buffer only when the donor's last read is
    the step that writes it; otherwise the usual rule (no buffer shared within a step)."""
    from webgrad.buffers import Live, plan_pool
    slots, a = plan_pool([Live("x", 400, 0, 1), Live("y", 400, 1, 2, donor="x")])
    assert a["x"] == a["y"] and len(slots) == 1
    slots, a = plan_pool([Live("x", 400, 0, 2), Live("y", 400, 1, 3, donor="x")])
    assert a["x"] != a["y"]  # x is still read after y is written
    slots, a = plan_pool([Live("x", 400, 0, 1), Live("y", 400, 1, 2)])
    assert a["x"] != a["y"]
