"""Graph -> Plan: fusion groups, a buffer plan, one WGSL kernel per group, the command list.

`lower(graph, limits)` is the whole WebGPU compiler back end; its result is plain data (the
Plan of backends/gpu_host.py) plus the maps the runtime needs: which buffer each feed is
written to, where each output is read from, which buffers are the persistent store, what
constant data to upload once. Buffers:
  persistent  one per param / state / writeback name, shared with sibling programs
              (the plan's optional "persistent" key)
  feeds       one per input, written before every step
  constants   one per non-uniform constant, written once at load
  pool        temporaries, planned by liveness (buffers.py)
"""
from __future__ import annotations

import array
from dataclasses import dataclass, field
from math import prod

from ..buffers import END, Live, align, plan_pool
from .align_match import align_products
from .thin_grads import thin_grads
from .thin_siblings import thin_siblings
from .attention import build_attention
from .attention_match import rewrite_attention
from .rowfuse import build_row_kernel
from .rowfuse_match import rewrite_rows
from .conv import build_fold
from .cost import group_cost
from .elementwise import build_elementwise
from .empty import strip_empty
from .emit import Emitter, Epilogue, Idx, Storage
from .fusion import Fusion
from .attention_split import split_scratch
from .index import build_scatter, scatter_scratch
from .kinds import VIEW_OPS, lowering_of
from .layout import build_concat_pieces, strided_view
from .matmul import (b_k_fast, build_matmul, matmul_dims, matmul_scratch_bytes, mma_scratch_bytes,
                     mma_takes)
from .matmul_config import group_config
from .matmul_splitk import split_sum_parts
from .quant import QuantOperand
from .remat import plan_fusion
from .reduce import build_reduce, scratch_specs
from .rows import build_write_rows, store_row
from .wgsl import Kernel, LimitError, Limits


def describe(node) -> str:
    """How errors name a tensor: "input 'x' f32[2048]", "%3 matmul f32[33,33] (built at ...)"."""
    if node.op in ("input", "param", "state"):
        return f"{node.op} '{node.attrs['name']}' {node.type_str}"
    where = f" (built at {node.loc})" if node.loc else ""
    return f"%{node.id} {node.op} {node.type_str}{where}"


@dataclass
class Lowered:
    plan: dict
    feeds: dict            # input name -> buffer id
    outputs: dict          # output name -> (buffer id, byte offset, nbytes, shape, dtype)
    persistent: dict       # persistent name -> buffer id
    const_data: dict       # buffer id -> bytes to upload once
    kernel_count: int
    report: dict
    writers: dict          # persistent name -> index of the dispatch that writes it, or "copy"
    kernels: list = None   # per command: name, ops, nodes, workgroups, bytes, flops (cost.py)
    empty_outputs: dict = field(default_factory=dict)  # name -> (shape, dtype): zero-size
    # the pool's plan, for diagnostics (bench/memory_plan.py): buffers.Live per temporary
    # (keys ("t", node) and ("s", (group, k)) for scratch), its pool slot, the graph lowered
    # and the group run at each step
    pool: dict = field(default_factory=dict)


