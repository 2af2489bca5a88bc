"""The playground behaving as people expect a code playground to, driven by keys and clicks:
Ctrl-Enter / Shift-Enter run and Escape stops; Stop reads as a normal end; the status says
what a run is doing (compiling N kernels, step N of M with steps/s and an ETA); the chart
shows values on hover; loaded weights are what the next Run starts from; tracebacks name the
user's code, leave webgrad's frames out and mark the line in the editor; values print as
Python's repr; edits are kept per example and a share link carries the code.

Checked against independent sources: the loss after loading weights against numpy's forward
pass of the saved file (read with the `safetensors` package) on the example's first batch,
the chart's hover text against the losses the page received, the shared code against the text
typed. Runs the MLP example, shortened, on the shared page of tests/browser/test_playground.py.
"""
from __future__ import annotations

import array
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest

from test_playground import page  # noqa: F401  (the shared page, ready)

pytestmark = pytest.mark.browser
REPO = Path(__file__).resolve().parents[2]
MLP = (REPO / "examples" / "mlp_sin.py").read_text()
FIT = "losses = fit(c, draw_every=25)"
SHORT = "losses = fit(c, max_steps=40, target=0.0, draw_every=20)"
LONG = "losses = fit(c, max_steps=10**6, target=0.0, draw_every=25)"
ENDED = "['done', 'error', 'stopped', 'dead'].includes(window.playground.state)"

# every text #status and #kernel-count show from now on (a run updates them many times)
RECORD = """() => {
  window.seen = {status: [], kernels: []};
  if (window.seenObservers) return;
  window.seenObservers = [['status', 'status'], ['kernel-count', 'kernels']].map(([id, key]) => {
    const el = document.getElementById(id);
    const o = new MutationObserver(() => window.seen[key].push(el.textContent));
    o.observe(el, {childList: true, characterData: true, subtree: true});
    return o;
  });
}"""


def _mlp(page, replacement=None):
    """Pick the MLP example; with a replacement for its fit(...) line, as a snippet."""
    page.select_option("#examples", "mlp_sin.py")
    page.wait_for_function("window.playground.code.includes('def fit(')")
    if replacement:
        page.evaluate("(t) => { window.playground.code = t; }", MLP.replace(FIT, replacement))


def _press_in_editor(page, keys, starts=True):
    runs = page.evaluate("window.playground.runs")
    page.click("#editor .cm-content")
    page.keyboard.press(keys)
    if starts:  # the key's handler starts the run at once
        assert page.evaluate("window.playground.runs") == runs + 1, keys


def _wait_end(page, timeout=300_000):
    page.wait_for_function(ENDED, timeout=timeout)
    page.wait_for_timeout(50)  # the console renders on the next animation frame
    return page.evaluate("window.playground.state")


def _text(page, selector):
    return page.eval_on_selector(selector, "e => e.textContent")


def _load_through_chooser(page, path):
    with page.expect_file_chooser() as chooser:
        page.click("#load")
    chooser.value.set_files(str(path))
    page.wait_for_function("(s => s.startsWith('Loaded') || s.startsWith('Cannot'))("
                           "document.querySelector('#status').textContent)", timeout=60_000)
    status = _text(page, "#status")
    assert status.startswith(f"Loaded {path.name}") and "the next Run starts" in status, status


def _numpy_first_loss(weights: dict) -> float:
    """The MLP's loss on fit()'s first batch (random.Random(0), as examples/mlp_sin.py draws
    it), computed by numpy from the weights file."""
    rng = random.Random(0)
    x = array.array("f", (rng.uniform(-math.pi, math.pi) for _ in range(256)))
    y = np.asarray(array.array("f", (math.sin(v) for v in x)), np.float32)[:, None]
    h = np.asarray(x, np.float32)[:, None]
    for i in (1, 2, 3):
        h = h @ weights[f"l{i}.W"] + weights[f"l{i}.b"]
        if i < 3:
            h = np.maximum(h, 0)
    return float(np.sum((h - y) ** 2) / 256)


