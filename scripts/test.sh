#!/usr/bin/env bash
# The README's test command: install everything on a fresh machine, then run the whole suite
# (core + torch oracle, native WebGPU on lavapipe, browser end-to-end on headless Chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
python3 serve.py --provision-only
set +e
python3 -m pytest -q "$@"
rc=$?
set -e
# pytest exits 5 when it collected nothing (e.g. a filter matched no test): not a failure here
if [ "$rc" = 5 ]; then echo "pytest collected no tests"; exit 0; fi
exit "$rc"
