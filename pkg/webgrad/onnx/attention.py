"""A KV cache's attention lowered as one onnxruntime contrib node, `GroupQueryAttention`.

A decode step of a Llama-family model (models/llama.py's cached_hidden) writes each layer's
new K and V rows into its cache state at the run-time position `pos` (ops.write_rows) and
attends over the whole cache with the mask key <= pos + i. Lowered one rule per primitive
that is about 30 kernels a layer after onnxruntime's optimizer (the rows' Gather and Where,
the heads' Reshapes and Transposes, the rotary embedding's Split, Neg, Concat, Muls and Add
for q and for k, the products, the mask and the softmax), each a fixed cost in
onnxruntime-web; onnxruntime's CPU kernels (its native build and onnxruntime-web's
WebAssembly one) have the whole pattern as com.microsoft's GroupQueryAttention: past and
present K/V ([1, n_kv, S, head_dim]), the causal mask from the past length, and, with
do_rotary, the rotate-half rotary embedding of q and k from cos/sin tables.

What is matched (find), reading from each `softmax(mask(scale * q @ k^T)) @ v` that
codegen/attention_pattern.py finds with the mask key <= i + pos (its `dyn` position):
  k^T = transpose(reshape(transpose(reshape(K, (S, Hkv, Dh))), (Hkv, 1, S, Dh)))  and v
  the same without the last transpose, K and V = write_rows(cache, rows [T, Hkv * Dh], pos);
  q [Hkv, rep, T, Dh] = reshape(transpose(Q [T, H, Dh])); the output [Hkv, rep, T, Dh]
  reshaped to [H, T, Dh], transposed and reshaped to [T, H * Dh] (llama.py's _attend);
  and, for do_rotary (head_dim a multiple of 16, which the CPU kernel needs), Q and the K
  rows both llama.py's _rope of their inputs by cos/sin of (pos + arange(T)) * inv_freq.
Every inner value must have no reader outside the pattern, and the step is of one id
(T = 1: a decode step). The present K/V that the node returns hold the past rows below pos
and the new row, and zeros after them; the cache's new value keeps the old rows there (a
Where on the row written, write_rows's own mask), so the state is what write_rows writes.
Unlike write_rows, a row past the cache's end is not dropped: onnxruntime refuses the run
(pos >= n_ctx, which decoding never feeds: Cache's n_ctx check). A cache that only its
pattern reads (row_states) can instead be exchanged by rows (export_graph's by_rows, which
the `wasm` backend asks for): its input is its rows below pos, its output the new row alone,
and the runtime writes that row into the state in place, so a step moves one row of each
cache rather than all n_ctx of them in and out. Chunks of T > 1 ids keep
the standard form: SurprisalTracker pads its chunks to a power of two, whose rows may pass
the cache's end, where write_rows drops them and the node would refuse.
"""
from __future__ import annotations

import array
import math
from dataclasses import dataclass, field

from ..ir import Graph
from ..codegen.attention_pattern import Matcher

DOMAIN = "com.microsoft"   # onnxruntime's contrib operators (opset version 1)


@dataclass
class CachedAttention:
    out: int            # the [T, H * Dh] output
    k_full: int         # write_rows of the K cache (a writeback)
    v_full: int
    q: int              # the query heads [T, H, Dh] (before the rotary embedding if rotary)
    k: int              # the new K rows (before it) and V rows, T * Hkv * Dh values
    v: int
    pos: int
    heads: int
    kv_heads: int
    scale: float
    inv_freq: list | None = None   # do_rotary: the angles' inverse frequencies
    inner: set = field(default_factory=set)

    @property
    def reads(self) -> tuple:
        return (self.q, self.k, self.v, self.pos)


def find(graph: Graph) -> tuple[dict[int, CachedAttention], set[int]]:
    """{each matched attention's output and its two write_rows: its record}, and the inner
    nodes, which are not lowered."""
    users = graph.consumers()
    roots = set(graph.roots())
    mt = Matcher(graph, mixed=False)
    found, inner = {}, set()
    for n in graph.nodes:
        m = mt.forward(n.id) if n.op == "matmul" else None
        rec = m and _record(graph, users, roots, m)
        if rec is None or rec.inner & inner:
            continue
        for i in (rec.out, rec.k_full, rec.v_full):
            found[i] = rec
        inner |= rec.inner
    return found, inner


