#!/usr/bin/env bash
# The GPU check on a machine without network (benchmarks/gpu/README.md): installs what is
# missing from the wheels carried in .device-wheels/ into .device-site/ (the machine's Python
# stays untouched), runs benchmarks/gpu/check.py, and leaves its JSON and log in $OUT.
#   OUT=/some/dir bash scripts/gpu-check.sh [check.py arguments]
set -uo pipefail
cd "$(dirname "$0")/.."

WHEELS=${WHEELS:-.device-wheels}
SITE=${SITE:-.device-site}
OUT=${OUT:-bench-results/gpu}
DEVICE=${DEVICE:-cuda}
log() { printf '[gpu-check] %s\n' "$*" >&2; }

PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then  # the Python that has torch
  for candidate in python3 python; do
    if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then
      PYTHON=$candidate
      break
    fi
  done
fi
[ -n "$PYTHON" ] || { log "no python with torch on PATH (set PYTHON=...)"; exit 3; }
log "$("$PYTHON" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__,
  "cuda", torch.version.cuda, "devices", torch.cuda.device_count())')"

mkdir -p "$OUT" "$SITE"
export PYTHONPATH="$PWD/$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
missing=$("$PYTHON" benchmarks/gpu/check.py --list-missing)
if [ -n "$missing" ]; then
  log "installing from $WHEELS: $missing"
  # shellcheck disable=SC2086  # one word per distribution
  if ! "$PYTHON" -m pip install --quiet --no-index --find-links "$WHEELS" --target "$SITE" \
    $missing; then
    log "the carried wheels do not fit this Python ($("$PYTHON" -V 2>&1)): download them with"
    log "PY_VERSION=<its X.Y> bash scripts/gpu-wheels.sh, then run again"
    exit 3
  fi
fi
if [ -z "${KVSTACK_COMMIT:-}" ] && [ -f "$WHEELS/COMMIT" ]; then
  KVSTACK_COMMIT=$(paste -sd' ' "$WHEELS/COMMIT")
  export KVSTACK_COMMIT
fi
stamp=$(date -u +%Y%m%dT%H%M%SZ)
result="$OUT/check-${DEVICE%%:*}-$stamp.json"
"$PYTHON" benchmarks/gpu/check.py --device "$DEVICE" --json "$result" "$@" 2>&1 \
  | tee "$OUT/check-${DEVICE%%:*}-$stamp.log"
rc=${PIPESTATUS[0]}
log "exit $rc; result $result"
exit "$rc"
