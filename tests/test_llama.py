"""Llama-family models (webgrad.models.llama) against transformers, one table over the four
model types.

Each row builds a tiny transformers model from a config that turns on what the family is
about (llama: llama3 rope scaling and all biases; mistral: a sliding window shorter than the
text; qwen2: q/k/v bias and tied embeddings; qwen3: q/k norms, head_dim != hidden/heads, one
K/V head), with random weights moved off their defaults (norm gains off 1, biases off 0), in
eval mode and float32. Logits must agree within 1e-4 of the largest logit on the reference,
torch and (where an adapter exists) WebGPU backends; the KV cache must reproduce the full
forward; greedy generate must equal transformers' generate(do_sample=False); files written by
save_pretrained (f32, bf16, sharded) and by save_safetensors must load to the same logits.
"""
from __future__ import annotations

import array
import copy
import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from backends import WEBGPU  # noqa: E402
from webgrad.models import llama  # noqa: E402

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=100, max_position_embeddings=48)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}

# model_type: (config class, model class, config overrides, what LlamaConfig must read)
KINDS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(rope_theta=500000.0, rope_scaling=LLAMA3, attention_bias=True, mlp_bias=True),
              dict(qkv_bias=True, o_bias=True, mlp_bias=True, rope_theta=500000.0)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=5, head_dim=16),
                dict(sliding_window=5, qkv_bias=False)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True, rope_theta=1e6),
              dict(qkv_bias=True, o_bias=False, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=24, num_key_value_heads=1),
              dict(qk_norm=True, head_dim=24, num_key_value_heads=1)),
}
IDS = [3, 17, 5, 99, 0, 42, 7, 8, 61, 11, 2, 30]


def hf_config(kind):
    cname, _, over, _ = KINDS[kind]
    return getattr(transformers, cname)(**{**SMALL, **over})


def hf_model(kind, seed=0):
    torch.manual_seed(seed)
    return perturbed(getattr(transformers, KINDS[kind][1])(hf_config(kind)).eval())


