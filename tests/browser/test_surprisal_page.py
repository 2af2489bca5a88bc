"""The surprisal page (web/surprisal.html) in headless Chromium: pick a GPT-2 safetensors file,
type text, and every token is coloured by its surprisal, with the model's guess on hover;
an edit at the end recomputes only the new suffix (through the KV cache in the worker).
The bits shown are judged against the same model's surprisal computed here in CPython."""
from __future__ import annotations

import pytest

from webgrad.models import gpt2

browser = pytest.mark.browser


@browser
def test_surprisal_page_colours_tokens_and_updates_the_suffix(browser_session, tmp_path):
    cfg = gpt2.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=64, vocab_size=256)
    model = gpt2.GPT2.init_random(cfg, seed=9, backend="reference")
    path = tmp_path / "model.safetensors"
    model.save_safetensors(path)

    page = browser_session.browser.new_page()
    try:
        page.goto(browser_session.url.rstrip("/") + "/surprisal.html")
        page.wait_for_selector("body[data-ready='1']", timeout=600_000)
        page.set_input_files("#model", str(path))
        page.wait_for_function("document.querySelectorAll('#view span').length > 0", timeout=300_000)

        def shown():
            return page.eval_on_selector_all(
                "#view span", "els => els.map(e => [e.textContent, +e.dataset.bits, e.title])")

        text = page.input_value("#text")
        spans = shown()
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
    finally:
        page.close()
