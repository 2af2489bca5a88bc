"""A 3-layer causal transformer learns 2-digit addition (tensorgrad's sample), with attention maps.

Each example is one sequence of 9 tokens: the two addends' digits, "+", "=", and the sum's
three digits written backwards (least significant first, so each digit depends only on the
digits already known and one carry):  4 7 + 3 8 = 5 8 0  is 47 + 38 = 085. The model reads the
first 8 tokens and is trained, with cross entropy, to predict the three digits of the sum at
positions "=", s0, s1. One in ten of the 10,000 possible pairs is held out: the accuracy
reported is greedy decoding (three forward passes, feeding each predicted digit back) on
sums the model never saw. Attention probabilities of every layer are captured
(`ops.capture`) and drawn as heatmaps while it trains.

    python3 examples/transformer_addition.py            # webgpu; or: reference | torch | auto

In the playground (examples menu) the file runs as it is and reports to the page.
"""
from __future__ import annotations

import math
import random
import time

import webgrad as wg
from webgrad import Module, init, lr, nn, ops, optim, playground

VOCAB = 12                 # digits, PLUS = 10, EQUALS = 11
PLUS, EQUALS = 10, 11
T = 8                      # tokens read: a1 a0 + b1 b0 = s0 s1 (s2 is only predicted)
ANSWER = 5                 # positions 5, 6, 7 predict s0, s1, s2
D, HEADS, LAYERS = 64, 4, 3
B = 128
STEPS = 1500
SEED = 0


