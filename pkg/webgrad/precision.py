"""Precision modes: where a traced program rounds its values to f16, and loss scaling.

The IR computes in f32 and stores in f16 only where a `cast` to f16 says so (ir.py).
`apply_precision(graph, precision)` rebuilds a traced graph (forward and backward alike)
with those casts inserted, so every executor rounds at the same points: numpy rounds to
float16 there (primitives' `cast` rule), the torch executor holds torch.float16 tensors, a
WebGPU kernel stores f16. The modes:
  f32    nothing changes (the default; the graph is returned as it is)
  mixed  every matmul reads its operands as f16 and accumulates in f32, and its result is
         stored in f16 (as under torch.amp's fp16 autocast, where a matmul returns f16); the
         parameters (f32 master weights), the optimizer, reductions, norm and softmax
         statistics and the loss stay f32. A weight gradient over a batch, sum_b x_b^T g_b,
         is one product over all B x T rows, rounded once after the whole sum (torch.amp's
         single product; _batch_sums). Attention is written with matmuls, so its two
         products are rounded the same way and its softmax is not. A quantized weight
         (dequantize) keeps its exact decoded value: its matmul rounds only the other
         operand, so that WebGPU still decodes the blocks in the matmul's registers.
  f16    mixed's rule, and every other float value a node produces is rounded to f16 too
         (parameters and feeds as they are read, each op's result): a model run in
         half precision, as torch's .half() model, except that constants and the random
         numbers stay f32 and reductions accumulate in f32 before rounding.
`append_loss_scaling` adds torch.amp.GradScaler's dynamic loss scale to a training graph.
Consumers: the driver (compile.py) for compile_module / compile_forward, and tests.
"""
from __future__ import annotations

import math
from math import prod

from . import ops
from .ir import Graph, Node
from .optim import STATE_PREFIX
from .primitives import PRIMS, bind
from .tensor import Tensor, tracing

PRECISIONS = ("f32", "mixed", "f16")

# GradScaler's defaults: scale 2^16, halved by an overflowing step, doubled after 2000 good
SCALE_EXP = STATE_PREFIX + "amp/scale_exp"    # log2(scale) - 16: 0 in a fresh or reset state
GOOD_STEPS = STATE_PREFIX + "amp/good_steps"  # good steps since the scale last changed
INIT_EXP = 16
GROWTH_INTERVAL = 2000

_KEEP_F32 = ("const", "arange", "state", "rand_uniform")  # never rounded by precision="f16"


def check_precision(precision, what: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"{what}: precision must be one of {', '.join(map(repr, PRECISIONS))} "
                         f"(f32 the default, 'mixed' for training with f16 matmuls, 'f16' for "
                         f"inference in half precision), got {precision!r}")
    return precision


def _rounds(node, precision: str) -> bool:
    if node.op == "matmul":
        return True
    return precision == "f16" and node.dtype == "f32" and node.op not in _KEEP_F32


_LAYOUT = ("reshape", "transpose", "broadcast_to", "slice")


def _moves(n: Node) -> bool:
    """Whether op n moves values unchanged (its result is f16 where they are f16)."""
    return n.op in _LAYOUT or n.op == "write_rows"


def _moved(n: Node) -> tuple[int, ...]:
    """The inputs whose values op n moves: write_rows(cache, rows, pos) moves the rows
    (the cache, a state, holds the rows the programs wrote, rounded: not rounded again)."""
    return (n.inputs[1],) if n.op == "write_rows" else n.inputs[:1]


def _decoded(g: Graph, i: int) -> bool:
    """Whether node i is a quantized weight's decoded value (dequantize, through layout ops)."""
    while g[i].op in _LAYOUT:
        i = g[i].inputs[0]
    return g[i].op == "dequantize"


