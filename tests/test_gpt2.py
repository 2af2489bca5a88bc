"""GPT-2 against transformers' GPT2LMHeadModel, and the KV cache against the full forward.

Weights are random with layer norms and biases moved off their defaults (so a dropped bias
or a swapped gain shows), loaded through from_hf_state_dict. Logits must agree within 1e-4
of the largest logit. The cache tests compare cached decoding (one token at a time, and in
chunks onto a non-empty cache) with the full forward at every position, and surprisal with
the decode path (the forge-ml test, ported).
"""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from webgrad.models import gpt2  # noqa: E402
from webgrad.models import sampling  # noqa: E402

BACKENDS = ["reference", "webgpu"]


def _webgpu_ok():
    try:
        from webgrad.backends.webgpu import WebGPUBackend
        WebGPUBackend()
        return True
    except Exception:
        return False


def backend_param(name):
    if name == "webgpu" and not _webgpu_ok():
        return pytest.param(name, marks=pytest.mark.skip("no WebGPU adapter"))
    return name


def hf_model(cfg: gpt2.GPT2Config, seed: int):
    hcfg = transformers.GPT2Config(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                                   n_positions=cfg.n_ctx, vocab_size=cfg.vocab_size,
                                   layer_norm_epsilon=cfg.layer_norm_epsilon,
                                   activation_function="gelu_new", resid_pdrop=0.0,
                                   embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(hcfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
            elif ".ln_" in name:                 # layer norm gains away from 1
                p.copy_(1 + torch.randn_like(p) * 0.2)
            else:
                p.copy_(torch.randn_like(p) * 0.08)
    return model


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def close(got, want, tol=1e-4):
    err = np.abs(np.asarray(got) - want).max() / np.abs(want).max()
    assert err <= tol, f"max error {err:.2e} of the largest logit"


def state_dict(model, kind: str):
    """The state dict as the values a user may hold: numpy, array.array or memoryview."""
    import array
    out = {}
    for k, (name, v) in enumerate(model.state_dict().items()):
        a = v.numpy()
        out[name if k % 2 else name[len("transformer."):] if name.startswith("transformer.") else name] = (
            a if kind == "numpy" else array.array("f", a.reshape(-1).tolist())
            if kind == "array" else memoryview(np.ascontiguousarray(a)))
    return out


CONFIGS = [
    gpt2.GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=32, vocab_size=11, layer_norm_epsilon=1e-5),
    gpt2.GPT2Config(n_layer=1, n_head=4, n_embd=32, n_ctx=16, vocab_size=50, layer_norm_epsilon=1e-3),
    gpt2.GPT2Config(n_layer=3, n_head=3, n_embd=48, n_ctx=20, vocab_size=97, layer_norm_epsilon=1e-5),
]


@pytest.mark.parametrize("backend", [backend_param(b) for b in BACKENDS])
@pytest.mark.parametrize("k", range(len(CONFIGS)))
def test_logits_match_transformers(k, backend):
    cfg = CONFIGS[k]
    ref = hf_model(cfg, seed=k)
    kind = ("numpy", "array", "memoryview")[k]
    m = gpt2.GPT2.from_hf_state_dict(cfg, state_dict(ref, kind), backend=backend)
    rng = random.Random(k)
    ids = [rng.randrange(cfg.vocab_size) for _ in range(cfg.n_ctx - 3)]
    close(m.forward(ids), hf_logits(ref, ids))
    # the cached path too, in two chunks
    c = m.new_cache()
    a = m.logits_all_step(ids[:5], c)
    b = m.logits_all_step(ids[5:], c)
    close(np.concatenate([a, b]), hf_logits(ref, ids))


# on WebGPU (lavapipe) it took 80 s on a slower machine with an empty shader cache: slow cases
@pytest.mark.parametrize("backend", ["reference", "torch",
                                     pytest.param("webgpu", marks=pytest.mark.slow)
                                     if _webgpu_ok() else backend_param("webgpu")])
def test_f16_weights_match_transformers_half_weights(backend):
    """dtype="f16": the weights held rounded to f16, the maths in f32, against transformers'
    model whose weights .half() rounded (and widened back), in the full and cached paths."""
    import copy
    cfg = CONFIGS[0]
    ref = hf_model(cfg, seed=5)
    m = gpt2.GPT2.from_hf_state_dict(cfg, state_dict(ref, "numpy"), backend=backend, dtype="f16")
    half = copy.deepcopy(ref).half().float()
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    close(m.forward(ids), hf_logits(half, ids))
    c = m.new_cache()
    close(np.concatenate([m.logits_all_step(ids[:4], c), m.logits_all_step(ids[4:], c)]),
          hf_logits(half, ids))
    assert np.abs(hf_logits(half, ids) - hf_logits(ref, ids)).max() > 1e-4  # it did round
    # an f16 inference program (precision="f16") against transformers' all-f16 model
    m16 = gpt2.GPT2.from_hf_state_dict(cfg, state_dict(ref, "numpy"), backend=backend, dtype="f16")
    m16.precision = "f16"
    want16 = hf_logits(copy.deepcopy(ref).half(), ids).astype(np.float32)
    got16 = m16.forward(ids)
    close(got16, want16, tol=3e-3)  # 1.2e-3 measured (2026-12-02): f16 rounding's size
    assert np.abs(got16 - m.forward(ids)).max() > 1e-5  # the program did round its values
    c = m16.new_cache()
    close(np.concatenate([m16.logits_all_step(ids[:4], c), m16.logits_all_step(ids[4:], c)]),
          want16, tol=3e-3)


@pytest.fixture(scope="module")
def hf_small():
    return hf_model(gpt2.GPT2Config.small(), seed=0)


@pytest.mark.parametrize("backend", [backend_param(b) for b in BACKENDS])
def test_124m_matches_transformers(hf_small, backend):
    cfg = gpt2.GPT2Config.small()
    m = gpt2.GPT2.from_hf_state_dict(cfg, hf_small.state_dict(), backend=backend)
    ids = [464, 2068, 7586, 21831]
    want = hf_logits(hf_small, ids)
    close(m.forward(ids), want)
    c = m.new_cache()
    m.logits_step(ids[:3], c)
    close(m.logits_step(ids[3:], c), want[3])


TINY = CONFIGS[0]


@pytest.fixture(scope="module", params=[backend_param(b) for b in BACKENDS])
def tiny(request):
    return gpt2.GPT2.init_random(TINY, seed=3, backend=request.param)


def test_cached_decoding_equals_the_full_forward(tiny):
    ids = [1, 4, 4, 9, 2, 7, 0, 3, 5, 5, 10, 6]
    full = np.asarray(tiny.forward(ids))
    c = tiny.new_cache()
    for i, t in enumerate(ids):                      # one at a time
        np.testing.assert_allclose(tiny.logits_step([t], c), full[i], atol=2e-5, rtol=0)
    c = tiny.new_cache()                             # chunks onto a non-empty cache
    rows = [tiny.logits_all_step(ids[a:b], c) for a, b in ((0, 1), (1, 4), (4, 5), (5, 12))]
    np.testing.assert_allclose(np.concatenate(rows), full, atol=2e-5, rtol=0)
    c = tiny.new_cache()
    tiny.logits_step(ids[:7], c)
    np.testing.assert_allclose(tiny.logits_step(ids[7:], c), full[-1], atol=2e-5, rtol=0)
    assert len(c) == len(ids)


def test_a_chunk_read_at_its_last_position_runs_the_head_on_one_row(tiny):
    """logits_step of a chunk (and generate's prompt) reads the last position alone: its
    program ("step_last") writes the cache for every id and multiplies only the last row by
    the head, and gives the full forward's last rows and generate's greedy tokens."""
    ids = [1, 4, 4, 9, 2, 7, 0, 3]
    full = np.asarray(tiny.forward(ids))
    c = tiny.new_cache()
    np.testing.assert_allclose(tiny.logits_step(ids[:5], c), full[4], atol=2e-5, rtol=0)
    np.testing.assert_allclose(tiny.logits_step(ids[5:], c), full[7], atol=2e-5, rtol=0)
    assert ("step_last", 5) in tiny._programs and ("step", 5) not in tiny._programs
    heads = [n.shape for n in tiny._program("step_last", 5).ir.nodes
             if n.op == "matmul" and n.shape[-1] == TINY.vocab_size]
    assert heads and all(s[:-1] == (1,) for s in heads), heads
    assert tiny.generate(ids[:5], max_new_tokens=1, temperature=0) == \
        ids[:5] + [int(np.argmax(full[4]))]


@pytest.mark.parametrize("forms", ["cpu", "gpu"])
def test_cached_decoding_with_the_rows_written_by_c_attn(forms):
    """GPT-2's K and V cache rows, columns of c_attn's output (+ bias), stored by c_attn's
    epilogue where those columns land (fusion rule 9, GPUs' default), forced onto this
    adapter with its barrier-free products or GPUs' tiled ones: no write_rows kernel is
    left, 2 a layer fewer than with write_rows_epilogue=False, at 1 and 3 rows a step, and
    the cached steps (one id at a time, then chunks onto a non-empty cache) equal the full
    forward."""
    pytest.importorskip("wgpu")
    from webgrad.backends.webgpu import WebGPUBackend
    from webgrad.codegen import KernelOptions
    gpu = dict(force_direct=False, attn_tiled=True) if forms == "gpu" else {}
    try:
        be = WebGPUBackend(options=KernelOptions(write_rows_epilogue=True, **gpu))
        plain = WebGPUBackend(options=KernelOptions(write_rows_epilogue=False, **gpu))
    except Exception as e:
        pytest.skip(f"no WebGPU adapter: {e}")
    m = gpt2.GPT2.init_random(TINY, seed=3, backend=be)
    p = gpt2.GPT2.init_random(TINY, seed=3, backend=plain)
    ids = [1, 4, 4, 9, 2, 7, 0, 3, 5, 5, 10, 6]
    full = np.asarray(m.forward(ids))
    c = m.new_cache()
    for i, t in enumerate(ids[:4]):
        np.testing.assert_allclose(m.logits_step([t], c), full[i], atol=2e-5, rtol=0)
    rows = [m.logits_all_step(ids[a:b], c) for a, b in ((4, 7), (7, 10), (10, 12))]
    np.testing.assert_allclose(np.concatenate(rows), full[4:], atol=2e-5, rtol=0)
    for T in (1, 3):
        names = m._program("step", T)._prog.exe.kernel_names
        before = p._program("step", T)._prog.exe.kernel_names
        assert not any(n.startswith("write_rows") for n in names), names
        assert len(before) - len(names) == 2 * TINY.n_layer, (names, before)
        assert all((" tile " in n) == (forms == "gpu") for n in names if n.startswith("matmul")
                   and " sum of " not in n and " gemv" not in n), names


@pytest.mark.parametrize("forms", ["cpu", "gpu"])
def test_f16_cached_decoding_is_fused(forms):
    """precision="f16" cached decoding on this adapter with GPUs' forms forced (the rows
    written by c_attn's epilogue; "gpu": the tiled products and attention): the cached
    attention is fused (attn_lse + attn_out: its mask reads the position rounded to f16,
    exact below 2049, attention_pattern._f16_exact), no softmax_last, matmul of the scores
    or write_rows kernel is left, each cached step's logits equal the full forward's row
    at its position, and the greedy tokens equal the reference executor's f16 program's."""
    pytest.importorskip("wgpu")
    from webgrad.backends.webgpu import WebGPUBackend
    from webgrad.codegen import KernelOptions
    gpu = dict(force_direct=False, attn_tiled=True) if forms == "gpu" else {}
    try:
        be = WebGPUBackend(options=KernelOptions(write_rows_epilogue=True, **gpu))
    except Exception as e:
        pytest.skip(f"no WebGPU adapter: {e}")
    if not be.limits.shader_f16:
        pytest.skip("the adapter has no shader-f16")
    from webgpu_helpers import f16_cached_decode
    cfg = CONFIGS[2]
    sd = state_dict(hf_model(cfg, seed=7), "numpy")
    names = f16_cached_decode(
        lambda b: gpt2.GPT2.from_hf_state_dict(cfg, sd, backend=b, dtype="f16"), be,
        [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8], prompt=3, new=8)
    kinds = {n.split(" ")[0] for n in names}
    assert {"attn_lse", "attn_out"} <= kinds and not kinds & {"softmax_last", "write_rows",
                                                              "write_rows_in_place"}, names
    assert sum(n.startswith("matmul") and " sum of " not in n for n in names) == \
        4 * cfg.n_layer + 1, names  # c_attn, c_proj, c_fc, mlp's c_proj and the head


def test_cache_misuse_is_refused(tiny):
    c = tiny.new_cache()
    tiny.logits_step([1, 2], c)
    c2 = tiny.new_cache()
    with pytest.raises(ValueError, match="retired"):
        tiny.logits_step([3], c)
    with pytest.raises(ValueError, match="exceed n_ctx"):
        tiny.logits_step([1] * (TINY.n_ctx + 1 - 0), c2)
    with pytest.raises(ValueError, match=r"ids\[1\] = 11"):
        tiny.logits_step([1, 11], c2)
    assert len(c2) == 0  # refused calls leave the cache where it was


def test_surprisal_matches_the_decode_path(tiny):
    ids = [1, 4, 4, 9, 2, 7, 0, 3]
    s = tiny.surprisal(ids)
    assert len(s.bits) == len(ids) and s.bits[0] == 0
    for i in range(1, len(ids)):
        c = tiny.new_cache()
        logits = np.asarray(tiny.logits_step(ids[:i], c), dtype=np.float64)
        logz = logits.max() + math.log(np.exp(logits - logits.max()).sum())
        want = -(logits[ids[i]] - logz) / math.log(2)
        assert abs(s.bits[i] - want) < 2e-3, (i, s.bits[i], want)
        assert s.top[i] == int(np.argmax(logits))
        assert abs(s.top_p[i] - math.exp(logits.max() - logz)) < 1e-4


def test_bits_are_bits(tiny):
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    s = tiny.surprisal(ids)
    uniform = math.log2(TINY.vocab_size)  # an untrained model is near uniform
    assert all(abs(b - uniform) < 1.5 for b in s.bits[1:])
    forced = [ids[0]] + s.top[1:]
    s2 = tiny.surprisal(forced)
    assert s2.bits[1] <= s.bits[1] + 1e-4  # the model's own top choice is never more surprising


def test_generate_is_deterministic_per_seed(tiny):
    ids = [1, 2, 3]
    a = tiny.generate(ids, max_new_tokens=10, seed=7)
    assert a == tiny.generate(ids, max_new_tokens=10, seed=7)
    assert a[:3] == ids and len(a) == 13
    assert any(tiny.generate(ids, max_new_tokens=10, seed=s) != a for s in range(8, 12))
    assert list(tiny.generate_stream(ids, max_new_tokens=10, seed=7)) == a[3:]
    greedy = tiny.generate(ids, max_new_tokens=6, temperature=0)
    # greedy = argmax of the full forward at every step
    seq = list(ids)
    for _ in range(6):
        seq.append(int(np.argmax(np.asarray(tiny.forward(seq))[-1])))
    assert greedy == seq


def test_generate_stops_at_the_context_and_refuses_bad_counts_and_text(tiny):
    """A prompt near n_ctx gets only the tokens that fit, each the argmax of the full forward;
    a negative count and a str prompt are refused (before: -1 gave the prompt back, and a
    str was read a character at a time)."""
    ids = [k % TINY.vocab_size for k in range(TINY.n_ctx - 3)]
    out = tiny.generate(ids, max_new_tokens=10, temperature=0)
    assert len(out) == TINY.n_ctx and out[:len(ids)] == ids
    seq = list(ids)
    while len(seq) < TINY.n_ctx:
        seq.append(int(np.argmax(np.asarray(tiny.forward(seq))[-1])))
    assert out == seq
    assert tiny.generate(ids, max_new_tokens=0) == ids
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0, got -1"):
        tiny.generate(ids, max_new_tokens=-1)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0, got 2.5"):
        tiny.generate(ids, max_new_tokens=2.5)
    with pytest.raises(ValueError, match="ids is text; pass token ids"):
        tiny.generate("hello", max_new_tokens=2)


def test_generate_agrees_across_backends():
    outs = {b: gpt2.GPT2.init_random(TINY, seed=4, backend=b).generate([5, 6], 12, seed=3, top_k=5)
            for b in ["reference", "torch"] + (["webgpu"] if _webgpu_ok() else [])}
    assert len(set(map(tuple, outs.values()))) == 1, outs


# ---------------------------------------------------------------- sampling definitions

LOGITS = [2.0, 1.0, 0.5, 0.5, -1.0, 3.0, 0.0]


def _freqs(n=20000, **kw):
    r = sampling.rng(0)
    counts = [0] * len(LOGITS)
    for _ in range(n):
        counts[sampling.sample(LOGITS, rng=r, **kw)] += 1
    return [c / n for c in counts]


def _softmax(xs, t=1.0):
    m = max(xs)
    e = [math.exp((x - m) / t) for x in xs]
    return [v / sum(e) for v in e]


@pytest.mark.parametrize("t", [1.0, 0.5, 2.0])
def test_temperature_samples_softmax_of_scaled_logits(t):
    got, want = _freqs(temperature=t), _softmax(LOGITS, t)
    for g, w in zip(got, want):  # 20000 draws: 4 standard deviations
        assert abs(g - w) < 4 * math.sqrt(w * (1 - w) / 20000) + 1e-3


def test_top_k_keeps_the_k_most_likely():
    got = _freqs(top_k=2)
    want = _softmax([LOGITS[5], LOGITS[0]])
    assert [i for i, g in enumerate(got) if g > 0] == [0, 5]
    assert abs(got[5] - want[0]) < 0.02
    assert sampling.sample(LOGITS, top_k=1, rng=sampling.rng(1)) == 5


def test_top_p_keeps_the_smallest_nucleus():
    p = _softmax(LOGITS)  # sorted: 5 (0.54), 0 (0.20), 1 (0.07), ...
    order = sorted(range(len(p)), key=lambda i: -p[i])
    q = p[order[0]] + p[order[1]] * 0.5    # needs the top two
    kept = [tok for tok, _ in sampling.kept_distribution(LOGITS, top_p=q)]
    assert kept == order[:2]
    got = _freqs(top_p=q)
    assert [i for i, g in enumerate(got) if g > 0] == sorted(order[:2])
    assert [tok for tok, _ in sampling.kept_distribution(LOGITS, top_p=0.01)] == [5]


def test_temperature_zero_is_argmax_and_bad_parameters_are_refused():
    assert sampling.sample(LOGITS, temperature=0, rng=sampling.rng(0)) == 5
    for kw in ({"temperature": -1}, {"top_k": 0}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ValueError):
            sampling.check_params(kw.get("temperature", 1.0), kw.get("top_k"), kw.get("top_p"))


@pytest.mark.parametrize("backend", [backend_param(b) for b in BACKENDS])
def test_split_token_table_gives_the_same_model(backend):
    """WebGPU binds at most 128 MiB per tensor by default: the 124M table is split in row
    blocks there. Forced here on a small model: every output must be unchanged."""
    whole = gpt2.GPT2.init_random(TINY, seed=6, backend="reference")
    split = gpt2.GPT2(TINY, backend, wte_chunks=3)
    split.load_state_dict(whole.state_dict())
    assert "wte.2.weight" in split.shapes
    ids = [10, 0, 5, 9, 9, 1]
    np.testing.assert_allclose(split.forward(ids), whole.forward(ids), atol=2e-5, rtol=0)
    c = split.new_cache()
    split.logits_step(ids[:2], c)
    np.testing.assert_allclose(split.logits_step(ids[2:], c), whole.forward(ids)[-1], atol=2e-5, rtol=0)
    a, b = split.surprisal(ids), whole.surprisal(ids)
    np.testing.assert_allclose(a.bits, b.bits, atol=1e-4)
    assert a.top == b.top
    assert split.generate(ids, 6, temperature=0) == whole.generate(ids, 6, temperature=0)
    np.testing.assert_array_equal(split.state_dict()["wte.weight"], whole.state_dict()["wte.weight"])


def test_surprisal_tracker_recomputes_only_the_changed_suffix(tiny):
    tr = tiny.surprisal_tracker()
    edits = [[1, 4, 4, 9, 2, 7, 0, 3], [1, 4, 4, 9, 2, 7, 0, 3, 5, 6],   # typed at the end
             [1, 4, 8, 9, 2, 7, 0, 3, 5, 6],                               # changed inside
             [1, 4, 8, 9, 2], [1, 4, 8, 9, 2], [7], []]                    # cut, same, all new
    expect_recomputed = [8, 3, 9, 0, 0, 1, 0]
    for ids, n in zip(edits, expect_recomputed):
        got = tr.update(ids)
        assert tr.recomputed == n, (ids, tr.recomputed)
        if not ids:
            assert got.bits == []
            continue
        want = tiny.surprisal(ids)
        np.testing.assert_allclose(got.bits, want.bits, atol=2e-3)
        assert got.top == want.top and got.bits[0] == 0
        np.testing.assert_allclose(got.top_p, want.top_p, atol=1e-4)
