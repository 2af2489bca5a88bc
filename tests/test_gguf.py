"""webgrad.io.gguf against the `gguf` package: files written by its GGUFWriter (metadata of
every value type, tensors in F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 from its quantizers, the k-quants
(Q4_K, Q5_K, Q6_K) from random blocks, as gguf has no k-quant quantizer), dequantization bit-equal to gguf.quants.dequantize on
both of our paths (numpy and pure Python), GPT-2 in llama.cpp's layout (models/gpt2_gguf.py; names from gguf's own
tensor map) back to transformers' state dict, and malformed files: every truncation of a
valid file, a table of faults, and a hypothesis fuzzer.
"""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as hst

import gguf
from gguf import GGMLQuantizationType as QT
from webgrad import quants
from webgrad.io import gguf as wgg
from webgrad.models.gpt2_gguf import state_dict as gpt2_state_dict

RNG = np.random.default_rng(0)


def write(tmp_path, build, arch="test", name="m.gguf"):
    path = tmp_path / name
    w = gguf.GGUFWriter(str(path), arch)
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# byte offsets of each quant format's f16 fields in a block (the rest of a block is any
# bytes): random blocks for every format of webgrad.quants.FORMATS
F16_FIELDS = {QT.Q8_0: (0,), QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2),
              QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,)}
FORMATS = [QT[name] for name in quants.FORMATS]
# the formats gguf's quantizer writes (the k-quants it only reads: random blocks for those)
QUANTIZABLE = (QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1)


def random_blocks(qtype, n_blocks, rng, scale=None):
    """Random bytes for n_blocks of qtype, with every f16 field finite (so no NaN/inf): of
    magnitude `scale` (then a format with a min has d, dmin >= 0, as quantizers write them),
    else of mixed magnitudes."""
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for at in F16_FIELDS[qtype]:
        if scale is None:
            f = rng.standard_normal(n_blocks) * rng.choice([1e-3, 1, 300], n_blocks)
        else:
            f = rng.uniform(-1, 1, n_blocks) * scale
            if len(F16_FIELDS[qtype]) == 2:
                f = np.abs(f)
        raw[:, at:at + 2] = f.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw


def test_type_table_matches_gguf():
    for qt, (block, size) in gguf.GGML_QUANT_SIZES.items():
        if int(qt) in wgg.GGML_TYPES:
            assert wgg.GGML_TYPES[int(qt)] == (qt.name, block, size)
    assert {"F32", "F16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"} <= set(wgg.DEQUANTIZABLE)


def test_metadata_and_tensor_infos(tmp_path):
    x = RNG.standard_normal((3, 64)).astype(np.float32)

    def build(w):
        w.add_custom_alignment(64)
        w.add_uint8("t.u8", 200); w.add_int8("t.i8", -5); w.add_uint16("t.u16", 60000)
        w.add_int16("t.i16", -30000); w.add_uint32("t.u32", 4_000_000_000); w.add_int32("t.i32", -7)
        w.add_float32("t.f32", 0.1); w.add_uint64("t.u64", 2**63 + 5); w.add_int64("t.i64", -2**40)
        w.add_float64("t.f64", 1e-300); w.add_bool("t.bool", True); w.add_string("t.str", "héllo ✓")
        w.add_array("t.ints", [1, -2, 3]); w.add_array("t.strs", ["a", "", "ünï"])
        w.add_array("t.nested", [[1, 2], [3]])
        w.add_tensor("x", x)
        w.add_tensor("y.weight", np.arange(10, dtype=np.float32))
        w.add_tensor("z", x.astype(np.float16))

    path = write(tmp_path, build)
    f = wgg.load(path)
    theirs = gguf.GGUFReader(str(path))
    assert f.version == 3 and f.alignment == 64
    want = {k: v.contents() for k, v in theirs.fields.items() if not k.startswith("GGUF.")}
    # gguf's reader flattens arrays of arrays ([[1, 2], [3]] -> [1, 2, 3]); we keep the nesting
    assert f.metadata.pop("t.nested") == [[1, 2], [3]] and want.pop("t.nested") == [1, 2, 3]
    assert f.metadata == want
    assert f.metadata["t.f32"] == np.float32(0.1) and f.metadata["t.str"] == "héllo ✓"
    assert f.metadata["t.u64"] == 2**63 + 5 and f.metadata["t.i64"] == -2**40
    assert list(f.tensors) == [t.name for t in theirs.tensors]
    for t in theirs.tensors:
        ours = f.tensors[t.name]
        assert ours.dims == tuple(int(d) for d in t.shape)           # ggml order
        assert ours.shape == tuple(t.data.shape)                       # numpy order
        assert ours.ggml_type == int(t.tensor_type)
        assert ours.data.tobytes() == t.data.tobytes()
        assert t.data_offset == f.tensors[t.name].offset + (t.data_offset - ours.offset)
        assert ours.offset % 64 == 0
    assert np.array_equal(np.asarray(f.tensors["x"].dequantize().tolist(), np.float32), x)


