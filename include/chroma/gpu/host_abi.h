// The C ABI a GPU artifact's host library exports for what every GPU runtime does (the CUDA
// host, include/chroma/cuda/host.h; the Metal host, include/chroma/metal/host.h), as far as
// their calls share a shape: one call of an entry point is one struct, `ChromaGpuCall`, which
// python/chroma/runtime/native.py mirrors with ctypes (its field offsets are checked against
// chroma_gpu_call_layout() when a library is loaded).
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// One call of entry point `entry`: inputs i (in_bytes[i] bytes from in_src[i]: a host address,
// or a device address where in_device[i]) into the arena at in_offset[i]; the status block
// (status_bytes at status_offset in the arena) cleared before the kernels and copied to `status`
// after them; outputs i (out_bytes[i] at out_offset[i]) to out_dst[i] (a device address where
// out_device[i]). `graph`: CUDA only, launch the kernels as one CUDA graph.
struct ChromaGpuCall {
  int32_t entry;
  int32_t n_in;
  const uint64_t* in_offset;
  const uint64_t* in_src;
  const uint64_t* in_bytes;
  const int32_t* in_device;
  int32_t n_out;
  int32_t graph;
  const uint64_t* out_offset;
  const uint64_t* out_dst;
  const uint64_t* out_bytes;
  const int32_t* out_device;
  uint64_t status_offset;
  void* status;
  uint64_t status_bytes;
};

}  // extern "C"

// The struct's size and each field's offset, in declaration order: what a loader compares with
// its own idea of the layout before the first call.
#define CHROMA_GPU_CALL_LAYOUT(api)                                                                         \
  extern "C" __attribute__((visibility("default"))) int chroma_##api##_call_layout(uint64_t* out, int n) { \
    const uint64_t layout[] = {sizeof(ChromaGpuCall),                                                      \
                               offsetof(ChromaGpuCall, entry),        offsetof(ChromaGpuCall, n_in),       \
                               offsetof(ChromaGpuCall, in_offset),    offsetof(ChromaGpuCall, in_src),     \
                               offsetof(ChromaGpuCall, in_bytes),     offsetof(ChromaGpuCall, in_device),  \
                               offsetof(ChromaGpuCall, n_out),        offsetof(ChromaGpuCall, graph),      \
                               offsetof(ChromaGpuCall, out_offset),   offsetof(ChromaGpuCall, out_dst),    \
                               offsetof(ChromaGpuCall, out_bytes),    offsetof(ChromaGpuCall, out_device), \
                               offsetof(ChromaGpuCall, status_offset), offsetof(ChromaGpuCall, status),    \
                               offsetof(ChromaGpuCall, status_bytes)};                                     \
    const int count = static_cast<int>(sizeof layout / sizeof layout[0]);                                  \
    for (int i = 0; i < n && i < count; ++i) out[i] = layout[i];                                           \
    return count;                                                                                          \
  }