def _batch_sums(g: Graph) -> dict[int, int]:
    """{sum node: the batched matmul it sums over every batch axis}, where nothing else reads
    the product and neither operand is broadcast: a weight gradient, sum_b x_b^T g_b."""
    cons, roots = g.consumers(), set(g.outputs.values()) | set(g.writebacks.values())
    out = {}
    for n in g.nodes:
        if n.op != "sum" or g[n.inputs[0]].op != "matmul":
            continue
        mm = g[n.inputs[0]]
        nb = len(mm.shape) - 2
        if (nb and cons[mm.id] == [n.id] and mm.id not in roots
                and tuple(sorted(n.attrs["axes"])) == tuple(range(nb))
                and all(tuple(g[i].shape[:-2]) == tuple(mm.shape[:-2]) and not _decoded(g, i)
                        for i in mm.inputs)):
            out[n.id] = mm.id
    return out


def _swaps_last_two(n: Node) -> bool:   # a transpose of the last two axes (W^T, x^T)
    r = len(n.shape)
    return n.op == "transpose" and r >= 2 and tuple(n.attrs["perm"]) == (*range(r - 2), r - 1, r - 2)


def _viewed_transposes(g: Graph, mode: bool | str) -> set[int]:
    """The transposes of the last two axes whose f16 form apply_precision makes a view of
    their input's f16 form (transposed_views): "all" every one; "weights" those of
    parameters; False none; True those of activations where the view costs no memory the
    rounded copy would not: the backward's products read the value anyway (its f16 copy
    is held for them), or nothing else in the backward keeps it (neither its f32 value,
    read by softmax's backward from its probabilities, nor what it is an elementwise
    function of, GELU's pre-activation or a layer norm's normalised values: the copy
    recomputes those). The weights' f32 values are persistent: their copies stay."""
    if not mode:
        return set()
    if mode not in (True, "all", "weights"):
        raise ValueError(f"transposed_views must be False, True, 'all' or 'weights', got {mode!r}")
    swaps = [n for n in g.nodes if _swaps_last_two(n)]
    if mode == "all":
        return {n.id for n in swaps}
    if mode == "weights":
        return {n.id for n in swaps if g[n.inputs[0]].op == "param"}
    loss = g.outputs.get("loss")
    fwd = g.ancestors(loss) if loss is not None else set(n.id for n in g.nodes)
    cons = g.consumers()

    def kept(y: int) -> bool:   # read by the backward (other than as a view's x^T)
        return any(c not in fwd and not _swaps_last_two(g[c]) for c in cons[y])

    def recomputed(x: int) -> bool:  # elementwise, through layout ops, of values kept anyway
        stack, seen = [x], set()
        while stack:
            y = stack.pop()
            if y in seen:
                continue
            seen.add(y)
            if g[y].op in _LEAVES or (y != x and kept(y)):
                continue   # held for the step, or kept for the backward anyway
            if g[y].op not in _EXPRESSIONS:
                return False
            stack.extend(g[y].inputs)
        return True

    def viewed(x: int) -> bool:
        if g[x].op == "param":
            return False
        if any(c not in fwd and g[c].op == "matmul" for c in cons[x]):
            return True   # a backward product reads x: its f16 copy is held anyway
        return not kept(x) and not recomputed(x)
    return {n.id for n in swaps if n.id not in fwd and viewed(n.inputs[0])}


# values every step holds (feeds, parameters, state, constants), and the ops a copy can
# recompute from its inputs at the element it stores (primitives' families)
_LEAVES = frozenset(op for op, p in PRIMS.items() if p.family == "leaf")
_EXPRESSIONS = frozenset(op for op, p in PRIMS.items() if p.family in ("elementwise", "layout"))


