"""webgrad.io.safetensors against the safetensors library and torch, both ways, and on
malformed files (a table of hand-made faults plus a hypothesis fuzzer mutating valid files).
"""
from __future__ import annotations

import io
import json
import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as hst

import safetensors
import safetensors.numpy
import safetensors.torch
from webgrad import HostArray
from webgrad.io import safetensors as st

TORCH_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint64, torch.uint32, torch.uint16,
                torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]


def sample(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    lo, hi = (0, 255) if not dtype.is_signed else (-100, 100)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def theirs_dict():
    shapes = [(3, 5), (7,), (), (2, 0, 3), (4, 1, 2)]
    return {f"t.{i}.{str(dt)[6:]}": sample(dt, shapes[i % len(shapes)], i)
            for i, dt in enumerate(TORCH_DTYPES)}


def test_theirs_load_in_webgrad(tmp_path):
    want = theirs_dict()
    path = tmp_path / "m.safetensors"
    safetensors.torch.save_file(want, str(path), metadata={"format": "pt", "k": "v"})
    for src in (path, str(path), path.read_bytes(), bytearray(path.read_bytes()),
                memoryview(path.read_bytes()), open(path, "rb")):
        got = st.load(src)
        assert got.metadata == {"format": "pt", "k": "v"}
        assert set(got) == set(want)
        for k, t in want.items():
            g = got[k]
            assert g.shape == tuple(t.shape)
            assert g.data.tobytes() == t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            host = g.to_host()
            assert host.shape == tuple(t.shape)
            ref = t.float() if (t.dtype.is_floating_point) else t.int()
            assert torch.equal(torch.tensor(host.tolist(), dtype=ref.dtype).reshape(t.shape), ref)
            assert torch.equal(torch.from_numpy(np.array(g.numpy())).to(ref.dtype), ref)


def test_webgrad_files_load_in_theirs(tmp_path):
    want = theirs_dict()
    ours = dict(want)
    ours["host_f32"] = HostArray("f32", [1.5, -2.0, 3.25, 0.0, 7.0, 8.0], shape=(2, 3))
    ours["host_i32"] = HostArray("i32", [1, -2, 3], shape=(3,))
    ours["np_f16"] = np.arange(6, dtype=np.float16).reshape(3, 2)
    ours["raw"] = ("I16", (2,), struct.pack("<2h", -5, 9))
    path = tmp_path / "ours.safetensors"
    st.save(ours, path, metadata={"format": "pt"})
    back = safetensors.torch.load_file(str(path))
    for k, t in want.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k], t), k
    assert back["host_f32"].tolist() == [[1.5, -2.0, 3.25], [0.0, 7.0, 8.0]]
    assert back["host_i32"].dtype == torch.int32 and back["host_i32"].tolist() == [1, -2, 3]
    assert back["np_f16"].dtype == torch.float16 and back["np_f16"].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert back["raw"].tolist() == [-5, 9]
    with safetensors.safe_open(str(path), "pt") as f:
        assert f.metadata() == {"format": "pt"}
    # a file object as destination, and the library's numpy reader
    buf = io.BytesIO()
    st.save({"x": np.eye(3, dtype=np.float32)}, buf)
    assert np.array_equal(safetensors.numpy.load(buf.getvalue())["x"], np.eye(3))


def test_same_bytes_as_the_library():
    """Same layout rules (widest dtype first, then name; header padded to 8): same bytes."""
    want = theirs_dict()
    assert st.dumps(want, metadata={"a": "b"}) == safetensors.torch.save(want, metadata={"a": "b"})
    assert st.dumps(st.load(safetensors.torch.save(want))) == safetensors.torch.save(want)


def test_to_host_int_range():
    blob = safetensors.torch.save({"big": torch.tensor([2**40, 1], dtype=torch.int64)})
    with pytest.raises(st.SafetensorsError, match="outside the i32 range"):
        st.load(blob)["big"].to_host()


