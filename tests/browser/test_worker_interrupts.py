"""The Pyodide worker survives what a person at the playground does: Stop (an interrupt) in any
kind of running code, floods of printed output, unterminated lines, broken syntax.

Each interrupt case runs in the shared worker and then checks that the same worker still
answers: a worker left stuck would time out every later test. The training case also checks
that the parameters the worker holds after the interrupt are those of a whole number of
completed steps, replayed independently on the CPU reference executor.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.browser
REPO = Path(__file__).resolve().parents[2]

# Starts `code` in the page, waits until it printed "started" (so the interrupt finds it running),
# interrupts it and reports how the request ended and how long the worker took to answer again.
_INTERRUPT_JS = """async ([code, delayMs]) => {
  const api = window.webgrad;
  const mark = api.stdout.length + api.dropped.stdout;
  const pending = api.run(code).then((v) => ({ok: true, value: v}),
                                     (e) => ({ok: false, error: e}));
  const t0 = performance.now();
  while (!api.stdout.slice(mark - api.dropped.stdout).includes("started")) {
    if (performance.now() - t0 > 60000) return {ended: "never started"};
    await new Promise((r) => setTimeout(r, 20));
  }
  await new Promise((r) => setTimeout(r, delayMs));
  api.interrupt();
  const t1 = performance.now();
  const ended = await Promise.race([pending,
    new Promise((r) => setTimeout(() => r({ended: "hung"}), 30000))]);
  const stopMs = performance.now() - t1;
  const after = await Promise.race([api.run("'alive'"),
    new Promise((r) => setTimeout(() => r("hung"), 30000))]);
  return {ended, stopMs, after};
}"""


def _interrupt(session, code, delay_ms=300):
    return session.page.evaluate(_INTERRUPT_JS, [code, delay_ms])


@pytest.mark.parametrize("code", [
    "import asyncio\nprint('started')\nawait asyncio.sleep(20)",
    "import time\nprint('started')\ntime.sleep(20)",
    "print('started')\nwhile True:\n    pass",
    "print('started')\nx = 0\nfor i in range(10**9):\n    x += i",
], ids=["asyncio.sleep", "time.sleep", "busy-loop", "python-loop"])
def test_interrupt_leaves_worker_usable(browser_session, code):
    outcome = _interrupt(browser_session, code)
    assert outcome["ended"] != "hung", "the interrupted request never finished"
    assert outcome["ended"]["ok"] is False, outcome
    error = outcome["ended"]["error"]
    assert error["type"] == "KeyboardInterrupt", error
    assert outcome["after"] == "alive"
    assert outcome["stopMs"] < 5000, outcome  # not "after the 20 s sleep"


_MLP = (REPO / "examples" / "mlp_sin.py").read_text().replace(
    'if __name__ == "__main__":', "if False:")


def _reference_params(steps: int, seed: int) -> dict:
    """The MLP's parameters after `steps` steps on the reference executor, same batches."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("mlp_sin_ref", REPO / "examples" / "mlp_sin.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.compile_mlp("reference", seed)
    rng = random.Random(seed)
    for _ in range(steps):
        c.step(mod.batch(rng))
    return {k: np.asarray(v, dtype=np.float64).reshape(-1) for k, v in c.download_params().items()}


@pytest.mark.parametrize("style", ["blocking", "async"])
def test_interrupted_training_keeps_last_completed_step(browser_session, style):
    s = browser_session
    s.run(_MLP)
    step = "c.step(batch(rng))" if style == "blocking" else "await c.step_async(batch(rng))"
    s.run("c = compile_mlp('webgpu', 0)\nimport random\nrng = random.Random(0)\nlosses = []")
    outcome = _interrupt(s, f"losses.append({step})\nprint('started')\n"
                            f"while True:\n    losses.append({step})", 300)
    assert outcome["ended"] != "hung" and outcome["after"] == "alive", outcome
    assert outcome["ended"]["error"]["type"] == "KeyboardInterrupt", outcome
    done, params = s.run("len(losses), {k: list(map(float, v)) for k, v in "
                         "c.download_params().items()}")
    assert done >= 2, done
    # an interrupt between c.step returning and losses.append leaves one step uncounted
    candidates = {k: _reference_params(k, 0) for k in (done, done + 1)}
    errors = {k: max(np.max(np.abs(np.asarray(params[n]) - ref[n])) for n in ref)
              for k, ref in candidates.items()}
    assert min(errors.values()) < 2e-3, errors
    gap = max(np.max(np.abs(candidates[done][n] - candidates[done + 1][n])) for n in params)
    assert gap > 4 * min(errors.values()), (gap, errors)  # the check tells steps apart
    # and training goes on from there
    assert s.run("float(c.step(batch(rng))) < losses[0]") is True
    s.run("c.destroy()")


def test_many_lines_of_output_are_bounded_and_complete(browser_session):
    s = browser_session
    s.run("for i in range(100000):\n    print(i)", timeout=120)
    state = s.page.evaluate("({n: window.webgrad.stdout.length, last: window.webgrad.stdout.at(-1),"
                            " first: window.webgrad.stdout.at(-10000)})")
    assert state["n"] <= 12500 and state["last"] == "99999" and state["first"] == "90000", state


def test_partial_line_shown_and_not_glued(browser_session):
    s = browser_session
    s.run("print('no newline here', end='')")
    assert s.stdout[-1] == "no newline here"
    s.run("import sys\nprint('second run')\nsys.stderr.write('err without newline')")
    assert s.stdout[-2:] == ["no newline here", "second run"]
    assert s.stderr[-1] == "err without newline"


def test_syntax_error_shows_the_users_line(browser_session):
    from webgrad.browser import BrowserPythonError
    with pytest.raises(BrowserPythonError) as info:
        browser_session.run("x = 1\ndef broken(:\n    pass\n")
    error = info.value
    assert error.type == "SyntaxError"
    assert "line 2" in error.traceback and "def broken(:" in error.traceback, error.traceback
    assert "^" in error.traceback
    for internal in ("webloop", "_pyodide", "eval_code", "webgrad_worker", "/lib/python"):
        assert internal not in error.traceback, error.traceback
