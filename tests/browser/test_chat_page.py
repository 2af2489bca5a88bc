"""The chat and fine-tune page (web/chat.html) in headless Chromium: it builds the demo model
(models/llama_demo.py) at start, a message streams its reply token by token through the chat
template, Stop ends a reply, a LoRA fine-tune of a few steps lowers the held-out loss, and the
site header links every page. The page's tokens are judged against llama.generate on the
reference backend in CPython (the same seed gives the same weights), its losses against the
same fine-tune steps run here on the reference backend (models/finetune.py). The tests on the
page run twice: on WebGPU, and in the Chromium without WebGPU, where backend 'auto' puts every
model (the demo's, picked files, the fine-tune, the model cache's) on the CPU backend and the
page says so."""
from __future__ import annotations

import asyncio
import json
import threading

import pytest

from webgrad.models import finetune, llama_demo

browser = pytest.mark.browser


@pytest.fixture(scope="module", params=["webgpu", "wasm"])
def chat_backend(request):
    """The backend the page's models run on: WebGPU, or in the Chromium without WebGPU the CPU
    backend (onnxruntime-web), which backend 'auto' picks there."""
    return request.param


@pytest.fixture(scope="module")
def chat_page(chat_backend, request):
    session = request.getfixturevalue(
        "browser_session" if chat_backend == "webgpu" else "browser_without_webgpu")
    context = session.browser.new_context()   # its own IndexedDB, for two pages
    page = context.new_page()
    page.goto(session.url.rstrip("/") + "/chat.html")
    page.wait_for_selector("#status[data-state='ready']", timeout=120_000)
    yield page
    context.close()


def _send(page, text, max_tokens):
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#temperature", "0")
    page.fill("#prompt", text)
    n = page.locator(".msg.assistant").count()
    page.click("#send")
    page.wait_for_function(f"document.querySelectorAll('.msg.assistant').length > {n}")
    return page.locator(".msg.assistant").nth(n)


def _ids(el):
    return json.loads(el.get_attribute("data-ids"))


def _in_thread(coro):   # Playwright's sync API keeps a loop on this thread (tests/conftest.py)
    out = {}
    t = threading.Thread(target=lambda: out.update(v=asyncio.run(coro)))
    t.start()
    t.join()
    return out["v"]


# first: it needs no Pyodide boot, so the session's start and the page's fall on two tests
@browser
def test_the_header_links_every_page(browser_session):
    page = browser_session.browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    base = browser_session.url.rstrip("/")
    try:
        want = [["index.html", "Playground"], ["surprisal.html", "Surprisal"],
                ["chat.html", "Chat & fine-tune"], ["lab/", "Notebooks"]]
        for path, current in (("/", "Playground"), ("/surprisal.html", "Surprisal"),
                              ("/chat.html", "Chat & fine-tune")):
            page.goto(base + path)
            page.wait_for_selector("#site-nav a")
            links = page.eval_on_selector_all("#site-nav a", "els => els.map(e => "
                                              "[e.getAttribute('href'), e.textContent])")
            assert links == want
            if path == "/":     # the playground's loss chart (losschart.mjs, shared) is made
                # (hidden until a run reports a loss)
                page.wait_for_selector("#chart .uplot", state="attached", timeout=30_000)
            assert page.text_content("#site-nav a[aria-current='page']") == current
            for href, _ in want:     # every link answers
                assert page.request.get(f"{base}{path.rsplit('/', 1)[0]}/{href}").ok, href
        page.click("#site-nav >> text=Surprisal")
        page.wait_for_url("**/surprisal.html")
        assert page.text_content("h1") == "Surprisal"
        assert errors == []
    finally:
        page.close()


@browser
def test_a_message_streams_the_greedy_reply(chat_page, chat_backend):
    page = chat_page
    info = json.loads(page.get_attribute("#model-info", "data-model"))
    assert info["layers"] == 2 and info["backend"] == chat_backend, info
    assert ("runs on the CPU" in page.text_content("#model-info")) == (chat_backend == "wasm")
    page.evaluate("() => { window._chatEvents = 0; webgrad.onEvent((m) => { "
                  "if (m.what === 'chat') window._chatEvents++; }); }")
    reply = _send(page, "Hello there", 16)
    page.wait_for_function("document.querySelector('.msg.assistant:last-child').dataset.done === '1'",
                           timeout=50_000)
    tok = llama_demo.tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hello there"}],
                                     add_generation_prompt=True)
    ids = tok.encode(prompt, add_special_tokens=False)
    want = llama_demo.model(0, backend="reference").generate(ids, max_new_tokens=16,
                                                             temperature=0)[len(ids):]
    assert _ids(reply) == want
    assert page.evaluate("window._chatEvents") == len(want)     # one event per token, streamed
    assert reply.locator(".text").text_content() == tok.decode(want, skip_special_tokens=True)
    assert page.evaluate("chat.messages")[-1] == {"role": "assistant",
                                                  "content": tok.decode(want, skip_special_tokens=True)}


