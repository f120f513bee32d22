// The Metal target's host runtime: compiled into each Metal artifact's host library together
// with the artifact's kernels (the MSL text of kernels.metal, embedded), on macOS against
// Apple's metal-cpp headers and the Metal and Foundation frameworks (docs/cuda.md, "Metal").
//
// The generated source that includes this header defines the metal-cpp implementation macros
// (NS_PRIVATE_IMPLEMENTATION, MTL_PRIVATE_IMPLEMENTATION) in this one translation unit, and
// chroma_metal_source: the kernels' text, NUL-terminated. At open the runtime compiles that
// text with fast math off (the kernels spell every transcendental metal::precise:: anyway) and
// makes one compute pipeline per kernel (chroma_k<i>_main). The kernels assume 32-lane SIMD
// groups (simd_sum and the like over one row), which every Apple GPU has: a pipeline whose
// thread execution width is not 32 is refused at load, never run to a wrong answer.
//
// The schedule is the GPU package's (docs/webgpu_package.md), as for CUDA (include/chroma/cuda/
// host.h, same C ABI, python/chroma/runtime/native.py drives both): the caller creates the buffers (the
// arena with its status block, the state, the weights shards; shared storage, which Apple
// silicon's unified memory reads in place), then appends each dispatch: a kernel, its grid, the
// buffers of its storage slots (kernel argument [[buffer(s + 1)]]) and its parameter words
// (the `constant Params&` at [[buffer(0)]], passed with setBytes; a kernel without parameters
// has its slots from [[buffer(0)]]). A call copies the inputs
// into the arena, clears the status block, encodes every dispatch in order into one compute
// encoder of one command buffer (serial dispatch: each dispatch sees the writes of those before
// it), commits it, waits, and copies the status block and the outputs back.
//
// Every entry point returns 0 on success; on failure it returns nonzero and writes one line
// that names the Metal call and its error into `err` (`errlen` bytes, NUL-terminated). Calls on
// one handle must not overlap (the Python layer holds a lock).
#pragma once

#include <Foundation/Foundation.hpp>
#include <Metal/Metal.hpp>

#include "chroma/gpu/host_abi.h"
#include "chroma/gpu/host_core.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// The artifact's kernels (the text of kernels.metal), NUL-terminated, defined by the generated
// source that includes this header.
extern "C" const char chroma_metal_source[];

namespace chroma::metal_host {

using gpu_host::say;

// An NSError's description (or "no error object").
inline std::string describe(const NS::Error* e) {
  if (e == nullptr) return "no error object";
  const NS::String* s = e->localizedDescription();
  const char* c = s != nullptr ? s->utf8String() : nullptr;
  return c != nullptr ? c : "an error without a description";
}

// Objects autoreleased while it lives (command buffers, encoders, strings, errors) are
// released when it goes.
class Pool {
 public:
  Pool() : p_(NS::AutoreleasePool::alloc()->init()) {}
  ~Pool() { p_->release(); }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

 private:
  NS::AutoreleasePool* p_;
};

constexpr unsigned kSimdWidth = 32;       // what the kernels' SIMD-group reductions assume
constexpr size_t kMaxSetBytes = 4096;     // Metal's limit for setBytes

// The shared replay core (include/chroma/gpu/host_core.h) over Metal's handles: a dispatch's
// slots are [[buffer(s + 1)]] ([[buffer(s)]] for a kernel without parameters), its parameter
// words [[buffer(0)]], passed with setBytes.
struct NoExtra {};
using Core = gpu_host::Core<MTL::Buffer*, MTL::ComputePipelineState*, NoExtra>;

struct Runtime {
  MTL::Device* device = nullptr;
  MTL::CommandQueue* queue = nullptr;
  MTL::Library* library = nullptr;
  std::string name;
  Core core;
  std::vector<MTL::Function*> functions;

