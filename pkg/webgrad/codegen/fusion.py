"""Fusion: which tensors get storage, which kernel computes each, and in what order.

The IR is cut into *groups*; each group is one kernel (a reduction split in two passes is
two dispatches of one group) that computes some tensors and stores those that anything
outside it reads. The rules, in order:

 1. Storage. Leaves (inputs, params, state) and non-uniform constants are stored; so is
    the output of every kernel op (matmul, reductions, row ops, scatter, fold: the ops whose
    registry row names a kernel kind, codegen/kinds.py). Everything else - elementwise ops,
    layout ops, one_hot, gathers, random numbers, unfold - is an *expression*, computed
    inside whichever kernel reads it. One exception, where KernelOptions.lowrank_epilogue asks:
    a matmul over K <= 16 added elementwise to a larger product's output (LoRA's
    (x A^T) B^T and (dY B) A) is an expression too, summed by that product's epilogue once
    rule 3 merges the sum into its kernel (codegen/lowrank.py).
 2. An expression is stored (becomes an *anchor*) when it must be: it is a graph output or
    a writeback value (unless it is a free reshape of something stored), or a matmul reads
    it and no affine view reaches it (matmul wants strides, not recomputation; attention
    too, except an inference attention's queries that would need an elementwise kernel of
    their own, read by its emitter on GPUs: a decoding step's q rope,
    fusion_storage._query_expr), or it is
    worth it: read by several kernels and costly (its chain's recompute weights, from the
    rows' Cost, reach 8; unless codegen/remat.py finds that this saves no memory worth
    having: GELU's tanh, kept for the backward beside its input), or
    read through a broadcast (it would be recomputed many times), or its kernel would bind
    more buffers than the device allows; on GPU adapters, a large transpose of a stored
    tensor's last two axes that elementwise ops read (_transposed_reads: written by
    elementwise.py's tiled transposing copy, then read along its rows).
 3. Merging. An anchor's kernel is merged into the kernel of a tensor it reads at the
    *same flat index* (same element count, read through elementwise ops and reshapes
    only): the reader's expression is evaluated by the producer's writer thread. So bias +
    relu join their matmul (an epilogue), the loss chain joins its sum, and the whole Adam
    update of a parameter (m', v', p') joins the kernel that produced the gradient - one
    kernel writing several tensors. A merge is refused if it would form a cycle or exceed
    the binding limit. Siblings first (_merge_siblings): kernels of new parameter values that
    read one stored tensor at their index but cannot join its kernel (they also read what
    needs it: the loss-scale flag under precision="mixed") become one kernel.
 4. Writebacks in place. A new value of a param/state is computed straight into the
    persistent buffer when every other reader of the old value can run before the writing
    kernel and the writer itself reads the old value only at the same index (or is a
    write_rows of that very buffer, which then writes only its new rows: codegen/rowfuse.py);
    those readers get ordering edges. Otherwise the value goes to a temporary and is copied at the end of
    the step (copyBufferToBuffer): a step always sees the old values everywhere.
Two algebraic folds save whole kernels: sum(sum(x, A1), A2) is one reduction of x, and a
sum over the batch axes of a batched matmul (every weight gradient of a layer applied to
[B, T, D] activations) is one matmul whose K runs over batch and k. A concat with more
inputs than a kernel may bind is written one input per dispatch.
Three more save kernels and memory traffic in a training step:
 5. Assembled tensors (_assemble). A sum of disjoint zero pads of views of attention
    kernels' outputs (the QKV gradient) is written by those kernels' epilogues straight
    into its buffer; no kernel adds the pads.
 6. Operand sums (_operand_sums). A bias gradient, the row sum of the tensor a weight
    gradient reads as an operand over the same rows, is summed by the weight gradient's
    kernel from the tiles it stages; the sum keeps only its second pass.
 7. Output sums (_output_sums). The row sums of an expression of a matmul's output at its
    own index (layer norm's weight and bias gradients) are taken by the matmul's epilogue
    (a split product's: its chunk sum's).
Two save kernels in a decoding step:
 8. Normalized rows (fusion_prologue.py, GPUs). An A operand of matrix-vector products
    that is an elementwise chain of one row sum (RMSNorm: x * rsqrt(mean(x * x) + eps) * w)
    and the sum are not stored: each product's kernel sums the row and normalizes it as
    it reads A (gemv_prologue.py). The chain's row x is stored instead where it is an
    expression of several products (a residual stream): it joins the last one's epilogue.
 9. Rows in epilogues (fusion_groups._row_epilogues, GPUs). An in-place write_rows
    (rule 4: a decoding step's V cache row) whose new rows a product computes at its own
    index is stored by that product's epilogue, at the run-time position: no write_rows
    kernel, and no buffer for the rows that nothing else reads. A write whose rows read
    their product at other columns (K's, rotated) joins the epilogue that writes a
    sibling's rows read by the same kernel (V's: the attention reads both). Rows that are
    columns of a product's output (GPT-2's K and V, of c_attn's) are stored where they land.

The rules live in four modules, three a mixin of Fusion whose methods share its state (the
sets and maps each rule fills, read by the later ones): fusion_storage.py (rules 1-2 and the
two folds: what is stored), fusion_groups.py (the groups, rule 3's merges, rule 4's in-place
writebacks, rule 9 and the schedule), fusion_sums.py (rules 5-7), and fusion_prologue.py's functions
(rule 8: before rule 2, what it must store and leave unstored; before the groups form, the
plan). Fusion's constructor below runs them in order; codegen/remat.py's plan_fusion builds
it (again with some expressions left unstored, where that saves memory) and
codegen/program.py builds a kernel per group.
"""
from __future__ import annotations

