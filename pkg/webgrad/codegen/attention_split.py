"""Decoding's attention split over the keys (flash-decoding), on request
(KernelOptions.attn_split): an inference attn_out (softmax online, attention.py) with few
query rows over a long K/V cache. Not taken by default: measured no quicker on an H200 at a
cache of 513 rows (use_split).

Why: the tiled kernel (attention_tiled.py) gives each (batch element, block of query rows)
one workgroup that walks every key block in turn. A decoding step has one query row per
head, so a Llama-3.2-1B step (32 query heads over a cache of 513 rows) ran 32 workgroups
with 15 of their 16 rows idle: 0.35-0.39 ms in its 16 layers on an H200, 87-96 GB/s.
Here the keys are cut into chunks of C (KernelOptions.attn_split_chunk, 64), each a
workgroup of C threads:
  pass 1, workgroup (batch element, chunk): the T query rows staged in workgroup memory,
          and the chunk's K rows DK columns at a time (read coalesced, where a thread per
          key reading its own row touched a cache line per thread and load);
          thread j the scores of key c0 + j for every row (-inf where masked: past S, or
          past the causal limit j <= i + offset [+ pos]); each row's chunk maximum m;
          p = exp(s - m); thread e the p-weighted sum of V's column e over the chunk
          (coalesced reads of V's rows) and l = sum p; written to scratch as the chunk's
          (O~ [Dv], m, l) for each row. Chunks past the causal limit load nothing and
          write (0, -inf, 0).
  pass 2, a thread per output element: M = max_p m_p, then
          O = sum_p O~_p exp(m_p - M) / sum_p l_p exp(m_p - M), through the group's epilogue.
That is the online softmax of the tiled kernel with its blocks side by side instead of in
sequence: the same value up to f32 rounding.
"""
from __future__ import annotations

from math import prod

from .emit import Idx
from .wgsl import f32_lit, u32_lit

DK = 32           # K's columns staged in workgroup memory at a time
PASS2_WG = 64     # threads per workgroup of pass 2


