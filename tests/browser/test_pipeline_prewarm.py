"""The worker's pipeline prewarm (worker/worker.mjs, Replay.prewarm in worker/replay.mjs): a
page keeps the WGSL texts of the pipelines its plans used in Cache Storage; the next page on
the origin compiles them while Pyodide boots, and its plans then find them made instead of
compiling them. Checked here: the second page compiles none of the training step's pipelines
itself, its numbers are the first page's and the reference executor's in CPython (a prewarmed
pipeline computes what a freshly compiled one does), and cached texts that do not compile, or
that were made for another adapter, do no harm.
"""
from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.browser

# A training step (Adam, two layers) and a forward run; returns the losses, the prediction and
# how many pipelines this worker's device compiled itself and how many prewarm() made.
_CODE = """
import webgrad as wg
from webgrad import ops, optim, Module, init
from webgrad.backends import webgpu_browser
class M(Module):
    def __init__(self):
        super().__init__()
        self.w = self.param([3, 4], init=init.literal([[0.1 * (i - j) for j in range(4)] for i in range(3)]))
        self.v = self.param([4, 1], init=init.literal([[0.5], [-0.25], [0.125], [0.3]]))
def fwd(m, inp):
    return ops.relu(inp["x"] @ m.w) @ m.v
def loss(m, inp):
    return ops.sum_all((fwd(m, inp) - inp["y"]) ** 2)
c = wg.compile_module(M, loss, inputs={"x": ([2, 3], "f32"), "y": ([2, 1], "f32")},
                      optimizer=optim.Adam(lr=0.05), backend="webgpu")
feed = {"x": [[1, 2, 3], [-1, 0.5, 2]], "y": [[0.5], [-1.0]]}
losses = [c.step(feed) for _ in range(3)]
p = c.compile_forward(fwd, inputs={"x": ([2, 3], "f32")})
pred = [float(v) for v in p.run({"x": feed["x"]})]
stats = webgpu_browser._shared.stats.to_py()
[losses, pred, stats["compiled"], stats["prewarmed"]]
"""

_STORED = """async () => {
  const cache = await caches.open("webgrad-pipelines");
  const keys = await cache.keys();
  return keys.length ? [keys[0].url, await (await cache.match(keys[0])).json()] : null;
}"""


def _expected():
    import webgrad as wg
    from webgrad import Module, init, ops, optim

    class M(Module):
        def __init__(self):
            super().__init__()
            self.w = self.param([3, 4], init=init.literal([[0.1 * (i - j) for j in range(4)]
                                                           for i in range(3)]))
            self.v = self.param([4, 1], init=init.literal([[0.5], [-0.25], [0.125], [0.3]]))

    def fwd(m, inp):
        return ops.relu(inp["x"] @ m.w) @ m.v

    c = wg.compile_module(M, lambda m, inp: ops.sum_all((fwd(m, inp) - inp["y"]) ** 2),
                          inputs={"x": ([2, 3], "f32"), "y": ([2, 1], "f32")},
                          optimizer=optim.Adam(lr=0.05), backend="reference")
    feed = {"x": [[1, 2, 3], [-1, 0.5, 2]], "y": [[0.5], [-1.0]]}
    losses = [c.step(feed) for _ in range(3)]
    p = c.compile_forward(fwd, inputs={"x": ([2, 3], "f32")})
    return losses, [float(v) for v in p.run({"x": feed["x"]}).reshape(-1)]


def _close(a, b):
    # f32 on the device against the reference executor; Adam's normalized steps carry the
    # rounding of three steps into the prediction (it differed by 5e-5 relative)
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=2e-4, abs_tol=1e-5)
                                    for x, y in zip(a, b))


def test_second_page_prewarms_the_first_pages_pipelines(browser_session):
    context = browser_session.browser.new_context()
    try:
        page = context.new_page()
        page.goto(browser_session.url)
        page.evaluate("window.webgrad.ready")
        first = page.evaluate("(code) => window.webgrad.run(code).catch((e) => ({error: e}))", _CODE)
        assert "error" not in first, first["error"]["traceback"]
        # stored as soon as the plans loaded (not awaited by anything the page sees)
        page.wait_for_function(f"""async () => {{ const s = await ({_STORED})();
            return s !== null && s[1].wgsl.length >= {first[2]}; }}""", timeout=60_000)
        key, stored = page.evaluate(_STORED)
        page.close()
        assert first[3] == 0 and first[2] > 0 and len(stored["wgsl"]) == first[2]

        # The next page: one text that does not compile and the rest as stored; then a page
        # whose entry claims another adapter prewarms nothing.
        bogus = "@compute @workgroup_size(1) fn main() { let x: f32 = undefined_name; }"
        runs = []
        for adapter, texts in ((stored["adapter"], [bogus] + stored["wgsl"]),
                               ("some other adapter", stored["wgsl"])):
            page = context.new_page()
            page.goto(browser_session.url + "assets/manifest.json")  # same origin, no worker
            page.evaluate("""async ([key, entry]) => {
                const cache = await caches.open("webgrad-pipelines");
                await cache.put(key, new Response(JSON.stringify(entry)));
            }""", [key, {"adapter": adapter, "wgsl": texts}])
            page.goto(browser_session.url)
            warm = page.evaluate("window.webgrad.warm")
            runs.append((warm, page.evaluate(
                "(code) => window.webgrad.run(code).catch((e) => ({error: e}))", _CODE)))
            assert "error" not in runs[-1][1], runs[-1][1]["error"]["traceback"]
            page.close()
    finally:
        context.close()
    (warm, second), (other_warm, other) = runs
    assert warm["prewarmed"] == second[3] == len(stored["wgsl"]) + 1  # the bogus one too...
    assert second[2] == 0  # ...and the plans found all theirs made: none compiled for them
    assert "prewarmed" not in other_warm and other[3] == 0 and other[2] == first[2]
    losses, pred = _expected()
    for got in (first, second, other):
        assert _close(got[0], losses) and _close(got[1], pred), (got, losses, pred)
    assert second[:2] == first[:2]  # the same kernels: the same bits
