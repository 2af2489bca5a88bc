"""webgrad against llama.cpp itself (llama-cpp-python, tests/llama_cpp_oracle.py).

- ggml's quantizer (ggml_quantize_chunk, what llama-quantize runs) writes blocks of every type
  webgrad decodes from varied rows; webgrad's decoders (the Python spec and numpy) give
  ggml's dequantize_row_* values.
- A Llama of SmolLM2-135M's shape (576 wide, 9 query and 3 key/value heads of 64, 1536-wide
  MLP, 49152 tokens, tied embeddings, rope_theta 1e5) with 2 layers and random weights,
  written as llama.cpp's converter writes it (tests/test_llama_gguf.py) in F32, then
  quantized by llama.cpp (llama_model_quantize) to Q8_0, Q4_0, Q4_K_M, Q5_K_M and Q6_K: the
  files hold what llama.cpp writes for that shape (the 576-wide matrices are not whole
  256-value blocks, so llama.cpp falls back to Q5_0/Q5_1/Q8_0 for them). webgrad's logits
  equal llama.cpp's at every position, within a tolerance per type (1e-4 for F32; llama.cpp's
  CPU matmuls quantize the activations too, to Q8_K or Q8_0, for quantized weights, webgrad's
  do not). Every quantized tensor of those files decodes in webgrad, from the file and read
  back from the model's GPU words, to the values ggml's dequantize_row_* gives.

Slow cases: they need the llama.cpp build (docs/testing.md), and fail without it.
"""
from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

import llama_cpp_oracle as oracle  # noqa: E402
from test_llama_gguf import hf_model, llama_cpp_gguf, unpermute  # noqa: E402
from webgrad import quants  # noqa: E402
from webgrad.io import gguf as wgg  # noqa: E402
from webgrad.models import llama  # noqa: E402

pytestmark = pytest.mark.slow

SMOL = dict(hidden_size=576, num_hidden_layers=2, num_attention_heads=9, num_key_value_heads=3,
            intermediate_size=1536, vocab_size=49152, max_position_embeddings=64,
            rope_theta=100000.0, rms_norm_eps=1e-5)
IDS = [1, 4093, 29, 731, 48000, 5, 260, 17, 9999, 3, 812, 2024, 33, 40000, 7, 1]
# max |webgrad - llama.cpp| / max |llama.cpp| per file type. F32: the same arithmetic up to
# summation order. Quantized: llama.cpp's CPU matmuls quantize the activations to 8 bits
# (Q8_0 or Q8_K blocks) before each product with a quantized matrix, webgrad's do not; at
# this model's logits (largest about 10) that moves them by 4-5e-2 of the largest, measured on
# every type; the weights themselves are compared exactly (below).
TOL = {"F32": 1e-4, "Q8_0": 7e-2, "Q4_0": 7e-2, "Q4_K_M": 7e-2, "Q5_K_M": 7e-2, "Q6_K": 7e-2}


@pytest.mark.parametrize("type_name", list(quants.FORMATS))
def test_ggml_quantized_blocks_decode_as_ggml_does(type_name):
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((12, 768)).astype(np.float32)
    rows *= np.logspace(-4, 2, 12, dtype=np.float32)[:, None]   # magnitudes 1e-4 .. 100
    rows[3, 5] = 40.0                                            # an outlier in a block
    rows[5] = np.abs(rows[5])                                    # all positive (mins)
    rows[7, :256] = 0.0                                          # an all-zero block
    blocks = oracle.quantize(rows, type_name)
    n = rows.size
    want = oracle.dequantize(blocks, type_name, n)
    fmt = quants.FORMATS[type_name]
    assert blocks.size == n // fmt.block * fmt.nbytes
    # ggml's quantizer did its work: the values are near the rows (but for the rows of 1e-4
    # and so, where Q6_K's f16 scale is subnormal)
    err = np.abs(want.reshape(rows.shape) - rows).max(axis=1) / np.abs(rows).max(axis=1)
    assert err[3:].max() < 0.15, err
    spec = np.asarray(quants.dequantize(type_name, blocks.tobytes(), n), np.float32)
    vec = fmt.numpy(np, blocks.reshape(-1, fmt.nbytes)).ravel()
    np.testing.assert_array_equal(vec, want)
    # the Python spec rounds once, ggml's f32 products may round twice: an ulp or two
    np.testing.assert_allclose(spec, want, rtol=3e-7, atol=1e-30)


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    d = tmp_path_factory.mktemp("smol")
    model = hf_model("llama_tied", SMOL, num_key_value_heads=3)
    path, _ = llama_cpp_gguf(d, model, "llama_tied", spm=True, name="f32.gguf")
    f32 = np.asarray(llama.Llama.from_gguf(path, backend="reference").forward(IDS))
    return d, path, f32


@pytest.mark.parametrize("ftype", list(TOL))
def test_logits_equal_llama_cpp(smol, ftype):
    d, f32_path, f32_logits = smol
    path = f32_path if ftype == "F32" else oracle.quantize_file(f32_path, d / f"{ftype}.gguf", ftype)
    f = wgg.load(path)
    types = {t.type_name for t in f.tensors.values()}
    if ftype != "F32":
        assert ftype.split("_K")[0] in {t.split("_K")[0] for t in types}, types
    m = llama.Llama.from_gguf(path, backend="reference")
    assert (m.cfg.hidden_size, m.cfg.num_key_value_heads, m.cfg.vocab_size) == (576, 3, 49152)
    assert {q.qtype for q in m.quant.values()} == types - {"F32"}
    # every tensor llama.cpp's quantizer wrote decodes as ggml decodes it: on the host from
    # the file, and read back from the model's GPU words (the q/k rows in transformers' order)
    sd = m.state_dict()
    back = {"token_embd.weight": "model.embed_tokens.weight",
            "blk.1.attn_k.weight": "model.layers.1.self_attn.k_proj.weight",
            "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight"}
    for name, t in f.tensors.items():
        if t.type_name == "F32":
            continue
        want = oracle.dequantize(np.frombuffer(t.data, np.uint8), t.type_name, t.n_elements)
        np.testing.assert_allclose(np.asarray(t.dequantize()).ravel(), want, rtol=3e-7, atol=0,
                                   err_msg=f"{name} ({t.type_name})")
        if name in back:
            w = want.reshape(np.asarray(sd[back[name]]).shape)
            if "attn_k" in name:
                w = unpermute(w, 3)
            np.testing.assert_allclose(np.asarray(sd[back[name]]), w, rtol=3e-7, atol=0,
                                       err_msg=f"{name} ({t.type_name}) read back")
    got = np.asarray(m.forward(IDS))
    want = oracle.logits(path, IDS)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= TOL[ftype], f"{ftype} ({sorted(types)}): {err:.2e} of the largest logit"
