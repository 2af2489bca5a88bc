"""GGUF blocks dequantized by WGSL kernels (io/gpu_dequant.py) on native WebGPU (lavapipe),
F16 and every format of webgrad.quants.FORMATS: the parameter buffer then holds exactly
gguf.quants.dequantize's values, plain or transposed, and a compiled program computes with
them. Skipped without an adapter."""
from __future__ import annotations

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as QT
import webgrad as wg
from webgrad import Module, ops
from webgrad.io import gguf as wgg, gpu_dequant

pytestmark = pytest.mark.webgpu

try:
    from webgrad.backends.webgpu_native import NativeHost
    NativeHost()
except Exception as e:  # no wgpu, no adapter
    pytest.skip(f"no native WebGPU adapter: {e}", allow_module_level=True)

from test_gguf import FORMATS, QUANTIZABLE, random_blocks, write  # noqa: E402

ROWS, COLS = 6, 512


class M(Module):
    def __init__(self):
        super().__init__()
        self.w = self.param([ROWS, COLS])
        self.wt = self.param([COLS, ROWS])


def fwd(m, inp):
    return ops.sum_last(inp["x"] @ m.wt) + ops.sum_all(m.w)


@pytest.fixture(scope="module")
def tensors(tmp_path_factory):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    data = {"F16": (x.astype(np.float16), None)}
    for qt in FORMATS:   # what gguf cannot quantize (the k-quants): random blocks
        data[qt.name] = (gguf.quants.quantize(x, qt) if qt in QUANTIZABLE else
                         random_blocks(qt, ROWS * COLS // 256, rng).reshape(ROWS, -1), qt)

    def build(w):
        for name, (d, qt) in data.items():
            if qt is None:
                w.add_tensor(name, d)
            else:
                w.add_tensor(name, d, raw_shape=d.shape, raw_dtype=qt)

    f = wgg.load(write(tmp_path_factory.mktemp("g"), build))
    want = {name: (d.astype(np.float32) if qt is None else gguf.quants.dequantize(d, qt))
            for name, (d, qt) in data.items()}
    return f, want


@pytest.mark.parametrize("type_name", ["F16"] + [qt.name for qt in FORMATS])
def test_gpu_dequantization_equals_gguf(tensors, type_name):
    f, want = tensors
    c = wg.compile_forward(M, fwd, inputs={"x": [2, COLS]}, backend="webgpu")
    t = f.tensors[type_name]
    gpu_dequant.write(c.owner.backend, "w", t)
    gpu_dequant.write(c.owner.backend, "wt", t, transpose=True)
    got = c.download_params()
    assert got["w"].view(np.uint32).tolist() == want[type_name].view(np.uint32).tolist()
    assert np.array_equal(got["wt"], want[type_name].T)
    x = np.ones((2, COLS), np.float32)
    ref = wg.compile_forward(M, fwd, inputs={"x": [2, COLS]}, backend="reference")
    ref.upload_params({"w": want[type_name], "wt": want[type_name].T})
    # f32 sums of ~3000 values in another order: an error relative to the sum of magnitudes
    # (random k-quant blocks reach 1e6)
    tol = 1e-3 + 1e-6 * np.abs(want[type_name]).sum()
    np.testing.assert_allclose(c.run({"x": x}), ref.run({"x": x}), rtol=1e-5, atol=tol)


def test_other_backends_and_errors(tensors):
    f, want = tensors
    c = wg.compile_forward(M, fwd, inputs={"x": [2, COLS]}, backend="reference")
    gpu_dequant.write(c.owner.backend, "wt", f.tensors["Q4_K"], transpose=True)   # host path
    assert np.array_equal(c.download_params()["wt"], want["Q4_K"].T)
    with pytest.raises(ValueError, match="'Q8_0' Q8_0\\[6, 512\\] does not fit parameter 'wt' \\[512, 6\\]"):
        gpu_dequant.write(c.owner.backend, "wt", f.tensors["Q8_0"])
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        gpu_dequant.write(c.owner.backend, "nope", f.tensors["Q8_0"])


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0], ids=["Q8_0", "Q4_0"])
def test_gpt2_from_gguf_on_webgpu(tmp_path, qtype):
    """GPT2.from_gguf(keep_quantized=False) on WebGPU dequantizes on the GPU at load: the
    weights equal the host path's and the logits agree with the reference executor's."""
    from test_gguf import gpt2_gguf, hf_gpt2
    from webgrad.models import gpt2
    cfg, model = hf_gpt2(n_embd=64, n_head=2)
    path, _ = gpt2_gguf(tmp_path, model, cfg, with_output=False, qtype=qtype)
    gpu = gpt2.GPT2.from_gguf(path, backend="webgpu", keep_quantized=False)
    # one dequantization program per quantized tensor (F32 ones are plain uploads): the GPU
    # path ran
    quantized = [t for t in wgg.load(path).tensors.values() if t.type_name == qtype.name]
    assert len(quantized) == 2 * 4 and len(gpu.backend.programs) == len(quantized)
    host = gpt2.GPT2.from_gguf(path, backend="reference", keep_quantized=False)
    got, want = gpu.state_dict(), host.state_dict()
    for k in want:
        assert np.array_equal(np.asarray(got[k]), np.asarray(want[k])), k
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    a, b = np.asarray(gpu.forward(ids)), np.asarray(host.forward(ids))
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * np.abs(b).max())


@pytest.mark.parametrize("qt", [q for q in FORMATS if q.name in ("Q4_0", "Q5_0", "Q8_0", "Q6_K", "Q4_K")],
                         ids=lambda q: q.name)
@pytest.mark.parametrize("blocks", [1, 7])
def test_blocks_laid_out_on_the_gpu_equal_the_host_layout(qt, blocks):
    """write_blocks_async sends the file's blocks as they are and a kernel moves the f16
    scales out: the parameter holds quants.transcode's bytes (gguf's block sizes), an odd
    block count included (the last scale word half empty)."""
    from webgrad.backends import get_backend
    from webgrad.blocking import run_blocking
    from webgrad.quants import transcode, n_words
    size = gguf.GGML_QUANT_SIZES[qt][1]
    raw = np.random.default_rng(blocks).integers(0, 256, blocks * size, dtype=np.uint8).tobytes()
    n = blocks * gguf.GGML_QUANT_SIZES[qt][0]
    b = get_backend("webgpu")
    try:
        b.ensure("q", (n_words(qt.name, n),), "i32")
        run_blocking(gpu_dequant.write_blocks_async(b, "q", qt.name, raw))
        got = bytes(memoryview(run_blocking(b.read("q"))).cast("B"))
        assert got == transcode(qt.name, raw, use_numpy=True)
    finally:
        b.destroy()
