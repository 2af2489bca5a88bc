#!/usr/bin/env bash
# Prints the Python interpreter that scripts/install.sh installed the test extras for:
# the checkout's .venv when it exists, else the python3 on PATH.
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then echo "$PWD/.venv/bin/python"; else command -v python3; fi
