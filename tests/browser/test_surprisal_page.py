"""The surprisal page (web/surprisal.html) in headless Chromium: pick a GPT-2 safetensors file,
type text, and every token is coloured by its surprisal, with the model's guess on hover;
an edit at the end recomputes only the new suffix (through the KV cache in the worker).
A model trained on the page (pydoc_data.topics, stopped after a few steps) colours the text,
downloads as safetensors and reloads from the model cache. The bits shown are judged against
the same model's surprisal computed here in CPython (the page's loading through the model
cache: test_modelcache_page.py). Each test runs twice (the `backend` fixture): on WebGPU, and
in the Chromium without WebGPU on the CPU backend (wasm), where the page says it runs on the
CPU."""
from __future__ import annotations

import json

import pytest

from webgrad.models import gpt2

browser = pytest.mark.browser


@browser
def test_surprisal_page_colours_tokens_and_updates_the_suffix(backend, page_session, tmp_path):
    cfg = gpt2.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=64, vocab_size=256)
    model = gpt2.GPT2.init_random(cfg, seed=9, backend="reference")
    path = tmp_path / "model.safetensors"
    model.save_safetensors(path)

    page = page_session.browser.new_page()
    try:
        page.goto(page_session.url.rstrip("/") + "/surprisal.html")
        page.wait_for_selector("body[data-ready='1']", timeout=600_000)
        page.set_input_files("#model", str(path))
        page.wait_for_function("document.querySelectorAll('#view span').length > 0", timeout=300_000)

        def shown():
            return page.eval_on_selector_all(
                "#view span", "els => els.map(e => [e.textContent, +e.dataset.bits, e.title])")

        text = page.input_value("#text")
        spans = shown()
        info = json.loads(page.get_attribute("#view", "data-model"))
        assert info["backend"] == backend and info["cached"] is False and "not_kept" not in info, info
        assert ("runs on the CPU" in page.text_content("#status")) == (backend == "wasm")
        want = model.surprisal(list(text.encode()))
        assert "".join(s[0] for s in spans) == text and len(spans) == len(want.bits)
        for (piece, bits, title), w, top, p in zip(spans, want.bits, want.top, want.top_p):
            assert abs(bits - w) < 2e-3
        assert f"p = {want.top_p[3]:.3f}" in spans[3][2] and repr(chr(want.top[3]))[1:-1] in spans[3][2]

        page.fill("#text", text + " More")       # typed at the end: 5 new bytes
        page.wait_for_function(f"document.querySelectorAll('#view span').length === {len(text) + 5}",
                               timeout=300_000)
        assert page.get_attribute("#stats", "data-recomputed") == "6"  # the suffix and one before
        want = model.surprisal(list((text + " More").encode()))
        assert all(abs(b - w) < 2e-3 for (_, b, _), w in zip(shown(), want.bits))

        # a text past the 64-byte context: every byte is scored, the later ones in windows
        # of 64 moved 32 at a time (each sees at least 32 bytes before it); the reference
        # scores the same windows on the CPU executor
        long = ("Scoring a text longer than the context: each token past it is read with the "
                "tokens before it that fit, in windows that move half a context at a time.")
        page.fill("#text", long)
        page.wait_for_function(f"document.querySelectorAll('#view span').length === {len(long)}",
                               timeout=300_000)
        ids, n = list(long.encode()), cfg.n_ctx
        want, first = list(model.surprisal(ids[:n]).bits), n
        while first < len(ids):
            start = min(first - n // 2, len(ids) - n)
            want += model.surprisal(ids[start:start + n]).bits[first - start:]
            first = start + n
        got = shown()
        assert "".join(s[0] for s in got) == long and len(want) == len(long)
        assert all(abs(b - w) < 2e-3 for (_, b, _), w in zip(got, want))
        assert page.get_attribute("#stats", "data-windowed") == str(len(long) - n)
        assert "sliding windows" in page.text_content("#stats")
        # the colour key: white (0 bits) to the deepest red (12 bits and more), as the tokens
        swatches = page.eval_on_selector_all(
            "#legend .swatch", "els => els.map(e => [+e.dataset.bits, getComputedStyle(e).backgroundColor])")
        assert [b for b, _ in swatches] == [0, 2, 4, 6, 8, 10, 12]
        assert swatches[0][1] == "rgb(255, 255, 255)" and swatches[-1][1] != swatches[0][1]

        # after a reload the text and the model (kept in the cache when it was picked) are back
        page.reload()
        page.wait_for_function(f"document.querySelectorAll('#view span').length === {len(long)}",
                               timeout=300_000)
        assert page.input_value("#text") == long
        assert all(abs(b - w) < 2e-3 for (_, b, _), w in zip(shown(), want))
        info = json.loads(page.get_attribute("#view", "data-model"))
        assert info["cached"] is True and info["backend"] == backend, info
        # the coloured text is on the first screen of a laptop-sized window
        page.set_viewport_size({"width": 1280, "height": 720})
        assert page.evaluate("document.getElementById('view').getBoundingClientRect().top") < 600

        # a model URL the server lacks: said in words, no progress line of the attempt left
        page.fill("#model-url", "models/no-such-model.safetensors")
        page.click("#load-url")
        page.wait_for_selector("#status.error")
        status = page.text_content("#status")
        assert "404" in status and "no-such-model" in status and "JsException" not in status, status
        assert page.is_hidden("#load-line") or "cache:" not in page.text_content("#load-line")
    finally:
        page.close()


@browser
def test_train_a_small_model_on_the_page(backend, page_session, tmp_path):
    """Train here (a tiny config, stopped after a few steps), then the page scores the text
    with that model: the bits shown equal those of from_safetensors(the downloaded file),
    computed here in CPython; the model is kept in the cache and reloads from it unchanged."""
    page = page_session.browser.new_page()
    try:
        page.goto(page_session.url.rstrip("/") + "/surprisal.html")
        page.wait_for_selector("body[data-ready='1']", timeout=600_000)
        for field, value in (("layers", 1), ("width", 32), ("ctx", 32), ("steps", 100_000)):
            page.fill(f"#train-{field}", str(value))
        text = "The value of x is"
        page.fill("#text", text)
        page.click("#train")
        page.wait_for_function("+(document.getElementById('train-line').dataset.step || 0) >= 8",
                               timeout=600_000)
        page.click("#stop")
        page.wait_for_selector("#train-line[data-done='1']", timeout=300_000)
        info = json.loads(page.get_attribute("#view", "data-model"))
        assert info["kind"] == "trained" and 8 <= info["step"] < 100_000
        assert info["backend"] == backend, info
        assert "held-out loss" in page.text_content("#train-text")
        page.wait_for_function(f"document.querySelectorAll('#view span').length === {len(text)}",
                               timeout=300_000)
        shown = page.eval_on_selector_all("#view span", "els => els.map(e => +e.dataset.bits)")

        with page.expect_download() as download:
            page.click("#download")
        path = tmp_path / "trained.safetensors"
        download.value.save_as(path)
        model = gpt2.GPT2.from_safetensors(path, backend="reference")
        assert model.cfg == gpt2.GPT2Config(1, 1, 32, 32, 256)
        want = model.surprisal(list(text.encode()))
        assert all(abs(b - w) < 2e-3 for b, w in zip(shown, want.bits)) and len(shown) == len(want.bits)

        listed = page.evaluate("modelCache.list()")
        assert [e["kind"] for e in listed] == ["trained"] and listed[0]["key"] == info["key"]
        assert f"{info['step']} steps" in listed[0]["name"]
        page.evaluate("document.getElementById('view').textContent = ''")
        page.locator("#cache tbody tr button.load").click()
        page.wait_for_function(f"document.querySelectorAll('#view span').length === {len(text)}",
                               timeout=300_000)
        again = json.loads(page.get_attribute("#view", "data-model"))
        assert again["cached"] is True and again["key"] == info["key"] and again["backend"] == backend
        assert page.eval_on_selector_all("#view span", "els => els.map(e => +e.dataset.bits)") == shown
    finally:
        page.close()
