#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a bounded time on
# a seed corpus made from the test models, then the Python GPU package reader's fuzzer for the
# same time. `.ci/run` calls it with the default budget.
#
#   ./scripts/fuzz.sh [SECONDS_PER_TARGET]     (default 90; docs/fuzzing.md has the long run)
#
# Fails if a target crashes, hangs (a run over 10 s), leaks an exception other than a clean
# error, or trips a sanitizer. New inputs found are kept in build/fuzz/corpus/.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET="${1:-90}"

. scripts/debs.sh
ensure_debs fuzz clang-14 libclang-rt-14-dev

# -O1 and line tables only, as for the ASan build (scripts/sanitize.sh): libFuzzer's own
# guidance, and less compile time than -O2 -g.
cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCHROMA_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++-14 >/dev/null
cmake --build build/fuzz -j 2 --target fuzz_graph fuzz_manifest

CORPUS=build/fuzz/corpus
if [ ! -d "$CORPUS/graph" ]; then
  .venv/bin/python tests/fuzz/make_corpus.py "$CORPUS.seed"
  mv "$CORPUS.seed" "$CORPUS"
fi
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

# One fuzzer; its report goes to build/fuzz/<name>.report, its verdict to its exit status.
fuzz_native() {
  local t=$1 rc=0
  mkdir -p "build/fuzz/artifacts/$t"
  ./build/fuzz/fuzz_$t "$CORPUS/$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=3072 \
    -max_len=65536 -dict="tests/fuzz/$t.dict" -artifact_prefix="build/fuzz/artifacts/$t/" -print_final_stats=1 >"build/fuzz/$t.log" 2>&1 || rc=$?
  grep -E "^(Done|stat::number_of_executed_units|fuzz_graph:|==[0-9]+==ERROR|SUMMARY)|crash-|timeout-|leak-" \
    "build/fuzz/$t.log" || true
  if [ "$rc" -ne 0 ]; then
    tail -n 60 "build/fuzz/$t.log"
    echo "[fuzz] fuzz_$t failed (exit $rc): build/fuzz/$t.log, inputs in build/fuzz/artifacts/$t/"
    return 1
  fi
  if [ -n "$(ls -A "build/fuzz/artifacts/$t")" ]; then
    echo "[fuzz] fuzz_$t found failing inputs: build/fuzz/artifacts/$t/"
    return 1
  fi
}
# The Python GPU package reader (chroma.runtime.package), mutating the test writer's packages;
# what it accepts also runs on lavapipe (tests/fuzz/fuzz_package.py).
fuzz_package() {
  mkdir -p build/fuzz/artifacts/package
  .venv/bin/python tests/fuzz/fuzz_package.py "$SECONDS_PER_TARGET" build/fuzz/artifacts/package
}

# The three run side by side: each is bounded by time, not by work, and each is one process,
# so one after another they left a core idle for the whole budget. Reports in a fixed order.
names=(graph manifest package)
echo "[fuzz] fuzz_graph, fuzz_manifest and fuzz_package for ${SECONDS_PER_TARGET}s each, side by side"
pids=()
for t in "${names[@]}"; do
  if [ "$t" = package ]; then fuzz_package >"build/fuzz/$t.report" 2>&1 & else fuzz_native "$t" >"build/fuzz/$t.report" 2>&1 & fi
  pids+=($!)
done
failed=0
for i in "${!names[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  echo "[fuzz] fuzz_${names[$i]}:"
  sed 's/^/  /' "build/fuzz/${names[$i]}.report"
  [ "$rc" -eq 0 ] || failed=1
done
if [ "$failed" -ne 0 ]; then
  echo "[fuzz] failed (above)" >&2
  exit 1
fi
echo "[fuzz] clean"