def test_save_errors():
    with pytest.raises(st.SafetensorsError, match="tensor 'x'.*12 bytes for F32\\[2, 2\\]"):
        st.dumps({"x": ("F32", (2, 2), bytes(12))})
    with pytest.raises(st.SafetensorsError, match="unknown dtype 'F12'"):
        st.dumps({"x": ("F12", (1,), bytes(2))})
    with pytest.raises(st.SafetensorsError, match="cannot save a str"):
        st.dumps({"x": "hello"})
    with pytest.raises(st.SafetensorsError, match="metadata must be a dict of str -> str"):
        st.dumps({}, metadata={"a": 1})


# ---------------------------------------------------------------------------- malformed files

def file_of(header: dict, data: bytes = b"", *, length: int | None = None) -> bytes:
    js = json.dumps(header).encode()
    return struct.pack("<Q", len(js) if length is None else length) + js + data


GOOD_HEADER = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
               "b": {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]}}


def with_entry(name, **changes):
    h = json.loads(json.dumps(GOOD_HEADER))
    h[name].update(changes)
    return h


MALFORMED = [
    (b"\x05\x00", "header length: the file has 2 bytes"),
    (struct.pack("<Q", 2**63) + b"{}", "header length: 9223372036854775808 bytes is over"),
    (b"PK\x03\x04 a zip file", "bytes is over the 100000000-byte limit: not a safetensors file\\? "
     "\\(it starts with b'PK\\\\x03\\\\x04 a z'\\)"),
    (struct.pack("<Q", 50) + b"{}", "header length: says 50 bytes of JSON but only 2 follow"),
    (struct.pack("<Q", 4) + b"[1] ", "header: the JSON header must start with '{'"),
    (struct.pack("<Q", 5) + b"{\"a\":", "header: invalid JSON"),
    (struct.pack("<Q", 3) + b"{\xff}", "header: not UTF-8"),
    (struct.pack("<Q", 17) + b'{"a":1,"a":2}    ', "header: name 'a' appears twice"),
    (file_of({"__metadata__": {"k": 1}}), "__metadata__: must be an object of string values"),
    (file_of({"a": [1]}), "tensor 'a': must be an object"),
    (file_of({"a": {"dtype": "F32", "shape": [0]}}), "tensor 'a': needs exactly dtype, shape"),
    (file_of(with_entry("a", dtype="F12"), bytes(16)), "tensor 'a'.dtype: unknown dtype 'F12'"),
    (file_of(with_entry("a", shape=[-2]), bytes(16)), "tensor 'a'.shape: must be a list"),
    (file_of(with_entry("a", shape=[2.0]), bytes(16)), "tensor 'a'.shape: must be a list"),
    (file_of(with_entry("a", data_offsets=[8]), bytes(16)), "tensor 'a'.data_offsets: must be"),
    (file_of(with_entry("a", data_offsets=[8, 0]), bytes(16)), "begin 8 is after end 0"),
    (file_of(GOOD_HEADER, bytes(12)), "tensor 'b'.data_offsets: end 16 is beyond the data buffer"),
    (file_of(with_entry("a", shape=[2**40, 2**40]), bytes(16)),
     "tensor 'a'.data_offsets: \\[0, 8\\] holds 8 bytes but F32\\[1099511627776, 1099511627776\\]"),
    (file_of(with_entry("a", shape=[10**30], data_offsets=[0, 4 * 10**30]), bytes(16)),
     r"shape: must be a list of integers in \[0, 2\*\*63\)"),
    (file_of(with_entry("b", data_offsets=[4, 12]), bytes(16)), "tensor 'b'.data_offsets: \\[4, 12\\] overlaps tensor 'a'"),
    (file_of(with_entry("a", data_offsets=[0, 8]) | {"b": {"dtype": "I64", "shape": [1],
             "data_offsets": [12, 20]}}, bytes(20)), "starts at 12, leaving bytes 8..12 unused"),
    (file_of(GOOD_HEADER, bytes(20)), "data buffer: 20 bytes but the tensors cover only 16"),
    (struct.pack("<Q", 10) + b"{\"a\":1" + b"9" * 4, "header: invalid JSON"),
]


