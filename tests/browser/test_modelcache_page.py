"""The browser's model cache (web/modelcache.mjs + webgrad.io.modelcache, with GPT-2's images from
webgrad.models.gpt2_cache) on the surprisal page
in headless Chromium: a GPT-2 safetensors file fetched from serve.py and a GGUF (written by the
`gguf` package, Q8_0) picked from disk each load twice. The first load downloads (or reads and
hashes), parses and keeps the GPU image (the GGUF's Q8_0 weights as their words, the size they
take on the GPU); the second is a cache hit: no GET of the file reaches the network (only a HEAD
for its ETag), no parse phase runs, and the logits equal the first load's bit for bit. Both loads' logits are judged against the same model in CPython (the
reference executor; for GGUF, gguf's dequantization on the host). The cache lists both files,
and clearing it empties it (the next load downloads again). Both load times are printed.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest

from webgrad.models import gpt2, gpt2_cache

browser = pytest.mark.browser
REPO = Path(__file__).resolve().parents[2]
IDS = list(b"The value of x")


def open_page(session):
    page = session.browser.new_page()
    page.on("console", lambda m: session.console.append(f"{m.type}: {m.text}"))
    requests = []
    page.on("request", lambda r: requests.append((r.method, r.url)))
    page.goto(session.url.rstrip("/") + "/surprisal.html")
    page.wait_for_selector("body[data-ready='1']", timeout=600_000)
    return page, requests


def loaded(page, start):
    """Run start() (which begins a load) and wait for its model info on #view."""
    page.evaluate("delete document.getElementById('view').dataset.model")
    start()
    page.wait_for_function("document.getElementById('view').dataset.model !== undefined || "
                           "document.getElementById('status').className === 'error'",
                           timeout=300_000)
    info = page.get_attribute("#view", "data-model")
    assert info is not None, page.text_content("#status")
    return json.loads(info)


def logits(page):
    flat = page.evaluate("""async (ids) => webgrad.run(
        `list(_surprisal["model"].forward(${JSON.stringify(ids)}))`)""", IDS)
    return np.asarray(flat, np.float32).reshape(len(IDS), -1)


def close(got, want):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


@browser
def test_models_load_from_the_cache_the_second_time(backend, page_session, tmp_path, capsys):
    """On WebGPU, and in the Chromium without WebGPU on the CPU backend (wasm), where the
    image is written through the host (cache_image.write) and the GGUF's words go into
    onnxruntime-web's tensors."""
    pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as QT
    from test_modelcache import gguf_of
    cfg = gpt2.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=64, vocab_size=256)
    st_model = gpt2.GPT2.init_random(cfg, seed=21, backend="reference")
    served = REPO / "models" / f"test-{uuid.uuid4().hex[:8]}.safetensors"
    served.parent.mkdir(exist_ok=True)
    st_model.save_safetensors(served)
    gg_path, _ = gguf_of(tmp_path / "picked.gguf", gpt2.GPT2.init_random(cfg, seed=22, backend="reference"),
                         qtype=QT.Q8_0)
    gg_host = gpt2.GPT2.from_gguf(gg_path, backend="reference")   # dequantized on the host

    page, requests = open_page(page_session)
    times = {}
    try:
        def by_url():
            page.fill("#model-url", f"models/{served.name}")
            page.click("#load-url")

        def gets():
            return [u for m, u in requests if m == "GET" and u.endswith(served.name)]

        def heads():
            return [u for m, u in requests if m == "HEAD" and u.endswith(served.name)]

        # safetensors from the server: downloaded, parsed, kept ...
        first = loaded(page, by_url)
        assert first["cached"] is False and first["kind"] == "safetensors", first
        assert first["backend"] == backend, first
        assert {"download", "parse", "store"} <= set(first["phases"]), first
        assert len(gets()) == 1 and len(heads()) == 1
        fresh = logits(page)
        close(fresh, np.asarray(st_model.forward(IDS)))
        # ... and the second time only the HEAD goes out: no download, no parse
        second = loaded(page, by_url)
        assert second["cached"] is True and second["key"] == first["key"], second
        assert second["backend"] == backend, second
        assert set(second["phases"]) <= {"lookup", "read", "upload"} and "upload" in second["phases"], second
        assert len(gets()) == 1 and len(heads()) == 2
        assert np.array_equal(logits(page), fresh)
        times["safetensors"] = (first["seconds"], second["seconds"])

        # GGUF picked from disk: hashed, parsed (blocks kept quantized), kept; then a hit
        first = loaded(page, lambda: page.set_input_files("#model", str(gg_path)))
        assert first["cached"] is False and first["kind"] == "gguf", first
        assert {"hash", "parse", "store"} <= set(first["phases"])
        fresh = logits(page)
        close(fresh, np.asarray(gg_host.forward(IDS)))
        page.set_input_files("#model", [])
        second = loaded(page, lambda: page.set_input_files("#model", str(gg_path)))
        assert second["cached"] is True and "parse" not in second["phases"], second
        assert first["backend"] == second["backend"] == backend
        assert np.array_equal(logits(page), fresh)
        times["gguf"] = (first["seconds"], second["seconds"])

        # listed (the page's table and the JS API agree), loadable from the list, cleared
        listed = page.evaluate("modelCache.list()")
        assert sorted(e["name"] for e in listed) == sorted([served.name, "picked.gguf"])
        assert sorted(e["kind"] for e in listed) == ["gguf", "safetensors"]
        assert all(e["meta"]["config"]["n_embd"] == 64 and e["nbytes"] == e["meta"]["nbytes"]
                   for e in listed)
        # the GGUF is kept as the GPU holds it: its Q8_0 weights as their words, not f32
        gg = next(e for e in listed if e["kind"] == "gguf")
        assert gg["nbytes"] == gg_host.weight_bytes
        assert {t["name"] for t in gg["meta"]["tensors"] if t["dtype"] == "words"} == set(gg_host.quant)
        page.wait_for_function("document.getElementById('cache').dataset.count === '2'")
        row = page.locator("#cache tbody tr", has_text=served.name)
        again = loaded(page, lambda: row.locator("button.load").click())
        assert again["cached"] is True and again["name"] == served.name
        close(logits(page), np.asarray(st_model.forward(IDS)))
        page.click("#cache-clear")
        page.wait_for_function("document.getElementById('cache').dataset.count === '0'")
        assert page.evaluate("modelCache.list()") == []
        third = loaded(page, by_url)
        assert third["cached"] is False and len(gets()) == 2
        # a URL that names nothing: the error says which and what the server answered
        page.fill("#model-url", "models/missing.safetensors")
        page.click("#load-url")
        page.wait_for_selector("#status.error")
        status = page.text_content("#status")
        assert "models/missing.safetensors" in status and "answered 404" in status, status
    finally:
        page.close()
        served.unlink(missing_ok=True)
    with capsys.disabled():
        for kind, (a, b) in times.items():
            print(f"\n  model cache on {backend}, {kind}: first load {a:.3f} s, second (cached) {b:.3f} s")


