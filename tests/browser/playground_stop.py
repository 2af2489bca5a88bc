"""Stop in the playground, shared by its tests on WebGPU (test_playground.py) and on the CPU
backend (test_wasm_backend.py): the MLP example made to run on and on, Stop pressed once a few
steps are reported, and what the page and the worker say afterwards.

``stop_long_mlp_run`` leaves the page stopped and returns the steps the page reported and the
model's parameters (the worker's global ``c``); ``twin_errors`` steps a twin of that model on
the same backend from the same seed and batches and gives, for each step count the stop could
have come after, the largest difference from the stopped parameters (0 for the right one).
"""
from __future__ import annotations

import numpy as np

LONG_RUN = ("losses = fit(c, draw_every=25)",
            "losses = fit(c, max_steps=10**6, target=0.0, draw_every=25)")


def stop_long_mlp_run(page, session, *, started_ms: int = 300_000) -> tuple[int, dict]:
    """Open examples/mlp_sin.py, edit it to train without end, Run, Stop after 5 reported steps.
    Checks that the page ends 'stopped', with a note where it stopped and no traceback."""
    # selected only when another file (or an edit of this one) is shown: a reload of the file
    # landing after the edit below would undo it, so the edit waits for the file's text
    shown = page.evaluate("[document.getElementById('examples').value, window.playground.code]")
    if shown[0] != "mlp_sin.py" or LONG_RUN[0] not in shown[1]:
        page.select_option("#examples", "mlp_sin.py")
    page.wait_for_function("(line) => window.playground.code.includes(line)", arg=LONG_RUN[0])
    long_run = page.evaluate("window.playground.code").replace(*LONG_RUN)
    assert "10**6" in long_run, "examples/mlp_sin.py no longer calls " + LONG_RUN[0]
    page.evaluate("(text) => { window.playground.code = text; }", long_run)
    page.wait_for_selector("#run:not([disabled])")
    page.click("#run")
    page.wait_for_function("window.playground.losses.length >= 5", timeout=started_ms)
    page.click("#stop")
    page.wait_for_function("['stopped', 'error', 'done'].includes(window.playground.state)",
                           timeout=30_000)
    assert page.evaluate("window.playground.state") == "stopped", page.eval_on_selector(
        "#console", "e => e.textContent")
    # the console renders its text on the next animation frame, after the state is set;
    # Stop is a normal end: a note where it stopped, no traceback
    page.wait_for_function(
        "document.querySelector('#console').textContent.includes('[stopped at step')",
        timeout=10_000)
    assert "KeyboardInterrupt" not in page.eval_on_selector("#console", "e => e.textContent")
    reported = len(page.evaluate("window.playground.losses"))
    params = session.run("{k: list(map(float, v)) for k, v in c.download_params().items()}")
    return reported, params


def twin_errors(session, params: dict, reported: int, *, extra: int = 1) -> dict[int, float]:
    """{k: max |stopped - twin after k steps|} for k = reported .. reported + extra (the stop
    may come between a step and its report reaching the page)."""
    twins = session.run(f"""
import random as _random
_twin, _rng, _at = compile_mlp(c.backend.name, 0), _random.Random(0), {{}}
for _k in range({reported + extra}):
    _twin.step(batch(_rng))
    if _k + 1 >= {reported}:
        _at[str(_k + 1)] = {{n: list(map(float, v)) for n, v in _twin.download_params().items()}}
_twin.destroy()
_at""")
    return {int(k): max(float(np.max(np.abs(np.asarray(params[n]) - np.asarray(t[n]))))
                        for n in t) for k, t in twins.items()}
