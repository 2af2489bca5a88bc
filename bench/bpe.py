#!/usr/bin/env python3
"""Seconds per MB of webgrad's pure-Python GPT-2 tokenizer against transformers' (Rust) one.

    python3 bench/bpe.py            # needs the GPT-2 files: scripts/install.sh fetches them

Two 1 MB texts: English prose (Python's own docs, `pydoc_data.topics`, repeated to 1 MB) and
a multilingual mix (the same prose with every tenth word replaced by words from eight
scripts, digits and emoji, so the Unicode pattern path runs). Each is encoded by a fresh
tokenizer (cold: every word goes through BPE once) and again by the same one (warm: words
come from its cache); the ids are checked equal to transformers' before anything is timed.
"""
from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "pkg"))
sys.path.insert(0, str(ROOT / "tests"))

from gpt2_files import gpt2_vocab_files  # noqa: E402
from webgrad.models import bpe as bpe_module  # noqa: E402
from webgrad.models.bpe import Tokenizer  # noqa: E402

MB = 1 << 20


def texts() -> dict[str, str]:
    from pydoc_data.topics import topics
    prose = "\n\n".join(topics[k] for k in sorted(topics))
    english = (prose * (MB // len(prose.encode()) + 1)).encode()[:MB].decode("utf-8", "ignore")
    rng = random.Random(0)
    foreign = ["Привет", "мир", "你好", "世界", "こんにちは", "안녕", "مرحبا", "שלום", "naïve",
               "café", "Ⅻ", "½", "٣٤٥", "😀", "👍🏽", "１２３", "ß", "İstanbul"]
    words = english.split(" ")
    mixed = " ".join(rng.choice(foreign) if rng.random() < 0.1 else w for w in words)
    mixed = mixed.encode()[:MB].decode("utf-8", "ignore")
    return {"english": english, "multilingual": mixed}


def best(fn, reps=3):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    got = gpt2_vocab_files()
    if isinstance(got, str):
        sys.exit(got)
    enc, bpe = got
    t = time.perf_counter()
    Tokenizer.from_files(enc, bpe)
    load = time.perf_counter() - t
    t = time.perf_counter()
    bpe_module._get_unicode_pattern()
    table = time.perf_counter() - t
    import transformers
    vocab = json.loads(enc.read_text(encoding="utf-8"))
    merges = [tuple(l.split()) for l in bpe.read_text(encoding="utf-8").split("\n")[1:] if l]
    theirs = transformers.GPT2Tokenizer(vocab=vocab, merges=merges)
    print(f"webgrad Tokenizer.from_files: {load:.3f} s; the \\p{{L}}/\\p{{N}} tables (once per "
          f"process, on the first non-ASCII text): {table:.3f} s")
    print(f"{'text':13} {'MB':>5} {'tokens':>7} {'cold s/MB':>10} {'warm s/MB':>10} "
          f"{'transformers s/MB':>18} {'ratio (cold)':>12}")
    for name, text in texts().items():
        mb = len(text.encode()) / MB
        ids = Tokenizer.from_files(enc, bpe).encode(text)
        assert ids == theirs.encode(text), f"{name}: ids differ from transformers'"
        fresh = [Tokenizer.from_files(enc, bpe) for _ in range(3)]
        cold = best(lambda: fresh.pop().encode(text))
        tok = Tokenizer.from_files(enc, bpe)
        tok.encode(text)
        warm = best(lambda: tok.encode(text))
        ref = best(lambda: theirs.encode(text))
        print(f"{name:13} {mb:5.2f} {len(ids):7d} {cold / mb:10.3f} {warm / mb:10.3f} "
              f"{ref / mb:18.3f} {cold / ref:12.2f}")


if __name__ == "__main__":
    main()