def apply_precision(g: Graph, precision: str, *, transposed_views: bool | str = False
                    ) -> tuple[Graph, dict[int, int]]:
    """(the rebuilt graph, old node id -> the new id holding that value, as f32 where it was
    f32). precision="f32" returns g itself and the identity map. transposed_views: the f16
    form of a transpose of the last two axes is the transpose of the value's f16 form (a
    view of the copy the forward's product reads), and a weight gradient's x^T a view of
    x's f16 form, where without it each is a rounded copy of the transpose (a transposing
    copy kernel): for kernels that read an operand stored transposed
    (KernelOptions.mma_transposed). True: the backward's transposes of activations where
    the view holds no more than the copy would (_viewed_transposes); "all": every
    transpose; "weights": only transposes of parameters (W^T of an input gradient). The
    values are the same: rounding commutes with the transpose."""
    if precision == "f32":
        return g, {n.id: n.id for n in g.nodes}
    viewed = _viewed_transposes(g, transposed_views)
    new = Graph(seed=g.seed, training=g.training)
    val: dict[int, int] = {}   # old id -> new id of its value (in the old node's dtype)
    half: dict[int, int] = {}  # old id -> new id of its value stored as f16

    def as_f16(i: int) -> int:
        if i not in half:
            n = g[i]
            if n.dtype == "f16":
                half[i] = val[i]
            elif n.op == "cast" and g[n.inputs[0]].dtype == "f16":  # an f16 value widened
                half[i] = as_f16(n.inputs[0])
            elif n.dtype == "f32" and ((i in exact and n.op in _LAYOUT) or (
                    n.op in ("transpose", "reshape") and held_f16(n.inputs[0])) or i in viewed):
                # a view of rounded values (exact), or of a value already held in f16 (an
                # f16 weight's transpose in a tied LM head): the same view of the f16
                # values, not a rounded copy of the view
                half[i] = new.add(n.op, [as_f16(n.inputs[0])], n.shape, "f16", n.attrs, n.loc)
            else:  # exact: a cache row write of rounded rows, whose f16 form is its own
                # value (the cast only names the type: f16_in_f32 makes it a view)
                attrs = {"dtype": "f16", "exact": True} if i in exact else {"dtype": "f16"}
                half[i] = new.add("cast", [val[i]], n.shape, "f16", attrs, n.loc)
        return half[i]

    def held_f16(i: int) -> bool:  # an f16 value of the traced graph, widened or viewed
        n = g[i]
        return n.dtype == "f16" or (n.op == "cast" and g[n.inputs[0]].dtype == "f16") \
            or (n.op in ("transpose", "reshape") and held_f16(n.inputs[0]))

    def rounded_f32(i: int) -> int:  # the value rounded to f16, as an f32 node
        h = as_f16(i)
        return new.add("cast", [h], g[i].shape, "f32", {"dtype": "f32"}, g[i].loc)

    def folded(mm: Node) -> int:
        # sum_b A_b B_b as one product [M, nb*K] @ [nb*K, N]: B's rows are its f16 value's
        # (a view, shared with the input gradient's product), A's columns a rounded copy of
        # A laid out along them (for A = x^T, the transpose of x's rows: the tiled
        # transposing copy writes it). Rounded once, after the whole sum, as torch.amp's
        # single product over the batch is: not once per batch element and summed in f32,
        # which also held nb f16 products and ran a sum kernel of its own
        a, b = (g[i] for i in mm.inputs)
        M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
        r, rows = len(a.shape), prod(a.shape[:-1]) // M * K
        if _swaps_last_two(a):
            # x's rows, transposed: with transposed_views x's f16 rows read so (no copy)
            views = a.id in viewed and g[a.inputs[0]].op != "param"
            x = as_f16(a.inputs[0]) if views else val[a.inputs[0]]
            dt = "f16" if views else a.dtype
            xr = new.add("reshape", [x], (rows, M), dt, {"shape": (rows, M)}, a.loc)
            at = new.add("transpose", [xr], (M, rows), dt, {"perm": (1, 0)}, a.loc)
        else:
            perm = (r - 2, *range(r - 2), r - 1)
            tp = new.add("transpose", [val[a.id]], tuple(a.shape[k] for k in perm), a.dtype,
                         {"perm": perm}, a.loc)
            at = new.add("reshape", [tp], (M, rows), a.dtype, {"shape": (M, rows)}, a.loc)
        a16 = at if new[at].dtype == "f16" else new.add("cast", [at], (M, rows), "f16",
                                                          {"dtype": "f16"}, a.loc)
        b16 = new.add("reshape", [as_f16(b.id)], (rows, N), "f16", {"shape": (rows, N)}, b.loc)
        return new.add("matmul", [a16, b16], (M, N), mm.dtype, mm.attrs, mm.loc)

    exact: set[int] = set()  # old ids whose f32 value (val) is an f16 value
    sums = _batch_sums(g)
    summed = set(sums.values())
    for n in g.nodes:
        if n.id in summed:   # computed by its sum (folded)
            continue
        if n.id in sums:
            nid = folded(g[sums[n.id]])
            half[n.id] = new.add("cast", [nid], n.shape, "f16", {"dtype": "f16"}, n.loc)
            val[n.id] = new.add("cast", [half[n.id]], n.shape, "f32", {"dtype": "f32"}, n.loc)
            continue
        ins = [val[i] for i in n.inputs]
        if n.op == "matmul":
            quant = [_decoded(g, i) for i in n.inputs]
            if any(quant):  # a quantized weight stays its exact decoded f32 value, decoded in
                # the matmul's registers (codegen/quant.py); the other operand is rounded
                ins = [val[i] if q else rounded_f32(i) for i, q in zip(n.inputs, quant)]
            else:
                ins = [as_f16(i) for i in n.inputs]
        nid = new.add(n.op, ins, n.shape, n.dtype, n.attrs, n.loc)
        if _rounds(n, precision) and _moves(n) and all(i in exact for i in _moved(n)):
            # a layout op (or a cache row write) of values already rounded holds f16 values:
            # its rounding is the identity, so none is inserted (the same values, fewer nodes
            # for the kernels to fuse through); its f16 form is the same op of the f16 values
            exact.add(n.id)
        elif _rounds(n, precision) and held_f16(n.id):
            # an f16 value widened or viewed (an f16 weight, its transpose): already f16,
            # so its rounding is itself (the f16 value, or the same view of it)
            half[n.id] = as_f16(n.id)
        elif _rounds(n, precision):
            half[n.id] = new.add("cast", [nid], n.shape, "f16", {"dtype": "f16"}, n.loc)
            nid = new.add("cast", [half[n.id]], n.shape, "f32", {"dtype": "f32"}, n.loc)
            exact.add(n.id)
        if n.id in exact or held_f16(n.id):
            exact.add(n.id)
        val[n.id] = nid
    new.outputs = {k: val[i] for k, i in g.outputs.items()}
    new.writebacks = {k: val[i] for k, i in g.writebacks.items()}
    return new, val


