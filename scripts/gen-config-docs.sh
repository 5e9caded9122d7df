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
  echo "\`__\`, e.g. \`KVSTACK_ROUTER_HEALTH__INTERVAL_S=2\`). Lists, objects, quoted strings and"
  echo "\`null\` in a variable are JSON (\`KVSTACK_KV_TIERS='[\"cpu://?size=1GiB\"]'\`); anything else"
  echo "is converted by the key's type. Unknown keys and unknown top-level sections are errors; an"
  echo "error names the file and key, or the variable, that set the value."
  echo
  "${KVSTACK_VENV:-.venv}/bin/python" -m kvstack config reference
  echo
  cat <<'TEXT'
## vLLM connector keys

The connector reads these keys of `kv_connector_extra_config` in vLLM's
`--kv-transfer-config` (`kvstack config reference --connector`). Every other key there is a
`kv` key above (`tiers`, `chunk_size`...), over the file named by `KVSTACK_CONFIG` and under
`KVSTACK_KV_*` variables; unknown keys are errors at engine start.

TEXT
  "${KVSTACK_VENV:-.venv}/bin/python" -m kvstack config reference --connector
} > docs/configuration.md
