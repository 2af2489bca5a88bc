"""Reliability, second pass (issue 29): every path that brings values in shares one check.

Infinity and overflow are refused where NaN was (feeds, upload_params, load_state_dict,
checkpoints, GGUF, safetensors; `allow_nonfinite=True` lets them through); loaders check a
header against the tensors in the file before building anything from it and bound the work
a header can ask for; malformed metadata and inputs get a webgrad error naming the input,
the file and the field, not a bare TypeError/KeyError/ZeroDivisionError; a refused call
changes nothing (parameters, optimizer state and step byte for byte). Device-free: the
reference and torch executors. docs/reliability.md section 6 lists what each test holds.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict

import numpy as np
import pytest
import safetensors.numpy
import torch

import webgrad as wg
from webgrad import FeedError, Module, ops
from webgrad.io import checkpoint, gguf as wgg, safetensors as st
from webgrad.models import gpt2, sampling

import tiny_files as tf
from test_reliability import assert_nothing_changed, feed, state_of, trained_pair

CPU = ["reference", "torch"]


# ---------------------------------------------------------------- infinity and overflow

INF_X = np.ones((2, 4), np.float32)
INF_X[1, 3] = np.inf
BIG_X = np.ones((2, 4), np.float64)
BIG_X[0, 2] = 1e300                     # finite in float64, inf once cast to f32


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("x,where", [(INF_X, r"inf at index \[1, 3\]"),
                                     (-INF_X, r"-inf at index \[1, 3\]"),
                                     (BIG_X, r"inf at index \[0, 2\].*beyond f32's range"),
                                     (torch.from_numpy(BIG_X), r"inf at index \[0, 2\]")],
                         ids=["inf", "-inf", "f64_1e300", "torch_f64_1e300"])
def test_step_refuses_inf_and_overflow(backend, x, where):
    c, twin = trained_pair(backend)
    before = state_of(c)
    with pytest.raises(FeedError, match=r"^step\(\): input 'x': " + where) as e:
        c.step({"x": x, "idx": [0, 1]})
    assert "allow_nonfinite=True" in str(e.value)
    assert_nothing_changed(c, twin, before)


@pytest.mark.parametrize("backend", CPU)
def test_allow_nonfinite_lets_a_step_through(backend):
    """Asked for explicitly, an inf feed runs (here into NaN parameters, which is the point
    of refusing it by default)."""
    c, _ = trained_pair(backend)
    c.step({"x": INF_X, "idx": [0, 1]}, allow_nonfinite=True)
    assert not np.isfinite(c.download_params()["W"]).all()


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("how", ["upload_params", "load_state_dict"])
@pytest.mark.parametrize("value,words", [
    (np.full((4, 3), np.inf, np.float32), r"inf at index \[0, 0\]"),
    (np.full((4, 3), 1e39, np.float64), r"inf at index \[0, 0\].*beyond f32's range"),
    (torch.full((4, 3), float("nan"), dtype=torch.bfloat16), r"NaN at index \[0, 0\]")],
    ids=["inf", "f64_1e39", "bf16_nan"])
def test_uploads_refuse_nonfinite(backend, how, value, words):
    c, twin = trained_pair(backend)
    before = state_of(c)
    params = c.download_params()
    params["W"] = value
    if how == "load_state_dict":
        params = {k: torch.as_tensor(v) for k, v in params.items()}
    with pytest.raises(FeedError, match=words):
        getattr(c, how)(params)
    assert_nothing_changed(c, twin, before)
    getattr(c, how)(params, allow_nonfinite=True)     # asked for: written
    assert not np.isfinite(c.download_params()["W"]).all()


@pytest.mark.parametrize("backend", CPU)
def test_forward_program_uploads_refuse_nonfinite(backend):
    """A forward program writes its owner's parameters through the same check (it passed
    `partial` on and dropped allow_nonfinite)."""
    c, twin = trained_pair(backend)
    before = state_of(c)
    f = c.compile_forward(lambda m, inp: ops.tanh(inp["x"] @ m.W + m.b), inputs={"x": [2, 4]})
    bad = {"W": np.full((4, 3), np.inf, np.float32)}
    with pytest.raises(FeedError, match=r"inf at index \[0, 0\].*allow_nonfinite=True"):
        f.upload_params(bad, partial=True)
    assert_nothing_changed(c, twin, before)
    f.upload_params(bad, partial=True, allow_nonfinite=True)
    assert np.isinf(c.download_params()["W"]).all()


@pytest.mark.parametrize("backend", CPU)
def test_bf16_and_meta_torch_tensors(backend):
    """A bf16 tensor feeds and uploads as its f32 values (it raised 'unsupported ScalarType
    BFloat16' though load_state_dict converted it); a meta tensor has no values to give."""
    c, twin = trained_pair(backend)
    x16 = torch.randn(2, 4).to(torch.bfloat16)
    assert c.step({"x": x16, "idx": [0, 1]}) == twin.step({"x": x16.float().numpy(), "idx": [0, 1]})
    w16 = torch.randn(4, 3).to(torch.bfloat16)
    c.upload_params({"W": w16}, partial=True)
    np.testing.assert_array_equal(c.download_params()["W"], w16.float().numpy())
    before = state_of(c)
    with pytest.raises(FeedError, match=r"input 'x': a torch meta tensor .*materialise it"):
        c.step({"x": torch.empty(2, 4, device="meta"), "idx": [0, 1]})
    assert all(np.array_equal(v, before[k]) for k, v in state_of(c).items())


def test_bool_lists_are_not_f32_values():
    c, twin = trained_pair("reference")
    before = state_of(c)
    with pytest.raises(FeedError, match=r"input 'x': expects numbers \(f32\[2, 4\]\), got the "
                                        r"bool True at index \[0, 1\]"):
        c.step({"x": [[1.0, True, 0.0, 0.0], [0.0] * 4], "idx": [0, 1]})
    assert_nothing_changed(c, twin, before)


# ---------------------------------------------------------------- checkpoints

def _with(blob: bytes, name: str, value) -> bytes:
    tensors = dict(safetensors.numpy.load(blob))
    tensors[name] = np.asarray(value, tensors[name].dtype).reshape(tensors[name].shape)
    return safetensors.numpy.save(tensors, {"format": "pt"})


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("name,value,words", [
    ("W", np.full((4, 3), np.nan), r"tensor 'W': NaN at index \[0, 0\]"),
    ("opt/adam.m.W", np.full((4, 3), np.inf), r"tensor 'opt/adam.m.W': inf at index \[0, 0\]"),
    ("step", np.nan, r"tensor 'step': NaN"),
    ("step", 2.5, r"tensor 'step' is 2.5; the step counter is a whole number >= 0"),
    ("step", -1.0, r"tensor 'step' is -1.0")],
    ids=["nan_param", "inf_moment", "nan_step", "fractional_step", "negative_step"])
def test_checkpoint_values_are_checked(backend, name, value, words):
    c, twin = trained_pair(backend)
    blob = _with(c.save(), name, value)
    c.step(feed(5)), twin.step(feed(5))
    before = state_of(c)
    with pytest.raises(checkpoint.CheckpointError, match=r"^load\(\): checkpoint <bytes>: " + words):
        c.load(blob)
    assert_nothing_changed(c, twin, before)


@pytest.mark.parametrize("backend", CPU)
def test_checkpoint_nonfinite_loads_when_asked(backend):
    c, _ = trained_pair(backend)
    c.load(_with(c.save(), "W", np.full((4, 3), np.nan)), allow_nonfinite=True)
    assert np.isnan(c.download_params()["W"]).all()


def test_checkpoint_opened_in_text_mode(tmp_path):
    c, twin = trained_pair("reference")
    path = tmp_path / "c.safetensors"
    c.save(path)
    before = state_of(c)
    with open(path, encoding="latin-1") as f, pytest.raises(
            st.SafetensorsError, match=r"gave str, not bytes: open it in binary mode"):
        c.load(f)
    assert_nothing_changed(c, twin, before)


# ---------------------------------------------------------------- GGUF and GPT-2 metadata

def _gguf(tmp_path, **kw) -> bytes:
    return tf.gpt2_gguf(tmp_path / "m.gguf", **kw)


GGUF_META = [  # metadata override, the field and words of the error
    ({"gpt2.attention.head_count": ("UINT32", 0)}, "gpt2.attention.head_count", "whole number >= 1 .*, got 0"),
    ({"gpt2.attention.head_count": ("UINT32", 3)}, "gpt2.attention.head_count", "is 3, which does not divide"),
    ({"gpt2.block_count": ("STRING", "one")}, "gpt2.block_count", "whole number >= 1 .*got 'one'"),
    ({"gpt2.block_count": ("UINT32", 0)}, "gpt2.block_count", "whole number >= 1 .*, got 0"),
    ({"gpt2.block_count": ("FLOAT32", 1.7)}, "gpt2.block_count", "got 1.70"),
    ({"gpt2.block_count": ("UINT64", 10**7)}, "gpt2.block_count", "is 10000000 but the file holds blocks \\[0, 1\\]"),
    ({"gpt2.block_count": ("UINT64", 2**63)}, "gpt2.block_count", "is 9223372036854775808 but"),
    ({"gpt2.block_count": ("UINT32", 1)}, "gpt2.block_count", "is 1 but the file holds"),
    ({"gpt2.block_count": None}, "gpt2.block_count", "is missing"),
    ({"gpt2.context_length": ("UINT64", 2**31)}, "gpt2.context_length", "is 2147483648 but position_embd.weight has shape \\[8, 32\\]"),
    ({"gpt2.context_length": ("UINT64", 2**23)}, "gpt2.context_length", "is 8388608 but"),
    ({"gpt2.attention.layer_norm_epsilon": ("FLOAT32", float("nan"))}, "gpt2.attention.layer_norm_epsilon", "number in \\(0, 1\\), got nan"),
    ({"gpt2.attention.layer_norm_epsilon": ("STRING", "1e-5")}, "gpt2.attention.layer_norm_epsilon", "got '1e-5'"),
    ({"tokenizer.ggml.eos_token_id": ("UINT32", 99)}, "tokenizer.ggml.eos_token_id", "token id in \\[0, 16\\), got 99"),
]


@pytest.mark.parametrize("meta,field,words", GGUF_META, ids=[f"{m[1]}={list(m[0].values())[0]}" for m in GGUF_META])
def test_gguf_metadata_is_checked_against_the_file(tmp_path, meta, field, words):
    """Each refused in well under a second, before a model is built: block_count 10^7 ran for
    minutes and context_length 2^23 allocated 1 GiB on the torch executor before."""
    blob = _gguf(tmp_path, metadata=meta)
    t0 = time.monotonic()
    with pytest.raises(wgg.GGUFError, match=f"GGUF file <bytes>: metadata '{field}' (.* )?{words}"):
        gpt2.GPT2.from_gguf(blob, backend="torch")
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize("q8", [False, True], ids=["F32_weight", "Q8_0_scale"])
def test_gguf_nonfinite_weights_are_refused(tmp_path, q8):
    blob = bytearray(_gguf(tmp_path, q8=q8))
    t = wgg.load(bytes(blob)).tensors["blk.1.ffn_up.weight"]
    start = bytes(blob).index(t.data.tobytes())          # its blocks' place in the file
    if q8:
        blob[start:start + 2] = np.float16(np.nan).tobytes()     # the first block's scale
    else:
        blob[start:start + 4] = np.float32(np.nan).tobytes()
    with pytest.raises(wgg.GGUFError, match=r"tensor 'blk.1.ffn_up.weight': NaN at index \[0, 0\]"):
        gpt2.GPT2.from_gguf(bytes(blob), backend="reference")
    m = gpt2.GPT2.from_gguf(bytes(blob), backend="reference", allow_nonfinite=True)
    assert not np.isfinite(m.state_dict()["h.1.mlp.c_fc.weight"]).all()


SAFETENSORS_CONFIG = [  # recorded config JSON, words of the error
    ("{not json", "metadata 'webgrad.gpt2_config': not JSON"),
    (json.dumps({**asdict(tf.CFG), "n_layer": 10**6}), "n_layer=1000000 but the file holds 2 layers"),
    (json.dumps({**asdict(tf.CFG), "n_layer": 2**63}), "n_layer=9223372036854775808 but the file"),
    (json.dumps({**asdict(tf.CFG), "vocab_size": 10**12}), "needs 'wte.weight' of shape \\[1000000000000, 32\\]"),
    (json.dumps({**asdict(tf.CFG), "n_ctx": 2**31}), "needs 'wpe.weight' of shape \\[2147483648, 32\\]"),
    (json.dumps({**asdict(tf.CFG), "n_head": 0}), "n_head must be a whole number >= 1, got 0"),
    (json.dumps({**asdict(tf.CFG), "n_layer": 1.7}), "n_layer must be a whole number >= 1, got 1.7"),
    (json.dumps({**asdict(tf.CFG), "layer_norm_epsilon": "x"}), "layer_norm_epsilon must be a number"),
    (json.dumps({**asdict(tf.CFG), "colour": 1}), "must be an object of GPT2Config's fields"),
    (json.dumps([1, 2]), "must be an object of GPT2Config's fields"),
]


@pytest.mark.parametrize("config,words", SAFETENSORS_CONFIG, ids=[w[:30] for _, w in SAFETENSORS_CONFIG])
def test_safetensors_gpt2_config_is_checked_against_the_file(config, words):
    blob = tf.gpt2_safetensors(config_json=config)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=words) as e:
        gpt2.GPT2.from_safetensors(blob, backend="torch")
    assert "safetensors file <bytes>" in str(e.value)
    assert time.monotonic() - t0 < 2