def row_states(graph: Graph, found: dict[int, CachedAttention]) -> dict[int, str]:
    """{state leaf id: the position feed's name} for each matched cache that the runtime can
    exchange by rows (Exported.row_reads, row_writes): the state is read by nothing but its
    write_rows, whose value is the state's writeback and is read only inside the pattern, at
    a position the program is fed. Its model input is then the cache's rows below the
    position (a symbolic length) and its output the new rows, which the runtime writes into
    the state itself: a step moves the rows it reads and writes, not the whole cache."""
    users = graph.consumers()
    names: dict[str, int] = {}
    for n in graph.nodes:
        if n.op == "state":
            names[n.attrs["name"]] = names.get(n.attrs["name"], 0) + 1
    out = {}
    for rec in {id(r): r for r in found.values()}.values():
        if graph[rec.pos].op != "input":
            continue
        for full in (rec.k_full, rec.v_full):
            leaf = graph[graph[full].inputs[0]]
            if (leaf.op == "state" and names[leaf.attrs["name"]] == 1
                    and users.get(leaf.id, []) == [full]
                    and graph.writebacks.get(leaf.attrs["name"]) == full
                    and all(u in rec.inner for u in users.get(full, []))):
                out[leaf.id] = graph[rec.pos].attrs["name"]
    return out


def _record(g: Graph, users, roots, m) -> CachedAttention | None:
    if m.mixed or m.offset != 0 or m.dyn is None or g[m.s].dtype != "f32":
        return None
    sole = lambda i, user: users.get(i, []) == [user] and i not in roots  # noqa: E731
    if not all(sole(i, j) for i, j in zip(m.inner, m.inner[1:] + [m.o])):
        return None   # the scores or probabilities are read elsewhere (a capture)
    qh = g[m.a]
    if len(qh.shape) != 4:
        return None
    Hkv, rep, T, Dh = qh.shape
    if T != 1:
        return None   # a chunk: the surprisal's padded rows may pass the cache's end (header)
    H = Hkv * rep
    chain = []

    def up(i, user, steps):
        """The node under the views `steps` (from the reader up) above node i, or None."""
        for op, want in steps:
            n = g[i]
            if n.op != op or not sole(i, user) or (
                    n.shape if op == "reshape" else tuple(n.attrs["perm"])) != want:
                return None
            chain.append(i)
            i, user = n.inputs[0], i
        return i

    S = g[m.b].shape[-1]
    kf = up(m.b, m.s, [("transpose", (0, 1, 3, 2)), ("reshape", (Hkv, 1, S, Dh)),
                       ("transpose", (1, 0, 2)), ("reshape", (S, Hkv, Dh))])
    vf = up(m.v, m.o, [("reshape", (Hkv, 1, S, Dh)), ("transpose", (1, 0, 2)),
                       ("reshape", (S, Hkv, Dh))])
    qt = up(m.a, m.s, [("reshape", (Hkv, rep, T, Dh)), ("transpose", (1, 0, 2))])
    if None in (kf, vf, qt) or g[qt].shape != (T, H, Dh):
        return None
    out, cur = m.o, None
    for op, want in (("reshape", (H, T, Dh)), ("transpose", (1, 0, 2)), ("reshape", (T, H * Dh))):
        if cur is not None:
            chain.append(out)
        if len(users.get(out, [])) != 1 or out in roots:
            return None
        cur = g[users[out][0]]
        if cur.op != op or (cur.shape if op == "reshape" else tuple(cur.attrs["perm"])) != want:
            return None
        out = cur.id
    ks, vs = g[kf], g[vf]
    if (ks.op != "write_rows" or vs.op != "write_rows" or kf == vf or ks.inputs[2] != m.dyn
            or vs.inputs[2] != m.dyn or g[ks.inputs[0]].shape != (S, Hkv * Dh)
            or g[vs.inputs[0]].shape != (S, Hkv * Dh) or g[ks.inputs[1]].shape != (T, Hkv * Dh)
            or g[vs.inputs[1]].shape != (T, Hkv * Dh) or g[m.dyn].dtype != "i32"):
        return None
    rec = CachedAttention(out, kf, vf, qt, ks.inputs[1], vs.inputs[1], m.dyn, H, Hkv, m.scale,
                          inner=set(m.inner) | {m.o} | set(chain))
    if Dh % 16 == 0:
        _rotary(g, users, roots, rec, T, Dh)
    return rec