@pytest.mark.parametrize("blob,msg", MALFORMED, ids=[m[:40] for _, m in MALFORMED])
def test_malformed(blob, msg):
    with pytest.raises(st.SafetensorsError, match=msg) as e:
        st.load(blob)
    assert str(e.value).startswith("safetensors file <bytes>: ")
    # the library agrees these are broken
    with pytest.raises(Exception):
        safetensors.deserialize(blob)


def test_error_names_the_path(tmp_path):
    p = tmp_path / "broken.safetensors"
    p.write_bytes(file_of(GOOD_HEADER, bytes(12)))
    with pytest.raises(st.SafetensorsError, match="broken.safetensors'.*tensor 'b'"):
        st.load(p)


def test_huge_int_in_header():
    blob = struct.pack("<Q", 6000) + b'{"a":' + b"9" * 5000 + b"}" + b" " * 994
    with pytest.raises(st.SafetensorsError, match="header: invalid JSON"):
        st.load(blob)


VALID = safetensors.torch.save({"w": torch.randn(3, 4), "idx": torch.arange(6, dtype=torch.int64),
                                "h": torch.randn(5).half(), "e": torch.zeros(0)},
                               metadata={"format": "pt"})


@hst.composite
def mutated(draw):
    blob = bytearray(VALID)
    for _ in range(draw(hst.integers(1, 4))):
        kind = draw(hst.sampled_from(["flip", "truncate", "insert", "length", "number", "delete"]))
        if kind == "flip" and blob:
            i = draw(hst.integers(0, len(blob) - 1))
            blob[i] = draw(hst.integers(0, 255))
        elif kind == "truncate":
            del blob[draw(hst.integers(0, len(blob))):]
        elif kind == "insert":
            i = draw(hst.integers(0, len(blob)))
            blob[i:i] = draw(hst.binary(min_size=1, max_size=8))
        elif kind == "delete" and blob:
            i = draw(hst.integers(0, len(blob) - 1))
            del blob[i:i + draw(hst.integers(1, 8))]
        elif kind == "length" and len(blob) >= 8:
            blob[:8] = struct.pack("<Q", draw(hst.one_of(hst.integers(0, 400),
                                                          hst.integers(0, 2**64 - 1))))
        elif kind == "number":
            # rewrite one integer of the JSON header (shape or offset) to something else
            n = int.from_bytes(blob[:8], "little") if len(blob) >= 8 else 0
            digits = [i for i in range(8, min(8 + n, len(blob))) if chr(blob[i]).isdigit()]
            if digits:
                i = draw(hst.sampled_from(digits))
                blob[i] = ord(str(draw(hst.integers(0, 9))))
    return bytes(blob)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fuzz_mutated_files(blob):
    """Every mutation either loads to in-bounds tensors the library reads identically, or
    raises SafetensorsError (nothing else: no IndexError, MemoryError, struct.error...)."""
    try:
        got = st.load(blob)
    except st.SafetensorsError:
        return
    theirs = dict(safetensors.deserialize(blob))
    assert set(theirs) == set(got)
    for k, t in got.items():
        assert t.data.nbytes == len(theirs[k]["data"])
        assert t.data.tobytes() == bytes(theirs[k]["data"])
        assert list(t.shape) == theirs[k]["shape"]


def test_bf16_widens_alike_with_and_without_numpy(tmp_path, monkeypatch):
    from safetensors.torch import save_file
    import webgrad.io.safetensors as mod
    x = torch.randn(33, 7).to(torch.bfloat16)
    x[0, :3] = torch.tensor([float("inf"), -0.0, 1e-40])        # inf, a signed zero, a subnormal
    save_file({"x": x}, str(tmp_path / "b.safetensors"))
    want = x.float().numpy().tobytes()
    f = mod.load(str(tmp_path / "b.safetensors"))
    assert f["x"].to_host().tobytes() == want
    monkeypatch.setattr(mod, "numpy_or_none", lambda: None)
    assert f["x"].to_host().tobytes() == want