def perturbed(model):
    """model with random weights off their defaults (norm gains off 1, biases off 0)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + torch.randn_like(p) * 0.2)
            elif name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
            else:
                p.copy_(torch.randn_like(p) * 0.08)
    return model


@pytest.fixture(scope="module")
def built():
    cache = {}

    def get(kind):
        if kind not in cache:
            m = hf_model(kind)
            cfg = llama.LlamaConfig.from_hf(m.config.to_dict())
            cache[kind] = m, cfg, {k: v.numpy() for k, v in m.state_dict().items()}
        return cache[kind]
    return get


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def close(got, want, tol=1e-4):
    err = np.abs(np.asarray(got) - want).max() / np.abs(want).max()
    assert err <= tol, f"max error {err:.2e} of the largest logit"


# ---------------------------------------------------------------- (a) the config

@pytest.mark.parametrize("kind", KINDS)
def test_from_hf_reads_each_family(kind, built):
    _, cfg, _ = built(kind)
    assert cfg.model_type == kind and cfg.vocab_size == 100 and cfg.num_hidden_layers == 2
    for field, want in KINDS[kind][3].items():
        assert getattr(cfg, field) == want, field
    assert cfg.n_ctx == 48                           # min(max_position_embeddings, 2048)
    assert llama.LlamaConfig.from_hf(cfg.to_hf(), n_ctx=cfg.n_ctx) == cfg


def test_rope_fields_of_transformers_4_and_5_agree_and_llama3_matches():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    hc = hf_config("llama")
    v5 = hc.to_dict()
    assert "rope_parameters" in v5
    v4 = {k: v for k, v in v5.items() if k != "rope_parameters"}
    v4.update(rope_theta=500000.0, rope_scaling={**LLAMA3, "rope_type": None, "type": "llama3"})
    del v4["rope_scaling"]["rope_type"]
    a, b = llama.LlamaConfig.from_hf(v5), llama.LlamaConfig.from_hf(v4)
    assert a == b and a.rope_scaling["factor"] == 8.0
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](hc, None)
    np.testing.assert_allclose(a.inv_freq(), want.numpy(), rtol=1e-6)


REFUSED = [
    ("llama", {"model_type": "gemma"}, "model_type 'gemma' is not supported; supported: llama"),
    ("llama", {"hidden_act": "gelu"}, "field 'hidden_act' = 'gelu' is not supported; supported: 'silu'"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
     "rope_type 'yarn'; supported: default, llama3"),
    ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}},
     "lacks 'low_freq_factor'"),
    ("llama", {"partial_rotary_factor": 0.5}, "'partial_rotary_factor' = 0.5 is not supported"),
    ("llama", {"quantization_config": {"quant_method": "gptq"}}, "'quantization_config'"),
    ("qwen2", {"use_sliding_window": True}, "field 'use_sliding_window' = True is not supported"),
    ("qwen3", {"layer_types": ["sliding_attention", "full_attention"]}, "field 'layer_types'"),
    ("llama", {"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
    ("llama", {"hidden_size": None}, "field 'hidden_size' is None"),
]


@pytest.mark.parametrize("kind,patch,match", REFUSED)
def test_from_hf_refuses_what_it_cannot_compute(kind, patch, match):
    d = {**hf_config(kind).to_dict(), **patch}
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace("[", r"\[")):
        llama.LlamaConfig.from_hf(d)


# ---------------------------------------------------------------- (b) the model

@pytest.mark.parametrize("backend", ["reference", "torch", WEBGPU])
@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_transformers(kind, backend, built):
    model, cfg, sd = built(kind)
    m = llama.Llama.from_hf_state_dict(cfg, sd, backend=backend)
    close(m.forward(IDS), hf_logits(model, IDS))


@pytest.mark.parametrize("forms", ["cpu", "gpu"])
def test_f16_decoding_with_the_fused_forms(forms, built):
    """precision="f16" decoding of f16 weights with the cache rows written by the products
    forced onto this adapter ("gpu": GPUs' forms too, the workgroup matrix-vector products
    reading the norms, the q rope read by the tiled attention): the attention is fused
    (attn_lse + attn_out; softmax_last none), no write_rows kernel is left, with "gpu" no
    sum kernel either (the norms' sums rounded to f16 by their products:
    fusion_prologue._rounded_sum); each cached step's logits equal the full forward's at
    its position, and greedy generate equals the reference executor's f16 program's."""
    from collections import Counter
    gpu = dict(force_gemv=True, gemv_cpu=False, force_direct=False, gemv_prologue=True,
               attn_q_expr=True, attn_tiled=True) if forms == "gpu" else {}
    be = _forced_backend(write_rows_epilogue=True, write_rows_join=True, **gpu)
    if not be.limits.shader_f16:
        pytest.skip("the adapter has no shader-f16")
    from webgpu_helpers import f16_cached_decode
    _, cfg, sd = built("llama")
    names = f16_cached_decode(
        lambda b: llama.Llama.from_hf_state_dict(cfg, sd, backend=b, dtype="f16"), be, IDS,
        prompt=5, new=6)
    kinds = Counter(n.split(" ")[0] for n in names)
    layers = cfg.num_hidden_layers
    assert kinds["attn_lse"] == kinds["attn_out"] == layers and "softmax_last" not in kinds, names
    assert not any(k.startswith("write_rows") for k in kinds), names
    assert ("sum" in kinds) == (forms == "cpu"), names


@pytest.mark.parametrize("backend", ["reference", "torch", WEBGPU])
def test_f16_weights_match_transformers_half_weights(backend, built):
    """dtype="f16" holds every weight rounded to f16 (half the bytes on the CPU executors)
    and computes in f32: transformers' model with its weights rounded by .half() and widened
    back gives the same logits; the weights read back are exactly those f16 values."""
    import copy
    model, cfg, sd = built("llama")
    m = llama.Llama.from_hf_state_dict(cfg, sd, backend=backend, dtype="f16")
    half = copy.deepcopy(model).half().float()
    close(m.forward(IDS), hf_logits(half, IDS))
    got = m.state_dict()["model.layers.0.mlp.up_proj.weight"]
    want = half.state_dict()["model.layers.0.mlp.up_proj.weight"].numpy()
    np.testing.assert_array_equal(np.asarray(got), want)
    assert np.abs(want - sd["model.layers.0.mlp.up_proj.weight"]).max() > 0  # it did round


def test_state_dict_values_of_every_kind_and_the_tied_head(built):
    model, cfg, _ = built("qwen2")
    raw = model.state_dict()
    assert "lm_head.weight" in raw                  # listed though tied: ignored
    sd = {}
    for k, (name, v) in enumerate(raw.items()):
        a = v.numpy()
        sd[name] = (v, array.array("f", a.reshape(-1).tolist()), memoryview(np.ascontiguousarray(a)),
                    a.astype(np.float16).astype(np.float32))[k % 4]
    m = llama.Llama.from_hf_state_dict(cfg, sd, backend="reference")
    close(m.forward(IDS), hf_logits(model, IDS), tol=2e-3)   # a quarter rounded through f16


def test_state_dict_errors_list_every_bad_name(built):
    _, cfg, sd = built("llama")
    bad = dict(sd)
    del bad["model.layers.1.mlp.up_proj.weight"], bad["model.norm.weight"]
    bad["model.layers.0.self_attn.rotary.weight"] = np.zeros(3, np.float32)
    bad["model.layers.0.self_attn.k_proj.weight"] = sd["model.layers.0.self_attn.k_proj.weight"].T
    with pytest.raises(ValueError) as e:
        llama.Llama.from_hf_state_dict(cfg, bad, backend="reference")
    msg = str(e.value)
    for part in ("missing: model.layers.1.mlp.up_proj.weight, model.norm.weight",
                 "unexpected: model.layers.0.self_attn.rotary.weight",
                 "mis-shaped: model.layers.0.self_attn.k_proj.weight is [64, 32], expected [32, 64]"):
        assert part in msg, msg
    no_head = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    with pytest.raises(ValueError, match="is tie_word_embeddings true"):
        llama.Llama.from_hf_state_dict(cfg, no_head, backend="reference")


@pytest.mark.parametrize("kind", ["llama", "qwen2"])          # an own head, a tied one
def test_tables_split_in_row_blocks_give_the_same_model(kind, built):
    """WebGPU's binding limit may need the token table (and head) in row blocks."""
    model, cfg, sd = built(kind)
    whole = llama.Llama.from_hf_state_dict(cfg, sd, backend="reference")
    split = llama.Llama(cfg, "reference", table_chunks=3)
    split.load_state_dict(sd)
    assert "model.embed_tokens.2.weight" in split.shapes
    assert ("lm_head.2.weight" in split.shapes) == (kind == "llama")
    np.testing.assert_allclose(split.forward(IDS), whole.forward(IDS), atol=1e-5, rtol=0)
    assert split.generate(IDS[:4], max_new_tokens=6, temperature=0) == \
        whole.generate(IDS[:4], max_new_tokens=6, temperature=0)
    np.testing.assert_allclose(split.surprisal(IDS).bits, whole.surprisal(IDS).bits, atol=1e-5)
    back = split.state_dict()
    assert set(back) == set(whole.state_dict())
    np.testing.assert_array_equal(back["model.embed_tokens.weight"], sd["model.embed_tokens.weight"])


