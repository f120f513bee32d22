#!/usr/bin/env bash
# Installs everything Chroma needs on a fresh Debian 12/13 machine and builds the package
# into ./.venv. Idempotent: re-running it only rebuilds what changed. `--bench` also installs
# the benchmark peers and models (ONNX Runtime, OpenVINO, transformers, all-MiniLM-L6-v2:
# bench/requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/debs.sh
ensure_debs setup g++ cmake ninja-build libopenblas-dev libdnnl-dev libgtest-dev nlohmann-json3-dev libssl-dev

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PYTHON" -m venv .venv
fi
.venv/bin/pip install -q -r requirements.txt
if [ "${1:-}" = "--bench" ]; then
  echo "[setup] installing the benchmark peers (bench/requirements.txt)"
  .venv/bin/pip install -q -r bench/requirements.txt -c requirements.txt
fi
echo "[setup] building chroma"
.venv/bin/pip install -q --no-build-isolation -e .
