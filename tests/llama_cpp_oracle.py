"""llama.cpp as an oracle: llama-cpp-python, built from its source by scripts/install.sh into
.cache/llama-cpp when asked (WEBGRAD_LLAMA_CPP=1; docs/testing.md), and ggml's own
quantizers and dequantizers from the library it ships (libggml-base), through ctypes.

The tests that use it carry the `slow` marker. Without the build they fail, saying how to
make it: a missing oracle must not pass as a skip.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "llama-cpp"
HOW = ("llama.cpp is not built: run `WEBGRAD_LLAMA_CPP=1 ./scripts/install.sh` (it builds "
       "llama-cpp-python into .cache/llama-cpp; docs/testing.md)")

# ggml's type ids (ggml.h) and llama_ftype values (llama.h) for llama_model_quantize
GGML = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
        "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
FTYPE = {"Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}


def llama_cpp():
    """The llama_cpp module (the cached build, or one installed in the environment)."""
    if CACHE.is_dir() and str(CACHE) not in sys.path:
        sys.path.insert(0, str(CACHE))
    try:
        import llama_cpp as mod
    except ImportError as e:
        pytest.fail(f"{HOW} ({e})")
    return mod


def ggml_base():
    """libggml-base, with the prototypes of the functions used here."""
    lib_dir = Path(llama_cpp().__file__).parent / "lib"
    found = sorted(glob.glob(str(lib_dir / "libggml-base.*")))
    if not found:
        pytest.fail(f"no libggml-base in {lib_dir}: {HOW}")
    lib = ctypes.CDLL(found[0])
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    return lib


def quantize(x: np.ndarray, type_name: str) -> np.ndarray:
    """ggml_quantize_chunk (what llama-quantize runs, no importance matrix): rows of x
    (float32 [rows, n]) -> the blocks, uint8 [rows, row bytes]."""
    lib = ggml_base()
    x = np.ascontiguousarray(x, np.float32)
    rows, n = x.shape
    t = GGML[type_name]
    out = np.zeros((rows, lib.ggml_row_size(t, n)), np.uint8)
    lib.ggml_quantize_chunk(t, x.ctypes.data, out.ctypes.data, 0, rows, n, None)
    return out


def dequantize(blocks: np.ndarray, type_name: str, n: int) -> np.ndarray:
    """ggml's dequantize_row_<type> (the CPU backend's to_float) of n values."""
    lib = ggml_base()
    fn = getattr(lib, f"dequantize_row_{type_name.lower().replace('_k', '_K')}")
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    blocks = np.ascontiguousarray(blocks)
    out = np.zeros(n, np.float32)
    fn(blocks.ctypes.data, out.ctypes.data, n)
    return out


def quantize_file(src: Path, dst: Path, ftype: str) -> Path:
    """llama_model_quantize (llama-quantize's library call): src (an F32 GGUF) -> dst."""
    lc = llama_cpp()
    params = lc.llama_model_quantize_default_params()
    params.ftype = FTYPE[ftype]
    params.nthread = 1
    rc = lc.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize({ftype}) returned {rc}"
    return dst


def logits(path: Path, ids: list[int]) -> np.ndarray:
    """llama.cpp's logits at every position of ids (CPU, f32 K/V cache), [len(ids), vocab]."""
    lc = llama_cpp()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    m = lc.Llama(model_path=str(path), n_ctx=max(32, len(ids)), n_batch=len(ids),
                 n_ubatch=len(ids), logits_all=True, n_threads=1, n_threads_batch=1,
                 type_k=GGML["F32"], type_v=GGML["F32"], verbose=False, seed=0)
    try:
        m.eval(ids)
        return np.array(m.scores[:len(ids)], np.float32)
    finally:
        m.close()