@browser
def test_python_api_in_the_worker(backend, page_session):
    """webgrad.io.modelcache and models.gpt2_cache from Python in the worker: bytes in, a hit
    the second time, stored trained models listed, removed and cleared; the image restores the
    same weights; entries another version wrote are replaced (a URL or file) or dropped (by
    key). With no backend named the loads run on 'auto': WebGPU, or the CPU backend in the
    Chromium without it."""
    cfg = gpt2.GPT2Config(n_layer=1, n_head=2, n_embd=32, n_ctx=16, vocab_size=256)
    src = gpt2.GPT2.init_random(cfg, seed=23, backend="reference")
    s = page_session
    s.run("""
from webgrad.io import modelcache
from webgrad.models import gpt2, gpt2_cache
async def cache_api(blob):
    await modelcache.clear_async()
    seen = []
    m1, a = await gpt2_cache.load_gpt2_async(blob, name="api.safetensors", progress=seen.append)
    m2, b = await gpt2_cache.load_gpt2_async(blob, name="api.safetensors")
    t = await gpt2_cache.store_async(m2, name="copy", kind="trained")
    listed = await modelcache.list_async()
    m3, c = await gpt2_cache.load_key_async(t["key"])
    same = list(await m1.forward_async([1, 2, 3])) == list(await m3.forward_async([1, 2, 3]))
    # an entry this webgrad cannot restore (another image format) is dropped and replaced
    import js
    from pyodide.ffi import to_js
    store = await js.webgradModelCache()
    rec = (await store.entry(b["key"])).to_py()
    rec["meta"]["format"] = 99
    await store.put(to_js(rec, dict_converter=js.Object.fromEntries),
                    to_js([await store.readData(b["key"])]))
    m4, d = await gpt2_cache.load_gpt2_async(blob, name="api.safetensors")
    _, e = await gpt2_cache.load_gpt2_async(blob, name="api.safetensors")
    stale = [d["cached"], e["cached"], (await store.entry(b["key"])).meta.format]
    await modelcache.remove_async(b["key"])
    after = [e["name"] for e in await modelcache.list_async()]
    # one loaded by key (no file to load again) is refused, saying so, and dropped
    rec = (await store.entry(t["key"])).to_py()
    rec["meta"]["format"] = 99
    await store.put(to_js(rec, dict_converter=js.Object.fromEntries),
                    to_js([await store.readData(t["key"])]))
    try:
        await gpt2_cache.load_key_async(t["key"])
        refused = None
    except modelcache.ModelCacheError as err:
        refused = [str(err), [e["name"] for e in await modelcache.list_async()]]
    await modelcache.clear_async()
    return {"a": a, "b": b, "c": c, "names": sorted(e["name"] for e in listed), "after": after,
            "refused": refused,
            "phases": sorted({p["phase"] for p in seen}), "same": same, "stale": stale,
            "empty": await modelcache.list_async(), "backends": [m.backend.name for m in (m1, m2, m3, m4)],
            "w": list(m3.state_dict()["h.0.mlp.c_fc.weight"])}
""")
    got = s.call("cache_api", src.save_safetensors())
    assert got["a"]["cached"] is False and got["b"]["cached"] is True and got["c"]["cached"] is True
    assert got["a"]["key"] == got["b"]["key"] and got["phases"] == ["hash", "lookup", "parse", "store"]
    assert got["names"] == ["api.safetensors", "copy"] and got["after"] == ["copy"]
    assert "format: 99" in got["refused"][0] and "dropped" in got["refused"][0], got["refused"]
    assert got["refused"][1] == []
    assert got["same"] and got["empty"] == [] and got["stale"] == [False, True, gpt2_cache.FORMAT]
    assert got["backends"] == [backend] * 4
    want = np.asarray(src.state_dict()["h.0.mlp.c_fc.weight"]).ravel()
    assert np.array_equal(np.asarray(got["w"], np.float32), want)
