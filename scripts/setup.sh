#!/usr/bin/env bash
# Installs everything Chroma needs on a fresh Debian 12/13 machine, builds the package into
# ./.venv and installs the WebGPU runtime's npm packages into web/node_modules. Idempotent:
# re-running it only rebuilds what changed. `--bench` also installs the benchmark peers and
# models (ONNX Runtime, OpenVINO, transformers, all-MiniLM-L6-v2: bench/requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/debs.sh
ensure_debs setup g++ cmake ninja-build libopenblas-dev libgtest-dev nlohmann-json3-dev libssl-dev
# WebGPU on the CPU: Chromium (headless tests; its SwiftShader Vulkan driver also serves Dawn
# in Node) and Mesa's lavapipe (the `wgpu` Python package's adapter in the tests).
ensure_debs setup chromium mesa-vulkan-drivers
# clang-14: type-checks the Metal target's MSL against include/chroma/msl_check (docs/cuda.md).
ensure_debs setup clang-14
command -v npm >/dev/null 2>&1 || ensure_debs setup nodejs npm

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PYTHON" -m venv .venv
fi
.venv/bin/pip install -q -r requirements.txt -r requirements-serve.txt
if [ "${1:-}" = "--bench" ]; then
  echo "[setup] installing the benchmark peers (bench/requirements.txt)"
  .venv/bin/pip install -q -r bench/requirements.txt -c requirements.txt
fi
if [ ! -f web/node_modules/.package-lock.json ] || [ web/package-lock.json -nt web/node_modules/.package-lock.json ]; then
  echo "[setup] installing the WebGPU runtime's npm packages (web/package-lock.json)"
  (cd web && npm ci --no-audit --no-fund --loglevel=error)
fi
echo "[setup] building chroma"
.venv/bin/pip install -q --no-build-isolation -e .
