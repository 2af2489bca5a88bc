"""The primitive registry: every IR op defined once, with all of its rules side by side.

The package is the registry's machinery (registry.py: Prim, Cost, PRIMS, defprim, bind) and
one module per op family, each a list of `defprim` rows: elementwise.py, leaves.py,
reduce.py, layout.py, matmul.py (with dequantize), index.py, random.py, conv.py. Importing
the package registers every row, in that order; `webgrad.primitives` keeps every public name
(ops.py, grad.py, the backends and codegen import from it).

Adding a primitive is one `defprim(...)` in its family's module, with
  1. shape     `shape(ins: list[Node], attrs) -> (shape, dtype)`, raising ShapeError;
  2. grad      `grad(g, ins: list[Tensor], out: Tensor, attrs) -> [Tensor | None]`, written
               with webgrad.ops (so backward is traced into the same IR); the engine in
               grad.py sums a gradient down to its input's shape, so rules for broadcasting
               ops may return the broadcast shape. `grad=None` marks an op as not
               differentiable (comparisons, indices, random numbers; tests/test_registry.py's
               NONDIFF must list it);
  3. ref       `ref(np, attrs, *arrays)` in numpy: the executable specification that every
               other executor is judged against;
  4. lowering  where WebGPU computes it: "expr" (the default: an expression evaluated inside
               whichever kernel reads it, fused), "leaf" (a buffer the executor fills), or
               the kind of kernel of its own that stores it ("matmul", "reduce", "row",
               "scatter", "fold", "write_rows", or a new kind);
  5. cost      a Cost (below): its FLOPs (codegen/cost.py's model, the profiler's columns),
               fusion's weight for recomputing it in a reader, whether it is a view and
               whether it reads only the input elements it selects. Pick one of the
               constants (ELEMENT, COSTLY, FREE, VIEW, SELECT, REDUCE, ROW, MATMUL) or write
               a Cost; there is no default count;
and, outside this package:
  6. ops.py: the public function that binds it (and a docstring);
  7. backends/torch_backend.py: its torch lowering in TORCH_IMPLS;
  8. onnx/lower.py: its ONNX lowering in LOWERINGS;
  9. codegen/: for "expr", an expression rule (`@rule("name")`, codegen/emit.py's
     EXPR_RULES) in the file of its family (elementwise.py, layout.py, index.py, conv.py,
     ...); for a kernel of an existing kind, its case in that kind's builder (reduce.py
     builds "reduce" and "row"); for a new kind, a builder in codegen/program.py's KERNELS
     (and its scratch buffers in SCRATCH, if any), in a file of its own. Codegen's op sets
     (fusion's kernel ops, views, recompute weights; reduce.py's ops) and the profiler's
     FLOPs and bytes are read from items 4 and 5 (codegen/kinds.py): no list names the op.
     (Codegen reads this registry; this package never imports codegen.);
 10. tests/oracle.py: a record exercising it (run by tests/test_ops.py on every executor).
tests/test_registry.py fails, naming the op and the missing piece, while any of these is
missing (`registry_problems()` is the checklist as code; test_oracle_exercises_every_primitive
checks item 10). A builder of an existing kind that lacks the op's case fails in the oracle
run on WebGPU (tests/test_webgpu.py, tests/test_ops.py).

Everything else in webgrad.ops (gelu, silu, softmax_causal_last, conv2d, cross entropy, ...)
is a composition of these; a new primitive earns its place only when a composition is slow
or numerically poor (the reason is noted beside it).
"""
from __future__ import annotations

# the families in the order their rows were always registered (PRIMS keeps it)
from . import elementwise, leaves, reduce, layout, matmul, index, random, conv  # noqa: F401
from .conv import Window, conv_out_size, window, window_rows
from .elementwise import NUMPY_DTYPES
from .random import M32, lowbias32, rand_bits, rand_key
from .registry import (COSTLY, ELEMENT, EXPR, F16_MATH, FREE, LEAF, MATMUL, PRIMS, REDUCE,
                       ROW, ROW_FLOPS, SELECT, VIEW, Cost, Prim, ShapeError, bind,
                       broadcast_shapes, defprim, matmul_flops, no_flops, per_element,
                       per_input_element, per_row_element)

__all__ = ["COSTLY", "ELEMENT", "EXPR", "F16_MATH", "FREE", "LEAF", "M32", "MATMUL",
           "NUMPY_DTYPES", "PRIMS", "REDUCE", "ROW", "ROW_FLOPS", "SELECT", "VIEW", "Cost",
           "Prim", "ShapeError", "Window", "bind", "broadcast_shapes", "conv_out_size",
           "defprim", "lowbias32", "matmul_flops", "no_flops", "per_element",
           "per_input_element", "per_row_element", "rand_bits", "rand_key", "window",
           "window_rows"]
