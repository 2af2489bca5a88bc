"""The op oracle table on the WebGPU executor (backend="webgpu") on a native adapter:
wgpu-py, lavapipe in CI. Every record of tests/oracle.py against torch in float64, in f16,
and under each kernel form an adapter may take (both matmul kernels, split-K, double
buffering, the H200's tilings, short rows several per workgroup, column splits).

The other WebGPU tests, by subject: test_webgpu_matmul.py (the matmul kernels and their
choice), test_webgpu_reduce.py (reductions), test_webgpu_programs.py (whole training steps,
memory plan, layout folds, numerics, runtime), test_webgpu_limits.py (device limits, device
loss, Chromium's compiler); their helpers are in webgpu_helpers.py.

Tolerances are the oracle's (rtol 1e-4, atol 1e-5 elementwise; atol 2e-5 for reductions and
1e-4 for matmul-like records, whose f32 summation order differs from torch's float64).
Skipped cleanly when no adapter exists.
"""
from __future__ import annotations

import math

import pytest

import oracle
from webgpu_helpers import (H200_CONFIGS, MATMUL_KERNELS, lowered_kernel_names, lowered_wgsl,
                            require_native_adapter)
import webgrad as wg

pytestmark = pytest.mark.webgpu
require_native_adapter()  # skips this module where there is none

from webgrad.codegen import KernelOptions  # noqa: E402
from webgrad.codegen import matmul_config as mm  # noqa: E402
from webgrad.codegen.matmul_direct import DIRECT_SMALL  # noqa: E402


# ---------------------------------------------------------------- the op oracle table

@pytest.mark.parametrize("record", oracle.RECORDS, ids=[r.name for r in oracle.RECORDS])
def test_oracle(record):
    oracle.check(record, "webgpu")


# one record of each family in the default run; the others (all pass on lavapipe) are slow
F16_DEFAULT = {"matmul/2d", "nn.Linear", "softmax_last/2d", "layer_norm_last",
               "nn.cross_entropy_last", "attention", "exp/2d", "nn.Embedding", "conv2d/basic"}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("record", [
    pytest.param(r, id=r.name, marks=[] if r.name in F16_DEFAULT else [pytest.mark.slow])
    for r in oracle.RECORDS if r.name not in oracle.F16_SKIP])
def test_oracle_f16(record):
    """The records compiled with precision="f16" (on an adapter with shader-f16: lavapipe's
    through wgpu-native) against torch, with tests/oracle.py's f16 tolerances."""
    if "shader-f16" not in (getattr(wg.backends.get_backend("webgpu").host, "features", None) or ()):
        pytest.skip("this adapter has no shader-f16 (test_precision checks the error)")
    oracle.check_f16(record, "webgpu")


# records whose step (forward and gradients) has a matmul kernel: run under both kernels
MATMUL_RECORDS = [r for r in oracle.RECORDS
                  if any(n.startswith("matmul") for n in lowered_kernel_names(r))]
# split-K forced on every matmul: 3 K chunks (empty ones where K is short), 32 x 32 tiles
SPLIT_CONFIG = mm.Config(2, 2, 16, splits=3)


@pytest.mark.parametrize("kernel", list(MATMUL_KERNELS))
@pytest.mark.parametrize("record", MATMUL_RECORDS, ids=[r.name for r in MATMUL_RECORDS])
def test_oracle_under_both_matmul_kernels(record, kernel):
    """The oracle records with a matmul (forward or gradient), through the barrier-free and
    the tiled kernel alike: which one runs by default depends on the adapter and the size."""
    opts = MATMUL_KERNELS[kernel]
    names = [n for n in lowered_kernel_names(record, opts) if n.startswith("matmul")]
    assert names and all((" direct " in n) == kernel.startswith("direct") for n in names), names
    if kernel == "direct_small":  # "matmul AxBxC K=k direct TMxTN": small products, small blocks
        for n in names:
            words = n.split()
            size = math.prod(int(d) for d in words[1].split("x"))
            tm, tn = (int(d) for d in words[-1].split("x"))
            assert (tm <= opts.small_block[0] and tn <= opts.small_block[1]) or size > DIRECT_SMALL, n
        wgsl = lowered_wgsl(record, opts)
        assert any("for (var e = 0u;" in w for w in wgsl), "no epilogue loop in a direct product"
    oracle.check(record, "webgpu", opts)


