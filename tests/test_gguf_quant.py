"""Quantized weights kept quantized (webgrad/quants, codegen/quant.py, GPT2.from_gguf),
for every format of webgrad.quants.FORMATS.

Judged against the gguf package: the GPU layout decodes to gguf.quants.dequantize's values
bit for bit (numpy and pure-Python paths) and gives back the file's blocks; a program that
multiplies by W^T through ops.dequantize and gathers rows of it matches float64 products of
gguf's values on reference, torch and WebGPU (lavapipe; both matmul kernels), and WebGPU
plans no f32 copy of the weight; GPT-2 from a GGUF written by gguf's GGUFWriter (every
matrix quantized, token and position tables too, odd block counts) gives, with its weights
held quantized, the logits of the same weights dequantized by gguf on the host and loaded as
f32 (from_hf_state_dict). Training a quantized parameter is refused.
"""
from __future__ import annotations

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as QT
import webgrad as wg
from webgrad import Module, ops, quants
from webgrad.arrays import HostArray
from webgrad.io import gguf as wgg
from webgrad.primitives import ShapeError
from webgrad.stateful import compile_program

from test_gguf import FORMATS, QUANTIZABLE, random_blocks, write
from backends import WEBGPU, webgpu_available

QTS = FORMATS    # every format of webgrad.quants.FORMATS

# f16 scales of a usable weight size: x ~ scale * (largest quant * largest sub-block scale)
SCALE = {QT.Q8_0: 0.05, QT.Q4_0: 0.05, QT.Q4_1: 0.05, QT.Q5_0: 0.02, QT.Q5_1: 0.02,
         QT.Q4_K: 2e-3, QT.Q5_K: 1e-3, QT.Q6_K: 2e-5}


def small_blocks(qt, n_blocks, rng):
    """Random blocks with small finite scales (weights of a usable size)."""
    return random_blocks(qt, n_blocks, rng, scale=SCALE[qt])


@pytest.mark.parametrize("n_blocks", [1, 3, 8])
@pytest.mark.parametrize("qt", QTS, ids=lambda q: q.name)
def test_layout_decodes_to_gguf(qt, n_blocks):
    rng = np.random.default_rng(n_blocks)
    block, size = gguf.GGML_QUANT_SIZES[qt]
    raw = random_blocks(qt, n_blocks, rng)
    n = n_blocks * block
    words = quants.transcode(qt.name, raw.tobytes())
    assert words == quants.transcode(qt.name, raw.tobytes(), use_numpy=False)   # both paths
    assert len(words) == 4 * quants.n_words(qt.name, n)
    assert len(words) - raw.nbytes in ((0, 2) if raw.shape[1] % 4 else (0,))  # at most 2 bytes of padding
    assert quants.raw_blocks(qt.name, words, n) == raw.tobytes()
    want = gguf.quants.dequantize(raw, qt).astype(np.float32).reshape(-1)
    for use_numpy in (True, False):
        got = np.frombuffer(quants.dequantize_words(qt.name, words, (n,), use_numpy=use_numpy), np.float32)
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


# odd shapes: M = 3 rows of x, N rows of W that divide no tile, odd block counts
SHAPES = {QT.Q8_0: (5, 96), QT.Q4_0: (7, 160), QT.Q4_1: (3, 96), QT.Q5_0: (5, 160),
          QT.Q5_1: (7, 96), QT.Q4_K: (3, 512), QT.Q5_K: (5, 512), QT.Q6_K: (7, 768)}