  ~Runtime() {
    for (auto* p : core.kernels) p->release();
    for (auto* f : functions) f->release();
    for (auto* b : core.buffers) b->release();
    if (library != nullptr) library->release();
    if (queue != nullptr) queue->release();
    if (device != nullptr) device->release();
  }
};

inline NS::String* text(const char* s) { return NS::String::string(s, NS::UTF8StringEncoding); }

}  // namespace chroma::metal_host

extern "C" {

// Opens the system's default Metal device (`ordinal` must be 0: Chroma runs on the default
// GPU), compiles the embedded kernels and makes the command queue. Returns the handle, or null
// with the reason in `err`.
__attribute__((visibility("default"))) void* chroma_metal_open(int ordinal, char* err, size_t errlen) {
  using namespace chroma::metal_host;
  if (ordinal != 0) {
    say(err, errlen, "Metal device %d requested: the Metal runtime uses the system's default device (0)", ordinal);
    return nullptr;
  }
  Pool pool;
  auto* rt = new Runtime;
  rt->device = MTL::CreateSystemDefaultDevice();
  if (rt->device == nullptr) {
    say(err, errlen, "MTLCreateSystemDefaultDevice returned no device: this machine has no Metal GPU");
    delete rt;
    return nullptr;
  }
  const NS::String* n = rt->device->name();
  rt->name = n != nullptr && n->utf8String() != nullptr ? n->utf8String() : "a Metal GPU";
  rt->queue = rt->device->newCommandQueue();
  if (rt->queue == nullptr) {
    say(err, errlen, "newCommandQueue failed on %s", rt->name.c_str());
    delete rt;
    return nullptr;
  }
  MTL::CompileOptions* opt = MTL::CompileOptions::alloc()->init();
  opt->setFastMathEnabled(false);
  NS::Error* e = nullptr;
  rt->library = rt->device->newLibrary(text(chroma_metal_source), opt, &e);
  opt->release();
  if (rt->library == nullptr) {
    say(err, errlen, "newLibrary (compiling the artifact's kernels.metal on %s) failed: %s", rt->name.c_str(), describe(e).c_str());
    delete rt;
    return nullptr;
  }
  return rt;
}

// "name|unified memory (0/1)|max buffer bytes|recommended working set bytes"
__attribute__((visibility("default"))) int chroma_metal_info(void* h, char* out, size_t n) {
  auto* rt = static_cast<chroma::metal_host::Runtime*>(h);
  chroma::metal_host::say(out, n, "%s|%d|%llu|%llu", rt->name.c_str(), rt->device->hasUnifiedMemory() ? 1 : 0,
                          static_cast<unsigned long long>(rt->device->maxBufferLength()),
                          static_cast<unsigned long long>(rt->device->recommendedMaxWorkingSetSize()));
  return 0;
}

// Allocates buffer number `buffers.size()` of `bytes` (at least 4), zero-filled unless `init`
// (then its first `init_bytes` bytes are copied in). Returns its number in *id.
__attribute__((visibility("default"))) int chroma_metal_buffer(void* h, uint64_t bytes, const void* init, uint64_t init_bytes,
                                                               int* id, char* err, size_t errlen) {
  using namespace chroma::metal_host;
  auto* rt = static_cast<Runtime*>(h);
  if (init_bytes > bytes) {
    say(err, errlen, "buffer of %llu bytes initialized with %llu", (unsigned long long)bytes, (unsigned long long)init_bytes);
    return 1;
  }
  const uint64_t n = bytes < 4 ? 4 : bytes;
  if (n > rt->device->maxBufferLength()) {
    say(err, errlen, "a buffer of %llu bytes is larger than %s allows in one buffer (%llu)", (unsigned long long)n,
        rt->name.c_str(), static_cast<unsigned long long>(rt->device->maxBufferLength()));
    return 1;
  }
  MTL::Buffer* b = rt->device->newBuffer(static_cast<NS::UInteger>(n), MTL::ResourceStorageModeShared);
  if (b == nullptr) {
    say(err, errlen, "newBuffer of %llu bytes failed on %s (out of memory?)", (unsigned long long)n, rt->name.c_str());
    return 1;
  }
  std::memset(b->contents(), 0, static_cast<size_t>(n));
  if (init != nullptr && init_bytes) std::memcpy(b->contents(), init, static_cast<size_t>(init_bytes));
  *id = rt->core.add_buffer(b, n);
  return 0;
}

// Copies `n` host bytes into buffer `id` at `offset` (state initialization).
__attribute__((visibility("default"))) int chroma_metal_upload(void* h, int id, uint64_t offset, const void* src, uint64_t n,
                                                               char* err, size_t errlen) {
  auto* rt = static_cast<chroma::metal_host::Runtime*>(h);
  if (!rt->core.check_upload(id, offset, n, err, errlen)) return 1;
  std::memcpy(static_cast<char*>(rt->core.buffers[static_cast<size_t>(id)]->contents()) + offset, src, static_cast<size_t>(n));
  return 0;
}

// Makes the pipeline of kernel `index` (chroma_k<index>_main) for `threads` threads per
// threadgroup.
__attribute__((visibility("default"))) int chroma_metal_kernel(void* h, int index, unsigned threads, char* err, size_t errlen) {
  using namespace chroma::metal_host;
  auto* rt = static_cast<Runtime*>(h);
  if (!rt->core.check_kernel_order(index, err, errlen)) return 1;
  Pool pool;
  char name[64];
  std::snprintf(name, sizeof name, "chroma_k%d_main", index);
  MTL::Function* fn = rt->library->newFunction(text(name));
  if (fn == nullptr) {
    say(err, errlen, "the artifact's kernels.metal has no kernel %s", name);
    return 1;
  }
  rt->functions.push_back(fn);
  NS::Error* e = nullptr;
  MTL::ComputePipelineState* p = rt->device->newComputePipelineState(fn, &e);
  if (p == nullptr) {
    say(err, errlen, "newComputePipelineState (%s) failed on %s: %s", name, rt->name.c_str(), describe(e).c_str());
    return 1;
  }
  rt->core.add_kernel(p, threads);
  if (p->maxTotalThreadsPerThreadgroup() < threads) {
    say(err, errlen, "kernel %s runs %u threads per threadgroup; its pipeline on %s allows %llu", name, threads,
        rt->name.c_str(), static_cast<unsigned long long>(p->maxTotalThreadsPerThreadgroup()));
    return 1;
  }
  if (p->threadExecutionWidth() != kSimdWidth) {
    say(err, errlen, "kernel %s: %s runs SIMD groups of %llu threads; Chroma's Metal kernels assume %u (Apple GPUs)", name,
        rt->name.c_str(), static_cast<unsigned long long>(p->threadExecutionWidth()), kSimdWidth);
    return 1;
  }
  return 0;
}

// Adds an entry point with an empty schedule; returns its number (0, 1, ...).
__attribute__((visibility("default"))) int chroma_metal_entry(void* h) {
  return static_cast<chroma::metal_host::Runtime*>(h)->core.add_entry();
}

// Appends a dispatch to entry point `entry`'s schedule: kernel `kernel` on a gx x gy grid of
// threadgroups, storage slot s bound to buffer slot_buffers[s], then `nparams` parameter words.
__attribute__((visibility("default"))) int chroma_metal_dispatch(void* h, int entry, int kernel, unsigned gx, unsigned gy,
                                                                 int nslots, const int* slot_buffers, int nparams,
                                                                 const unsigned* params, char* err, size_t errlen) {
  using namespace chroma::metal_host;
  auto* rt = static_cast<Runtime*>(h);
  if (nparams < 0 || static_cast<size_t>(nparams) * 4 > kMaxSetBytes) {
    say(err, errlen, "a dispatch of %d parameter words: more than setBytes takes (%zu bytes)", nparams, kMaxSetBytes);
    return 1;
  }
  return rt->core.append(entry, kernel, gx, gy, nslots, slot_buffers, nparams, params, err, errlen) ? 0 : 1;
}

// Runs entry point `entry` once: inputs i (in_bytes[i] bytes at in_src[i]) into the arena at
// in_offset[i], the status block cleared, every dispatch in one command buffer, then the status
// block and outputs i back to out_dst[i]. The signature is the CUDA runtime's (chroma_cuda_run):
// device inputs and outputs and `graph` have no Metal counterpart and are refused.
__attribute__((visibility("default"))) int chroma_metal_run(void* h, const ChromaGpuCall* call, char* err, size_t errlen) {
  using namespace chroma::metal_host;
  auto* rt = static_cast<Runtime*>(h);
  if (!rt->core.check_call(*call, /*device_io=*/false, err, errlen)) return 1;
  if (call->graph) {
    say(err, errlen, "the Metal runtime has no graph mode (one command buffer per call already)");
    return 1;
  }
  const int n_in = call->n_in, n_out = call->n_out;
  const uint64_t *in_offset = call->in_offset, *in_src = call->in_src, *in_bytes = call->in_bytes;
  const uint64_t *out_offset = call->out_offset, *out_dst = call->out_dst, *out_bytes = call->out_bytes;
  const uint64_t status_offset = call->status_offset, status_bytes = call->status_bytes;
  char* base = static_cast<char*>(rt->core.buffers[0]->contents());
  for (int i = 0; i < n_in; ++i) {
    if (in_bytes[i]) std::memcpy(base + in_offset[i], reinterpret_cast<const void*>(in_src[i]), static_cast<size_t>(in_bytes[i]));
  }
  std::memset(base + status_offset, 0, static_cast<size_t>(status_bytes));
  {
    Pool pool;
    MTL::CommandBuffer* cb = rt->queue->commandBuffer();
    if (cb == nullptr) {
      say(err, errlen, "commandBuffer failed on %s", rt->name.c_str());
      return 1;
    }
    MTL::ComputeCommandEncoder* enc = cb->computeCommandEncoder();
    if (enc == nullptr) {
      say(err, errlen, "computeCommandEncoder failed on %s", rt->name.c_str());
      return 1;
    }
    for (const Core::Dispatch& d : rt->core.entries[static_cast<size_t>(call->entry)]) {
      if (!d.gx || !d.gy) continue;
      enc->setComputePipelineState(d.fn);
      // The MSL printer's layout: the parameters at [[buffer(0)]] when the kernel has any (then
      // every dispatch of it carries its words), the storage slots after them.
      const size_t first = d.params.empty() ? 0 : 1;
      for (size_t s = 0; s < d.slots.size(); ++s) enc->setBuffer(d.slots[s], 0, static_cast<NS::UInteger>(first + s));
      if (!d.params.empty()) enc->setBytes(d.params.data(), static_cast<NS::UInteger>(d.params.size() * 4), 0);
      enc->dispatchThreadgroups(MTL::Size(d.gx, d.gy, 1), MTL::Size(d.threads, 1, 1));
    }
    enc->endEncoding();
    cb->commit();
    cb->waitUntilCompleted();
    if (cb->status() != MTL::CommandBufferStatusCompleted) {
      say(err, errlen, "the command buffer failed on %s (status %d): %s", rt->name.c_str(), static_cast<int>(cb->status()),
          describe(cb->error()).c_str());
      return 1;
    }
  }
  std::memcpy(call->status, base + status_offset, static_cast<size_t>(status_bytes));
  for (int i = 0; i < n_out; ++i) {
    if (out_bytes[i]) std::memcpy(reinterpret_cast<void*>(out_dst[i]), base + out_offset[i], static_cast<size_t>(out_bytes[i]));
  }
  return 0;
}

__attribute__((visibility("default"))) void chroma_metal_close(void* h) {
  chroma::metal_host::Pool pool;
  delete static_cast<chroma::metal_host::Runtime*>(h);
}

}  // extern "C"

CHROMA_GPU_CALL_LAYOUT(metal)
