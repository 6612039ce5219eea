#!/usr/bin/env bash
# The test suite, as CI runs it (`.ci/run`) and the README's second command: the fast set on two workers, one per
# core of this machine (each test file in one worker, so a module's server starts once), then the tests that
# measure how busy the machine is, alone. Arguments go to both runs, e.g. `bash scripts/test.sh -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -n 2 --dist loadfile -m "not slow and not alone" "$@"
.venv/bin/python -m pytest -m alone "$@"
