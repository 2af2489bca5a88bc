"""The attention pass: find `softmax(mask(scale * q @ k^T)) @ v` and its autograd, and
rewrite them into fused attention kernels (codegen/attention.py), so that the [.., T, S]
scores and probabilities are never stored.

A WebGPU lowering only: `program.lower` runs `rewrite_attention(graph, limits)` before
fusion; the reference and torch executors keep interpreting the plain IR, and the kernels
compute the same mathematics (up to f32 rounding).

What is matched, and how the mask is read, is codegen/attention_pattern.py's (find_matches):
the scores S = matmul(A, B) of q = A [.., T, D] and k^T = B [.., D, S], a chain of scale and
mask ops, P = softmax_last, O = matmul(P, V), and grad.py's rules for exactly those ops
(gV, gA, gB from the gradient G of O).
Rewrite (lse: the row log-sum-exp of the masked, scaled scores):
  O = attn_out(A, B, V)                  when nothing differentiates O (inference), else
  lse = attn_lse(A, B); O = attn_out(A, B, V, lse)
  gV = attn_dv(A, B, G, lse); Drow = sum_last(G * O)  (= sum_last(gP * P), plain IR)
  gA = attn_dq(A, B, V, G, lse, Drow); gB = transpose(attn_dk(A, B, V, G, lse, Drow))
On GPUs (the tiled kernels, attention_tiled.py) each side is one pass, as in
flash-attention 2: the forward OL = attn_fwd(A, B, V) [.., T, Dv + 1] (online softmax; each
row O_i then lse_i), O = slice(OL, 0, Dv), lse = reshape(slice(OL, Dv, Dv + 1)); and dK, dV
from one pass over each key block: dKV = attn_dkv(A, B, V, G, lse, Drow) [.., S, D + Dv],
each row dK_j then dV_j, gB = transpose(slice(dKV, 0, D)), gV = slice(dKV, D, D + Dv)
(views: nothing is copied).
A match is all-or-nothing: when anything else still reads the scores or probabilities
after the rewrite (a capture, a gradient path not recognised), the graph keeps its
unfused form.
"""
from __future__ import annotations

from math import prod

from ..dce import dce
from ..ir import Graph, Node
from ..primitives import Cost
from .attention_pattern import Match, find_matches

ATTN_OPS = frozenset({"attn_lse", "attn_out", "attn_fwd", "attn_dq", "attn_dk", "attn_dv",
                      "attn_dkv"})


def attention_flops(ins: list[Node], node: Node) -> int:
    """2 x the kept (query, key) pairs x the summed widths of the kernel's products (the
    profiler's model: attn_out computes q.k and p v, attn_dq q.k, g.v and ds k, ...);
    a FLOP rule of primitives.Cost, over the input nodes `ins`."""
    T, D, S = ins[0].shape[-2], ins[0].shape[-1], ins[1].shape[-1]
    off = node.attrs["offset"]
    batch = node.shape[:-1] if node.op == "attn_lse" else node.shape[:-2]
    pairs = T * S if off is None or node.attrs.get("dyn") else \
        sum(min(S, i + off + 1) for i in range(T))
    dv = ins[2].shape[-1] if node.op != "attn_lse" else 0
    width = {"attn_lse": D, "attn_out": D + dv, "attn_fwd": D + dv, "attn_dv": D + dv,
             "attn_dq": 2 * D + dv, "attn_dk": 2 * D + dv, "attn_dkv": 2 * D + 2 * dv}[node.op]
    return 2 * prod(batch) * pairs * width


# the ops this pass creates, as primitives' rows give them: (lowering, cost); codegen/kinds.py
# reads them beside primitives.PRIMS
ATTN_PASS_OPS = {op: ("attention", Cost(attention_flops)) for op in ATTN_OPS}