def test_keys_progress_stop_and_loaded_weights(page, tmp_path):
    from safetensors.numpy import load_file
    run_title, stop_title = page.get_attribute("#run", "title"), page.get_attribute("#stop", "title")
    assert "Ctrl-Enter" in run_title and "Shift-Enter" in run_title and "Escape" in stop_title
    page.evaluate(RECORD)
    _mlp(page, SHORT)
    before = page.evaluate("window.playground.code")
    # Ctrl-Enter in the editor runs (the editor's own Mod-Enter would insert a blank line)
    _press_in_editor(page, "Control+Enter")
    assert _wait_end(page) == "done", _text(page, "#console")
    assert page.evaluate("window.playground.code") == before, "Ctrl-Enter changed the text"
    first = page.evaluate("window.playground.losses")
    assert len(first) == 40
    seen = page.evaluate("window.seen")
    # the status said what was happening: compiling (kernels, pipelines), then step N of 40
    compiling = [tuple(map(int, m.groups())) for t in seen["kernels"]
                 if (m := re.match(r"\(compiling: (\d+) kernels, (\d+) pipelines made\)", t))]
    assert compiling and compiling[-1][0] == compiling[-1][1] > 5, seen["kernels"]
    assert [k for k, _ in compiling] == sorted(k for k, _ in compiling), compiling
    compiles = [i for i, t in enumerate(seen["status"])
                if re.match(r"Compiling: \d+ kernels generated, \d+ of \d+ pipelines created", t)]
    assert compiles, seen["status"]
    # before the first kernel: tracing (compile_module started), after the code's first lines
    tracing = [i for i, t in enumerate(seen["status"]) if t.startswith("Tracing your code")]
    assert tracing and tracing[0] < compiles[0], seen["status"]
    assert re.search(r" · [\d.]+ s$", seen["status"][tracing[0]]), seen["status"]
    training = [t for t in seen["status"]
                if re.match(r"Training: step \d+ of 40 · [\d.]+ steps/s · ETA [\d.]+ s · ", t)]
    assert training, seen["status"]
    assert re.match(r"Done in [\d.]+ s: 40 steps, [\d.]+ steps/s", seen["status"][-1]), seen
    count = _text(page, "#kernel-count")
    assert re.fullmatch(r"\(\d+ dispatches per step\)", count), count

    # the chart shows the point under the cursor
    box = page.locator("#chart .u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] / 2)
    page.wait_for_selector("#chart .chart-tip:not([hidden])", timeout=5_000)
    step, loss = re.fullmatch(r"step (\d+)  loss (\S+)", _text(page, "#chart .chart-tip")).groups()
    steps = page.evaluate("window.playground.steps")
    assert math.isclose(float(loss), first[steps.index(int(step))], rel_tol=1e-3), (step, loss)

    # the weights after 40 steps, downloaded, then loaded back: Shift-Enter's run starts from them
    with page.expect_download(timeout=55_000) as info:
        page.click("#save")
    saved = tmp_path / "weights.safetensors"
    info.value.save_as(saved)
    expected = _numpy_first_loss(load_file(str(saved)))
    _load_through_chooser(page, saved)
    assert page.get_attribute("#run", "title").endswith("its model starts from weights.safetensors")
    _press_in_editor(page, "Shift+Enter")
    # the previous run's kernel count goes as this one starts (it shows this run's as it compiles)
    assert "dispatches" not in _text(page, "#kernel-count")
    assert _wait_end(page) == "done", _text(page, "#console")
    loaded = page.evaluate("window.playground.losses")
    assert _text(page, "#status").endswith("(started from the loaded weights.safetensors)")
    assert "[started from the loaded weights weights.safetensors]" in _text(page, "#console")
    assert math.isclose(loaded[0], expected, rel_tol=1e-4), (loaded[0], expected)
    assert not math.isclose(loaded[0], first[0], rel_tol=1e-2), (loaded[0], first[0])
    # used once: the Run after it starts from the example's own initial weights again
    page.click("#run")
    assert _wait_end(page) == "done"
    assert math.isclose(page.evaluate("window.playground.losses[0]"), first[0], rel_tol=1e-5)

    # Escape stops a long run: a normal end, the training log stays, no traceback
    _mlp(page, LONG)
    _press_in_editor(page, "Control+Enter")
    page.wait_for_function("window.playground.losses.length >= 5", timeout=300_000)
    page.keyboard.press("Escape")
    assert _wait_end(page, 30_000) == "stopped"
    status, console = _text(page, "#status"), _text(page, "#console")
    n = int(re.match(r"Stopped at step (\d+) of 1000000: the model keeps the weights of that "
                     r"step$", status).group(1))
    assert n >= 5 and f"[stopped at step {n} of 1000000]" in console, (status, console)
    assert "step    0  loss" in console and "Traceback" not in console
    assert "KeyboardInterrupt" not in console
    # stopped before any step: no claim about weights
    page.evaluate("() => { window.playground.code = 'import time\\ntime.sleep(30)\\n'; }")
    page.click("#run")
    page.wait_for_timeout(300)
    page.keyboard.press("Escape")
    assert _wait_end(page, 30_000) == "stopped"
    assert _text(page, "#status") == "Stopped before any training step"

    # with no model in the worker, Download is off; Load keeps the file for the next Run
    page.evaluate("""() => { window.playground.code = 'import webgrad_worker\\n' +
        'for _, m in webgrad_worker._compiled_modules():\\n    m.destroy()\\n'; }""")
    page.click("#run")
    assert _wait_end(page) == "done"
    assert page.is_disabled("#save")
    assert "Run an example first" in page.get_attribute("#save", "title")
    assert page.is_enabled("#load")
    _load_through_chooser(page, saved)
    _mlp(page, SHORT)
    page.click("#run")
    assert _wait_end(page) == "done"
    assert math.isclose(page.evaluate("window.playground.losses[0]"), expected, rel_tol=1e-4)
    assert page.is_enabled("#save")


SHAPE_ERROR = '''import webgrad as wg
from webgrad import Module, ops

class M(Module):
    def __init__(self):
        super().__init__()
        self.W = self.param([3, 4])

def loss(m, inp):
    return ops.sum_all(inp["x"] @ m.W)

c2 = wg.compile_module(M, loss, inputs={"x": ([2, 5], "f32")}, backend="reference")
'''


def test_traceback_names_users_code_marks_line_and_values_print_as_repr(page):
    page.evaluate("(t) => { window.playground.code = t; }", SHAPE_ERROR)
    _press_in_editor(page, "Control+Enter")
    assert _wait_end(page) == "error"
    console = _text(page, "#console")
    assert 'File "your code", line 12, in <module>' in console, console
    assert 'File "your code", line 10, in loss' in console, console
    assert "ShapeError: matmul(f32[2,5], f32[3,4])" in console and "your code:10" in console
    for internal in ("site-packages", "webgrad/", "<run-", "webgrad_worker", "_pyodide"):
        assert internal not in console, console
    marked = page.eval_on_selector_all("#editor .cm-error-line",
                                       "els => els.map(e => e.textContent)")
    assert marked == ['    return ops.sum_all(inp["x"] @ m.W)'], marked
    assert page.is_hidden("#loss-box")  # this run reported no loss: no empty chart

    # a value prints as Python's repr (and the mark goes with the next run)
    page.evaluate("() => { window.playground.code = \"{'a': (1, 2.5), 'b': None, 's': 'x'}\"; }")
    _press_in_editor(page, "Control+Enter")
    assert _wait_end(page) == "done"
    # (the console renders on an animation frame, later than 50 ms on a loaded machine)
    page.wait_for_function("document.querySelector('#console').textContent !== ''")
    assert _text(page, "#console") == "{'a': (1, 2.5), 'b': None, 's': 'x'}\n"
    assert not page.query_selector("#editor .cm-error-line")

    # a long status is cut to one line; its title and a click show all of it
    words = " ".join(f"word{i}" for i in range(80))
    page.evaluate("(t) => { window.playground.code = t; }", f"raise ValueError({words!r})")
    page.click("#run")
    assert _wait_end(page) == "error"
    full = f"ValueError: {words}"
    assert _text(page, "#status") == full and full in page.get_attribute("#status", "title")
    cut = "e => e.scrollWidth > e.clientWidth + 1"
    assert page.eval_on_selector("#status", cut)
    page.click("#status")
    assert not page.eval_on_selector("#status", cut)
    page.click("#status")


def test_edits_kept_per_example_reset_and_share_link(page, browser_session):
    _mlp(page)
    assert page.evaluate("window.playground.code") == MLP and page.is_disabled("#reset")
    _press_in_editor(page, "Control+Home", starts=False)
    page.keyboard.type("# my change\n")
    edited = "# my change\n" + MLP
    assert page.evaluate("window.playground.code") == edited
    key = "webgrad.playground.code.mlp_sin.py"
    page.wait_for_function(f"localStorage.getItem({key!r}) !== null", timeout=5_000)
    assert page.evaluate(f"localStorage.getItem({key!r})") == edited and page.is_enabled("#reset")
    # another example shows its own text; back, the edit is there
    page.select_option("#examples", "char_lm.py")
    page.wait_for_function("window.playground.code.includes('STEPS =')")
    assert page.evaluate("window.playground.code") == (REPO / "examples" / "char_lm.py").read_text()
    page.select_option("#examples", "mlp_sin.py")
    page.wait_for_function("window.playground.code.startsWith('# my change')")
    assert page.evaluate("window.playground.code") == edited

    page.click("#share")
    page.wait_for_function("document.querySelector('#status').textContent.startsWith('Share link')")
    link = page.evaluate("location.href")
    assert "#example=mlp_sin.py&z=" in link, link
    # Reset puts the original back and forgets the edit (so what the link opens is the link's)
    page.click("#reset")
    assert page.evaluate("window.playground.code") == MLP and page.is_disabled("#reset")
    assert page.evaluate(f"localStorage.getItem({key!r})") is None
    assert "#" not in page.evaluate("location.href")

    other = browser_session.browser.new_page()
    try:
        other.goto(link)
        other.wait_for_function("window.playground?.code?.startsWith('# my change')",
                                timeout=30_000)
        assert other.evaluate("window.playground.code") == edited
        assert other.eval_on_selector("#examples", "e => e.value") == "mlp_sin.py"
        # before the first run: no empty boxes, one line saying what comes, no model to save
        for box in ("#loss-box", "#figure-box", "#kernels-panel"):
            assert other.is_hidden(box), box
        assert other.is_visible("#right-empty") and other.is_disabled("#save")
        assert other.eval_on_selector("#console", "e => getComputedStyle(e, '::before').content"
                                      ).startswith('"The output of Run')
    finally:
        other.close()
