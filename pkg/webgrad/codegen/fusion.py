"""Fusion: which tensors get storage, which kernel computes each, and in what order.

The IR is cut into *groups*; each group is one kernel (a reduction split in two passes is
two dispatches of one group) that computes some tensors and stores those that anything
outside it reads. The rules, in order:

 1. Storage. Leaves (inputs, params, state) and non-uniform constants are stored; so is
    the output of every kernel op (matmul, reductions, row ops, scatter, fold: the ops whose
    registry row names a kernel kind, codegen/kinds.py). Everything else - elementwise ops,
    layout ops, one_hot, gathers, random numbers, unfold - is an *expression*, computed
    inside whichever kernel reads it.
 2. An expression is stored (becomes an *anchor*) when it must be: it is a graph output or
    a writeback value (unless it is a free reshape of something stored), or a matmul reads
    it and no affine view reaches it (matmul wants strides, not recomputation), or it is
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
    the binding limit.
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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from . import elementwise
from .elementwise import const_fill
from .emit import EXPR_RULES
from .kinds import ELEMENTWISE_OPS, KERNEL_OPS, LEAF_OPS, VIEW_OPS, cost_of, lowering_of
from .layout import canon_digits, merge_batch_into_k, strided_view, swaps_last_two
from .matmul import b_k_fast, matmul_dims
from .matmul_config import group_config
from .quant import quant_base
from .reduce import ReduceShape, scratch_specs
from .wgsl import Limits


@dataclass
class Group:
    id: int
    main: int | None               # the kernel op's node (None: elementwise kernel)
    anchors: list[int]             # fused tensors this kernel computes (in node order)
    numel: int                     # elements of the domain every output is indexed by
    order: int = 0                 # node order (for a stable schedule)
    after: set[int] = field(default_factory=set)  # extra ordering edges (in-place writes)

    @property
    def outputs(self) -> list[int]:
        return ([self.main] if self.main is not None else []) + self.anchors


class FusionError(NotImplementedError):
    pass


class Fusion:
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
        self._costs()
        for sid, x in list(self.matmul_fold.items()):  # its matmul got stored after all
            if x in self.mat or self.folded_views(x) is None:
                del self.matmul_fold[sid]
                self.mat.add(x)
        for sid in list(self.sum_source):  # likewise an inner sum: reduce what is stored
            if g[sid].inputs[0] in self.mat:
                del self.sum_source[sid]
        self._roots()
        self._form_groups()
        self._merge()
        self._assemble()
        self._inplace()
        self._operand_sums()
        self._output_sums()
        self._schedule()

    # ------------------------------------------------------------ storage decisions
    def has_storage(self, n: int) -> bool:
        return n in self.stored or n in self.mat

    def operand_base(self, n: int) -> bool:
        """Where a matmul operand's strided view may stop: stored, or a dequantize that the
        kernel decodes in registers (codegen/quant.py)."""
        return self.has_storage(n) or quant_base(self.g, n, self.has_storage)

    def _classify(self):
        for n in self.g.nodes:
            if n.op in LEAF_OPS:
                self.stored.add(n.id)
            elif n.op == "const" and const_fill(n) is None:
                self.stored.add(n.id)
            elif n.op in KERNEL_OPS:
                self.mat.add(n.id)
            elif n.op not in EXPR_RULES:
                where = f" (at {n.loc})" if n.loc else ""
                raise FusionError(f"backend 'webgpu' cannot lower op {n.op!r} (%{n.id}){where}")
            if n.op == "dequantize" and not self.has_storage(n.inputs[0]):
                self.mat.add(n.inputs[0])  # its readers decode the words from a buffer

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
            if lowering_of(n.op) not in ("matmul", "attention"):
                continue
            has = self.operand_base if n.op == "matmul" else self.has_storage
            for x in n.inputs:
                while strided_view(g, x, has) is None:
                    y = x
                    while g[y].op in VIEW_OPS and not has(y):
                        y = g[y].inputs[0]
                    if has(y):  # a view no digits express: store the operand
                        self.mat.add(x)
                        break
                    self.mat.add(y)         # an expression under the view: store it

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
        """Store expressions that are costly to recompute or that bind too many buffers."""
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
                cands = [i for i in n.inputs if not self.has_storage(i) and len(loads[i]) > 1]
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
            if n.size <= 1 or not self.cons[n.id]:
                continue
            # read through a broadcast: each element recomputed many times (a pad reads
            # each once, so the padded logit gradient computes the gradient in its kernel)
            expand = any(g[c2].op not in KERNEL_OPS and g[c2].op != "pad" and g[c2].size > n.size
                         for c2 in self.cons[n.id])
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

    # ------------------------------------------------------------ groups
    def _form_groups(self):
        self.groups: dict[int, Group] = {}
        self.group_of: dict[int, int] = {}
        for n in self.g.nodes:
            if n.id not in self.mat:
                continue
            gid = len(self.groups)
            if n.op in KERNEL_OPS:
                G = Group(gid, n.id, [], n.size, n.id)
            else:
                G = Group(gid, None, [n.id], n.size, n.id)
            self.groups[gid] = G
            self.group_of[n.id] = gid
        self._loads_cache: dict[int, dict[int, bool]] = {}
        self._leaves_of: dict[int, list[int]] | None = None  # binding_estimate's

    def preserves(self, node, k: int) -> bool:
        """Is input k read at the flat index node is read at?"""
        x = self.g[node.inputs[k]]
        if node.op in ELEMENTWISE_OPS or node.op in ("reshape", "broadcast_to"):
            return x.size == node.size
        if node.op == "transpose":
            moved = [p for p in node.attrs["perm"] if x.shape[p] != 1]
            return moved == sorted(moved)
        return False

    def loads(self, gid: int) -> dict[int, bool]:
        """Stored tensors group gid reads -> whether every read is at the domain's index.
        A read through pad(.., slice(x)) along the last axis, both at 0, with x as wide as
        the pad (align_match.py's padded logits, read by the padded logit gradient) is at
        the domain's index too: the state between the two is ("cols", width)."""
        if gid in self._loads_cache:
            return self._loads_cache[gid]
        G, g = self.groups[gid], self.g
        inside = set(G.anchors)
        res: dict[int, bool] = {}
        seen = set()
        stack = [(a, True) for a in G.anchors]
        if G.main is not None:
            stack += [(i, False) for i in g[G.main].inputs]
        while stack:
            n, ident = stack.pop()
            if (n, ident) in seen:
                continue
            seen.add((n, ident))
            if n == G.main or (self.has_storage(n) and n not in inside):
                res[n] = res.get(n, True) and ident is True
                continue
            node = g[n]
            for k, i in enumerate(node.inputs):
                stack.append((i, self._read_at(node, k, ident)))
        self._loads_cache[gid] = res
        return res

    def _read_at(self, node, k: int, ident):
        """Where node reads input k, given where node is read: True (the domain's index),
        False, or ("cols", W): at the domain's index of a last axis W wide, cut short."""
        x = self.g[node.inputs[k]]
        last = len(node.shape) - 1
        if ident is True and node.op == "pad" and node.attrs["axis"] == last \
                and node.attrs["before"] == 0:
            return ("cols", node.shape[-1])
        if isinstance(ident, tuple):
            if node.op == "slice" and node.attrs["axis"] == last and node.attrs["start"] == 0:
                return x.shape[-1] == ident[1]
            return ident if node.op in ELEMENTWISE_OPS and x.shape == node.shape else False
        return ident and self.preserves(node, k)

    def deps(self, gid: int) -> set[int]:
        out = {self.group_of[s] for s in self.loads(gid) if s in self.mat}
        out |= self.groups[gid].after
        out.discard(gid)
        return out

    def depends(self, a: int, b: int) -> bool:
        """Does group a (transitively) need group b?"""
        stack, seen = [a], set()
        while stack:
            x = stack.pop()
            for d in self.deps(x):
                if d == b:
                    return True
                if d not in seen:
                    seen.add(d)
                    stack.append(d)
        return False

    def binding_estimate(self, outputs, loads) -> int:
        if self._leaves_of is None:  # writeback value -> the persistent leaves it replaces
            self._leaves_of = {}
            for name, r in self.g.writebacks.items():
                leaf = self.persist_leaf.get(name)
                if leaf is not None:
                    self._leaves_of.setdefault(r, []).append(leaf)
        inplace = sum(1 for o in outputs
                      if any(loads.get(leaf) for leaf in self._leaves_of.get(o, ())))
        return len(set(loads) | set(outputs)) - inplace

    def scratch_bindings(self, main: int | None) -> int:
        """Scratch buffers that the last dispatch of kernel op `main` binds beside its
        epilogue's: one for a split reduction's partials or scatter_add_rows' row lists."""
        if main is None:
            return 0
        node = self.g[main]
        kind = lowering_of(node.op)
        if kind == "scatter":
            return 1
        if kind == "reduce":
            return 1 if scratch_specs(self.g, node, self.sum_source.get(main), self.limits.options) else 0
        return 0

    def _merge(self):
        limit = self.limits.max_storage_buffers_per_shader_stage
        for gid in sorted(self.groups, key=lambda i: self.groups[i].order):
            G = self.groups.get(gid)
            if (G is None or G.main is not None or len(G.anchors) != 1
                    or G.anchors[0] in self.piecewise):
                continue
            ld = self.loads(gid)
            cands: dict[int, bool] = {}
            reads: dict[int, int] = {}
            for s, ident in ld.items():
                h = self.group_of.get(s)
                if h is not None and h != gid and self.groups[h].numel == G.numel:
                    cands[h] = cands.get(h, True) and ident
                    reads[h] = reads.get(h, 0) + 1
            # prefer the kernel that computes most of what this one reads (Adam's p' reads
            # m' and v': join their kernel), then the latest
            for h in sorted(cands, key=lambda i: (-reads[i], -self.groups[i].order)):
                if not cands[h]:
                    continue
                H = self.groups[h]
                if any(a in self.piecewise or a in self.transposed for a in H.anchors):
                    continue
                if H.main is not None and self.g[H.main].op == "write_rows":
                    continue  # its in-place form visits only the new rows: no epilogue
                if any(self.depends(d, h) for d in self.deps(gid) if d != h):
                    continue  # gid needs something that needs H: merging would form a cycle
                merged_loads = dict(self.loads(h))
                for s, ident in ld.items():
                    merged_loads[s] = merged_loads.get(s, True) and ident
                outs = H.outputs + G.anchors
                for o in outs:
                    merged_loads.pop(o, None)
                if self.binding_estimate(outs, merged_loads) > limit - self.scratch_bindings(H.main):
                    continue
                H.anchors += G.anchors
                H.after |= G.after
                for a in G.anchors:
                    self.group_of[a] = h
                del self.groups[gid]
                # a group's loads follow from its own anchors and main alone: only H's changed
                self._loads_cache.pop(h, None)
                self._loads_cache.pop(gid, None)
                break

    # ------------------------------------------------------------ assembled tensors
    def _assemble(self):
        """A tensor z that is a sum of zero pads along one axis, disjoint and covering it,
        each of a view (slice / transpose / reshape) of an attention kernel's output that
        nothing else reads (the QKV gradient: dQ, dK and dV through merge_heads, padded
        into [B, T, 3C] and added), is never computed: each producer's epilogue stores
        its elements straight into z's buffer, where the views and the pad put them
        (program.GroupCtx.write_outputs), and the pieces get no buffer. z's group stays,
        as an ordering point after its producers, with no dispatch.
        self.assembled: piece -> [(z, [the view nodes from the piece up to the pad])];
        self.assembled_groups: z's group -> the producers' groups."""
        g = self.g
        self.assembled: dict[int, list[tuple[int, list]]] = {}
        self.assembled_groups: dict[int, set[int]] = {}
        if not self.limits.options.assemble:  # KernelOptions: tests compute it in a kernel of its own
            return
        roots = set(g.outputs.values()) | set(g.writebacks.values())
        readers: dict[int, set[int]] = {}
        for h in self.groups:
            for n in self.loads(h):
                readers.setdefault(n, set()).add(h)
        for gid, G in list(self.groups.items()):
            if G.main is not None or len(G.anchors) != 1:
                continue
            z = G.anchors[0]
            if z in roots or g[z].dtype != "f32" or g[z].op != "add":
                continue
            terms, stack = [], [z]
            while stack:
                n = stack.pop()
                if g[n].op == "add" and (n == z or not self.has_storage(n)):
                    stack += g[n].inputs
                else:
                    terms.append(n)
            pieces = []
            for t in terms:
                pad = g[t]
                if (pad.op != "pad" or self.has_storage(t)
                        or (pieces and pad.attrs["axis"] != pieces[0][2])):
                    break
                chain, n = [pad], pad.inputs[0]
                while not self.has_storage(n) and g[n].op in ("slice", "transpose", "reshape"):
                    chain.append(g[n])
                    n = g[n].inputs[0]
                h = self.group_of.get(n)
                if (not self.has_storage(n) or n in roots or h is None or self.groups[h].main != n
                        or lowering_of(g[n].op) != "attention" or readers.get(n) != {gid}):
                    break
                pieces.append((n, chain[::-1], pad.attrs["axis"]))
            else:
                ax = pieces[0][2] if pieces else None
                spans = sorted((c[-1].attrs["before"], c[-1].attrs["before"]
                                + g[c[-1].inputs[0]].shape[ax]) for _, c, _ in pieces)
                if not spans or spans[0][0] != 0 or spans[-1][1] != g[z].shape[ax] or any(
                        a[1] != b[0] for a, b in zip(spans, spans[1:])):
                    continue
                for n, chain, _ in pieces:
                    self.assembled.setdefault(n, []).append((z, chain))
                self.assembled_groups[gid] = {self.group_of[n] for n, _, _ in pieces}

    # ------------------------------------------------------------ in-place writebacks
    def _inplace(self):
        g = self.g
        self.inplace: dict[int, str] = {}   # node -> persistent name it is computed into
        self.end_copies: list[tuple[int, str]] = []  # (stored node, persistent name)
        readers_of: dict[int, list[int]] = {}  # stored node -> the groups that load it
        for h in self.groups:
            for n in self.loads(h):
                readers_of.setdefault(n, []).append(h)
        for name, r in g.writebacks.items():
            s = self.storage_base(r)
            leaf = self.persist_leaf.get(name)
            if s == leaf:
                continue  # the value is the old value: nothing to do
            if s in self.stored or s in self.inplace:
                self.end_copies.append((s, name))
                continue
            gid = self.group_of[s]
            ok = g[s].size == g[leaf].size if leaf is not None else True
            readers = []
            if ok and leaf is not None:
                for h in readers_of.get(leaf, ()):
                    ld = self.loads(h)
                    if h == gid:  # write_rows of the leaf itself: written row by row, in place
                        ok = ok and (ld[leaf] or (g[s].op == "write_rows" and g[s].inputs[0] == leaf))
                    else:
                        readers.append(h)
                        ok = ok and not self.depends(h, gid)
            if ok:
                self.groups[gid].after |= set(readers)
                self.inplace[s] = name
            else:
                self.end_copies.append((s, name))

    # ------------------------------------------------------------ operand sums
    def _operand_sums(self):
        """A bias gradient is the column sum of the very tensor its weight gradient reads as
        an operand over the same rows (y = x W + b: dW = x^T dY, db = sum of dY's rows).
        The weight gradient's kernel stages every K step of dY in workgroup memory anyway:
        it sums what it stages into K-chunk partials (codegen/matmul_tiled.py), and the sum keeps
        only its second pass, over those partials, where its epilogue (the bias' AdamW
        update) runs. self.operand_sums: sum group -> (matmul group, operand 0 / 1), the
        sum ordered after the matmul."""
        g = self.g
        self.operand_sums: dict[int, tuple[int, int]] = {}
        if not self.limits.options.operand_sums:
            return
        readers: dict[int, list[tuple[int, int]]] = {}  # stored x -> (matmul group, operand)
        limit = self.limits.max_storage_buffers_per_shader_stage
        for gid, G in self.groups.items():
            m = G.main
            if m is None or (g[m].op != "matmul" and m not in self.matmul_fold):
                continue
            M, K, N, nb, shared_b = matmul_dims(g, self, m)
            cfg = group_config(self.limits, M, K, N, nb, shared_b, b_k_fast(g, self, m))
            if cfg is None or cfg.gemv or nb != 1:  # the kernels that take no sums
                continue
            if cfg.splits == 1 and self.binding_estimate(G.outputs, self.loads(gid)) + 1 > limit:
                continue  # the partials' binding beside the epilogue's would be one too many
            if m in self.matmul_fold:
                views = self.folded_views(self.matmul_fold[m])
            else:
                views = [strided_view(g, i, self.operand_base) + (g[i].shape,)
                         for i in g[m].inputs]
            for k, (base, off, dims, shape) in enumerate(views):
                X = shape[-2] if k == 0 else shape[-1]
                xd, kd = (dims[-2], dims[-1]) if k == 0 else (dims[-1], dims[-2])
                # the operand is x [.., X] itself, its rows along K: x^T for A, x for B
                if (off == 0 and self.has_storage(base) and g[base].size == K * X
                        and g[base].shape[-1:] == (X,) and canon_digits(xd) == [(X, 1)]
                        and canon_digits(kd) == [(K, X)]):
                    readers.setdefault(base, []).append((gid, k))
        taken = set()
        for gid, G in self.groups.items():
            m = G.main
            if m is None or g[m].op != "sum":
                continue
            s = ReduceShape(g, g[m], self.sum_source.get(m))
            if (g[s.x].dtype != "f32" or len(s.xs) < 2
                    or s.axes != tuple(range(len(s.xs) - 1))):
                continue
            for mg, k in readers.get(s.x, ()):
                if (mg, k) not in taken and not self.depends(mg, gid):
                    taken.add((mg, k))
                    self.operand_sums[gid] = (mg, k)
                    G.after.add(mg)
                    break

    def _output_sums(self):
        """The column sums of an expression of a matmul's output, read at the output's own
        index (layer norm's weight and bias gradients, sum(dY * y) and sum(dY), where dY is
        the next Linear's input gradient): the matmul's epilogue evaluates the expression,
        adds it over each thread's rows, then over its workgroup's threads, into partials
        per tile row (codegen/matmul_tiled.py; a split product's chunk sum, per block of rows),
        and the sum keeps only its second pass. self.output_sums: sum group -> matmul
        group."""
        g = self.g
        self.output_sums: dict[int, int] = {}
        if not self.limits.options.operand_sums:
            return
        limit = self.limits.max_storage_buffers_per_shader_stage
        extra: dict[int, set] = {}  # matmul group -> what its epilogue's sums read
        written = {self.persist_leaf[name] for name in self.inplace.values()
                   if name in self.persist_leaf}
        for gid, G in self.groups.items():
            m = G.main
            if (m is None or g[m].op != "sum" or gid in self.operand_sums
                    or m in self.sum_source):
                continue
            x = g[m].inputs[0]
            xs = g[x].shape
            if (g[x].dtype != "f32" or len(xs) < 2
                    or tuple(sorted(g[m].attrs["axes"])) != tuple(range(len(xs) - 1))):
                continue
            mms, leaves, stack, seen = set(), set(), [(x, True)], set()
            while stack:
                n, ident = stack.pop()
                if (n, ident) in seen:
                    continue
                seen.add((n, ident))
                if self.has_storage(n):
                    h = self.group_of.get(n)
                    if h is not None and self.groups[h].main == n and g[n].op == "matmul":
                        mms.add((n, ident is True))
                    else:
                        leaves.add(n)
                    continue
                for k, i in enumerate(g[n].inputs):
                    stack.append((i, self._read_at(g[n], k, ident)))
            if len(mms) != 1:
                continue
            (mm, ident), = mms
            mg = self.group_of[mm]
            if not ident or g[mm].shape != xs or leaves & written:
                continue  # read elsewhere than at its own index; or a parameter written in
                # place, whose readers _inplace ordered before its writer
            cfg = group_config(self.limits, *matmul_dims(g, self, mm), b_k_fast(g, self, mm))
            if cfg is None or cfg.gemv or self.depends(mg, gid):
                continue
            ups = {self.group_of[c] for c in leaves if c in self.group_of}
            if any(self.depends(u, mg) or u == gid for u in ups):
                continue
            reads = extra.get(mg, set()) | leaves
            n_sums = (sum(1 for v in self.output_sums.values() if v == mg) + 1
                      + sum(1 for h, _ in self.operand_sums.values() if h == mg))
            loads = {**self.loads(mg), **{c: True for c in reads}}
            if self.binding_estimate(self.groups[mg].outputs, loads) + n_sums > limit:
                continue
            extra[mg] = reads
            self.output_sums[gid] = mg
            self.groups[mg].after |= ups
            G.after.add(mg)

    # ------------------------------------------------------------ schedule
    def _schedule(self):
        """Groups in dependency order, ties by the node order of the earliest group that
        needs them: a producer traced after its consumer's kernel op (the optimizer's
        scalars, read by the weight gradients' kernels the Adam update joined) runs just
        before that consumer, not after the whole backward pass, which would keep every
        activation gradient a weight gradient reads alive until then."""
        import heapq
        deps = {gid: self.deps(gid) for gid in self.groups}
        users: dict[int, list[int]] = {gid: [] for gid in self.groups}
        for gid, ds in deps.items():
            for d in ds:
                users[d].append(gid)
        prio = {gid: G.order for gid, G in self.groups.items()}
        for gid in sorted(self.groups, key=lambda i: -self.groups[i].order):
            for d in deps[gid]:  # deps mostly precede in node order: a few sweeps settle it
                prio[d] = min(prio[d], prio[gid])
        changed = True
        while changed:
            changed = False
            for gid, ds in deps.items():
                for d in ds:
                    if prio[gid] < prio[d]:
                        prio[d], changed = prio[gid], True
        indeg = {gid: len(ds) for gid, ds in deps.items()}
        ready = [(prio[gid], self.groups[gid].order, gid) for gid, k in indeg.items() if k == 0]
        heapq.heapify(ready)
        self.order: list[int] = []
        while ready:
            *_, gid = heapq.heappop(ready)
            self.order.append(gid)
            for u in users[gid]:
                indeg[u] -= 1
                if indeg[u] == 0:
                    heapq.heappush(ready, (prio[u], self.groups[u].order, u))
        if len(self.order) != len(self.groups):
            raise AssertionError("fusion produced a cyclic schedule")

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
