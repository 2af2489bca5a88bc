"""Shared model definitions for the test suites, in plain webgrad.

Two models are reused by several suites (reference/torch here, WebGPU and the browser
later), so this file imports only webgrad, math and random: no numpy, no torch. The
browser suite ships this very file into Pyodide (`source()` returns its text) and runs
the same model code there.

  MLP          tensorgrad's MLP fitting sin(x): B=256, 1-64-64-1, kaiming W, zeros b, relu,
               loss sum(d*d)/B, trained with Adam(lr=0.005) on x ~ U(-pi, pi).
  Transformer  a tiny pre-LN causal transformer (2 layers, 2 heads, GELU MLP) trained on
               a fixed batch of a sequence-reversal task, with nn.cross_entropy_last.
"""
from __future__ import annotations

import math
import random

import webgrad as wg
from webgrad import Module, init, nn, ops, optim


def source() -> str:
    """This file's text, to ship into another interpreter (the browser worker)."""
    with open(__file__, encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------- MLP fitting sin(x)

MLP_B = 256


class Linear(Module):
    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.W = self.param([d_in, d_out], init=init.kaiming())
        self.b = self.param([d_out], init="zeros")


def linear(p: Linear, x):
    return x @ p.W + p.b


class MLP(Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = Linear(1, 64), Linear(64, 64), Linear(64, 1)


def mlp_forward(m: MLP, x):
    h = ops.relu(linear(m.l1, x))
    h = ops.relu(linear(m.l2, h))
    return linear(m.l3, h)


def mlp_loss(m: MLP, inp):
    d = mlp_forward(m, inp["x"]) - inp["y"]
    return ops.sum_all(d * d) / MLP_B


MLP_INPUTS = {"x": ([MLP_B, 1], "f32"), "y": ([MLP_B, 1], "f32")}


def compile_mlp(backend: str = "reference", seed: int = 0, **kw):  # kw: compile_module's
    return wg.compile_module(MLP, mlp_loss, inputs=MLP_INPUTS, optimizer=optim.Adam(lr=0.005),
                             backend=backend, seed=seed, **kw)


def sin_batch(rng: random.Random, b: int = MLP_B) -> dict:
    """x ~ U(-pi, pi) and y = sin(x), as nested lists [b, 1]."""
    xs = [rng.uniform(-math.pi, math.pi) for _ in range(b)]
    return {"x": [[x] for x in xs], "y": [[math.sin(x)] for x in xs]}


# ---------------------------------------------------------------- tiny causal transformer

VOCAB = 12          # digits 0..9, SEP = 10, 11 unused
SEP = 10
HALF = 4            # a sequence is HALF digits, SEP, then the digits reversed
SEQ = 2 * HALF      # the model reads the first SEQ of the 2*HALF+1 tokens
D_MODEL = 32
N_HEADS = 2
N_LAYERS = 2
TF_B = 16


class Block(Module):
    """Pre-LN: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, d: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.Wq = self.param([d, d], init=init.randn(0.1))
        self.Wk = self.param([d, d], init=init.randn(0.1))
        self.Wv = self.param([d, d], init=init.randn(0.1))
        self.Wo = self.param([d, d], init=init.randn(0.1))
        self.W1 = self.param([d, 4 * d], init=init.randn(0.1))
        self.b1 = self.param([4 * d], init="zeros")
        self.W2 = self.param([4 * d, d], init=init.randn(0.1))
        self.b2 = self.param([d], init="zeros")


def attention(p: Block, x, n_heads: int):
    q = nn.split_heads(x @ p.Wq, n_heads)   # [B, H, T, Dh]
    k = nn.split_heads(x @ p.Wk, n_heads)
    v = nn.split_heads(x @ p.Wv, n_heads)
    scores = (q @ ops.swap_axes(k, -1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    return nn.merge_heads(ops.softmax_causal_last(scores) @ v) @ p.Wo


def block(p: Block, x, n_heads: int):
    x = x + attention(p, p.ln1(x), n_heads)
    return x + ops.gelu(p.ln2(x) @ p.W1 + p.b1) @ p.W2 + p.b2


class Transformer(Module):
    def __init__(self, vocab: int = VOCAB, seq: int = SEQ, d: int = D_MODEL,
                 n_layers: int = N_LAYERS):
        super().__init__()
        self.tok = nn.Embedding(vocab, d, init_w=init.randn(0.5))
        self.pos = self.param([seq, d], init=init.randn(0.5))
        self.blocks = [Block(d) for _ in range(n_layers)]
        self.ln_f = nn.LayerNorm(d)
        self.head = self.param([d, vocab], init=init.randn(0.1))


def transformer_logits(m: Transformer, idx, n_heads: int = N_HEADS):
    """i32 [B, T] tokens -> f32 [B, T, vocab] next-token logits."""
    x = m.tok(idx) + m.pos
    for p in m.blocks:
        x = block(p, x, n_heads)
    return m.ln_f(x) @ m.head


def transformer_loss(m: Transformer, inp):
    """Cross entropy on the reversed half only: those tokens follow from the context,
    the first half's digits are random."""
    logits = transformer_logits(m, inp["idx"])
    answer = ops.slice(logits, 1, SEQ - HALF, SEQ)          # positions SEP .. end-1
    return nn.cross_entropy_last(answer, inp["target"])


TF_INPUTS = {"idx": ([TF_B, SEQ], "i32"), "target": ([TF_B, HALF], "i32")}


def compile_transformer(backend: str = "reference", seed: int = 0, optimizer="adam", **kw):
    """optimizer: "adam" for Adam(lr=0.01), an optim.* instance, or None (gradients only)."""
    opt = optim.Adam(lr=0.01) if optimizer == "adam" else optimizer
    return wg.compile_module(Transformer, transformer_loss, inputs=TF_INPUTS, optimizer=opt,
                             backend=backend, seed=seed, **kw)


def reversal_batch(seed: int = 0, b: int = TF_B) -> dict:
    """A fixed batch: idx = digits, SEP, reversed digits (minus the last); target = the
    reversed digits. Nested lists of ints (i32 feeds)."""
    rng = random.Random(seed)
    idx, target = [], []
    for _ in range(b):
        digits = [rng.randrange(10) for _ in range(HALF)]
        rev = digits[::-1]
        idx.append(digits + [SEP] + rev[:-1])
        target.append(rev)
    return {"idx": idx, "target": target}
