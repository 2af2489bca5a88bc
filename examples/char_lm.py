"""A character-level language model learns the text of Python's own help (pydoc_data.topics).

The corpus is every help topic of the standard library's `pydoc_data.topics` (the text
`help("for")` prints), about 460k characters. A 2-layer causal transformer reads 64
characters and predicts each next one; every few hundred steps it writes text of its own
(sampled one character at a time at temperature 0.8 from a forward program that shares the
trained parameters), so you can watch it go from noise to words to Python-documentation prose.

    python3 examples/char_lm.py                   # webgpu; or: reference | torch | auto

In the playground (examples menu) the file runs as it is and shows the samples as it trains.
"""
from __future__ import annotations

import array
import math
import random
import time

import webgrad as wg
from webgrad import Module, init, lr, nn, ops, optim, playground

T, D, HEADS, LAYERS = 64, 96, 4, 2
B = 32
STEPS = 3000
SEED = 0


def corpus() -> str:
    from pydoc_data.topics import topics  # in the browser serve.py ships it as a wheel
    text = "\n\n".join(topics[k] for k in sorted(topics))
    return "".join(ch if ch.isascii() else "?" for ch in text)


class Block(Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)


class CharModel(Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, D, init_w=init.randn(0.1))
        self.pos = self.param([T, D], init=init.randn(0.02))
        self.blocks = [Block() for _ in range(LAYERS)]
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, vocab, init_w=init.randn(0.02))  # starts near uniform


def logits(m: CharModel, idx):
    x = m.tok(idx) + m.pos
    for p in m.blocks:
        h = p.qkv(p.ln1(x))
        q, k, v = (nn.split_heads(ops.slice_last_range(h, i * D, (i + 1) * D), HEADS)
                   for i in range(3))
        scores = (q @ ops.swap_axes(k, -1, -2)) * (1.0 / math.sqrt(D // HEADS))
        x = x + p.proj(nn.merge_heads(ops.softmax_causal_last(scores) @ v))
        x = x + p.fc2(ops.gelu(p.fc1(p.ln2(x))))
    return m.head(m.ln_f(x))


def loss_fn(m, inp):
    return nn.cross_entropy_last(logits(m, inp["idx"]), inp["target"])


class Data:
    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {ch: i for i, ch in enumerate(self.chars)}
        self.ids = array.array("i", (self.index[ch] for ch in text))

    def batch(self, rng: random.Random) -> dict:
        idx, target = array.array("i"), array.array("i")
        for _ in range(B):
            at = rng.randrange(len(self.ids) - T - 1)
            idx.extend(self.ids[at:at + T])
            target.extend(self.ids[at + 1:at + T + 1])
        return {"idx": idx, "target": target}


def build(data: Data, backend: str = "webgpu", seed: int = SEED, steps: int = STEPS):
    schedule = lr.warmup(peak=2e-3, steps=100,
                         after=lr.cosine_decay(peak=2e-3, final=2e-4, steps=max(steps - 100, 1)))
    return wg.compile_module(lambda: CharModel(len(data.chars)), loss_fn,
                             inputs={"idx": ([B, T], "i32"), "target": ([B, T], "i32")},
                             optimizer=optim.AdamW(lr=schedule, weight_decay=0.01),
                             backend=backend, seed=seed)


class Sampler:
    """Text from the model, one character per forward pass of the last T characters."""

    def __init__(self, c, data: Data):
        self.data = data
        self.next = c.compile_forward(lambda m, inp: ops.slice(logits(m, inp["idx"]), 1, T - 1, T),
                                      inputs={"idx": ([1, T], "i32")})

    def sample(self, prompt: str, n: int, rng: random.Random, temperature: float = 0.8) -> str:
        ids = [self.data.index.get(ch, 0) for ch in prompt][-T:]
        ids = [self.data.index[" "]] * (T - len(ids)) + ids
        out = []
        for _ in range(n):
            row = playground.flat(self.next.run({"idx": [ids[-T:]]}))  # [1, 1, V]
            top = max(row)
            weights = [math.exp((v - top) / temperature) for v in row]
            k = rng.choices(range(len(weights)), weights)[0]
            ids.append(k)
            out.append(self.data.chars[k])
        return prompt + "".join(out)


def train(c, data: Data, steps: int = STEPS, seed: int = SEED, log=print,
          sample_every: int = 300, sample_chars: int = 240) -> dict:
    rng, srng = random.Random(seed + 1), random.Random(seed + 2)
    sampler = Sampler(c, data)
    losses, text = [], ""
    for step in range(steps):
        losses.append(c.step(data.batch(rng)))
        figure = None
        # not at step 0: sampling costs a forward run per character (~10 s of SwiftShader
        # before the first point of the chart), and an untrained model writes only noise
        if sample_every and ((step + 1) % sample_every == 0 or step == steps - 1):
            text = sampler.sample("The ", sample_chars, srng)
            figure = playground.text(f"sampled after {step + 1} step{'s' if step else ''} "
                                     f"(loss {losses[-1]:.2f})", text)
            log(f"step {step + 1:5d}  loss {losses[-1]:.3f}\n{text}\n")
        playground.report(step=step, loss=losses[-1], figure=figure, total=steps)
    return {"losses": losses, "loss": sum(losses[-20:]) / len(losses[-20:]), "sample": text}


if __name__ == "__main__":
    backend = playground.example_backend()  # the page: "auto" (WebGPU, else the CPU's "wasm")
    data = Data(corpus())
    print(f"{len(data.ids)} characters, vocabulary {len(data.chars)}")
    c = build(data, backend)  # a global: the page's weights buttons and kernel panel find it
    print(f"compiled on {c.backend.name}: {c.kernel_count} kernels per training step")
    t0 = time.perf_counter()
    result = train(c, data)
    print(f"loss {result['loss']:.3f} ({math.log(len(data.chars)):.2f} for uniform guessing) "
          f"after {len(result['losses'])} steps, {time.perf_counter() - t0:.0f} s")
