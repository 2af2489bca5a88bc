"""The playground page (`python serve.py`): its default snippet trains an MLP on the page's
WebGPU when the user presses Run, and what it learned is checked here against math.sin."""
import json
import math

import pytest

pytestmark = pytest.mark.browser


def test_default_snippet_trains_on_run_click(browser_session):
    page = browser_session.page
    assert "backend=\"webgpu\"" in page.eval_on_selector("#code", "e => e.value")
    page.click("#run")
    page.wait_for_function("document.querySelector('#status').textContent !== 'Running…' "
                           "&& document.querySelector('#result').textContent !== ''",
                           timeout=300_000)
    assert page.eval_on_selector("#status", "e => e.textContent") == "Done"
    result = json.loads(page.eval_on_selector("#result", "e => e.textContent"))
    assert result["loss"] < 1e-3 and result["steps"] <= 1000, result
    output = page.eval_on_selector("#output", "e => e.textContent")
    assert "kernels per training step" in output and "step    0  loss" in output
    # the trained model lives on in the worker's __main__: ask it for sin on unseen points
    xs = [-2.5 + 0.25 * k for k in range(21)]
    pred = browser_session.run(
        "f = c.compile_forward(lambda m, inp: forward(m, inp['x']), inputs={'x': ([21, 1], 'f32')})\n"
        f"f.run({{'x': [[x] for x in {xs!r}]}}).tolist()")
    for x, (p,) in zip(xs, pred):
        assert abs(p - math.sin(x)) < 0.1, (x, p)