class GroupCtx:
    """What a kernel builder needs to know about its group (see the builders' modules)."""

    def __init__(self, low: "_Lowering", gid: int):
        fu = low.fu
        G = fu.groups[gid]
        self.g, self.limits, self.group = fu.g, low.limits, G
        self.main_node = fu.g[G.main] if G.main is not None else None
        self.numel = G.numel
        self._low = low
        self.compute = set(G.anchors)
        # in-place write_rows whose new rows its epilogue stores (fusion_groups._row_epilogues)
        self.rows = G.rows
        self.outs = [n for n in G.outputs if n in low.storage and n not in G.rows]
        self.scratch = low.scratch.get(gid, [])
        self.sum_source = fu.sum_source.get(G.main)  # (x, axes): a folded sum(sum(x))
        # a sum whose partials a matmul writes: how many per output (fusion.operand_sums)
        self.operand_parts = low.operand_parts.get(gid)
        # a matmul that writes them: (operand 0 / 1, the sum's scratch)
        self.operand_sum = next(((k, low.scratch[h][0]) for h, (mg, k) in
                                 fu.operand_sums.items() if mg == gid), None)
        # sums of expressions of its output, and their partials' scratch (fusion.output_sums)
        self.output_sums = [(fu.g[fu.groups[h].main].inputs[0], low.scratch[h][0])
                            for h, mg in fu.output_sums.items() if mg == gid]
        # its epilogue stores pieces of an assembled tensor (fusion_sums._assemble)
        self.writes_pieces = any(n in fu.assembled for n in G.outputs)
        # its A computed as it is read (fusion_prologue.py: a normalized row), or None
        self.prologue = fu.prologue.get(G.main)

    def storage(self, n):
        return self._low.storage.get(n)

    def kernel(self, name: str) -> Kernel:
        return Kernel(self.limits, name)

    def emitter(self, kernel: Kernel) -> Emitter:
        return Emitter(kernel, self.g, self.storage, compute=self.compute)

    def matmul_operands(self):
        """[(Storage, element offset, dims, shape)] for A and B (layout.strided_view): the
        main matmul's operands, or, for a sum folded over a batched matmul, the 2-D views
        with the batch merged into K. A computed as it is read (self.prologue) comes as
        (its gemv_prologue.RowOperand, 0, None, shape)."""
        fu = self._low.fu
        x = fu.matmul_fold.get(self.group.main)
        if x is not None:
            views = fu.folded_views(x)
        else:
            views = []
            for i in self.main_node.inputs:
                if i == self.main_node.inputs[0] and self.prologue is not None:
                    views.append((None, 0, None, tuple(self.g[i].shape)))
                    continue
                base, off, dims = strided_view(self.g, i, fu.operand_base)
                views.append((base, off, dims, tuple(self.g[i].shape)))
        out = []
        for base, off, dims, shape in views:
            if base is None:
                out.append((self.prologue, 0, None, shape))
                continue
            st = self.storage(base)
            if st is None:  # a view of dequantize(words): decoded as it is read
                node = self.g[base]
                st = QuantOperand(self.storage(node.inputs[0]), node.attrs["qtype"], node.size)
            out.append((st, st.offset + off, dims, tuple(shape)))
        return out

    def write_outputs(self, em: Emitter, flat: str, main_val: str | None, cols=None) -> None:
        """Evaluate every stored output of the group at flat index `flat`, then store them
        (all values first: an output written in place must not change under a later read)."""
        G = self.group
        if main_val is not None:
            em.bound[G.main] = (flat, main_val)
        vals = []
        for n in self.outs:
            v = main_val if n == G.main else em.value(n, Idx(self.g[n].shape, flat=flat))
            vals.append((self.storage(n), v))
        cuts = self._low.fu.row_cuts
        rows = []
        for r in self.rows:   # the rows' values: the new rows, or the product cut into them
            src = cuts[r][0] if r in cuts else self.g[r].inputs[1]
            rows.append((r, em.value(src, Idx(self.g[src].shape, flat=flat))))
        for st, v in vals:
            em.store(st, flat, v)
        for r, v in rows:  # into the cache's rows at the start (codegen/rows.py's in-place form)
            if r not in cuts:
                store_row(em, self.g[r], self.storage(r), flat, lambda v=v: v)
                continue
            x, a, b = cuts[r]   # columns a..b-1 of x [T, N]: the rows' element (t, c - a)
            N = self.g[x].shape[-1]
            c = em.let(f"{flat} % {N}u")
            with em.block(f"if ({c} >= {a}u && {c} < {b}u)"):
                at = em.let(f"{flat} / {N}u * {b - a}u + {c} - {a}u")
                store_row(em, self.g[r], self.storage(r), at, lambda v=v: v)
        for n in G.outputs:  # pieces of an assembled tensor (fusion_sums._assemble)
            for z, chain in self._low.fu.assembled.get(n, ()):
                v = main_val if n == G.main else em.value(n, Idx(self.g[n].shape, flat=flat))
                self._store_piece(em, n, flat, v, z, chain, cols)

    def _store_piece(self, em: Emitter, n: int, flat: str, v: str, z: int, chain, cols) -> None:
        """Store n's element at `flat` into z where the chain of views and the pad that
        ends it put it, if this piece covers it (a slice keeps part of n). cols: (name, lo,
        hi), the index variable `name` known to be in [lo, hi) (epilogue_fn)."""
        g = self.g
        dims, conds = list(em.unravel(flat, g[n].shape)), []
        for node in chain:
            ish = g[node.inputs[0]].shape
            a = node.attrs.get("axis")
            if node.op == "slice":
                start, stop = node.attrs["start"], node.attrs["stop"]
                lo, hi = cols[1:] if cols is not None and dims[a] == cols[0] else (0, ish[a])
                if stop <= lo or start >= hi:
                    return  # none of the caller's values is in this piece
                conds += ([f"{dims[a]} >= {start}u"] if start > lo else []) + (
                    [f"{dims[a]} < {stop}u"] if stop < hi else [])
                if start:
                    dims[a] = em.let(f"{dims[a]} - {start}u")
            elif node.op == "transpose":
                dims = [dims[p] for p in node.attrs["perm"]]
            elif node.op == "reshape":
                dims = em.unravel(em.ravel(dims, ish), node.shape)
            else:  # the pad
                before = node.attrs["before"]
                if before:
                    dims[a] = em.let(f"{dims[a]} + {before}u")
        at = em.ravel(dims, g[z].shape)
        if conds:
            with em.block(f"if ({' && '.join(conds)})"):
                em.store(self.storage(z), at, v)
        else:
            em.store(self.storage(z), at, v)

    def epilogue_fn(self, kernel: Kernel, grid: tuple[int, ...] | None = None,
                    cols: tuple[int, int] | None = None) -> str:
        """The name of the group's epilogue function in `kernel` (see epilogue)."""
        return self.epilogue(kernel, grid, cols).name

    def epilogue(self, kernel: Kernel, grid: tuple[int, ...] | None = None,
                 cols: tuple[int, int] | None = None) -> Epilogue:
        """`fn epi(f: u32, v: T)`: the main result v at flat index f, and all fused outputs,
        added to kernel's functions once and returned as data (emit.Epilogue).
        With `grid` (a shape of the output's elements: an attention kernel's [batch, row,
        column]) `fn epi(i0: u32, .., v: T)` takes the index in that shape, so that views
        of it (a piece's store into an assembled tensor) regroup it instead of dividing;
        `cols` = (lo, hi): the caller's last index is in [lo, hi) (one of attn_dkv's
        products), so a piece's slice of the columns is decided here, not per value
        (a function per range: epi_lo_hi)."""
        name = "epi" if cols is None else f"epi_{cols[0]}_{cols[1]}"
        if name in kernel.epilogues:
            return kernel.epilogues[name]
        em = self.emitter(kernel)
        if grid is None:
            args, flat = "f: u32", "f"
            em.declare("f", "v")
        else:
            names = [f"i{k}" for k in range(len(grid))]
            em.declare(*names, "v")
            args, flat = "".join(f"{n}: u32, " for n in names)[:-2], em.ravel(names, grid)
        self.write_outputs(em, flat, "v", None if cols is None else (f"i{len(grid) - 1}",) + cols)
        epi = Epilogue(name, args, self.main_node.dtype, tuple(em.stmts),
                       "f" if grid is None else None, len(kernel.functions))
        kernel.functions.append(epi.function())
        kernel.epilogues[name] = epi
        return epi

    def sum_fn(self, kernel: Kernel, x: int, name: str) -> str:
        """`fn name(f: u32, v: T) -> f32`: x at flat index f, where the group's main result
        there is v (an output sum's term, fusion.output_sums)."""
        em = self.emitter(kernel)
        em.declare("f", "v")
        em.bound[self.group.main] = ("f", "v")
        val = em.value(x, Idx(self.g[x].shape, flat="f"))
        kernel.functions.append(f"fn {name}(f: u32, v: {self.main_node.dtype}) -> f32 {{\n"
                                + "\n".join(em.lines) + f"\n  return {val};\n}}\n")
        return name

    def dispatch(self, kernel: Kernel, lines, grid, wgs) -> dict:
        return {"wgsl": kernel.source(lines, workgroup_size=wgs),
                "bindings": [b.buffer for b in kernel.bindings], "workgroups": grid,
                "name": kernel.name}