def test_safetensors_nan_weight_is_refused():
    sd = tf.gpt2_state_dict()
    sd["h.0.ln_1.weight"][3] = np.nan
    with pytest.raises(FeedError, match=r"'h.0.ln_1.weight': NaN at index 3"):
        gpt2.GPT2.from_safetensors(tf.gpt2_safetensors(sd=sd), backend="reference")


# ---------------------------------------------------------------- safetensors headers

def _header_file(header: dict, data: bytes = b"") -> bytes:
    js = json.dumps(header).encode()
    return len(js).to_bytes(8, "little") + js + data


def test_safetensors_dtype_of_the_wrong_type():
    blob = _header_file({"a": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, bytes(4))
    with pytest.raises(st.SafetensorsError, match=r"tensor 'a'.dtype: unknown dtype \['F32'\]"):
        st.load(blob)


def test_safetensors_tensor_count_is_bounded():
    """The largest header the format allows (1.4 M zero-size tensors) took 22-31 s and 1.5 GB;
    over MAX_TENSORS names it is refused by a byte count before the JSON is parsed."""
    n = st.MAX_TENSORS + 1
    blob = _header_file({f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
                         for i in range(n)})
    t0 = time.monotonic()
    with pytest.raises(st.SafetensorsError, match=f"names more than {st.MAX_TENSORS} tensors"):
        st.load(blob)
    assert time.monotonic() - t0 < 1
    ok = _header_file({f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
                       for i in range(1000)})
    assert len(st.load(ok)) == 1000


def test_stored_tensor_copies_are_copies():
    """np.array(t, copy=True) was a view of the file's buffer, writable (and writing through)
    when the buffer is a bytearray; np.asarray(t) stays a zero-copy view, read-only."""
    buf = bytearray(st.dumps({"w": np.arange(4, dtype=np.float32)}))
    t = st.load(buf)["w"]
    a = np.array(t, copy=True)
    a[0] = 99
    assert t.numpy()[0] == 0 and not np.shares_memory(a, t.numpy())
    v = np.asarray(t)
    assert not v.flags.writeable
    with pytest.raises(ValueError):
        v[0] = 5
    assert bytes(buf) == st.dumps({"w": np.arange(4, dtype=np.float32)})


# ---------------------------------------------------------------- arguments

class Tiny(Module):
    def __init__(self):
        super().__init__()
        self.W = self.param([4, 3], init="kaiming")
        self.E = self.param([0, 3], init="kaiming")     # fan-in 0: ZeroDivisionError before


def _tiny_loss(m, inp):
    return ops.mean_all(inp["x"] @ m.W)


@pytest.mark.parametrize("seed", ["abc", None, 1.9, True])
def test_seed_must_be_an_int(seed):
    with pytest.raises(TypeError, match=f"compile_module: seed must be an int .*got {type(seed).__name__}"):
        wg.compile_module(Tiny, _tiny_loss, inputs={"x": [2, 4]}, seed=seed)
    with pytest.raises(TypeError, match="compile_forward: seed must be an int"):
        wg.compile_forward(Tiny, _tiny_loss, inputs={"x": [2, 4]}, seed=seed)


def test_zero_size_kaiming_parameter_and_numpy_seed():
    c = wg.compile_module(Tiny, _tiny_loss, inputs={"x": [2, 4]}, seed=np.int64(3))
    same = wg.compile_module(Tiny, _tiny_loss, inputs={"x": [2, 4]}, seed=3)
    p = c.download_params()
    assert p["E"].shape == (0, 3)
    np.testing.assert_array_equal(p["W"], same.download_params()["W"])


@pytest.mark.parametrize("top_k", [True, 0, 1.0, "2"])
def test_top_k_must_be_a_positive_int(top_k):
    with pytest.raises(ValueError, match="top_k must be None or an int >= 1"):
        sampling.check_params(1.0, top_k, None)
