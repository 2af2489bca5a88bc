"""The row pass: cross entropy and layer-norm backward as row kernels, for WebGPU.

`program.lower` runs `rewrite_rows(graph)` before fusion (after the attention pass); the
reference and torch executors keep the plain IR, and the rewritten graph computes the same
mathematics up to f32 rounding. Three rewrites, each local:

 1. log_softmax_last(x) -> x - logsumexp_last(x)   (unless it is itself a graph output)
    The [.., V] log-probabilities become an expression over the logits: cross entropy
    over a 50k vocabulary stores the logits and a per-row log-sum-exp, not a second
    [N, V] tensor. Its readers (the pick below, softmax's gradient exp(logp)) recompute
    one subtraction per element.
 2. sum_last(A * one_hot(i, V)) -> pick_last(A, i)    (through size-1 reshapes)
    take_along_last (hence cross entropy) is written as a one-hot contraction so that its
    gradient needs no scatter; on the GPU that reads all V entries of a row to keep one.
    pick_last reads A at index i (0 when i is outside [0, V), as the one-hot row is all
    zero there; fed indices are checked on the host, computed ones may still stray). The
    backward's row sum of g * one_hot becomes a pick of g too.
    (The one-hot sum is NaN where a row of A holds an inf; the pick is not.)
 3. layer_norm_last's derivative, r * (g - mean(g) - o * mean(g * o)) with
    r = rsqrt(mean((x - mean x)^2) + eps) (primitives/reduce.py's _layer_norm_grad), ->
    layer_norm_grad(x, g): one row kernel for what was four row reductions and the
    elementwise rest.
Kernels and the pick's expression rule: codegen/rowfuse.py.
"""
from __future__ import annotations

from ..dce import dce
from ..ir import Graph
from ..primitives import ELEMENT, EXPR

# the ops this pass creates, as primitives' rows give them: (lowering, cost); codegen/kinds.py
# reads them beside primitives.PRIMS. The two row kernels count one FLOP per output element.
ROW_PASS_OPS = {"logsumexp_last": ("row_kernel", ELEMENT),
                "layer_norm_grad": ("row_kernel", ELEMENT),
                "pick_last": (EXPR, ELEMENT)}
ROW_KERNEL_OPS = frozenset(op for op, (kind, _) in ROW_PASS_OPS.items() if kind == "row_kernel")


class _Rewriter:
    def __init__(self, g: Graph):
        self.g = g
        self.cons = g.consumers()
        self.roots = set(g.roots())

    def through_unit_reshapes(self, n: int) -> int:
        """n, or what it reshapes when the reshape only adds or drops size-1 axes."""
        g = self.g
        while g[n].op == "reshape" and [d for d in g[n].shape if d != 1] == \
                [d for d in g[g[n].inputs[0]].shape if d != 1]:
            n = g[n].inputs[0]
        return n

    def mean_of(self, n: int):
        """y when n is mean_last(y, keepdims=True) as ops spells it (sum, reshape, * 1/D)."""
        g = self.g
        node = g[n]
        if node.op != "mul":
            return None
        for k in (0, 1):
            r, c = g[node.inputs[k]], g[node.inputs[1 - k]]
            if r.op != "reshape" or c.op != "const" or c.size != 1:
                continue
            s = g[r.inputs[0]]
            if s.op != "sum":
                continue
            y = g[s.inputs[0]]
            if tuple(s.attrs["axes"]) != (len(y.shape) - 1,) or r.shape != y.shape[:-1] + (1,):
                continue
            v = c.attrs["value"]
            v = v[0] if isinstance(v, tuple) else v
            if abs(float(v) * y.shape[-1] - 1.0) < 1e-6:
                return y.id
        return None

    # ------------------------------------------------------------ 2. pick
    def pick(self, n: int):
        """(A, i) for n = sum over the last axis of (reshapes of) A * one_hot(i, V)."""
        g = self.g
        node = g[n]
        if node.op != "sum" or node.dtype != "f32":
            return None
        x = g[node.inputs[0]]
        if tuple(node.attrs["axes"]) != (len(x.shape) - 1,):
            return None
        m = g[self.through_unit_reshapes(x.id)]
        if m.op != "mul" or m.shape[-1] != x.shape[-1]:
            return None
        for k in (0, 1):
            oh = g[m.inputs[k]]
            if oh.op == "one_hot" and oh.attrs["n"] == m.shape[-1]:
                return m.inputs[1 - k], oh.inputs[0], m
        return None

    # ------------------------------------------------------------ 3. layer norm backward
    def layer_norm_grad(self, n: int):
        """(x, g, eps) for n = primitives/reduce.py's _layer_norm_grad result, else None."""
        gr = self.g
        node = gr[n]
        if node.op != "mul":
            return None
        for k in (0, 1):
            r, d2 = gr[node.inputs[k]], gr[node.inputs[1 - k]]
            if r.op != "rsqrt" or d2.op != "sub" or d2.shape != node.shape:
                continue
            d1, t = gr[d2.inputs[0]], gr[d2.inputs[1]]
            if d1.op != "sub" or t.op != "mul":
                continue
            g_, mg = d1.inputs
            if self.mean_of(mg) != g_:
                continue
            for j in (0, 1):
                o, mgo = gr[t.inputs[j]], t.inputs[1 - j]
                if o.op != "layer_norm_last":
                    continue
                prod_ = self.mean_of(mgo)
                if prod_ is None or gr[prod_].op != "mul" or set(gr[prod_].inputs) != {g_, o.id}:
                    continue
                x, eps = o.inputs[0], o.attrs["eps"]
                if self._is_rstd(r, x, eps):
                    return x, g_, eps
        return None

    def _is_rstd(self, r, x: int, eps: float) -> bool:
        """r = rsqrt(mean(xc * xc) + eps), xc = x - mean(x)."""
        g = self.g
        a = g[r.inputs[0]]
        if a.op != "add":
            return False
        for k in (0, 1):
            c = g[a.inputs[1 - k]]
            if c.op != "const" or c.size != 1:
                continue
            v = c.attrs["value"]
            if float(v[0] if isinstance(v, tuple) else v) != float(eps):
                continue
            sq = self.mean_of(a.inputs[k])
            if sq is None or g[sq].op != "mul" or g[sq].inputs[0] != g[sq].inputs[1]:
                continue
            xc = g[g[sq].inputs[0]]
            if xc.op == "sub" and xc.inputs[0] == x and self.mean_of(xc.inputs[1]) == x:
                return True
        return False


