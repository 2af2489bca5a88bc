"""The quantized matrix-vector kernel's integer form (KernelOptions.gemv_q8_dot,
codegen/matmul_gemv_q8.py), forced onto lavapipe: A rounded to int8 per 32 values as
llama.cpp's q8_1 does, integer dot products against the weights' packed quants.

Judged two ways: against an independent numpy model of that arithmetic (A's blocks rounded
in f32, d = max|a| / 127, q = rint(a * (1 / d)); then gguf's dequantized W times d q in
float64), to f32 tolerance; and against the exact product of gguf's values with A, within
the bound A's rounding implies (1/2 sum_i |w_i| d_i a column). A Q4_K_M Llama's decode steps
with the option give transformers' logits within the error that rounding leaves.
"""
from __future__ import annotations

import numpy as np
import pytest

from gguf import GGMLQuantizationType as QT
from webgrad.arrays import HostArray
from webgrad.stateful import compile_program

from backends import WEBGPU, webgpu_available
from test_gguf_quant import GEMV_SHAPES, quantized_linear

Q8_TYPES = [QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_0]   # the formats whose Chunk has `packed`


def q8_rounded(x):
    """(A as llama.cpp's q8_1 rounds it, d * q in float64; each value's block scale d)."""
    f32 = np.float32
    b = x.astype(f32).reshape(x.shape[0], -1, 32)
    amax = np.abs(b).max(-1, keepdims=True)
    d = amax / f32(127)
    inv = np.where(amax > 0, f32(1) / np.where(amax > 0, d, f32(1)), f32(0)).astype(f32)
    q = np.rint(b * inv)
    d = np.broadcast_to(d, b.shape)
    return (d.astype(np.float64) * q).reshape(x.shape), d.reshape(x.shape).astype(np.float64)


def activations(rng, rows: int, K: int):
    """Rows of A whose 32-value blocks have scales a thousandfold apart, one block all zero."""
    x = rng.standard_normal((rows, K // 32, 32)) * np.exp(rng.uniform(-3.5, 3.5, (rows, K // 32, 1)))
    x[:, 1] = 0.0
    return x.reshape(rows, K).astype(np.float32)


@pytest.mark.webgpu
@pytest.mark.skipif(not webgpu_available(), reason="no WebGPU adapter")
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("qt", Q8_TYPES, ids=lambda q: q.name)
def test_gemv_q8_dot_is_llama_cpp_arithmetic(qt, rows):
    from webgrad.codegen import KernelOptions
    rng = np.random.default_rng(int(qt) + 10 * rows)
    for (N, K), shape in zip(GEMV_SHAPES, [(128, 32, 2), (64, 16, 3)]):
        M, W, words = quantized_linear(qt, N, K, rng)
        x = activations(rng, rows, K)
        opts = KernelOptions(force_gemv=True, gemv_cpu=False, gemv_quant=shape, gemv_q8_dot=True)
        p = compile_program("webgpu", M, lambda m, f: {"y": f["x"] @ m.w},
                            inputs={"x": ([rows, K], "f32")}, kernel_options=opts)
        names = p._prog.exe.kernel_names
        assert any(" gemv q " in k and k.endswith(" q8") for k in names), names
        assert any("dot4I8Packed" in pl["wgsl"] for pl in p._prog.exe.plan["pipelines"])
        p._prog.backend.write("w", HostArray("i32", words.tolist(), shape=words.shape))
        got = p.run({"x": x}, ["y"])["y"].astype(np.float64)
        a8, d = q8_rounded(x)
        W64 = W.astype(np.float64)
        model = a8 @ W64.T
        np.testing.assert_allclose(got, model, rtol=1e-5, atol=1e-5 * np.abs(model).max())
        exact = x.astype(np.float64) @ W64.T
        bound = 0.5 * d @ np.abs(W64).T                  # |a - d q| <= d / 2, value by value
        err = np.abs(got - exact)
        assert (err <= bound + 1e-5 * np.abs(exact).max()).all(), (err / bound).max()
        # the rounding is there: well above f32's noise, well under the bound
        assert 1e-4 < (err / bound).max() < 0.5, (err / bound).max()


@pytest.mark.webgpu
@pytest.mark.skipif(not webgpu_available(), reason="no WebGPU adapter")
def test_gemv_q8_dot_leaves_other_formats_alone():
    """Q4_0 (its Chunk has no packed form) keeps the f32 kernel with the option on."""
    from webgrad.codegen import KernelOptions
    M, W, words = quantized_linear(QT.Q4_0, 16, 256, np.random.default_rng(3))
    opts = KernelOptions(force_gemv=True, gemv_cpu=False, gemv_q8_dot=True)
    p = compile_program("webgpu", M, lambda m, f: {"y": f["x"] @ m.w},
                        inputs={"x": ([1, 256], "f32")}, kernel_options=opts)
    names = p._prog.exe.kernel_names
    assert any(" gemv q " in k for k in names) and not any(k.endswith(" q8") for k in names), names


def test_gemv_q8_dot_takes_what_fits_workgroup_memory():
    """A's quants take 1.5 bytes a value beside the kernel's own partial sums; where the
    rows do not fit (or the option is off) the product keeps the f32 form."""
    from types import SimpleNamespace
    from webgrad import quants
    from webgrad.codegen import KernelOptions
    from webgrad.codegen.matmul_gemv_q8 import q8_dot_takes
    ch = quants.FORMATS["Q4_K"].wgsl_chunk(256)

    def ctx(on=True):
        return SimpleNamespace(limits=SimpleNamespace(
            options=KernelOptions(gemv_q8_dot=on), max_compute_workgroup_storage_size=16384))
    assert q8_dot_takes(ctx(), ch, 1, 8192, 1024)         # 12288 + 4096 bytes
    assert not q8_dot_takes(ctx(), ch, 1, 8192, 1025)
    assert not q8_dot_takes(ctx(), ch, 2, 8192, 0)
    assert not q8_dot_takes(ctx(False), ch, 1, 256, 0)
    assert not q8_dot_takes(ctx(), quants.FORMATS["Q4_0"].wgsl_chunk(256), 1, 256, 0)


def test_gemv_q8_dot_default_is_gpus_with_the_wgsl_feature():
    """gemv_q8_dot=None (the default): the integer form on a GPU whose WGSL has dot4I8Packed
    (Limits.packed_dot), the float form on a CPU adapter or without the feature; a plan
    using dot4I8Packed is refused by a host whose WGSL lacks it, with the reason."""
    from types import SimpleNamespace
    from webgrad import quants
    from webgrad.backends.gpu_host import FeatureMissingError, PACKED_DOT, check_features
    from webgrad.codegen import KernelOptions
    from webgrad.codegen.matmul_gemv_q8 import q8_dot_takes
    ch = quants.FORMATS["Q4_K"].wgsl_chunk(256)

    def takes(cpu, packed_dot):
        return q8_dot_takes(SimpleNamespace(limits=SimpleNamespace(
            options=KernelOptions(), cpu=cpu, packed_dot=packed_dot,
            max_compute_workgroup_storage_size=16384)), ch, 1, 256, 0)
    assert KernelOptions().gemv_q8_dot is None
    assert takes(False, True) and not takes(True, True) and not takes(False, False)
    wgsl = "fn main() { let x = dot4I8Packed(a, b); }"
    check_features([wgsl], (), "gpu", frozenset({PACKED_DOT}))
    check_features(["fn main() {}"], (), "gpu", frozenset())
    with pytest.raises(FeatureMissingError, match=PACKED_DOT):
        check_features([wgsl], (), "gpu", frozenset())
