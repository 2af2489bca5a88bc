"""WGSL code generation: from a Graph to a WebGPU Plan (backends/gpu_host.py).

  options.py      KernelOptions: every switch that changes the WGSL, carried on Limits
  wgsl.py         the builder: bindings, limits, workgroup sizing, dispatch splitting, literals
  emit.py         expressions: any fusable node's value at an index, as WGSL text
  elementwise.py  elementwise formulas (erf, pow, ...) and the fused elementwise kernel
  layout.py       reshape/transpose/broadcast/slice/pad/concat as index arithmetic; affine views
  index.py        one_hot, gather_rows (expressions), scatter_add_rows (kernel)
  random.py       rand_uniform, bit-identical to primitives.rand_bits
  conv.py         unfold2d (expression), fold2d (kernel)
  rows.py         write_rows (kernel; in place into a state buffer: the KV cache step;
                  or stored by the product that computes its rows, fusion rule 9)
  reduce.py       sum, max_last, argmax_last, softmax/log_softmax/layer_norm (one kernel each)
  matmul.py       matmul groups: which of the kernels below takes a product
  matmul_config.py  the tilings: Config, ADAPTER_TILINGS, group_config (kernel and tile)
  matmul_tiled.py   the tiled, register-blocked kernel (GPUs); matmul_direct.py the
                  barrier-free one (CPU adapters); matmul_gemv.py matrix-vector
                  (decoding; matmul_gemv_cpu.py its CPU adapters' form); matmul_mma.py subgroup matrices (f16); matmul_splitk.py
                  the sum of a split product's K chunks
  quant.py        dequantize: quantized blocks decoded in registers by their readers
                  (matmul operands, gathers); the f32 weights are never stored
  attention_match.py, attention.py   softmax(mask(q k^T)) v and its gradient found in the
                  graph (attention_pattern.py), rewritten into flash-style kernels (no
                  [T, S] tensor stored)
  attention_tiled.py  those kernels on GPUs (workgroups of row blocks): build_tiled over
                  attention_tiled_plan.py (blocks, threads, options; no WGSL) and
                  attention_tiled_kernel.py (the WGSL, stage by stage); attention_split.py
                  decoding's attn_out over chunks of keys, then their combination
  rowfuse_match.py, rowfuse.py   cross entropy as logits - logsumexp + a pick; layer-norm
                  backward as one row kernel
  empty.py        zero-size tensors leave the graph before anything is planned
  fusion.py       storage decisions, kernel groups, merges, in-place writebacks, schedule:
                  the rules in order, over fusion_storage.py (what is stored),
                  fusion_groups.py (groups, merges, writebacks, schedule),
                  fusion_sums.py (sums taken by the kernels of their terms) and
                  fusion_prologue.py (normalized rows left to the matrix-vector products
                  that read them, which sum and apply them: gemv_prologue.py)
  program.py      the driver: pattern passes, buffer plan (../buffers.py), kernels, commands
  kinds.py        each op's lowering and cost, read from primitives.PRIMS (and the passes'
                  own ops): fusion's kernel ops, views, recompute weights
  cost.py         the cost model: each kernel's bytes and FLOPs (the profiler's static columns)
LOWERED_OPS lists every IR op this back end lowers: an expression rule (EXPR_RULES) or a
builder for its kernel kind (program.KERNELS); tests/test_registry.py checks it against
primitives.PRIMS.
"""
from __future__ import annotations

from . import conv, elementwise, index, layout, quant, random, rowfuse  # noqa: F401  (register expression rules)
from .emit import EXPR_RULES
from .fusion import FusionError
from .kinds import CODEGEN_OPS, lowering_of
from .options import KernelOptions
from .program import KERNELS, Lowered, lower
from .wgsl import LimitError, Limits
from ..primitives import EXPR, LEAF, PRIMS


def lowers(op: str) -> bool:
    """Whether this back end has op's lowering: its expression rule, its kind's builder, or
    (a leaf) the buffer the executor fills."""
    low = lowering_of(op)
    return low == LEAF or (op in EXPR_RULES if low == EXPR else low in KERNELS)


LOWERED_OPS: frozenset[str] = frozenset(op for op in [*PRIMS, *CODEGEN_OPS] if lowers(op))

__all__ = ["CODEGEN_OPS", "EXPR_RULES", "KERNELS", "LOWERED_OPS", "lower", "lowers", "Lowered",
           "Limits", "LimitError", "FusionError", "KernelOptions"]