def _rotary(g: Graph, users, roots, rec: CachedAttention, T: int, Dh: int) -> None:
    """Read llama.py's _rope on the query heads and the K rows into `rec` (do_rotary), where
    both rotate by the same angles (pos + arange(T)) * inv_freq; else leave it."""
    sole = lambda i, user: users.get(i, []) == [user] and i not in roots  # noqa: E731
    half = Dh // 2

    def other(n, i):
        a, c = n.inputs
        return c if a == i else a if c == i else None

    def rope(r, reader):
        """(x, angles' node, inner nodes) where r = x * cos(ang) + concat(-x2, x1) * sin(ang)."""
        n = g[r]
        if n.op != "add" or not sole(r, reader):
            return None
        for mc, ms in (n.inputs, n.inputs[::-1]):
            a, b = g[mc], g[ms]
            if a.op != "mul" or b.op != "mul" or not sole(mc, r) or not sole(ms, r):
                continue
            for cs in a.inputs:
                x, sn = other(a, cs), None
                if g[cs].op != "cos":
                    continue
                for s in b.inputs:
                    if g[s].op == "sin" and g[s].inputs == g[cs].inputs:
                        sn = s
                if sn is None or x is None or g[x].shape != n.shape:
                    continue
                cat = g[other(b, sn)]
                if cat.op != "concat" or cat.attrs["axis"] != len(n.shape) - 1 or len(cat.inputs) != 2:
                    continue
                ng, lo = g[cat.inputs[0]], g[cat.inputs[1]]
                if ng.op != "neg" or not sole(ng.id, cat.id) or not sole(lo.id, cat.id):
                    continue
                hi = g[ng.inputs[0]]
                if not (_slice(lo, x, 0, half) and _slice(hi, x, half, Dh) and sole(hi.id, ng.id)
                        and sole(cat.id, ms)):
                    continue
                return x, g[cs].inputs[0], {r, mc, ms, cat.id, ng.id, lo.id, hi.id}
        return None

    rows = g[rec.k]
    if rows.op != "reshape" or not sole(rows.id, rec.k_full) or g[rows.inputs[0]].shape[-1] != Dh:
        return
    q, k = rope(rec.q, _reader(g, users, rec.q)), rope(rows.inputs[0], rows.id)
    if q is None or k is None or q[1] != k[1]:
        return
    inv = _angles(g, q[1], rec.pos, T, half)
    if inv is None:
        return
    rec.q, rec.k, rec.inv_freq = q[0], k[0], inv
    rec.inner |= q[2] | k[2] | {rows.id}


def _reader(g: Graph, users, i: int) -> int | None:
    u = users.get(i, [])
    return u[0] if len(u) == 1 else None


def _slice(n, x: int, start: int, stop: int) -> bool:
    return (n.op == "slice" and n.inputs[0] == x and n.attrs["axis"] == len(n.shape) - 1
            and n.attrs["start"] == start and n.attrs["stop"] == stop and n.attrs.get("step", 1) == 1)


def _angles(g: Graph, ang: int, pos: int, T: int, half: int) -> list | None:
    """The inverse frequencies where node ang = reshape(concat(a, a)) [T, 1, Dh] and
    a = qpos * inv [T, Dh/2], qpos = f32 (pos + arange(T)) [T, 1] (llama.py's _rotary)."""
    r = g[ang]
    if r.op != "reshape" or r.shape != (T, 1, 2 * half):
        return None
    cat = g[r.inputs[0]]
    if cat.op != "concat" or len(cat.inputs) != 2 or cat.inputs[0] != cat.inputs[1] \
            or cat.shape != (T, 2 * half):
        return None
    a = g[cat.inputs[0]]
    if a.op != "mul" or a.shape != (T, half):
        return None
    for qp, c in (a.inputs, a.inputs[::-1]):
        cn = g[c]
        if cn.op == "const" and cn.shape == (1, half) and _positions(g, qp, pos, T):
            v = cn.attrs["value"]
            return [float(x) for x in v] if isinstance(v, (list, tuple)) else None
    return None


