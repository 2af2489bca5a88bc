"""Index ops: one_hot and gather_rows are expressions; scatter_add_rows is a kernel.

one_hot      (idx == j) as f32, read where the consumer reads it (no [.., n] tensor made
             unless something needs one stored)
gather_rows  the table read at the row an index names; a row outside [0, n) reads zeros
             (no negative wrap: bounds.py refuses such feeds, this is the computed-index rule)
scatter_add_rows  WGSL has no float atomics. The indices are grouped by row first (a
             counting sort with u32 atomics, then each row's segment put in index order),
             and one thread per output element (row r, column d) sums its row's segment:
             O(N + V + N*D + V*D) for N indices into V rows of width D, where the loop over
             every index per output element cost O(V*D*N) (a 50k vocabulary made the
             embedding gradient unusable). Deterministic: the sum runs in index order, as
             numpy's add.at. Rows outside [0, V) are dropped.
"""
from __future__ import annotations

from math import prod

from .emit import Emitter, Idx, rule
from .wgsl import WG, u32_lit, zero


@rule("one_hot")
def _one_hot_rule(em: Emitter, node, idx: Idx) -> str:
    i = node.inputs[0]
    dims = idx.dims(em)
    v = em.value(i, Idx(em.g[i].shape, dims=dims[:-1]))
    return f"select(0.0f, 1.0f, {v} == i32({dims[-1]}))"


@rule("gather_rows")
def _gather_rule(em, node, idx):
    w, i = node.inputs
    k = len(em.g[i].shape)
    rows = em.g[w].shape[0]
    dims = idx.dims(em)
    r = em.value(i, Idx(em.g[i].shape, dims=dims[:k]))
    ok = em.let(f"{r} >= 0i && {r} < {rows}i")
    row = em.let(f"u32(clamp({r}, 0i, {max(rows - 1, 0)}i))")
    v = em.value(w, Idx(em.g[w].shape, dims=[row] + list(dims[k:])))
    return f"select({zero(node.dtype)}, {v}, {ok})"


def scatter_scratch(g, node) -> list[tuple[int, str]]:
    """Scratch of scatter_add_rows: per-row counts (reused as placement cursors); the row
    starts followed by the index positions sorted within each row (one buffer, so the
    final kernel binds a single scratch buffer beside its epilogue's); the positions
    grouped by row before sorting."""
    n_rows, n_idx = node.shape[0], prod(g[node.inputs[1]].shape)
    return [(4 * (n_rows + 1), "u32"), (4 * (n_rows + 1 + n_idx), "u32"), (4 * max(n_idx, 1), "u32")]