@pytest.mark.parametrize("use_numpy", [True, False], ids=["numpy", "pure"])
@pytest.mark.parametrize("qtype", FORMATS + [QT.F16, QT.BF16, QT.F32], ids=lambda q: q.name)
def test_dequantize_equals_gguf(qtype, use_numpy):
    rng = np.random.default_rng(int(qtype))
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype in (QT.F16, QT.BF16, QT.F32):
        x = (rng.standard_normal((4, 512)) * 10).astype(np.float32)
        raw = gguf.quants.quantize(x, qtype) if qtype == QT.BF16 else x.astype(
            np.float16 if qtype == QT.F16 else np.float32).view(np.uint8)
        blobs = [raw]
    else:
        blobs = [random_blocks(qtype, 24, rng)]
        if qtype in QUANTIZABLE:
            x = (rng.standard_normal((6, 256)) * rng.choice([0.01, 1, 50], (6, 1))).astype(np.float32)
            blobs.append(gguf.quants.quantize(x, qtype))
    for raw in blobs:
        raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
        n = raw.size // size * block
        want = gguf.quants.dequantize(raw.reshape(-1, size), qtype).astype(np.float32).reshape(-1)
        got = wgg.dequantize(qtype.name, raw.tobytes(), n, use_numpy=use_numpy)
        got = np.frombuffer(got, dtype=np.float32)
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()   # bit for bit


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_nonfinite_blocks_found_without_decoding(qtype):
    """QuantFormat.first_nonfinite_block (the check without numpy: the browser) reads only
    the f16 fields; gguf's own decoder says which block really holds a NaN or inf."""
    rng = np.random.default_rng(int(qtype) + 100)
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    fmt = quants.FORMATS[qtype.name]
    raw = random_blocks(qtype, 40, rng)
    assert fmt.first_nonfinite_block(raw.tobytes()) is None
    for field in F16_FIELDS[qtype]:
        for bad, block in ((np.inf, 31), (-np.inf, 7), (np.nan, 0), (np.nan, 39)):
            poisoned = raw.copy()
            poisoned[block, field:field + 2] = np.frombuffer(np.float16(bad).tobytes(), np.uint8)
            poisoned[block + 1:, field:field + 2] = np.frombuffer(np.float16(65504).tobytes(),
                                                                  np.uint8)  # f16's largest
            values = gguf.quants.dequantize(poisoned.reshape(-1, size), qtype).reshape(40, -1)
            want = int(np.flatnonzero(~np.isfinite(values).all(axis=1))[0])
            assert fmt.first_nonfinite_block(poisoned.tobytes()) == want == block


