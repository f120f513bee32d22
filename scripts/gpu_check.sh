#!/usr/bin/env bash
# The CUDA device check (docs/cuda.md, "The device check"): on a machine with an NVIDIA GPU and
# the CUDA toolkit, builds Chroma's compiler, runs the tests that need the GPU, the CUDA
# benchmark and the op suite compiled for CUDA and run natively, writing logs and the JSON
# report under $OUT (default build/gpu_check).
#
# A session is lent such a machine for a few minutes at most, in one try, so the script works to
# a deadline: BUDGET seconds (default 500) from its start. The stages run in order of value and
# each gets what is left, so whatever ran comes back: the build, a smoke test (stops the run
# if the extension cannot compile and run one model), the native runtime's own tests
# (test_cuda.py's GPU cases), the benchmark (its JSON is rewritten after every system), then
# the op suite (one line per test in the log, so a cut-off run still says what passed).
# A machine started in about 30 s on this project's first runs; the whole default run fits
# one lease of 15 minutes with room to spare, not two.
#
# The device machines this project is lent have python3 with PyTorch, CMake, ninja and pytest,
# and no network. What the build needs beyond that travels in .gpu_deps/:
# `scripts/gpu_check.sh --fetch-deps` downloads it here (Debian's nlohmann-json3-dev,
# libssl-dev and OpenBLAS as .deb files, nanobind's wheel), and the run carries that folder:
#   run(command="scripts/gpu_check.sh", carry=[".gpu_deps"], timeout_s=560)
set -uo pipefail
cd "$(dirname "$0")/.."
DEBS="nlohmann-json3-dev libssl-dev libopenblas0-pthread libopenblas-pthread-dev libgfortran5 libquadmath0"
if [ "${1:-}" = "--fetch-deps" ]; then
  rm -rf .gpu_deps && mkdir -p .gpu_deps || exit 1
  (cd .gpu_deps && apt-get download $DEBS) || exit 1
  python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu_deps nanobind==3.1.0 || exit 1
  grep -qx '/.gpu_deps/' .git/info/exclude 2>/dev/null || echo '/.gpu_deps/' >> .git/info/exclude
  ls -la .gpu_deps
  exit 0
fi
OUT="${OUT:-$PWD/build/gpu_check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
JOBS="$(nproc)"
t0=$(date +%s)
BUDGET="${BUDGET:-500}"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
elapsed() { echo $(( $(date +%s) - t0 )); }
left() { echo $(( BUDGET - $(elapsed) )); }
step() { echo "== $1 ($(elapsed) s)" | tee -a "$SUMMARY"; }
note() { echo "   $1" | tee -a "$SUMMARY"; }
# run_for CAP LOG CMD...: runs CMD with at most min(CAP, time left - 15 s), output to LOG
run_for() {
  local cap=$1 log=$2; shift 2
  local t=$(( $(left) - 15 )); [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt 20 ]; then note "skipped: $(left) s left"; return 124; fi
  note "time limit ${t} s"
  timeout -s INT -k 15 "$t" "$@" > "$OUT/$log" 2>&1
  local rc=$?
  tail -30 "$OUT/$log"
  note "rc $rc$([ $rc = 124 ] && echo ' (time limit)')"
  return $rc
}

step environment
{ nvidia-smi; nvcc --version; "$PY" --version; g++ --version | head -1; cmake --version | head -1
  "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(), torch.cuda.get_device_capability())"
  ldconfig -p | grep -E 'libopenblas|libgfortran|libcrypto|libstdc\+\+|libcuda\.|libcublas\.'
  for c in ${CXX:-} g++; do echo "$c: $("$c" --version | head -1); finds $("$c" -print-file-name=libstdc++.so)"; done
  env | grep -E '^(CC|CXX|CFLAGS|CXXFLAGS|CPPFLAGS|LDFLAGS|LIBRARY_PATH|LD_LIBRARY_PATH|CPATH)=' ; } > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

