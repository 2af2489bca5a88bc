"""The rank-r products' tiles (matmul_config.expand_config and thin_config, KernelOptions
expand_k, expand_tile, thin_split; bench/thin_products.py times them): the tiled kernel with
a thread's columns apart (Config.cols_apart) for products over K <= expand_k, and the thin
products' 16-wide tiles split over K, each forced onto this adapter (lavapipe runs the
barrier-free kernel by default) on shapes no tile divides, operands read through
transposes as LoRA's are, with an epilogue; against float64 numpy. Then which products of
the 1B-shaped LoRA step take them on an H200 (no device). Skipped cleanly (the device
tests) when no adapter exists.
"""
from __future__ import annotations

import numpy as np
import pytest

from webgrad import ops
from webgrad.codegen import KernelOptions
from webgrad.codegen import matmul_config as mm

H200 = "NVIDIA H200 (DiscreteGPU) via Vulkan"


def _product(M: int, K: int, N: int, ta: bool, tb: bool, epi: bool, opts: KernelOptions):
    """(kernel names, webgpu result, float64 numpy) of a @ b (+ bias, relu where epi), a
    stored [K, M] and read transposed where ta (dA = du^T x), b stored [N, K] where tb
    (x A^T)."""
    from webgpu_helpers import exe, forward
    rng = np.random.default_rng(M * 7 + K * 3 + N)
    A = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
    B = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)

    def fn(a, b, bias):
        y = (ops.swap_axes(a, 0, 1) if ta else a) @ (ops.swap_axes(b, 0, 1) if tb else b)
        return ops.relu(y + bias) if epi else y
    f = forward(fn, {"a": list(A.shape), "b": list(B.shape), "bias": [N]}, options=opts)
    got = np.asarray(f.run({"a": A, "b": B, "bias": bias}))
    a64 = (A.T if ta else A).astype(np.float64)
    b64 = (B.T if tb else B).astype(np.float64)
    want = a64 @ b64
    if epi:
        want = np.maximum(want + bias, 0.0)
    return [n for n in exe(f).kernel_names if n.startswith("matmul")], got, want


# (M, K, N, A transposed, B transposed, epilogue): (x A^T) B^T, (dY B) A, shapes no tile divides
EXPAND_CASES = {
    "uBT_epi": (70, 16, 200, False, True, True),
    "dyB_A": (45, 16, 130, False, False, False),
    "k5_epi": (33, 5, 70, False, True, True),
    "k32_ta": (40, 32, 96, True, False, True),
}
# expand_config's tile and two forced (tm, tn, wx, wy): tm 4 reads A's rows as vec4
EXPAND_TILES = {"auto": None, "4x4_w32x8": (4, 4, 32, 8, 0), "2x2_w16x4": (2, 2, 16, 4, 0)}


@pytest.mark.webgpu
@pytest.mark.parametrize("tile", list(EXPAND_TILES))
@pytest.mark.parametrize("case", list(EXPAND_CASES))
def test_expansion_tiles_match_numpy(case, tile):
    """A product over K <= expand_k on the tiled kernel (forced: force_direct=False) takes
    expand_config's tile, columns wx apart, and equals float64 numpy's, the epilogue's
    loads issued first (epi_rows) included."""
    from webgpu_helpers import require_native_adapter
    require_native_adapter()
    M, K, N, ta, tb, epi = EXPAND_CASES[case]
    t = EXPAND_TILES[tile]
    opts = KernelOptions(force_direct=False, force_gemv=False, expand_tile=t, expand_min_n=0)
    cfg = mm.expand_config(M, N, K, 1, opts)
    assert cfg.cols_apart and (t is None or cfg.tm == t[0])   # (workgroups 0: tm as given)
    names, got, want = _product(M, K, N, ta, tb, epi, opts)
    assert names == [f"matmul {M}x{N} K={K} tile {cfg.bm}x{cfg.bn}x{cfg.bk}"], names
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_expansion_tile_keeps_its_rows_where_the_grid_is_large():
    """expand_config halves tm only until the grid has EXPAND_TILE's workgroups; tn halves
    where N is narrower than the tile; K is one step (bk >= K); expand_k=0 turns it off."""
    big = mm.expand_config(2048, 8192, 16, 1)
    assert (big.tm, big.tn, big.wx, big.wy, big.bk, big.epi_rows) == (4, 4, 32, 8, 16, 4)
    assert mm.expand_config(2048, 2048, 16, 1).tm == 4     # 64 x 16 = 1024 tiles
    assert mm.expand_config(2048, 512, 16, 1).tm == 1      # 256 -> 1024 tiles at 8 rows
    assert mm.expand_config(2048, 512, 16, 1).bk == 32     # 8 x 32 staged by 256 threads
    assert mm.expand_config(64, 40, 16, 1).tn == 2
    assert mm.choose_config(2048, 8192, 16, 1, adapter=H200) == big
    old = mm.choose_config(2048, 8192, 16, 1, adapter=H200, options=KernelOptions(expand_k=0))
    assert not old.cols_apart and (old.bm, old.bn) == (128, 128)


