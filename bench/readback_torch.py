"""Host read-back of a large result on the CPU executors: torch vs the numpy reference.

A forward program returns an [n, n] f32 tensor (2 * W for a parameter W); `run()` converts
the executor's array into a HostArray and then into the user's numpy array. The torch
executor once copied its storage byte by byte (8.7 s for 1024 x 1024); now one memcpy.
The peer in the same run is the reference executor (numpy's tobytes), and the floor is
torch's own `.numpy()` copy of the same tensor.

    python3 bench/readback_torch.py                 # n = 1024, best of 5
    python3 bench/readback_torch.py --n 2048 --reps 3
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pkg"))

import torch  # noqa: E402

import webgrad as wg  # noqa: E402
from webgrad import Module  # noqa: E402


def best_of(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()

    class Square(Module):
        def __init__(self):
            super().__init__()
            self.W = self.param([a.n, a.n])

    rows = []
    for backend in ("torch", "reference"):
        f = wg.compile_forward(Square, lambda m, inp: m.W * 2.0, inputs={}, backend=backend)
        f.run({})
        rows.append((backend, best_of(lambda: f.run({}), a.reps)))
    t = torch.randn(a.n, a.n)
    rows.append(("torch .numpy().copy() (floor)", best_of(lambda: (t * 2.0).numpy().copy(), a.reps)))
    ref = rows[1][1]
    print(f"run() of an f32[{a.n}, {a.n}] output, best of {a.reps}")
    print(f"{'executor':32} {'ms':>9} {'vs reference':>13}")
    for name, s in rows:
        print(f"{name:32} {1e3 * s:9.2f} {s / ref:12.2f}x")


if __name__ == "__main__":
    main()
