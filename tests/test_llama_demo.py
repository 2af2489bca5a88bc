"""The chat page's demo model and fine-tune (models/llama_demo.py, models/finetune.py), in
CPython on the reference backend: the tokenizer round-trips bytes and renders SmolLM2's ChatML,
the weights are Llama.init_random's (the head scaled), and a few LoRA steps lower the loss.
The page itself: tests/browser/test_chat_page.py."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from webgrad.models import finetune, llama, llama_demo


def _run(coro):   # a thread of its own: a browser test's Playwright loop may hold this one
    out = {}
    t = threading.Thread(target=lambda: out.update(v=asyncio.run(coro)))
    t.start()
    t.join()
    return out["v"]


def test_tokenizer_bytes_and_chat_template():
    tok = llama_demo.tokenizer()
    text = "héllo <|im_end|> wörld\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert 258 in ids and tok.decode(ids) == text
    assert tok.encode("ab", add_special_tokens=False) == [97, 98]
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert prompt == ("<|im_start|>system\nYou are a tiny demo model.<|im_end|>\n"
                      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token_id == llama_demo.CONFIG.eos_token_id == 258


def test_weights_are_init_random_with_the_head_scaled():
    got = llama_demo.model(3, backend="reference").state_dict()
    want = llama.Llama.init_random(llama_demo.CONFIG, seed=3, backend="reference").state_dict()
    assert set(got) == set(want)
    for name in want:
        scale = llama_demo.HEAD_SCALE if name == "lm_head.weight" else 1.0
        np.testing.assert_array_equal(got[name], want[name] * np.float32(scale))


def test_a_few_lora_steps_lower_the_held_out_loss():
    ft = finetune.FineTune(llama_demo.model(0, "reference"), llama_demo.tokenizer(),
                           finetune.pydoc_text(), backend="reference", lr=0.01)

    async def run():
        await ft.load_base_async()
        before = await ft.held_loss_async()
        losses = await ft.steps_async(4)
        first = float(await ft.c.run_async(ft.held[0]))
        return before, losses, await ft.held_loss_async(), first, await ft.merged_async()

    before, losses, after, first, tuned = _run(run())
    assert before > 7.0 and after < before - 1.0 and losses[-1] < losses[0]
    # the merged model (what the page chats with) scores the held-out text as the adapted one
    b = ft.held[0]
    bits = [x for ids, ys in zip(b["tokens"], b["targets"])
            for x in tuned.surprisal(ids + ys[-1:]).bits[1:]]
    assert abs(sum(bits) / len(bits) * np.log(2) - first) < 1e-3


def test_a_short_text_says_what_to_do():
    with pytest.raises(ValueError, match="paste a longer text"):
        finetune.FineTune(llama_demo.model(0, "reference"), llama_demo.tokenizer(), "too short",
                          backend="reference")


def test_the_cache_image_round_trips():
    """models/llama_cache.py: a Llama and its tokenizer, imaged and restored here (the page
    keeps them in IndexedDB with the same functions)."""
    import json
    from webgrad.models import llama_cache
    m = llama_demo.model(2, "reference")
    item = llama_cache.Chat(m, json.dumps(llama_demo.tokenizer_spec()).encode(),
                            llama_demo.tokenizer_config())
    meta, parts = _run(llama_cache.image_async(item))
    data = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    assert meta["nbytes"] == len(data) == llama_cache.nbytes(item)
    back = llama_cache.restore(json.loads(json.dumps(meta)), data, backend="reference")
    assert back.model.cfg == m.cfg
    for name, w in m.state_dict().items():
        np.testing.assert_array_equal(back.model.state_dict()[name], w)
    tok = back.tokenizer()
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == \
        llama_demo.tokenizer().apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(llama_cache.ModelCacheError, match="format"):
        llama_cache.restore({**meta, "format": 99}, data, backend="reference")


@pytest.mark.parametrize("qt", ["F32", "Q4_K_M"])
def test_a_gguf_model_is_kept_as_its_file(tmp_path, qt):
    """A Llama loaded from GGUF (F32, or Q4_K with Q6_K: the blocks held quantized) images as
    the file itself and restores to the same quantized weights, logits and tokenizer;
    a damaged entry is refused naming the field."""
    import json
    pytest.importorskip("transformers")
    gguf = pytest.importorskip("gguf")
    from test_llama_gguf import IDS, WIDE, hf_model, llama_cpp_gguf, q4_k_m
    from webgrad.models import llama, llama_cache
    QT = gguf.GGMLQuantizationType
    model = hf_model("llama", WIDE)
    path, _ = llama_cpp_gguf(tmp_path, model, "llama", spm=True,
                             **(dict(qtype=QT.Q4_K, mix=q4_k_m(2)) if qt != "F32" else {}))
    blob = path.read_bytes()
    m = llama.Llama.from_gguf(blob, backend="reference")
    assert bool(m.quant) == (qt != "F32")
    meta, parts = _run(llama_cache.image_async(llama_cache.Chat(m, b"", {}, gguf=blob)))
    data = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    assert data == blob and meta["nbytes"] == len(blob) == llama_cache.nbytes(
        llama_cache.Chat(m, b"", {}, gguf=blob))
    meta = json.loads(json.dumps(meta))
    back = llama_cache.restore(meta, data, backend="reference")
    assert back.model.cfg == m.cfg
    assert {n: (q.qtype, q.shape) for n, q in back.model.quant.items()} == {
        n: (q.qtype, q.shape) for n, q in m.quant.items()}
    np.testing.assert_array_equal(back.model.forward(IDS), m.forward(IDS))
    text = "t7t12 t300"
    assert back.tokenizer().encode(text) == llama.Tokenizer.from_gguf(blob).encode(text)
    for field, bad in (("offset", {"offset": 8}), ("tensors", {"dtype": "f32"})):
        t = dict(meta["tensors"][0], **bad)
        with pytest.raises(llama_cache.ModelCacheError, match=field):
            llama_cache.restore({**meta, "tensors": [t]}, data, backend="reference")
    with pytest.raises(llama_cache.ModelCacheError, match="config"):
        llama_cache.restore({**meta, "config": {**meta["config"], "hidden_size": 128}}, data,
                            backend="reference")
