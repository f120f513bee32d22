// For hosts that load an artifact's library: OpenBLAS picks its kernels when it loads, and an
// OpenBLAS older than the CPU (Debian 12's 0.3.21 on Sapphire Rapids) silently falls back to
// generic SSE3 kernels. Call chroma::rt::configure_blas_env() before dlopen()ing the library
// (before anything loads libopenblas): unless OPENBLAS_CORETYPE is set already, it selects
// OpenBLAS's AVX-512 ("SkylakeX") or AVX2 ("Haswell") kernels when the CPU has them. The
// Python package does the same on import (chroma/cpuinfo.py); tools/chroma_run.cpp calls it.
// It also sets OMP_WAIT_POLICY=PASSIVE unless set (before libgomp loads).
#pragma once

#include <cstdlib>

namespace chroma::rt {

inline const char* configure_blas_env() {
  // oneDNN's OpenMP workers would otherwise spin after each convolution and take a core from
  // the program's own pool (chroma/cpuinfo.py has the measurement).
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  if (const char* set = std::getenv("OPENBLAS_CORETYPE"); set && *set) return set;
#if defined(__x86_64__)
  __builtin_cpu_init();
  const char* core = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd")) {
    core = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    core = "Haswell";
  }
  if (core) ::setenv("OPENBLAS_CORETYPE", core, 0);
  return core;
#else
  return nullptr;
#endif
}

}  // namespace chroma::rt
