"""Index bounds: fed indices are range-checked on the host before a step runs.

An i32 input that reaches an index operand (gather_rows / embedding rows, one_hot classes,
which take_along_last and cross_entropy_last use, scatter_add_rows rows) through layout ops
only (reshape, transpose, broadcast_to, slice) must hold values in [0, n) for that
operand's n. `index_checks(graph)` derives these bounds once, at compile time, from the
graph; `check_index_feeds` tests a feed against them (one min/max pass over each checked
input: arrays.extent) and raises FeedError naming the input, the value and its
position, the op with its bound and the user's line that built it. The check runs before
anything is written, so a refused step changes nothing, on every backend alike.

Indices *computed* in the graph (argmax, categorical samples, arithmetic on indices) cannot
be checked on the host. Their policy, the same on every executor (the primitives' `ref`
rules define it): an out-of-range row reads as zeros in gather_rows, one_hot gives an
all-zero row, scatter_add_rows drops the value. Negative indices never wrap. A device-side
error flag was considered and not taken: it would cost a reduction per index tensor and
could only report after the step had already updated the parameters.
"""
from __future__ import annotations

from dataclasses import dataclass

from .arrays import FeedError, extent

_VIEWS = ("reshape", "transpose", "broadcast_to", "slice")
# op -> (operand position of the indices, the bound as a function of the node)
_INDEX_OPERANDS = {
    "gather_rows": (1, lambda g, n: g[n.inputs[0]].shape[0], "rows of the table"),
    "one_hot": (0, lambda g, n: n.attrs["n"], "classes"),
    "scatter_add_rows": (1, lambda g, n: n.attrs["n"], "rows of the result"),
}
_HINT = {"gather_rows": "embedding / gather_rows",
         "one_hot": "one_hot (also take_along_last and cross_entropy_last targets)",
         "scatter_add_rows": "scatter_add_rows"}


@dataclass(frozen=True)
class IndexBound:
    op: str
    n: int          # valid values are 0 <= v < n
    what: str       # "rows of the table", ...
    loc: str | None


def index_checks(graph) -> dict[str, list[IndexBound]]:
    """{input name: [IndexBound, ...]} for every i32 input that feeds an index operand."""
    cons: dict[int, list] = {}
    for n in graph.nodes:
        for k, i in enumerate(n.inputs):
            cons.setdefault(i, []).append((n, k))
    out: dict[str, list[IndexBound]] = {}
    for name, i in graph.inputs.items():
        if graph[i].dtype != "i32":
            continue
        found, stack, seen = [], [i], set()
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            for n, k in cons.get(x, []):
                if n.op in _VIEWS:
                    stack.append(n.id)
                elif n.op in _INDEX_OPERANDS and _INDEX_OPERANDS[n.op][0] == k:
                    _, bound, what = _INDEX_OPERANDS[n.op]
                    b = IndexBound(n.op, int(bound(graph, n)), what, n.loc)
                    if b not in found:
                        found.append(b)
        if found:
            out[name] = sorted(found, key=lambda b: b.n)
    return out


def check_index_feeds(feeds: dict, checks: dict[str, list[IndexBound]], method: str) -> None:
    """Raise FeedError when a fed index is outside the bound of an op it indexes."""
    for name, bounds in checks.items():
        h = feeds[name]
        if not len(h):
            continue
        lo, hi = extent(h)
        b = bounds[0]  # the tightest bound
        if lo >= 0 and hi < b.n:
            continue
        bad = lo if lo < 0 else hi
        at = list(h).index(bad)
        where = f" built at {b.loc}" if b.loc else ""
        shape = list(getattr(h, "shape", [len(h)]))
        neg = " (negative indices do not wrap)" if bad < 0 else ""
        raise FeedError(
            f"{method}(): input '{name}' i32{shape} holds {bad} at flat index {at}, outside "
            f"[0, {b.n}){neg}: it indexes the {b.n} {b.what} of {_HINT[b.op]}{where}; "
            f"pass indices in [0, {b.n})")
