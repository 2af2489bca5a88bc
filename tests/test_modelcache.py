"""webgrad.io.modelcache's GPU image, here in CPython (the IndexedDB half is tested in the
browser, tests/browser/test_modelcache_page.py): an image restores to a model with the same logits
bit for bit, whatever the token table's split on either side; a GGUF model's image holds the
weights as the `gguf` package dequantizes them; a damaged image is refused naming the field.
"""
from __future__ import annotations

import asyncio
import copy
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from webgrad.io import modelcache
from webgrad.models import gpt2

CFG = gpt2.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_ctx=16, vocab_size=50)
IDS = [3, 1, 4, 1, 5, 9, 2, 6, 49]


def run(coro):
    """asyncio.run on a thread of its own (a browser test's Playwright may hold this one's loop)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def image(m):
    meta, parts = run(modelcache.image_async(m))
    return meta, b"".join(bytes(p) for p in parts)


def test_image_round_trip_is_exact():
    m = gpt2.GPT2.init_random(CFG, seed=4, backend="reference")
    meta, data = image(m)
    assert meta["nbytes"] == len(data) == 4 * sum(np.prod(s) for s in gpt2.param_shapes(CFG).values())
    seen = []
    back = modelcache.restore(meta, data, backend="reference", progress=lambda d, t: seen.append((d, t)))
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
    back = modelcache.restore(meta, data, backend="reference")
    assert back.wte_chunks == 1
    want = m.state_dict()
    assert all(np.array_equal(np.asarray(v), np.asarray(want[k])) for k, v in back.state_dict().items())
    np.testing.assert_allclose(np.asarray(back.forward(IDS)), np.asarray(m.forward(IDS)), atol=1e-5)


def gguf_of(path, m, *, qtype=None):
    """What llama.cpp's converter writes for GPT2 `m` (gguf's own names and writer; Conv1D
    weights [out, in]; no output.weight: tied), 2-D weights quantized to qtype. Returns the
    path and each stored tensor as gguf dequantizes it."""
    import gguf
    cfg = m.cfg
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, cfg.n_layer)
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_context_length(cfg.n_ctx); w.add_embedding_length(cfg.n_embd)
    w.add_feed_forward_length(4 * cfg.n_embd); w.add_block_count(cfg.n_layer)
    w.add_head_count(cfg.n_head); w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    stored = {}
    for k, v in m.state_dict().items():
        base, _, suffix = ("transformer." + k).rpartition(".")
        name = f"{name_map.get_name(base)}.{suffix}"
        v = np.asarray(v, np.float32)
        if k.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            v = np.ascontiguousarray(v.T)
        if qtype is not None and v.ndim == 2 and k.startswith("h."):
            q = gguf.quants.quantize(v, qtype)
            stored[name] = gguf.quants.dequantize(q, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
        else:
            stored[name] = v
            w.add_tensor(name, v)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return path, stored


def test_gguf_image_keeps_the_blocks(tmp_path):
    """A GGUF model's quantized weights are imaged as the file's own blocks (read here by the
    gguf package) and restore quantized, with the same logits; its f32 tensors hold gguf's
    values. keep_quantized=False models image as f32, gguf's dequantization."""
    gguf = pytest.importorskip("gguf")
    src = gpt2.GPT2.init_random(gpt2.GPT2Config(2, 2, 64, 16, 50), seed=7, backend="reference")
    path, stored = gguf_of(tmp_path / "m.gguf", src, qtype=gguf.GGMLQuantizationType.Q8_0)
    raw = {t.name: bytes(t.data.tobytes()) for t in gguf.GGUFReader(str(path)).tensors}
    m, kind = run(modelcache.parse_async(path.read_bytes(), "reference"))
    assert kind == "gguf" and "h.1.mlp.c_fc.weight" in m.quant_full
    meta, data = image(m)
    t = next(t for t in meta["tensors"] if t["name"] == "h.1.mlp.c_fc.weight")
    assert (t["dtype"], t["shape"], t["transposed"]) == ("Q8_0", [256, 64], True)
    assert data[t["offset"]:t["offset"] + t["nbytes"]] == raw["blk.1.ffn_up.weight"]
    b = next(t for t in meta["tensors"] if t["name"] == "h.1.ln_1.bias")
    got = np.frombuffer(data[b["offset"]:b["offset"] + b["nbytes"]], np.float32)
    assert b["dtype"] == "f32" and np.array_equal(got, stored["blk.1.attn_norm.bias"])
    back = modelcache.restore(meta, data, backend="reference")
    assert back.quant_full == m.quant_full
    assert np.array_equal(np.asarray(back.forward(IDS)), np.asarray(m.forward(IDS)))
    # dequantized at load: the image is f32, gguf's values, [in, out]
    f32 = gpt2.GPT2.from_gguf(path, backend="reference", keep_quantized=False)
    meta, data = image(f32)
    t = next(t for t in meta["tensors"] if t["name"] == "h.1.mlp.c_fc.weight")
    got = np.frombuffer(data[t["offset"]:t["offset"] + t["nbytes"]], np.float32).reshape(t["shape"])
    assert t["dtype"] == "f32" and np.array_equal(got, stored["blk.1.ffn_up.weight"].T)
    assert not np.array_equal(got, np.asarray(src.state_dict()["h.1.mlp.c_fc.weight"]))


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
            modelcache.restore(bad, blob, backend="reference", what="'k1'")


def test_cache_outside_the_browser_says_where_it_lives():
    with pytest.raises(RuntimeError, match="IndexedDB.*Pyodide worker"):
        run(modelcache.list_async())


def test_damaged_quantized_entries_are_refused(tmp_path):
    gguf = pytest.importorskip("gguf")
    src = gpt2.GPT2.init_random(gpt2.GPT2Config(1, 2, 64, 16, 50), seed=8, backend="reference")
    path, _ = gguf_of(tmp_path / "m.gguf", src, qtype=gguf.GGMLQuantizationType.Q4_0)
    meta, data = image(run(modelcache.parse_async(path.read_bytes(), "reference"))[0])
    name = "h.0.mlp.c_fc.weight"
    for field, edit in (("dtype", {"dtype": "Q5_0"}), ("nbytes", {"dtype": "Q8_0"}),
                        ("shape", {"shape": [64, 256]}), ("shape", {"shape": [256, 60]}),
                        ("shape", {"transposed": False})):
        bad = copy.deepcopy(meta)
        next(t for t in bad["tensors"] if t["name"] == name).update(edit)
        with pytest.raises(modelcache.ModelCacheError, match=rf"\['{name}'\]\.{field}"):
            modelcache.restore(bad, data, backend="reference")
