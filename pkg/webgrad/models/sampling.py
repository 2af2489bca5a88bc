"""Drawing the next token from logits: temperature, top-k, top-p (nucleus), seeded.

Definitions (the tests check each one):
  temperature T > 0   p_i = softmax(logits / T)_i; T = 0 means greedy (the argmax, first on ties)
  top_k = k           only the k most likely tokens stay (ties broken by lower token id)
  top_p = q           the smallest set of most likely tokens whose probability sums to >= q
                      stays (at least one token), after top_k; then renormalised
The draw is inverse-CDF with one u = rng.random() per token over the kept tokens in
descending probability order, from a `random.Random(seed)`: pure Python, so a seed gives the
same tokens on every backend and in the browser (given the same logits).
"""
from __future__ import annotations

import heapq
import math
import random

from ..init import check_seed


def check_params(temperature, top_k, top_p) -> None:
    if not (isinstance(temperature, (int, float)) and temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"generate: temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"generate: top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"generate: top_p must be None or in (0, 1], got {top_p!r}")


def rng(seed) -> random.Random:
    return random.Random(f"webgrad.sampling:{check_seed(seed, 'generate')}")


def kept_distribution(logits, *, temperature=1.0, top_k=None, top_p=None) -> list[tuple[int, float]]:
    """[(token, probability)] of the tokens that may be drawn, most likely first, summing to 1."""
    vals = [float(v) for v in _flat(logits.tolist() if hasattr(logits, "tolist") else logits)]
    n = len(vals)
    order_key = lambda i: (-vals[i], i)  # noqa: E731  descending, lower id first on ties
    if top_k is not None and top_k < n:
        idx = heapq.nsmallest(top_k, range(n), key=order_key)
    else:
        idx = sorted(range(n), key=order_key)
    m = vals[idx[0]]
    w = [math.exp((vals[i] - m) / temperature) for i in idx]
    z = sum(w)
    probs = [x / z for x in w]
    if top_p is not None and top_p < 1:
        acc, cut = 0.0, len(probs)
        for k, p in enumerate(probs):
            acc += p
            if acc >= top_p:
                cut = k + 1
                break
        idx, probs = idx[:cut], probs[:cut]
        z = sum(probs)
        probs = [p / z for p in probs]
    return list(zip(idx, probs))


def sample(logits, *, temperature=1.0, top_k=None, top_p=None, rng: random.Random) -> int:
    check_params(temperature, top_k, top_p)
    if temperature == 0:
        vals = list(_flat(logits.tolist() if hasattr(logits, "tolist") else logits))
        return max(range(len(vals)), key=lambda i: (vals[i], -i))
    dist = kept_distribution(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    u, acc = rng.random(), 0.0
    for tok, p in dist:
        acc += p
        if u < acc:
            return tok
    return dist[-1][0]  # u within rounding of 1


def _flat(v):
    for e in v:
        if isinstance(e, (list, tuple)):
            yield from _flat(e)
        else:
            yield e