# ---------------------------------------------------------------- (c) the cache, decoding

@pytest.mark.parametrize("backend", ["reference", "torch", WEBGPU])
@pytest.mark.parametrize("kind", KINDS)
def test_cached_decoding_equals_the_full_forward(kind, backend, built):
    _, cfg, sd = built(kind)
    m = llama.Llama.from_hf_state_dict(cfg, sd, backend=backend)
    full = np.asarray(m.forward(IDS))
    cache = m.new_cache()
    rows = [np.asarray(m.logits_step(IDS[:1], cache))]
    rows += list(np.asarray(m.logits_all_step(IDS[1:6], cache)))      # a chunk onto a cache
    rows += [np.asarray(m.logits_step([t], cache)) for t in IDS[6:]]
    assert len(cache) == len(IDS)
    close(np.stack(rows), full)


def _forced_backend(**options):
    """A native WebGPU backend whose programs take the kernel forms `options` (codegen
    KernelOptions fields) ask for; the test skips where there is no adapter."""
    pytest.importorskip("wgpu")
    from webgrad.backends.webgpu import WebGPUBackend
    from webgrad.codegen import KernelOptions
    try:
        return WebGPUBackend(options=KernelOptions(**options))
    except Exception as e:
        pytest.skip(f"no WebGPU adapter: {e}")


def _greedy_equals_transformers(m, model, new: int = 6):
    """webgrad's greedy generate after IDS[:5] equals transformers' generate."""
    prompt = IDS[:5]
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 5, dtype=torch.long),
                              max_new_tokens=new, do_sample=False)[0].tolist()
    assert m.generate(prompt, max_new_tokens=new, temperature=0) == want


def _cached_rows(cfg, sd, backend):
    """The model on `backend` and its cached logits for IDS[:8]: a chunk of 3, then one id a
    step."""
    m = llama.Llama.from_hf_state_dict(cfg, sd, backend=backend)
    cache = m.new_cache()
    rows = list(np.asarray(m.logits_all_step(IDS[:3], cache)))
    rows += [np.asarray(m.logits_step([t], cache)) for t in IDS[3:8]]
    return m, rows


@pytest.mark.parametrize("form", ["workgroup", "cpu"])
@pytest.mark.parametrize("kind", ["llama"])   # every bias, llama3 rope scaling
def test_decoding_through_the_matrix_vector_kernel(kind, form, built):
    """Decoding's products (a few rows of C) through the matrix-vector kernel, forced onto
    this adapter in either form (matmul_gemv.py, GPUs' default; matmul_gemv_cpu.py, CPU
    adapters'): the cached steps equal transformers' logits at every position, one id at a
    time and a chunk of 3."""
    be = _forced_backend(force_gemv=True, gemv_cpu=form == "cpu")
    model, cfg, sd = built(kind)
    m, rows = _cached_rows(cfg, sd, be)
    names = m._program("step", 1)._prog.exe.kernel_names
    assert sum(" gemv " in n for n in names) >= 7 * cfg.num_hidden_layers, names
    assert all((" gemv cpu " in n) == (form == "cpu") for n in names if " gemv " in n), names
    close(np.stack(rows), hf_logits(model, IDS[:8]))