def check_index_range(g) -> None:
    """Kernels index with u32: a tensor of 2^32 elements or more (a broadcast can make one
    without any memory) cannot be addressed. Refuse it here, naming the op that reads it,
    instead of emitting WGSL whose literals overflow."""
    readers: dict[int, list] = {}
    for n in g.nodes:
        for i in n.inputs:
            readers.setdefault(i, []).append(n)
    for n in g.nodes:
        if n.size >= 2 ** 32:
            users = readers.get(n.id, [])
            by = f", read by {', '.join(describe(u) for u in users[:3])}" if users else ""
            raise LimitError(
                f"webgpu: {describe(n)} has {n.size} elements{by}; WGSL indexes tensors with "
                "32-bit integers, so no tensor (not even a virtual one, such as a broadcast "
                "summed without being stored) may reach 2**32 elements: reduce in steps "
                "(sum over a smaller broadcast, or sum the factors first)")


def half_storage(g, fu, limits: Limits, half_names=()) -> set[int]:
    """The nodes stored as f16 (`array<f16>`, 2 bytes an element; loads widen to f32, stores
    round: emit.py): the persistent values named in half_names (f16 parameters, which the
    backend holds in f16 buffers), and, where the device has shader-f16 and
    KernelOptions.f16_emulation is off, every stored temporary that is a cast to f16 (the
    graph holds f16 values as f32 nodes, precision.f16_in_f32; a cast's attrs keep "f16").
    Values read back or copied into the persistent store at the end of the step stay f32
    (the host reads f32), as do values written in place into a persistent f32 buffer. A
    stored zero padding of such a cast (align_match's padded operand of a vocabulary-wide
    product) holds f16 values too: it is stored in f16 as well, so that the product reads
    two f16 operands (the subgroup-matrix kernel, matmul_mma.py)."""
    out = {i for name, i in list(g.params.items()) + list(g.state.items()) if name in half_names}
    if not limits.shader_f16 or limits.options.f16_emulation:
        return out
    keep = {fu.storage_base(r) for r in list(g.outputs.values()) + list(g.writebacks.values())}
    keep |= {s for s, _ in fu.end_copies}
    keep |= set(fu.inplace)
    def cast_to_f16(i):  # through views
        while g[i].op in VIEW_OPS:
            i = g[i].inputs[0]
        return g[i].op == "cast" and g[i].attrs.get("dtype") == "f16"
    for n in fu.needs_storage():
        node = g[n]
        if n not in keep and (cast_to_f16(n) if node.op == "cast" else
                              node.op == "pad" and cast_to_f16(node.inputs[0])):
            out.add(n)
    return out


