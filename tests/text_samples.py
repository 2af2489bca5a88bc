"""Texts the tokenizer tests and bench/tokenizer_speed.py share: Python's own docs as prose, and
issue 29's worst case, one long word without spaces (the prose's letters run together)."""
from __future__ import annotations

import time


def prose() -> str:
    from pydoc_data.topics import topics
    return "\n\n".join(topics[k] for k in sorted(topics))


def long_word(n: int = 2**20) -> str:
    letters = "".join(c for c in prose() if c.isascii() and c.isalpha())
    return (letters * (n // len(letters) + 1))[:n]


def random_word(n: int, seed: int = 0) -> str:
    """n ASCII letters drawn at random: a word without spaces whose pieces do not repeat (the
    tokenizer's cache of equal chunks does not help it, as it does the prose's letters)."""
    import random
    import string
    return "".join(random.Random(seed).choices(string.ascii_letters, k=n))


def best_cpu_seconds(fn, reps: int = 2) -> tuple[object, float]:
    """fn()'s result and its best CPU time over reps runs (CPU time, so that other jobs on
    the machine count less than in wall time; the collector off, so a collection that the
    run happens to trigger is not timed)."""
    import gc
    times = []
    for _ in range(reps):
        gc.collect()
        gc.disable()
        try:
            t = time.process_time()
            out = fn()
            times.append(time.process_time() - t)
        finally:
            gc.enable()
    return out, min(times)


def growth(encode, n: int = 2**16, factor: int = 8) -> float:
    """How many times longer encode(word) takes for a random word `factor` times longer than
    n letters (best of three each): about `factor` when the time is linear in the input,
    factor squared when it is quadratic. A ratio of two timings on the same machine in the
    same minute, so a slow or busy machine does not change it the way it changes seconds."""
    short, long = random_word(n, seed=1), random_word(n * factor, seed=2)
    _, small = best_cpu_seconds(lambda: encode(short), reps=3)
    _, large = best_cpu_seconds(lambda: encode(long), reps=3)
    return large / small
