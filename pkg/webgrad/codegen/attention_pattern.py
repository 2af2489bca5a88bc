"""The attention pass's pattern (codegen/attention_match.py rewrites what it finds): each
`softmax(mask(scale * q @ k^T)) @ v` in a graph and its autograd, read back from the output
product, with the mask read symbolically as a causal offset.

What is matched (forward), reading back from `O = matmul(P, V)`:
  P = softmax_last(X), X = a chain of ops on S = matmul(A, B) (A = q [.., T, D],
  B = k^T [.., D, S]), each with one non-chain input that is a constant subgraph:
    mul / div by a positive scalar constant             (the 1/sqrt(d) scale, before or after)
    where(m, chain, fill) / where(m, fill, chain)       (a mask, fill <= MASK_FILL)
    add(chain, M) / add(M, chain) / sub(chain, M)        (an additive mask of 0 and <= MASK_FILL)
  The mask must keep key j for query i exactly when j <= i + offset (offset >= 0: every
  query keeps key 0; causal is offset 0, a query block at the end of a cache S - T), or
  keep every key; the offset may add a one-element feed or state read at run time (a
  query block at position `pos` of a KV cache: j <= i + pos). It is read symbolically:
  arange / cast / reshape / transpose / broadcast / add / sub / mul / comparisons / where
  over constants are affine functions of (i, j) and half-planes of them (`_sym`), so
  `ops.causal_mask`, `where_causal`, `softmax_causal_last`
  and hand-written `less(cols, rows)` spellings all read as an offset; a constant table (a
  precomputed triangle) is checked entry by entry.
What is matched (backward), from grad.py's rules for exactly those ops:
  gV = matmul(P^T, G) and gP = matmul(G, V^T) for one G (the gradient of O);
  gX = P * (gP - sum_last(gP * P)) (softmax_last's rule); the chain's rules back to gS
  (mul(g, c), div(g, c), where(m, g, 0), the identity for add/sub); gA = matmul(gS, B^T),
  gB = matmul(A^T, gS).
Under precision="mixed" (KernelOptions.attn_mixed), the casts precision.py inserts are read
through as well, and the Match records them (mixed=True), so that the kernels round where
the program does: the scores q @ k^T rounded to f16 (cast f32 of cast f16) before the
chain; the probabilities' f16 cast before @ V (and P^T's before the product with G); in
the backward the rounded gP = G @ V^T, and gS's cast before its two products. A, B, V and
G are then the f16 operands (cast nodes or f16 values) the matmuls read, and the backward's
transposed operands (k^T^T, q^T, v^T) may be f16 casts of the f32 values' transposes.
find_matches returns a Match per attention found (forward, and backward where the graph has
it); the rewrite checks afterwards that nothing else reads the scores.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from math import prod

from ..ir import Graph
from .layout import swaps_last_two
from .options import KernelOptions

MASK_FILL = -1e4    # a masked score must be at most this: exp(-1e4 - max) is 0 in f32
MAX_HEAD_DIM = 256  # head dims are unrolled into registers; wider heads stay unfused


@dataclass
class Match:
    s: int                  # S = matmul(A, B)
    a: int
    b: int
    v: int
    p: int                  # softmax_last
    o: int                  # matmul(P, V)
    scale: float
    offset: int | None      # key j is kept for query i iff j <= i + offset (None: all)
    dyn: int | None = None  # a runtime scalar added to offset (a KV cache's position feed)
    inner: list[int] = field(default_factory=list)   # S .. X, P
    g: int | None = None    # gradient of O
    gv: int | None = None
    ga: int | None = None
    gb: int | None = None
    mixed: bool = False     # the program rounds the scores, P, gP and gS to f16 (above)
    casts: list[int] = field(default_factory=list)   # mixed: the casts of S, P, gP, gS
    round_x: bool = False   # precision="f16": the scaled score rounded again (after the scale)


class Matcher:
    """The attention pattern's reader of one graph (the fusion's find and onnx.attention's
    cached-attention search both walk through it): constant subgraphs (is_const, scalar), the mask's
    symbolic form (sym, kept), then forward from an output product and backward from its
    Match (the caches are per graph)."""

    def __init__(self, g: Graph, mixed: bool = True):
        self.g, self.mixed = g, mixed   # mixed: read through precision="mixed"'s casts
        self.cons = g.consumers()
        self._const: dict[int, bool] = {}
        self._sym: dict[int, object] = {}
        self._kept: dict[tuple, object] = {}
        self.pos_max = 0  # the largest runtime position the symbols were read for (kept)

    # ------------------------------------------------------------ constant subgraphs
    def is_const(self, n: int) -> bool:
        """Built from const / arange leaves and one-element feeds or state (a position:
        the same for every score), no parameter or random number."""
        r = self._const.get(n)
        if r is None:
            node = self.g[n]
            if node.op in ("const", "arange") or (node.op in ("input", "state") and node.size == 1):
                r = True
            elif node.op in ("input", "param", "state", "rand_uniform") or not node.inputs:
                r = False
            else:
                r = all(self.is_const(i) for i in node.inputs)
            self._const[n] = r
        return r

    def scalar(self, n: int):
        """The value of a constant that holds one number, else None."""
        node = self.g[n]
        while node.op in ("reshape", "broadcast_to") and self.g[node.inputs[0]].size == 1:
            node = self.g[node.inputs[0]]
        if node.op == "const" and node.size == 1 and node.dtype == "f32":
            v = node.attrs["value"]
            return float(v[0] if isinstance(v, tuple) else v)
        return None

    # ------------------------------------------------------------ precision's casts
    def to_f16(self, n: int) -> int | None:
        """x where node n is a cast of x to f16 (an f16 node, or its f16_in_f32 form)."""
        node = self.g[n]
        if node.op == "cast" and node.attrs.get("dtype") == "f16":
            return node.inputs[0]
        return None

    def rounded(self, n: int) -> int | None:
        """x where node n is x rounded to f16 as an f32 value: cast(cast(x, f16), f32)."""
        node = self.g[n]
        if node.op != "cast" or node.attrs.get("dtype") != "f32":
            return None
        return self.to_f16(node.inputs[0])

    def round_of(self, n: int) -> int | None:
        """The node holding n rounded to f16 as f32 (its only reader's reader), or None."""
        h = self._one(n, lambda c: c.op == "cast" and c.attrs.get("dtype") == "f16")
        return None if h is None else self._one(
            h, lambda c: c.op == "cast" and c.attrs.get("dtype") == "f32")

    def swap_of(self, x: int, y: int) -> bool:
        """Is y the last-two-axes transpose of operand x: transpose(x), or (x an f16 cast of
        a value u) an f16 cast of transpose(u)."""
        yn = self.g[y]
        if swaps_last_two(yn) and yn.inputs[0] == x:
            return True
        u, t = self.to_f16(x), self.to_f16(y)
        return u is not None and t is not None and swaps_last_two(self.g[t]) \
            and self.g[t].inputs[0] == u

    # ------------------------------------------------------------ the mask, symbolically
    # A value over an index is ("aff", c0, {axis: coef}) = c0 + sum coef * idx[axis] or
    # ("sel", (c0, coefs, strict), a, b) = a where c0 + sum coef * idx[axis] > 0 (>= 0 when
    # not strict) else b. Axes are negative (right-aligned), as broadcasting aligns them.
    def sym(self, n: int):
        if n not in self._sym:
            node = self.g[n]
            try:
                x = self._sym_of(node)
            except (KeyError, ValueError, ZeroDivisionError, TypeError):
                x = None
            if x is not None:  # an index along a size-1 axis is always 0: no coefficient
                r = len(node.shape)
                keep = {k for k in range(-r, 0) if node.shape[k] != 1}

                def kept(coefs):
                    return {k: c for k, c in coefs.items() if c and (k in keep or not isinstance(k, int))}
                if x[0] == "aff":
                    x = ("aff", x[1], kept(x[2]))
                else:
                    c0, coefs, strict = x[1]
                    x = ("sel", (c0, kept(coefs), strict), x[2], x[3])
            self._sym[n] = x
        return self._sym[n]

    def _sym_of(self, node):
        op, ins = node.op, node.inputs
        if op == "const":
            v = self.scalar(node.id)
            return ("aff", v, {}) if v is not None else None
        if op == "arange":
            return ("aff", 0.0, {-1: 1.0})
        if op in ("input", "state") and node.size == 1:  # a runtime scalar: a symbol
            return ("aff", 0.0, {("dyn", node.id): 1.0})
        if op == "cast":
            x = self.sym(ins[0])
            if x is None or (node.dtype == "i32" and not _integral(x)):
                return None
            if node.attrs.get("dtype") == "f16" and \
                    not _f16_exact(x, self.g[ins[0]].shape, self.pos_max):
                return None  # precision="f16" rounds positions past 2048: not the index
            return x
        if op in ("reshape", "broadcast_to", "transpose"):
            x = self.sym(ins[0])
            return None if x is None else _remap_axes(x, self.g[ins[0]].shape, node)
        if op == "add":  # ops.less_equal / greater_equal: less(a, b) + equal(a, b)
            le = self._compare_or_equal(*(self.g[i] for i in ins))
            if le is not None:
                return le
        if op in ("add", "sub", "mul", "div"):
            x, y = self.sym(ins[0]), self.sym(ins[1])
            return None if x is None or y is None else _arith(op, x, y)
        if op == "neg":
            x = self.sym(ins[0])
            return None if x is None else _arith("mul", x, ("aff", -1.0, {}))
        if op in ("less", "greater"):
            x, y = self.sym(ins[0]), self.sym(ins[1])
            if x is None or y is None or x[0] != "aff" or y[0] != "aff":
                return None
            lo, hi = (x, y) if op == "less" else (y, x)  # lo < hi  <=>  hi - lo > 0
            d = _arith("sub", hi, lo)
            return ("sel", (d[1], d[2], True), 1.0, 0.0)
        if op == "equal":  # a mask compared with a constant: `mask == 0`
            x, y = self.sym(ins[0]), self.sym(ins[1])
            if x is None or y is None:
                return None
            if x[0] == "aff" and not x[2]:
                x, y = y, x
            if y[0] != "aff" or y[2]:
                return None
            if x[0] == "aff":
                return None if x[2] else ("aff", float(x[1] == y[1]), {})
            return ("sel", x[1], float(x[2] == y[1]), float(x[3] == y[1]))
        if op == "where":
            c, x, y = (self.sym(i) for i in ins)
            if c is None or x is None or y is None or x[0] != "aff" or y[0] != "aff" \
                    or x[2] or y[2]:
                return None
            if c[0] == "aff":
                return None if c[2] else (x if c[1] != 0 else y)
            _, pred, a, b = c
            if (a != 0) == (b != 0):
                return x if a != 0 else y
            return ("sel", pred, x[1], y[1]) if a != 0 else ("sel", pred, y[1], x[1])
        return None

    def _compare_or_equal(self, a, b):
        """less(x, y) + equal(x, y) (either order) as one non-strict half-plane x <= y
        (each may be rounded to f16, as precision="f16" rounds them: 0 and 1 are exact)."""
        a, b = (self.g[self.rounded(n.id)] if self.rounded(n.id) is not None else n for n in (a, b))
        if a.op == "equal":
            a, b = b, a
        if a.op not in ("less", "greater") or b.op != "equal" \
                or sorted(a.inputs) != sorted(b.inputs):
            return None
        strict = self.sym(a.id)
        if strict is None or strict[0] != "sel":
            return None
        _, (c0, coefs, _), one, zero = strict
        return ("sel", (c0, coefs, False), one, zero)

    def kept(self, m: int, shape, keeps: str):
        """(ok, offset, dyn) for a mask m read over scores of `shape`: key j of query i is
        kept where the mask is nonzero (keeps="nonzero", a where) or zero ("zero": where's
        other branch, an additive mask); ok when that is `j <= i + offset` (offset >= 0)
        or everything (offset None); dyn: a runtime scalar (node id) added to the offset,
        as in `j <= i + pos` for a query block at position pos of a cache (taken to be
        >= 0: with a negative position a row would keep no key)."""
        key = (m, tuple(shape), keeps)
        # a query block of T rows at position pos of a cache of S rows: 0 <= pos <= S - T
        # (its rows are written there), which bounds a position rounded to f16 (sym)
        if max(shape[-1] - shape[-2], 0) != self.pos_max:
            self.pos_max, self._sym, self._kept = max(shape[-1] - shape[-2], 0), {}, {}
        if key not in self._kept:
            keep_if = (lambda x: x != 0) if keeps == "nonzero" else (lambda x: x == 0)
            self._kept[key] = self._kept_of(m, tuple(shape), keep_if)
        return self._kept[key]

    def _kept_of(self, m, shape, keep_if):
        T, S = shape[-2], shape[-1]
        node = self.g[m]
        if node.op == "const" and isinstance(node.attrs["value"], tuple):
            return _table_offset(node, T, S, keep_if) + (None,)
        s = self.sym(m)
        no = (False, None, None)
        if s is None:
            return no
        if s[0] == "aff":
            return (keep_if(s[1]), None, None) if not s[2] else no
        _, (c0, coefs, strict), a, b = s
        ka, kb = keep_if(a), keep_if(b)
        if ka == kb:
            return ka, None, None
        dyn = [k for k in coefs if not isinstance(k, int)]
        if set(coefs) - {-1, -2} - set(dyn) or len(dyn) > 1:
            return no  # the mask differs across batch axes, or two runtime scalars
        ci, cj = coefs.get(-2, 0.0), coefs.get(-1, 0.0)
        cp = coefs[dyn[0]] if dyn else 0.0
        if T == 1:
            ci = 0.0
        if not ka:  # kept where the predicate fails: not (e > 0) is -e >= 0
            c0, ci, cj, cp, strict = -c0, -ci, -cj, -cp, not strict
        # kept iff c0 + ci i + cj j + cp pos  (> or >=)  0
        if ci == 0 and cj == 0:
            return ((c0 > 0 if strict else c0 >= 0), None, None) if not dyn else no
        k = -cj  # kept iff j - i <= offset (+ pos): ci = k, cj = -k, cp = k
        if k <= 0 or (ci != k and T > 1) or (dyn and cp != k):
            return no
        t = c0 / k
        off = (math.ceil(t) - 1) if strict else math.floor(t)
        return _offset_ok(off, T, S, dyn[0][1] if dyn else None)

    # ------------------------------------------------------------ the forward pattern
    def forward(self, o: int) -> Match | None:
        g = self.g
        on = g[o]
        if on.op != "matmul":
            return None
        p, v = on.inputs
        casts = []
        if self.mixed and self.to_f16(p) is not None:  # P rounded to f16 before @ V
            casts.append(p)
            p = self.to_f16(p)
        pn = g[p]
        if pn.op != "softmax_last" or len(pn.shape) < 2:
            return None
        if tuple(on.shape[:-2]) != tuple(pn.shape[:-2]):
            return None  # V broadcasts P: not the attention shape
        chain = []   # (node id, index of the chain input), from X back to just after S
        rounds = []  # mixed / f16: the chain's roundings, as the length of chain above each
        cur = pn.inputs[0]
        while g[cur].op != "matmul":
            node = g[cur]
            x = self.rounded(cur) if casts else None
            if x is not None:  # a value of the chain rounded to f16
                casts += [cur, node.inputs[0]]
                rounds.append(len(chain))
                cur = x
                continue
            if node.shape != pn.shape or len(chain) > 8:
                return None
            k = self._chain_input(node)
            if k is None:
                return None
            chain.append((cur, k))
            cur = node.inputs[k]
        s = cur
        sn = g[s]
        if sn.shape != pn.shape:
            return None
        round_x = False
        if casts:
            # s = f16(scale * f16(q.k)) (round_x: precision="f16" rounds after each op) or
            # scale * f16(q.k) ("mixed"): a rounding before the first scale op rounds q.k
            # (a mask keeps the kept scores as they are), one after it the scaled score; a
            # scale op after that would round twice, which the kernels do not
            scales = [len(chain) - 1 - i for i, (n, _) in enumerate(chain)
                      if g[n].op in ("mul", "div")]  # scale ops, counted from S
            first = min(scales, default=len(chain))
            at = [len(chain) - r for r in rounds]  # chain ops below each rounding
            if not any(a <= first for a in at):
                return None  # q.k itself is not rounded: not precision.py's rule
            later = [a for a in at if a > first]
            if later and any(sc >= min(later) for sc in scales):
                return None
            round_x = bool(later)
        a, b = sn.inputs
        scale, fill, mask = 1.0, None, None
        for n, k in reversed(chain):
            node = g[n]
            other = [i for j, i in enumerate(node.inputs) if j != k]
            if node.op in ("mul", "div"):
                c = self.scalar(other[0])
                if c is None or not c > 0:
                    return None
                f = c if node.op == "mul" else 1.0 / c
                scale *= f
                fill = None if fill is None else fill * f
            elif node.op == "where":
                if mask is not None or k == 0:
                    return None
                fv = self.scalar(node.inputs[3 - k])
                if fv is None:
                    return None
                mask = (node.inputs[0], "nonzero" if k == 1 else "zero")
                fill = fv
            else:  # add / sub of a mask
                if mask is not None:
                    return None
                sign = -1.0 if node.op == "sub" else 1.0
                mask = (other[0], "zero")
                fill = _mask_fill(self, other[0], sign)
                if fill is None:
                    return None
        offset = dyn = None
        if mask is not None:
            ok, offset, dyn = self.kept(mask[0], pn.shape, mask[1])
            if not ok or (offset is not None and not (fill is not None and fill <= MASK_FILL)):
                return None
        D, Dv = g[a].shape[-1], g[v].shape[-1]
        if D > MAX_HEAD_DIM or Dv > MAX_HEAD_DIM or g[v].shape[-2] != sn.shape[-1]:
            return None
        inner = [s] + [n for n, _ in reversed(chain)] + [p]
        return Match(s, a, b, v, p, o, scale, offset, inner=inner, dyn=dyn,
                     mixed=bool(casts), casts=casts, round_x=round_x)

    def _chain_input(self, node) -> int | None:
        """Which input carries the scores (the others must be constant), or None."""
        ins = node.inputs
        if node.op in ("mul", "add"):
            cands = [k for k in (0, 1) if not self.is_const(ins[k]) and self.is_const(ins[1 - k])]
        elif node.op in ("div", "sub"):
            cands = [0] if self.is_const(ins[1]) and not self.is_const(ins[0]) else []
        elif node.op == "where":
            cands = [k for k in (1, 2) if not self.is_const(ins[k]) and self.is_const(ins[3 - k])]
            if not self.is_const(ins[0]):
                cands = []
        else:
            return None
        return cands[0] if len(cands) == 1 else None

    # ------------------------------------------------------------ the backward pattern
    def _one(self, n: int, pred):
        hits = [c for c in self.cons.get(n, []) if pred(self.g[c])]
        return hits[0] if len(hits) == 1 else None

    def backward(self, m: Match) -> None:
        """Fill m.g, m.gv, m.ga, m.gb where grad.py's nodes are found (else leave None)."""
        g = self.g
        pt = self._one(m.p, swaps_last_two)
        if m.mixed and pt is not None:  # P^T rounded to f16 before the product with G
            pt = self._one(pt, lambda n: self.to_f16(n.id) is not None)
        gv = self._one(pt, lambda n: n.op == "matmul" and n.inputs[0] == pt) if pt is not None else None
        if gv is None:
            return
        G = g[gv].inputs[1]
        gp = self._one(G, lambda n: n.op == "matmul" and n.inputs[0] == G
                       and self.swap_of(m.v, n.inputs[1]))
        if gp is None:
            return
        if m.mixed:  # gP rounded to f16 before the softmax's rule reads it
            gp = self.round_of(gp)
            if gp is None:
                return
        r = len(g[m.p].shape)
        # softmax_last's rule: gX = P * (gP - reshape(sum(gP * P, last)))
        m1 = self._one(gp, lambda n: n.op == "mul" and set(n.inputs) == {gp, m.p})
        s1 = m1 is not None and self._one(m1, lambda n: n.op == "sum"
                                          and tuple(n.attrs["axes"]) == (r - 1,))
        r1 = s1 and self._one(s1, lambda n: n.op == "reshape")
        d1 = r1 and self._one(r1, lambda n: n.op == "sub" and n.inputs == (gp, r1))
        gx = d1 and self._one(d1, lambda n: n.op == "mul" and set(n.inputs) == {m.p, d1})
        if not gx:
            return
        cur = gx
        for n in reversed(m.inner[1:-1]):  # the chain, from X back to S's consumer
            node = g[n]
            if node.op in ("add", "sub"):
                continue  # d(x + M) = dx
            if node.op in ("mul", "div"):
                c = [i for i in node.inputs if self.is_const(i)][0]
                op = node.op
                nxt = self._one(cur, lambda q, c=c, op=op: q.op == op and (
                    q.inputs == (cur, c) or (op == "mul" and q.inputs == (c, cur))))
            else:  # where(m, x, fill): dx = where(m, g, 0)
                k = 1 if not self.is_const(node.inputs[1]) else 2
                mk = node.inputs[0]
                nxt = self._one(cur, lambda q, k=k, mk=mk: q.op == "where" and q.inputs[0] == mk
                                and q.inputs[k] == cur and self.scalar(q.inputs[3 - k]) == 0.0)
            if nxt is None:
                return
            cur = nxt
        gs = cur
        if m.mixed:  # gS rounded to f16 before its two products
            gs = self._one(gs, lambda n: self.to_f16(n.id) is not None)
            if gs is None:
                return
        m.g, m.gv = G, gv
        m.ga = self._one(gs, lambda n: n.op == "matmul" and n.inputs[0] == gs
                         and self.swap_of(m.b, n.inputs[1]))
        m.gb = self._one(gs, lambda n: n.op == "matmul" and n.inputs[1] == gs
                         and self.swap_of(m.a, n.inputs[0]))


# ---------------------------------------------------------------- symbolic helpers

def _integral(x) -> bool:
    vals = [x[1], *x[2].values()] if x[0] == "aff" else [x[2], x[3], x[1][0], *x[1][1].values()]
    return all(float(v).is_integer() for v in vals)


def _f16_exact(x, shape, pos_max: int = 0) -> bool:
    """Whether f16 holds every value of x over an index of `shape` exactly: integers of
    magnitude at most 2048, a runtime scalar (a cache position) taken in [0, pos_max]."""
    r = len(shape)
    if x[0] == "sel":
        try:
            return all(struct.unpack("<e", struct.pack("<e", v))[0] == v for v in (x[2], x[3]))
        except OverflowError:
            return False
    if not _integral(x):
        return False
    top = abs(x[1]) + sum(abs(c) * (shape[k] - 1) for k, c in x[2].items()
                     if isinstance(k, int) and -r <= k < 0) \
        + sum(abs(c) * pos_max for k, c in x[2].items() if not isinstance(k, int))
    return top <= 2048


def _remap_axes(x, in_shape, node):
    """x (over in_shape's axes) as a value over node's axes (reshape/broadcast/transpose)."""
    coefs = x[2] if x[0] == "aff" else x[1][1]
    r_in, r_out = len(in_shape), len(node.shape)
    if node.op == "broadcast_to":
        new = dict(coefs)  # right-aligned: the same negative axes
    elif node.op == "transpose":
        perm = node.attrs["perm"]
        new = {k - r_out: coefs[perm[k] - r_in] for k in range(r_out) if perm[k] - r_in in coefs}
    else:  # reshape: only size-1 axes may come or go
        src = [k - r_in for k, d in enumerate(in_shape) if d != 1]
        dst = [k - r_out for k, d in enumerate(node.shape) if d != 1]
        if [in_shape[k] for k in src] != [node.shape[k] for k in dst]:
            raise ValueError("a reshape that merges or splits axes")
        where = dict(zip(src, dst))
        new = {where[k]: c for k, c in coefs.items() if k in where}
    new.update({k: c for k, c in coefs.items() if not isinstance(k, int)})  # runtime scalars
    if x[0] == "aff":
        return ("aff", x[1], new)
    return ("sel", (x[1][0], new, x[1][2]), x[2], x[3])


def _arith(op, x, y):
    f = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b,
         "mul": lambda a, b: a * b, "div": lambda a, b: a / b}[op]
    if x[0] == "aff" and y[0] == "aff":
        if op in ("add", "sub"):
            keys = set(x[2]) | set(y[2])
            return ("aff", f(x[1], y[1]), {k: f(x[2].get(k, 0.0), y[2].get(k, 0.0)) for k in keys})
        if y[2] and x[2]:
            raise ValueError("a product of two index-dependent values")
        if op == "div" and y[2]:
            raise ValueError("division by an index-dependent value")
        c, v = (y[1], x) if not y[2] else (x[1], y)
        return ("aff", f(v[1], c) if v is x else f(c, v[1]),
                {k: (f(e, c) if v is x else f(c, e)) for k, e in v[2].items()})
    # a selection with a constant: apply to both branches
    if x[0] == "sel" and y[0] == "aff" and not y[2]:
        return ("sel", x[1], f(x[2], y[1]), f(x[3], y[1]))
    if y[0] == "sel" and x[0] == "aff" and not x[2]:
        return ("sel", y[1], f(x[1], y[2]), f(x[1], y[3]))
    raise ValueError("two masks combined")


