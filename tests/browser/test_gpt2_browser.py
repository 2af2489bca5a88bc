"""GPT-2 in the browser worker (Pyodide, WebGPU on SwiftShader): transformers parity, cached
decoding, and training on pydoc_data.topics from Pyodide's own stdlib.

The weights of a random transformers GPT2LMHeadModel (norms and biases off their defaults)
travel into the worker as f32 bytes; the worker's logits come back as bytes and are judged
here against transformers. Training runs entirely in the worker; only numbers come back.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

browser = pytest.mark.browser
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@browser
def test_gpt2_matches_transformers_in_the_worker(browser_session):
    pytest.importorskip("transformers")
    from test_gpt2 import CONFIGS, hf_logits, hf_model, close
    s = browser_session
    cfg = CONFIGS[0]
    ref = hf_model(cfg, seed=11)
    weights = {k: v.numpy().astype(np.float32).tobytes() for k, v in ref.state_dict().items()}
    ids = [1, 4, 4, 9, 2, 7, 0, 3, 5, 5, 10, 6, 8, 1]
    s.run(f"""
from webgrad.models import gpt2
async def gpt2_parity(weights, ids):
    cfg = gpt2.GPT2Config(**{dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                                  n_ctx=cfg.n_ctx, vocab_size=cfg.vocab_size)!r})
    sd = {{k: memoryview(v).cast("f") for k, v in weights.items()}}
    m = gpt2.GPT2.from_hf_state_dict(cfg, sd, backend="webgpu")
    full = await m.forward_async(ids)
    c = m.new_cache()
    steps = [await m.logits_step_async([t], c) for t in ids[:4]]
    rest = await m.logits_all_step_async(ids[4:], c)
    return [bytes(memoryview(full)), [bytes(memoryview(x)) for x in steps], bytes(memoryview(rest))]
""")
    full, steps, rest = s.call("gpt2_parity", weights, ids, timeout=600)
    V = cfg.vocab_size
    want = hf_logits(ref, ids)
    close(np.frombuffer(full, np.float32).reshape(len(ids), V), want)
    cached = np.concatenate([np.frombuffer(x, np.float32).reshape(1, V) for x in steps]
                            + [np.frombuffer(rest, np.float32).reshape(-1, V)])
    close(cached, want)


def _ensure_pydoc_data(s):
    """Pyodide unvendors pydoc_data from its stdlib (a package its CDN serves, which the npm
    distribution served offline here lacks): when the worker cannot import it, ship this
    Python's own copy of the module (the same text) into the worker's filesystem."""
    if s.run("import importlib.util; importlib.util.find_spec('pydoc_data') is not None"):
        return
    import pydoc_data.topics
    source = Path(pydoc_data.topics.__file__).read_text()
    s.run(f"""
import os, sys, importlib
os.makedirs("/home/pyodide/webgrad_corpus/pydoc_data", exist_ok=True)
open("/home/pyodide/webgrad_corpus/pydoc_data/__init__.py", "w").close()
with open("/home/pyodide/webgrad_corpus/pydoc_data/topics.py", "w") as f:
    f.write({source!r})
if "/home/pyodide/webgrad_corpus" not in sys.path:
    sys.path.insert(0, "/home/pyodide/webgrad_corpus")
importlib.invalidate_caches()
""")


@browser
def test_gpt2_trains_on_pydoc_topics_in_the_worker(browser_session):
    _ensure_pydoc_data(browser_session)
    got = browser_session.run("""
import math, random, time
from collections import Counter
import pydoc_data.topics as topics
import webgrad as wg
from webgrad import optim
from webgrad.models import gpt2
text = "".join(topics.topics[k] for k in sorted(topics.topics)).encode()
cut = int(len(text) * 0.9)
train, held = text[:cut], text[cut:]
cfg = gpt2.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=32, vocab_size=256)
B, L = 32, 32
def batches(src, seed):
    rng = random.Random(seed)
    while True:
        xs, ys = [], []
        for _ in range(B):
            i = rng.randrange(len(src) - L - 1)
            xs.append(list(src[i:i + L])); ys.append(list(src[i + 1:i + L + 1]))
        yield {"tokens": xs, "targets": ys}
c = wg.compile_module(lambda: gpt2.GPT2Module(cfg), gpt2.lm_loss,
                      inputs={"tokens": ([B, L], "i32"), "targets": ([B, L], "i32")},
                      optimizer=optim.Adam(lr=3e-3), backend="webgpu")
data = batches(train, 0)
t0 = time.perf_counter()
for _ in range(120):
    await c.step_async(next(data))
secs = time.perf_counter() - t0
hb = batches(held, 1)
held_loss = sum([await c.run_async(next(hb)) for _ in range(6)]) / 6
cnt = Counter(train)
base = -sum(math.log((cnt[b] + 1) / (len(train) + 256)) for b in held) / len(held)
m = gpt2.GPT2.from_compiled(c, cfg)                  # same device buffers: no copy
out = await m.generate_async(list(b"The "), max_new_tokens=16, seed=1, top_k=20)
again = await m.generate_async(list(b"The "), max_new_tokens=16, seed=1, top_k=20)
blob = await m.save_safetensors_async()
back = gpt2.GPT2.from_safetensors(blob, backend="webgpu")
a = await m.forward_async(list(b"The value"))
b = await back.forward_async(list(b"The value"))
diff = max(abs(x - y) for x, y in zip(a, b))
{"held": held_loss, "base": base, "out": out, "again": again, "diff": diff, "secs": secs,
 "cfg": [back.cfg.n_layer, back.cfg.n_embd, back.cfg.vocab_size]}
""", timeout=900)
    assert got["held"] < got["base"] - 0.5, got
    assert got["out"] == got["again"] and len(got["out"]) == 20
    assert got["diff"] == 0 and got["cfg"] == [2, 64, 256]