class _Lowering:
    def __init__(self, graph, limits: Limits, persist_key, half_names=()):
        self.g, self.limits = graph, limits
        check_index_range(graph)
        self.fu = fu = plan_fusion(graph, limits)
        self.half = half = half_storage(graph, fu, limits, half_names)

        def nbytes_of(n):  # an f16-stored value takes 2 bytes an element (align() pads)
            return (2 if n in half else 4) * g[n].size
        self.buffers: list[dict] = []
        self.storage: dict[int, Storage] = {}
        self.scratch: dict[int, list[Storage]] = {}
        self.persistent: dict[str, int] = {}
        self.feeds: dict[str, int] = {}
        self.const_data: dict[int, bytes] = {}
        g = graph

        def new_buffer(nbytes, label, **extra):
            if nbytes > limits.max_buffer_size:
                raise LimitError(f"{label} needs a {nbytes}-byte buffer but this device allows "
                                 f"{limits.max_buffer_size} (maxBufferSize)")
            self.buffers.append({"size": align(nbytes), "label": label, **extra})
            return len(self.buffers) - 1

        def check(n, nbytes):
            if nbytes > limits.max_storage_buffer_binding_size:
                raise LimitError(
                    f"webgpu: tensor {describe(g[n])} needs {nbytes} bytes but this device's "
                    f"maxStorageBufferBindingSize is {limits.max_storage_buffer_binding_size}: "
                    "make it smaller (e.g. split the batch) or use a device with a larger limit")

        def st(n, buf, what=None):
            node = g[n]
            check(n, nbytes_of(n))
            self.storage[n] = Storage(buf, 0, "f16" if n in half else node.dtype, nbytes_of(n),
                                      what or describe(node))

        # persistent store: params, state, every writeback target
        pshape = {}
        for name, i in list(g.params.items()) + list(g.state.items()):
            pshape[name] = g[i]
        for name, i in g.writebacks.items():
            pshape.setdefault(name, g[i])
        for name, node in pshape.items():
            self.persistent[name] = new_buffer((2 if name in half_names else 4) * node.size, f"{name}",
                                               persistent=persist_key(name))
        for name, i in list(g.params.items()) + list(g.state.items()):
            st(i, self.persistent[name])
        for name, i in g.inputs.items():
            self.feeds[name] = new_buffer(4 * g[i].size, f"input {name}")
            st(i, self.feeds[name])
        for n in g.nodes:
            if n.op == "const" and n.id in fu.stored:
                b = new_buffer(4 * n.size, f"const %{n.id}")
                st(n.id, b)
                self.const_data[b] = array.array("f" if n.dtype == "f32" else "i",
                                                 n.attrs["value"]).tobytes()
        for n, name in fu.inplace.items():
            st(n, self.persistent[name], f"{describe(g[n])} (written into '{name}')")

        # temporaries by liveness over the schedule
        need = fu.needs_storage() - set(fu.inplace)
        pos = {gid: t for t, gid in enumerate(fu.order)}
        last: dict[int, int] = {}
        for gid in fu.order:
            for s in fu.loads(gid):
                if s in need and fu.group_of[s] != gid:
                    last[s] = max(last.get(s, -1), pos[gid])
        fetched = {fu.storage_base(r) for r in g.outputs.values()}
        ends = fetched | {s for s, _ in fu.end_copies}
        lives = []
        donors = _donors(fu, need, pos, last, ends, half)
        for n in sorted(need):
            check(n, nbytes_of(n))
            if n in fetched:  # read back after the step: a buffer of its own, exactly its size,
                # since hosts read whole buffers (a scalar loss in a 500 MB pool slot cost GPT-2
                # 0.5 s a step in copies)
                st(n, new_buffer(4 * g[n].size, f"output {describe(g[n])}"))
                continue
            first = pos[fu.group_of[n]]
            if fu.group_of[n] in fu.assembled_groups:  # written by its pieces' kernels
                first = min(pos[h] for h in fu.assembled_groups[fu.group_of[n]])
            lives.append(Live(("t", n), nbytes_of(n), first, END if n in ends else last.get(n, first),
                              ("t", donors[n]) if n in donors else None))
        scratch_dtype = {}
        # a sum taken by a weight gradient's kernel (fusion.operand_sums): its K-chunk
        # partials, written by that matmul and read by the sum's pass 2
        self.operand_parts = {}  # sum group -> partials per output
        writer = {}  # the matmul group writing them
        for gid, (mg, k) in fu.operand_sums.items():
            M, K, N, nb, shared_b = matmul_dims(g, fu, fu.groups[mg].main)
            self.operand_parts[gid] = group_config(limits, M, K, N, nb, shared_b,
                                                   b_k_fast(g, fu, fu.groups[mg].main)).splits
            writer[gid] = mg
        for gid, mg in fu.output_sums.items():  # a partial per tile row of each product
            mm = g[fu.groups[mg].main]
            M, K, N, nb, shared_b = matmul_dims(g, fu, mm.id)
            cfg = group_config(limits, M, K, N, nb, shared_b, b_k_fast(g, fu, mm.id))
            self.operand_parts[gid] = (prod(mm.shape[:-2]) * -(-M // cfg.bm) if cfg.splits == 1
                                       else split_sum_parts(mm.size, N))
            writer[gid] = mg
        for gid in fu.order:
            G = fu.groups[gid]
            if gid in self.operand_parts:
                P = self.operand_parts[gid]
                lives.append(Live(("s", (gid, 0)), 4 * P * g[G.main].size,
                                  pos[writer[gid]], pos[gid]))
                scratch_dtype[(gid, 0)] = "f32"
            elif G.main is not None:
                for k, (nb, dt) in enumerate(_scratch_specs(fu, G.main, limits, half)):
                    lives.append(Live(("s", (gid, k)), nb, pos[gid], pos[gid]))
                    scratch_dtype[(gid, k)] = dt
        slots, assign = plan_pool(lives)
        self.lives, self.pool_assign = lives, assign
        base = len(self.buffers)
        for k, size in enumerate(slots):
            self.buffers.append({"size": size, "label": f"pool {k}"})
        for lv in lives:
            kind, key = lv.key
            buf = base + assign[lv.key]
            if kind == "t":
                st(key, buf)
            else:  # scratch piece k of a group, in order
                self.scratch.setdefault(key[0], []).append(
                    Storage(buf, 0, scratch_dtype[key], lv.nbytes, f"scratch {key[1]} of group {key[0]}"))
        self.report = {
            "planned_bytes": sum(b["size"] for b in self.buffers),
            "naive_bytes": sum(4 * n.size for n in g.nodes),
            "persistent_bytes": sum(self.buffers[b]["size"] for b in self.persistent.values()),
            "input_bytes": sum(self.buffers[b]["size"] for b in self.feeds.values()),
            "const_bytes": sum(self.buffers[b]["size"] for b in self.const_data),
            "pool_bytes": sum(slots),
            "temporaries": len(lives),
            "pool_buffers": len(slots),
            "buffers": len(self.buffers),
        }

    def build(self, on_pipeline=None) -> Lowered:
        fu, g = self.fu, self.g
        pipelines: list[dict] = []
        by_text: dict[str, int] = {}
        commands: list[dict] = []
        names = []
        writers = {}
        kernels = []
        for gid in fu.order:
            ctx = GroupCtx(self, gid)
            # the group's bytes and FLOPs go to the dispatch a builder marks "cost" (split-K's
            # first), else its last one (the epilogue's)
            cost = group_cost(fu, gid, ctx.outs)
            built = _build_group(ctx)
            at = next((k for k, d in enumerate(built) if d.get("cost")), len(built) - 1)
            for k, d in enumerate(built):
                kernels.append(dict(cost, name=d["name"], workgroups=prod(d["workgroups"])))
                if k != at:
                    kernels[-1].update(bytes=0, flops=0)
            for d in built:
                p = by_text.get(d["wgsl"])
                if p is None:
                    p = by_text[d["wgsl"]] = len(pipelines)
                    pipelines.append({"wgsl": d["wgsl"]})
                    if on_pipeline is not None:
                        on_pipeline(d["wgsl"])
                commands.append({"op": "dispatch", "pipeline": p, "bindings": d["bindings"],
                                 "workgroups": d["workgroups"]})
                names.append(d["name"])
            for n in fu.groups[gid].outputs:  # the group's last dispatch writes its outputs
                if n in fu.inplace:
                    writers[fu.inplace[n]] = len(commands) - 1
        n_kernels = len(commands)
        for s, name in fu.end_copies:
            writers[name] = "copy"
            src = self.storage[s]
            kernels.append({"name": f"copy -> '{name}'", "ops": "copy", "nodes": [s],
                            "workgroups": 0, "bytes": 2 * src.nbytes, "flops": 0})
            commands.append({"op": "copy", "src": src.buffer, "dst": self.persistent[name],
                             "size": src.nbytes, "src_offset": 4 * src.offset, "dst_offset": 0})
        outputs = {}
        for name, r in g.outputs.items():
            s = fu.storage_base(r)
            stg = self.storage[s]
            outputs[name] = (stg.buffer, 4 * stg.offset, 4 * g[r].size, g[r].shape, g[r].dtype)
        plan = {"buffers": self.buffers, "pipelines": pipelines, "commands": commands}
        report = dict(self.report, kernels=n_kernels, pipelines=len(pipelines),
                      end_copies=len(fu.end_copies), in_place=len(fu.inplace))
        pool = {"lives": self.lives, "slot": self.pool_assign, "graph": g, "order": fu.order,
                "split_k": {gid for gid in fu.order if gid in self.scratch and (
                    g[fu.groups[gid].main].op == "matmul" or fu.groups[gid].main in fu.matmul_fold)}}
        return Lowered(plan, self.feeds, outputs, self.persistent, self.const_data, n_kernels,
                       report, writers, kernels, pool=pool), names


def _donors(fu, need, pos, last, ends, half=frozenset()) -> dict[int, int]:
    """Output -> a temporary of the same size and dtype whose buffer it may take over: the
    group writing the output is the temporary's last reader and reads it only at the
    index it writes (fusion.loads' identity flag), so each thread reads its element before
    it overwrites it (cross entropy's logit gradient in the logits' buffer, a residual
    update, an activation's backward)."""
    g, out = fu.g, {}
    for gid in fu.order:
        G = fu.groups[gid]
        cands = [s for s, ident in fu.loads(gid).items()
                 if ident and s in need and s not in ends and fu.group_of.get(s) != gid
                 and last.get(s) == pos[gid] and g[s].size == G.numel]
        for n in G.outputs:
            if n not in need:
                continue
            for s in cands:
                if g[s].dtype == g[n].dtype and g[s].size == g[n].size and (s in half) == (n in half):
                    out[n] = s
                    cands.remove(s)
                    break
    return out


# kernel kind (primitives' `lowering`, kinds.CODEGEN_OPS') -> the builder of a group whose
# kernel op is of that kind: GroupCtx -> its dispatches. A new kind of kernel op adds a row.
KERNELS = {
    "matmul": build_matmul,
    "reduce": build_reduce,          # sum, max_last, argmax_last
    "row": build_reduce,             # softmax_last, log_softmax_last, layer_norm_last
    "attention": build_attention,    # attention_match.py's fused attention
    "row_kernel": build_row_kernel,  # rowfuse_match.py's logsumexp_last, layer_norm_grad
    "scatter": build_scatter,
    "fold": build_fold,
    "write_rows": build_write_rows,
}


def _matmul_scratch(fu, main: int, limits, half):  # split-K partial sums
    if mma_takes(fu.g, fu, main, limits, half):   # the subgroup-matrix kernel's own split
        nb = mma_scratch_bytes(fu.g, fu, main, limits, half)
        return [(nb, "f32")] if nb else []
    nb = matmul_scratch_bytes(fu.g, fu, main, limits)
    return [(nb, "f32")] if nb else []


# kernel kind -> (fu, main, limits, half) -> [(bytes, dtype)]: scratch between its dispatches
# (half: the values stored in f16, half_storage)
SCRATCH = {
    "matmul": _matmul_scratch,
    "reduce": lambda fu, main, limits, half: scratch_specs(fu.g, fu.g[main], fu.sum_source.get(main),
                                                     limits.options, cpu=limits.cpu),
    "scatter": lambda fu, main, limits, half: scatter_scratch(fu.g, fu.g[main]),
    "attention": lambda fu, main, limits, half: split_scratch(fu.g, fu.g[main], limits),
}


def _kind(fu, main: int) -> str:
    """The kernel kind of group main's kernel op; a sum folded into a matmul is a matmul."""
    return "matmul" if main in fu.matmul_fold else lowering_of(fu.g[main].op)


def _scratch_specs(fu, main: int, limits, half=frozenset()) -> list[tuple[int, str]]:
    """[(bytes, dtype)]: the scratch buffers a kernel op needs between its dispatches."""
    rule = SCRATCH.get(_kind(fu, main))
    return rule(fu, main, limits, half) if rule else []


def _build_group(ctx: GroupCtx) -> list[dict]:
    m = ctx.main_node
    if ctx.group.id in ctx._low.fu.assembled_groups:
        return []  # its pieces' kernels write it (fusion_sums._assemble)
    if m is None and ctx.group.anchors[0] in ctx._low.fu.piecewise:
        return build_concat_pieces(ctx)
    if m is None:
        return build_elementwise(ctx)
    return KERNELS[_kind(ctx._low.fu, m.id)](ctx)


def lower(graph, limits: Limits | None = None, persist_key=lambda name: name, *,
          on_pipeline=None, half_names=()):
    """Compile a Graph into (Lowered, kernel names). on_pipeline(wgsl), if given, is called
    with each distinct kernel text as soon as it is emitted (NativeHost.prefetch).
    half_names: the persistent values (params, state) whose buffers hold f16 (half_storage)."""
    limits = limits or Limits()
    graph, empty = strip_empty(graph)  # zero-size tensors: nothing to compute or bind
    graph = rewrite_attention(graph, limits)  # fused attention kernels (attention_match.py)
    if limits.options.fuse_rows:  # cross entropy, layer-norm backward (rowfuse_match.py)
        graph = rewrite_rows(graph)
    graph = align_products(graph, limits)  # vocabulary-wide products padded (align_match.py)
    graph = thin_grads(graph, limits)  # LoRA's factor gradients in their layout (thin_grads.py)
    graph = thin_siblings(graph, limits)  # LoRA's x @ A^T of q, k, v as one (thin_siblings.py)
    low = _Lowering(graph, limits, persist_key, frozenset(half_names))
    lowered, names = low.build(on_pipeline)
    lowered.empty_outputs = empty
    return lowered, names


__all__ = ["lower", "Lowered", "describe"]