def build_scatter(ctx) -> list:
    """Six dispatches, O(N + V + V*D + N*D) work for N indices into V rows of D values:
      1 zero the counts   2 count each row (atomicAdd on u32)   3 exclusive scan of the
      counts into row starts (one workgroup: tiles in shared memory on GPUs, a chunk of
      rows per thread on CPU adapters), counts reset to serve as cursors   4 place
      each index position in its row's segment (atomicAdd on the cursor: any order)
      5 sort each segment by position (a position's rank = how many in its segment are
      smaller)   6 one thread per output element sums its row's segment in position order.
    Out-of-range indices are dropped in 2 and 4. The sum runs in index order, as numpy's
    add.at, so the result is deterministic although 4's placement is not."""
    node = ctx.main_node
    g_in, i_in = node.inputs
    G = ctx.g
    N = prod(G[i_in].shape)
    V = node.shape[0]
    D = prod(node.shape[1:])
    counts, rows, grouped = ctx.scratch
    starts = rows  # rows[0..V] the row starts, rows[V+1 + q] the sorted positions
    out = []

    def index_at(em, j):
        t = em.value(i_in, Idx(G[i_in].shape, flat=j))
        return t, em.let(f"{t} >= 0i && {t} < {V}i")

    def bind(k, st, dtype, write=False):
        return k.binding(st.buffer, dtype, write=write, what=st.what, nbytes=st.nbytes)

    # 1: zero the counts
    k = ctx.kernel("scatter_add_rows (zero)")
    em = ctx.emitter(k)
    grid = k.thread_index(em, V + 1, "r")
    em.emit(f"atomicStore(&{bind(k, counts, 'atomic_u32', True)}[r], 0u);")
    out.append(ctx.dispatch(k, em.lines, grid, WG))
    # 2: count
    k = ctx.kernel("scatter_add_rows (count)")
    em = ctx.emitter(k)
    grid = k.thread_index(em, N, "j")
    t, ok = index_at(em, "j")
    c = bind(k, counts, "atomic_u32", True)
    with em.block(f"if ({ok})"):
        em.emit(f"atomicAdd(&{c}[u32({t})], 1u);")
    out.append(ctx.dispatch(k, em.lines, grid, WG))
    # 3: exclusive scan of the counts into row starts, one workgroup; counts reset
    forced = ctx.limits.options.scan_tiled  # KernelOptions (tests): True / False on any adapter
    tiled = forced if forced is not None else not ctx.limits.cpu
    if tiled:
        out.append(_scan_tiled(ctx, V, counts, starts))
    else:
        out.append(_scan_chunks(ctx, V, counts, starts))
    # 4: place each position in its row's segment
    k = ctx.kernel("scatter_add_rows (place)")
    em = ctx.emitter(k)
    grid = k.thread_index(em, N, "j")
    t, ok = index_at(em, "j")
    c = bind(k, counts, "atomic_u32", True)
    s = bind(k, starts, "u32")
    gl = bind(k, grouped, "u32", True)
    with em.block(f"if ({ok})"):
        em.emit(f"let row = u32({t});")
        em.emit(f"{gl}[{s}[row] + atomicAdd(&{c}[row], 1u)] = j;")
    out.append(ctx.dispatch(k, em.lines, grid, WG))
    # 5: sort within segments: position j goes to its segment's start + its rank
    k = ctx.kernel("scatter_add_rows (order)")
    em = ctx.emitter(k)
    grid = k.thread_index(em, N, "q")
    s = od = bind(k, rows, "u32", True)
    gl = bind(k, grouped, "u32")
    with em.block(f"if (q < {s}[{V}u])"):
        em.emit(f"let j = {gl}[q];")
        em.declare("j")
        t = em.value(i_in, Idx(G[i_in].shape, flat="j"))
        em.emit(f"let row = u32({t});")
        em.emit(f"let a = {s}[row];")
        em.emit(f"let b = {s}[row + 1u];")
        em.emit("var rank = 0u;")
        with em.block("for (var q2 = a; q2 < b; q2++)"):
            em.emit(f"rank += select(0u, 1u, {gl}[q2] < j);")
        em.emit(f"{od}[{V + 1}u + a + rank] = j;")
    out.append(ctx.dispatch(k, em.lines, grid, WG))
    # 6: one thread per output element sums its row's values in index order
    k = ctx.kernel("scatter_add_rows")
    epi = ctx.epilogue_fn(k)
    em = ctx.emitter(k)
    grid = k.thread_index(em, V * D, "o")
    s = od = bind(k, rows, "u32")
    r = em.let(f"o / {D}u") if D > 1 else "o"
    d = em.let(f"o % {D}u") if D > 1 else u32_lit(0)
    acc = em.var(node.dtype, zero(node.dtype))
    with em.block(f"for (var q = {s}[{r}]; q < {s}[{r} + 1u]; q++)"):
        em.emit(f"let j = {od}[{V + 1}u + q];")
        em.declare("j")
        v = em.value(g_in, Idx(G[g_in].shape, flat=em.let(f"j * {D}u + {d}") if D > 1 else "j"))
        em.emit(f"{acc} += {v};")
    em.emit(f"{epi}(o, {acc});")
    out.append(ctx.dispatch(k, em.lines, grid, WG))
    return out


