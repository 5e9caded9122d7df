#!/usr/bin/env bash
# Prepares the GPU check for a machine without network: downloads into .device-wheels/ (ignored
# by git) the wheels of kvstack's core and kv dependencies for one Python version, and records
# the commit being measured. Run it after the last commit, right before the device run.
#   PY_VERSION=3.12 PIP=.venv/bin/pip bash scripts/gpu-wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PIP=${PIP:-.venv/bin/pip}
PY_VERSION=${PY_VERSION:-3.12}
WHEELS=${WHEELS:-.device-wheels}
# core (pyproject's dependencies) and the kv extra, torch excepted: the GPU machine has its own
REQUIREMENTS=("pydantic>=2.6" "pyyaml>=6.0" "prometheus-client>=0.19" "xxhash>=3.4"
  "numpy>=1.24" "zstandard>=0.22" "lz4>=4.3" "cryptography>=42")

rm -rf "$WHEELS"
"$PIP" download --quiet --only-binary=:all: --python-version "$PY_VERSION" \
  --platform manylinux2014_x86_64 -d "$WHEELS" "${REQUIREMENTS[@]}"
git rev-parse HEAD > "$WHEELS/COMMIT"
git diff --quiet HEAD || echo "uncommitted changes" >> "$WHEELS/COMMIT"
printf '[gpu-wheels] %s wheels for Python %s in %s (%s), commit %s\n' \
  "$(ls "$WHEELS"/*.whl | wc -l)" "$PY_VERSION" "$WHEELS" "$(du -sh "$WHEELS" | cut -f1)" \
  "$(head -1 "$WHEELS/COMMIT")" >&2
