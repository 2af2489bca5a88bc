"""Progress and pictures from training code to the playground page (and nowhere else).

The demos in examples/ run unchanged in CPython and in the page's Pyodide worker. While they
train they call ``report(step=..., loss=..., figure=...)``: in the worker that becomes a
``{type: "progress", ...}`` message, which the page (web/playground/bridge.mjs) turns into a
point of the live loss chart and a drawing; in CPython it goes to the listener set with
``set_listener`` (tests use it to check the figures) and otherwise nowhere.

Figures are plain data, one of:

    lines(title, x, series)                 series: {name: y values}; points=[names] are dots
    heatmaps(title, maps)                   maps: [(caption, rows of values)], e.g. attention
    matrix(title, labels, rows)             a confusion matrix: counts, labelled rows/columns
    text(title, body)                       e.g. text sampled from a language model

Values are plain floats in nested lists (JSON-able), small enough to send every few steps.
"""
from __future__ import annotations

import sys

_listener = None


def in_browser() -> bool:
    """True in the playground's worker (Pyodide), where reports reach the page."""
    return sys.platform == "emscripten"


def example_backend(default: str = "webgpu") -> str:
    """The backend an example's __main__ runs on: in the page "auto" (WebGPU where the page has
    a hardware adapter, else the CPU backend "wasm"); in CPython its first command-line
    argument, or `default`."""
    if in_browser():
        return "auto"
    return sys.argv[1] if len(sys.argv) > 1 else default


def set_listener(fn) -> None:
    """CPython: call fn(event dict) for every report (None stops it)."""
    global _listener
    _listener = fn


def report(step: int | None = None, loss: float | None = None, *, figure: dict | None = None,
           total: int | None = None, **fields) -> None:
    """Send one progress event: the step (counted from 0), its loss (charted), an optional
    figure, the number of steps planned (total: the page shows "step N of M" and an ETA), and
    any other plain fields."""
    event = {k: v for k, v in (("step", step), ("loss", loss), ("figure", figure),
                               ("total", total)) if v is not None}
    event.update(fields)
    if _listener is not None:
        _listener(event)
    if in_browser():
        try:
            import webgrad_worker  # only in the playground's worker
        except ImportError:
            return
        webgrad_worker.progress(event)


def flat(values) -> list:
    """A program's output as a flat list (numpy arrays in CPython, HostArray in Pyodide)."""
    return values.reshape(-1).tolist() if hasattr(values, "reshape") else list(values)


def _floats(values) -> list:
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [_floats(v) if isinstance(v, (list, tuple)) else float(v) for v in values]


def lines(title: str, x, series: dict, *, points: tuple = ()) -> dict:
    return {"kind": "lines", "title": title, "x": _floats(x),
            "series": [{"name": k, "y": _floats(v), "points": k in points}
                       for k, v in series.items()]}


def heatmaps(title: str, maps) -> dict:
    return {"kind": "heatmaps", "title": title,
            "maps": [{"caption": cap, "rows": _floats(rows)} for cap, rows in maps]}


def matrix(title: str, labels, rows) -> dict:
    return {"kind": "matrix", "title": title, "labels": [str(v) for v in labels],
            "rows": _floats(rows)}


def text(title: str, body: str) -> dict:
    return {"kind": "text", "title": title, "text": str(body)}
