"""Fusion's storage rules (codegen/fusion.py's rules 1 and 2, and its two algebraic folds):
which tensors get a buffer of their own.

StorageRules is a mixin of fusion.Fusion: its methods run first in Fusion's constructor and
fill `stored` (leaves, non-uniform constants), `mat` (kernel outputs and anchors), the folds
`sum_source` and `matmul_fold`, and `transposed`, `piecewise`, `cost_stored`; the grouping
and sum rules (fusion_groups.py, fusion_sums.py) and codegen/program.py read them.
"""
from __future__ import annotations

from math import prod

from . import elementwise
from .elementwise import const_fill
from .emit import EXPR_RULES
from .kinds import ELEMENTWISE_OPS, KERNEL_OPS, LEAF_OPS, VIEW_OPS, cost_of, lowering_of
from .layout import merge_batch_into_k, strided_view, swaps_last_two
from .lowrank import lowrank_products
from .quant import quant_base


class FusionError(NotImplementedError):
    pass


class StorageRules:
    """Rules 1-2 of codegen/fusion.py and the folds (a mixin of fusion.Fusion)."""

    # ------------------------------------------------------------ storage decisions
    def has_storage(self, n: int) -> bool:
        return n in self.stored or n in self.mat

    def operand_base(self, n: int) -> bool:
        """Where a matmul operand's strided view may stop: stored, or a dequantize that the
        kernel decodes in registers (codegen/quant.py)."""
        return self.has_storage(n) or quant_base(self.g, n, self.has_storage)

    def _classify(self):
        lowrank = self._lowrank()
        for n in self.g.nodes:
            if n.op in LEAF_OPS:
                self.stored.add(n.id)
            elif n.op == "const" and const_fill(n) is None:
                self.stored.add(n.id)
            elif n.op in KERNEL_OPS and n.id not in lowrank:
                self.mat.add(n.id)
            elif n.op not in EXPR_RULES:
                where = f" (at {n.loc})" if n.loc else ""
                raise FusionError(f"backend 'webgpu' cannot lower op {n.op!r} (%{n.id}){where}")
            if n.op == "dequantize" and not self.has_storage(n.inputs[0]):
                self.mat.add(n.inputs[0])  # its readers decode the words from a buffer

    def _lowrank(self) -> set[int]:
        """Rule 1's exception: the small products that are expressions, computed in the
        epilogue of the product they are added to (codegen/lowrank.py)"""
        want = self.limits.options.lowrank_epilogue
        if want is False or (want is None and self.limits.cpu):
            return set()
        return lowrank_products(self.g, self.cons, set(self.g.roots()))

    def _half_results(self):
        """Where f16 values are stored in f16 (the device has shader-f16, no f16_emulation:
        program.half_storage), a kernel's result rounded to f16 (precision="mixed" rounds
        every matmul's) is stored rounded: the kernel's epilogue writes 2 bytes an element,
        its readers widen the f16 value, and the f32 result itself is never stored."""
        if not self.limits.shader_f16 or self.limits.options.f16_emulation:
            return
        g = self.g
        for n in g.nodes:
            if n.op == "cast" and n.attrs.get("dtype") == "f16" and g[n.inputs[0]].op in KERNEL_OPS:
                self.mat.add(n.id)

    def _fold_sums(self):
        """sum(sum(x, A1), A2) is one reduction of x over both sets of axes when nothing
        else reads the inner sum (cross entropy: take_along_last's sum, then mean_all)."""
        g = self.g
        roots = set(g.outputs.values()) | set(g.writebacks.values())
        self.sum_source: dict[int, tuple[int, tuple[int, ...]]] = {}
        for n in g.nodes:
            if n.op != "sum":
                continue
            x = n.inputs[0]
            if g[x].op != "sum" or len(self.cons[x]) != 1 or x in roots:
                continue
            x0, a0 = self.sum_source.get(x, (g[x].inputs[0], tuple(g[x].attrs["axes"])))
            kept = [d for d in range(len(g[x0].shape)) if d not in a0]
            self.sum_source[n.id] = (x0, tuple(sorted(set(a0) | {kept[a] for a in n.attrs["axes"]})))
            self.mat.discard(x)
            self.sum_source.pop(x, None)

    def _matmul_operands(self):
        g = self.g
        for n in g.nodes:
            # attention kernels read every row of k and v once per query: operands stay
            # strided views of stored tensors, as matmul's do, never recomputed expressions
            # (but attn_out's own query rows, a small expression: _query_expr)
            if lowering_of(n.op) not in ("matmul", "attention"):
                continue
            has = self.operand_base if n.op == "matmul" else self.has_storage
            for k, x in enumerate(n.inputs):
                if k == 0 and self._query_expr(n):
                    continue
                while strided_view(g, x, has) is None:
                    y = x
                    while g[y].op in VIEW_OPS and not has(y):
                        y = g[y].inputs[0]
                    if has(y):  # a view no digits express: store the operand
                        self.mat.add(x)
                        break
                    self.mat.add(y)         # an expression under the view: store it

    def _query_expr(self, n) -> bool:
        """Is n an attn_out (or its inference attn_lse) whose queries stay an expression, computed by the attention
        kernel's emitter as it stages its own rows (the tiled kernel: again for each block
        of keys, a decoding step's 4 rows of 64 beside 64 keys of 64)? Where storing them
        would take an elementwise kernel of its own (a decoding step's q rope, which reads
        its product at other columns too), not where they would join a product's epilogue
        (GPT-2's q, a slice of c_attn + bias: rule 3). KernelOptions.attn_q_expr: None on
        GPUs, True on any adapter, False never. The queries must be f32 and no part of
        them an output or written back."""
        want = self.limits.options.attn_q_expr
        if want is False or (want is None and self.limits.cpu) or not (
                n.op == "attn_out" or (n.op == "attn_lse" and self._inference_lse(n.id))):
            return False
        g = self.g
        y = n.inputs[0]
        while g[y].op in VIEW_OPS and not self.has_storage(y):
            y = g[y].inputs[0]
        if self.has_storage(y) or g[n.inputs[0]].dtype != "f32":
            return False
        roots = set(g.roots())
        reads = self.stored_reads([(y, True)], stop=lambda x: x in roots)
        if reads is None:   # part of the queries is an output or written back
            return False
        return not any(m in self.mat and g[m].size == g[y].size and ats == {True}
                       for m, ats in reads.items())

    def _inference_lse(self, n: int) -> bool:
        """Is attn_lse n read by attn_out alone (precision="mixed"/"f16" inference, whose
        rounded probabilities take the lse first: attention_match): its queries are those
        of attn_out, an expression for both."""
        return all(self.g[c].op == "attn_out" for c in self.cons[n])

    def _transposed_reads(self):
        """Rule 2, GPU adapters: a large transpose of the last two axes of a stored tensor
        (through slices and pads) read by elementwise ops is stored, so that the tiled
        transposing copy (elementwise.build_transposing_copy) writes it and its readers
        read it along its rows. The tied LM head's weight gradient, [768, 50304] added to
        the token table's [50257, 768] gradient in the scatter kernel's epilogue, was read
        a float per 200 KB there."""
        g = self.g
        self.transposed: set[int] = set()  # stored so; nothing merges into their kernels
        if not elementwise.tiled_transposes(self.limits):
            return
        for n in g.nodes:
            if (not swaps_last_two(n) or n.size < self.limits.options.transposed_read_min
                    or self.has_storage(n.id)
                    or not elementwise.tileable(n.shape) or not self.cons[n.id]
                    or any(g[c].op not in ELEMENTWISE_OPS for c in self.cons[n.id])):
                continue
            if all(elementwise._rounds_f16(g[c]) for c in self.cons[n.id]):
                continue   # its f16 rounding alone reads it: the transposing copy rounds
                # as it stores (elementwise.transposing_copy), one kernel, half the writes
            x = n.inputs[0]
            while not self.has_storage(x) and g[x].op in ("slice", "pad"):
                x = g[x].inputs[0]
            if self.has_storage(x):
                self.mat.add(n.id)
                self.transposed.add(n.id)

    def _fold_matmul_sums(self):
        """sum over all batch axes of a batched matmul (a weight gradient: sum_b x_b^T g_b)
        is one matmul whose K runs over batch and k, when nothing else reads the batched
        product and both operands' batch strides continue their K stride."""
        g = self.g
        roots = set(g.outputs.values()) | set(g.writebacks.values())
        self.matmul_fold: dict[int, int] = {}  # sum node -> its batched matmul
        for n in g.nodes:
            if n.op != "sum" or n.id in self.sum_source:
                continue
            x = n.inputs[0]
            mm = g[x]
            nb = len(mm.shape) - 2
            if (mm.op != "matmul" or nb == 0 or len(self.cons[x]) != 1 or x in roots
                    or tuple(sorted(n.attrs["axes"])) != tuple(range(nb))):
                continue
            if self.folded_views(x) is not None:
                self.matmul_fold[n.id] = x
                self.mat.discard(x)

    def folded_views(self, x: int):
        """[(base node, offset, dims, shape)] of a batched matmul's operands, 2-D, with the
        batch merged into K, or None (see layout.merge_batch_into_k)."""
        g = self.g
        views = []
        for op_, k_axis in zip(g[x].inputs, (-1, -2)):
            sh = g[op_].shape
            if tuple(sh[:-2]) != tuple(g[x].shape[:-2]):
                return None  # a broadcast operand: sum_b A B_b is not one matmul of this form
            v = strided_view(g, op_, self.has_storage)
            if v is None:
                return None
            kt = prod(sh[:-2]) * sh[k_axis]
            shape2 = (sh[-2], kt) if k_axis == -1 else (kt, sh[-1])
            views.append((v[0], v[1], merge_batch_into_k(v[2], k_axis), shape2))
        return views

    def _costs(self):
        """Store expressions that are costly to recompute or that bind too many buffers;
        never those of keep_expr (rule 8's chains, computed by the products that read them)."""
        g, limit = self.g, self.limits.max_storage_buffers_per_shader_stage
        cost: dict[int, int] = {}
        loads: dict[int, frozenset] = {}

        def store(i):
            self.mat.add(i)
            cost[i], loads[i] = 0, frozenset([i])

        def shrink(n, budget):
            while True:
                ls = frozenset().union(*(loads[i] for i in n.inputs)) if n.inputs else frozenset()
                if len(ls) <= budget:
                    return ls
                cands = [i for i in n.inputs if not self.has_storage(i) and len(loads[i]) > 1
                         and i not in self.keep_expr]
                if not cands:
                    return ls  # nothing left to store: the binding check in wgsl.py reports it
                store(max(cands, key=lambda i: len(loads[i])))

        self.piecewise: set[int] = set()  # concats written one input per dispatch
        for n in g.nodes:
            if self.has_storage(n.id):
                if n.op in KERNEL_OPS:  # its prologue's loads, its output and a scratch buffer
                    shrink(n, max(2, limit - 1 - max(1, self.scratch_bindings(n.id))))
                elif n.id in self.mat:  # an anchor already: its expression's loads + its output
                    shrink(n, max(2, limit - 1))
                cost[n.id], loads[n.id] = 0, frozenset([n.id])
                continue
            ls = shrink(n, max(2, limit - 1))
            if n.op == "concat" and len(ls) > max(2, limit - 1):
                self.piecewise.add(n.id)  # more inputs than bindings: copy them one by one
                store(n.id)
                continue
            c = cost_of(n.op).recompute + sum(cost[i] for i in n.inputs)
            cost[n.id], loads[n.id] = c, ls
            if n.size <= 1 or not self.cons[n.id] or n.id in self.keep_expr:
                continue
            # read through a broadcast: each element recomputed many times (a pad reads
            # each once, so the padded logit gradient computes the gradient in its kernel;
            # so does a concat: the loss-scale check's flattened gradients, read by its max)
            expand = any(g[c2].op not in KERNEL_OPS and g[c2].op not in ("pad", "concat")
                         and g[c2].size > n.size for c2 in self.cons[n.id])
            if expand and c >= 3:
                store(n.id)
            elif len(self.cons[n.id]) >= 2 and c >= 8 and not (self.remat and self.remat.skip(n.id, ls)):
                store(n.id)
                self.cost_stored.add(n.id)

    def storage_base(self, n: int):
        """The stored node whose buffer holds n's elements in n's order (n itself, or under
        reshapes / size-preserving broadcasts), or None."""
        g = self.g
        while not self.has_storage(n):
            node = g[n]
            if node.op in ("reshape", "broadcast_to") and g[node.inputs[0]].size == node.size:
                n = node.inputs[0]
            else:
                return None
        return n

    def _roots(self):
        g = self.g
        written = {self.persist_leaf[name] for name in g.writebacks if name in self.persist_leaf}
        for r in g.outputs.values():
            s = self.storage_base(r)
            if s is None or s in written:  # an output must show the value from before the step
                self.mat.add(r)
        for name, r in g.writebacks.items():
            s = self.storage_base(r)
            if s is None or (s in written and s != self.persist_leaf.get(name)):
                self.mat.add(r)
