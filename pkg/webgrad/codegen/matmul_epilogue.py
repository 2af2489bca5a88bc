"""The tiled matmul kernel's epilogue side (matmul_tiled.build_tiled): a thread's block of
C written out (`write_block`), sums of expressions of the output taken on the way
(`output_sum_partials`, fusion.output_sums), and the epilogue's loads issued before its
stores (`prefetch_epilogue`).

Where the epilogue streams a tensor of the output's size (GELU's pre-activation in its
backward), Config.epi_rows splits it so that the loads of a row of the thread's block are
issued before any of its stores: the GPU's compiler must assume a storage load may alias an
earlier store, so one call after another waits out a memory latency per output. The split
reads the epilogue as data (emit.Epilogue: the statements the emitter recorded, each with
the names it is built from), never its WGSL text. Measured on an H200 (bench/README.md,
"epilogues"): GELU's backward twin 0.579 -> 0.548 ms in the GPT-2 step with one row at a
time; vec4 stores of 4 adjacent outputs were slower than scalar ones (0.969 against 0.888
ms at [16384 x 512] @ [512 x 2048]).
"""
from __future__ import annotations

from .matmul_config import Tile


def column_totals(em, B: int, NT: int, terms, Q: str, at, guard) -> None:
    """A thread per column c of B (looping where B > NT threads): Q[at(c)] = the sum of
    terms(c), where guard(c) holds (None: everywhere); the sums' partials."""
    with em.block(f"for (var c = lid; c < {B}u; c += {NT}u)" if B > NT else
                  f"if (lid < {B}u)"):
        c = "c" if B > NT else "lid"
        em.emit("var t = 0.0f;")
        for term in terms(c):
            em.emit(f"t += {term};")
        store = f"{Q}[{at(c)}] = t;"
        em.emit(f"if ({guard(c)}) {{ {store} }}" if guard else store)


def block_conds(ri: int, cj: int, M: int, N: int, need_m: bool, need_n: bool) -> str | None:
    """The WGSL test that a thread's output (m0 + ri, n0 + cj) is inside C (None: always)."""
    conds = ([f"m0 + {ri}u < {M}u"] if need_m else []) + ([f"n0 + {cj}u < {N}u"] if need_n else [])
    return " && ".join(conds) or None


def guarded(stmt: str, cond: str | None) -> str:
    """stmt, inside `if (cond)` where there is a condition."""
    return f"if ({cond}) {{ {stmt} }}" if cond else stmt


def output_sum_partials(ctx, em, kernel, t: Tile, acc, osums, rows_a, cols_b, M: int, N: int,
                        tiles_m: int) -> None:
    """Sums over the rows of expressions of the output (fusion.output_sums): each thread
    adds its rows per column, the workgroup its WY threads per column, and the tile row's
    partial of each column goes to scratch[(bt * tiles_m + tm) * N + n]. Before the
    epilogue's stores: the loads of the sums' terms wait out no store (the GPU's compiler
    keeps a storage load after any earlier storage store)."""
    need_m, need_n, L = M % t.BM != 0, N % t.BN != 0, em.emit
    kernel.decls.append(f"var<workgroup> Os: array<f32, {t.WY * t.BN}>;")
    totals = []  # every sum's per-column totals first: all their loads, then stores
    for j, (x, part) in enumerate(osums):
        fn = ctx.sum_fn(kernel, x, f"osum{j}")
        totals.append([])
        for c, cj in enumerate(cols_b):
            tot = em.var("f32", "0.0f", prefix="ot")
            for i, ri in enumerate(rows_a):
                L(guarded(f"{tot} += {fn}(f0 + {ri * N + cj}u, {acc[i][c]});",
                          block_conds(ri, cj, M, N, need_m, need_n)))
            totals[-1].append(tot)
    for (x, part), ts in zip(osums, totals):
        Q = kernel.binding(part.buffer, "f32", write=True, what=part.what, nbytes=part.nbytes)
        for tot, cj in zip(ts, cols_b):
            L(f"Os[ty * {t.BN}u + n0 - col0 + {cj}u] = {tot};")
        L("workgroupBarrier();")
        column_totals(em, t.BN, t.NT, lambda c: [f"Os[{y * t.BN}u + {c}]" for y in range(t.WY)],
                      Q, lambda c: f"(bt * {tiles_m}u + tm) * {N}u + col0 + {c}",
                      (lambda c: f"col0 + {c} < {N}u") if need_n else None)
        L("workgroupBarrier();")


