#!/usr/bin/env bash
# The README's test command: install everything on a fresh machine, then run the whole suite
# (core + torch oracle, native WebGPU on lavapipe, browser end-to-end on headless Chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
PY="$(./scripts/python.sh)"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
"$PY" serve.py --provision-only
# the suite's rules (tests/suite_rules.py): a test over 60 s, or one skipped for a reason not
# documented there, fails the run; -rs prints every skip's reason; a test that hangs is
# stopped after 300 s with every thread's stack (pytest-timeout); --durations=25 prints the 25
# longest tests, so a CI log shows which ones near the 60 s rule
export WEBGRAD_STRICT=1
# numpy's BLAS on one thread: the reference executor's products are small, and OpenBLAS's
# spinning threads took the cores from Chromium and lavapipe (a char LM on the reference ran
# 46 s with its default threads beside a busy browser, 4.3 s with one)
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
# WEBGRAD_TEST_WORKERS=N: N pytest-xdist workers, 2 unless set (lavapipe compiles a kernel on
# one thread, so two keep two cores busy); the browser tests stay on one worker, in file
# order, and every other file on one worker (tests/suite_rules.py's scheduler, docs/testing.md)
workers="${WEBGRAD_TEST_WORKERS:-2}"
par=()
[ "$workers" -gt 1 ] && par=(-n "$workers" --dist loadscope)
set +e
"$PY" -m pytest -q -rs --durations=25 --timeout=300 --timeout-method=thread "${par[@]}" "$@"
rc=$?
set -e
# pytest exits 5 when it collected nothing (a filter that matched no test, a broken
# collection): a run that tested nothing must not pass
if [ "$rc" = 5 ]; then echo "scripts/test.sh: pytest collected no tests; failing" >&2; fi
exit "$rc"
