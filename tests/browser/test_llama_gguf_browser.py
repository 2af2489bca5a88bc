"""A Llama of SmolLM2-135M's shape, loaded from GGUF in the browser worker (Pyodide, WebGPU on
SwiftShader), and the Q4_K file (Q4_K, Q5_0 and Q8_0 blocks) kept in the model cache and
loaded back from it.

The model: 576 wide, 9 query and 3 key/value heads of 64, a 1536-wide MLP, 49152 tokens with
tied embeddings, rope_theta 1e5, norms moved off their defaults, one layer, random weights
(transformers' LlamaForCausalLM). Written in CPython as llama.cpp's converter writes it
(tests/test_llama_gguf.py: gguf's writer, llama.cpp's names, q/k rows permuted) in four
files: F32, and "Q4_K" and "Q6_K" as llama-quantize lays them out for this width (576 is not a
whole number of 256-value k-quant blocks, so those matrices fall back: Q5_0 beside Q4_K, with
a Q8_0 token table; Q8_0 beside Q6_K; ffn_down, 1536 wide, is Q4_K or Q6_K). serve.py serves them from models/; the
worker fetches each, Llama.from_gguf keeps its blocks quantized on the GPU.

Expected: transformers' logits on the weights gguf.quants.dequantize decodes from the same
file, within 1e-4 of the largest logit, for the full forward and for the cached last step;
from the model cache (models/llama_cache.py), the logits of the model read from the file.
"""
from __future__ import annotations

import numpy as np
import pytest

browser = pytest.mark.browser

SMOL = dict(hidden_size=576, num_hidden_layers=1, num_attention_heads=9, num_key_value_heads=3,
            intermediate_size=1536, vocab_size=49152, max_position_embeddings=64,
            rope_theta=100000.0, rms_norm_eps=1e-5)
IDS = [1, 4093, 29, 731, 48000, 5, 260, 17, 9999, 3, 812]


@browser
def test_smollm2_shaped_gguf_files_in_the_worker(browser_session, serve_module):
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as QT
    from test_llama_gguf import close, hf_model, llama_cpp_gguf
    s = browser_session
    down = "blk.0.ffn_down.weight"
    files = {"F32": (None, None),
             "Q4_K": (QT.Q5_0, {down: QT.Q4_K, "token_embd.weight": QT.Q8_0}),
             "Q6_K": (QT.Q8_0, {down: QT.Q6_K})}
    models = serve_module.layout()["models"]
    s.run("""
from pyodide.http import pyfetch
from webgrad.io import modelcache as _modelcache
from webgrad.models import llama as _llama, llama_cache as _llama_cache
async def smol_gguf_logits(url, ids, keep):
    blob = await (await pyfetch(url)).bytes()
    m = await _llama.Llama.from_gguf_async(blob, backend="webgpu")
    full = await m.forward_async(ids)
    c = m.new_cache()
    await m.logits_all_step_async(ids[:-3], c)
    last = await m.logits_all_step_async(ids[-3:], c)
    types = sorted({q.qtype for q in m.quant.values()})
    cached = None
    if keep:     # kept in the model cache (the GPU's words) and loaded back by key
        info = await _llama_cache.store_async(_llama_cache.Chat(m, b"", {}, gguf=blob), name="t")
        m.backend.destroy()
        item, got = await _llama_cache.load_key_async(info["key"], backend="webgpu")
        cached = bytes(memoryview(await item.model.forward_async(ids)))
        assert got["cached"] and item.model.quant == m.quant and len(item.gguf) < len(blob) // 10
        item.model.backend.destroy()
        await _modelcache.remove_async(info["key"])
    return bytes(memoryview(full)), bytes(memoryview(last)), types, cached
""")
    model = hf_model("llama_tied", SMOL, num_key_value_heads=3)
    got = {}
    try:
        for name, (qtype, mix) in files.items():
            models.mkdir(exist_ok=True)
            dst, sd = llama_cpp_gguf(models, model, "llama_tied", qtype=qtype, mix=mix,
                                     name=f"test-smol-{name}.gguf")
            try:
                got[name] = sd, *s.call("smol_gguf_logits", f"{s.url.rstrip('/')}/models/{dst.name}",
                                        IDS, name == "Q4_K", timeout=180)
            finally:
                dst.unlink()
    finally:
        for name in files:
            (models / f"test-smol-{name}.gguf").unlink(missing_ok=True)
    # transformers on each file's decoded weights (loaded into the one model, after writing)
    for name, (sd, full, last, types, cached) in got.items():
        # restored from the cache (uploaded as the GPU held them): the same logits, bit for bit
        assert (cached is not None) == (name == "Q4_K") and cached in (None, full), name
        qtype, mix = files[name]
        assert types == sorted({q.name for q in (qtype, *(mix or {}).values()) if q is not None}), (
            name, types)
        missing, unexpected = model.load_state_dict({k: torch.tensor(v) for k, v in sd.items()},
                                                    strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}
        model.tie_weights()
        with torch.no_grad():
            want = model(torch.tensor([IDS])).logits[0].float().numpy()
        close(np.frombuffer(full, np.float32).reshape(want.shape), want)
        close(np.frombuffer(last, np.float32).reshape(3, -1), want[-3:])