@browser
def test_stop_ends_a_reply(chat_page):
    page = chat_page
    page.click("#clear")   # a new conversation: the stopped one and "Go on" fit the context
    # Stop is pressed by the page itself when the third token shows (a click from here
    # lands tens of tokens later on a busy machine: the conversation then outgrew the
    # demo model's 256 positions)
    page.evaluate("() => { const off = webgrad.onEvent((m) => { if (m.what === 'chat' && "
                  "JSON.parse(document.querySelector('.msg.assistant:last-child').dataset.ids "
                  "|| '[]').length >= 3) { off(); document.querySelector('#stop').click(); } }); }")
    reply = _send(page, "Tell me a long story", 200)
    page.wait_for_function("document.querySelector('.msg.assistant:last-child').dataset.done "
                           "=== 'stopped'", timeout=30_000)
    got = _ids(reply)
    assert 3 <= len(got) < 200
    page.wait_for_selector("#status[data-state='ready']")
    assert "Stopped after" in page.text_content("#status")
    # the conversation goes on: the next reply comes, starting from the stopped one (the
    # stopped reply's text in the template), as generate gives it here
    again = _send(page, "Go on", 2)
    page.wait_for_function("document.querySelector('.msg.assistant:last-child').dataset.done === '1'",
                           timeout=30_000)
    said = page.evaluate("chat.messages")[:-1]
    assert said[-2]["content"] == reply.locator(".text").text_content() and said[-1]["content"] == "Go on"
    tok = llama_demo.tokenizer()
    ids = tok.encode(tok.apply_chat_template(said, add_generation_prompt=True), add_special_tokens=False)
    want = llama_demo.model(0, backend="reference").generate(ids, max_new_tokens=2, temperature=0)
    assert _ids(again) == want[len(ids):]
    page.click("#clear")
    assert page.evaluate("chat.messages") == []


@browser
def test_lora_fine_tune_lowers_the_loss(chat_page):
    page = chat_page
    steps = 4
    page.fill("#ft-steps", str(steps))
    page.fill("#ft-lr", "0.01")
    page.click("#ft-train")
    page.wait_for_selector("#ft-held[data-done='1']", timeout=55_000)
    losses, held = page.evaluate("chat.losses"), page.evaluate("chat.held")

    async def here():   # the same fine-tune in CPython, on the reference backend
        ft = finetune.FineTune(llama_demo.model(0, "reference"), llama_demo.tokenizer(),
                               finetune.pydoc_text(), backend="reference", lr=0.01)
        await ft.load_base_async()
        before = await ft.held_loss_async()
        got = await ft.steps_async(steps)
        return before, got, await ft.held_loss_async()

    before, want, after = _in_thread(here())
    assert len(losses) == steps
    assert abs(held["before"] - before) < 1e-3
    assert all(abs(a - b) < 5e-3 * max(1.0, b) for a, b in zip(losses, want)), (losses, want)
    assert abs(held["after"] - after) < 2e-2
    assert held["after"] < held["before"] - 1.0       # 7.2 -> about 4.3 nats/token
    assert f"after {steps} steps" in page.text_content("#ft-held")


@browser
def test_a_fine_tuned_model_is_kept_and_reloads(chat_page):
    """The fine-tuned model is kept in the model cache: reloaded from it, it answers as
    before; the surprisal page (same browser, same cache) lists it and scores text with it."""
    page = chat_page
    key = page.get_attribute("#ft-held", "data-key")
    assert key and page.get_attribute("#cache", "data-count") == "1"
    first = _send(page, "Hi", 6)
    page.wait_for_function("document.querySelector('.msg.assistant:last-child').dataset.done === '1'",
                           timeout=30_000)
    before = _ids(first)
    page.locator(f"#cache tbody tr[data-key='{key}'] button.load").click()
    page.wait_for_function("document.getElementById('status').textContent.includes("
                           "\"from this browser's cache\")", timeout=30_000)
    again = _send(page, "Hi", 6)
    page.wait_for_function("document.querySelector('.msg.assistant:last-child').dataset.done === '1'",
                           timeout=30_000)
    assert _ids(again) == before

    other = page.context.new_page()
    try:
        other.goto(page.url.replace("chat.html", "surprisal.html"))
        other.wait_for_selector("body[data-ready='1']", timeout=30_000)
        other.fill("#text", "The value")
        other.locator(f"#cache tbody tr[data-key='{key}'] button.load").click()
        other.wait_for_function("document.querySelectorAll('#view span').length === 9",
                                timeout=30_000)
        bits = other.eval_on_selector_all("#view span", "els => els.map(e => +e.dataset.bits)")
        # a fine-tuned model finds English text far less surprising than 8 bits a byte
        assert sum(bits[1:]) / 8 < 8.0 and "2 layers" in other.text_content("#status")
    finally:
        other.close()


