#!/usr/bin/env bash
# The main job: bootstrap, then the kvstack demo. Extra arguments go to `kvstack demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/kvstack demo "$@"
