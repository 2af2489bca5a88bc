"""Tiled fused attention kernels for GPUs: the ops of codegen/attention.py, plus the
one-pass forms attention_match.py uses where these kernels run (attn_fwd: O and lse;
attn_dkv: dK and dV), each a workgroup that owns a block of rows and streams the other
side's rows through workgroup memory, flash-attention style.

Why: the row kernels of attention.py (a thread per query or key, its vectors in registers)
leave a GPU nearly idle in the backward: at GPT-2 size attn_dk / attn_dv ran 10-12 ms each
on an H200 (a few hundred workgroups of 64 threads, each thread walking 512 rows with 192
registers of vectors); here the three kernels of a training step take 0.79 ms together
(bench/README.md). Every kernel is a chain of small matrix products between
workgroup-memory tiles, which is the shape GPUs are built for.

Notation as in attention.py: q = A [.., T, D], k^T = B [.., D, S], v = V [.., S, Dv],
g = G [.., T, Dv]; s_ij = scale q_i . k_j over kept keys (j <= i + offset [+ pos]);
p_ij = exp(s_ij - lse_i); ds_ij = p_ij (g_i . v_j - Drow_i).

A workgroup of 16 x 16 threads owns BR rows ("own" side) and loops over the "streamed"
side BC rows at a time; W is a BR x BC tile, X the streamed rows it multiplies:
  kernel    own      streamed  W -> X                       out (a row of the result)
  attn_lse  queries  keys      online log-sum-exp per row    lse_i
  attn_out  queries  keys      p (or p online) -> v          O_i = sum_j W v_j
  attn_fwd  queries  keys      p online -> v                 [O_i | lse_i]
  attn_dq   queries  keys      ds -> k                       scale sum_j W k_j
  attn_dv   keys     queries   p^T -> g                      sum_i W g_i
  attn_dk   keys     queries   ds^T -> q                     scale sum_i W q_i
  attn_dkv  keys     queries   p^T -> g, then ds^T -> q      [dK_j | dV_j]
Per streamed block: the scores (own . streamed over D) and, for dq / dk / dkv, g . v over
Dv are products of D-chunks (DK wide) staged in workgroup memory (As: own, Bs: streamed),
each thread owning a TR x TC block of the tile (TR = BR / 16: rows ty*TR + a up to 4 per
thread, read as one vec{TR}; 8 are two vec4s 64 rows apart, likewise columns). W goes to
workgroup memory transposed (Ws: a thread's adjacent rows of one column are one vector,
stored as one), then out += W @ X with X staged XK rows at a time (Xs; where the loads
are issued ahead, the whole block at once in As's and Bs's words, the "x_whole" option), each thread
owning TR rows x EP/16 output columns (4 adjacent ones per 64, vec4 reads, where the
width pads to whole 64s; else tx + 16 e). Global loads are issued ahead of their use:
the next D chunk's before the current chunk's products, and a block's X rows before its
scores (the loads are `let`s, stored to workgroup memory later), so their latency hides
behind arithmetic; with barriers between every stage and one or two workgroups per SM,
the exposed latency was what held these kernels back (bench/README.md). The backward's
softmax statistics come from elsewhere (lse, Drow: FA-2's backward recomputes p from the
saved lse, and Drow = rowsum(g * O) is a plain reduction in the IR), so the only row
reductions across threads are attn_lse's final combine of per-thread (max, sum) pairs
and the online softmax's per-block row maximum and final row sums, through workgroup
memory (As, free between a block's products, read back as vec4s; no subgroup operations:
they are an optional WebGPU feature this compiler does not request yet).
Causal blocks beyond the diagonal are never visited: a query block stops at its last
kept key, a key block starts at its first query; the workgroups run block-major, the
blocks with the most streamed rows first, so that the short ones fill the GPU's tail.
dQ and dK / dV are separate kernels (WebGPU has no float atomics).

Every loop bound depends only on the workgroup (a runtime cache position is read with
workgroupUniformLoad), so the barriers are in uniform control flow. Rows past T or S
read clamped addresses and are zeroed or masked; head dims that are not multiples of 16
(odd ones too) are padded with zeros in workgroup memory. Tile sizes follow the device's
maxComputeWorkgroupStorageSize (WebGPU's default 16 KiB: 32-row blocks; 32 KiB or more:
64, with 32-wide D chunks where they fit: the H200 through Dawn offers 48 KiB; there the
query kernels over rows of 1024 or more take 128-row blocks, LONG_BLOCKS). Bounds tests
are emitted only where a block does not divide its extent. KernelOptions.attn_opts switches each of these
choices so that bench/attention.py --variants can measure it against its absence.

The files: this one is the driver (build_tiled, which codegen/attention.py calls for every
attention op on GPUs); attention_tiled_plan.py decides the blocks, threads and options
(TilePlan, no WGSL); attention_tiled_kernel.py emits the WGSL stage by stage (TiledKernel).
"""
from __future__ import annotations

from .attention_mma import build_mma, use_mma
from .attention_tiled_kernel import TiledKernel
from .attention_tiled_plan import (Operands, TilePlan, choose_blocks, operands, plan_of,
                                   plan_tiled, use_tiled)

# build_tiled is a driver over the pieces, in the order they emit: plan_of picks the blocks
# and code options of one op (attention_tiled_plan.py; pure: tests/test_attention_tiled.py
# checks its indices and workgroup arrays by emulation); TiledKernel emits the kernel's stages,
# one method each (attention_tiled_kernel.py): the workgroup's rows and causal range (open),
# the accumulators, per streamed block the prefetched X rows, the scores and softmax
# statistics (scores, weights) and the output products (accumulate), then the per-op
# epilogue (epilogue_lse for attn_lse, epilogue_rows for the others).


def build_tiled(ctx) -> list[dict]:
    """The tiled kernel of ctx's attention node: plan, then the stages in order (a
    half-precision program's on subgroup matrices where the adapter has them:
    attention_mma.py)."""
    if use_mma(ctx):
        return build_mma(ctx)
    plan = plan_of(ctx.main_node, ctx.g, ctx.limits)
    k = TiledKernel(ctx, plan, operands(ctx.main_node))
    k.open()
    k.accumulators()
    with k.em.block(f"for (var c0 = {k.cbeg}; c0 < {k.cend}; c0 += {plan.BC}u)"):
        x_pre = k.prefetch_x()
        s, dp = k.scores()
        for i, w in enumerate(k.weights(s, dp)):
            k.accumulate(i, w, x_pre)
    if plan.op == "attn_lse":
        k.epilogue_lse()
    else:
        k.epilogue_rows()
    return [k.dispatch()]


__all__ = ["build_tiled", "use_tiled", "choose_blocks", "plan_tiled", "plan_of", "TilePlan",
           "operands", "Operands"]
