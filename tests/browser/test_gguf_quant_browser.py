"""GPT-2 with its weights held quantized, in the browser worker (WebGPU on SwiftShader).

GGUF files written in CPython by gguf's GGUFWriter (tests/test_gguf_quant.py: every matrix,
the token and position tables too, Q4_0 with odd block counts and Q4_K) are loaded in the
Pyodide worker by GPT2.from_gguf (keep_quantized=True, no numpy there: the blocks are
transcoded by strided byte slices). Judged in CPython: the logits equal those of the same
weights dequantized by gguf on the host (reference executor, f32), and in the worker those
of the model dequantized at load; the GPU holds the blocks, not f32 weights.
"""
from __future__ import annotations

import numpy as np
import pytest

browser = pytest.mark.browser


@browser
def test_gpt2_quantized_in_the_worker(browser_session, tmp_path):
    pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as QT
    from test_gguf_quant import quantized_gpt2
    from webgrad.models import gpt2
    s = browser_session
    s.run("""
from webgrad.models import gpt2 as _g
def quantized_logits(blob, ids):
    m = _g.GPT2.from_gguf(blob, backend="webgpu")
    full = _g.GPT2.from_gguf(blob, backend="webgpu", keep_quantized=False)
    c = m.new_cache()
    m.logits_step(ids[:-1], c)
    step = m.logits_step(ids[-1:], c)
    return (m.forward(ids).tobytes(), full.forward(ids).tobytes(), step.tobytes(),
            m.weight_bytes, full.weight_bytes, sorted(m.quant))
""")
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 96, 0, 11]
    for qt, dims in ((QT.Q4_0, dict(n_embd=96, n_head=3)), (QT.Q4_K, dict(n_embd=256, n_head=4))):
        path, sd = quantized_gpt2(tmp_path, qt, **dims)
        got, full, step, qbytes, fbytes, names = s.call("quantized_logits", path.read_bytes(), ids)
        host = gpt2.GPT2.from_hf_state_dict(gpt2.GPT2.from_gguf(path, backend="reference").cfg, sd,
                                            backend="reference")
        want = np.asarray(host.forward(ids))
        got = np.frombuffer(got, np.float32).reshape(want.shape)
        full = np.frombuffer(full, np.float32).reshape(want.shape)
        assert "wte.weight" in names and "h.1.mlp.c_fc.weight" in names
        assert qbytes < fbytes / 3 and fbytes == 4 * sum(np.asarray(v).size for v in sd.values())
        np.testing.assert_allclose(got, full, rtol=0, atol=2e-6 * np.abs(full).max())
        # against the host's f32 model: SwiftShader's f32 maths (exp, tanh, the row kernels'
        # summation order) differ from numpy's, within GPT-2's 1e-4-of-the-largest-logit
        # standard (tests/test_gpt2.py); the quantization itself is judged by the line above
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
        np.testing.assert_allclose(np.frombuffer(step, np.float32), want[-1], rtol=0,
                                   atol=1e-4 * np.abs(want).max())
