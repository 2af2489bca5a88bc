"""The chat page's demo model and fine-tune (models/llama_demo.py, models/finetune.py), in
CPython on the reference backend: the tokenizer round-trips bytes and renders SmolLM2's ChatML,
the weights are Llama.init_random's (the head scaled), and a few LoRA steps lower the loss.
The page itself: tests/browser/test_chat_page.py."""
from __future__ import annotations

import asyncio
import re
import threading

import numpy as np
import pytest

from backends import WEBGPU
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
    # format 1 held f32 weights in this layout too: such an entry (a fine-tuned model) is read
    old = llama_cache.restore({**json.loads(json.dumps(meta)), "format": 1}, data,
                              backend="reference")
    np.testing.assert_array_equal(old.model.state_dict()["lm_head.weight"],
                                  m.state_dict()["lm_head.weight"])


def _gguf_chat(tmp_path, qt, backend):
    """(file path, file bytes, the transformers state dict of the values it holds as the gguf package
    decodes them, transformers' model, the Llama read from it on `backend`)."""
    pytest.importorskip("transformers")
    gguf = pytest.importorskip("gguf")
    from test_llama_gguf import WIDE, hf_model, llama_cpp_gguf, q4_k_m
    QT = gguf.GGMLQuantizationType
    model = hf_model("llama", WIDE)
    path, sd = llama_cpp_gguf(tmp_path, model, "llama", spm=True,
                              **(dict(qtype=QT.Q4_K, mix=q4_k_m(2)) if qt != "F32" else {}))
    blob = path.read_bytes()
    return path, blob, sd, model, llama.Llama.from_gguf(blob, backend=backend)


@pytest.mark.parametrize("qt,backend", [("F32", "reference"), ("Q4_K_M", "reference"),
                                        pytest.param("Q4_K_M", "webgpu", marks=WEBGPU.marks)])
def test_a_gguf_model_images_as_the_gpu_holds_it(tmp_path, qt, backend, monkeypatch):
    """A Llama loaded from GGUF (F32, or Q4_K with Q6_K: the blocks held quantized) images
    as its weights in the GPU's layout: f32 values and quantized words that decode to the
    values the gguf package reads from the file (q/k rows in transformers' order), and the
    file's metadata alone for the tokenizer. Restored without parsing the file or laying
    out a block, it gives the same quant specs, the logits of the model read from the file
    bit for bit (transformers' on gguf's values, near), and the same tokenizer."""
    import json
    from webgrad import quants
    from webgrad.io import gguf as wgg
    from webgrad.models import llama_cache
    from test_llama_gguf import IDS, close, hf_logits
    gguf = pytest.importorskip("gguf")
    path, blob, sd, model, m = _gguf_chat(tmp_path, qt, backend)
    assert bool(m.quant) == (qt != "F32")
    item = llama_cache.Chat(m, b"", {}, gguf=blob)
    meta, parts = _run(llama_cache.image_async(item))
    data = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    assert meta["nbytes"] == len(data) == llama_cache.nbytes(item) and meta["source"] == "gguf"
    assert meta["format"] == llama_cache.FORMAT == 2
    tensors = {t["name"]: t for t in json.loads(json.dumps(meta))["tensors"]}
    for name, want in sd.items():
        t = tensors[name]
        raw = data[t["offset"]:t["offset"] + t["nbytes"]]
        if t["dtype"] == "words":
            q = t["quant"]
            assert q["qtype"] == m.quant_full[name].qtype and not q["transposed"], name
            got = quants.dequantize_words(q["qtype"], raw, tuple(q["shape"]))
        else:
            assert t["dtype"] == "f32" and name not in m.quant_full
            got = np.frombuffer(raw, np.float32)
        np.testing.assert_array_equal(np.asarray(got, np.float32).reshape(want.shape), want,
                                      err_msg=name)
    # the tokenizer's part: a GGUF file of the metadata alone, as the gguf package reads it
    t = tensors["tokenizer.gguf"]
    head = data[t["offset"]:t["offset"] + t["nbytes"]]
    assert t["dtype"] == "bytes" and len(head) < len(blob) / 4
    (tmp_path / "head.gguf").write_bytes(head)
    small, full = gguf.GGUFReader(tmp_path / "head.gguf"), gguf.GGUFReader(path)
    assert not small.tensors and small.fields["tokenizer.ggml.tokens"].contents() == \
        full.fields["tokenizer.ggml.tokens"].contents()
    # restored: nothing parsed, transcoded or laid out again
    def refused(*a, **k):
        raise AssertionError("restore parsed the file or laid out blocks")
    for mod, attr in ((wgg, "load"), (quants, "transcode"), (llama_cache.cache_image, "transcode"),
                      (llama.Llama, "write_blocks_async"), (llama.Llama, "write_blocks")):
        monkeypatch.setattr(mod, attr, refused)
    back = llama_cache.restore(json.loads(json.dumps(meta)), data, backend=backend)
    monkeypatch.undo()
    assert back.model.cfg == m.cfg and back.model.quant == m.quant
    assert back.model.weight_bytes == m.weight_bytes
    logits = np.asarray(back.model.forward(IDS))
    np.testing.assert_array_equal(logits, np.asarray(m.forward(IDS)))
    close(logits, hf_logits(model, IDS, sd))
    text = "t7t12 t300"
    assert back.tokenizer().encode(text) == llama.Tokenizer.from_gguf(blob).encode(text)
    meta2, parts2 = _run(llama_cache.image_async(back))     # and imaged again: the same
    assert meta2 == meta and b"".join(bytes(memoryview(p).cast("B")) for p in parts2) == data


