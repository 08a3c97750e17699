#!/usr/bin/env bash
# Create .venv (if missing) and install MindMotor into it.
#   scripts/install.sh          serving only (numpy, grpc, ...; no PyTorch)
#   scripts/install.sh dev      + training (PyTorch 2.13.0 CPU first), tests, benchmarks and the operator (kopf)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
PIP=".venv/bin/pip"
$PIP install -q --upgrade pip >/dev/null
if [ "${1:-}" = "dev" ]; then
  # The CPU build of torch 2.13.0 lies on this kind of machine's disk; any other version would
  # pull a multi-GB CUDA build. Installing it first makes the `train` extra's range a no-op.
  $PIP install -q "torch==2.13.0"
  $PIP install -q -e ".[train,test,bench,operator]"
else
  $PIP install -q -e .
fi
echo "installed into $(pwd)/.venv"