@browser
def test_a_picked_model_folder_chats(chat_page, tmp_path):
    """config.json + model.safetensors + tokenizer.json + tokenizer_config.json, as
    transformers' save_pretrained writes them (the demo model of seed 4, saved here): picked
    together, the page chats with them and replies as generate does here."""
    page = chat_page
    model = llama_demo.model(4, backend="reference")
    model.save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps(llama_demo.tokenizer_spec()))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(llama_demo.tokenizer_config()))
    page.set_input_files("#files", [str(tmp_path / n) for n in (
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")])
    page.wait_for_function("document.getElementById('status').textContent.startsWith("
                           "'Ready: model folder: llama, 2 layers')", timeout=30_000)
    reply = _send(page, "Hi", 8)
    page.wait_for_function("document.querySelector('.msg.assistant:last-child').dataset.done === '1'",
                           timeout=30_000)
    tok = llama_demo.tokenizer()
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hi"}],
                                             add_generation_prompt=True), add_special_tokens=False)
    assert _ids(reply) == model.generate(ids, max_new_tokens=8, temperature=0)[len(ids):]

    page.set_input_files("#files", [str(tmp_path / "config.json")])   # not enough: says what to pick
    page.wait_for_selector("#status.error")
    assert "pick a .gguf file, or a model folder's files together" in page.text_content("#status")


@browser
def test_a_picked_gguf_chats(chat_page, tmp_path):
    """The demo model of seed 5 as llama.cpp's converter writes it (F32 tensors, q/k rows
    permuted, the byte-level vocabulary and the chat template in the metadata): the page
    chats with it as generate does here with the same weights."""
    import gguf   # a test dependency (pyproject.toml): missing, the test fails
    import numpy as np
    page = chat_page
    cfg, model = llama_demo.CONFIG, llama_demo.model(5, backend="reference")
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads

    def permute(w, heads):   # convert_hf_to_gguf.py's LlamaModel.permute
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    path = tmp_path / "demo-f32.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    spec = llama_demo.tokenizer_spec()
    tokens = sorted(spec["model"]["vocab"], key=spec["model"]["vocab"].get) + llama_demo.SPECIAL
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3] * len(llama_demo.SPECIAL))
    w.add_eos_token_id(cfg.eos_token_id)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(llama_demo.CHAT_TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for k, v in model.state_dict().items():
        base, _, suffix = k.rpartition(".")
        heads = H if ".q_proj." in k else Hkv if ".k_proj." in k else None
        v = permute(v, heads) if heads else v
        w.add_tensor(f"{names.get_name(base)}.{suffix}", np.ascontiguousarray(v, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    page.set_input_files("#files", str(path))
    page.wait_for_function("document.getElementById('status').textContent.startsWith("
                           "'Ready: demo-f32.gguf')", timeout=30_000)
    reply = _send(page, "Hi", 8)
    page.wait_for_function("document.querySelector('.msg.assistant:last-child').dataset.done === '1'",
                           timeout=30_000)
    tok = llama_demo.tokenizer()
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hi"}],
                                             add_generation_prompt=True), add_special_tokens=False)
    want = model.generate(ids, max_new_tokens=8, temperature=0)[len(ids):]
    assert _ids(reply) == want

    # the file is kept in the model cache: loaded back from it (no file picked), with the
    # tokenizer and chat template its metadata holds, it answers the same
    kept = json.loads(page.get_attribute("#model-info", "data-model"))
    assert kept.get("kept") and kept.get("key"), kept
    page.click("#demo")
    page.wait_for_function("document.getElementById('status').textContent.startsWith("
                           "'Ready: demo model')", timeout=30_000)
    page.locator(f"#cache tbody tr[data-key='{kept['key']}'] button.load").click()
    page.wait_for_function("document.getElementById('status').textContent.startsWith("
                           "\"Ready: demo-f32.gguf (from this browser's cache)\")", timeout=30_000)
    again = _send(page, "Hi", 8)
    page.wait_for_function("document.querySelector('.msg.assistant:last-child').dataset.done === '1'",
                           timeout=30_000)
    assert _ids(again) == want


@browser
def test_stop_ends_a_fine_tune(chat_page):
    page = chat_page
    page.click("#demo")      # back to the demo model: a fine-tune needs f32 weights
    page.wait_for_function("document.getElementById('status').textContent.startsWith("
                           "'Ready: demo model')", timeout=30_000)
    page.fill("#ft-steps", "100000")
    page.click("#ft-train")
    page.wait_for_function("+(document.getElementById('ft-chart').dataset.step || 0) >= 2",
                           timeout=40_000)
    page.click("#ft-stop")
    page.wait_for_selector("#ft-held[data-done='1']", timeout=30_000)
    steps = len(page.evaluate("chat.losses"))
    assert 2 <= steps < 100_000 and f"after {steps} steps" in page.text_content("#ft-held")