def test_quantized_nonfinite_refused_without_numpy(tmp_path, monkeypatch):
    """Where numpy does not import, a Q8_0 block with a NaN scale is still refused."""
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    raw = gguf.quants.quantize(x, QT.Q8_0)
    raw.reshape(-1)[34 * 5:34 * 5 + 2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
    path = write(tmp_path, lambda w: w.add_tensor("w", raw, raw_dtype=QT.Q8_0))
    monkeypatch.setattr(wgg, "numpy_or_none", lambda: None)
    f = wgg.load(path.read_bytes())
    with pytest.raises(wgg.GGUFError, match=r"tensor 'w': Q8_0 block 5 \(values 160 to 191\) "
                                            r"has a NaN or inf scale.*allow_nonfinite=True"):
        wgg.check_values(f)
    wgg.check_values(f, allow_nonfinite=True)


def test_quantized_tensors_in_a_file(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 512)).astype(np.float32)

    def build(w):
        for qt in FORMATS:
            q = (gguf.quants.quantize(x, qt) if qt in QUANTIZABLE else
                 random_blocks(qt, 16, rng).reshape(8, -1))
            w.add_tensor(qt.name, q, raw_shape=q.shape, raw_dtype=qt)

    f = wgg.load(write(tmp_path, build))
    for qt in FORMATS:
        t = f.tensors[qt.name]
        assert t.type_name == qt.name and t.shape == (8, 512)
        want = gguf.quants.dequantize(np.frombuffer(t.data, np.uint8).reshape(8, -1), qt)
        assert np.array_equal(np.asarray(t.dequantize().tolist(), np.float32), want)


# ---------------------------------------------------------------------------- GPT-2

def hf_gpt2(n_layer=2, n_embd=64, n_head=4, vocab=96, n_ctx=16):
    transformers = pytest.importorskip("transformers")
    import torch
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                                  vocab_size=vocab, n_positions=n_ctx, layer_norm_epsilon=1e-5)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name:               # norms away from their 1/0 defaults
                p.add_(torch.randn_like(p) * 0.1)
    return cfg, model


def gpt2_gguf_file(path, sd, *, n_ctx, n_embd, n_layer, n_head, eps, qtype=None):
    """What llama.cpp's converter writes for a GPT-2 state dict sd (transformers' names,
    numpy arrays): gguf's own name map, Conv1D weights transposed to [out, in], 2-D weights
    other than the embeddings quantized to qtype. Returns the path and each stored tensor as
    gguf dequantizes it."""
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, n_layer)
    stored = {}

    def build(w):
        w.add_context_length(n_ctx); w.add_embedding_length(n_embd)
        w.add_feed_forward_length(4 * n_embd); w.add_block_count(n_layer)
        w.add_head_count(n_head); w.add_layer_norm_eps(eps)
        for k, v in sd.items():
            base, _, suffix = k.rpartition(".")
            gname = f"{name_map.get_name(base)}.{suffix}"
            if k.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
                v = v.T
            v = np.ascontiguousarray(v, dtype=np.float32)
            if qtype is not None and v.ndim == 2 and "token_embd" not in gname and "position" not in gname:
                q = gguf.quants.quantize(v, qtype)
                stored[gname] = gguf.quants.dequantize(q, qtype)
                w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=qtype)
            else:
                stored[gname] = v
                w.add_tensor(gname, v)

    return write(path.parent, build, arch="gpt2", name=path.name), stored


