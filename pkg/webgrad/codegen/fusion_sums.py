"""Fusion's sum rules (codegen/fusion.py's rules 5-7): sums computed by the kernels that
produce or read their terms, so that a training step saves kernels and memory traffic.

SumRules is a mixin of fusion.Fusion, run after the merges (fusion_groups.py): `assembled`
(the QKV gradient written by the attention kernels' epilogues), `operand_sums` (a bias
gradient summed from a weight gradient's staged tiles) and `output_sums` (layer norm's
weight and bias gradients summed in a matmul's epilogue). codegen/program.py and the
kernels' builders (matmul*.py, reduce.py) read them.
"""
from __future__ import annotations

from .kinds import lowering_of
from .layout import canon_digits, strided_view
from .matmul import b_k_fast, matmul_dims
from .matmul_config import group_config
from .reduce import ReduceShape


class SumRules:
    """Rules 5-7 of codegen/fusion.py (a mixin of fusion.Fusion)."""

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
            mms, leaves = set(), set()
            for n, ats in self.stored_reads([(x, True)], step=self._read_at).items():
                h = self.group_of.get(n)
                if h is not None and self.groups[h].main == n and g[n].op == "matmul":
                    mms.update((n, ident is True) for ident in ats)
                else:
                    leaves.add(n)
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