def _offset_ok(off, T, S, dyn=None):
    if off < 0:
        return False, None, None  # some query would keep no key at all
    if dyn is not None:
        return True, int(off), dyn
    return True, (None if off >= S - 1 else int(off)), None


def _table_offset(node, T, S, keep_if):
    """A constant mask table, checked entry by entry against j <= i + offset."""
    shape, vals = node.shape, node.attrs["value"]
    if len(shape) < 2 or prod(shape[:-2]) != 1 or shape[-1] != S or shape[-2] not in (1, T):
        return False, None
    rows = shape[-2]
    kept0 = [keep_if(vals[j]) for j in range(S)]
    off = sum(kept0) - 1
    if rows == 1 and T > 1:
        return (True, None) if all(kept0) else (False, None)
    for i in range(rows):
        base = i * S
        for j in range(S):
            if keep_if(vals[base + j]) != (j <= i + off):
                return False, None
    return _offset_ok(off, T, S)[:2]


def _mask_fill(mt: Matcher, m: int, sign: float):
    """The masked value of an additive mask (sign * M): its entries must be 0 (kept) or
    at most MASK_FILL; returns the largest masked entry, or None."""
    node = mt.g[m]
    if node.op == "const" and isinstance(node.attrs["value"], tuple):
        bad = [sign * v for v in node.attrs["value"] if sign * v != 0]
        return max(bad) if bad else -math.inf
    s = mt.sym(m)
    if s is None or s[0] != "sel":
        return None
    vals = [sign * s[2], sign * s[3]]
    if 0.0 not in vals:
        return None
    return min(vals)


def find_matches(g: Graph, limits=None) -> list[Match]:
    mt = Matcher(g, (limits.options if limits is not None else KernelOptions()).attn_mixed
                  is not False)
    out = []
    for n in g.nodes:
        m = mt.forward(n.id)
        if m is None:
            continue
        mt.backward(m)
        out.append(m)
    return out
