#!/usr/bin/env bash
# Runs the tests, in one of two tiers (docs/testing.md):
#
#   ./scripts/test.sh          the tier that guards every change (CI: .ci/run): the C++ unit
#                              tests, the JS WebGPU runtime's tests, the Python tests on the CPU
#                              target except those marked `full`, each GPU target's op suite on
#                              a sample that holds every kernel kind and dtype the whole suite
#                              does (checked after the run), the sanitizer subset and a bounded
#                              fuzz run
#   ./scripts/test.sh --full   everything: every Python test, each GPU target's whole op suite
#                              (recording what it covers into tests/python/gpu_coverage.json),
#                              the sanitizers, and the fuzzers three times as long; run it before an
#                              issue is called resolved
#
# Arguments after the tier go to every pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
FULL=0
if [ "${1:-}" = "--full" ]; then
  FULL=1
  shift
fi
./scripts/setup.sh
export CHROMA_CACHE_DIR="${CHROMA_CACHE_DIR:-$PWD/build/cache}"
export CHROMA_MODEL_CACHE_BYTES="${CHROMA_MODEL_CACHE_BYTES:-2147483648}"  # finished artifacts kept: 2 GiB
export CHROMA_VERIFY=1   # run the IR verifier after every pass
lap() { echo "[test] $1 ($(( $(date +%s) - T0 )) s so far)"; }
T0=$(date +%s)
# The C++ unit tests, built once, with -Werror and the sanitizers (scripts/sanitize.sh).
./scripts/sanitize.sh --cpp
lap "C++ unit tests (ASan + UBSan, -Werror)"
(cd web && npm test --silent)   # the JS WebGPU runtime, on Dawn + SwiftShader
lap "JS runtime"
if [ "$FULL" = 1 ]; then
  .venv/bin/python -m pytest tests/python -q -n 2 "$@"
else
  # The sanitizer subset's files (scripts/sanitize.sh --list) run there only: every test of
  # them, with the compiler and the generated code built with ASan + UBSan, the same
  # assertions with more checked. --full runs them here too.
  ignores=()
  for f in $(./scripts/sanitize.sh --list); do ignores+=("--ignore=$f"); done
  .venv/bin/python -m pytest tests/python -q -n 2 --dist worksteal -m "not full" "${ignores[@]}" "$@"
fi
lap "CPU suite"
# Every op on every backend: the shared op suite compiled for WebGPU (run on a software adapter,
# lavapipe) and for CUDA and Metal (run on the CPU SIMT emulator, docs/cuda.md); a case the
# target refuses is skipped with the target's own reason (conftest.py). The guarding tier runs a
# sample of each (below), chosen so that it still holds every kernel kind and dtype, and fails when a case
# the full tier's record ran is now refused (tests/python/gpu_coverage.py checks both).
for target in webgpu cuda metal; do
  cov="build/coverage/$target"
  rm -rf "$cov"
  if [ "$FULL" = 1 ]; then
    CHROMA_TEST_TARGET=$target CHROMA_COVERAGE_DIR="$cov" .venv/bin/python -m pytest tests/python -q -n 2 "$@"
    .venv/bin/python tests/python/gpu_coverage.py record "$cov" "$target"
  else
    # WebGPU a third (the real driver path, on lavapipe); CUDA a sixth on the SIMT emulator;
    # Metal, the same kernels as CUDA in another dialect on the same emulator, a twelfth. The
    # check after the run fails if a sample misses a kernel kind or dtype of the full record.
    case "$target" in webgpu) every=3 ;; cuda) every=6 ;; *) every=12 ;; esac
    CHROMA_TEST_TARGET=$target CHROMA_TEST_SAMPLE=$every CHROMA_COVERAGE_DIR="$cov" \
      .venv/bin/python -m pytest tests/python -q -n 2 "$@"
    .venv/bin/python tests/python/gpu_coverage.py check "$cov" "$target"
  fi
  lap "$target op suite"
done
# Hardening (docs/fuzzing.md): the ASan + UBSan build with a subset of the Python tests, and
# a bounded fuzz run of the graph-file, manifest and GPU package readers.
./scripts/sanitize.sh --python
lap "sanitizers (Python subset)"
./scripts/fuzz.sh $(( FULL ? 90 : 30 ))
lap "fuzzing"
