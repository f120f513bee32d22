#!/usr/bin/env bash
# Installs everything Chroma needs on a fresh Debian 12/13 machine and builds the package
# into ./.venv. Idempotent: re-running it only rebuilds what changed. `--bench` also installs
# the benchmark peers (onnx, onnxruntime, onnxscript: bench/requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(g++ cmake ninja-build libopenblas-dev libdnnl-dev libgtest-dev nlohmann-json3-dev libssl-dev)
missing=()
for p in "${DEBS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "[setup] installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PYTHON" -m venv .venv
fi
.venv/bin/pip install -q -r requirements.txt
if [ "${1:-}" = "--bench" ]; then
  echo "[setup] installing the benchmark peers (bench/requirements.txt)"
  .venv/bin/pip install -q -r bench/requirements.txt
fi
echo "[setup] building chroma"
.venv/bin/pip install -q --no-build-isolation -e .
