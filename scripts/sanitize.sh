#!/usr/bin/env bash
# ASan + UBSan: builds the compiler, the C++ unit tests, chroma_run and the Python extension
# with both sanitizers and -Werror (the one -Werror build of the tiers), runs the unit tests,
# then a subset of the Python tests with the generated code built with the sanitizers too
# (docs/fuzzing.md). scripts/test.sh runs the two halves apart:
#
#   ./scripts/sanitize.sh [pytest args...]     both
#   ./scripts/sanitize.sh --cpp                the build and the C++ unit tests
#   ./scripts/sanitize.sh --python [args...]   the Python subset (after --cpp)
#   ./scripts/sanitize.sh --list               the subset's test files (the guarding tier runs
#                                              them only here: scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_SUBSET=(tests/python/test_hardening.py tests/python/test_errors.py tests/python/test_runtime.py)
PART=all
case "${1:-}" in --cpp | --python) PART="${1#--}"; shift ;; --list) printf '%s\n' "${PYTHON_SUBSET[@]}"; exit 0 ;; esac

if [ "$PART" != python ]; then
  # -O1 and line tables only: ASan's own guidance, and half the compile time of -O2 -g.
  cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCHROMA_BUILD_TESTS=ON -DCHROMA_SANITIZE=ON -DCHROMA_WERROR=ON \
    -DCHROMA_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PWD/.venv/bin/python" >/dev/null
  cmake --build build/asan -j 2 --target chroma_tests chroma_run _compiler
  echo "[sanitize] C++ unit tests"
  ASAN_OPTIONS="abort_on_error=1:detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    ./build/asan/chroma_tests --gtest_brief=1
  [ "$PART" = cpp ] && exit 0
fi
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

echo "[sanitize] Python tests, generated code built with the sanitizers"
ASAN_LIB="$(gcc -print-file-name=libasan.so)"
UBSAN_LIB="$(gcc -print-file-name=libubsan.so)"
export CHROMA_COMPILER_LIBRARY="$(ls "$PWD"/build/asan/_compiler*.so | head -n 1)"
export CHROMA_EXTRA_CXXFLAGS="-fsanitize=address,undefined -fno-sanitize=signed-integer-overflow -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
export CHROMA_CACHE_DIR="$PWD/build/asan/cache"
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=0"
LD_PRELOAD="$ASAN_LIB $UBSAN_LIB" .venv/bin/python -m pytest -q -n 2 -p no:cacheprovider \
  "${PYTHON_SUBSET[@]}" "$@"
echo "[sanitize] the GPU generator (compile-only tests of the WebGPU target: no GPU driver under ASan)"
LD_PRELOAD="$ASAN_LIB $UBSAN_LIB" .venv/bin/python -m pytest -q -n 2 -p no:cacheprovider tests/python/test_webgpu.py \
  -k "golden or unsupported or linalg or float64 or cuda_dialect"
echo "[sanitize] clean"