def write_block(em, acc, rows_a, cols_b, M: int, N: int, need_m: bool, need_n: bool, *,
                epi: str | None = None, prefetch_rows: int = 0, partials: str | None = None) -> None:
    """The thread's TM x TN results out: into the split-K partials `partials` (at poff), or
    through the epilogue `epi`; with prefetch_rows (prefetch_epilogue done), `epi_ld`'s
    loads of that many rows of the block first, then those rows' calls."""
    step = prefetch_rows if prefetch_rows else len(rows_a)
    for i0 in range(0, len(rows_a), step):
        rows = list(enumerate(rows_a))[i0:i0 + step]
        if prefetch_rows:  # the epilogue's loads of these rows first, then their stores
            for i, ri in rows:
                for j, cj in enumerate(cols_b):
                    em.emit(f"let q{i}_{j} = {epi}_ld(f0 + {ri * N + cj}u);")
        for i, ri in rows:
            for j, cj in enumerate(cols_b):
                at = f"{ri * N + cj}u"
                call = (f"{partials}[poff + {at}] = {acc[i][j]};" if partials else
                        f"{epi}(f0 + {at}, {acc[i][j]}, q{i}_{j});" if prefetch_rows else
                        f"{epi}(f0 + {at}, {acc[i][j]});")
                em.emit(guarded(call, block_conds(ri, cj, M, N, need_m, need_n)))


def prefetch_epilogue(kernel, epi, max_loads: int, widened: bool = False) -> bool:
    """Put the epilogue `fn epi(f, v)` (program.GroupCtx.epilogue, emit.Epilogue) in
    kernel's functions as two where it loads anything (a bias, a pre-activation):
    `epi_ld(f)` makes those loads, which depend on f alone, and returns them in a struct;
    `epi(f, v, p)` is the rest, taking the loaded values from p. The tile's writer then
    issues the loads of several outputs before their stores (Config.epi_rows): the GPU's
    compiler keeps a load after any earlier store to a storage buffer (they may alias), so
    one call after another waits out a memory latency per value. Only where a load
    streams a tensor of the output's size (read at f): a broadcast bias alone is a cache
    hit, and prefetching it measured slower (the GPT-2 MLP's GELU forward, 0.546 -> 0.554
    ms). False (nothing changed): no such load, or more than max_loads loads
    (KernelOptions.epi_max_loads), or a body that is not straight-line lets and stores.
    widened: f16 loads too (their f32 values in the struct): the subgroup-matrix kernel's
    epilogue under precision="mixed" streams f16 pre-activations."""
    got = epilogue_loads(epi, max_loads, widened)
    if got is None:
        return False
    keep, loads = got
    names = [s.name for s in loads]
    fields = ", ".join(f"{s.name}: {'f32' if s.elem == 'f16' else s.elem}" for s in loads)
    kernel.functions[epi.slot:epi.slot + 1] = [
        f"struct EpiLoads {{ {fields} }}\n",
        f"fn {epi.name}_ld({epi.params}) -> EpiLoads {{\n" + "\n".join(s.text for s in keep)
        + f"\n  return EpiLoads({', '.join(names)});\n}}\n",
        epi.function([f"  let {s.name} = p.{s.name};" if s.name in names else s.text
                      for s in epi.stmts], ", p: EpiLoads")]
    return True


def epilogue_loads(epi, max_loads: int, widened: bool = False):
    """(the statements epi_ld keeps: its loads and what their indices are computed from,
    the loads) of prefetch_epilogue's split of `epi`, or None where it does not split.
    A statement depends on the value v where any name it is built from does (Stmt.deps);
    the loads are those that do not, except loads widened from f16 (their value is a
    conversion, computed in place) unless `widened`."""
    if epi.flat is None or any(s.kind not in ("let", "load", "store") for s in epi.stmts):
        return None  # anything but straight-line lets and stores: left as it is
    dep, loads, pure = {"v"}, [], []
    for s in epi.stmts:
        if s.kind == "store":
            continue
        if s.deps & dep:
            dep.add(s.name)
            continue
        pure.append(s)
        if s.kind == "load" and (widened or s.elem != "f16"):
            loads.append(s)
    if len(loads) > max_loads or not any(s.at == epi.flat for s in loads):
        return None  # nothing streamed from memory at f: a broadcast bias stays in cache
    need, keep = {s.name for s in loads}, []  # epi_ld keeps what the loads' indices need
    for s in reversed(pure):
        if s.name in need:
            keep.append(s)
            need |= s.deps
    return keep[::-1], loads