class _Split:
    """The extents of a split attn_out node: batch, T query rows of D, S keys, Dv output
    columns, P chunks; the scratch's layout (O~ of each (row, chunk), then m, then l)."""

    def __init__(self, g, node, C: int):
        q, kt, v = node.inputs[:3]
        self.C = C  # keys per chunk: a workgroup of pass 1, one thread each
        self.batch = tuple(node.shape[:-2])
        self.nb = prod(self.batch)
        self.T, self.D = g[q].shape[-2:]
        self.S, self.Dv = g[kt].shape[-1], g[v].shape[-1]
        self.P = -(-self.S // C)
        self.NP = self.nb * self.T * self.P   # (row, chunk) pairs
        self.m0 = self.NP * self.Dv           # first word of the maxima, then the sums
        self.words = self.m0 + 2 * self.NP
        self.shared = 4 * (self.T * self.D + 2 * self.T * C + C * (min(self.D, DK) + 1))

    @property
    def name(self) -> str:
        return (f"attn_out [{'x'.join(map(str, self.batch)) or '1'}] T{self.T} S{self.S} "
                f"D{self.D} split {self.P}x{self.C}")


def use_split(g, node, limits) -> bool:
    """Whether attention node `node` takes the split kernels: an inference attn_out whose
    chunk fits in workgroup memory, where KernelOptions.attn_split asks for it (True, on any
    adapter; meant for few query rows over a long cache). Off by default (None): on an
    H200 (Dawn) the Llama-3.2-1B-shaped decode's 16 attention layers at S 513 took 0.42 ms as
    32 split dispatches against 0.37 ms as 16 tiled ones, and the step was no quicker
    (bench/README.md, 2026-12-03): at this cache length a dispatch costs more than the
    tiled kernel's idle workgroups."""
    if node.op != "attn_out" or not node.attrs.get("online"):
        return False
    sp = _Split(g, node, limits.options.attn_split_chunk)
    if sp.shared > limits.max_compute_workgroup_storage_size:
        return False
    return bool(limits.options.attn_split)


def split_scratch(g, node, limits) -> list[tuple[int, str]]:
    """[(bytes, dtype)]: the partials between the two passes, where the node splits."""
    if not use_split(g, node, limits):
        return []
    return [(4 * _Split(g, node, limits.options.attn_split_chunk).words, "f32")]


def build_split(ctx) -> list[dict]:
    """The two dispatches of ctx's attn_out node (the header)."""
    node = ctx.main_node
    sp = _Split(ctx.g, node, ctx.limits.options.attn_split_chunk)
    return [_pass1(ctx, node, sp), _pass2(ctx, sp)]


def _at(base: int, i: str) -> str:
    """Word i of the row starting at `base` of a workgroup array."""
    return f"{base}u + {i}" if base else i


def _tree_max(xs: list[str]) -> str:
    """max over xs as a balanced tree of WGSL max calls."""
    if len(xs) == 1:
        return xs[0]
    h = len(xs) // 2
    return f"max({_tree_max(xs[:h])}, {_tree_max(xs[h:])})"


def _pass1(ctx, node, sp: _Split) -> dict:
    g, scratch = ctx.g, ctx.scratch[0]
    T, D, Dv, P, C = sp.T, sp.D, sp.Dv, sp.P, sp.C
    q, kt, v = node.inputs[:3]
    off, ninf = node.attrs["offset"], f32_lit(float("-inf"))
    k = ctx.kernel(sp.name + " (pass 1)")
    k.decls.append(f"var<workgroup> qs: array<f32, {T * D}>;")
    vec = C % 4 == 0
    k.decls.append(f"var<workgroup> ss: array<vec4<f32>, {T * C // 4}>;" if vec else  # scores ...
                   f"var<workgroup> ss: array<f32, {T * C}>;")
    k.decls.append(f"var<workgroup> ps: array<f32, {T * C}>;")  # ... and their weights
    k.decls.append(f"var<workgroup> ks: array<f32, {C * (min(D, DK) + 1)}>;")  # K, D chunks
    em = ctx.emitter(k)
    L = em.emit
    grid = k.workgroup_index(em, sp.nb * P, "w")  # uniform: barriers stay legal
    L(f"let bo = w / {P}u;")
    L(f"let p = w % {P}u;")
    L(f"let c0 = p * {C}u;")
    em.declare("bo", "p", "c0", "i", "d", "jj")
    bdims = em.unravel("bo", sp.batch) if sp.batch else []

    def at(n, last):  # operand n at (its last two dims), batch element bo (broadcast dims: 0)
        shape = g[n].shape
        k0 = len(shape) - 2
        r = len(sp.batch) - k0
        dims = [u32_lit(0) if shape[a] == 1 else bdims[r + a] for a in range(k0)] + last
        return em.value(n, Idx(shape, dims=dims))

    dyn = ""
    if node.attrs.get("dyn"):  # read by one thread, then uniformly: the loop bounds below
        pn = node.inputs[-1]
        k.decls.append("var<workgroup> wdyn: i32;")
        with em.block("if (lid == 0u)"):
            L(f"wdyn = i32({em.value(pn, Idx(g[pn].shape, flat=u32_lit(0)))});")
        L("let dyn = workgroupUniformLoad(&wdyn);")
        dyn = " + dyn"
    # keys below cend are kept by some row (the last: j <= T - 1 + off + dyn)
    cend = em.let(f"{sp.S}u" if off is None else
                  f"u32(clamp({T + off}i{dyn}, 0i, {sp.S}i))")
    with em.block(f"for (var i = lid; i < {T * D}u; i += {C}u)"):
        L(f"qs[i] = {at(q, [em.let(f'i / {D}u'), em.let(f'i % {D}u')])};")
    L("workgroupBarrier();")
    # the scores of key j, one per row
    L("let j = c0 + lid;")
    em.declare("j")
    dots = [em.var("f32", "0.0f", "s") for _ in range(T)]
    with em.block(f"if (c0 < {cend})"):  # uniform: chunks past the causal limit load nothing
        for d0 in range(0, D, DK):
            w = min(DK, D - d0)
            if d0:
                L("workgroupBarrier();")  # every thread is done with the last D chunk
            # the chunk's keys x this D chunk, a key's w words read by w neighbouring
            # threads (coalesced); key rows past S are clamped (their scores are masked)
            words = []  # every load issued before the first store
            for i in range(w):
                e = em.let(f"lid + {i * C}u" if i else "lid")
                rr, dd = em.let(f"{e} / {w}u"), em.let(f"{e} % {w}u")
                key = em.let(f"min(c0 + {rr}, {sp.S - 1}u)")
                words.append((f"{rr} * {w + 1}u + {dd}",
                              em.let(at(kt, [em.let(f"{d0}u + {dd}"), key]))))
            for at_, val in words:
                L(f"ks[{at_}] = {val};")
            L("workgroupBarrier();")
            # key rows w + 1 words apart: a warp's reads of one d hit distinct banks
            with em.block(f"for (var d = 0u; d < {w}u; d++)"):
                kv = em.let(f"ks[lid * {w + 1}u + d]")
                for t, s in enumerate(dots):
                    L(f"{s} = fma(qs[{_at(t * D + d0, 'd')}], {kv}, {s});")
    sc = f32_lit(node.attrs["scale"])
    scores = []
    for t, s in enumerate(dots):
        kept = f"j < {cend}" if off is None else f"i32(j) <= {t + off}i{dyn} && j < {sp.S}u"
        scores.append(em.let(f"select({ninf}, {s} * {sc}, {kept})"))
        L(f"ss[{_at(t * C // 4, '(lid >> 2u)')}][lid & 3u] = {scores[t]};" if vec else
          f"ss[{_at(t * C, 'lid')}] = {scores[t]};")
    L("workgroupBarrier();")
    # each row's chunk maximum (every thread reads all C: broadcasts), the weights
    maxes = []
    for t, s in enumerate(scores):
        if vec:  # C / 4 independent vector reads, then a tree (a loop was a chain of C)
            vs = [em.let(f"ss[{t * C // 4 + i}u]") for i in range(C // 4)]
            m = em.let(_tree_max([_tree_max([f"{v}.{c}" for c in "xyzw"]) for v in vs]))
        else:
            m = em.var("f32", ninf, "m")
            with em.block(f"for (var c = 0u; c < {C}u; c++)"):
                L(f"{m} = max({m}, ss[{_at(t * C, 'c')}]);")
        mz = em.let(f"select({m}, 0.0f, {m} == {ninf})")  # no -inf - -inf
        L(f"ps[{_at(t * C, 'lid')}] = exp({s} - {mz});")
        maxes.append(m)
    L("workgroupBarrier();")
    # thread e: the weighted sum of V's column e over the chunk's live keys
    NE = -(-Dv // C)
    cols = [em.let(f"lid + {e * C}u" if e else "lid") for e in range(NE)]
    vcols = [c if (e + 1) * C <= Dv else em.let(f"min({c}, {Dv - 1}u)") for e, c in enumerate(cols)]
    nk = em.let(f"min(select(0u, {cend} - c0, {cend} > c0), {C}u)")
    accs = [[em.var("f32", "0.0f", "o") for _ in range(NE)] for _ in range(T)]
    sums = [em.var("f32", "0.0f", "l") for _ in range(T)]
    with em.block(f"for (var jj = 0u; jj < {nk}; jj++)"):
        key = em.let("c0 + jj")
        xs = [em.let(at(v, [key, c])) for c in vcols]
        for t in range(T):
            wt = em.let(f"ps[{_at(t * C, 'jj')}]")
            L(f"{sums[t]} = {sums[t]} + {wt};")
            for e, x in enumerate(xs):
                L(f"{accs[t][e]} = fma({wt}, {x}, {accs[t][e]});")
    for t in range(T):
        pair = em.let(f"bo * {T * P}u + {_at(t * P, 'p')}")  # (row bo * T + t, chunk p)
        for e, c in enumerate(cols):  # the last columns' threads may have none
            with em.block("" if (e + 1) * C <= Dv else f"if ({c} < {Dv}u)"):
                em.store(scratch, f"{pair} * {Dv}u + {c}", accs[t][e])
        with em.block("if (lid == 0u)"):
            em.store(scratch, f"{sp.m0}u + {pair}", maxes[t])
            em.store(scratch, f"{sp.m0 + sp.NP}u + {pair}", sums[t])
    return ctx.dispatch(k, em.lines, grid, C)


def _pass2(ctx, sp: _Split) -> dict:
    scratch = ctx.scratch[0]
    T, Dv, P = sp.T, sp.Dv, sp.P
    ninf = f32_lit(float("-inf"))
    k = ctx.kernel(sp.name + " (pass 2)")
    epi = ctx.epilogue_fn(k, (sp.nb, T, Dv))
    em = ctx.emitter(k)
    L = em.emit
    grid = k.thread_index(em, sp.nb * T * Dv, "o", PASS2_WG)
    L(f"let row = o / {Dv}u;")
    L(f"let e = o % {Dv}u;")
    em.declare("row", "e", "q")

    def word(flat):
        return em.load(scratch, Idx((sp.words,), flat=em.let(flat)))
    mx = em.var("f32", ninf, "m")
    with em.block(f"for (var q = 0u; q < {P}u; q++)"):
        L(f"{mx} = max({mx}, {word(f'{sp.m0}u + row * {P}u + q')});")
    mz = em.let(f"select({mx}, 0.0f, {mx} == {ninf})")
    tot, acc = em.var("f32", "0.0f", "l"), em.var("f32", "0.0f", "a")
    with em.block(f"for (var q = 0u; q < {P}u; q++)"):
        pair = em.let(f"row * {P}u + q")
        wt = em.let(f"exp({word(f'{sp.m0}u + {pair}')} - {mz})")
        L(f"{tot} = {tot} + {word(f'{sp.m0 + sp.NP}u + {pair}')} * {wt};")
        L(f"{acc} = fma({word(f'{pair} * {Dv}u + e')}, {wt}, {acc});")
    bo, t = ("row", "0u") if T == 1 else (em.let(f"row / {T}u"), em.let(f"row % {T}u"))
    L(f"{epi}({bo}, {t}, e, {acc} * (1.0f / {tot}));")
    return ctx.dispatch(k, em.lines, grid, PASS2_WG)


__all__ = ["build_split", "use_split", "split_scratch"]