@pytest.mark.parametrize("kind", ["llama", "qwen3"])   # GQA 2 query heads a K/V head; 4, head 24
def test_decoding_through_the_split_kernels(kind, built):
    """Decoding's attention over chunks of keys (codegen/attention_split.py) and its argmax
    over chunks of the vocabulary (reduce.py), GPUs' forms forced onto this adapter (chunks
    of 16 keys and 16 logits, so that this cache of 48 and vocabulary of 100 split): the
    cached steps equal transformers' logits, and greedy generate equals its generate."""
    be = _forced_backend(attn_split=True, attn_split_chunk=16, argmax_split=True, argmax_chunk=8)
    model, cfg, sd = built(kind)
    m, rows = _cached_rows(cfg, sd, be)
    for T in (1, 3):
        names = m._program("step", T)._prog.exe.kernel_names
        assert sum(" split 3x16 (pass 1)" in n for n in names) == cfg.num_hidden_layers, names
    close(np.stack(rows), hf_logits(model, IDS[:8]))
    _greedy_equals_transformers(m, model)
    assert "argmax_last (pass 2)" in m._program("step", 1)._prog.exe.kernel_names


@pytest.mark.parametrize("kind", KINDS)
def test_decoding_with_the_norms_in_the_products(kind, built):
    """Decoding's RMSNorms summed and applied by the matrix-vector products that read them
    (fusion's rule 8, codegen/gemv_prologue.py; GPUs' default), forced onto this adapter
    with the products' workgroup form: no `sum` kernel is left in a step (Qwen3's q/k
    norms feed rope, not a product: theirs stay), the cached steps equal transformers'
    logits (3 rows a product, then 1), and greedy generate equals its generate."""
    be = _forced_backend(force_gemv=True, gemv_prologue=True)
    model, cfg, sd = built(kind)
    m, rows = _cached_rows(cfg, sd, be)
    for T in (1, 3):
        names = m._program("step", T)._prog.exe.kernel_names
        sums = 2 * cfg.num_hidden_layers if cfg.qk_norm else 0
        assert sum(n.split(" ")[0] == "sum" for n in names) == sums, names
    close(np.stack(rows), hf_logits(model, IDS[:8]))
    _greedy_equals_transformers(m, model)


@pytest.mark.parametrize("tiled", [True, False])
@pytest.mark.parametrize("kind", KINDS)
def test_decoding_with_the_queries_read_by_the_attention(kind, tiled, built):
    """Decoding's q rope read as an expression by the attention kernel (GPUs' default,
    fusion_storage._query_expr), forced onto this adapter with the tiled attention kernels
    (GPUs') or the row ones (CPU adapters'): one elementwise kernel fewer a layer (none
    where a sliding window leaves attention unfused: Mistral's), the cached steps equal
    transformers' logits (3 rows, then 1), and greedy generate equals its generate."""
    be = _forced_backend(attn_q_expr=True, attn_tiled=tiled)
    plain = _forced_backend(attn_q_expr=False, attn_tiled=tiled)
    model, cfg, sd = built(kind)
    m, rows = _cached_rows(cfg, sd, be)
    p = llama.Llama.from_hf_state_dict(cfg, sd, backend=plain)
    for T in (1, 3):
        names = m._program("step", T)._prog.exe.kernel_names
        before = p._program("step", T)._prog.exe.kernel_names
        att = sum(n.startswith("attn_out") for n in names)   # none: a sliding window's
        assert att == (0 if cfg.sliding_window else cfg.num_hidden_layers), names   # matmuls
        assert all((" tiled " in n) == tiled for n in names if n.startswith("attn_out")), names
        assert len(before) - len(names) == att, (names, before)
    close(np.stack(rows), hf_logits(model, IDS[:8]))
    _greedy_equals_transformers(m, model)


@pytest.mark.parametrize("forms,join", [("cpu", True), ("gpu", True), ("gpu", False)])
@pytest.mark.parametrize("kind", ["llama", "qwen3"])   # v_proj's bias in its epilogue; 1 K/V head of 24
def test_decoding_with_the_cache_rows_written_by_the_products(kind, forms, join, built):
    """Decoding's V cache rows stored by v_proj's epilogue at the run-time position, and
    K's (rotated: other columns of k_proj) by the same epilogue (fusion rule 9, GPUs'
    default; join=False: K's by its write_rows kernel), forced onto this adapter with its
    own kernel forms (the CPU matrix-vector and barrier-free products) or GPUs' (the
    workgroup matrix-vector and tiled products, norms and q rope read by their readers):
    no write_rows kernel is left (one a layer without the join), 2 kernels a layer fewer
    than with write_rows_epilogue=False (1), at 1, 3 and 6 rows a step; the cached steps
    (a chunk of 6 onto an empty cache, one of 3, then one id a step) equal transformers'
    logits, and greedy generate equals its generate."""
    gpu = dict(force_gemv=True, gemv_cpu=False, force_direct=False, gemv_prologue=True,
               attn_q_expr=True, attn_tiled=True) if forms == "gpu" else {}
    be = _forced_backend(write_rows_epilogue=True, write_rows_join=join, **gpu)
    plain = _forced_backend(write_rows_epilogue=False, **gpu)
    model, cfg, sd = built(kind)
    m = llama.Llama.from_hf_state_dict(cfg, sd, backend=be)
    cache = m.new_cache()
    rows = list(np.asarray(m.logits_all_step(IDS[:6], cache)))
    rows += list(np.asarray(m.logits_all_step(IDS[6:9], cache)))
    rows += [np.asarray(m.logits_step([t], cache)) for t in IDS[9:]]
    p = llama.Llama.from_hf_state_dict(cfg, sd, backend=plain)
    layers = cfg.num_hidden_layers
    form = {1: " gemv 8x32 ", 6: " tile "} if gpu else {1: " gemv cpu ", 6: " direct "}
    for T in (1, 3, 6):
        names = m._program("step", T)._prog.exe.kernel_names
        before = p._program("step", T)._prog.exe.kernel_names
        assert T == 3 or any(form[T] in n for n in names if n.startswith("matmul")), names
        assert sum(n.startswith("write_rows") for n in names) == (0 if join else layers), names
        assert sum(n.startswith("write_rows") for n in before) == 2 * layers, before
        assert len(before) - len(names) == (2 if join else 1) * layers, (names, before)
    close(np.stack(rows), hf_logits(model, IDS))
    _greedy_equals_transformers(m, model)