def quantized_linear(qt, N: int, K: int, rng):
    """(a Module whose weight `w` is declared [K, N], as a Conv1D's, and stored as qt's blocks
    of an [N, K] matrix; gguf's dequantization of those blocks, [N, K]; the blocks as the
    GPU words to write into `w`)."""
    raw = small_blocks(qt, N * K // gguf.GGML_QUANT_SIZES[qt][0], rng)
    W = gguf.quants.dequantize(raw.reshape(N, -1), qt)
    words = np.frombuffer(quants.transcode(qt.name, raw.tobytes()), np.int32)
    spec = quants.QuantSpec(qt.name, (N, K), transposed=True)

    class M(Module):
        def __init__(self):
            super().__init__()
            self.w = self.param([K, N])
            self.w.quant = spec

    return M, W, words


@pytest.mark.parametrize("backend", ["reference", "torch", WEBGPU])
@pytest.mark.parametrize("qt", QTS, ids=lambda q: q.name)
def test_matmul_and_gather_read_the_blocks(qt, backend):
    from webgrad.codegen import KernelOptions, matmul_config as matmul
    rng = np.random.default_rng(int(qt))
    N, K = SHAPES[qt]
    M, W, words = quantized_linear(qt, N, K, rng)

    def fn(m, f):
        return {"y": f["x"] @ m.w + 1.0, "rows": ops.gather_rows(ops.swap_axes(m.w, 0, 1), f["i"])}

    x = rng.standard_normal((3, K)).astype(np.float32)
    want = x.astype(np.float64) @ W.T.astype(np.float64) + 1.0
    # webgpu: the barrier-free kernel (CPU adapters), the tiled one (GPUs) and the tiled one
    # split over K (the H200's long-K rule: partial sums, then a second kernel)
    # and the H200's wide tile with vec4 loads (x read as vec4, the blocks decoded per element)
    # and the matrix-vector kernel (M = 3: decoding's products), lanes reading chunks
    # and its barrier-free CPU form (a thread per 8 columns, the words 4 values at a time)
    kernels = (("direct", "tiled", "split", "vec4", "gemv", "gemv_cpu") if backend == "webgpu"
               else (None,))
    for kind in kernels:
        opts = KernelOptions(
            force_direct={"direct": True, "tiled": False}.get(kind),
            force_gemv=True if kind == "gemv" else None, gemv_cpu=kind == "gemv_cpu" or None,
            force_config={"split": matmul.Config(2, 2, 16, splits=2),
                          "vec4": matmul.Config(8, 16, 8, wx=8, wy=16, vload=True)}.get(kind))
        p = compile_program(backend, M, fn, inputs={"x": ([3, K], "f32"), "i": ([2], "i32")},
                            kernel_options=opts)
        if kind == "split":
            assert any("split 2" in k for k in p._prog.exe.kernel_names)
        if kind == "vec4":
            assert any("vec4<f32>" in pl["wgsl"] for pl in p._prog.exe.plan["pipelines"])
        p._prog.backend.write("w", HostArray("i32", words.tolist(), shape=words.shape))
        out = p.run({"x": x, "i": [N - 1, 0]}, ["y", "rows"])
        np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        assert np.array_equal(out["rows"], W[[N - 1, 0]])
        if backend == "webgpu":   # the blocks are bound and decoded; no f32 weight is planned
            plan, feeds = p._prog.exe.plan, set(p._prog.exe.lowered.feeds.values())
            assert all(b["size"] < 4 * N * K for k, b in enumerate(plan["buffers"]) if k not in feeds)
            mm = [pl["wgsl"] for pl in plan["pipelines"] if " K=" in pl["wgsl"].split("\n")[0]]
            # the barrier-free kernel and the CPU matrix-vector one read a scale per group of
            # 32 and 4 values per word; the GPU matrix-vector one reads its format's chunks
            grouped = bool(opts.force_direct or opts.gemv_cpu)
            chunks = kind == "gemv"
            assert mm and all(("dqs_" in w) == grouped and ("dq_" in w) != chunks
                              if not grouped else "dqs_" in w for w in mm)
            if kind in ("gemv", "gemv_cpu"):
                names = p._prog.exe.kernel_names
                assert any((" gemv cpu " if kind == "gemv_cpu" else " gemv q ") in k for k in names)


# (N, K) of the matrix-vector kernel's chunked form: N no multiple of a workgroup's columns,
# K several blocks (an odd count of super-blocks: rows with fewer chunks than lanes, too)
GEMV_SHAPES = [(37, 3 * 256), (70, 8 * 256)]


@pytest.mark.webgpu
@pytest.mark.skipif(not webgpu_available(), reason="no WebGPU adapter")
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("qt", QTS, ids=lambda q: q.name)
def test_gemv_reads_the_blocks_in_chunks(qt, rows):
    """The GPU matrix-vector kernel's quantized form (matmul_gemv.build_gemv_chunks: lanes
    read consecutive chunks of the blocks), run on lavapipe by name, against gguf's values
    times x in float64; a shape of its block options that leaves lanes idle too."""
    from webgrad.codegen import KernelOptions
    rng = np.random.default_rng(int(qt) + rows)
    for (N, K), shape in zip(GEMV_SHAPES, [(128, 32, 2), (64, 16, 3)]):
        M, W, words = quantized_linear(qt, N, K, rng)
        x = rng.standard_normal((rows, K)).astype(np.float32)
        want = x.astype(np.float64) @ W.T.astype(np.float64)
        opts = KernelOptions(force_gemv=True, gemv_cpu=False, gemv_quant=shape)
        p = compile_program("webgpu", M, lambda m, f: {"y": f["x"] @ m.w},
                            inputs={"x": ([rows, K], "f32")}, kernel_options=opts)
        assert any(" gemv q " in k for k in p._prog.exe.kernel_names), p._prog.exe.kernel_names
        p._prog.backend.write("w", HostArray("i32", words.tolist(), shape=words.shape))
        got = p.run({"x": x}, ["y"])["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_quantized_params_are_not_trainable_but_run_forward():
    spec = quants.QuantSpec("Q8_0", (4, 32), transposed=True)

    class M(Module):
        def __init__(self):
            super().__init__()
            self.w = self.param([32, 4])
            self.w.quant = spec
            self.b = self.param([4])

    with pytest.raises(ValueError, match=r"compile_module: parameters 'w' \(Q8_0\) are held "
                                         "quantized, and quantized weights are not trainable"):
        wg.compile_module(M, lambda m, f: ops.sum_all(f["x"] @ m.w + m.b),
                          inputs={"x": [2, 32]}, backend="reference")
    # a forward program holds them: written (and read back) as the words of their blocks
    W = (0.1 * np.random.default_rng(0).standard_normal((4, 32))).astype(np.float32)
    raw = gguf.quants.quantize(W, QT.Q8_0)
    words = np.frombuffer(quants.transcode("Q8_0", raw.tobytes()), dtype="<i4")
    fwd = wg.compile_forward(M, lambda m, f: f["x"] @ m.w, inputs={"x": [2, 32]})
    fwd.upload_params({"w": words, "b": np.zeros(4, np.float32)})
    x = np.ones((2, 32), np.float32)
    np.testing.assert_allclose(fwd.run({"x": x}), x @ gguf.quants.dequantize(raw, QT.Q8_0).T,
                               rtol=1e-6)


def test_dequantize_shape_errors():
    def build(words_n, qtype, shape):
        return compile_program("reference", Module,
                               lambda m, f: {"y": ops.dequantize(f["w"], qtype, shape)},
                               inputs={"w": ([words_n], "i32")})
    build(9, "Q8_0", (1, 32))
    with pytest.raises(ShapeError, match=r"Q8_0\[2, 32\] takes 17 words, got 9"):
        build(9, "Q8_0", (2, 32))
    with pytest.raises(ShapeError, match="rows must be whole blocks of 256 values; shape \\[1, 32\\]"):
        build(9, "Q4_K", (1, 32))
    with pytest.raises(ShapeError, match="'Q3_K' is not kept quantized"):
        build(9, "Q3_K", (1, 256))
    with pytest.raises(ValueError, match="do not give the declared shape"):
        class M(Module):
            def __init__(self):
                super().__init__()
                self.w = self.param([32, 4])
                self.w.quant = quants.QuantSpec("Q8_0", (32, 4 * 8))
        compile_program("reference", M, lambda m, f: {"y": m.w * 1.0}, inputs={})


# ---------------------------------------------------------------------------- GPT-2

def quantized_gpt2(tmp_path, qt, *, n_embd, n_head, vocab=97, n_ctx=13, n_layer=2, mix=None):
    """A llama.cpp gpt2 GGUF (gguf's names) whose 2-D tensors, the token and position
    tables included, are all `qt` (or mix[name] where mix names them); 1-D ones F32. Returns
    (path, transformers-layout state dict of the values gguf dequantizes)."""
    rng = np.random.default_rng(int(qt) + n_embd)
    qt0, D = qt, n_embd
    shapes = {"token_embd.weight": (vocab, D), "position_embd.weight": (n_ctx, D),
              "output_norm.weight": (D,), "output_norm.bias": (D,)}
    for i in range(n_layer):
        for base, s in (("attn_norm", None), ("ffn_norm", None)):
            shapes[f"blk.{i}.{base}.weight"] = (D,)
            shapes[f"blk.{i}.{base}.bias"] = (D,)
        for base, (o, n) in (("attn_qkv", (3 * D, D)), ("attn_output", (D, D)),
                             ("ffn_up", (4 * D, D)), ("ffn_down", (D, 4 * D))):
            shapes[f"blk.{i}.{base}.weight"] = (o, n)
            shapes[f"blk.{i}.{base}.bias"] = (o,)
    values = {}

    def build(w):
        w.add_context_length(n_ctx); w.add_embedding_length(D); w.add_feed_forward_length(4 * D)
        w.add_block_count(n_layer); w.add_head_count(n_head); w.add_layer_norm_eps(1e-5)
        for name, s in shapes.items():
            if len(s) == 1:
                v = (1.0 if name.endswith("norm.weight") else 0.0) + 0.1 * rng.standard_normal(s)
                values[name] = v.astype(np.float32)
                w.add_tensor(name, values[name])
                continue
            qt = (mix or {}).get(name, qt0)
            if qt not in QUANTIZABLE:   # gguf has no k-quant quantizer: random blocks
                q = small_blocks(qt, s[0] * s[1] // 256, rng).reshape(s[0], -1)
            else:
                q = gguf.quants.quantize((0.08 * rng.standard_normal(s)).astype(np.float32), qt)
            values[name] = gguf.quants.dequantize(q, qt)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)

    path = write(tmp_path, build, arch="gpt2", name=f"{qt0.name}{'_mixed' if mix else ''}.gguf")
    hf = {"token_embd.weight": "wte.weight", "position_embd.weight": "wpe.weight",
          "output_norm.weight": "ln_f.weight", "output_norm.bias": "ln_f.bias"}
    blk = {"attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj",
           "ffn_norm": "ln_2", "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
    sd = {}
    for name, v in values.items():
        if name in hf:
            sd[hf[name]] = v
        else:
            _, i, base, suffix = name.split(".")
            sd[f"h.{i}.{blk[base]}.{suffix}"] = v.T if (v.ndim == 2) else v   # Conv1D [in, out]
    return path, sd


CONFIGS = {QT.Q8_0: dict(n_embd=96, n_head=3), QT.Q4_0: dict(n_embd=96, n_head=3),
           QT.Q4_1: dict(n_embd=96, n_head=3), QT.Q5_0: dict(n_embd=96, n_head=3),
           QT.Q5_1: dict(n_embd=96, n_head=3),
           QT.Q4_K: dict(n_embd=256, n_head=4), QT.Q5_K: dict(n_embd=256, n_head=4),
           QT.Q6_K: dict(n_embd=256, n_head=4)}


@pytest.mark.parametrize("backend", ["reference", WEBGPU])
@pytest.mark.parametrize("qt", QTS, ids=lambda q: q.name)
def test_gpt2_quantized_logits_equal_host_dequantized(tmp_path, qt, backend):
    from webgrad.models import gpt2
    path, sd = quantized_gpt2(tmp_path, qt, **CONFIGS[qt])
    m = gpt2.GPT2.from_gguf(path, backend=backend)            # keep_quantized=True: the default
    cfg = m.cfg
    # the f32 model of the same weights on the numpy executor: the reference, and on a cold
    # lavapipe half the kernels to compile
    host = gpt2.GPT2.from_hf_state_dict(cfg, sd, backend="reference")
    assert set(m.quant) == {n for n in gpt2.param_shapes(cfg) if n.endswith("weight")
                            and len(gpt2.param_shapes(cfg)[n]) == 2}
    blocks = sum(t.data.nbytes for t in wgg.load(path).tensors.values() if t.type_name == qt.name)
    # the GPU holds the file's bytes of every quantized tensor (plus <= 2 bytes of padding each)
    f32_bytes = 4 * sum(np.asarray(v).size for v in sd.values())
    onedim = 4 * sum(np.asarray(v).size for v in sd.values() if np.asarray(v).ndim == 1)
    assert blocks <= m.weight_bytes - onedim <= blocks + 2 * len(m.quant)
    assert host.weight_bytes == f32_bytes and m.weight_bytes < f32_bytes / 3
    # against numpy's f32 sums in another order (a transposed weight takes another BLAS path;
    # WebGPU's kernels sum in theirs): random k-quant blocks make weights up to ~1e6, so the
    # logits' rounding reaches ~3e-5 of the largest
    tol = 1e-4 if backend == "webgpu" else 2e-5
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 96, 0, 11]
    got, want = np.asarray(m.forward(ids)), np.asarray(host.forward(ids))
    assert np.isfinite(want).all() and np.abs(want).max() > 0.1
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())
    c1, c2 = m.new_cache(), host.new_cache()
    for t in ids[:5]:   # token by token: one decode program (a chunk's is another to compile)
        a = np.asarray(m.logits_step([t], c1))
        b = np.asarray(host.logits_step([t], c2))
        np.testing.assert_allclose(a, b, rtol=0, atol=tol * np.abs(b).max())
    a = np.asarray(m.logits_step([7], c1))                     # one decode step
    b = np.asarray(host.logits_step([7], c2))
    np.testing.assert_allclose(a, b, rtol=0, atol=tol * np.abs(b).max())
    got_s, want_s = m.surprisal(ids), host.surprisal(ids)
    np.testing.assert_allclose(got_s.bits, want_s.bits, rtol=1e-4, atol=1e-4)
    # the weights read back decoded, as gguf dequantizes them
    back = m.state_dict()
    for k in ("wte.weight", "h.1.mlp.c_proj.weight"):
        assert np.array_equal(np.asarray(back[k]), sd[k]), k
    with pytest.raises(ValueError, match="holds .* quantized; f32 weights go into a model built "
                                         "without quant"):
        m.load_state_dict(sd)


# the types of a llama.cpp Q4_K_M gpt2 file: Q4_K, with Q5_K for attn_qkv and Q6_K for
# ffn_down of some layers (llama-quantize's "more bits" rule), here the token table too
Q4_K_M = {"blk.0.attn_qkv.weight": QT.Q5_K, "blk.1.attn_qkv.weight": QT.Q5_K,
          "blk.0.ffn_down.weight": QT.Q6_K, "token_embd.weight": QT.Q6_K}


# on WebGPU three k-quant decoders in one model: 77 s of kernels on a cold lavapipe, a slow
# case (each type alone runs by default in test_gpt2_quantized_logits_equal_host_dequantized)
@pytest.mark.parametrize("backend", ["reference", pytest.param("webgpu", marks=[*WEBGPU.marks, pytest.mark.slow])])
def test_gpt2_mixed_k_quants_stay_quantized(tmp_path, backend):
    """A Q4_K_M-style file loads with every matrix held in its own type, and its logits
    (full and one decode step) equal those of gguf's dequantized weights loaded as f32."""
    from webgrad.models import gpt2
    path, sd = quantized_gpt2(tmp_path, QT.Q4_K, n_embd=256, n_head=4, mix=Q4_K_M)
    m = gpt2.GPT2.from_gguf(path, backend=backend)
    assert m.quant["wte.weight"].qtype == "Q6_K" and m.quant["h.0.mlp.c_proj.weight"].qtype == "Q6_K"
    assert m.quant["h.1.attn.c_attn.weight"].qtype == "Q5_K" and m.quant["h.1.mlp.c_fc.weight"].qtype == "Q4_K"
    host = gpt2.GPT2.from_hf_state_dict(m.cfg, sd, backend=backend)
    tol = 2e-6 if backend == "webgpu" else 2e-5
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 96, 0, 11]
    want = np.asarray(host.forward(ids))
    assert np.isfinite(want).all() and np.abs(want).max() > 0.1
    np.testing.assert_allclose(np.asarray(m.forward(ids)), want, rtol=0, atol=tol * np.abs(want).max())
    c1, c2 = m.new_cache(), host.new_cache()
    m.logits_step(ids[:5], c1)
    host.logits_step(ids[:5], c2)
    a, b = np.asarray(m.logits_step([7], c1)), np.asarray(host.logits_step([7], c2))
    np.testing.assert_allclose(a, b, rtol=0, atol=tol * np.abs(b).max())


