// A stand-in for Apple's metal-cpp Metal header, for testing the Metal host runtime
// (include/chroma/metal/host.h) on machines without Metal (tests/python/test_metal_host.py).
// Only what the runtime calls, with metal-cpp's signatures (metal-cpp for macOS 14.2). The
// "GPU" is the artifact's CPU SIMT emulator library, named by $CHROMA_METAL_FAKE_KERNELS:
// newLibrary keeps the source it is handed, and newFunction finds in it each kernel the
// runtime asks for (declared as itself or through the translation unit's #define chroma_main),
// and a committed command buffer runs its dispatches through chroma_simt_launch with the
// buffers bound at [[buffer(1)]]... as the storage slots and the bytes at [[buffer(0)]] as the
// parameters. What a real device would refuse, it refuses: fast math left on, a dispatch with
// no pipeline or with a hole in its bindings, setBytes over 4 KB, more threads than the
// pipeline allows, commit before endEncoding, a zero-length buffer. New buffers hold garbage
// (Metal does not promise zeros). $CHROMA_METAL_FAKE_SIMD_WIDTH and
// $CHROMA_METAL_FAKE_NO_DEVICE stand for GPUs the runtime must refuse.
#pragma once

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "Foundation/Foundation.hpp"

namespace MTL {

enum ResourceOptions : NS::UInteger { ResourceCPUCacheModeDefaultCache = 0, ResourceStorageModeShared = 0 };

enum CommandBufferStatus : NS::UInteger {
  CommandBufferStatusNotEnqueued = 0,
  CommandBufferStatusEnqueued = 1,
  CommandBufferStatusCommitted = 2,
  CommandBufferStatusScheduled = 3,
  CommandBufferStatusCompleted = 4,
  CommandBufferStatusError = 5,
};

struct Size {
  Size() = default;
  Size(NS::UInteger w, NS::UInteger h, NS::UInteger d) : width(w), height(h), depth(d) {}
  NS::UInteger width = 0, height = 0, depth = 0;
};

namespace fake {
using Launch = int (*)(int, unsigned, unsigned, unsigned**, const unsigned long long*, const unsigned*, int);
inline NS::UInteger env(const char* name, NS::UInteger otherwise) {
  const char* v = std::getenv(name);
  return v != nullptr && *v ? static_cast<NS::UInteger>(std::strtoull(v, nullptr, 10)) : otherwise;
}
}  // namespace fake

class CompileOptions : public NS::Object {
 public:
  static CompileOptions* alloc() { return new CompileOptions; }
  CompileOptions* init() { return this; }
  void setFastMathEnabled(bool on) { fast_math = on; }
  bool fast_math = true;  // Metal's default
};

class Function : public NS::Object {
 public:
  explicit Function(int module) : module(module) {}
  int module;
};

class ComputePipelineState : public NS::Object {
 public:
  explicit ComputePipelineState(int module) : module(module) {}
  NS::UInteger maxTotalThreadsPerThreadgroup() const { return fake::env("CHROMA_METAL_FAKE_MAX_THREADS", 1024); }
  NS::UInteger threadExecutionWidth() const { return fake::env("CHROMA_METAL_FAKE_SIMD_WIDTH", 32); }
  int module;
};

class Library : public NS::Object {
 public:
  Library(std::string source, void* dl) : source_(std::move(source)), dl_(dl) {}
  ~Library() override { ::dlclose(dl_); }
  Function* newFunction(const NS::String* name) {
    int module = -1;
    char tail = 0;
    const std::string n = name->utf8String();
    if (std::sscanf(n.c_str(), "chroma_k%d_mai%c", &module, &tail) != 2 || tail != 'n' ||
        (source_.find("#define chroma_main " + n + "\n") == std::string::npos &&
         source_.find("kernel void " + n + "(") == std::string::npos)) {
      return nullptr;  // as Metal: no such function in the library
    }
    return new Function(module);
  }

