"""Every quant format is defined once and whole (webgrad/quants): the formats' registry test.

Fails when a ggml type the GGUF reader names (quants.GGML_TYPES) is neither decoded (a
float type, or a format of quants.FORMATS) nor listed in NOT_SUPPORTED with the reason; when
a format lacks a piece (Python spec, numpy path, the three WGSL decoders, a documented layout)
or its geometry disagrees with the gguf package; when a reader (io/gguf.py, io/gpu_dequant.py,
quantized parameters, the tests' block generators) does not take a format; when code outside
webgrad/quants names a format (a per-type special case); and when the quants layer imports
from the layers above it. The values are judged where each reader is tested, every test
parametrized over FORMATS: tests/test_gguf.py (Python and numpy against
gguf.quants.dequantize), tests/test_gguf_quant.py (the word layout; matmuls, gathers and
GPT-2 on reference, torch and WebGPU) and tests/test_gguf_gpu.py (gpu_dequant on lavapipe).
"""
from __future__ import annotations

import ast
import importlib
import tokenize
from pathlib import Path

import gguf
from gguf import GGMLQuantizationType as QT

from webgrad import quants
from webgrad.io import gguf as wgg, gpu_dequant

import test_gguf_quant
from test_gguf import F16_FIELDS

PKG = Path(quants.__file__).resolve().parents[1]          # pkg/webgrad

# ggml types the reader parses but webgrad does not decode: a file holding one loads, and
# dequantizing such a tensor raises, naming the supported types
NOT_SUPPORTED = {
    **dict.fromkeys(["Q2_K", "Q3_K"], "k-quants of Q2_K/Q3_K_* files, not yet"),
    **dict.fromkeys(["Q8_1", "Q8_K"], "llama.cpp's intermediate formats for activations; "
                    "never stored in model files"),
    **dict.fromkeys(["IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S",
                     "IQ4_XS", "IQ1_M"], "i-quants: lattice codebooks, not yet"),
    **dict.fromkeys(["TQ1_0", "TQ2_0", "MXFP4"], "ternary and FP4 formats, not yet"),
    **dict.fromkeys(["I8", "I16", "I32", "I64"], "integer tensors, not weights"),
}


def test_every_ggml_type_is_decoded_or_says_why_not():
    names = {name for name, _, _ in quants.GGML_TYPES.values()}
    decoded = set(quants.FLOATS) | set(quants.FORMATS)
    assert not decoded & set(NOT_SUPPORTED), "a decoded type is listed in NOT_SUPPORTED"
    missing = sorted(names - decoded - set(NOT_SUPPORTED))
    assert not missing, (f"ggml types {missing} are neither decoded (webgrad/quants) nor in "
                         "NOT_SUPPORTED with a reason (tests/test_quant_formats.py)")
    assert set(wgg.DEQUANTIZABLE) == decoded
    for qt, (block, size) in gguf.GGML_QUANT_SIZES.items():   # the table is gguf's
        if int(qt) in quants.GGML_TYPES:
            assert quants.GGML_TYPES[int(qt)] == (qt.name, block, size)


def test_every_format_has_every_piece():
    problems = []
    for name, fmt in quants.FORMATS.items():
        where = f"webgrad/quants: {name}"
        module = importlib.import_module(f"webgrad.quants.{name.lower()}")
        if module.FORMAT is not fmt:
            problems.append(f"{where}: FORMATS holds another FORMAT than {module.__name__}'s")
        if name not in (module.__doc__ or ""):
            problems.append(f"{where}: module {module.__name__} has no docstring giving the "
                            "block layout, the formula and the word layout")
        for piece in ("python", "numpy", "wgsl", "wgsl_group", "wgsl_chunk"):
            if not callable(getattr(fmt, piece)):
                problems.append(f"{where}: {piece} is not a function")
        n = 3 * fmt.block
        ch = fmt.wgsl_chunk(n)
        if not (isinstance(ch, quants.Chunk) and ch.runs * ch.run * ch.per_block == fmt.block):
            problems.append(f"{where}: wgsl_chunk's chunks do not cover a block once")
        body = fmt.wgsl("w", n)
        scale, quant = fmt.wgsl_group("w", n)
        for what, text in (("wgsl", body), ("wgsl_group's scale", scale),
                           ("wgsl_group's quant", quant)):
            if not (isinstance(text, str) and "return" in text and "w[" in text):
                problems.append(f"{where}: {what} is not a WGSL body reading the words")
        if (fmt.block, fmt.nbytes) != tuple(gguf.GGML_QUANT_SIZES[QT[name]]):
            problems.append(f"{where}: block geometry differs from gguf's")
        if QT[name] not in F16_FIELDS:
            problems.append(f"{where}: tests/test_gguf.py's F16_FIELDS has no entry (the "
                            "random blocks every format test draws)")
        for table in ("SCALE", "SHAPES", "CONFIGS"):
            if QT[name] not in getattr(test_gguf_quant, table):
                problems.append(f"{where}: tests/test_gguf_quant.py's {table} has no entry")
        if name not in gpu_dequant.SUPPORTED:
            problems.append(f"{where}: io/gpu_dequant.py does not decode it")
        raw = bytes(range(256)) * (3 * fmt.nbytes // 256 + 1)
        words = quants.transcode(name, raw[:3 * fmt.nbytes])
        if len(words) != 4 * quants.n_words(name, n):
            problems.append(f"{where}: the word layout's size is not n_words")
        quants.QuantSpec(name, (2, fmt.block))               # held quantized
    assert not problems, "\n".join(problems)


def _string_literals(path: Path):
    with tokenize.open(path) as f:
        for tok in tokenize.generate_tokens(f.readline):
            if tok.type == tokenize.STRING:
                yield tok.start[0], tok.string


def test_no_format_is_special_cased_outside_quants():
    """A quoted format name outside webgrad/quants is a per-type branch or table that the
    next format would have to be added to: read the format's pieces from FORMATS instead."""
    quoted = {q + name + q for name in quants.FORMATS for q in "\"'"}
    found = [f"{p.relative_to(PKG.parent)}:{line}: {s}"
             for p in sorted(PKG.rglob("*.py")) if "quants" not in p.relative_to(PKG).parts
             for line, s in _string_literals(p) if s in quoted]
    assert not found, "per-format special cases:\n" + "\n".join(found)


def test_quants_imports_nothing_above_it():
    """webgrad/quants imports the standard library, itself and arrays.py (plain data) only."""
    for path in sorted((PKG / "quants").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                bad = ((node.level > 1 and node.module != "arrays") or node.level > 2
                       or (node.level == 0 and (node.module or "").startswith("webgrad")))
            elif isinstance(node, ast.Import):
                bad = any(a.name.startswith("webgrad") for a in node.names)
            else:
                continue
            assert not bad, (f"webgrad/quants/{path.name}:{node.lineno} imports from outside "
                             "webgrad/quants and arrays.py; the formats are the lowest layer (io/, codegen/ "
                             "and the executors import them, never the reverse)")


def test_unsupported_types_fail_saying_what_to_do():
    import pytest
    with pytest.raises(wgg.GGUFError, match="Q3_K is not supported .*add the format"):
        wgg.dequantize("Q3_K", bytes(110), 256)