step "dependencies (.gpu_deps)"
# Packages are unpacked under /tmp/debroot, never over /. Debian's OpenBLAS installs its
# libraries under openblas-pthread/ and links them into place with update-alternatives, which
# dpkg -x does not run: the links are made here. The system's own copy of a library wins where
# it has one (libgfortran, libcrypto); OpenBLAS is Debian's either way.
DEPLIB=/tmp/deplib
LINK_FLAGS=""
mkdir -p "$DEPLIB"
if ls .gpu_deps/*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/debroot
  for f in .gpu_deps/*.deb; do dpkg -x "$f" /tmp/debroot || note "dpkg -x $f failed"; done
  lib=/tmp/debroot/usr/lib/x86_64-linux-gnu
  ob=$lib/openblas-pthread
  for so in libopenblas.so libopenblas.so.0; do ln -sf "$ob/$so" "$lib/$so"; ln -sf "$ob/$so" "$DEPLIB/$so"; done
  for so in libgfortran.so.5 libquadmath.so.0; do
    ldconfig -p | grep -q "$so " || ln -sf "$lib/$so" "$DEPLIB/$so"
  done
  # libssl-dev's libcrypto.so is a relative link to libcrypto.so.3, which is the system's.
  sysc=$(ldconfig -p | awk '/libcrypto\.so\.3 .*x86-64/ {print $NF; exit}')
  [ -n "$sysc" ] && ln -sf "$sysc" "$lib/libcrypto.so"
  export CMAKE_PREFIX_PATH="/tmp/debroot/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export CPATH="/tmp/debroot/usr/include:/tmp/debroot/usr/include/x86_64-linux-gnu:/tmp/debroot/usr/include/x86_64-linux-gnu/openblas-pthread${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export OPENSSL_ROOT_DIR=/tmp/debroot/usr
fi
export LD_LIBRARY_PATH="$DEPLIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# libstdc++ must be linked as the shared library the process already has. An extension that
# carries its own static copy shares some of its symbols with the process's copy and not others,
# and crashes at its first stream output: the first device run's did, built by the image's
# CXX=/opt/gcc/bin/g++, which links libstdc++ statically. So the compiler (CMake's, and the one
# Chroma runs on generated code, both read $CXX) is the first of $CXX, g++ that links it as a
# shared library; where g++ finds only libstdc++.a, the system's libstdc++.so.6 is put first
# on its library path.
links_shared() {
  printf '#include <string>\nstd::string f(int i) { return std::to_string(i); }\n' |
    "$1" -x c++ -shared -fPIC -o /tmp/probe.so - 2>/dev/null && readelf -d /tmp/probe.so | grep -q 'NEEDED.*libstdc++'
}
if [ -n "${CXX:-}" ] && ! links_shared "$CXX"; then
  note "CXX=$CXX links libstdc++ statically: using g++ ($(command -v g++))"
  export CXX=g++ CC=gcc
fi
if ! links_shared "${CXX:-g++}"; then
  sys_cxx=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
  if [ -n "$sys_cxx" ] && ln -sf "$sys_cxx" "$DEPLIB/libstdc++.so"; then
    # -L, not LIBRARY_PATH: g++ searches its own directory (which holds libstdc++.a) before
    # LIBRARY_PATH. Chroma's own builds of generated code get it through CHROMA_EXTRA_CXXFLAGS.
    LINK_FLAGS="-L$DEPLIB"
    export CHROMA_EXTRA_CXXFLAGS="-L$DEPLIB${CHROMA_EXTRA_CXXFLAGS:+ $CHROMA_EXTRA_CXXFLAGS}"
    note "${CXX:-g++} finds no libstdc++.so: linking $sys_cxx through -L$DEPLIB"
  fi
fi
unset CFLAGS CXXFLAGS CPPFLAGS LDFLAGS
if ls .gpu_deps/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu-site .gpu_deps/*.whl || note "wheels failed"
  export PYTHONPATH="/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}"
fi
note "nanobind $("$PY" -c 'import nanobind; print(nanobind.__version__)' 2>&1)"

step "building the compiler"
BUILD=/tmp/chroma-build
if ! run_for 300 build.log bash -c "cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHROMA_BUILD_PYTHON=ON \
      -DCMAKE_MODULE_LINKER_FLAGS='$LINK_FLAGS' -DPython_EXECUTABLE=$(command -v "$PY") && ninja -C $BUILD -j $JOBS _compiler"; then
  grep -m 20 -E 'error|Error|CMake Error' "$OUT/build.log"
  step "the build failed (log: build.log)"
  exit 1
fi
ninja -C $BUILD -t commands _compiler | tail -1 >> "$OUT/build.log"  # the link command
if ! readelf -d "$BUILD"/_compiler*.so | grep -q 'NEEDED.*libstdc++'; then
  # libstdc++ went in statically all the same: keep that copy's symbols to the extension
  note "libstdc++ is linked statically: relinking with --exclude-libs,ALL"
  cmake -S . -B $BUILD -DCMAKE_MODULE_LINKER_FLAGS="$LINK_FLAGS -Wl,--exclude-libs,ALL" >> "$OUT/build.log" 2>&1
  ninja -C $BUILD -j $JOBS _compiler >> "$OUT/build.log" 2>&1 || note "relink failed"
fi
cp "$BUILD"/_compiler*.so python/chroma/  # the tests and the benchmark import python/chroma
export CHROMA_CACHE_DIR=/tmp/chroma-cache PYTHONUNBUFFERED=1
note "extension needs: $(readelf -d python/chroma/_compiler*.so | grep -o 'NEEDED.*' | grep -o '\[.*\]' | tr '\n' ' ')"

step "smoke test: one CPU and one CUDA compile"
if ! CHROMA_CUDA_ARCHS=90 run_for 60 smoke.log "$PY" -X faulthandler -c "
import sys, numpy as np, torch
sys.path.insert(0, 'python')
import chroma
x = torch.randn(4, 8)
for t in ('cpu', 'cuda'):
    p = chroma.compile(lambda x: x.exp() + 1, (x,), target=t, out='/tmp/smoke-' + t)
    q = chroma.load('/tmp/smoke-' + t)
    print(t, type(q).__name__, float(np.abs(q(x.numpy()) - (x.exp() + 1).numpy()).max()))
"; then
  step "the smoke test failed: nothing else would run (log: smoke.log)"
  cat "$SUMMARY"
  exit 1
fi
rc=0
TO=""; "$PY" -c "import pytest_timeout" 2>/dev/null && TO="--timeout 120"  # one hung test must not hold a worker

step "test_cuda.py: the cases that also run natively (runtime, CUDA graphs, TF32, decoder, cuBLAS, weight formats, split K, scans)"
# every listed architecture here: the tests check the fatbin holds them all
run_for 100 gpu_tests.log "$PY" -m pytest tests/python/test_cuda.py -v -n 16 -rfE -p no:cacheprovider $TO \
  -k "(native_runtime or tf32 or kv_cache or library_gemm or bfloat16_weights or grouped_weights or normalizations or split_k or scans) and not metal and not webgpu" || rc=1

# Only this GPU's architecture for the fatbins built from here on (CI builds and checks every listed one).
cc="$("$PY" -c "import torch; a, b = torch.cuda.get_device_capability(); print(f'{a}{b}')" 2>/dev/null || echo 90)"
export CHROMA_CUDA_ARCHS="$cc"

step "benchmark (bench/cuda_gpu.py)"
run_for 240 bench.log "$PY" bench/cuda_gpu.py --out "$OUT/cuda.json" --calls 30 --warmup 5 --weights "${BENCH_WEIGHTS:-fp32,fp32-nosplit,bf16,q4}" || rc=1

step "the op suite, compiled for CUDA and run natively"
CHROMA_TEST_TARGET=cuda-native run_for 600 op_suite.log "$PY" -m pytest tests/python -v -n "$JOBS" -p no:cacheprovider \
  $TO -rf --continue-on-collection-errors || rc=1
note "op suite: $(grep -c ' PASSED' "$OUT/op_suite.log") passed, $(grep -c ' FAILED' "$OUT/op_suite.log") failed, $(grep -c ' SKIPPED' "$OUT/op_suite.log") skipped"

step "done (rc $rc)"
echo; cat "$SUMMARY"
exit $rc