def _state(g: Graph, name: str) -> Tensor:
    if name in g.state:
        return Tensor(g, g.state[name])
    return bind("state", name=name, shape=(), dtype="f32")


def loss_scale(g: Graph) -> Tensor:
    """The step's loss scale, 2^(16 + SCALE_EXP), read from the persistent state (call
    inside tracing(g)). A power of two, so scaling and unscaling are exact."""
    exp = _state(g, SCALE_EXP)
    return ops.pow(2.0, exp + float(INIT_EXP))


# gradients a finiteness check reads in one reduction: with the output and a split
# reduction's partials, 4 buffers stay within the 8 bindings WebGPU guarantees a kernel
CHECK_GROUP = 4
_F32_MAX = 3.4028234663852886e38


def unscale(grads: dict[int, Tensor], scale: Tensor) -> tuple[dict[int, Tensor], Tensor]:
    """(gradients divided by the scale, ok): ok is 1.0 when every gradient is finite.
    The test is m = max |g| over all of them (max propagates NaN) and ok = (sign(m - F32_MAX)
    == -1): -1 for a finite m, 1 for inf, 0 for NaN (sign's NaN rule). On WebGPU both read
    the bits (isnan_f), so a shader compiler that assumes no NaN or inf cannot fold the test
    away, as lavapipe's folds g * 0 to 0 (the sum of g * 0 this replaced let NaN gradients
    through there). The max is taken CHECK_GROUP gradients at a time, flattened and
    concatenated (a concat of expressions is read by the reduction's kernel itself): on
    WebGPU one reduction per group, not one per gradient (in GPT-2 124M: 410 kernels)."""
    inv = 1.0 / scale
    out = {i: gr * inv for i, gr in grads.items()}
    # the last parameters' gradients come first in the backward: grouped in that order, a
    # group's gradients are produced close together, and its check runs soon after
    flat = [ops.reshape(gr, (gr.node.size,)) for gr in reversed(out.values())]
    top = None
    for k in range(0, len(flat), CHECK_GROUP):
        m = ops.max(ops.abs(ops.concat(flat[k:k + CHECK_GROUP], axis=0)))
        top = m if top is None else ops.maximum(top, m)
    if top is None:
        return out, ops.constant(1.0)
    return out, ops.equal(ops.sign(top - _F32_MAX), -1.0)


