"""Index primitives: one_hot, gather_rows, scatter_add_rows and write_rows.

gather_rows and one_hot are expressions (codegen/index.py); scatter_add_rows and write_rows
are kernels of their own ("scatter", "write_rows"). The reference rules state what every
executor does with an index outside the table (bounds.py refuses fed ones before a step).
"""
from __future__ import annotations

from .registry import ELEMENT, F16_MATH, Cost, ShapeError, defprim, ops_module as _O, per_element


def _one_hot_shape(ins, attrs):
    if ins[0].dtype != "i32":
        raise ShapeError("indices must be i32")
    return ins[0].shape + (attrs["n"],), "f32"


defprim("one_hot", "index", shape=_one_hot_shape, grad=None, cost=ELEMENT,
        ref=lambda np, a, i: (i[..., None] == np.arange(a["n"])).astype("float32"))


def _gather_shape(ins, attrs):
    w, idx = ins
    if idx.dtype != "i32":
        raise ShapeError("indices must be i32")
    if not w.shape:
        raise ShapeError("the table needs at least one axis")
    return idx.shape + w.shape[1:], w.dtype


def _gather_ref(np, a, w, i):
    # rows outside [0, n) read as zeros and negative indices never wrap (bounds.py: fed
    # indices are refused before a step; this is the rule for computed ones)
    ok = (i >= 0) & (i < w.shape[0])
    rows = w[np.where(ok, i, 0)]
    return np.where(ok.reshape(ok.shape + (1,) * (w.ndim - 1)), rows, np.zeros_like(rows))


defprim("gather_rows", "index", shape=_gather_shape, ref=_gather_ref,
        cost=Cost(per_element, narrows=True),
        grad=lambda g, i, o, a: [_O().scatter_add_rows(g, i[1], i[0].shape[0]), None],
        doc="rows of a table by index (embedding); primitive because one_hot @ W costs "
            "V times more work and memory")


def _scatter_shape(ins, attrs):
    g, idx = ins
    if idx.dtype != "i32":
        raise ShapeError("indices must be i32")
    if g.shape[:len(idx.shape)] != idx.shape:
        raise ShapeError("values must start with the indices' shape")
    if g.dtype == "f16":
        raise ShapeError(F16_MATH)
    return (attrs["n"],) + g.shape[len(idx.shape):], g.dtype


def _scatter_ref(np, a, g, i):
    rest = g.shape[i.ndim:]
    out = np.zeros((a["n"],) + rest, g.dtype)
    flat = i.reshape(-1)
    ok = (flat >= 0) & (flat < a["n"])  # out-of-range rows are dropped (gather reads zeros)
    np.add.at(out, flat[ok], g.reshape((-1,) + rest)[ok])
    return out


# its FLOPs: one per element of the table it writes (per_element), not per row added
defprim("scatter_add_rows", "index", shape=_scatter_shape, ref=_scatter_ref, cost=ELEMENT,
        lowering="scatter",
        grad=lambda g, i, o, a: [_O().gather_rows(g, i[1]), None],
        doc="the adjoint of gather_rows: rows summed into a zero table")


def _write_rows_shape(ins, attrs):
    base, vals, start = ins
    if not base.shape:
        raise ShapeError("the target needs at least one axis (its rows)")
    if vals.shape[1:] != base.shape[1:] or len(vals.shape) != len(base.shape):
        raise ShapeError(f"values {list(vals.shape)} must be rows of the target {list(base.shape)} "
                         f"(shape [T, {', '.join(map(str, base.shape[1:]))}])")
    if vals.dtype != base.dtype:
        raise ShapeError(f"values are {vals.dtype}, the target {base.dtype}")
    if start.dtype != "i32" or start.size != 1:
        raise ShapeError(f"start must be one i32 (shape [] or [1]), got {start.type_str}")
    return base.shape, base.dtype


def _write_rows_ref(np, a, base, vals, start):
    out = base.copy()
    s, n = int(start.reshape(-1)[0]), base.shape[0]
    lo, hi = max(s, 0), min(s + vals.shape[0], n)  # rows that land outside the target are dropped
    if lo < hi:
        out[lo:hi] = vals[lo - s:hi - s]
    return out


def _write_rows_grad(g, i, o, a):
    # out[r] = values[r - s] where 0 <= r - s < T, else base[r]:
    #   d base = g off the written rows,  d values[t] = g[s + t] (0 where s + t is outside)
    O = _O()
    base, vals, start = i
    n, t = base.shape[0], vals.shape[0]
    s = O.reshape(start, (1,))
    rows = O.arange(n) - s
    written = O.cast(O.greater_equal(rows, 0), "f32") * O.less(rows, t)
    keep = O.reshape(1.0 - written, (n,) + (1,) * (len(base.shape) - 1))
    dst = O.arange(t) + s
    inside = O.greater_equal(dst, 0) * O.less(dst, n)
    rows_of_g = O.gather_rows(g, O.minimum(O.maximum(dst, 0), n - 1))
    return [g * keep, rows_of_g * O.reshape(inside, (t,) + (1,) * (len(base.shape) - 1)), None]


defprim("write_rows", "index", shape=_write_rows_shape, ref=_write_rows_ref, grad=_write_rows_grad,
        cost=ELEMENT, lowering="write_rows",
        doc="rows start..start+T-1 of a target replaced by values (start a run-time i32; rows "
            "outside the target dropped). A primitive, not where(mask, gather(values), base), "
            "because assigned back to its own state (stateful.py) the WebGPU kernel writes only "
            "the T rows in place: a KV cache step touches T rows, not the whole cache")
