"""Texts the tokenizer tests and bench/tokenizers.py share: Python's own docs as prose, and
issue 29's worst case, one long word without spaces (the prose's letters run together)."""
from __future__ import annotations

import time


def prose() -> str:
    from pydoc_data.topics import topics
    return "\n\n".join(topics[k] for k in sorted(topics))


def long_word(n: int = 2**20) -> str:
    letters = "".join(c for c in prose() if c.isascii() and c.isalpha())
    return (letters * (n // len(letters) + 1))[:n]


def best_cpu_seconds(fn, reps: int = 2) -> tuple[object, float]:
    """fn()'s result and its best CPU time over reps runs (CPU time, so that other jobs on
    the machine count less than in wall time)."""
    times = []
    for _ in range(reps):
        t = time.process_time()
        out = fn()
        times.append(time.process_time() - t)
    return out, min(times)
