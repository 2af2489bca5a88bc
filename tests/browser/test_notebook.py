"""The notebook site (/lab/, JupyterLite built by scripts/lab.py): notebooks/mlp_sin.ipynb runs
all its cells in headless Chromium, installing webgrad with piplite/micropip from the site and
training the MLP in the Pyodide kernel: on WebGPU (SwiftShader), and in a Chromium without
WebGPU on the CPU backend (onnxruntime-web), where its first losses equal the reference
executor's run here on the notebook's own model cell.

Checked against things computed here, not by the notebook: the plotted MLP curve lies on
math.sin (read back from the SVG's pixel coordinates), the loss printed at the end is far below
the first step's, no cell raised, and the page fetched nothing from outside the server.
"""
from __future__ import annotations

import json
import math
import re
import time

import numpy as np
import pytest

pytestmark = pytest.mark.browser

NOTEBOOK = "mlp_sin.ipynb"

# The cells of the open notebook: [execution count, outputs as nbformat JSON] per code cell.
_CELLS_JS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const cells = panel.content.model.cells;
  const out = [];
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i);
    if (c.type === "code") out.push([c.executionCount, c.outputs.toJSON()]);
  }
  return {cells: out, kernel: panel.sessionContext.session?.kernel?.status ?? null};
}"""

_KERNEL_IDLE_JS = """() => {
  const w = window.jupyterapp?.shell.currentWidget;
  return w?.sessionContext?.session?.kernel?.status === "idle";
}"""


@pytest.fixture(scope="module")
def lab_site(serve_module):
    pytest.importorskip("jupyterlite_core", reason="jupyterlite-core is not installed "
                        "(pip install -e '.[test]')")
    lab = serve_module.provisioning.load_lab()
    serve_module.provision()
    try:
        return lab.build_lab()
    except lab.LabError as e:
        pytest.fail(f"the notebook site does not build: {e}")


def _points(svg: str, colour: str) -> list[tuple[float, float]]:
    found = re.search(rf'<polyline points="([^"]+)" fill="none" stroke="{colour}"', svg)
    assert found, f"no {colour} curve in the plot: {svg[:300]}"
    return [tuple(map(float, p.split(","))) for p in found.group(1).split()]


# Runs Python in the open notebook's kernel (as a cell would, without adding one): its stdout.
_KERNEL_RUN_JS = """async (code) => {
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  const future = kernel.requestExecute({code, store_history: false});
  let out = "";
  future.onIOPub = (msg) => {
    if (msg.header.msg_type === "stream") out += msg.content.text;
    if (msg.header.msg_type === "error") out += "ERROR " + msg.content.ename + ": " + msg.content.evalue;
  };
  await future.done;
  return out;
}"""


def _run_notebook(session, check=None, before: str | None = None):
    """Open the notebook in a fresh page of `session`'s browser, run all its cells and check
    what the page shows; `before` (Python source) runs in the kernel before the cells,
    check(page) after them, before the page closes. The cells' outputs (nbformat JSON per
    code cell)."""
    page = session.browser.new_page()  # a fresh context: no notebook saved in storage
    outside: list[str] = []
    page.on("request", lambda r: r.url.startswith(("data:", "blob:", session.url))
            or outside.append(r.url))
    try:
        page.goto(session.url + f"lab/notebooks/index.html?path={NOTEBOOK}")
        page.wait_for_function(_KERNEL_IDLE_JS, timeout=300_000, polling=250)
        if before is not None:
            page.evaluate(_KERNEL_RUN_JS, before)
        # run-all's promise settles once every cell ran (false when one failed)
        page.evaluate("""() => { window.webgradRunAll = undefined;
          window.jupyterapp.commands.execute("notebook:run-all-cells").then(
            (ok) => { window.webgradRunAll = ok; }, (e) => { window.webgradRunAll = String(e); }); }""")
        deadline = time.monotonic() + 240
        while True:
            state = page.evaluate(_CELLS_JS)
            done = page.evaluate("window.webgradRunAll")
            errors = [o for _, outs in state["cells"] for o in outs if o["output_type"] == "error"]
            assert not errors, "a notebook cell raised:\n" + "\n".join(
                re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(e["traceback"])) for e in errors)
            if done is not None:
                assert done is True, f"running the cells failed: {done}"
                # run-all's promise may settle while the last cell still runs (seen under
                # load: no execution count yet, the plot at an early step): wait for it too
                if all(n is not None for n, _ in state["cells"]) and state["kernel"] == "idle":
                    break
            assert time.monotonic() < deadline, f"the notebook did not finish: {state}"
            time.sleep(1)
        rendered = page.locator("svg.webgrad-plot").count()
        # the notebook links back to the site's other pages, and each link answers
        links = page.eval_on_selector_all(".jp-RenderedMarkdown a[href]",
                                          "els => els.map(e => e.getAttribute('href'))")
        assert {"/index.html", "/surprisal.html", "/chat.html"} <= set(links), links
        for href in ("/index.html", "/surprisal.html", "/chat.html"):
            assert page.request.get(session.url.rstrip("/") + href).ok, href
        if check is not None:
            check(lambda code: page.evaluate(_KERNEL_RUN_JS, code))
    finally:
        page.close()
    assert not outside, f"the notebook page fetched from outside the server: {outside[:5]}"
    assert rendered == 1, "the training plot is not on the page"

    outputs = state["cells"][-1][1]
    text = "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")
    found = re.search(r"first step ([\d.]+), last step ([\d.]+) after (\d+) steps", text)
    assert found, f"the last cell did not say how training went: {state['cells']}"
    first, last, steps = found.groups()
    assert float(last) < 2e-3 and float(last) < float(first) / 20, text

    svg = [o["data"]["text/html"] for o in outputs if o["output_type"] == "display_data"][-1]
    assert f"fit after {steps} steps" in svg  # the plot shows the final model
    # pixel -> data: the fit panel maps x in [-pi, pi] to 40..360 and y in [-1.3, 1.3] to 230..30
    errs = [abs((230 - py) / 200 * 2.6 - 1.3 - math.sin((px - 40) / 320 * 2 * math.pi - math.pi))
            for px, py in _points(svg, "#1f6fd1")]
    assert len(errs) == 101 and max(errs) < 0.15, max(errs)
    return state["cells"]


def _said(cells, k: int) -> str:
    """The stream text of code cell k."""
    return "".join(o.get("text", "") for o in cells[k][1] if o["output_type"] == "stream")


def test_mlp_notebook_trains_on_webgpu(browser_session, lab_site):
    # the kernel is JupyterLite's worker, not webgrad's: it gets no {"auto": "webgpu"} from
    # the session's manifest, so it is told here to keep backend='auto' on SwiftShader
    cells = _run_notebook(browser_session, before="import js\njs.globalThis.webgradAuto = 'webgpu'")
    assert "backend 'webgpu'" in _said(cells, 1), _said(cells, 1)


def _reference_losses(steps: int) -> list[float]:
    """The notebook's model cell run here on the reference executor: its first steps' losses
    on the notebook's batches (random.Random(0))."""
    import random
    from pathlib import Path
    nb = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / NOTEBOOK).read_text())
    model_cell = next("".join(c["source"]) for c in nb["cells"]
                      if c["cell_type"] == "code" and "compile_module" in "".join(c["source"]))
    assert model_cell.count('backend="auto"') == 1
    scope: dict = {}
    exec("import webgrad as wg\n" + model_cell.replace('backend="auto"', 'backend="reference"'), scope)
    rng = random.Random(0)
    return [scope["c"].step(scope["batch"](rng)) for _ in range(steps)]