def _fuse_training(score_bytes: int, limits) -> bool:
    """Whether a training step's attention (forward and backward) is fused on this adapter:
    everywhere now. With the row kernels a GPU lost (the GPT-2 step ran 4.8x torch's time
    fused against 1.3x unfused on the H200), so GPUs fused only scores too large to bind.
    The tiled kernels (attention_tiled.py) made the fused step as fast as the unfused one
    there (GPT-2 8 x 512: 124.0 ms against 124.2; 64 x 256: the same GPU time) while its
    peak memory fell by the stored scores and probabilities (9226 -> 7151 MiB, 0.92x
    torch's; bench/README.md, gpt2_train.py --attention forced,unfused), so every adapter
    fuses. Kept as the one place a future adapter class would opt out
    (KernelOptions.fuse_attention overrides it: the benches compare with it)."""
    return True


def _unfused_mixed(limits) -> bool:
    """Whether a precision="mixed" training step's attention stays unfused (its scores and
    probabilities stored in f16): KernelOptions.attn_mixed None on a GPU, where the unfused
    products run on the tensor cores at full rate; the fused kernels there, on subgroup
    matrices too (attention_mma.py), measured slower (options.py gives the H200's
    figures). True fuses it there too, False nowhere (the matcher's own rule)."""
    return limits.options.attn_mixed is None and not limits.cpu


def rewrite_attention(g: Graph, limits=None) -> Graph:
    """The graph with every matched attention fused (the same graph when none is).
    KernelOptions.fuse_attention: False fuses none, True every match (training steps too,
    whatever _fuse_training says), None follows the policy."""
    fuse = None if limits is None else limits.options.fuse_attention
    if fuse is False:
        return g
    matches = find_matches(g, limits)
    if limits is not None:
        # attn_dq/attn_dk bind A, B, V, G, lse, Drow and their output
        budget = limits.max_storage_buffers_per_shader_stage
        matches = [m for m in matches
                   if budget >= (7 if m.g is not None else 5) + (m.dyn is not None)
                   and (m.g is None or fuse or _fuse_training(4 * g[m.s].size, limits))
                   and not (m.mixed and m.g is not None and _unfused_mixed(limits))]
    from .attention_tiled import use_tiled
    merge = limits is not None and use_tiled(limits)
    while matches:
        out, remap = _rebuild(g, matches, merge)
        live = _live(out)
        bad = [m for m in matches if any(remap[i] in live for i in m.inner + m.casts)]
        if not bad:
            return dce(out)
        matches = [m for m in matches if m not in bad]
    return g