# (M, K, N, A transposed, B transposed, epilogue, thin_split): LoRA's x A^T, dA = du^T x,
# dB = dY^T u, dY B; on lowered thresholds (thin_chunk 32) so that they split here
THIN_CASES = {
    "xAT_epi": (200, 512, 12, False, True, True, 64),
    "dA_ta": (16, 300, 70, True, False, False, 64),
    "dB_ta": (90, 260, 16, True, False, True, 32),
    "dyB": (130, 192, 20, False, False, False, 64),
    "unsplit": (300, 96, 16, False, True, False, 8),
}


@pytest.mark.webgpu
@pytest.mark.parametrize("case", list(THIN_CASES))
def test_thin_tiles_split_over_k_match_numpy(case):
    """A thin product on thin_config's tiles (the wide side's tile halved, K split in
    chunks until the grid has thin_split workgroups; a chunk sum adds them and runs the
    epilogue) equals float64 numpy's."""
    from webgpu_helpers import require_native_adapter
    require_native_adapter()
    M, K, N, ta, tb, epi, target = THIN_CASES[case]
    opts = KernelOptions(force_direct=False, force_gemv=False, thin_split=target, thin_chunk=32)
    cfg = mm.thin_config(M, N, K, 1, 0, opts)
    assert cfg is not None and (cfg.splits > 1) == (case != "unsplit"), cfg
    names, got, want = _product(M, K, N, ta, tb, epi, opts)
    tile = f"matmul {M}x{N} K={K} tile {cfg.bm}x{cfg.bn}x{cfg.bk}"
    assert names == ([f"{tile} split {cfg.splits}", f"matmul {M}x{N} sum of {cfg.splits} K chunks"]
                     if cfg.splits > 1 else [tile]), names
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_thin_products_fill_the_h200():
    """The 1B LoRA step's thin products on the H200 row: a grid of THIN_TILES workgroups
    (they ran 64-256 before), tiles across the thin side 16 (or 32) wide, K chunks of at
    least thin_chunk; thin_split=0 gives the split_thin rule's tiles back."""
    def grid(M, N, K):
        c = mm.choose_config(M, N, K, 1, adapter=H200)
        return -(-M // c.bm) * -(-N // c.bn) * c.splits, c
    for M, N, K in ((2048, 16, 2048), (16, 2048, 2048), (8192, 16, 2048), (16, 8192, 2048),
                    (2048, 32, 2048)):
        n, c = grid(M, N, K)
        assert n >= mm.THIN_TILES and min(c.bm, c.bn) in (16, 32), (M, N, K, c)
        assert -(-K // c.splits) >= KernelOptions().thin_chunk
    # K 8192 and the 48-wide sibling product measured slower on these tiles: the other rules
    slots = mm.adapter_tiling(H200, KernelOptions()).get("slots", 0)
    assert slots and mm.thin_config(2048, 16, 8192, 1, slots) is None
    assert mm.thin_config(2048, 48, 2048, 1, slots) is None
    # K = 512 (k's and v's dY B): chunks of 128 at most 4, the tile down to 16 rows
    n, c = grid(2048, 16, 512)
    assert (c.splits, c.bm, n) == (4, 16, 512)
    old = mm.choose_config(2048, 16, 2048, 1, adapter=H200, options=KernelOptions(thin_split=0))
    assert (old.splits, old.bm, old.bn, old.bk) == (1, 32, 16, 64)
    # adapters without a row (no slots): unchanged unless thin_split asks
    assert mm.thin_config(2048, 16, 2048, 1, 0) is None
    assert mm.thin_config(2048, 16, 2048, 1, 0, KernelOptions(thin_split=256)).splits > 1