def test_a_gguf_image_restores_into_split_tables_and_refuses_damage(tmp_path, monkeypatch):
    """A device that splits the token table and the head holds each row block in its own
    layout: restored there, the image's whole words are cut into the blocks, and imaged
    again they join into the same bytes. Damaged entries, and format 1's (the GGUF file
    itself, laid out again on every load), are refused naming the field."""
    import json
    from webgrad.models import llama_cache
    from test_llama_gguf import IDS
    _, blob, _, _, m = _gguf_chat(tmp_path, "Q4_K_M", "reference")
    meta, parts = _run(llama_cache.image_async(llama_cache.Chat(m, b"", {}, gguf=blob)))
    data = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    monkeypatch.setattr(llama, "chunks_for", lambda *a, **k: 3)
    split = llama_cache.restore(meta, data, backend="reference")
    monkeypatch.undo()
    assert split.model.table_chunks == 3 and "lm_head.2.weight" in split.model.quant
    np.testing.assert_allclose(np.asarray(split.model.forward(IDS)), np.asarray(m.forward(IDS)),
                               rtol=0, atol=1e-5)
    meta2, parts2 = _run(llama_cache.image_async(split))
    assert meta2 == meta and b"".join(bytes(memoryview(p).cast("B")) for p in parts2) == data
    meta = json.loads(json.dumps(meta))

    def tensor(which, **edit):
        return [dict(t, **edit) if t["name"] == which else t for t in meta["tensors"]]
    q = "model.layers.0.self_attn.q_proj.weight"
    for field, bad in (
            ("format", {"format": 1}),                 # kept as the file by an older webgrad
            ("format", {"format": 99}),
            ("config", {"config": {**meta["config"], "hidden_size": 128}}),
            ("tensors", {"tensors": tensor("tokenizer.gguf", name="tokenizer.json")}),
            (f"tensors['{q}'].offset", {"tensors": tensor(q, offset=2)}),
            (f"tensors['{q}'].quant.qtype", {"tensors": tensor(q, quant={"qtype": "Q3_K",
                                                                        "shape": [256, 256],
                                                                        "transposed": False})}),
            ("tensors['tokenizer.gguf'].offset", {"tensors": tensor("tokenizer.gguf",
                                                                    offset=len(data))})):
        with pytest.raises(llama_cache.ModelCacheError, match=re.escape(field)):
            llama_cache.restore({**meta, **bad}, data, backend="reference")
