"""Fusion's kernel groups (codegen/fusion.py's rules 3, 4 and 9): a group per stored tensor,
merged into the kernel that writes what it reads at the same index, new parameter values
written in place, cache rows written by the products that compute them, and the groups'
schedule.

GroupRules is a mixin of fusion.Fusion: it runs after the storage rules (fusion_storage.py)
and fills `groups`, `group_of`, `inplace`, `end_copies` and `order`; its queries (loads,
deps, depends, binding_estimate) serve the sum rules (fusion_sums.py) and
codegen/program.py, which builds one kernel per group.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .attention_split import split_scratch
from .kinds import ELEMENTWISE_OPS, KERNEL_OPS, lowering_of
from .reduce import scratch_specs


@dataclass
class Group:
    id: int
    main: int | None               # the kernel op's node (None: elementwise kernel)
    anchors: list[int]             # fused tensors this kernel computes (in node order)
    numel: int                     # elements of the domain every output is indexed by
    order: int = 0                 # node order (for a stable schedule)
    after: set[int] = field(default_factory=set)  # extra ordering edges (in-place writes)
    # in-place write_rows whose new rows this kernel's epilogue stores (_row_epilogues)
    rows: list[int] = field(default_factory=list)

    @property
    def outputs(self) -> list[int]:
        return ([self.main] if self.main is not None else []) + self.anchors + self.rows


class GroupRules:
    """Groups, merges, in-place writebacks and the schedule (a mixin of fusion.Fusion)."""

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
        starts = [(a, True) for a in G.anchors]
        if G.main is not None:
            starts += [(i, False) for i in g[G.main].inputs]
        for r in G.rows:  # the new rows at the domain's index, the start; not the target
            starts += [(g[r].inputs[1], True), (g[r].inputs[2], False)]
        res = self._reads(starts, set(G.anchors), G.main)
        self._loads_cache[gid] = res
        return res

    def _reads(self, starts, inside=frozenset(), main=None) -> dict[int, bool]:
        """The stored tensors that computing the (node, where it is read) pairs of `starts`
        reads, outside `inside` (main: the kernel op whose result the kernel has) -> whether
        every read is at the domain's index (loads)."""
        reads = self.stored_reads(
            starts, step=self._read_at,
            stored=lambda n: n == main or (self.has_storage(n) and n not in inside))
        return {n: ats == {True} for n, ats in reads.items()}

    def stored_reads(self, starts, step=None, stored=None, stop=None) -> dict | None:
        """The stored tensors an unstored expression reads, walked down from `starts` ((node,
        where it is read) pairs): stored tensor -> the set of the ways it is read. step(node,
        k, at): where node reads input k when node is read at `at` (default: the same index
        while the op preserves it, `at and preserves`); stored(n): the walk ends at n
        (default: has_storage); stop(n): an unstored node at which the caller gives up (the
        answer is then None)."""
        g = self.g
        step = step or (lambda node, k, at: at and self.preserves(node, k))
        stored = stored or self.has_storage
        reads: dict[int, set] = {}
        stack, seen = list(starts), set()
        while stack:
            n, at = stack.pop()
            if (n, at) in seen:
                continue
            seen.add((n, at))
            if stored(n):
                reads.setdefault(n, set()).add(at)
                continue
            if stop is not None and stop(n):
                return None
            node = g[n]
            stack.extend((i, step(node, k, at)) for k, i in enumerate(node.inputs))
        return reads

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
        epilogue's: one for a split reduction's partials, a split attention's or
        scatter_add_rows' row lists."""
        if main is None:
            return 0
        node = self.g[main]
        kind = lowering_of(node.op)
        if kind == "scatter":
            return 1
        if kind == "attention":
            return 1 if split_scratch(self.g, node, self.limits) else 0
        if kind == "reduce":
            return 1 if scratch_specs(self.g, node, self.sum_source.get(main), self.limits.options,
                                   cpu=self.limits.cpu) else 0
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
                if self._merged_bindings(h, gid) > limit - self.scratch_bindings(H.main):
                    continue
                self._absorb(h, gid)
                break

    def _merged_bindings(self, h: int, gid: int) -> int:
        """The bindings group h's kernel would need with group gid's elementwise work in it."""
        H, G = self.groups[h], self.groups[gid]
        loads = dict(self.loads(h))
        for s, ident in self.loads(gid).items():
            loads[s] = loads.get(s, True) and ident
        outs = H.outputs + G.anchors
        for o in outs:
            loads.pop(o, None)
        return self.binding_estimate(outs, loads)

    def _absorb(self, h: int, gid: int) -> None:
        """Group gid's anchors join group h (appended to h's); gid is gone."""
        H, G = self.groups[h], self.groups[gid]
        H.anchors += G.anchors
        H.after |= G.after
        for a in G.anchors:
            self.group_of[a] = h
        del self.groups[gid]
        # a group's loads follow from its own anchors and main alone: only H's changed
        self._loads_cache.pop(h, None)
        self._loads_cache.pop(gid, None)

    def _merge_siblings(self):
        """Rule 3's siblings, before its merges: elementwise kernels that compute new
        parameter/state values, of one size, whose only stored input of that size read at
        their own index is one tensor s, and that cannot join s's kernel (they also read
        something that needs s's kernel: merging would form a cycle), become one kernel that
        reads s once. Under precision="mixed" a parameter's update (p', m', v', each
        where(ok, new, old) behind the loss-scale skip) reads the gradient, but ok needs
        every gradient first: merged, the update is one kernel a parameter, not three that
        each reread the gradient. In an f32 step the update joins the gradient's kernel."""
        g = self.g
        limit = self.limits.max_storage_buffers_per_shader_stage
        written = set(g.writebacks.values())
        by_source: dict[int, list[int]] = {}
        for gid in sorted(self.groups, key=lambda i: self.groups[i].order):
            G = self.groups[gid]
            if (G.main is not None or G.numel <= 1 or not any(a in written for a in G.anchors)
                    or any(a in self.piecewise or a in self.transposed for a in G.anchors)):
                continue
            src = [s for s, ident in self.loads(gid).items()
                   if ident and s in self.mat and g[s].size == G.numel]
            if len(src) != 1:
                continue
            h = self.group_of[src[0]]
            if any(self.depends(d, h) for d in self.deps(gid) if d != h):
                by_source.setdefault(src[0], []).append(gid)
        for gids in by_source.values():
            h = gids[0]
            for gid in gids[1:]:
                H, G = self.groups[h], self.groups[gid]
                if G.numel != H.numel or self.depends(gid, h) or self.depends(h, gid):
                    continue
                if self._merged_bindings(h, gid) > limit:
                    continue
                self._absorb(h, gid)
                H.anchors.sort()

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

    def _row_epilogues(self):
        """Rule 9: an in-place write_rows (a decoding step's cache row, rule 4) whose new
        rows are an expression of one product's outputs (or of leaves), read at the
        product's own index (V = x @ Wv^T + b), is written by that product's epilogue
        (codegen/rows.store_row): its kernel is gone, and the rows need no buffer of their
        own unless something else reads them. One whose rows read their product at other
        columns too (K, rotated: no epilogue has the other columns) joins instead the
        product whose epilogue writes a sibling's rows that a reader of its own reads too
        (V's, both read by the attention): one kernel writes both. Rows that are columns
        of a product's output (GPT-2's K and V: c_attn's) are stored by its epilogue
        where those columns land. KernelOptions write_rows_epilogue and write_rows_join:
        None on GPUs, True on any adapter, False never (the join needs the epilogue)."""
        opts, cpu = self.limits.options, self.limits.cpu
        own = opts.write_rows_epilogue is True or (opts.write_rows_epilogue is None and not cpu)
        join = own and (opts.write_rows_join is True or (opts.write_rows_join is None and not cpu))
        self.row_cuts: dict[int, tuple] = {}  # write_rows -> (x, a, b): _rows_cut's
        if not own:
            return
        g = self.g
        left = []
        for s in self.inplace:
            if g[s].op != "write_rows" or self.groups[self.group_of[s]].main != s:
                continue
            cut = self._rows_cut(s)
            if cut is not None:   # columns of a product's output: stored where they land
                done = self._join_rows(s, self.group_of[cut[0]], {cut[0]: True}, cut)
            else:
                made = self._rows_made(s)
                hs = {self.group_of[x] for x in made}
                done = len(hs) == 1 and all(made.values()) and self._join_rows(s, hs.pop(), made)
            if not done:
                left.append(s)
        for s in left if join else ():
            readers = self._rows_readers(s)
            for h in sorted(self.groups, key=lambda i: self.groups[i].order):
                H = self.groups[h]
                if any(r2 in self.loads(r) for r in readers for r2 in H.rows) and \
                        self._join_rows(s, h, self._rows_made(s)):
                    break

    def _rows_made(self, s: int) -> dict[int, bool]:
        """What write_rows s's new rows read that a kernel computes -> whether at their index."""
        return {x: at for x, at in self._reads([(self.g[s].inputs[1], True)]).items()
                if x in self.mat}

    def _rows_cut(self, s: int):
        """(x, a, b) where write_rows s's new rows are columns a..b-1 of a kernel's output
        x, a [T, N] tensor (GPT-2's K and V: slices of c_attn's), else None."""
        g = self.g
        v = g[g[s].inputs[1]]
        if v.op != "slice" or v.attrs["axis"] != len(v.shape) - 1 or len(v.shape) != 2:
            return None
        x = v.inputs[0]
        while x not in self.mat and g[x].op == "cast" and g[x].attrs.get("dtype") == "f32" \
                and g[g[x].inputs[0]].dtype == "f32":
            # an f32 node widened to f32 (precision="f16" held in f32, f16_in_f32: the
            # product's output rounded, then read as f32): the same values
            x = g[x].inputs[0]
        return (x, v.attrs["start"], v.attrs["stop"]) if x in self.mat else None

    def _bound_outputs(self, h: int) -> list[int]:
        """Group h's outputs that its kernel stores: those another group reads, the
        program's roots and its cache rows. Not a value only its own epilogue reads
        (precision="f16"'s rounded product, _half_results: computed, rounded, read on)."""
        H, g = self.groups[h], self.g
        roots = {self.storage_base(r) for r in g.roots()}
        read = {x for k in self.groups if k != h for x in self.loads(k)}
        return [o for o in H.outputs if o in H.rows or o in roots or o in read]

    def _rows_readers(self, s: int) -> list[int]:
        return [r for r in self.groups if r != self.group_of[s] and s in self.loads(r)]

    def _join_rows(self, s: int, h: int, made: dict[int, bool], cut=None) -> bool:
        """Move in-place write_rows s out of its kernel into product group h's epilogue
        (rule 9), unless h is no product of the rows' size (of cut's x: _rows_cut), reads
        its own output at other indices, would bind more buffers than the device allows,
        or would form a cycle (h needs a reader of s, or what s reads needs h), or s must
        run before an in-place write of what it reads."""
        g = self.g
        w = self.group_of[s]
        W, H = self.groups[w], self.groups[h]
        vals = g[s].inputs[1]
        if (h == w or W.anchors or H.main is None or g[H.main].op != "matmul"
                or H.main in self.matmul_fold or H.numel != g[vals if cut is None else cut[0]].size
                or (cut is not None and cut[0] not in H.outputs)
                or any(x in self.assembled or (x in H.outputs and not at) for x, at in made.items())):
            return False
        if (any(self.depends(h, r) for r in self._rows_readers(s))
                or any(self.depends(self.group_of[x], h) for x in made if self.group_of[x] != h)
                or any(self.depends(a, h) for a in W.after)
                or any(w in G.after for G in self.groups.values())):
            return False
        loads = dict(self.loads(h))
        for x, at in self._reads([(vals, True), (g[s].inputs[2], False)]).items():
            loads[x] = loads.get(x, True) and at
        limit = self.limits.max_storage_buffers_per_shader_stage - self.scratch_bindings(H.main)
        if self.binding_estimate(H.outputs + [s], loads) > limit and \
                self.binding_estimate(self._bound_outputs(h) + [s], loads) > limit:
            return False
        H.rows.append(s)
        if cut is not None:
            self.row_cuts[s] = cut
        H.after |= W.after
        self.group_of[s] = h
        del self.groups[w]
        self._loads_cache.pop(h, None)
        return True

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
