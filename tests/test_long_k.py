"""Matmuls whose K is past what one shader invocation may loop over on a CPU adapter.

lavapipe (Mesa's CPU Vulkan) stops an invocation's loops after 65535 iterations in all,
silently (codegen/wgsl.CPU_LOOP_ITERATIONS): a [2, 70000] @ [70000, 3] product through the
barrier-free kernel returned sums off by up to 43 (of 515) before matmul_config.cpu_splits cut K
into chunks there. These records go through the oracle's whole compile path (forward and
gradients) and are judged against torch in float64: a plain product and a weight gradient
whose K runs over batch x rows (fusion's folded sum, K = 2 x 35001), both wrong without the
chunks on lavapipe; and a quantized W^T, whose kernel loops over groups of 32 (about K / 4
iterations: under the limit still, but chunked all the same, since cpu_splits bounds every
kernel by K), as is the tiled kernel forced onto the CPU adapter (K / 16 steps). Small M
and N keep them fast (seconds).
"""
from __future__ import annotations

import pytest

import oracle
from backends import WEBGPU
from oracle import Record, f32
from webgrad.codegen import KernelOptions, Limits, lower
from webgrad.codegen import matmul_config as mm
from webgrad.codegen.wgsl import CPU_LOOP_ITERATIONS
from webgrad.compile import build_train_graph, parse_inputs

K = 70000  # past 65535, not a multiple of the 32-element chunk rounding

RECORDS = [
    Record("matmul/k_past_cpu_loop_limit", "lambda a, b: ops.matmul(a, b)", lambda a, b: a @ b,
           (f32(2, K), f32(K, 3)), atol=2e-2),
    Record("matmul/wgrad_k_past_cpu_loop_limit",
           "lambda x, g: ops.sum(ops.matmul(ops.swap_axes(x, -1, -2), g), 0)",
           lambda x, g: (x.transpose(-1, -2) @ g).sum(0), (f32(2, 35001, 3), f32(2, 35001, 2)),
           atol=2e-2),
]


def _t_q8_0_wt(x, w):
    """x @ W^T for W [1, KQ] in webgrad's Q8_0 word layout (webgrad/quants/q8_0.py), decoded
    independently: words [8 b, 8 b + 8) hold block b's 32 int8 quants (4 a word,
    little-endian), word 8 nb + b / 2 its f16 scale in half b % 2."""
    import torch
    nb = KQ // 32
    u = w.to(torch.int64) & 0xFFFFFFFF
    q = torch.stack([(u[:8 * nb] >> (8 * k)) & 255 for k in range(4)], -1).reshape(nb, 32)
    q = torch.where(q >= 128, q - 256, q).double()
    halves = torch.stack([u[8 * nb:] & 0xFFFF, u[8 * nb:] >> 16], -1).reshape(-1)[:nb]
    d = halves.to(torch.int16).view(torch.float16).double()  # int16 wraps the top bit
    return x @ (d[:, None] * q).reshape(1, -1).T


KQ = 70016  # 2188 blocks of 32
RECORDS.append(Record(
    "dequantize/q8_0_k_past_cpu_loop_limit",
    f"lambda x, w: ops.matmul(x, ops.swap_axes(ops.dequantize(w, 'Q8_0', (1, {KQ})), 0, 1))",
    _t_q8_0_wt, (f32(2, KQ), oracle.i32((8 * KQ // 32 + KQ // 64,), 0, 0x3C00)), atol=2e-2))


def _matmul_names(record, limits):
    factory, loss_fn, inputs, _ = oracle.build_record(record)
    g = build_train_graph(factory, loss_fn, parse_inputs(inputs), None)[1]
    return [n for n in lower(g, limits)[1] if n.startswith("matmul")]


def test_cpu_splits_bounds_every_chunk():
    """Chunks cover K exactly, in multiples of 32, none past the loop budget."""
    assert mm.cpu_splits(CPU_LOOP_ITERATIONS) == (1, CPU_LOOP_ITERATIONS)
    for k in (CPU_LOOP_ITERATIONS + 1, 65536, K, 70002, 10 ** 6 + 7):
        S, KS = mm.cpu_splits(k)
        assert S > 1 and KS % 32 == 0 and KS <= CPU_LOOP_ITERATIONS and (S - 1) * KS < k <= S * KS


@pytest.mark.parametrize("record", RECORDS, ids=[r.name for r in RECORDS])
def test_long_k_is_split_on_cpu_adapters_only(record):
    cpu = Limits(adapter="llvmpipe (LLVM 15.0.6, 256 bits) (CPU)", cpu=True)
    names = _matmul_names(record, cpu)
    assert any(" direct " in n and " split 2" in n for n in names), names
    assert any("sum of 2 K chunks" in n for n in names), names
    assert not any("split" in n for n in _matmul_names(record, Limits())), "GPU: no split"


@pytest.mark.parametrize("backend", [WEBGPU])
@pytest.mark.parametrize("record", RECORDS, ids=[r.name for r in RECORDS])
def test_long_k_matches_torch(record, backend):
    oracle.check(record, backend)


@pytest.mark.parametrize("backend", [WEBGPU])
def test_long_k_tiled_kernel_on_a_cpu_adapter(backend):
    """The tiled kernel forced onto the CPU adapter (as tests/test_webgpu.py does for the
    GPU tilings) gets the same K chunks."""
    oracle.check(RECORDS[0], backend, KernelOptions(force_direct=False))