def test_h200_decode_step_reads_the_norms_in_its_products():
    """A Llama-3.2-1B-shaped decode step (hidden 2048, 16 layers, 32 / 8 heads,
    intermediate 8192, vocabulary 128256; the graph only, no weights) lowered for an H200:
    its 33 RMSNorms (2 a layer and the final one) were a `sum` kernel and an elementwise
    kernel each, 247 kernels in all (bench/llama_decode.py measured them so); rule 8 leaves
    181 (no sum, 18 elementwise: the rotary angles' cos and sin and each layer's q rope).
    The attention kernels read q rope as an expression (fusion_storage._query_expr): 165,
    the 2 elementwise kernels of cos and sin left. Each layer's V cache row is stored by
    v_proj's epilogue (fusion rule 9), and K's rotated row too (its rope reads k_proj's
    output at other columns, done by then): 133, no write_rows kernel.
    KernelOptions(write_rows_join=False) leaves K's write_rows kernels (149),
    write_rows_epilogue=False gives the 165 back, with attn_q_expr=False the 181, with
    gemv_prologue=False the 247, and a CPU adapter keeps its kernels."""
    from collections import Counter
    from dataclasses import replace
    from webgrad import ops
    from webgrad.codegen import KernelOptions, Limits, lower
    from webgrad.compile import parse_inputs
    from webgrad.dce import dce
    from webgrad.ir import Graph
    from webgrad.models.decoding import head_stats
    from webgrad.trace import cse, trace
    cfg = llama.LlamaConfig.from_hf(dict(
        model_type="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=8192, vocab_size=128256,
        max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True))

    def step(m, f):   # decoding._build_program's "step", T = 1
        blocks = llama.head(m, llama.cached_hidden(m, f["ids"], f["pos"], cfg))
        lasts = [(ops.reshape(ops.slice(b, 0, 0, 1), (b.shape[-1],)), a) for b, a in blocks]
        return {**{f"logits.{k}": b for k, (b, _) in enumerate(blocks)}, "next": head_stats(lasts)[2]}
    g = Graph(training=False)
    _, outs = trace(g, lambda: llama.LlamaModule(cfg), step,
                    parse_inputs({"ids": ([1], "i32"), "pos": ([1], "i32")}), 0)
    g.outputs.update((k, v.id) for k, v in outs.items())
    g = dce(cse(g))
    h200 = Limits(adapter="NVIDIA H200 (DiscreteGPU)", max_storage_buffer_binding_size=(1 << 32) - 4,
                  max_buffer_size=1 << 40, max_compute_workgroup_storage_size=49152, subgroups=True,
                  max_storage_buffers_per_shader_stage=16)   # Dawn's, as measured
    low, names = lower(g, h200)
    kinds = Counter(n.split(" ")[0] for n in names)
    assert len(names) == 133 and "sum" not in kinds and kinds["elementwise"] == 2, kinds
    assert "write_rows_in_place" not in kinds and sum(" gemv " in n for n in names) == 7 * 16 + 1
    for x in "kv":   # each layer's cache: written by a product, read by the attention
        caches = {low.persistent[f"kv.{i}.{x}"] for i in range(16)}
        by_cache = Counter(n.split(" ")[0] for n, c in zip(names, low.plan["commands"])
                           if caches & set(c["bindings"]))
        assert by_cache == {"matmul": 16, "attn_out": 16}, (x, by_cache)
    lk, names_k = lower(g, replace(h200, options=KernelOptions(write_rows_join=False)))
    k = Counter(n.split(" ")[0] for n in names_k)
    assert sum(k.values()) == 149 and k["write_rows_in_place"] == 16, k
    ab = KernelOptions(write_rows_epilogue=False)
    lq, names_q = lower(g, replace(h200, options=ab))
    q = Counter(n.split(" ")[0] for n in names_q)
    assert sum(q.values()) == 165 and q["write_rows_in_place"] == 32, q
    # the cost model's bytes (codegen/cost.py): a write_rows kernel moves its row, not its
    # cache: V's reads v [512] and pos and writes 512, K's reads cos and sin [64] too;
    # in the epilogue, v's 2 KiB write and read a layer are gone (and 16 reads of pos)
    assert {k["bytes"] for k in lq.kernels if k["name"].startswith("write_rows")} == \
        {4 * (512 + 1 + 512), 4 * (512 + 2 * 64 + 1 + 512)}
    total = [sum(k["bytes"] for k in x.kernels) for x in (lq, lk, low)]
    assert total[0] - total[1] == 16 * 4 * (2 * 512) and total[1] - total[2] == 16 * 4, total
    rope = lower(g, replace(h200, options=replace(ab, attn_q_expr=False)))[1]
    assert len(rope) == 181 and Counter(n.split(" ")[0] for n in rope)["elementwise"] == 18
    before = lower(g, replace(h200, options=replace(ab, gemv_prologue=False, attn_q_expr=False)))[1]
    assert len(before) == 247 and Counter(n.split(" ")[0] for n in before)["sum"] == 33
    cpu = Limits(adapter="llvmpipe (LLVM 15.0.6, 256 bits) (CPU)", cpu=True,
                 max_storage_buffer_binding_size=1 << 31, max_buffer_size=1 << 40)
    on_cpu = Counter(n.split(" ")[0] for n in lower(g, cpu)[1])
    assert on_cpu["sum"] == 33 and on_cpu["write_rows_in_place"] == 32, on_cpu


