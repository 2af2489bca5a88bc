"""GPT-2's GPU image for the model cache (webgrad.models.gpt2_cache), here in CPython (the
IndexedDB half, webgrad.io.modelcache, is tested in the browser,
tests/browser/test_modelcache_page.py): an image restores to a model with the same logits
bit for bit, whatever the token table's split on either side; a GGUF model kept quantized (Q4_K,
Q8_0; reference and WebGPU) images as its GPU words, which give back the file's blocks as the
`gguf` package reads them, and restores, without transcoding, to the same quant specs, weight
bytes and logits; dequantized at load, its image holds the weights as `gguf` dequantizes them;
a damaged image is refused naming the field.
"""
from __future__ import annotations

import asyncio
import copy
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from webgrad.io import modelcache
from webgrad.models import cache_image, gpt2, gpt2_cache
from backends import WEBGPU

CFG = gpt2.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_ctx=16, vocab_size=50)
IDS = [3, 1, 4, 1, 5, 9, 2, 6, 49]


def run(coro):
    """asyncio.run on a thread of its own (a browser test's Playwright may hold this one's loop)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def image(m):
    meta, parts = run(gpt2_cache.image_async(m))
    return meta, b"".join(bytes(p) for p in parts)


def test_image_round_trip_is_exact():
    m = gpt2.GPT2.init_random(CFG, seed=4, backend="reference")
    meta, data = image(m)
    assert meta["nbytes"] == len(data) == 4 * sum(np.prod(s) for s in gpt2.param_shapes(CFG).values())
    seen = []
    back = gpt2_cache.restore(meta, data, backend="reference", progress=lambda d, t: seen.append((d, t)))
    assert back.cfg == CFG and seen[0] == (0, len(data)) and seen[-1] == (len(data), len(data))
    assert len(seen) == 1 + len(meta["tensors"])
    assert np.array_equal(np.asarray(back.forward(IDS)), np.asarray(m.forward(IDS)))
    # the values are the state dict's (the safetensors library reads the same from a file)
    for t in meta["tensors"]:
        raw = np.frombuffer(data[t["offset"]:t["offset"] + t["nbytes"]], np.float32)
        assert np.array_equal(raw.reshape(t["shape"]), np.asarray(m.state_dict()[t["name"]]))


def test_split_token_table_images_as_one():
    m = gpt2.GPT2(CFG, "reference", wte_chunks=3)
    m.load_state_dict(gpt2.GPT2.init_random(CFG, seed=5, backend="reference").state_dict())
    meta, data = image(m)
    assert "wte.weight" in {t["name"] for t in meta["tensors"]}
    back = gpt2_cache.restore(meta, data, backend="reference")
    assert back.wte_chunks == 1
    want = m.state_dict()
    assert all(np.array_equal(np.asarray(v), np.asarray(want[k])) for k, v in back.state_dict().items())
    np.testing.assert_allclose(np.asarray(back.forward(IDS)), np.asarray(m.forward(IDS)), atol=1e-5)


def gguf_of(path, m, *, qtype=None):
    """What llama.cpp's converter writes for GPT2 `m` (test_gguf.gpt2_gguf_file: gguf's own
    names and writer; no output.weight: tied), 2-D weights quantized to qtype. Returns the
    path and each stored tensor as gguf dequantizes it."""
    from test_gguf import gpt2_gguf_file
    cfg = m.cfg
    sd = {"transformer." + k: np.asarray(v, np.float32) for k, v in m.state_dict().items()}
    return gpt2_gguf_file(path, sd, n_ctx=cfg.n_ctx, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
                          n_head=cfg.n_head, eps=cfg.layer_norm_epsilon, qtype=qtype)


def test_gguf_image_holds_ggufs_dequantization(tmp_path):
    """Loaded with keep_quantized=False, a GGUF's weights are f32: the image holds gguf's values."""
    gguf = pytest.importorskip("gguf")
    src = gpt2.GPT2.init_random(gpt2.GPT2Config(2, 2, 64, 16, 50), seed=7, backend="reference")
    path, stored = gguf_of(tmp_path / "m.gguf", src, qtype=gguf.GGMLQuantizationType.Q8_0)
    m = gpt2.GPT2.from_gguf(path, "reference", keep_quantized=False)
    meta, data = image(m)
    t = next(t for t in meta["tensors"] if t["name"] == "h.1.mlp.c_fc.weight")
    assert t["dtype"] == "f32" and "quant" not in t
    got = np.frombuffer(data[t["offset"]:t["offset"] + t["nbytes"]], np.float32).reshape(t["shape"])
    assert np.array_equal(got, stored["blk.1.ffn_up.weight"].T)   # gguf's values, [in, out]
    assert not np.array_equal(got, np.asarray(src.state_dict()["h.1.mlp.c_fc.weight"]))


def _quantized(tmp_path, qt_name, backend):
    """A GGUF (gguf's writer; every matrix, token table included, in qt) loaded quantized."""
    pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as QT
    from test_gguf_quant import CONFIGS, quantized_gpt2
    qt = QT[qt_name]
    path, _ = quantized_gpt2(tmp_path, qt, **CONFIGS[qt])
    return path, gpt2.GPT2.from_gguf(path, backend=backend)


@pytest.mark.parametrize("backend", ["reference", WEBGPU])
@pytest.mark.parametrize("qt", ["Q4_K", "Q8_0"])
def test_quantized_image_keeps_the_gpu_words(tmp_path, qt, backend, monkeypatch):
    import gguf
    from webgrad import quants
    path, m = _quantized(tmp_path, qt, backend)
    assert m.quant_full and m.wte_chunks == 1
    meta, data = image(m)
    # the image is what the GPU holds: the blocks' bytes, not f32 (Q4_K: ~1/7 of them)
    assert meta["nbytes"] == len(data) == m.weight_bytes
    assert m.weight_bytes < 4 * sum(np.prod(s) for s in gpt2.param_shapes(m.cfg).values()) / 3
    # each quantized tensor's words give back the file's blocks as the gguf package reads them
    blocks = {t.name: bytes(np.asarray(t.data).view(np.uint8).reshape(-1))
              for t in gguf.GGUFReader(str(path)).tensors}
    names = {"wte.weight": "token_embd.weight", "h.1.mlp.c_fc.weight": "blk.1.ffn_up.weight"}
    for t in meta["tensors"]:
        assert (t["dtype"] == "words") == (t["name"] in m.quant_full), t
        if t["name"] in names:
            q = t["quant"]
            assert q["qtype"] == qt and tuple(q["shape"]) == m.quant_full[t["name"]].shape
            words = data[t["offset"]:t["offset"] + t["nbytes"]]
            assert quants.raw_blocks(qt, words, int(np.prod(q["shape"]))) == blocks[names[t["name"]]]
    # restored: the same specs and bytes, nothing transcoded again, the same logits bit for bit
    def no_transcode(*a):
        raise AssertionError("restore transcoded blocks")
    monkeypatch.setattr(quants, "transcode", no_transcode)
    monkeypatch.setattr(cache_image, "transcode", no_transcode)   # imported by name there
    back = gpt2_cache.restore(meta, data, backend=backend)
    monkeypatch.undo()
    assert back.quant_full == m.quant_full and back.quant == m.quant
    assert back.weight_bytes == m.weight_bytes
    assert np.array_equal(np.asarray(back.forward(IDS)), np.asarray(m.forward(IDS)))
    meta2, data2 = image(back)
    assert meta2 == meta and data2 == data


def test_quantized_split_token_table_images_as_one(tmp_path, monkeypatch):
    """A device that splits the token table holds each row block in its own layout: the image
    joins them into the whole table's words, and a split restore cuts them again."""
    path, m = _quantized(tmp_path, "Q8_0", "reference")
    meta, data = image(m)
    monkeypatch.setattr(gpt2, "wte_chunks_for", lambda *a, **k: 3)
    split = gpt2_cache.restore(meta, data, backend="reference")
    monkeypatch.undo()
    assert split.wte_chunks == 3 and sorted(n for n in split.quant if n.startswith("wte.")) == [
        "wte.0.weight", "wte.1.weight", "wte.2.weight"]
    assert split.quant_full == m.quant_full
    assert image(split) == (meta, data)
    np.testing.assert_allclose(np.asarray(split.forward(IDS)), np.asarray(m.forward(IDS)),
                               rtol=0, atol=1e-5)


def _damaged(meta, data):
    def tensor(meta, name="h.0.ln_1.bias"):
        return next(t for t in meta["tensors"] if t["name"] == name)
    cases = []

    def case(field, edit, data_edit=None):
        m = copy.deepcopy(meta)
        edit(m)
        cases.append((field, m, data_edit(data) if data_edit else data))
    case("format", lambda m: m.update(format=99))
    case("model", lambda m: m.update(model="llama"))
    case("config", lambda m: m["config"].update(n_head=3))              # 32 % 3
    case("config", lambda m: m["config"].update(bogus=1))
    case("tensors", lambda m: m["tensors"].pop())
    case("tensors", lambda m: m["tensors"].append(dict(m["tensors"][0], name="extra")))
    case("dtype", lambda m: tensor(m).update(dtype="f16"))
    case("shape", lambda m: tensor(m).update(shape=[31]))
    case("nbytes", lambda m: tensor(m).update(nbytes=12))
    case("offset", lambda m: tensor(m).update(offset=-4))
    case("offset", lambda m: tensor(m).update(offset=2))
    case("offset", lambda m: None, lambda d: d[:-4])                    # truncated data
    return cases


def test_damaged_images_are_refused_by_field():
    m = gpt2.GPT2.init_random(CFG, seed=6, backend="reference")
    meta, data = image(m)
    for field, bad, blob in _damaged(meta, data):
        with pytest.raises(modelcache.ModelCacheError, match=rf"entry 'k1': .*{field}"):
            gpt2_cache.restore(bad, blob, backend="reference", what="'k1'")


def test_damaged_quantized_images_are_refused_by_field(tmp_path):
    _, m = _quantized(tmp_path, "Q4_K", "reference")
    meta, data = image(m)
    name = "h.0.mlp.c_fc.weight"

    def q(m):
        return next(t for t in m["tensors"] if t["name"] == name)
    cases = [
        ("format", lambda m: m.update(format=1)),          # written before quantized images
        (".quant.qtype", lambda m: q(m)["quant"].update(qtype="Q3_K")),
        (".quant.qtype", lambda m: q(m)["quant"].update(qtype=None)),
        (".quant.transposed", lambda m: q(m)["quant"].update(transposed="yes")),
        (".quant.transposed", lambda m: q(m)["quant"].update(transposed=not q(m)["quant"]["transposed"])),
        (".quant.shape", lambda m: q(m)["quant"].update(shape=[q(m)["quant"]["shape"][0], 128])),
        (".quant.shape", lambda m: q(m)["quant"].update(shape="1024x256")),
        (".quant", lambda m: q(m).pop("quant")),
        (".nbytes", lambda m: q(m).update(nbytes=q(m)["nbytes"] - 144)),
        (".nbytes", lambda m: q(m).update(dtype="f32")),   # words are not f32 values
        (".dtype", lambda m: q(m).update(dtype="Q4_K")),
    ]
    for field, edit in cases:
        bad = copy.deepcopy(meta)
        edit(bad)
        with pytest.raises(modelcache.ModelCacheError,
                           match=rf"entry 'k2': (tensors\['{name}'\])?{re.escape(field)}"):
            gpt2_cache.restore(bad, data, backend="reference", what="'k2'")


def test_cache_outside_the_browser_says_where_it_lives():
    with pytest.raises(RuntimeError, match="IndexedDB.*Pyodide worker"):
        run(modelcache.list_async())
