"""Weights and text formats inside the Pyodide worker, where there is no numpy and no `regex`:
the GPT-2 tokenizer (its \\p{L}/\\p{N} tables built from Pyodide's own unicodedata), safetensors
both ways, GGUF dequantization on the pure-Python path, and a checkpoint that resumes a
browser-WebGPU training run exactly. Every result is judged in CPython: against the
tokenizer there (itself checked against transformers), the safetensors library and torch,
and gguf.quants.dequantize.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import safetensors.torch

browser = pytest.mark.browser

TEXT = ("Hello  world! It's 2026 -- naïve café, Привет мир, 你好世界, ½ Ⅻ x²,\n\n\t"
        "emoji 😀👍🏽 <|endoftext|> trailing   ")


@browser
def test_tokenizer_in_the_worker(browser_session, gpt2_vocab_files):
    from webgrad.models.bpe import Tokenizer
    enc, bpe = gpt2_vocab_files
    want = Tokenizer.from_files(enc, bpe).encode(TEXT)
    s = browser_session
    s.run("""
from webgrad.models.gpt2 import Tokenizer
def tokenize(enc, bpe, text):
    tok = Tokenizer.from_files(enc, bpe)
    ids = tok.encode(text)
    return ids, tok.decode(ids)
""")
    ids, text = s.call("tokenize", enc.read_bytes(), bpe.read_bytes(), TEXT)
    assert ids == want and text == TEXT
    assert s.run("import sys; 'numpy' in sys.modules or 'regex' in sys.modules") is False


@browser
def test_safetensors_both_ways_in_the_worker(browser_session):
    g = torch.Generator().manual_seed(0)
    theirs = {"f32": torch.randn(3, 4, generator=g), "f16": torch.randn(5, generator=g).half(),
              "bf16": torch.randn(2, 2, generator=g).bfloat16(),
              "i64": torch.arange(-3, 3, dtype=torch.int64)}
    s = browser_session
    s.run("""
from webgrad import HostArray
from webgrad.io import safetensors as st
def st_roundtrip(blob):
    f = st.load(blob)
    values = {k: [t.dtype, list(t.shape), t.to_host().tolist()] for k, t in f.items()}
    mine = st.dumps({"w": HostArray("f32", [0.5, -1.25, 3.0, 4.0], shape=(2, 2)),
                     "i": HostArray("i32", [7, -8], shape=(2,)), **f}, metadata={"from": "pyodide"})
    return values, mine
""")
    values, mine = s.call("st_roundtrip", safetensors.torch.save(theirs))
    for k, t in theirs.items():
        dtype, shape, vals = values[k]
        assert shape == list(t.shape)
        ref = t.float() if t.dtype.is_floating_point else t
        assert torch.equal(torch.tensor(vals, dtype=ref.dtype), ref), k
    back = safetensors.torch.load(mine)
    assert back["w"].tolist() == [[0.5, -1.25], [3.0, 4.0]] and back["i"].tolist() == [7, -8]
    assert all(torch.equal(back[k], t) for k, t in theirs.items())


@browser
def test_gguf_dequantizes_in_the_worker(browser_session, tmp_path):
    gguf = pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as QT
    from test_gguf import random_blocks, write
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    q4k = random_blocks(QT.Q4_K, 4, rng)
    quants = {QT.Q8_0: gguf.quants.quantize(x, QT.Q8_0), QT.Q4_0: gguf.quants.quantize(x, QT.Q4_0),
              QT.Q4_K: q4k.reshape(4, 144)}

    def build(w):
        w.add_string("general.name", "tiny")
        for qt, q in quants.items():
            w.add_tensor(qt.name, q, raw_shape=q.shape, raw_dtype=qt)
        w.add_tensor("F16", x.astype(np.float16))

    blob = write(tmp_path, build).read_bytes()
    s = browser_session
    s.run("""
from webgrad.io import gguf as G
def gguf_values(blob):
    f = G.load(blob)
    return f.metadata["general.name"], {k: [t.type_name, list(t.shape), t.dequantize().tobytes()]
                                        for k, t in f.tensors.items()}