def gpt2_gguf(tmp_path, model, cfg, *, with_output: bool, qtype=None):
    """gpt2_gguf_file of a transformers GPT-2: attention mask buffers dropped, the tied head
    written or not."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()
          if not (k.endswith((".attn.bias", ".attn.masked_bias"))
                  or (k == "lm_head.weight" and not with_output))}
    return gpt2_gguf_file(tmp_path / "m.gguf", sd, n_ctx=cfg.n_positions, n_embd=cfg.n_embd,
                          n_layer=cfg.n_layer, n_head=cfg.n_head, eps=cfg.layer_norm_epsilon,
                          qtype=qtype)


@pytest.mark.parametrize("with_output", [False, True], ids=["tied", "output.weight"])
def test_gpt2_state_dict_round_trip(tmp_path, with_output):
    import torch
    cfg, model = hf_gpt2()
    path, _ = gpt2_gguf(tmp_path, model, cfg, with_output=with_output)
    hp, sd = gpt2_state_dict(path)
    assert hp == {"n_layer": 2, "n_head": 4, "n_embd": 64, "n_ctx": 16, "vocab_size": 96,
                  "layer_norm_epsilon": pytest.approx(1e-5), "eos_token_id": None}
    want = {k: v for k, v in model.transformer.state_dict().items()
            if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    assert set(sd) == set(want) | ({"lm_head.weight"} if with_output else set())
    for k, v in want.items():
        assert sd[k].shape == tuple(v.shape), k
        assert np.array_equal(np.asarray(sd[k].tolist(), np.float32), v.numpy()), k
    # the state dict drives transformers' own model to the same logits
    fresh = type(model)(cfg).eval()
    fresh.transformer.load_state_dict({k: torch.tensor(np.asarray(sd[k].tolist(), np.float32))
                                       for k in want}, strict=False)
    fresh.tie_weights()
    ids = torch.tensor([[1, 5, 9, 3, 95, 0]])
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)


def test_gpt2_quantized_weights(tmp_path):
    cfg, model = hf_gpt2()
    path, stored = gpt2_gguf(tmp_path, model, cfg, with_output=False, qtype=QT.Q8_0)
    _, sd = gpt2_state_dict(path)
    w = np.asarray(sd["h.1.mlp.c_fc.weight"].tolist(), np.float32)
    assert np.array_equal(w, stored["blk.1.ffn_up.weight"].T)   # dequantized gguf's way, [in, out]
    assert wgg.load(path).tensors["blk.1.ffn_up.weight"].type_name == "Q8_0"


@pytest.mark.parametrize("qtype", [None, QT.Q8_0, QT.Q4_0], ids=["F32", "Q8_0", "Q4_0"])
def test_gpt2_from_gguf_logits(tmp_path, qtype):
    """GPT2.from_gguf: F32 weights give transformers' logits; quantized ones give the logits
    of the same weights dequantized on the host by gguf and loaded from a state dict."""
    import torch
    from webgrad.models import gpt2
    cfg, model = hf_gpt2(n_embd=64, n_head=2)
    path, stored = gpt2_gguf(tmp_path, model, cfg, with_output=qtype is None, qtype=qtype)
    m = gpt2.GPT2.from_gguf(path, backend="reference")
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    got = np.asarray(m.forward(ids))
    if qtype is None:
        with torch.no_grad():
            want = model(torch.tensor([ids])).logits[0].numpy()
    else:                                   # gguf's dequantization, then transformers' names
        name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, cfg.n_layer)
        sd = {}
        for k in model.transformer.state_dict():
            if k.endswith((".attn.bias", ".attn.masked_bias")):
                continue
            base, _, suffix = ("transformer." + k).rpartition(".")
            v = stored[f"{name_map.get_name(base)}.{suffix}"]
            sd[k] = v.T if k.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")) else v
        host = gpt2.GPT2.from_hf_state_dict(gpt2.GPT2Config(**gpt2_state_dict(path)[0]), sd,
                                            backend="reference")
        want = np.asarray(host.forward(ids))
        assert not np.allclose(want, model(torch.tensor([ids])).logits[0].detach().numpy(),
                               atol=1e-4)      # quantization did change the weights
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_tensors_upload_directly(tmp_path):
    """GGUF and safetensors tensors go straight into upload_params (arrays.to_host calls
    their to_host)."""
    import webgrad as wg
    from webgrad import Module, ops
    from webgrad.io import safetensors as st

    class M(Module):
        def __init__(self):
            super().__init__()
            self.w = self.param([2, 32])

    c = wg.compile_forward(M, lambda m, i: ops.sum_all(m.w), inputs={}, backend="reference")
    x = np.arange(64, dtype=np.float32).reshape(2, 32) / 7
    q = gguf.quants.quantize(x, QT.Q8_0)
    path = write(tmp_path, lambda w: w.add_tensor("w", q, raw_shape=q.shape, raw_dtype=QT.Q8_0))
    c.upload_params(wgg.load(path).tensors)
    assert np.array_equal(c.download_params()["w"], gguf.quants.dequantize(q, QT.Q8_0))
    c.upload_params(st.load(st.dumps({"w": x.astype(np.float16)})))
    assert np.array_equal(c.download_params()["w"], x.astype(np.float16).astype(np.float32))


def test_gpt2_errors(tmp_path):
    path = write(tmp_path, lambda w: w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32)),
                 arch="llama")
    with pytest.raises(wgg.GGUFError, match="'general.architecture': expected 'gpt2', got 'llama'"):
        gpt2_state_dict(path)
    path = write(tmp_path, lambda w: w.add_tensor("blk.0.attn_q.weight", np.zeros((4, 32), np.float32)),
                 arch="gpt2", name="b.gguf")
    with pytest.raises(wgg.GGUFError, match="metadata 'gpt2.block_count' is missing"):
        gpt2_state_dict(path)


# ---------------------------------------------------------------------------- malformed files

def s_(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def handmade(*, magic=b"GGUF", version=3, n_tensors=None, n_kv=None, kv=None, infos=None,
             align=32, data=None) -> bytes:
    """A GGUF file from parts, written independently of both readers."""
    kv = kv if kv is not None else [s_("general.architecture") + struct.pack("<I", 8) + s_("gpt2")]
    infos = infos if infos is not None else [
        s_("a") + struct.pack("<I2Q", 2, 32, 2) + struct.pack("<IQ", 0, 0),
        s_("b") + struct.pack("<I1Q", 1, 32) + struct.pack("<IQ", 8, 256)]
    head = magic + struct.pack("<I", version) + struct.pack(
        "<QQ", len(infos) if n_tensors is None else n_tensors, len(kv) if n_kv is None else n_kv)
    head += b"".join(kv) + b"".join(infos)
    head += bytes(-len(head) % align)
    return head + (data if data is not None else bytes(256 + 34))


def info(name, dims, ttype, offset):
    return s_(name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims) + struct.pack("<IQ", ttype, offset)


GOOD = handmade()

MALFORMED = [
    (b"GGU", "magic: needs 4 bytes"),
    (b"GGML" + bytes(20), "magic: expected b'GGUF', got b'GGML'"),
    (handmade(version=1), "version: 1 is not supported"),
    (handmade(version=3 << 24), "version: big-endian GGUF files are not supported"),
    (handmade(n_tensors=2**60), "tensor count: 1152921504606846976 entries of at least 24 bytes"),
    (handmade(n_kv=2**50), "metadata count: 1125899906842624 entries"),
    (handmade(kv=[struct.pack("<Q", 2**62) + b"key"]), "metadata\\[0\\].key \\(length\\)|metadata\\[0\\].key: needs 4611686018427387904 bytes"),
    (handmade(kv=[s_("k") + struct.pack("<I", 13)]), "metadata 'k': unknown value type 13"),
    (handmade(kv=[s_("k") + struct.pack("<IIQ", 9, 4, 2**40)]), "metadata 'k' \\(array length\\): 1099511627776 entries"),
    (handmade(kv=[s_("k") + struct.pack("<IIQ", 9, 77, 1)]), "metadata 'k': unknown array element type 77"),
    (handmade(kv=[s_("k") + struct.pack("<I", 8) + struct.pack("<Q", 3) + b"\xff\xfe\xfd"]), "metadata 'k': not UTF-8"),
    (handmade(kv=[s_("k") + struct.pack("<IB", 0, 1)] * 2), "metadata 'k': the key appears twice"),
    (handmade(kv=[s_("general.alignment") + struct.pack("<II", 4, 24)]), "'general.alignment': must be a positive power of two, got 24"),
    (handmade(kv=[s_("general.alignment") + struct.pack("<II", 4, 0)]), "must be a positive power of two, got 0"),
    (handmade(infos=[info("a", [32] * 5, 0, 0)]), "tensor 'a'.n_dims: 5 dims"),
    (handmade(infos=[info("a", [32], 99, 0)]), "tensor 'a'.type: unknown ggml type 99"),
    (handmade(infos=[info("a", [30], 8, 0)]), "tensor 'a'.dims: a row of 30 elements is not a whole number of Q8_0 blocks"),
    (handmade(infos=[info("a", [32], 0, 8)]), "tensor 'a'.offset: 8 is not a multiple of the alignment 32"),
    (handmade(infos=[info("a", [32], 0, 0), info("a", [32], 0, 128)]), "tensor 'a': the name appears twice"),
    (handmade(infos=[info("a", [2**31, 2**31], 0, 0)]), "tensor 'a'.offset: bytes \\[0, 18446744073709551616\\) of F32\\[2147483648, 2147483648\\] go beyond"),
    (handmade(infos=[info("a", [32], 0, 0), info("b", [64], 0, 128)], data=bytes(200)), "tensor 'b'.offset: bytes \\[128, 384\\) of F32\\[64\\] go beyond the 200-byte data section"),
    (handmade(infos=[info("a", [64], 0, 0), info("b", [32], 0, 224), info("c", [32], 0, 192)], data=bytes(512)), "tensor 'c'.offset: bytes \\[192, 320\\) overlap tensor 'a'|tensor 'b'.offset: bytes \\[224, 352\\) overlap tensor 'c'"),
    (handmade(data=b"")[:-1], "data section|needs|beyond"),
]


@pytest.mark.parametrize("blob,msg", MALFORMED, ids=[m[:40] for _, m in MALFORMED])
def test_malformed(blob, msg):
    with pytest.raises(wgg.GGUFError, match=msg) as e:
        wgg.load(blob)
    assert str(e.value).startswith("GGUF file <bytes>: ")


def test_handmade_good_file_reads_in_both(tmp_path):
    """The malformed cases' base file is itself valid, for us and for gguf's reader."""
    f = wgg.load(GOOD)
    (tmp_path / "good.gguf").write_bytes(GOOD)
    theirs = gguf.GGUFReader(str(tmp_path / "good.gguf"))
    assert [t.name for t in theirs.tensors] == list(f.tensors) == ["a", "b"]
    assert f.tensors["a"].shape == (2, 32) and f.tensors["b"].type_name == "Q8_0"
    assert f.tensors["b"].data.tobytes() == theirs.tensors[1].data.tobytes()
    assert f.metadata == {"general.architecture": "gpt2"}


def test_every_truncation(tmp_path):
    path = write(tmp_path, lambda w: (w.add_array("t.strs", ["ab", "c"]), w.add_float32("t.f", 2.0),
                                      w.add_tensor("x", np.ones((2, 32), np.float32)),
                                      w.add_tensor("y", np.ones(32, np.float16))))
    blob = path.read_bytes()
    wgg.load(blob)
    for n in range(len(blob)):
        with pytest.raises(wgg.GGUFError):
            wgg.load(blob[:n])


def _gguf_file_bytes():
    import io
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        def build(w):
            w.add_array("t.ints", [1, 2, 3]); w.add_string("t.s", "hello")
            w.add_tensor("x", np.arange(64, dtype=np.float32).reshape(2, 32))
            q = gguf.quants.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), QT.Q8_0)
            w.add_tensor("q", q, raw_shape=q.shape, raw_dtype=QT.Q8_0)
        return write(Path(d), build).read_bytes()


VALID = _gguf_file_bytes()


@hst.composite
def mutated(draw):
    blob = bytearray(VALID)
    for _ in range(draw(hst.integers(1, 4))):
        kind = draw(hst.sampled_from(["flip", "truncate", "insert", "delete", "u64", "u32"]))
        i = draw(hst.integers(0, max(0, len(blob) - 1)))
        if kind == "flip" and blob:
            blob[i] = draw(hst.integers(0, 255))
        elif kind == "truncate":
            del blob[i:]
        elif kind == "insert":
            blob[i:i] = draw(hst.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del blob[i:i + draw(hst.integers(1, 8))]
        elif kind in ("u64", "u32") and len(blob) >= i + 8:
            # counts, lengths, dims and offsets are u64/u32 fields: make one huge or small
            v = draw(hst.one_of(hst.integers(0, 300), hst.integers(0, 2**64 - 1)))
            if kind == "u64":
                blob[i:i + 8] = struct.pack("<Q", v)
            else:
                blob[i:i + 4] = struct.pack("<I", v & 0xFFFFFFFF)
    return bytes(blob)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fuzz_mutated_files(blob):
    """A mutation either parses to tensors inside the file (and dequantizes) or raises
    GGUFError: never IndexError, struct.error, MemoryError or a hang."""
    try:
        f = wgg.load(blob)
    except wgg.GGUFError:
        return
    for t in f.tensors.values():
        _, block, size = wgg.GGML_TYPES[t.ggml_type]
        assert t.data.nbytes == t.n_elements // block * size
        assert 0 <= t.offset and t.offset + t.data.nbytes <= len(blob)
        if t.type_name in wgg.DEQUANTIZABLE and t.n_elements < 10**6:
            assert len(t.dequantize()) == t.n_elements
