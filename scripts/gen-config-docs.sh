#!/usr/bin/env bash
# Regenerates docs/configuration.md from the config schema (kvstack config reference).
set -euo pipefail
cd "$(dirname "$0")/.."
{
  echo "# Configuration reference"
  echo
  echo "Generated from the config schema by \`kvstack config reference\`; do not edit by hand."
  echo "Every key can be set in the YAML file named by \`KVSTACK_CONFIG\` (or \`--config\`), and"
  echo "overridden by an environment variable \`KVSTACK_<SECTION>_<KEY>\` (nested keys joined with"
  echo "\`__\`, e.g. \`KVSTACK_ROUTER_HEALTH__INTERVAL_S=2\`). Unknown keys are errors."
  echo
  "${KVSTACK_VENV:-.venv}/bin/python" -m kvstack config reference
} > docs/configuration.md
