"""GGUF's quant formats, each defined once: block layout, formulas and every decoder.

llama.cpp stores weights in blocks (Q8_0: 32 int8s and an f16 scale; Q4_K: 256 nibbles with
per-sub-block scales and mins; ...). webgrad reads them on the host (the file parser, the
reference and torch executors) and keeps them quantized on the GPU, where WGSL decodes them
in registers. Every one of those readers takes a type's layout and formulas from the type's
own module here, so a format is written in one file:

    format.py     QuantFormat (the pieces a format has) and GGML_TYPES (every ggml type id,
                  name and block size, decodable or not)
    q8_0.py q4_0.py q4_1.py q5_0.py q5_1.py q4_k.py q5_k.py q6_k.py
                  one format each (the module is the type's name in lower case): the
                  block layout, the formula and the GPU word layout in its docstring, then
                  its decoders; a family's shared decoders sit with it (block32.py for
                  Q4_1/Q5_0/Q5_1, q4_k.py's for Q5_K)
    registry.py   FORMATS, the formats above by name; FLOATS, the float types
    decode.py     dequantize(type_name, raw, n): any type's values on the host (and
                  F16's WGSL, for io/gpu_dequant.py)
    words.py      the blocks as aligned u32 words on the GPU (transcode, raw_blocks,
                  n_words), QuantSpec (a parameter held quantized) and the `dequantize`
                  primitive's reference (dequantize_numpy)

This is the data-and-specs layer: of webgrad it imports only arrays.py. Above it, io/gguf.py
parses files (types and sizes from GGML_TYPES), io/gpu_dequant.py and codegen/quant.py wrap
the formats' WGSL in kernels, primitives/matmul.py and the executors call dequantize_numpy.

Adding a quant format (tests/test_quant_formats.py fails until each piece is there):
  1. its row in format.GGML_TYPES exists already (every ggml type is listed);
  2. a module qX.py (the name in lower case) with a docstring giving the file block's
     layout, the formula and the GPU word layout, and FORMAT = QuantFormat(name,
     f16_at=..., scales_at=..., python=, numpy=, wgsl=, wgsl_group=, wgsl_chunk=, group=,
     has_min=): see QuantFormat (and Chunk) for what each piece takes and returns; the
     Python decoder is the spec (Python floats, rounded once to f32), the others compute
     the same values;
  3. its module in registry.py's list;
  4. test data: its f16 fields' offsets in tests/test_gguf.py's F16_FIELDS (random blocks
     with finite scales; QUANTIZABLE if gguf can quantize it), its weight scale and test
     shapes in tests/test_gguf_quant.py's SCALE, SHAPES and CONFIGS, and its name out of
     tests/test_quant_formats.py's NOT_SUPPORTED. The tests over FORMATS then run every
     piece against gguf.quants.dequantize, on the host and on WebGPU (tests/test_gguf.py,
     tests/test_gguf_quant.py, tests/test_gguf_gpu.py).
Nothing else names a type: the parser, GPT-2 loading (GPT2.from_gguf keeps every format of
FORMATS quantized), the matmul kernels and the model cache go by FORMATS.
"""
from __future__ import annotations

from .decode import DEQUANTIZABLE, dequantize, f16_wgsl
from .format import GGML_TYPES, TYPE_IDS, Chunk, QuantFormat
from .registry import FLOATS, FORMATS
from .words import (QuantSpec, check, dequantize_numpy, dequantize_words, n_words, raw_blocks,
                    transcode)

__all__ = ["Chunk", "DEQUANTIZABLE", "FLOATS", "FORMATS", "GGML_TYPES", "QuantFormat",
           "QuantSpec", "TYPE_IDS", "check", "dequantize", "dequantize_numpy", "dequantize_words",
           "f16_wgsl", "n_words", "raw_blocks", "transcode"]