@pytest.mark.parametrize("record", MATMUL_RECORDS, ids=[r.name for r in MATMUL_RECORDS])
def test_oracle_under_split_k(record):
    """The same records with every matmul split into K chunks (partial sums in scratch, a
    second kernel adds them and runs the epilogue)."""
    opts = KernelOptions(force_config=SPLIT_CONFIG)
    names = [n for n in lowered_kernel_names(record, opts) if n.startswith("matmul")]
    assert any(" split 3" in n for n in names) and any("sum of 3 K chunks" in n for n in names)
    oracle.check(record, "webgpu", opts)


DB_RECORDS = [r for r in MATMUL_RECORDS if r.name.startswith("matmul")]


@pytest.mark.parametrize("config", [mm.Config(2, 2, 16, double=True),
                                    mm.Config(4, 4, 16, vec=False, splits=3, double=True)],
                         ids=["double", "double_split_scalar"])
@pytest.mark.parametrize("record", DB_RECORDS, ids=[r.name for r in DB_RECORDS])
def test_oracle_under_double_buffering(record, config):
    """The matmul records through the double-buffered kernel (one barrier per K step),
    alone and with split-K and scalar shared-memory reads."""
    oracle.check(record, "webgpu", KernelOptions(force_config=config))


# 8 x 16 outputs per thread make large shaders, slow to compile on lavapipe: those configs
# run the records with several tiles per axis only
_H200_BIG = {"wide": ("matmul/tiles_odd", "matmul/batched_odd", "matmul/aligned_epilogue"),
             "split_group": ("matmul/wgrad_odd", "matmul/odd_long_k"),
             "wide_bk16_group_split": ("matmul/wgrad_odd", "matmul/odd_long_k"),
             "odd_split": ("matmul/odd_long_k", "matmul/wgrad_odd"),
             "odd_group": ("matmul/tiles_odd", "matmul/aligned_epilogue"),
             "vocab_wgrad_group": ("matmul/wgrad_odd", "matmul/aligned_epilogue")}
_H200_ALL = ("matmul/2d", "matmul/batch_bcast", "matmul/vec_mat", "matmul/tiles_odd",
             "matmul/batched_odd", "matmul/wgrad_odd", "matmul/odd_long_k",
             "matmul/aligned_epilogue")
H200_CASES = [(r, cfg) for cfg in H200_CONFIGS for r in DB_RECORDS
              if r.name in _H200_BIG.get(cfg, _H200_ALL)]


@pytest.mark.parametrize("record,config", H200_CASES,
                         ids=[f"{r.name}-{cfg}" for r, cfg in H200_CASES])
def test_oracle_under_h200_tilings(record, config):
    oracle.check(record, "webgpu", KernelOptions(force_config=H200_CONFIGS[config]))


# records whose step (on a GPU adapter) reduces short rows several per workgroup
ROWS_RECORDS = [r for r in oracle.RECORDS if any("let lane = " in w for w in lowered_wgsl(r))]


@pytest.mark.parametrize("record", ROWS_RECORDS, ids=[r.name for r in ROWS_RECORDS])
def test_oracle_under_rows_per_workgroup(record):
    """The records whose short-row sums and maxima take _wg_rows on a GPU (i32 sums,
    attention's backward row sums, maxima over the last axis), with it forced on this
    adapter, against torch."""
    oracle.check(record, "webgpu", KernelOptions(rows_tiled=True))


SUM_RECORDS = [r for r in oracle.RECORDS
               if any(n.startswith("sum (pass 1)")
                      for n in lowered_kernel_names(r, KernelOptions(col_split_min_r=1)))]


@pytest.mark.parametrize("record", SUM_RECORDS, ids=[r.name for r in SUM_RECORDS])
def test_oracle_under_column_split(record):
    """The records whose step sums over leading axes (bias gradients, the batch of a
    broadcast, sums in the forward pass), every such sum through col_split's tiled kernel (even short
    ones), its producers and consumers fused as usual."""
    opts = KernelOptions(col_split_min_r=1, column_tiled=True)
    assert any(n.startswith("sum (pass 1)") for n in lowered_kernel_names(record, opts))
    oracle.check(record, "webgpu", opts)