""")
    name, got = s.call("gguf_values", blob)
    assert name == "tiny"
    for qt, q in quants.items():
        type_name, shape, raw = got[qt.name]
        want = gguf.quants.dequantize(q, qt).astype(np.float32)
        assert type_name == qt.name and shape == list(want.shape)
        assert np.frombuffer(raw, np.float32).tobytes() == want.tobytes(), qt.name
    assert np.frombuffer(got["F16"][2], np.float32).tobytes() == x.astype(np.float16).astype(np.float32).tobytes()


@browser
def test_checkpoint_resumes_on_browser_webgpu(browser_session):
    s = browser_session
    out = s.run("""
import random
import webgrad as wg
from webgrad import Module, nn, ops, optim, lr

class Net(Module):
    def __init__(self):
        super().__init__()
        self.l1, self.ln, self.l2 = nn.Linear(5, 16), nn.LayerNorm(16), nn.Linear(16, 1)

def loss_fn(m, inp):
    h = ops.dropout(ops.gelu(m.ln.fwd(m.l1.fwd(inp["x"]))), 0.2)
    d = m.l2.fwd(h) - inp["y"]
    return ops.mean_all(d * d)

def make():
    sched = lr.warmup(peak=0.02, steps=3, after=lr.cosine_decay(peak=0.02, final=0.001, steps=20))
    return wg.compile_module(Net, loss_fn, inputs={"x": [8, 5], "y": [8, 1]},
                             optimizer=optim.AdamW(lr=sched, weight_decay=0.1), backend="webgpu")

def batch(i):
    rng = random.Random(i)
    xs = [[rng.uniform(-1, 1) for _ in range(5)] for _ in range(8)]
    return {"x": xs, "y": [[sum(x) ** 2] for x in xs]}

whole = make()
want = [whole.step(batch(i)) for i in range(8)]
first = make()
got = [first.step(batch(i)) for i in range(3)]
blob = first.save()
second = make()
second.step(batch(42))
second.load(blob)
got += [second.step(batch(i)) for i in range(3, 8)]
[want, got, blob]
""")
    want, got, blob = out
    assert got == want
    f = safetensors.torch.load(blob)
    assert f["step"].item() == 3.0 and "l1.W" in f and any(k.startswith("opt/") for k in f)


@browser
def test_gguf_dequantizes_on_browser_webgpu(browser_session, tmp_path):
    """The blocks go up as they are and a WGSL kernel writes the f32 parameter (SwiftShader)."""
    gguf = pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as QT
    from test_gguf import random_blocks, write
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    quants = {QT.Q8_0: gguf.quants.quantize(x, QT.Q8_0), QT.Q4_0: gguf.quants.quantize(x, QT.Q4_0),
              QT.Q4_K: random_blocks(QT.Q4_K, 4, rng).reshape(4, 144)}

    def build(w):
        for qt, q in quants.items():
            w.add_tensor(qt.name, q, raw_shape=q.shape, raw_dtype=qt)

    blob = write(tmp_path, build).read_bytes()
    s = browser_session
    s.run("""
import webgrad as wg
from webgrad import Module, ops
from webgrad.io import gguf as G, gpu_dequant

class W(Module):
    def __init__(self):
        super().__init__()
        self.w = self.param([4, 256])
        self.wt = self.param([256, 4])

def gpu_values(blob):
    f = G.load(blob)
    c = wg.compile_forward(W, lambda m, i: ops.sum_all(m.w) + ops.sum_all(m.wt), inputs={},
                           backend="webgpu")
    out = {}
    for name, t in f.tensors.items():
        gpu_dequant.write(c.owner.backend, "w", t)
        gpu_dequant.write(c.owner.backend, "wt", t, transpose=True)
        p = c.download_params()
        out[name] = [p["w"].tobytes(), p["wt"].tobytes(), float(c.run({}).tolist())]
    c.destroy()
    return out
""")
    got = s.call("gpu_values", blob)
    for qt, q in quants.items():
        want = gguf.quants.dequantize(q, qt).astype(np.float32)
        w, wt, total = got[qt.name]
        assert w == want.tobytes(), qt.name
        assert wt == np.ascontiguousarray(want.T).tobytes(), qt.name
        assert total == pytest.approx(2 * float(want.astype(np.float64).sum()), rel=1e-4, abs=1e-3)
