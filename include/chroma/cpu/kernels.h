// Everything generated kernel files use, in one header: it is the first thing every
// kernels_NNN.cpp includes, so the build can precompile it once per compiler command (a GCC
// precompiled header in the build cache, src/artifact/build.cpp) instead of parsing the
// runtime library again for every file of every model.
#pragma once

#include <cstdint>
#include <limits>

#if __has_include(<cblas.h>)
#include <cblas.h>
#include "chroma/cpu/linalg.h"
#endif
#include "chroma/cpu/attention.h"
#include "chroma/cpu/conv.h"
#include "chroma/cpu/et.h"
#include "chroma/cpu/gemm_packed.h"
#include "chroma/cpu/gemm_quant.h"
#include "chroma/cpu/runtime.h"
#if defined(CHROMA_DNNL)
#include "chroma/cpu/sgemm.h"
#endif
#include "chroma/cpu/threads.h"
