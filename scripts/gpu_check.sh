#!/usr/bin/env bash
# The CUDA device check (docs/cuda.md, "The device check"): on a machine with an NVIDIA GPU and
# the CUDA toolkit, builds Chroma's compiler, runs every CUDA test natively and the CUDA
# benchmark, writing logs and the JSON report under $OUT (default build/gpu_check). Meant to
# finish in under 8 minutes on a 16-core machine.
#
# The device machines this project is lent have python3 with PyTorch, nanobind,
# scikit-build-core, CMake, ninja and pytest, and no network. Debian packages the build needs
# that such an image may lack (nlohmann-json3-dev, libssl-dev) travel as .deb files in
# .gpu_debs/: `scripts/gpu_check.sh --fetch-debs` downloads them here (apt-get download), and
# the run carries that folder.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fetch-debs" ]; then
  mkdir -p .gpu_debs && (cd .gpu_debs && apt-get download nlohmann-json3-dev libssl-dev)
  grep -qx '/.gpu_debs/' .git/info/exclude 2>/dev/null || echo '/.gpu_debs/' >> .git/info/exclude
  exit $?
fi
OUT="${OUT:-$PWD/build/gpu_check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
JOBS="$(nproc)"
t0=$(date +%s)
step() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }

step environment
{ nvidia-smi; nvcc --version; "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; } \
  > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

if ls .gpu_debs/*.deb >/dev/null 2>&1; then
  step "unpacking .gpu_debs"
  mkdir -p /tmp/debroot
  for f in .gpu_debs/*.deb; do dpkg -x "$f" /tmp/debroot; done
  lib=/tmp/debroot/usr/lib/x86_64-linux-gnu
  # libssl-dev's libcrypto.so is a relative link to libcrypto.so.3, which is the system's.
  [ -e "$lib/libcrypto.so" ] || ln -sf /usr/lib/x86_64-linux-gnu/libcrypto.so.3 "$lib/libcrypto.so"
  export CMAKE_PREFIX_PATH="/tmp/debroot/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export CPATH="/tmp/debroot/usr/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export OPENSSL_ROOT_DIR=/tmp/debroot/usr
fi

step "building the compiler"
export CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
if ! "$PY" -m pip install -q --no-build-isolation --no-deps --target /tmp/chroma-site . > "$OUT/build.log" 2>&1; then
  tail -60 "$OUT/build.log"
  echo "gpu_check: the build failed (log: $OUT/build.log)"
  exit 1
fi
cp /tmp/chroma-site/chroma/_compiler*.so python/chroma/  # the tests import python/chroma
export CHROMA_CACHE_DIR=/tmp/chroma-cache PYTHONUNBUFFERED=1
rc=0

step "test_cuda.py (native runtime, fatbins, emulator)"
"$PY" -m pytest tests/python/test_cuda.py -q -n 4 -rs -p no:cacheprovider 2>&1 | tee "$OUT/test_cuda.log" | tail -25
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

step "the op suite, compiled for CUDA and run natively"
# Only this GPU's architecture for the op suite's hundreds of small fatbins (test_cuda.py
# above built and checked every listed one).
cc="$("$PY" -c "import torch; a, b = torch.cuda.get_device_capability(); print(f'{a}{b}')" 2>/dev/null || echo 90)"
CHROMA_CUDA_ARCHS="$cc" CHROMA_TEST_TARGET=cuda-native timeout 330 "$PY" -m pytest tests/python -q -n "$JOBS" -p no:cacheprovider \
  2>&1 | tee "$OUT/op_suite.log" | tail -25
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

step "benchmark"
timeout 300 "$PY" bench/cuda_gpu.py --out "$OUT/cuda.json" 2>&1 | tee "$OUT/bench.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

step "done (rc $rc)"
exit $rc
