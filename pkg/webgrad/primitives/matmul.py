"""The matmul primitive and dequantize, the quantized weights a matmul reads.

matmul is a kernel of its own (codegen/matmul.py picks which); dequantize is an expression
that its consumers, matmuls included, decode in registers (codegen/quant.py), with the block
layouts of webgrad.quants.
"""
from __future__ import annotations

from math import prod

from .registry import ELEMENT, MATMUL, ShapeError, broadcast_shapes, defprim, ops_module as _O


def _matmul_shape(ins, attrs):
    a, b = ins
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ShapeError("operands need rank >= 2 (ops.matmul lifts vectors)")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"inner dimensions differ: {a.shape[-1]} vs {b.shape[-2]}")
    if a.dtype != b.dtype or a.dtype not in ("f32", "f16"):
        raise ShapeError("needs two f32 or two f16 operands (f16 x f16 accumulates in f32); "
                         "convert with ops.cast(x, 'f32') or ops.cast(x, 'f16')")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return batch + (a.shape[-2], b.shape[-1]), "f32"


def _matmul_ref(np, a, x, y):
    # f16 operands are multiplied and summed in f32 (the GPU's f16 x f16 -> f32 products);
    # numpy's own float16 matmul would round every partial sum to f16
    if x.dtype == np.float16:
        return np.matmul(x.astype(np.float32), y.astype(np.float32))
    return np.matmul(x, y)


def _matmul_grad(g, i, o, a):
    # C = A B:  dA = dC B^T,  dB = A^T dC  (then summed over broadcast batch dims); with f16
    # operands the incoming gradient is rounded to f16 too, as torch.amp's backward does
    O = _O()
    if i[0].dtype == "f16":
        g = O.cast(g, "f16")
    return [O.matmul(g, O.swap_axes(i[1], -1, -2)), O.matmul(O.swap_axes(i[0], -1, -2), g)]


defprim("matmul", "matmul", shape=_matmul_shape, ref=_matmul_ref, grad=_matmul_grad, cost=MATMUL,
        lowering="matmul")


def _dequantize_shape(ins, attrs):
    from ..quants import check, n_words
    w, qtype, shape = ins[0], attrs["qtype"], tuple(attrs["shape"])
    if w.dtype != "i32" or len(w.shape) != 1:
        raise ShapeError("the blocks must be an i32 vector of words (webgrad.quants' word layout)")
    try:
        check(qtype, shape, "dequantize")
    except ValueError as e:
        raise ShapeError(str(e)) from None
    if w.shape[0] != n_words(qtype, prod(shape)):
        raise ShapeError(f"{qtype}{list(shape)} takes {n_words(qtype, prod(shape))} words, "
                         f"got {w.shape[0]}")
    return shape, "f32"


def _dequantize_ref(np, a, w):
    from ..quants import dequantize_numpy
    return dequantize_numpy(np, a["qtype"], w, a["shape"])


defprim("dequantize", "quant", shape=_dequantize_shape, ref=_dequantize_ref, grad=None,
        cost=ELEMENT,
        doc="quantized blocks -> f32 (webgrad/quants): a primitive because on WebGPU its consumers "
            "decode the blocks in registers (codegen/quant.py), which no composition of "
            "bit ops on i32 would let a matmul do without storing the f32 weights")
