#!/usr/bin/env bash
# The whole test suite from a fresh clone: bootstrap, lint, type-check, pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/kv -x). KVSTACK_SKIP_LINT=1 skips ruff/mypy.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
VENV=${KVSTACK_VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"

if [ "${KVSTACK_SKIP_LINT:-0}" != 1 ]; then
  echo "== ruff" && ruff check src tests benchmarks && ruff format --check src tests benchmarks
  echo "== mypy" && mypy
fi
echo "== pytest"
exec python -m pytest "$@"