 private:
  std::string source_;
  void* dl_;
};

class Buffer : public NS::Object {
 public:
  explicit Buffer(NS::UInteger n) : bytes_(n, static_cast<unsigned char>(0xcd)) {}
  void* contents() { return bytes_.data(); }
  NS::UInteger length() const { return bytes_.size(); }

 private:
  std::vector<unsigned char> bytes_;
};

class ComputeCommandEncoder : public NS::Object {
 public:
  void setComputePipelineState(const ComputePipelineState* state) { pipe_ = state; }
  void setBuffer(const Buffer* buffer, NS::UInteger offset, NS::UInteger index) {
    if (index >= 31) return fail("setBuffer index " + std::to_string(index) + " (31 buffer slots)");
    if (bound_.size() <= index) bound_.resize(index + 1);
    bound_[index] = static_cast<unsigned char*>(const_cast<Buffer*>(buffer)->contents()) + offset;
    if (words_.size() <= index) words_.resize(index + 1);
    words_[index] = (buffer->length() - offset) / 4;  // what the kernel may index (the emulator checks)
  }
  void setBytes(const void* bytes, NS::UInteger length, NS::UInteger index) {
    if (length > 4096) return fail("setBytes of " + std::to_string(length) + " bytes (4 KB at most)");
    if (index != 0) return fail("setBytes at index " + std::to_string(index) + " (the parameters are buffer 0)");
    params_.assign(static_cast<const unsigned char*>(bytes), static_cast<const unsigned char*>(bytes) + length);
  }
  // Metal keeps an encoder's bindings from one dispatch to the next; so does the fake, which
  // then hands a kernel every buffer bound so far (the emulated kernel reads the ones it has).
  void dispatchThreadgroups(Size groups, Size threads) {
    if (pipe_ == nullptr) return fail("dispatch without a pipeline state");
    if (threads.width * threads.height * threads.depth > pipe_->maxTotalThreadsPerThreadgroup())
      return fail("dispatch of more threads per threadgroup than the pipeline allows");
    Command c{pipe_->module, static_cast<unsigned>(groups.width), static_cast<unsigned>(groups.height), {}, {}, {}};
    for (size_t i = params_.empty() ? 0 : 1; i < bound_.size(); ++i) {  // the MSL printer's layout
      if (bound_[i] == nullptr) return fail("dispatch with no buffer at index " + std::to_string(i));
      c.slots.push_back(reinterpret_cast<unsigned*>(bound_[i]));
      c.words.push_back(words_[i]);
    }
    c.params.resize((params_.size() + 3) / 4 + 1);
    if (!params_.empty()) std::memcpy(c.params.data(), params_.data(), params_.size());
    if (groups.depth != 1) return fail("3-D grid");
    commands.push_back(std::move(c));
  }
  void endEncoding() { ended = true; }

  struct Command {
    int module;
    unsigned gx, gy;
    std::vector<unsigned*> slots;
    std::vector<unsigned long long> words;
    std::vector<unsigned> params;
  };
  std::vector<Command> commands;
  std::string error;
  bool ended = false;

 private:
  void fail(const std::string& what) {
    if (error.empty()) error = what;
  }
  const ComputePipelineState* pipe_ = nullptr;
  std::vector<unsigned char*> bound_;
  std::vector<unsigned long long> words_;
  std::vector<unsigned char> params_;
};

class CommandBuffer : public NS::Object {
 public:
  explicit CommandBuffer(fake::Launch launch) : launch_(launch) {}
  ~CommandBuffer() override {
    for (auto* e : encoders_) e->release();
  }
  ComputeCommandEncoder* computeCommandEncoder() {
    auto* e = new ComputeCommandEncoder;
    encoders_.push_back(e);
    e->autorelease();
    e->retain();  // the command buffer's reference, released with it
    return e;
  }
  void commit() {
    status_ = CommandBufferStatusCompleted;
    for (auto* e : encoders_) {
      if (!e->ended) return failed("commit before endEncoding");
      if (!e->error.empty()) return failed(e->error);
      for (auto& c : e->commands) {
        const int rc = c.gx && c.gy ? launch_(c.module, c.gx, c.gy, c.slots.data(), c.words.data(), c.params.data(), 0) : 0;
        if (rc == -1) return failed("no kernel " + std::to_string(c.module));
        if (rc != 0) return failed("a kernel accessed a buffer out of bounds (kernel " + std::to_string(c.module) + ")");
      }
    }
  }
  void waitUntilCompleted() {}
  CommandBufferStatus status() const { return status_; }
  NS::Error* error() const { return error_; }