def _rebuild(g: Graph, matches: list[Match], merge: bool = False):
    """The graph with `matches` rewritten (merge: the GPU's one-pass forms, attn_fwd and
    attn_dkv), and the map from old node ids to new ones."""
    out = Graph(seed=g.seed, training=g.training)
    remap: dict[int, int] = {}
    at: dict[int, tuple] = {}
    for m in matches:
        at[m.o] = ("o", m)
        if m.g is not None:
            at[m.gv] = ("gv", m)
            if m.ga is not None:
                at[m.ga] = ("ga", m)
            if m.gb is not None:
                at[m.gb] = ("gb", m)
    made: dict[tuple[int, str], int] = {}

    def add(op, ins, shape, attrs, loc) -> int:
        i = len(out.nodes)
        out.nodes.append(Node(i, op, tuple(ins), tuple(shape), "f32", dict(attrs), loc))
        return i

    for n in g.nodes:
        hit = at.get(n.id)
        if hit is None:
            i = len(out.nodes)
            out.nodes.append(Node(i, n.op, tuple(remap[x] for x in n.inputs), n.shape, n.dtype,
                                  n.attrs, n.loc))
            remap[n.id] = i
            continue
        what, m = hit
        A, B, V = remap[m.a], remap[m.b], remap[m.v]
        batch = tuple(g[m.p].shape[:-2])
        T, S = g[m.p].shape[-2:]
        D = g[m.a].shape[-1]
        attrs = {"scale": m.scale, "offset": m.offset, "dyn": m.dyn is not None}
        if m.mixed:  # round as precision="mixed" / "f16" does (attention.py's header)
            attrs["mixed"] = True
            if m.round_x:
                attrs["round_x"] = True
        pos = [remap[m.dyn]] if m.dyn is not None else []  # the runtime offset, last input
        if what == "o":
            if m.g is None and not m.mixed:  # no backward: one kernel, softmax online
                remap[n.id] = add("attn_out", [A, B, V] + pos, n.shape, dict(attrs, online=True),
                                  n.loc)
                continue
            if merge and not m.mixed:  # O and lse from one kernel: a row [O_i | lse_i]
                # (mixed rounds the normalized probabilities, which the online softmax
                # of attn_fwd never forms: lse first, then O)
                Dv = n.shape[-1]
                both = add("attn_fwd", [A, B, V] + pos, batch + (T, Dv + 1), attrs, n.loc)
                r = len(batch) + 2
                remap[n.id] = add("slice", [both], n.shape,
                                  {"axis": r - 1, "start": 0, "stop": Dv}, n.loc)
                col = add("slice", [both], batch + (T, 1),
                          {"axis": r - 1, "start": Dv, "stop": Dv + 1}, n.loc)
                made[(m.o, "lse")] = add("reshape", [col], batch + (T,), {"shape": batch + (T,)},
                                         n.loc)
                continue
            lse = add("attn_lse", [A, B] + pos, batch + (T,), attrs, n.loc)
            made[(m.o, "lse")] = lse
            remap[n.id] = add("attn_out", [A, B, V, lse] + pos, n.shape, attrs, n.loc)
            continue
        lse, G = made[(m.o, "lse")], remap[m.g]
        dkv = merge and m.gb is not None  # dK and dV from one kernel
        if what == "gv" and not dkv:
            remap[n.id] = add("attn_dv", [A, B, G, lse] + pos, n.shape, attrs, n.loc)
            continue
        drow = made.get((m.o, "drow"))
        if drow is None:  # sum_last(G * O): the softmax gradient's row term
            # (mixed: G is the f16-rounded gradient and O the kernel's f32 output, from the
            # rounded probabilities; the program's sum_j p_ij f16(dP_ij) differs from it by
            # dP's rounding, and so dQ and dK by about one f16 ulp of their largest value:
            # FA-2's D = rowsum(dO * O), tests/test_precision.py states the tolerance)
            prod_ = add("mul", [G, remap[m.o]], g[m.o].shape, {}, n.loc)
            drow = made[(m.o, "drow")] = add("sum", [prod_], batch + (T,),
                                             {"axes": (len(batch) + 1,)}, n.loc)
        ins = [A, B, V, G, lse, drow] + pos
        r = len(batch) + 2
        swap = {"perm": tuple(range(r - 2)) + (r - 1, r - 2)}
        if what == "ga":
            remap[n.id] = add("attn_dq", ins, n.shape, attrs, n.loc)
        elif dkv:
            Dv = g[m.v].shape[-1]
            both = made.get((m.o, "dkv"))
            if both is None:
                both = made[(m.o, "dkv")] = add("attn_dkv", ins, batch + (S, D + Dv), attrs,
                                                n.loc)
            if what == "gv":
                remap[n.id] = add("slice", [both], n.shape,
                                  {"axis": r - 1, "start": D, "stop": D + Dv}, n.loc)
            else:
                dk = add("slice", [both], batch + (S, D), {"axis": r - 1, "start": 0, "stop": D},
                         n.loc)
                remap[n.id] = add("transpose", [dk], n.shape, swap, n.loc)
        else:
            dk = add("attn_dk", ins, batch + (S, D), attrs, n.loc)
            remap[n.id] = add("transpose", [dk], n.shape, swap, n.loc)
    for name in ("inputs", "params", "state", "outputs", "writebacks"):
        setattr(out, name, {k: remap[v] for k, v in getattr(g, name).items()})
    return out, remap


def _live(g: Graph) -> set[int]:
    live = set(g.roots())
    for n in reversed(g.nodes):
        if n.id in live:
            live.update(n.inputs)
    return live


__all__ = ["ATTN_OPS", "ATTN_PASS_OPS", "Match", "find_matches", "rewrite_attention"]