def rewrite_rows(g: Graph) -> Graph:
    """The graph with the three rewrites applied wherever they match (else g itself)."""
    rw = _Rewriter(g)
    plan: dict[int, tuple] = {}
    for n in g.nodes:
        if n.op == "log_softmax_last" and n.id not in rw.roots:
            plan[n.id] = ("lse", n.inputs[0])
        elif n.op == "sum":
            hit = rw.pick(n.id)
            if hit is not None:
                plan[n.id] = ("pick",) + hit
        elif n.op == "mul":
            hit = rw.layer_norm_grad(n.id)
            if hit is not None:
                plan[n.id] = ("lng",) + hit
    if not plan:
        return g
    out = Graph(seed=g.seed, training=g.training)
    remap: dict[int, int] = {}

    add = out.add
    for n in g.nodes:
        how = plan.get(n.id)
        if how is None:
            remap[n.id] = add(n.op, [remap[x] for x in n.inputs], n.shape, n.dtype, n.attrs, n.loc)
        elif how[0] == "lse":
            x = remap[how[1]]
            lse = add("logsumexp_last", [x], n.shape[:-1], "f32", {}, n.loc)
            keep = add("reshape", [lse], n.shape[:-1] + (1,), "f32", {"shape": n.shape[:-1] + (1,)},
                       n.loc)
            remap[n.id] = add("sub", [x, keep], n.shape, "f32", {}, n.loc)
        elif how[0] == "pick":
            _, a, i, m = how
            a, i = remap[a], remap[i]
            if out[a].shape != m.shape:
                a = add("broadcast_to", [a], m.shape, "f32", {"shape": m.shape}, n.loc)
            p = add("pick_last", [a, i], m.shape[:-1], "f32", {}, n.loc)
            remap[n.id] = p if m.shape[:-1] == n.shape else \
                add("reshape", [p], n.shape, "f32", {"shape": n.shape}, n.loc)
        else:
            _, x, g_, eps = how
            remap[n.id] = add("layer_norm_grad", [remap[x], remap[g_]], n.shape, "f32",
                              {"eps": eps}, n.loc)
    for name in ("inputs", "params", "state", "outputs", "writebacks"):
        setattr(out, name, {k: remap[v] for k, v in getattr(g, name).items()})
    return dce(out)


__all__ = ["ROW_KERNEL_OPS", "ROW_PASS_OPS", "rewrite_rows"]