def test_h200_f16_decode_steps_have_the_f32_steps_kernels():
    """precision="f16" decode steps of f16 weights, lowered as the WebGPU backend lowers
    them (f16_in_f32, shader-f16) for an H200: GPT-2 124M's took 226 kernels to the f32
    step's 116 (the cached attention unfused, 24 write_rows kernels, two copies of each
    cache a step and 62 more elementwise kernels), a Llama-3.2-1B-shaped step of 2 layers
    53 to 23. Now the attention is fused (its mask reads the position rounded to f16,
    exact for a cache of at most 2049 rows), no layout op or cache write is rounded again
    (precision.py), c_attn writes GPT-2's cache rows through the cast, and the products
    read the norms' rounded sums: the f32 kernels and, per layer, the attn_lse that
    f16's rounded probabilities need (attention_match), with WebGPU's default 8 storage
    buffers a kernel one elementwise kernel more for GPT-2 (the first LayerNorm's affine)
    and Llama's q rope kernels (attn_out with the lse binds one buffer more than the
    budget); with Dawn's 16 (as measured on the H200) only the attn_lse."""
    from collections import Counter
    from dataclasses import replace
    from webgrad.codegen import Limits, lower
    from webgrad.models import gpt2
    from webgrad.precision import f16_in_f32
    h200 = Limits(adapter="NVIDIA H200 (DiscreteGPU)", max_storage_buffer_binding_size=(1 << 32) - 4,
                  max_buffer_size=1 << 40, max_compute_workgroup_storage_size=49152, subgroups=True)
    lcfg = llama.LlamaConfig.from_hf(dict(
        model_type="llama", hidden_size=2048, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=8192, vocab_size=32000,
        max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True))

    def kinds(make, dtype, buffers):
        m = make(dtype)   # the graph only: zero weights on the reference executor
        m.precision = dtype
        g = m._program("step", 1).ir
        half = [n for n, i in g.params.items() if g[i].dtype == "f16"]
        limits = replace(h200, shader_f16=dtype == "f16", max_storage_buffers_per_shader_stage=buffers)
        names = lower(f16_in_f32(g), limits, half_names=half)[1]
        return Counter(n.split(" ")[0] for n in names)
    models = {
        "gpt2": (lambda dt: gpt2.GPT2(gpt2.GPT2Config(12, 12, 768, 1024, 50257, 1e-5, 50256),
                                      backend="reference", wte_chunks=1, dtype=dt), 12),
        "llama": (lambda dt: llama.Llama(lcfg, backend="reference", dtype=dt), 2)}
    extra = {("gpt2", 8): {"elementwise": 1}, ("llama", 8): {"elementwise": 2}}
    for name, (make, layers) in models.items():
        for buffers in (8, 16):
            f32, f16 = kinds(make, "f32", buffers), kinds(make, "f16", buffers)
            want = f32 + Counter({"attn_lse": layers, **extra.get((name, buffers), {})})
            assert f16 == want, (name, buffers, f16, f32)
            assert "softmax_last" not in f16 and f16["attn_out"] == layers
    assert sum(kinds(models["gpt2"][0], "f16", 8).values()) == 129
    assert sum(kinds(models["llama"][0], "f16", 8).values()) == 27


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_generate_equals_transformers(kind, built):
    model, cfg, sd = built(kind)
    m = llama.Llama.from_hf_state_dict(cfg, sd, backend="reference")
    prompt = IDS[:5]
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 5, dtype=torch.long),
                              max_new_tokens=12, do_sample=False)[0].tolist()
    got = m.generate(prompt, max_new_tokens=12, temperature=0)
    assert got == want
    assert list(m.generate_stream(prompt, max_new_tokens=12, temperature=0)) == want[5:]