 private:
  void failed(const std::string& what) {
    status_ = CommandBufferStatusError;
    error_ = new NS::Error("fake Metal: " + what);
  }
  fake::Launch launch_;
  std::vector<ComputeCommandEncoder*> encoders_;
  CommandBufferStatus status_ = CommandBufferStatusNotEnqueued;
  NS::Error* error_ = nullptr;
};

class CommandQueue : public NS::Object {
 public:
  explicit CommandQueue(const fake::Launch* launch) : launch_(launch) {}  // the device's, set by newLibrary
  CommandBuffer* commandBuffer() {
    auto* b = new CommandBuffer(*launch_);
    b->autorelease();
    return b;
  }

 private:
  const fake::Launch* launch_;
};

class Device : public NS::Object {
 public:
  Device() : name_(new NS::String("Chroma's fake Metal device (the CPU SIMT emulator)")) {}
  ~Device() override { name_->release(); }
  NS::String* name() const { return name_; }
  bool hasUnifiedMemory() const { return true; }
  NS::UInteger maxBufferLength() const { return fake::env("CHROMA_METAL_FAKE_MAX_BUFFER", NS::UInteger(1) << 32); }
  uint64_t recommendedMaxWorkingSetSize() const { return uint64_t(8) << 30; }
  CommandQueue* newCommandQueue() { return new CommandQueue(&launch_); }
  Buffer* newBuffer(NS::UInteger length, ResourceOptions) { return length ? new Buffer(length) : nullptr; }
  Library* newLibrary(const NS::String* source, const CompileOptions* options, NS::Error** error) {
    const char* path = std::getenv("CHROMA_METAL_FAKE_KERNELS");
    std::string why;
    void* dl = nullptr;
    fake::Launch fn = nullptr;
    if (options == nullptr || options->fast_math) {
      why = "compiled with fast math on";
    } else if (path == nullptr || (dl = ::dlopen(path, RTLD_NOW | RTLD_LOCAL)) == nullptr) {
      why = std::string("CHROMA_METAL_FAKE_KERNELS names no emulator library (") + (path ? path : "unset") + ")";
    } else if ((fn = reinterpret_cast<fake::Launch>(::dlsym(dl, "chroma_simt_launch"))) == nullptr) {
      ::dlclose(dl);
      why = "the emulator library has no chroma_simt_launch";
    }
    if (!why.empty()) {
      if (error != nullptr) *error = new NS::Error("fake Metal: " + why);
      return nullptr;
    }
    launch_ = fn;
    return new Library(source->utf8String(), dl);
  }
  ComputePipelineState* newComputePipelineState(const Function* fn, NS::Error**) { return new ComputePipelineState(fn->module); }

 private:
  NS::String* name_;
  fake::Launch launch_ = nullptr;
};

inline Device* CreateSystemDefaultDevice() { return std::getenv("CHROMA_METAL_FAKE_NO_DEVICE") ? nullptr : new Device; }

}  // namespace MTL

// The fake's object counts: alive now, and ever autoreleased with no pool in place.
extern "C" __attribute__((visibility("default"))) void chroma_metal_fake_counts(long* alive, long* orphans) {
  *alive = NS::fake::counts().alive;
  *orphans = NS::fake::counts().orphans;
}
