// Runtime types shared by generated kernels and the program entry points
// (chroma/cpu/program_main.h).
#pragma once

#include <cstdint>

#include "chroma/cpu/threads.h"

namespace chroma::rt {

struct IoSpec {
  const char* name;
  const char* dtype;
  int rank;
  int64_t shape[8];
  int64_t nbytes;
};

struct KernelInfo {
  const char* label;   // "Gather <- ..." 
  const char* node;    // IR node name
  const char* source;  // user's source line
  int64_t dim_size;    // Gather: size of the indexed dimension
  int axis;
};

// Everything a kernel addresses: user buffers, the weights mapping, the arena.
struct Ctx {
  const void* const* in;
  void* const* out;
  const uint8_t* weights;
  uint8_t* arena;
  ThreadPool* pool = nullptr;  // null or one thread: run everything on the caller
  // Set by a kernel that fails (returns non-zero).
  int err_kernel = -1;
  int64_t err_value = 0;
  int index_error(int kernel, int64_t value) {
    err_kernel = kernel;
    err_value = value;
    return 2;
  }
};

}  // namespace chroma::rt
