#!/usr/bin/env bash
# Runs every test: the C++ unit tests (GoogleTest), the JS WebGPU runtime's tests (Node's test
# runner on Dawn) and the Python tests against PyTorch (CPU, WebGPU, and CUDA and Metal on the emulator).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export CHROMA_CACHE_DIR="${CHROMA_CACHE_DIR:-$PWD/build/cache}"
export CHROMA_MODEL_CACHE_BYTES="${CHROMA_MODEL_CACHE_BYTES:-2147483648}"  # finished artifacts kept: 2 GiB
export CHROMA_VERIFY=1   # run the IR verifier after every pass
cmake -S . -B build/tests -G Ninja -DCHROMA_BUILD_TESTS=ON -DCHROMA_WERROR=ON >/dev/null
cmake --build build/tests -j 2 --target chroma_tests chroma_run
./build/tests/chroma_tests
(cd web && npm test --silent)   # the JS WebGPU runtime, on Dawn + SwiftShader
.venv/bin/python -m pytest tests/python -q -n 2 "$@"
# Every op on every backend: the shared op suite again, compiled for WebGPU and run on a
# software adapter (tests/python/conftest.py; skips with reasons in webgpu_skips.py).
CHROMA_TEST_TARGET=webgpu .venv/bin/python -m pytest tests/python -q -n 2 "$@"
# ... and compiled for CUDA and for Metal, run on the CPU SIMT emulator (docs/cuda.md; skips in
# cuda_skips.py and metal_skips.py).
CHROMA_TEST_TARGET=cuda .venv/bin/python -m pytest tests/python -q -n 2 "$@"
CHROMA_TEST_TARGET=metal .venv/bin/python -m pytest tests/python -q -n 2 "$@"
