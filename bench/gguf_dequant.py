#!/usr/bin/env python3
"""GGUF reading and dequantization speed, pure Python against numpy and the gguf package.

    python3 bench/gguf_dequant.py      # a GPT-2 124M-shaped matrix set, F32/F16/Q8_0/Q4_0/Q4_K

For each type it writes one GGUF file (gguf's GGUFWriter) holding the 124M model's matrices
(token table 50257x768, four per block x 12 blocks; Q4_K blocks are random with finite
scales, as gguf cannot quantize Q4_K), then times webgrad.io.gguf.load (parse, zero-copy)
and dequantization of every tensor on the pure-Python path (what the browser worker runs,
numpy being absent there) and on the numpy path, against gguf.quants.dequantize; the
values are checked bit-equal to gguf's first. Reported: file MB (the bytes a quantized
weight keeps), load seconds, and dequantized M values/s.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "pkg"), str(ROOT / "tests")]

import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

from webgrad.io import gguf as wgg  # noqa: E402

SHAPES = [(50257, 768)] + [(2304, 768), (768, 768), (3072, 768), (768, 3072)] * 12


def blocks_for(qt, shape, rng):
    x = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    if qt == QT.F32:
        return x, None
    if qt == QT.F16:
        return x.astype(np.float16), None
    if qt == QT.Q4_K:
        from test_gguf import random_blocks
        nb = shape[0] * shape[1] // 256
        return random_blocks(qt, nb, rng).reshape(shape[0], -1), qt
    q = gguf.quants.quantize(x, qt)
    return q, qt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12, help="blocks of four matrices (12 = 124M)")
    ap.add_argument("--types", default="F32,F16,Q8_0,Q4_0,Q4_K")
    args = ap.parse_args()
    shapes = SHAPES[:1 + 4 * args.layers]
    rng = np.random.default_rng(0)
    print(f"{'type':5} {'file MB':>8} {'load s':>7} {'pure M/s':>9} {'numpy M/s':>10} "
          f"{'gguf M/s':>9}")
    with tempfile.TemporaryDirectory() as d:
        for name in args.types.split(","):
            qt = QT[name]
            path = os.path.join(d, f"{name}.gguf")
            w = gguf.GGUFWriter(path, "gpt2")
            for i, shape in enumerate(shapes):
                data, raw = blocks_for(qt, shape, rng)
                if raw is None:
                    w.add_tensor(f"t{i}", data)
                else:
                    w.add_tensor(f"t{i}", data, raw_shape=data.shape, raw_dtype=raw)
            w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file()
            w.close()
            blob = Path(path).read_bytes()
            t = time.perf_counter()
            f = wgg.load(blob)
            load = time.perf_counter() - t
            n = sum(t.n_elements for t in f.tensors.values())
            first = next(iter(f.tensors.values()))
            want = gguf.quants.dequantize(np.frombuffer(first.data, np.uint8).reshape(first.shape[0], -1), qt)
            got = wgg.dequantize(name, first.data, first.n_elements, use_numpy=False)
            assert np.frombuffer(got, np.float32).tobytes() == want.astype(np.float32).tobytes()
            timings = {}
            for label, fn in (
                    ("pure", lambda t: wgg.dequantize(name, t.data, t.n_elements, use_numpy=False)),
                    ("numpy", lambda t: wgg.dequantize(name, t.data, t.n_elements)),
                    ("gguf", lambda t: gguf.quants.dequantize(
                        np.frombuffer(t.data, np.uint8).reshape(t.shape[0], -1), qt))):
                t0 = time.perf_counter()
                for t in f.tensors.values():
                    fn(t)
                timings[label] = n / (time.perf_counter() - t0) / 1e6
            theirs = "-" if name == "F32" else f"{timings['gguf']:.1f}"   # F32: a view, no work
            print(f"{name:5} {len(blob) / 2**20:8.1f} {load:7.3f} {timings['pure']:9.2f} "
                  f"{timings['numpy']:10.1f} {theirs:>9}")


if __name__ == "__main__":
    main()
