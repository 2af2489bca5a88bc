"""A small convnet (conv2d, max_pool2d) learns to read generated digits, with its confusion matrix.

The data set is made here, so it needs no download: each 16x16 image is one digit of a 5x7
bitmap font, drawn at a random size (1x or 2x pixels wide), position and stroke darkness, with
pixel noise and a few strokes knocked out. 4,000 training and 1,000 test images come from fixed
seeds. The net is conv 3x3 (1 -> 8) - relu - maxpool 2 - conv 3x3 (8 -> 16) - relu - maxpool 2 -
linear (256 -> 10); the confusion matrix of the test set is drawn while it trains.

    python3 examples/digits_convnet.py            # webgpu; or: reference | torch | auto

In the playground (examples menu) the file runs as it is and draws the matrix as it trains.
"""
from __future__ import annotations

import array
import random
import time

import webgrad as wg
from webgrad import Module, nn, ops, optim, playground

S = 16                     # image side
B = 64
N_TRAIN, N_TEST = 4000, 1000
STEPS = 600
SEED = 0

FONT = [  # 5x7 bitmaps, "#" = ink; digit d is FONT[d]
    [".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."],
    ["..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."],
    [".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"],
    ["#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."],
    ["...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."],
    ["#####", "#....", "####.", "....#", "....#", "#...#", ".###."],
    ["..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."],
    ["#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."],
    [".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."],
    [".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."],
]


def glyph(d: int) -> list[list[int]]:
    return [[1 if ch == "#" else 0 for ch in row] for row in FONT[d]]


def render(d: int, rng: random.Random) -> list[float]:
    """One S*S image (row-major floats in [0, 1]) of digit d."""
    scale = rng.choice((1, 2)) if rng.random() < 0.7 else 2
    g = glyph(d)
    h, w = 7 * scale, 5 * scale
    top, left = rng.randrange(S - h + 1), rng.randrange(S - w + 1)
    ink = rng.uniform(0.6, 1.0)
    img = [rng.uniform(0.0, 0.15) for _ in range(S * S)]
    for r in range(7):
        for c in range(5):
            if g[r][c] and rng.random() > 0.08:  # knock out a few strokes
                for dy in range(scale):
                    for dx in range(scale):
                        img[(top + r * scale + dy) * S + left + c * scale + dx] = ink
    return img


def dataset(n: int, seed: int) -> tuple[array.array, list[int]]:
    rng = random.Random(seed)
    labels = [rng.randrange(10) for _ in range(n)]
    images = array.array("f")
    for d in labels:
        images.extend(render(d, rng))
    return images, labels


class ConvNet(Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * (S // 4) ** 2, 10)


def logits(m: ConvNet, x):
    n = x.shape[0]
    h = ops.max_pool2d(ops.relu(m.c1(x)), 2)
    h = ops.max_pool2d(ops.relu(m.c2(h)), 2)
    return m.fc(ops.reshape(h, (n, 16 * (S // 4) ** 2)))


def loss_fn(m, inp):
    return nn.cross_entropy_last(logits(m, inp["x"]), inp["y"])


def build(backend: str = "webgpu", seed: int = SEED):
    return wg.compile_module(ConvNet, loss_fn,
                             inputs={"x": ([B, 1, S, S], "f32"), "y": ([B], "i32")},
                             optimizer=optim.Adam(lr=3e-3), backend=backend, seed=seed)


def confusion(classify, images, labels) -> tuple[list[list[int]], float]:
    pred = playground.flat(classify.run({"x": images}))
    rows = [[0] * 10 for _ in range(10)]
    for t, p in zip(labels, pred):
        rows[t][int(p)] += 1
    return rows, sum(rows[i][i] for i in range(10)) / len(labels)


def train(c, steps: int = STEPS, seed: int = SEED, log=print, eval_every: int = 100,
          n_train: int = N_TRAIN, n_test: int = N_TEST) -> dict:
    train_x, train_y = dataset(n_train, seed)
    test_x, test_y = dataset(n_test, seed + 1)
    classify = c.compile_forward(lambda m, inp: ops.argmax_last(logits(m, inp["x"])),
                                 inputs={"x": ([n_test, 1, S, S], "f32")})
    rng = random.Random(seed + 2)
    losses, accuracy, rows = [], None, None
    for step in range(steps):
        pick = [rng.randrange(n_train) for _ in range(B)]
        x = array.array("f")
        for i in pick:
            x.extend(train_x[i * S * S:(i + 1) * S * S])
        losses.append(c.step({"x": x, "y": [train_y[i] for i in pick]}))
        figure = None
        if eval_every and (step % eval_every == eval_every - 1 or step == steps - 1):
            rows, accuracy = confusion(classify, test_x, test_y)
            figure = playground.matrix(f"test set after {step + 1} steps: {accuracy:.1%} right",
                                       range(10), rows)
            log(f"step {step + 1:4d}  loss {losses[-1]:.4f}  test accuracy {accuracy:.1%}")
        playground.report(step=step, loss=losses[-1], figure=figure, total=steps)
    return {"losses": losses, "accuracy": accuracy, "confusion": rows}


if __name__ == "__main__":
    backend = playground.example_backend()  # the page: "auto" (WebGPU, else the CPU's "wasm")
    c = build(backend)  # a global: the page's weights buttons and kernel panel find it
    print(f"compiled on {c.backend.name}: {c.kernel_count} kernels per training step")
    t0 = time.perf_counter()
    result = train(c)
    print(f"test accuracy {result['accuracy']:.1%} after {len(result['losses'])} steps "
          f"({time.perf_counter() - t0:.0f} s)")