def test_gpt2_keep_quantized_false_and_split_table(tmp_path):
    """keep_quantized=False: f32 parameters as before. A token table split by the binding
    limit is split as blocks (row ranges of whole blocks)."""
    from webgrad.models import gpt2
    path, sd = quantized_gpt2(tmp_path, QT.Q8_0, n_embd=96, n_head=3)
    m = gpt2.GPT2.from_gguf(path, backend="reference", keep_quantized=False)
    assert not m.quant and m.weight_bytes == 4 * sum(np.asarray(v).size for v in sd.values())
    host = gpt2.GPT2.from_hf_state_dict(m.cfg, sd, backend="reference")
    ids = [5, 6, 7]
    np.testing.assert_allclose(np.asarray(m.forward(ids)), np.asarray(host.forward(ids)),
                               rtol=0, atol=1e-6)
    cfg = m.cfg
    full = {"wte.weight": quants.QuantSpec("Q8_0", (cfg.vocab_size, cfg.n_embd))}
    split = gpt2.GPT2(cfg, "reference", wte_chunks=3, quant=full)
    assert sorted(n for n in split.quant if n.startswith("wte")) == ["wte.0.weight", "wte.1.weight",
                                                                     "wte.2.weight"]
    f = wgg.load(path)
    split.write_blocks("wte.weight", f.tensors["token_embd.weight"].data)
    assert np.array_equal(np.asarray(split.state_dict()["wte.weight"]), sd["wte.weight"])


@pytest.mark.webgpu
@pytest.mark.skipif(not webgpu_available(), reason="no native WebGPU adapter")
def test_gpt2_quantized_on_the_tiled_kernel(tmp_path):
    """GPUs take the tiled matmul (lavapipe the barrier-free one): forced here, the whole
    model's logits still equal the host-dequantized model's on the same kernel."""
    from webgrad.backends.webgpu import WebGPUBackend
    from webgrad.codegen import KernelOptions
    from webgrad.models import gpt2
    path, sd = quantized_gpt2(tmp_path, QT.Q8_0, n_embd=96, n_head=3)
    tiled = KernelOptions(force_direct=False)
    m = gpt2.GPT2.from_gguf(path, backend=WebGPUBackend(options=tiled))
    host = gpt2.GPT2.from_hf_state_dict(m.cfg, sd, backend=WebGPUBackend(options=tiled))
    ids = [3, 1, 4, 1, 5, 9, 2]
    got, want = np.asarray(m.forward(ids)), np.asarray(host.forward(ids))
    names = [k for k in m._program("full", len(ids))._prog.exe.kernel_names if "matmul" in k]
    assert names and all(" tile " in k for k in names)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())
