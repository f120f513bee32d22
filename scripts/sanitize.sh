#!/usr/bin/env bash
# ASan + UBSan: builds the compiler, the C++ unit tests and the Python extension with both
# sanitizers, runs the unit tests, then a subset of the Python tests with the generated code
# built with the sanitizers too (docs/fuzzing.md). `.ci/run` calls it.
#
#   ./scripts/sanitize.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCHROMA_BUILD_TESTS=ON -DCHROMA_SANITIZE=ON \
  -DCHROMA_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PWD/.venv/bin/python" >/dev/null
cmake --build build/asan -j 2 --target chroma_tests _compiler

export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
echo "[sanitize] C++ unit tests"
./build/asan/chroma_tests --gtest_brief=1

echo "[sanitize] Python tests, generated code built with the sanitizers"
ASAN_LIB="$(gcc -print-file-name=libasan.so)"
UBSAN_LIB="$(gcc -print-file-name=libubsan.so)"
export CHROMA_COMPILER_LIBRARY="$(ls "$PWD"/build/asan/_compiler*.so | head -n 1)"
export CHROMA_EXTRA_CXXFLAGS="-fsanitize=address,undefined -fno-sanitize=signed-integer-overflow -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
export CHROMA_CACHE_DIR="$PWD/build/asan/cache"
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=0"
LD_PRELOAD="$ASAN_LIB $UBSAN_LIB" .venv/bin/python -m pytest -q -n 2 -p no:cacheprovider \
  tests/python/test_hardening.py tests/python/test_errors.py tests/python/test_runtime.py "$@"
echo "[sanitize] the GPU generator (compile-only tests of the WebGPU target: no GPU driver under ASan)"
LD_PRELOAD="$ASAN_LIB $UBSAN_LIB" .venv/bin/python -m pytest -q -p no:cacheprovider tests/python/test_webgpu.py \
  -k "golden or unsupported or linalg or float64 or cuda_dialect"
echo "[sanitize] clean"
