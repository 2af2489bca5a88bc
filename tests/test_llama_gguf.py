"""Llama.from_gguf (models/llama_gguf.py) on GGUF files written as llama.cpp's converter
writes them, judged against transformers.

The files: small random transformers models (LlamaForCausalLM with GQA, untied, llama3 rope
scaling and biases, and tied without scaling; Qwen2ForCausalLM with q/k/v biases and tied
embeddings; Qwen3ForCausalLM with q/k norms and head_dim != hidden / heads) written by the
gguf package's GGUFWriter: names from gguf's own tensor map, the metadata keys
convert_hf_to_gguf.py writes, llama3 scaling as its rope_freqs tensor, and the llama
architecture's q/k rows permuted by the converter's formula (LlamaModel.permute), copied
below. Weights F32, F16, or quantized: Q8_0 and Q4_0 by gguf.quants.quantize; gguf has no
k-quant quantizer, so Q4_K, Q5_K and Q6_K tensors are random blocks of usable magnitudes.

Expected: an F32 file gives transformers' logits within 1e-4 of the largest logit; other
files give the logits of transformers run on the weights gguf.quants.dequantize decodes
from the file (q/k rows put back in transformers' order here, in numpy), within 1e-4
relative to the largest logit, with the weights held quantized (keep_quantized, the
default), on the reference and torch backends and one tiny WebGPU case (lavapipe), which
also checks that no f32 copy of a weight is planned. Malformed files fail naming the key or
the tensors.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from gguf import GGMLQuantizationType as QT  # noqa: E402

from backends import WEBGPU  # noqa: E402
from test_gguf import random_blocks, write  # noqa: E402
from test_llama import perturbed  # noqa: E402
from webgrad.io import gguf as wgg  # noqa: E402
from webgrad.models import llama  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=100, max_position_embeddings=48)
# hidden and intermediate sizes of whole k-quant blocks (256 values)
WIDE = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=512, vocab_size=96, max_position_embeddings=48)

# name: (config class, model class, GGUF architecture, config fields)
KINDS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", gguf.MODEL_ARCH.LLAMA,
              dict(rope_theta=500000.0, rope_scaling=LLAMA3, attention_bias=True, mlp_bias=True)),
    "llama_tied": ("LlamaConfig", "LlamaForCausalLM", gguf.MODEL_ARCH.LLAMA,
                   dict(tie_word_embeddings=True, num_key_value_heads=4)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", gguf.MODEL_ARCH.QWEN2,
              dict(tie_word_embeddings=True, rope_theta=1e6)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", gguf.MODEL_ARCH.QWEN3,
              dict(head_dim=24, num_key_value_heads=1)),
}
IDS = [3, 17, 5, 95, 0, 42, 7, 8, 61, 11, 2, 30]
# random k-quant blocks: f16 scales giving weights of about 0.05
KSCALE = {QT.Q4_K: 2e-4, QT.Q5_K: 1e-4, QT.Q6_K: 1e-5}


def hf_model(kind, size=SMALL, seed=0, **over):
    cname, mname, _, fields = KINDS[kind]
    cfg = getattr(transformers, cname)(**{**size, **fields, **over})
    torch.manual_seed(seed)
    return perturbed(getattr(transformers, mname)(cfg).eval())


def head_dim(hp):
    return getattr(hp, "head_dim", None) or hp.hidden_size // hp.num_attention_heads


def permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py's LlamaModel.permute: rotate-half rows -> interleaved pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    """Its inverse (the expected values, computed here independently of the loader)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rope_factors(hp):
    """convert_hf_to_gguf.py's llama3 rope_freqs (LlamaModel.generate_extra_tensors)."""
    r = hp.rope_parameters if hasattr(hp, "rope_parameters") else hp.rope_scaling
    base = r.get("rope_theta", getattr(hp, "rope_theta", 10000.0))
    dim = head_dim(hp)
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    old = r["original_max_position_embeddings"]
    lo_wl, hi_wl = old / r["low_freq_factor"], old / r["high_freq_factor"]
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < hi_wl:
            out.append(1)
        elif wavelen > lo_wl:
            out.append(r["factor"])
        else:
            smooth = (old / wavelen - r["low_freq_factor"]) / (r["high_freq_factor"] - r["low_freq_factor"])
            out.append(1 / ((1 - smooth) / r["factor"] + smooth))
    return np.asarray(out, np.float32)