def test_sampling_is_seeded_and_stops_at_eos_and_context(built):
    _, cfg, sd = built("qwen3")
    m = llama.Llama.from_hf_state_dict(cfg, sd, backend="reference")
    a = m.generate(IDS[:3], max_new_tokens=6, temperature=0.9, top_k=20, top_p=0.9, seed=4)
    assert a == m.generate(IDS[:3], max_new_tokens=6, temperature=0.9, top_k=20, top_p=0.9, seed=4)
    assert a[3:] == list(m.generate_stream(IDS[:3], max_new_tokens=6, temperature=0.9, top_k=20,
                                           top_p=0.9, seed=4))
    assert len(m.generate(IDS[:3], max_new_tokens=100, temperature=0)) == cfg.n_ctx
    first = m.generate(IDS[:3], max_new_tokens=1, temperature=0)[-1]
    import dataclasses
    stop = llama.Llama.from_hf_state_dict(dataclasses.replace(cfg, eos_token_id=[first, 1]), sd,
                                          backend="reference")
    assert stop.generate(IDS[:3], max_new_tokens=5, temperature=0) == IDS[:3] + [first]
    with pytest.raises(ValueError, match="ids is text; pass token ids"):
        m.generate("hello")
    with pytest.raises(ValueError, match="exceed n_ctx=48"):
        m.forward(list(range(49)))


@pytest.mark.parametrize("kind", KINDS)
def test_surprisal_is_the_log_softmax_in_bits(kind, built):
    model, cfg, sd = built(kind)
    m = llama.Llama.from_hf_state_dict(cfg, sd, backend="reference")
    logp = torch.log_softmax(torch.tensor(hf_logits(model, IDS)), -1)
    s = m.surprisal(IDS)
    assert s.bits[0] == 0 and s.top[0] == -1
    for i in range(1, len(IDS)):
        assert abs(s.bits[i] + logp[i - 1, IDS[i]].item() / math.log(2)) < 1e-4
        assert s.top[i] == int(logp[i - 1].argmax())
    tracker = m.surprisal_tracker()
    np.testing.assert_allclose(tracker.update(IDS).bits, s.bits, atol=1e-4)


# ---------------------------------------------------------------- (d) files

@pytest.mark.parametrize("how", ["f32", "bf16", "f16", "sharded"])
def test_from_pretrained_reads_save_pretrained(how, built, tmp_path):
    kind = {"f32": "llama", "bf16": "qwen3", "f16": "mistral", "sharded": "qwen2"}[how]
    model, _, _ = built(kind)
    if how in ("bf16", "f16"):         # half-exact weights; the reference computes in f32
        dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[how]
        model = hf_model(kind)         # (casting the model itself would round rope's inv_freq)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(dtype).float())
        copy.deepcopy(model).to(dtype).save_pretrained(tmp_path)
        from webgrad.io import safetensors as st
        assert {t.dtype for t in st.load(tmp_path / "model.safetensors").values()} == {how.upper()}
    else:
        model.save_pretrained(tmp_path, max_shard_size="40KB" if how == "sharded" else "5GB")
        gen = json.loads((tmp_path / "generation_config.json").read_text())
        (tmp_path / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [5, 7]}))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert ("model.safetensors.index.json" in files) == (how == "sharded"), files
    heard = []
    m = llama.Llama.from_pretrained(tmp_path, backend="reference",
                                    progress=lambda done, total: heard.append((done, total)))
    assert heard[-1][0] == heard[-1][1] and len(heard) == len(m.shapes)
    if how in ("f32", "sharded"):
        assert m.cfg.eos_ids == {5, 7}
    close(m.forward(IDS), hf_logits(model, IDS))


def _half_folder(tmp_path, dtype, *, nan_at=None):
    """A bf16/f16 save_pretrained folder of the qwen2 row (tied table), the table's values
    salted with the bit patterns a widening can get wrong (subnormals, -0, the largest
    finite, the smallest normal), or a NaN at `nan_at` of q_proj."""
    model = hf_model("qwen2")
    bits = {torch.bfloat16: [0x0001, 0x807F, 0x8000, 0x7F7F, 0x0080, 0xFF7F],
            torch.float16: [0x0001, 0x83FF, 0x8000, 0x7BFF, 0x0400, 0xFBFF]}[dtype]
    half = copy.deepcopy(model).to(dtype)
    with torch.no_grad():
        table = half.model.embed_tokens.weight
        table.view(-1)[:len(bits)].view(torch.int16).copy_(
            torch.tensor(bits, dtype=torch.int32).to(torch.int16))
        if nan_at is not None:
            half.model.layers[1].self_attn.q_proj.weight[nan_at] = float("nan")
    half.save_pretrained(tmp_path)
    from safetensors.torch import load_file
    return {k: v.float() for k, v in load_file(tmp_path / "model.safetensors").items()}