def test_mlp_notebook_trains_without_webgpu(browser_without_webgpu, lab_site):
    """In a Chromium without WebGPU the same notebook says it runs on the CPU (backend 'wasm':
    onnxruntime-web, loaded into the kernel from the site by its prepare cell) and trains to
    its target; its first steps' losses, read from the kernel, are the reference executor's
    here. Unprepared, 'auto' raises saying how to prepare (the kernel has no numpy for the
    reference executor it would otherwise fall back to)."""
    got = {}

    def check(run):
        got["losses"] = json.loads(run("import json\nprint(json.dumps(losses[:5]))"))
        got["backend"] = run("print(c.backend.name)").strip()
        # as before the prepare cell (onnxruntime-web not loaded, no URL for it): 'auto' says
        # what to do, not that the reference executor needs numpy (this Pyodide has none)
        got["unprepared"] = run("""
import js
import webgrad.backends as _b
from webgrad.backends import onnx_runtime as _o
_o._ort, _b._no_webgpu = None, "no adapter"
del js.globalThis.webgradOrtURL
try:
    _b.get_backend("auto")
except Exception as e:
    print(f"{type(e).__name__}: {e}")
""")

    cells = _run_notebook(browser_without_webgpu, check)
    said = _said(cells, 1)
    assert "backend 'wasm'" in said and "onnxruntime-web" in said and "no WebGPU adapter" in said, said
    assert got["backend"] == "wasm"
    said = got["unprepared"]   # and the cell, which caught it, shows no error of its own
    assert said.startswith("RuntimeError: backend='auto' has nothing to run on here") and (
        "await webgrad.backends.prepare_async('auto')" in said and "webgradOrtURL" in said), said
    assert "ERROR" not in said, said
    assert len(got["losses"]) == 5
    np.testing.assert_allclose(got["losses"], _reference_losses(5), rtol=1e-5)


def test_notebook_in_repository_is_clean():
    """The committed notebook carries no outputs (they would show stale results before a run)."""
    from pathlib import Path
    nb = json.loads((Path(__file__).resolve().parents[2] / "notebooks" / NOTEBOOK).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(not c["outputs"] and c["execution_count"] is None for c in code)