def append_loss_scaling(g: Graph, ok: Tensor, trainable: list[str]) -> None:
    """GradScaler's update, appended to a training graph whose optimizer has already set its
    writebacks (call inside tracing(g)): a step with a non-finite gradient (ok = 0) keeps the
    parameters, the optimizer state and the step counter, and halves the scale; the 2000th
    good step in a row doubles it. Outputs: amp/skipped (1.0 for a skipped step) and
    amp/scale (the scale the next step uses)."""
    # every kept writeback reads the flag through the stored output amp/skipped: one
    # buffer a kernel (ok itself is an expression of the check's last two maxima: two, and
    # AdamW's p' then needed one binding more than the 8 WebGPU guarantees)
    skipped = 1.0 - ok
    g.outputs["amp/skipped"] = skipped.id
    ok = ops.equal(skipped, 0.0)
    keep = set(trainable) | {"step"}
    kept = {}  # a new value -> where(ok, it, the old value)
    for name, i in list(g.writebacks.items()):
        if name in keep or (name.startswith(STATE_PREFIX) and name not in (SCALE_EXP, GOOD_STEPS)):
            old = g.params.get(name, g.state.get(name))
            if old is not None and i not in kept:
                kept[i] = ops.where(ok, Tensor(g, i), Tensor(g, old)).id
    # a new value that reads another's (AdamW's p' reads m' and v') reads its kept form: the
    # same value where ok = 1, and where ok = 0 its own where keeps the old value anyway. So
    # m' and v' each have one reader, their where, and are not stored for p' to reread:
    # on WebGPU a parameter's whole update is one kernel (codegen/fusion_groups.py)
    redo: dict[int, int] = {}

    def rebuilt(n: int) -> int:
        if n in kept:
            return kept[n]
        if n not in redo:
            node = g[n]
            ins = [rebuilt(i) for i in node.inputs]
            redo[n] = n if ins == list(node.inputs) else g.add(
                node.op, ins, node.shape, node.dtype, dict(node.attrs), node.loc)
        return redo[n]

    # nodes traced before the first new value cannot read one: never rebuilt
    redo.update({j: j for j in range(min(kept, default=0))})
    for name, i in list(g.writebacks.items()):
        if i in kept:
            node = g[i]
            ins = [rebuilt(j) for j in node.inputs]
            if ins != list(node.inputs):
                i2 = g.add(node.op, ins, node.shape, node.dtype, dict(node.attrs), node.loc)
                old = g.params.get(name, g.state.get(name))
                g.writebacks[name] = ops.where(ok, Tensor(g, i2), Tensor(g, old)).id
            else:
                g.writebacks[name] = kept[i]
    exp = Tensor(g, g.state[SCALE_EXP])
    good = _state(g, GOOD_STEPS)
    grow = ops.greater_equal(good + 1.0, float(GROWTH_INTERVAL))
    new_exp = ops.where(ok, exp + grow, exp - 1.0)
    g.writebacks[SCALE_EXP] = new_exp.id
    g.writebacks[GOOD_STEPS] = ops.where(ok, (good + 1.0) * (1.0 - grow), 0.0).id
    g.outputs["amp/scale"] = ops.pow(2.0, new_exp + float(INIT_EXP)).id