def _positions(g: Graph, i: int, pos: int, T: int) -> bool:
    """Node i is f32 (pos + arange(T)) as [T, 1]."""
    r = g[i]
    if r.op != "reshape" or r.shape != (T, 1):
        return False
    c = g[r.inputs[0]]
    if c.op != "cast" or c.dtype != "f32":
        return False
    s = g[c.inputs[0]]
    if s.op != "add" or pos not in s.inputs:
        return False
    ar = g[s.inputs[1] if s.inputs[0] == pos else s.inputs[0]]
    return ar.op == "arange" and ar.attrs["n"] == T and ar.dtype == "i32"


def lower(b, rec: CachedAttention, graph: Graph, names: dict, *, reshape, write_rows,
          by_rows=()) -> None:
    """GroupQueryAttention on the cache's rows below pos (sliced, transposed to
    [1, Hkv, pos, Dh]: its past; the node attends to them and the new row), and the cache's
    new value by write_rows's own rule (lower.py's) of the new V row and the new K row, under
    do_rotary the rotated one: the node's present K at pos. A cache state in `by_rows`
    (row_states) is its rows below pos already, and its value here is the new rows alone."""
    ks, vs = graph[rec.k_full], graph[rec.v_full]
    S, W = ks.shape
    T = graph[rec.out].shape[0]
    Hkv, Dh = rec.kv_heads, W // rec.kv_heads
    pos = names[rec.pos]

    def past(state):   # the rows below pos, as the node's past [1, Hkv, pos, Dh]
        rows = names[state] if state in by_rows else \
            b.emit("Slice", names[state], b.const([0], "i32"), pos, b.const([0], "i32"))
        return b.emit("Transpose", reshape(b, rows, (1, -1, Hkv, Dh)), perm=[0, 2, 1, 3])

    ins = [reshape(b, names[rec.q], (1, T, rec.heads * Dh)), reshape(b, names[rec.k], (1, T, W)),
           reshape(b, names[rec.v], (1, T, W)), past(ks.inputs[0]), past(vs.inputs[0]),
           b.emit("Add", pos, b.scalar(T - 1, "i32")),
           reshape(b, b.emit("Add", pos, b.scalar(T, "i32")), ())]
    attrs = dict(num_heads=rec.heads, kv_num_heads=Hkv, scale=float(rec.scale))
    if rec.inv_freq is not None:
        ins += [_cache(b, fn, rec.inv_freq, S) for fn in (math.cos, math.sin)]
        attrs["do_rotary"] = 1
    o, pk, _ = b.emit_n("GroupQueryAttention", *ins, domain=DOMAIN,
                        outs=[b.fresh("gqa"), b.fresh("present"), b.fresh("present")], **attrs)
    names[rec.out] = reshape(b, o, (T, rec.heads * Dh))
    k_row = names[ks.inputs[1]] if rec.inv_freq is None else \
        reshape(b, b.emit("Gather", pk, pos, axis=2), (T, W))   # the rotated row: present's at pos
    v_row = names[vs.inputs[1]]
    names[ks.id] = k_row if ks.inputs[0] in by_rows else \
        write_rows(b, ks, [names[ks.inputs[0]], k_row, pos], graph)
    names[vs.id] = v_row if vs.inputs[0] in by_rows else \
        write_rows(b, vs, [names[vs.inputs[0]], v_row, pos], graph)


def _cache(b, fn, inv: list, S: int) -> str:
    """cos or sin of the angles p * inv_freq for p < S, each angle the f32 product llama.py's
    _rotary computes (an exact double product of two f32s, rounded to f32)."""
    f32 = lambda v: array.array("f", v).tolist()  # noqa: E731
    inv = f32(inv)
    ang = f32([p * w for p in range(S) for w in inv])
    return b.const(f32([fn(a) for a in ang]), "f32", dims=(S, len(inv)))