def _scan_chunks(ctx, V, counts, starts) -> dict:
    """Each thread scans a chunk of rows serially, the chunk totals are scanned in shared
    memory (Hillis-Steele), then written back. Few barriers: CPU adapters emulate them."""
    k, em, wgs, c, s = _scan_kernel(ctx, counts, starts, "atomic_u32", 0)
    chunk = -(-V // wgs) if V else 1
    em.emit(f"let r0 = min(lid * {chunk}u, {V}u);")
    em.emit(f"let r1 = min(r0 + {chunk}u, {V}u);")
    tot = em.var("u32", "0u")
    with em.block("for (var r = r0; r < r1; r++)"):
        em.emit(f"{tot} += atomicLoad(&{c}[r]);")
    em.emit(f"part[lid] = {tot};")
    _scan_part(em, wgs)
    em.emit("workgroupBarrier();")
    run = em.var("u32", f"part[lid] - {tot}")  # the exclusive prefix of this chunk
    with em.block("for (var r = r0; r < r1; r++)"):
        em.emit(f"let cr = atomicLoad(&{c}[r]);")
        em.emit(f"{s}[r] = {run};")
        em.emit(f"{run} += cr;")
        em.emit(f"atomicStore(&{c}[r], 0u);")
    with em.block(f"if (lid == {wgs - 1}u)"):
        em.emit(f"{s}[{V}u] = part[lid];")
    return ctx.dispatch(k, em.lines, k.grid(1), wgs)


SCAN_E = 8          # counts a thread scans per tile of the tiled scan (tiles of SCAN_E x wgs)


def _scan_tiled(ctx, V, counts, starts) -> dict:
    """The scan in tiles of SCAN_E x wgs counts: each tile is read into shared memory with
    coalesced loads, every thread scans SCAN_E adjacent counts, the thread totals are
    scanned (Hillis-Steele), and the tile goes back out coalesced, plus the running total
    of the tiles before. A thread per chunk of V / wgs rows instead read them serially and
    strided: 0.19 ms for GPT-2's 50257 rows on an H200, 0.063 ms in tiles (bench/README.md).
    About 20 barriers a tile: CPU adapters, which emulate barriers, keep the chunks."""
    E = SCAN_E
    k, em, wgs, c, s = _scan_kernel(ctx, counts, starts, "u32", E)
    TILE = E * wgs
    em.emit("var carry = 0u;")
    with em.block(f"for (var b = 0u; b < {V}u; b += {TILE}u)"):  # uniform: barriers inside
        for e in range(E):
            em.emit(f"let q{e} = b + {e * wgs}u + lid;")
            em.emit(f"tile[{e * wgs}u + lid] = select(0u, {c}[min(q{e}, {max(V - 1, 0)}u)], q{e} < {V}u);")
        em.emit("workgroupBarrier();")
        em.emit("var sum = 0u;")
        for e in range(E):
            em.emit(f"let v{e} = tile[lid * {E}u + {e}u];")
            em.emit(f"tile[lid * {E}u + {e}u] = sum;")
            em.emit(f"sum += v{e};")
        em.emit("part[lid] = sum;")
        _scan_part(em, wgs)
        em.emit("workgroupBarrier();")
        em.emit("let before = carry + part[lid] - sum;")
        for e in range(E):
            em.emit(f"tile[lid * {E}u + {e}u] += before;")
        em.emit(f"carry += part[{wgs - 1}u];")
        em.emit("workgroupBarrier();")
        for e in range(E):
            with em.block(f"if (q{e} < {V}u)"):
                em.emit(f"{s}[q{e}] = tile[{e * wgs}u + lid];")
                em.emit(f"{c}[q{e}] = 0u;")
        em.emit("workgroupBarrier();")  # the tile is read before the next one is written
    with em.block("if (lid == 0u)"):
        em.emit(f"{s}[{V}u] = carry;")
    return ctx.dispatch(k, em.lines, k.grid(1), wgs)


def _scan_kernel(ctx, counts, starts, count_type: str, E: int):
    """The scan's kernel (one workgroup of wgs threads): its emitter, shared arrays (part:
    a total per thread; with E, tile: E x wgs counts) and the counts / starts bindings."""
    wgs = min(WG, ctx.limits.max_compute_invocations_per_workgroup,
              ctx.limits.max_compute_workgroup_size_x)
    k = ctx.kernel("scatter_add_rows (scan)")
    if E:
        k.decls.append(f"var<workgroup> tile: array<u32, {E * wgs}>;")
    k.decls.append(f"var<workgroup> part: array<u32, {wgs}>;")
    c = k.binding(counts.buffer, count_type, write=True, what=counts.what, nbytes=counts.nbytes)
    s = k.binding(starts.buffer, "u32", write=True, what=starts.what, nbytes=starts.nbytes)
    return k, ctx.emitter(k), wgs, c, s


def _scan_part(em, wgs: int) -> None:
    """part[lid] becomes the inclusive scan of part over the workgroup (Hillis-Steele)."""
    st = 1
    while st < wgs:
        em.emit("workgroupBarrier();")
        em.emit(f"let p{st} = select(0u, part[lid - {st}u], lid >= {st}u);")
        em.emit("workgroupBarrier();")
        em.emit(f"part[lid] += p{st};")
        st *= 2
