"""Fuzzing the paths that bring values in (issue 29): valid safetensors and GGUF GPT-2 files,
checkpoints and feeds, mutated by hypothesis; each case must either raise a documented
webgrad error with a message (FeedError, SafetensorsError, GGUFError, CheckpointError: never
a bare TypeError, KeyError, ZeroDivisionError, IndexError, struct.error, UnicodeDecodeError)
and change nothing, or give the reference's result: the tensors the `safetensors` and `gguf`
packages read from the same bytes, the step of a twin module fed the value numpy converts.

Bounded: 60-100 examples a test, each under a deadline, in-process on the reference
executor; the file runs in well under 40 s. The parsers' own byte fuzzers are in
tests/test_safetensors.py and tests/test_gguf.py.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import asdict

import numpy as np
import pytest
import gguf  # noqa: F401  (imported here, not inside the first timed example)
import safetensors.numpy
import torch
from hypothesis import HealthCheck, event, given, settings, strategies as hst

import webgrad as wg
from webgrad import FeedError
from webgrad.io import checkpoint, gguf as wgg, safetensors as st
from webgrad.models import gpt2

import tiny_files as tf
from test_reliability import compile_net, feed, state_of

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"),   # numpy's casts of mutants
              pytest.mark.timeout(120)]        # a hard bound per test, beside each case's deadline
WEBGRAD_ERRORS = (FeedError, st.SafetensorsError, wgg.GGUFError, checkpoint.CheckpointError)
FUZZ = settings(max_examples=100, deadline=3000, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def refused(call) -> bool:
    """True when call() raised a webgrad error with a message; False when it returned.
    Anything else (a bare TypeError, KeyError, ...) propagates and fails the test."""
    try:
        call()
    except WEBGRAD_ERRORS as e:
        assert str(e), type(e)
        event(f"refused: {type(e).__name__}")
        return True
    event("accepted")
    return False


def json_values():
    return hst.one_of(hst.integers(-3, 40), hst.integers(-2**70, 2**70), hst.floats(),
                      hst.text(max_size=4), hst.booleans(), hst.none(),
                      hst.lists(hst.integers(0, 3), max_size=2))


def byte_mutations(blob: bytes, draw) -> bytes:
    b = bytearray(blob)
    for _ in range(draw(hst.integers(1, 3))):
        if not b:
            break
        i = draw(hst.integers(0, len(b) - 1))
        kind = draw(hst.sampled_from(["byte", "u32", "u64", "truncate", "insert"]))
        if kind == "byte":
            b[i] = draw(hst.integers(0, 255))
        elif kind == "u32":
            b[i:i + 4] = struct.pack("<I", draw(hst.integers(0, 2**32 - 1)))
        elif kind == "u64":
            b[i:i + 8] = struct.pack("<Q", draw(hst.one_of(hst.integers(0, 64),
                                                            hst.integers(0, 2**64 - 1))))
        elif kind == "truncate":
            del b[i:]
        else:
            b[i:i] = draw(hst.binary(min_size=1, max_size=8))
    return bytes(b)


# ---------------------------------------------------------------- safetensors GPT-2

def _same_weights(m, tensors: dict):
    """m's weights equal the safetensors package's reading of the file (as f32)."""
    got = m.state_dict()
    for n, v in got.items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(tensors[n], np.float32), err_msg=n)


@hst.composite
def safetensors_gpt2(draw):
    fields = asdict(tf.CFG)
    how = draw(hst.sampled_from(["config", "config", "bytes", "tensor"]))
    sd = tf.gpt2_state_dict()
    config = json.dumps(fields)
    if how == "config":
        for _ in range(draw(hst.integers(1, 2))):
            fields[draw(hst.sampled_from(sorted(fields) + ["extra"]))] = draw(json_values())
        config = json.dumps(fields)
    elif how == "tensor":
        name = draw(hst.sampled_from(sorted(sd)))
        kind = draw(hst.sampled_from(["value", "shape", "dtype", "drop"]))
        if kind == "value":
            sd[name].flat[draw(hst.integers(0, sd[name].size - 1))] = draw(hst.floats(width=32))
        elif kind == "shape":
            sd[name] = sd[name].reshape(-1)
        elif kind == "dtype":
            sd[name] = sd[name].astype(draw(hst.sampled_from([np.float16, np.float64, np.int32])))
        else:
            del sd[name]
    blob = tf.gpt2_safetensors(config_json=config, sd=sd)
    return byte_mutations(blob, draw) if how == "bytes" else blob


@FUZZ
@given(safetensors_gpt2())
def test_fuzz_gpt2_from_safetensors(blob):
    m = None

    def load():
        nonlocal m
        m = gpt2.GPT2.from_safetensors(blob, backend="reference")
    if not refused(load):
        _same_weights(m, dict(safetensors.numpy.load(blob)))


# ---------------------------------------------------------------- GGUF GPT-2

VALUE_TYPES = ["UINT32", "INT32", "UINT64", "FLOAT32", "STRING", "BOOL"]


def _typed(vtype, draw):
    if vtype == "STRING":
        return draw(hst.text(max_size=4))
    if vtype == "BOOL":
        return draw(hst.booleans())
    if vtype == "FLOAT32":
        return draw(hst.floats(width=32))
    lo, hi = {"UINT32": (0, 2**32 - 1), "INT32": (-2**31, 2**31 - 1), "UINT64": (0, 2**64 - 1)}[vtype]
    return draw(hst.one_of(hst.integers(max(lo, -2), 40), hst.integers(lo, hi)))


@hst.composite
def gguf_gpt2(draw):
    keys = sorted(tf.gpt2_metadata()) + ["tokenizer.ggml.eos_token_id"]
    meta = {}
    for _ in range(draw(hst.integers(0, 2))):
        vtype = draw(hst.sampled_from(VALUE_TYPES))
        meta[draw(hst.sampled_from(keys))] = draw(hst.sampled_from([None, (vtype, _typed(vtype, draw))]))
    return meta, draw(hst.booleans()), draw(hst.booleans())


def _gguf_reference(path) -> dict[str, np.ndarray]:
    """The `gguf` package's reading: transformers name -> f32 values in transformers' layout."""
    import gguf
    r = gguf.GGUFReader(str(path))
    names = {tf.gguf_name(hf): hf for hf in gpt2.param_shapes(tf.CFG)}
    out = {}
    for t in r.tensors:
        v = gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
        hf = names.get(t.name, t.name)
        out[hf] = v.T if hf.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")) else v
    return out


@settings(FUZZ, max_examples=60)
@given(gguf_gpt2(), hst.data())
def test_fuzz_gpt2_from_gguf(tmp_path_factory, case, data):
    meta, q8, mutate = case
    path = tmp_path_factory.mktemp("g") / "m.gguf"
    blob = tf.gpt2_gguf(path, metadata=meta, q8=q8)
    if mutate:
        blob = byte_mutations(blob, data.draw)
        path.write_bytes(blob)
    m = None

    def load():
        nonlocal m
        m = gpt2.GPT2.from_gguf(blob, backend="reference", keep_quantized=False)
    if refused(load):
        return
    ref = _gguf_reference(path)
    for n, v in m.state_dict().items():
        np.testing.assert_array_equal(np.asarray(v), ref[n], err_msg=n)
    md = wgg.load(blob).metadata
    assert m.cfg.n_layer == md["gpt2.block_count"] and m.cfg.n_ctx == md["gpt2.context_length"]
    assert all(math.isfinite(np.asarray(v).sum()) for v in ref.values())


# ---------------------------------------------------------------- checkpoints

@pytest.fixture(scope="module")
def pair():
    c, twin = compile_net("reference"), compile_net("reference")
    for k in range(2):
        assert c.step(feed(k)) == twin.step(feed(k))
    return c, twin


@hst.composite
def checkpoints(draw, good: bytes):
    how = draw(hst.sampled_from(["bytes", "tensor", "tensor"]))
    if how == "bytes":
        return byte_mutations(good, draw)
    tensors = dict(safetensors.numpy.load(good))
    name = draw(hst.sampled_from(sorted(tensors)))
    t = tensors[name]
    kind = draw(hst.sampled_from(["value", "f64", "dtype", "shape", "drop", "extra"]))
    if kind == "value":
        t = t.copy()
        t.flat[draw(hst.integers(0, max(t.size - 1, 0)))] = draw(hst.floats(width=32))
    elif kind == "f64":                    # finite float64 values, some beyond f32's range
        t = t.astype(np.float64)
        t.flat[0] = draw(hst.floats(allow_nan=False, allow_infinity=False))
    elif kind == "dtype":
        t = t.astype(draw(hst.sampled_from([np.float16, np.int32, np.int64, np.uint8, np.bool_])))
    elif kind == "shape":
        t = np.zeros(draw(hst.lists(hst.integers(0, 5), max_size=3)), t.dtype)
    if kind == "drop":
        del tensors[name]
    elif kind == "extra":
        tensors[name + ".x"] = t
    else:
        tensors[name] = t
    return safetensors.numpy.save(tensors, {"format": "pt"})


@FUZZ
@given(hst.data())
def test_fuzz_checkpoint_load(pair, data):
    """A refused load leaves every persistent value byte for byte; an accepted one holds the
    file's values (as the safetensors package reads them, cast to f32), and then steps as a
    twin loaded with the same values."""
    c, twin = pair
    good = twin.save()
    blob = data.draw(checkpoints(good))
    before = state_of(c)
    if refused(lambda: c.load(blob)):
        after = state_of(c)
        assert all(after[k].tobytes() == before[k].tobytes() for k in before)
        return
    theirs = dict(safetensors.numpy.load(blob))
    now = state_of(c)
    for k, v in now.items():
        if k in theirs:
            np.testing.assert_array_equal(v, np.asarray(theirs[k], np.float32).reshape(v.shape), err_msg=k)
    c.load(good)                                       # back in step with the twin


# ---------------------------------------------------------------- feeds

def _floats():
    return hst.one_of(hst.floats(-4, 4, width=32), hst.floats(width=64),
                      hst.sampled_from([math.nan, math.inf, -math.inf, 1e39, -3e300, 0.0]))


@hst.composite
def feed_values(draw):
    """A value for input 'x' (f32[2, 4]) in one of the forms users pass."""
    shape = draw(hst.sampled_from([(2, 4), (2, 4), (8,), (4, 2), (2, 5), ()]))
    n = int(np.prod(shape))
    vals = [draw(hst.one_of(_floats(), hst.integers(-5, 5))) for _ in range(n)]
    form = draw(hst.sampled_from(["numpy", "list", "torch", "memoryview", "bytes", "odd_list"]))
    dtype = draw(hst.sampled_from(["float16", "float32", "float64", "int32", "int64", "bool"]))
    with np.errstate(all="ignore"):
        a = np.array(vals, np.float64).astype(dtype).reshape(shape)
    if form == "numpy":
        return a
    if form == "list":
        return a.tolist()
    if form == "torch":
        t = torch.from_numpy(a.copy())
        return t.to(torch.bfloat16) if draw(hst.booleans()) and a.dtype.kind == "f" else t
    if form == "memoryview":
        return memoryview(np.ascontiguousarray(a))
    if form == "bytes":
        return np.asarray(vals, np.float32).tobytes()
    lst = a.tolist() if shape else [a.item()]
    leaf = draw(hst.sampled_from([True, None, "1.0", [1.0], 2**40]))
    flat = lst if not shape or len(shape) == 1 else lst[0]
    flat[draw(hst.integers(0, len(flat) - 1))] = leaf
    return lst


def _reference(v):
    """What the value means as f32[2, 4] (numpy's and torch's conversion), or None where it
    must be refused: not 8 finite f32 numbers, an integer or bool buffer, an array of
    another shape (lists, memoryviews and bytes may also be flat)."""
    if isinstance(v, bytes):
        a = np.frombuffer(v, np.float32)
    elif isinstance(v, torch.Tensor):
        if not v.dtype.is_floating_point:
            return None
        a = v.float().numpy()
    else:
        try:
            a = np.asarray(v)
        except ValueError:                        # ragged
            return None
        if a.dtype.kind not in "fiu" or (a.dtype.kind in "iu" and not isinstance(v, list)):
            return None                           # integer *buffers* are refused for f32
        if isinstance(v, list) and any(type(x) is bool for x in _leaves(v)):
            return None
        with np.errstate(all="ignore"):
            a = a.astype(np.float32)
    flat_ok = isinstance(v, (list, memoryview, bytes))
    if a.size != 8 or (a.shape != (2, 4) and not (flat_ok and a.ndim == 1)) or not np.isfinite(a).all():
        return None
    return a.reshape(2, 4)


def _leaves(v):
    return [y for x in v for y in _leaves(x)] if isinstance(v, list) else [v]


@FUZZ
@given(feed_values())
def test_fuzz_step_feeds(pair, x):
    """step() either refuses the value (FeedError, nothing changed) or trains exactly as a
    twin fed numpy's f32 conversion of it; never a bare error."""
    c, twin = pair
    before = state_of(c)
    want = _reference(x)
    loss = None

    def step():
        nonlocal loss
        loss = c.step({"x": x, "idx": [0, 1]})
    if refused(step):
        after = state_of(c)
        assert all(after[k].tobytes() == before[k].tobytes() for k in before)
        assert want is None, f"refused a value numpy reads as {want}"
        return
    assert want is not None, f"accepted {x!r}"
    assert loss == twin.step({"x": want, "idx": [0, 1]})
    after, theirs = state_of(c), state_of(twin)
    assert all(after[k].tobytes() == theirs[k].tobytes() for k in after)
