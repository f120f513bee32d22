// Runtime types shared by generated kernels and the program entry points
// (chroma/cpu/program_main.h).
#pragma once

#include <cstdint>

#include "chroma/chroma.h"

namespace chroma::rt {

class ThreadPool;  // chroma/cpu/threads.h (kept out of here: the tables file needs only the types)

using IoSpec = ::chroma_tensor_spec;  // name, dtype, rank, shape[8], nbytes

struct KernelInfo {
  const char* label;   // "Gather <- ..." 
  const char* node;    // IR node name
  const char* source;  // user's source line
  int64_t dim_size;    // Gather: size of the indexed dimension
  int axis;
};

// Everything a kernel addresses: user buffers, the weights mapping, the arena, the state.
struct Ctx {
  const void* const* in;
  void* const* out;
  const uint8_t* weights;
  uint8_t* arena;
  uint8_t* state = nullptr;    // persistent state region (KV caches), shared by all entries
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

using KernelFn = int (*)(Ctx&);

// One entry point of an artifact (forward; or prefill and step): its signature and kernels.
struct EntryInfo {
  const char* name;
  int num_inputs;
  const IoSpec* inputs;
  int num_outputs;
  const IoSpec* outputs;
  int num_kernels;
  const KernelInfo* kernels;
  const KernelFn* fns;
  int64_t arena_bytes;
};

// A persistent state tensor: `nbytes` at `offset` in the state region, initialized from
// the weights file at `init_offset`.
struct StateInfo {
  const char* name;
  int64_t nbytes;
  int64_t offset;
  int64_t init_offset;
};

}  // namespace chroma::rt
