"""Inside the worker, feeds may be JS typed arrays (Float32Array, Int32Array) and results come
back as HostArrays (no numpy in Pyodide). The same program is judged in CPython by torch."""
import pytest
import torch

pytestmark = pytest.mark.browser

CODE = """
import js
import webgrad as wg
from webgrad import ops, init

class M(wg.Module):
    def __init__(self):
        super().__init__()
        self.E = self.param([5, 3], init=init.literal([0.1 * k - 0.7 for k in range(15)]))

f = wg.compile_forward(M, lambda m, i: ops.embedding(m.E, i["idx"]) * i["s"],
                       inputs={"idx": ([4], "i32"), "s": ([4, 1], "f32")}, backend="webgpu")
idx = js.Int32Array.new([4, 0, 2, 2])
s = js.Float32Array.new([1.0, -2.0, 0.5, 3.0])
out = f.run({"idx": idx, "s": s})
bad = None
try:
    f.run({"idx": js.Float32Array.new([0, 1, 2, 3]), "s": s})
except wg.FeedError as e:
    bad = str(e)
{"type": type(out).__name__, "shape": list(out.shape), "values": out.tolist(), "bad": bad}
"""


def test_js_typed_arrays_feed_a_webgpu_program(browser_session):
    got = browser_session.run(CODE)
    E = torch.tensor([0.1 * k - 0.7 for k in range(15)]).reshape(5, 3)
    want = E[torch.tensor([4, 0, 2, 2])] * torch.tensor([1.0, -2.0, 0.5, 3.0]).reshape(4, 1)
    assert got["type"] == "HostArray" and got["shape"] == [4, 3]
    assert torch.allclose(torch.tensor(got["values"]), want, rtol=1e-6, atol=1e-6)
    assert "input 'idx'" in got["bad"] and "i32" in got["bad"]  # f32 data for i32 indices refused