def llama_cpp_gguf(tmp_path, model, kind, *, qtype=None, mix=None, name="m.gguf", spm=False):
    """What llama.cpp's converter (and llama-quantize, for qtype / mix) writes for `model`:
    returns (path, the transformers state dict of the values the file holds, as gguf
    decodes them). qtype: the type of every 2-D tensor (None: F32); mix: {gguf name: type}
    overrides. 1-D tensors (norms, biases, rope_freqs) stay F32, as llama.cpp keeps them.
    spm: a SentencePiece vocabulary (<unk>, <s>, </s>, the 256 byte tokens, then made-up
    pieces) with its scores and token types, which llama.cpp needs to load the file."""
    hp = model.config
    arch = KINDS[kind][2]
    rng = np.random.default_rng(7)
    H, Hkv = hp.num_attention_heads, hp.num_key_value_heads
    tied = hp.tie_word_embeddings
    name_map = gguf.get_tensor_name_map(arch, hp.num_hidden_layers)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()
          if not (tied and k == "lm_head.weight")}
    back = {}

    def build(w):
        w.add_context_length(hp.max_position_embeddings)
        w.add_embedding_length(hp.hidden_size)
        w.add_feed_forward_length(hp.intermediate_size)
        w.add_block_count(hp.num_hidden_layers)
        w.add_head_count(H)
        w.add_head_count_kv(Hkv)
        w.add_layer_norm_rms_eps(hp.rms_norm_eps)
        rp = getattr(hp, "rope_parameters", None) or {}
        w.add_rope_freq_base(rp.get("rope_theta", getattr(hp, "rope_theta", 10000.0)))
        if kind == "qwen3":
            w.add_key_length(hp.head_dim)
            w.add_value_length(hp.head_dim)
        if arch == gguf.MODEL_ARCH.LLAMA:
            w.add_rope_dimension_count(head_dim(hp))
            w.add_vocab_size(hp.vocab_size)
        if spm:
            pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
            w.add_tokenizer_model("llama")
            w.add_token_list(pieces + [f"t{i}" for i in range(hp.vocab_size - len(pieces))])
            w.add_token_scores([0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(hp.vocab_size - 259)])
            w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (hp.vocab_size - 259))
            w.add_bos_token_id(1)
        else:
            w.add_token_list([f"<t{i}>" for i in range(hp.vocab_size)])
        w.add_eos_token_id(2)
        if rp.get("rope_type") == "llama3":
            w.add_tensor("rope_freqs.weight", rope_factors(hp))
        if rp.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rp["factor"])
        for k, v in sd.items():
            base, _, suffix = k.rpartition(".")
            gname = f"{name_map.get_name(base)}.{suffix}"
            heads = H if ".q_proj." in k else Hkv if ".k_proj." in k else None
            if arch == gguf.MODEL_ARCH.LLAMA and heads:
                v = permute(v, H, heads)
            v = np.ascontiguousarray(v, np.float32)
            qt = (mix or {}).get(gname, qtype) if v.ndim == 2 else None
            if qt is None:
                stored = v
                w.add_tensor(gname, v)
            elif qt == QT.F16:
                w.add_tensor(gname, v.astype(np.float16))
                stored = v.astype(np.float16).astype(np.float32)
            else:
                if qt in KSCALE:     # gguf has no k-quant quantizer: random blocks
                    q = random_blocks(qt, v.size // 256, rng, scale=KSCALE[qt]).reshape(v.shape[0], -1)
                elif qt == QT.Q3_K:  # a type webgrad does not decode (the errors test)
                    q = np.zeros((v.shape[0], v.shape[1] // 256 * 110), np.uint8)
                else:
                    q = gguf.quants.quantize(v, qt)
                w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=qt)
                stored = gguf.quants.dequantize(q, qt)
            if arch == gguf.MODEL_ARCH.LLAMA and heads:
                stored = unpermute(stored, heads)
            back[k] = stored

    path = write(tmp_path, build, arch=gguf.MODEL_ARCH_NAMES[arch], name=name)
    return path, back


def hf_logits(model, ids, sd=None):
    if sd is not None:
        model = type(model)(model.config).eval()
        missing, unexpected = model.load_state_dict({k: torch.tensor(v) for k, v in sd.items()},
                                                    strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}
        model.tie_weights()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def close(got, want, tol=1e-4):
    err = np.abs(np.asarray(got) - want).max() / np.abs(want).max()
    assert err <= tol, f"max error {err:.2e} of the largest logit"


def matrices(m):
    return {n for n, s in m.hf_shapes.items() if len(s) == 2}


# ---------------------------------------------------------------- F32 and F16 files

@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("kind", KINDS)
def test_f32_file_gives_transformers_logits(tmp_path, kind, backend):
    model = hf_model(kind)
    path, _ = llama_cpp_gguf(tmp_path, model, kind)
    m = llama.Llama.from_gguf(path, backend=backend)
    c = m.cfg
    hp = model.config
    assert (c.model_type, c.num_key_value_heads, c.head_dim, c.tie_word_embeddings) == (
        kind.split("_")[0], hp.num_key_value_heads, head_dim(hp), hp.tie_word_embeddings)
    assert c.qkv_bias == (kind in ("llama", "qwen2")) and c.qk_norm == (kind == "qwen3")
    assert (c.rope_freq_factors is not None) == (kind == "llama") and c.eos_token_id == 2
    assert not m.quant and c.n_ctx == 48
    want = hf_logits(model, IDS)
    close(m.forward(IDS), want)
    cache = m.new_cache()                       # the KV cache: the same last logits
    m.logits_step(IDS[:7], cache)
    close(m.logits_step(IDS[7:], cache), want[-1])


@pytest.mark.parametrize("kind,qt", [("llama", QT.F16), ("qwen3", QT.F16), ("llama", QT.BF16)],
                         ids=lambda v: getattr(v, "name", v))
def test_f16_and_bf16_files(tmp_path, kind, qt):
    model = hf_model(kind)
    path, sd = llama_cpp_gguf(tmp_path, model, kind, qtype=qt)
    m = llama.Llama.from_gguf(path, backend="reference")
    assert wgg.load(path).tensors["blk.0.attn_q.weight"].type_name == qt.name and not m.quant
    close(m.forward(IDS), hf_logits(model, IDS, sd))


def test_linear_rope_scaling(tmp_path):
    model = hf_model("llama_tied", rope_scaling={"rope_type": "linear", "factor": 4.0})
    path, _ = llama_cpp_gguf(tmp_path, model, "llama_tied")
    assert wgg.load(path).metadata["llama.rope.scaling.type"] == "linear"
    m = llama.Llama.from_gguf(path, backend="reference")
    assert m.cfg.rope_freq_factors == (4.0,) * 8
    want = hf_logits(model, IDS)
    assert np.abs(want - hf_logits(hf_model("llama_tied"), IDS)).max() > 1e-3   # it matters
    close(m.forward(IDS), want)


def test_llama3_rope_freqs_equal_transformers():
    model = hf_model("llama")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](model.config, None)
    base = llama.LlamaConfig(head_dim=16, rope_theta=500000.0,
                             rope_freq_factors=rope_factors(model.config).tolist())
    np.testing.assert_allclose(base.inv_freq(), want.numpy(), rtol=1e-6)
    assert llama.LlamaConfig.from_hf(base.to_hf()) == base    # kept through config.json


# ---------------------------------------------------------------- quantized files

QUANTS = [QT.Q8_0, QT.Q4_0, QT.Q4_K, QT.Q5_K, QT.Q6_K]


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("qt", QUANTS, ids=lambda q: q.name)
def test_quantized_llama_stays_quantized(tmp_path, qt, backend):
    """Every matrix of a llama file (q/k rows permuted) in `qt`, held as its blocks."""
    model = hf_model("llama", WIDE)
    path, sd = llama_cpp_gguf(tmp_path, model, "llama", qtype=qt)
    m = llama.Llama.from_gguf(path, backend=backend)
    assert set(m.quant) == matrices(m) and {q.qtype for q in m.quant.values()} == {qt.name}
    blocks = sum(t.data.nbytes for t in wgg.load(path).tensors.values() if t.type_name == qt.name)
    f32 = 4 * sum(v.size for v in sd.values())
    onedim = 4 * sum(v.size for v in sd.values() if v.ndim == 1)
    assert blocks <= m.weight_bytes - onedim <= blocks + 2 * len(m.quant) and m.weight_bytes < f32 / 3
    want = hf_logits(model, IDS, sd)
    if qt in (QT.Q8_0, QT.Q4_0):                 # quantized from the model: near, not equal
        assert np.abs(want - hf_logits(model, IDS)).max() > 1e-4 * np.abs(want).max()
    close(m.forward(IDS), want)
    cache = m.new_cache()
    m.logits_step(IDS[:5], cache)
    close(m.logits_step(IDS[5:], cache), want[-1])
    back = m.state_dict()                       # read back decoded, in transformers' order
    for k in ("model.layers.1.self_attn.k_proj.weight", "model.embed_tokens.weight"):
        assert np.array_equal(np.asarray(back[k]), sd[k]), k


@pytest.mark.parametrize("kind,qt", [("qwen2", QT.Q8_0), ("qwen3", QT.Q6_K), ("llama_tied", QT.Q5_K)])
def test_quantized_qwen_and_tied(tmp_path, kind, qt):
    over = dict(head_dim=128) if kind == "qwen3" else {}
    model = hf_model(kind, WIDE, **over)
    path, sd = llama_cpp_gguf(tmp_path, model, kind, qtype=qt)
    m = llama.Llama.from_gguf(path, backend="reference")
    assert set(m.quant) == matrices(m)
    close(m.forward(IDS), hf_logits(model, IDS, sd))


def q4_k_m(n_layer):
    """The types of a llama-quantize Q4_K_M file: Q4_K matrices, Q6_K ffn_down (here of every
    block), token_embd and output."""
    mix = {f"blk.{i}.ffn_down.weight": QT.Q6_K for i in range(n_layer)}
    return {**mix, "token_embd.weight": QT.Q6_K, "output.weight": QT.Q6_K}


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_q4_k_m_mix(tmp_path, backend):
    model = hf_model("llama", WIDE)
    path, sd = llama_cpp_gguf(tmp_path, model, "llama", qtype=QT.Q4_K, mix=q4_k_m(2))
    m = llama.Llama.from_gguf(path, backend=backend)
    types = {n: q.qtype for n, q in m.quant.items()}
    assert types["model.layers.0.mlp.down_proj.weight"] == types["lm_head.weight"] == "Q6_K"
    assert types["model.embed_tokens.weight"] == "Q6_K"
    layer1 = "model.layers.1."
    assert types[layer1 + "self_attn.q_proj.weight"] == types[layer1 + "mlp.up_proj.weight"] == "Q4_K"
    close(m.forward(IDS), hf_logits(model, IDS, sd))


@pytest.mark.parametrize("backend", [WEBGPU])
def test_q4_k_m_decode_through_the_chunked_gemv(tmp_path, backend):
    """A Q4_K_M file's decode steps through the GPU matrix-vector kernel's quantized form
    (matmul_gemv.build_gemv_chunks, forced onto lavapipe): every product of a step, the
    Q6_K head included, reads its blocks in chunks, and the cached steps give
    transformers' logits of gguf's values."""
    from webgrad.backends.webgpu import WebGPUBackend
    from webgrad.codegen import KernelOptions
    be = WebGPUBackend(options=KernelOptions(force_gemv=True, gemv_cpu=False))
    model, sd, m, rows = _q4_k_m_steps(tmp_path, be)
    names = m._program("step", 1)._prog.exe.kernel_names
    assert sum(" gemv q " in n for n in names) == 7 * WIDE["num_hidden_layers"] + 1, names
    close(np.stack(rows), hf_logits(model, IDS[:6], sd))


def _q4_k_m_steps(tmp_path, backend):
    """(transformers' model, its state dict, webgrad's model of its Q4_K_M file on
    `backend`, the cached logits for IDS[:6]: a chunk of 3, then one id a step)."""
    model = hf_model("llama", WIDE)
    path, sd = llama_cpp_gguf(tmp_path, model, "llama", qtype=QT.Q4_K, mix=q4_k_m(2))
    m = llama.Llama.from_gguf(path, backend=backend)
    cache = m.new_cache()
    rows = list(np.asarray(m.logits_all_step(IDS[:3], cache)))
    rows += [np.asarray(m.logits_step([t], cache)) for t in IDS[3:6]]
    return model, sd, m, rows


@pytest.mark.parametrize("backend", [WEBGPU])
def test_q4_k_m_decode_with_the_norms_in_the_chunked_gemv(tmp_path, backend):
    """The same steps with each RMSNorm summed and applied by the products that read it
    (fusion's rule 8, codegen/gemv_prologue.py, forced onto lavapipe): no `sum` kernel is
    left, the products after the first layer read the normalized rows as vec4s (the first
    layer's token rows, a gather, four scalars at a time), and the logits are
    transformers'."""
    from webgrad.backends.webgpu import WebGPUBackend
    from webgrad.codegen import KernelOptions
    be = WebGPUBackend(options=KernelOptions(force_gemv=True, gemv_cpu=False, gemv_prologue=True))
    model, sd, m, rows = _q4_k_m_steps(tmp_path, be)
    exe = m._program("step", 1)._prog.exe
    assert not any(n.split(" ")[0] == "sum" for n in exe.kernel_names), exe.kernel_names
    plan, L = exe.plan, WIDE["num_hidden_layers"]
    heads = [plan["pipelines"][c["pipeline"]]["wgsl"].split("var c0_0")[0]   # before the product
             for c, n in zip(plan["commands"], exe.kernel_names) if " gemv q " in n]
    norms = [h for h in heads if "for (var pk" in h]   # q, k, v, gate, up a layer; the head
    assert len(norms) == 5 * L + 1 and sum("dot(" in h for h in norms) == len(norms) - 3
    close(np.stack(rows), hf_logits(model, IDS[:6], sd))


@pytest.mark.parametrize("backend", [WEBGPU])
def test_q4_k_m_decode_with_int8_activations(tmp_path, backend):
    """The same steps with KernelOptions.gemv_q8_dot (codegen/matmul_gemv_q8.py, forced onto
    lavapipe, the norms in the products as above): every product, Q4_K and Q6_K, rounds its
    A to int8 blocks of 32 and multiplies by integer dot products. The logits differ from
    transformers' by that rounding only, within Q8_TOL of the largest logit (the f32 form:
    1e-4), and each step's greedy token is transformers'."""
    from webgrad.backends.webgpu import WebGPUBackend
    from webgrad.codegen import KernelOptions
    be = WebGPUBackend(options=KernelOptions(force_gemv=True, gemv_cpu=False, gemv_prologue=True,
                                             gemv_q8_dot=True))
    model, sd, m, rows = _q4_k_m_steps(tmp_path, be)
    names = m._program("step", 1)._prog.exe.kernel_names
    assert sum(" gemv q " in n and n.endswith(" q8") for n in names) == 7 * WIDE["num_hidden_layers"] + 1, names
    want = hf_logits(model, IDS[:6], sd)
    err = np.abs(np.stack(rows) - want).max() / np.abs(want).max()
    assert 1e-4 < err <= Q8_TOL, f"max error {err:.2e} of the largest logit"
    assert np.array_equal(np.stack(rows).argmax(-1), want.argmax(-1))


# A's int8 rounding moves a product by ~ |W row| |a| / 440 (codegen/matmul_gemv_q8.py), and
# these random weights' logits are small next to |W row| |h| (~ 1 / sqrt(hidden) of it): it
# measured 1.34e-2 of the largest logit on these steps (lavapipe); a min dropped (1.26) or
# A's block scales 1% off (2.81e-2) fail it
Q8_TOL = 2.5e-2


def test_keep_quantized_false_and_split_tables(tmp_path):
    """keep_quantized=False: f32 parameters, the same logits. Token table and head in row
    blocks (as the binding limit splits them) take their blocks' rows."""
    model = hf_model("llama", WIDE)
    path, sd = llama_cpp_gguf(tmp_path, model, "llama", qtype=QT.Q4_K, mix=q4_k_m(2))
    want = hf_logits(model, IDS, sd)
    heard = []
    f32 = llama.Llama.from_gguf(path, backend="reference", keep_quantized=False,
                                progress=lambda done, total: heard.append((done, total)))
    total = sum(t.data.nbytes for n, t in wgg.load(path).tensors.items() if n != "rope_freqs.weight")
    assert heard[-1] == (total, total) and len(heard) == len(sd)
    assert not f32.quant and f32.weight_bytes == 4 * sum(v.size for v in sd.values())
    close(f32.forward(IDS), want)
    m = llama.Llama.from_gguf(path, backend="reference")
    split = llama.Llama(m.cfg, "reference", table_chunks=3, quant=m.quant_full)
    assert sorted(n for n in split.quant if n.startswith("lm_head")) == [
        "lm_head.0.weight", "lm_head.1.weight", "lm_head.2.weight"]
    from webgrad.models import llama_gguf
    tensors = llama_gguf.tensors(wgg.load(path), m.cfg, m.hf_shapes)
    llama.run_blocking(llama_gguf.write_async(split, tensors))
    close(split.forward(IDS), want)
    assert np.array_equal(np.asarray(split.state_dict()["lm_head.weight"]), sd["lm_head.weight"])
    with pytest.raises(ValueError, match="holds .* quantized; f32 weights go into a model built "
                                         "without quant"):
        m.load_state_dict(sd)


@pytest.mark.parametrize("backend", [WEBGPU])
def test_webgpu_reads_the_blocks(tmp_path, backend):
    """Tiny Q8_0 llama (rows of 64) on WebGPU: transformers' logits of gguf's values, with
    the blocks bound and decoded in the kernels: no planned buffer could hold an f32 copy
    of even the smallest matrix."""
    size = dict(SMALL, intermediate_size=64, num_hidden_layers=1, vocab_size=64)
    model = hf_model("llama", size)
    path, sd = llama_cpp_gguf(tmp_path, model, "llama", qtype=QT.Q8_0)
    m = llama.Llama.from_gguf(path, backend=backend)
    assert set(m.quant) == matrices(m)
    ids = [3, 17, 5, 63, 0, 42]
    close(m.forward(ids), hf_logits(model, ids, sd))
    exe = m._program("full", len(ids))._prog.exe
    feeds = set(exe.lowered.feeds.values())
    assert len(exe.plan["buffers"]) > len(m.quant)
    smallest = 4 * min(math.prod(s) for s in m.hf_shapes.values() if len(s) == 2)
    assert all(b["size"] < smallest for k, b in enumerate(exe.plan["buffers"]) if k not in feeds)


@pytest.mark.parametrize("backend", [WEBGPU])
def test_webgpu_blocks_of_an_odd_word_count(tmp_path, backend):
    """A Q8_0 token table of 66 rows of 64 holds 1122 words, not a whole number of 16-byte
    units: the layout kernel's buffer is sized as compiled programs size it (it was 8 bytes
    short, and the first compile refused the shared buffer)."""
    size = dict(SMALL, intermediate_size=64, num_hidden_layers=1, vocab_size=66)
    model = hf_model("llama", size)
    path, sd = llama_cpp_gguf(tmp_path, model, "llama", qtype=QT.Q8_0)
    m = llama.Llama.from_gguf(path, backend=backend)
    assert m.quant["model.embed_tokens.weight"].words % 4 == 2
    ids = [3, 17, 5, 65, 0]
    close(m.forward(ids), hf_logits(model, ids, sd))


# ---------------------------------------------------------------- errors

def test_errors(tmp_path):
    """Unknown architectures, missing metadata, missing / unexpected / mis-shaped tensors:
    each error names the key or the tensors, in llama.cpp's names."""
    model = hf_model("llama_tied")
    path, _ = llama_cpp_gguf(tmp_path, model, "llama_tied")
    f = wgg.load(path)
    good = {k: np.asarray(t.dequantize().tolist(), np.float32).reshape(t.shape)
            for k, t in f.tensors.items()}

    def rewrite(name, arch="llama", drop=(), extra=None):
        def build(w):
            for k, v in f.metadata.items():
                if k.startswith("general.") or k in drop:
                    continue
                k = arch + k[len("llama"):] if k.startswith("llama.") else k
                if isinstance(v, list):
                    w.add_array(k, v)
                elif isinstance(v, float):
                    w.add_float32(k, v)
                elif isinstance(v, int):
                    w.add_uint32(k, v)
                else:
                    w.add_string(k, v)
            for k, v in {**good, **(extra or {})}.items():
                if k not in drop:
                    w.add_tensor(k, v)
        return write(tmp_path, build, arch=arch, name=name)

    def load(p):
        return llama.Llama.from_gguf(p, backend="reference")

    with pytest.raises(wgg.GGUFError, match="'general.architecture' is 'gemma'; Llama.from_gguf "
                                            "supports 'llama', 'qwen2', 'qwen3'"):
        load(rewrite("a.gguf", arch="gemma"))
    with pytest.raises(wgg.GGUFError, match=r"missing: blk.1.attn_k.weight, blk.1.ffn_up.weight"):
        load(rewrite("b.gguf", drop=("blk.1.attn_k.weight", "blk.1.ffn_up.weight")))
    with pytest.raises(wgg.GGUFError, match=r"mis-shaped: blk.0.ffn_gate.weight is \[64, 96\], "
                                            r"expected \[96, 64\]"):
        load(rewrite("c.gguf", extra={"blk.0.ffn_gate.weight": np.zeros((64, 96), np.float32)}))
    with pytest.raises(wgg.GGUFError, match="metadata 'llama.block_count' is missing"):
        load(rewrite("d.gguf", drop=("llama.block_count",)))
    with pytest.raises(wgg.GGUFError, match=r"unexpected: blk.0.attn_qkv.weight"):
        load(rewrite("e.gguf", extra={"blk.0.attn_qkv.weight": np.zeros((4, 64), np.float32)}))
    with pytest.raises(wgg.GGUFError, match=r"tensor 'token_embd.weight' has shape \[100, 32\]; "
                                            r"\[vocab, 64\] expected"):
        load(rewrite("f.gguf", extra={"token_embd.weight": np.zeros((100, 32), np.float32)}))
    bad = good["blk.1.ffn_up.weight"].copy()
    bad[3, 5] = np.nan                     # refused as GPT2.from_gguf and upload_params refuse it
    nan_file = rewrite("n.gguf", extra={"blk.1.ffn_up.weight": bad})
    with pytest.raises(wgg.GGUFError, match=r"tensor 'blk.1.ffn_up.weight': NaN at index \[3, 5\]"):
        load(nan_file)
    m = llama.Llama.from_gguf(nan_file, backend="reference", allow_nonfinite=True)
    assert np.isnan(np.asarray(m.state_dict()["model.layers.1.mlp.up_proj.weight"])).any()
    q3, _ = llama_cpp_gguf(tmp_path, hf_model("llama", WIDE), "llama",
                           mix={"blk.0.ffn_up.weight": QT.Q3_K}, name="h.gguf")
    with pytest.raises(wgg.GGUFError, match=r"tensors blk.0.ffn_up.weight \(Q3_K\) are of a type "
                                            "webgrad cannot decode; supported: F32, F16, BF16"):
        load(q3)
    with pytest.raises(wgg.GGUFError, match="'llama.rope.scaling.type' is 'yarn'; supported"):
        g = rewrite("g.gguf", extra={})
        f2 = wgg.load(g)
        f2.metadata["llama.rope.scaling.type"] = "yarn"
        from webgrad.models import llama_gguf
        llama_gguf.config(f2)