@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("half", ["bf16", "f16"])
@pytest.mark.parametrize("backend", [WEBGPU])
def test_from_pretrained_widens_half_files_on_the_gpu(backend, half, chunks, tmp_path, monkeypatch):
    """A bf16/f16 folder on WebGPU: its bytes go up as they are and a kernel widens them;
    the weights read back from the GPU equal torch's .float() of the same file bit for bit
    (with the token table in 3 row blocks too), and no f32 copy is made on the host."""
    from webgrad.models import llama_weights
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[half]
    want = _half_folder(tmp_path, dtype)
    if chunks > 1:
        monkeypatch.setattr(llama, "chunks_for", lambda *a: chunks)

    def no_host(*a):
        raise AssertionError("widened on the host")
    monkeypatch.setattr(llama_weights, "to_f32", no_host)
    m = llama.Llama.from_pretrained(tmp_path, backend=backend)
    assert m.table_chunks == chunks
    got = m.state_dict()
    for name, w in want.items():
        if name == "lm_head.weight":
            continue
        g = np.ascontiguousarray(np.asarray(got[name], dtype=np.float32)).view(np.uint32)
        np.testing.assert_array_equal(g.reshape(w.shape), w.numpy().view(np.uint32), err_msg=name)


@pytest.mark.parametrize("backend", [WEBGPU])
def test_from_pretrained_refuses_a_nan_half_weight_on_the_gpu(backend, tmp_path):
    _half_folder(tmp_path, torch.bfloat16, nan_at=(3, 5))
    with pytest.raises(ValueError, match=r"model.layers.1.self_attn.q_proj.weight.*NaN at index \[3, 5\]"):
        llama.Llama.from_pretrained(tmp_path, backend=backend)


def test_half_nonfinite_scan_with_and_without_numpy(tmp_path, monkeypatch):
    """StoredTensor.first_nonfinite on F16/BF16 bits (numpy) agrees with the f32 scan."""
    from webgrad.io import safetensors as st
    from webgrad import arrays
    for dtype, name in ((torch.bfloat16, "BF16"), (torch.float16, "F16")):
        x = torch.randn(3000).to(dtype)
        for at, bad in ((None, None), (2999, float("inf")), (1234, float("nan")), (7, -float("inf"))):
            y = x.clone()
            if at is not None:
                y[at] = bad
            t = st.StoredTensor(name, y.shape, y.view(torch.int16).numpy().tobytes())
            assert t.first_nonfinite() == at, (name, at)
            with monkeypatch.context() as mp:
                mp.setattr(st, "numpy_or_none", lambda: None)
                mp.setattr(arrays, "numpy_or_none", lambda: None)
                assert t.first_nonfinite() == at, (name, at, "no numpy")


def test_from_pretrained_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        llama.Llama.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(hf_config("llama").to_dict()))
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor"):
        llama.Llama.from_pretrained(tmp_path)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_save_safetensors_round_trips(kind, built, tmp_path):
    model, cfg, sd = built(kind)
    m = llama.Llama.from_hf_state_dict(cfg, sd, backend="reference")
    want = np.asarray(m.forward(IDS))
    path = tmp_path / "model.safetensors"
    m.save_safetensors(path)
    back = llama.Llama.from_safetensors(path, backend="reference")
    assert back.cfg == cfg
    np.testing.assert_array_equal(np.asarray(back.forward(IDS)), want)
    assert llama.Llama.from_safetensors(m.save_safetensors(), backend="reference").cfg == cfg
    m.save_pretrained(tmp_path / "hf")                      # transformers reads it back
    hf = getattr(transformers, KINDS[kind][1]).from_pretrained(tmp_path / "hf").eval()
    close(want, hf_logits(hf, IDS))


@pytest.mark.parametrize("backend", [WEBGPU])
def test_webgpu_fuses_the_grouped_attention(backend, built):
    """GQA is written as queries [Hkv, rep, T, Dh] against K/V [Hkv, 1, S, Dh], which the
    attention pass fuses (no [.., T, S] scores stored) in the full forward and the steps."""
    _, cfg, sd = built("qwen3")                      # 4 query heads per K/V head
    m = llama.Llama.from_hf_state_dict(cfg, sd, backend=backend)
    m.forward(IDS)
    c = m.new_cache()
    m.logits_step(IDS[:3], c)
    m.logits_step([1], c)
    for key in (("full", len(IDS)), ("step_last", 3), ("step", 1)):   # (decoding.step_kind)
        names = m._programs[key]._prog.exe.kernel_names
        assert sum(n.startswith("attn") for n in names) == cfg.num_hidden_layers, names
        assert not any(n.startswith("softmax") for n in names), names
