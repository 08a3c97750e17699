#!/usr/bin/env bash
# Install (serving only) and start MindMotor serving the bundled model. Extra arguments are
# passed to the server command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
if .venv/bin/mindmotor --help | grep -qE '^\s+up\b'; then
  exec .venv/bin/mindmotor up "$@"
fi
exec .venv/bin/mindmotor worker --port "${MINDMOTOR_PORT:-50051}" "$@"