from .fusion_groups import Group, GroupRules
from .fusion_prologue import row_prologues, store_rows
from .fusion_storage import FusionError, StorageRules
from .fusion_sums import SumRules
from .wgsl import Limits


class Fusion(StorageRules, GroupRules, SumRules):
    """The fusion plan of one graph on one adapter: its stored tensors (stored: leaves and
    constants; mat: kernel outputs and anchors), its groups and their schedule (order)."""

    def __init__(self, g, limits: Limits, remat=None):
        self.g, self.limits = g, limits
        self.remat = remat  # remat.Remat: what rule 2's cost test must not store, or None
        self.cost_stored: set[int] = set()  # those it did store
        self.cons = g.consumers()
        self.stored: set[int] = set()
        self.mat: set[int] = set()
        self.persist_leaf = {name: i for name, i in list(g.params.items()) + list(g.state.items())}
        self._classify()
        self._half_results()
        self._fold_sums()
        self._matmul_operands()
        self._transposed_reads()
        self._fold_matmul_sums()
        # rule 8's chains: what reads their sums is computed where the products read A,
        # from stored rows
        pro = set(row_prologues(self).values())
        self.keep_expr = frozenset().union(*(op.dep for op in pro))
        self.mat |= store_rows(self, pro)
        self._costs()
        for sid, x in list(self.matmul_fold.items()):  # its matmul got stored after all
            if x in self.mat or self.folded_views(x) is None:
                del self.matmul_fold[sid]
                self.mat.add(x)
        for sid in list(self.sum_source):  # likewise an inner sum: reduce what is stored
            if g[sid].inputs[0] in self.mat:
                del self.sum_source[sid]
        self._roots()
        self.prologue = row_prologues(self)   # matmul -> its A, computed as it is read
        for op in set(self.prologue.values()):
            self.mat.discard(op.a)
            self.mat.discard(op.s)
            self.mat.difference_update(op.dep)  # a rounded sum (fusion_prologue._rounded_sum)
        self._form_groups()
        self._merge_siblings()
        self._merge()
        self._assemble()
        self._inplace()
        self._row_epilogues()
        self._operand_sums()
        self._output_sums()
        self._schedule()

    # ------------------------------------------------------------ what needs storage
    def needs_storage(self) -> set[int]:
        """Outputs of groups that something reads from memory: another group, the host
        (outputs), or an end-of-step copy."""
        need = set(self.g.outputs.values()) | set(self.g.writebacks.values())
        need = {self.storage_base(n) for n in need}
        for gid in self.groups:
            for s in self.loads(gid):
                if s in self.mat and self.group_of[s] != gid:
                    need.add(s)
        need |= set(self.inplace)
        return {n for n in need if n is not None and n in self.mat and n not in self.assembled}


__all__ = ["Fusion", "FusionError", "Group"]