def f16_in_f32(g: Graph) -> Graph:
    """The same program with its f16 values held in f32: every f16 node becomes an f32 one
    and each cast to f16 an f32 node whose value is the rounded one (attrs dtype "f16" kept,
    so a lowering rounds there: WGSL's f32(f16(x))). The values are those of the f16
    program bit for bit (an f16 value is exact in f32, and an f16 x f16 matmul accumulates
    in f32 anyway); the memory and bandwidth are f32's. WebGPU runs precision="mixed"/"f16"
    programs this way until its kernels read and write f16 storage."""
    if not any(n.dtype == "f16" for n in g.nodes):
        return g
    new = Graph(seed=g.seed, training=g.training)
    for n in g.nodes:
        if n.op == "cast" and n.attrs.get("exact"):  # f16 values typed f16: a view in f32
            nid = new.add("reshape", n.inputs, n.shape, "f32", {"shape": n.shape}, n.loc)
        else:
            nid = new.add(n.op, n.inputs, n.shape, "f32" if n.dtype == "f16" else n.dtype,
                          n.attrs, n.loc)
        assert nid == n.id
    new.outputs, new.writebacks = dict(g.outputs), dict(g.writebacks)
    return new


def round_f16_bytes(data: bytes) -> bytes:
    """Little-endian f32 values rounded to f16 (nearest even, inf past 65504 + half an ulp),
    as f32 bytes again: how an f16 parameter held in an f32 buffer is written."""
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        with np.errstate(over="ignore"):
            return np.frombuffer(data, "<f4").astype("<f2").astype("<f4").tobytes()
    import struct
    n = len(data) // 4
    out = []
    for v in struct.unpack(f"<{n}f", data):
        try:
            out.append(struct.unpack("<e", struct.pack("<e", v))[0])
        except OverflowError:  # struct refuses what rounds past f16's largest finite value
            out.append(math.copysign(math.inf, v))
    return struct.pack(f"<{n}f", *out)


def f16_bytes(data: bytes) -> bytes:
    """Little-endian f32 values as little-endian f16 bytes (nearest even, inf past 65504 +
    half an ulp): how an f16 parameter held in an f16 buffer is written."""
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        with np.errstate(over="ignore"):
            return np.frombuffer(data, "<f4").astype("<f2").tobytes()
    import struct
    n = len(data) // 4
    vals = struct.unpack(f"<{n}f", round_f16_bytes(data))  # rounded: exact in f16
    return struct.pack(f"<{n}e", *vals)


def f32_from_f16_bytes(data: bytes) -> bytes:
    """Little-endian f16 values widened (exactly) to little-endian f32 bytes."""
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        return np.frombuffer(data, "<f2").astype("<f4").tobytes()
    import struct
    n = len(data) // 2
    return struct.pack(f"<{n}f", *struct.unpack(f"<{n}e", data))


def half_feature_error(graph: Graph, features, adapter: str) -> str | None:
    """The error for a program holding f16 values on an adapter without shader-f16 (None
    when the program has none, or the adapter has the feature)."""
    if "shader-f16" in (features or ()) or not any(n.dtype == "f16" for n in graph.nodes):
        return None
    return (f"this program stores f16 values (compiled with precision='mixed' or 'f16', or an "
            f"ops.cast(x, 'f16')), and the WebGPU adapter {adapter} does not offer the "
            f"'shader-f16' feature it needs; compile with precision='f32' (the default), use "
            f"an adapter with shader-f16 (Chrome on most GPUs, Safari 26; Dawn on NVIDIA needs "
            f"its vulkan_enable_f16_on_nvidia toggle), or ask for the same rounding without "
            f"f16 types: kernel_options=codegen.KernelOptions(f16_emulation=True)")
