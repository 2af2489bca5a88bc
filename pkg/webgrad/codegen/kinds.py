"""What codegen knows of each IR op, read from the registry: no op list here is written by hand.

Every primitive's row in primitives.PRIMS carries its `lowering` (an expression fused into
its readers, a leaf buffer, or the kind of kernel of its own that stores it) and its `cost`
(FLOP rule, fusion's recompute weight, view, narrows). The ops codegen's own pattern passes
create carry the same two facts in their pass's table (attention_match.ATTN_PASS_OPS,
rowfuse_match.ROW_PASS_OPS). Fusion, the reduction builder and the cost model test against
the sets below; program.py's KERNELS maps each kernel kind to its builder.
tests/test_registry.py checks that every op has a cost and a lowering that exists.
"""
from __future__ import annotations

from ..primitives import EXPR, LEAF, PRIMS, Cost
from .attention_match import ATTN_PASS_OPS
from .rowfuse_match import ROW_PASS_OPS

# op -> (lowering, cost) for the ops that exist only inside codegen (after its pattern passes)
CODEGEN_OPS: dict[str, tuple[str, Cost]] = {**ATTN_PASS_OPS, **ROW_PASS_OPS}


def lowering_of(op: str) -> str:
    """The op's lowering: "expr", "leaf" or its kernel kind (a key of program.KERNELS)."""
    p = PRIMS.get(op)
    if p is not None:
        return p.lowering
    return CODEGEN_OPS[op][0]


def cost_of(op: str) -> Cost:
    """The op's Cost; an op without one is refused here (never counted as 1 FLOP an element)."""
    p = PRIMS.get(op)
    cost = p.cost if p is not None else CODEGEN_OPS.get(op, (None, None))[1]
    if not isinstance(cost, Cost):
        raise ValueError(f"op {op!r} has no cost rule: give its defprim a cost= (primitives/ "
                         "header, item 5) or its pattern pass's table a Cost")
    return cost


def _ops(keep) -> frozenset[str]:
    """The ops whose row passes keep(lowering, cost, prim); prim is None for CODEGEN_OPS.
    A row without a cost reads as a non-view here (tests/test_registry.py names it)."""
    rows = [(op, p.lowering, p.cost, p) for op, p in PRIMS.items()]
    rows += [(op, low, cost, None) for op, (low, cost) in CODEGEN_OPS.items()]
    return frozenset(op for op, low, cost, p in rows if keep(low, cost, p))


# kernel ops: each computes and stores its output in a kernel of its own (fusion rule 1)
KERNEL_OPS = _ops(lambda low, cost, p: low not in (EXPR, LEAF))
# stored by the executor (inputs, params, state)
LEAF_OPS = _ops(lambda low, cost, p: low == LEAF)
# index remaps of one input (strided views for matmul operands)
VIEW_OPS = _ops(lambda low, cost, p: getattr(cost, "view", False))
# elementwise primitives: every input read at the output's (broadcast) index
ELEMENTWISE_OPS = _ops(lambda low, cost, p: p is not None and p.family == "elementwise")
# the reductions and row ops reduce.py builds
REDUCE_OPS = _ops(lambda low, cost, p: low == "reduce")
ROW_OPS = _ops(lambda low, cost, p: low == "row")

__all__ = ["CODEGEN_OPS", "ELEMENTWISE_OPS", "KERNEL_OPS", "LEAF_OPS", "REDUCE_OPS", "ROW_OPS",
           "VIEW_OPS", "cost_of", "lowering_of"]