def tokens(a: int, b: int) -> list[int]:
    s = a + b
    return [a // 10, a % 10, PLUS, b // 10, b % 10, EQUALS, s % 10, s // 10 % 10, s // 100]


def split(seed: int = SEED) -> tuple[list, list]:
    """All 10,000 (a, b) pairs, shuffled: (train 9,000, held out 1,000)."""
    pairs = [(a, b) for a in range(100) for b in range(100)]
    random.Random(seed).shuffle(pairs)
    return pairs[1000:], pairs[:1000]


class Block(Module):
    """Pre-LN block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)


class AdderTransformer(Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D, init_w=init.randn(0.1))
        self.pos = self.param([T, D], init=init.randn(0.1))
        self.blocks = [Block() for _ in range(LAYERS)]
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, init_w=init.randn(0.02))  # starts near uniform


def logits(m: AdderTransformer, idx):
    """i32 [N, T] -> f32 [N, T, VOCAB]; captures attention probabilities as "attn{layer}"."""
    x = m.tok(idx) + m.pos
    for layer, p in enumerate(m.blocks):
        h = p.qkv(p.ln1(x))
        q, k, v = (nn.split_heads(ops.slice_last_range(h, i * D, (i + 1) * D), HEADS)
                   for i in range(3))
        scores = (q @ ops.swap_axes(k, -1, -2)) * (1.0 / math.sqrt(D // HEADS))
        probs = ops.capture(f"attn{layer}", ops.softmax_causal_last(scores))  # [N, H, T, T]
        x = x + p.proj(nn.merge_heads(probs @ v))
        x = x + p.fc2(ops.gelu(p.fc1(p.ln2(x))))
    return m.head(m.ln_f(x))


def loss_fn(m, inp):
    answer = ops.slice(logits(m, inp["idx"]), 1, ANSWER, T)      # [B, 3, VOCAB]
    return nn.cross_entropy_last(answer, inp["target"])


def batch(rng: random.Random, pairs: list) -> dict:
    seqs = [tokens(*rng.choice(pairs)) for _ in range(B)]
    return {"idx": [s[:T] for s in seqs], "target": [s[ANSWER + 1:] for s in seqs]}


def schedule(steps: int = STEPS):
    """Linear warm-up to 3e-3 over 100 steps, then cosine decay to 1e-4 by `steps`."""
    return lr.warmup(peak=3e-3, steps=100,
                     after=lr.cosine_decay(peak=3e-3, final=1e-4, steps=max(steps - 100, 1)))


def build(backend: str = "webgpu", seed: int = SEED, steps: int = STEPS):
    return wg.compile_module(AdderTransformer, loss_fn,
                             inputs={"idx": ([B, T], "i32"), "target": ([B, 3], "i32")},
                             optimizer=optim.AdamW(lr=schedule(steps), weight_decay=0.01),
                             backend=backend, seed=seed)


class Evaluator:
    """Greedy decoding of held-out sums, and attention maps of one example."""

    def __init__(self, c, pairs: list):
        self.pairs = pairs
        n = len(pairs)
        self.decode = c.compile_forward(lambda m, inp: ops.argmax_last(logits(m, inp["idx"])),
                                        inputs={"idx": ([n, T], "i32")})
        self.one = c.compile_forward(lambda m, inp: logits(m, inp["idx"]),
                                     inputs={"idx": ([1, T], "i32")})

    def accuracy(self) -> float:
        seqs = [tokens(a, b) for a, b in self.pairs]
        idx = [s[:ANSWER + 1] + [0, 0] for s in seqs]
        for k in range(3):  # causal: position ANSWER + k sees only the digits already decoded
            pred = self.decode.run({"idx": idx}).tolist()
            for row, p in zip(idx, pred):
                if k < 2:
                    row[ANSWER + 1 + k] = int(p[ANSWER + k])
                else:
                    row.append(int(p[ANSWER + k]))
        right = sum(row[ANSWER + 1:] == s[ANSWER + 1:] for row, s in zip(idx, seqs))
        return right / len(seqs)

    def attention(self, a: int, b: int) -> dict:
        _, caps = self.one.run({"idx": [tokens(a, b)[:T]]}, with_captures=True)
        labels = "".join("0123456789+="[t] for t in tokens(a, b)[:T])
        maps = []
        for layer in range(LAYERS):
            probs = caps[f"attn{layer}"].tolist()[0]
            maps += [(f"layer {layer} head {h}", probs[h]) for h in range(HEADS)]
        # the model reads and writes the sum lowest digit first: 47+38= is followed by 5, 8
        return playground.heatmaps(f"attention on {a}+{b}={a + b}, read as the tokens {labels} "
                                   "(the sum's digits reversed; rows: query, cols: key)", maps)


def train(c, steps: int = STEPS, seed: int = SEED, log=print, eval_every: int = 250) -> dict:
    """Train `steps` steps; evaluate held-out exact match every `eval_every` steps and at the
    end. Returns {"loss", "accuracy", "losses", "steps"}."""
    pairs, held_out = split(seed)
    rng = random.Random(seed + 1)
    ev = Evaluator(c, held_out)
    losses, accuracy = [], None
    for step in range(steps):
        losses.append(c.step(batch(rng, pairs)))
        last = step == steps - 1
        figure = None
        if step % 50 == 0 or last:
            figure = ev.attention(47, 38)
        if eval_every and (step % eval_every == eval_every - 1 or last):
            accuracy = ev.accuracy()
            log(f"step {step + 1:5d}  loss {losses[-1]:.4f}  held-out exact match {accuracy:.1%}")
        playground.report(step=step, loss=losses[-1], figure=figure, total=steps,
                          **({"accuracy": accuracy} if accuracy is not None else {}))
    return {"loss": sum(losses[-20:]) / len(losses[-20:]), "accuracy": accuracy,
            "losses": losses, "steps": steps}


if __name__ == "__main__":
    backend = playground.example_backend()  # the page: "auto" (WebGPU, else the CPU's "wasm")
    c = build(backend)  # a global: the page's weights buttons and kernel panel find it
    print(f"compiled on {c.backend.name}: {c.kernel_count} kernels per training step")
    t0 = time.perf_counter()
    result = train(c)
    print(f"loss {result['loss']:.4f}, held-out exact match {result['accuracy']:.2%} after "
          f"{result['steps']} steps ({time.perf_counter() - t0:.0f} s)")
