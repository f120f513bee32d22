// The CUDA target's host runtime: compiled into each CUDA artifact's host library together with
// the artifact's fatbin (docs/cuda.md, "The native runtime").
//
// It talks to the NVIDIA driver through the CUDA driver API, opened with dlopen at run time
// (libcuda.so.1, which the driver installs): the library builds with a plain C++ compiler, with
// no CUDA toolkit, and loading it on a machine without a driver or a GPU is a clear error, not a
// missing-symbol failure. The few driver types and entry points used are declared here from the
// driver API's documented C ABI (cuda.h, "Driver API"); the `_v2` names are the ones the
// driver exports for the 64-bit forms.
//
// The schedule is the GPU package's (docs/webgpu_package.md): the caller (python/chroma/runtime/native.py)
// reads the package, creates the device buffers (the arena with its status block, the state, the
// weights shards), uploads them once, then appends each dispatch: a kernel, its grid, the
// buffers in its storage slots, and its parameter words, which are passed by value as kernel
// arguments. A call copies the inputs into the arena, clears the status block, launches every
// dispatch in order on the runtime's one non-blocking stream (or replays them as one CUDA graph,
// captured on the second call that asks for it) and copies the status block and the outputs back;
// outputs may also stay on the device (a device-to-device copy into memory the caller owns).
//
// Every entry point returns 0 on success; on failure it returns nonzero and writes one line that
// names the driver call and its error into `err` (`errlen` bytes, NUL-terminated). Calls on one
// handle must not overlap (the Python layer holds a lock).
#pragma once

#include <dlfcn.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "chroma/gpu/host_abi.h"
#include "chroma/gpu/host_core.h"

// The artifact's fatbin (sm_80, sm_90 cubins and compute_90 PTX), embedded by the generated
// source that includes this header.
extern "C" const unsigned char chroma_fatbin[];
extern "C" const unsigned long long chroma_fatbin_size;

namespace chroma::cuda_host {

// Driver API types (cuda.h): handles are pointers to opaque structs, device memory a 64-bit
// address.
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUgraph = struct CUgraph_st*;
using CUgraphExec = struct CUgraphExec_st*;

constexpr CUresult kSuccess = 0;
constexpr int kAttrComputeMajor = 75;       // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrComputeMinor = 76;       // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
constexpr unsigned kStreamNonBlocking = 1;  // CU_STREAM_NON_BLOCKING
constexpr int kCaptureThreadLocal = 1;      // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL

struct Driver {
  void* lib = nullptr;
  CUresult (*cuInit)(unsigned);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemGetInfo)(size_t*, size_t*);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                             void**, void**);
  CUresult (*cuStreamBeginCapture)(CUstream, int);
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*);
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
  CUresult (*cuGraphExecDestroy)(CUgraphExec);
  CUresult (*cuGraphDestroy)(CUgraph);
};

using gpu_host::say;

// The driver, opened once per process. On failure `why` says what is missing.
inline const Driver* driver(std::string* why) {
  static Driver d;
  static std::string failure;
  static const bool ok = [] {
    d.lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (d.lib == nullptr) {
      const char* e = ::dlerror();
      failure = std::string("the NVIDIA driver's libcuda.so.1 does not load (") + (e ? e : "not found") +
                "): this machine has no NVIDIA driver";
      return false;
    }
    bool all = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(d.lib, name));
      if (fn == nullptr && all) {
        failure = std::string("the NVIDIA driver's libcuda.so.1 lacks ") + name + " (a driver older than CUDA 11.4?)";
        all = false;
      }
    };
    sym(d.cuInit, "cuInit");
    sym(d.cuGetErrorName, "cuGetErrorName");
    sym(d.cuGetErrorString, "cuGetErrorString");
    sym(d.cuDriverGetVersion, "cuDriverGetVersion");
    sym(d.cuDeviceGetCount, "cuDeviceGetCount");
    sym(d.cuDeviceGet, "cuDeviceGet");
    sym(d.cuDeviceGetName, "cuDeviceGetName");
    sym(d.cuDeviceGetAttribute, "cuDeviceGetAttribute");
    sym(d.cuDeviceTotalMem, "cuDeviceTotalMem_v2");
    sym(d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    sym(d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    sym(d.cuCtxSetCurrent, "cuCtxSetCurrent");
    sym(d.cuModuleLoadData, "cuModuleLoadData");
    sym(d.cuModuleUnload, "cuModuleUnload");
    sym(d.cuModuleGetFunction, "cuModuleGetFunction");
    sym(d.cuMemAlloc, "cuMemAlloc_v2");
    sym(d.cuMemFree, "cuMemFree_v2");
    sym(d.cuMemGetInfo, "cuMemGetInfo_v2");
    sym(d.cuMemcpyHtoD, "cuMemcpyHtoD_v2");
    sym(d.cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    sym(d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    sym(d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    sym(d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    sym(d.cuMemsetD8Async, "cuMemsetD8Async");
    sym(d.cuStreamCreate, "cuStreamCreate");
    sym(d.cuStreamDestroy, "cuStreamDestroy_v2");
    sym(d.cuStreamSynchronize, "cuStreamSynchronize");
    sym(d.cuLaunchKernel, "cuLaunchKernel");
    sym(d.cuStreamBeginCapture, "cuStreamBeginCapture_v2");
    sym(d.cuStreamEndCapture, "cuStreamEndCapture");
    sym(d.cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
    sym(d.cuGraphLaunch, "cuGraphLaunch");
    sym(d.cuGraphExecDestroy, "cuGraphExecDestroy");
    sym(d.cuGraphDestroy, "cuGraphDestroy");
    return all;
  }();
  if (!ok && why != nullptr) *why = failure;
  return ok ? &d : nullptr;
}

// cuBLAS (libcublas, opened on first use like the driver): float32 products with FP32 compute
// (CUBLAS_COMPUTE_32F) and the default math mode, so no TF32 tensor-core rounding.
struct Blas {
  void* lib = nullptr;
  void* handle = nullptr;
  int (*create)(void**);
  int (*destroy)(void*);
  int (*set_stream)(void*, CUstream);
  int (*set_math_mode)(void*, int);
  int (*gemm)(void*, int, int, int, int, int, const void*, const void*, int, int, long long, const void*, int, int, long long,
              const void*, void*, int, int, long long, int, int, int);
};
constexpr int kBlasOpN = 0, kBlasOpT = 1;    // CUBLAS_OP_N, CUBLAS_OP_T
constexpr int kBlasDefaultMath = 0;          // CUBLAS_DEFAULT_MATH: no TF32
constexpr int kR32F = 0;                     // CUDA_R_32F
constexpr int kCompute32F = 68;              // CUBLAS_COMPUTE_32F
constexpr int kGemmDefault = -1;             // CUBLAS_GEMM_DEFAULT

// A row-major C = A B (each operand: word offset in its buffer, batch/row/column strides in
// words, one of row/column 1) as cuBLAS's column-major call computing C^T = B^T A^T.
struct Gemm {
  int batch = 1, m = 0, n = 0, k = 0;
  CUdeviceptr a = 0, b = 0, c = 0;
  int op_a = kBlasOpN, op_b = kBlasOpN, lda = 0, ldb = 0, ldc = 0;
  long long stride_a = 0, stride_b = 0, stride_c = 0;
};

// What a CUDA dispatch adds to the shared core's (include/chroma/gpu/host_core.h): a kernel's
// arguments are its storage slots' base addresses, then its parameter words, by value;
// cuLaunchKernel takes a pointer to each (`args`, into the dispatch's own vectors). A cuBLAS
// product (`library`) is a dispatch of no kernel.
struct Extra {
  bool library = false;
  Gemm gemm;
  std::vector<void*> args;
};
using Core = gpu_host::Core<CUdeviceptr, CUfunction, Extra>;
using Dispatch = Core::Dispatch;

struct Runtime {
  const Driver* d = nullptr;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUmodule module = nullptr;
  CUstream stream = nullptr;
  Core core;
  struct Entry {  // an entry point's captured graph (its schedule: core.entries)
    CUgraph graph = nullptr;
    CUgraphExec graph_exec = nullptr;
    uint64_t graph_status_offset = 0;
    int eager_calls = 0;  // graph mode captures from the second call (cuBLAS sets up on the first)
  };
  std::vector<Entry> graphs;  // per entry point
  Blas blas;
  int cc_major = 0, cc_minor = 0;
  char name[256] = {};
};

// One line for a failed driver call: the call, the error's name and the driver's description.
inline bool failed(const Driver* d, CUresult r, const char* call, char* err, size_t errlen) {
  if (r == kSuccess) return false;
  const char* n = nullptr;
  const char* s = nullptr;
  if (d->cuGetErrorName(r, &n) != kSuccess) n = nullptr;
  if (d->cuGetErrorString(r, &s) != kSuccess) s = nullptr;
  say(err, errlen, "%s failed: %s (%d: %s)", call, n ? n : "CUDA_ERROR_UNKNOWN", r, s ? s : "no description");
  return true;
}

// Opens cuBLAS for `rt` on its stream (once). Returns false with the reason in err.
inline bool open_blas(Runtime* rt, char* err, size_t errlen) {
  Blas& b = rt->blas;
  if (b.handle) return true;
  const char* names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
  std::string tried;
  for (const char* n : names) {
    b.lib = ::dlopen(n, RTLD_NOW | RTLD_LOCAL);
    if (b.lib) break;
    const char* e = ::dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (e ? e : n);
  }
  if (!b.lib) {
    say(err, errlen, "cuBLAS does not load (%s): install the CUDA toolkit's libcublas or the nvidia-cublas Python package",
        tried.c_str());
    return false;
  }
  b.create = reinterpret_cast<decltype(b.create)>(::dlsym(b.lib, "cublasCreate_v2"));
  b.destroy = reinterpret_cast<decltype(b.destroy)>(::dlsym(b.lib, "cublasDestroy_v2"));
  b.set_stream = reinterpret_cast<decltype(b.set_stream)>(::dlsym(b.lib, "cublasSetStream_v2"));
  b.set_math_mode = reinterpret_cast<decltype(b.set_math_mode)>(::dlsym(b.lib, "cublasSetMathMode"));
  b.gemm = reinterpret_cast<decltype(b.gemm)>(::dlsym(b.lib, "cublasGemmStridedBatchedEx"));
  if (!b.create || !b.destroy || !b.set_stream || !b.set_math_mode || !b.gemm) {
    say(err, errlen, "the cuBLAS library found lacks cublasCreate_v2, cublasSetStream_v2, cublasSetMathMode or "
        "cublasGemmStridedBatchedEx (CUDA 11 or newer is needed)");
    return false;
  }
  int st = b.create(&b.handle);
  if (st == 0) st = b.set_stream(b.handle, rt->stream);
  if (st == 0) st = b.set_math_mode(b.handle, kBlasDefaultMath);
  if (st != 0) {
    say(err, errlen, "cuBLAS initialization failed (cublasStatus_t %d)", st);
    if (b.handle) b.destroy(b.handle);
    b.handle = nullptr;
    return false;
  }
  return true;
}

}  // namespace chroma::cuda_host

#define CHROMA_CU(call, what)                                                    \
  do {                                                                           \
    if (::chroma::cuda_host::failed(rt->d, rt->d->call, what, err, errlen)) return 1; \
  } while (0)

extern "C" {

// Opens device `ordinal`, loads the embedded fatbin and creates the stream. Returns the handle,
// or null with the reason in `err`.
__attribute__((visibility("default"))) void* chroma_cuda_open(int ordinal, char* err, size_t errlen) {
  using namespace chroma::cuda_host;
  std::string why;
  const Driver* d = driver(&why);
  if (d == nullptr) {
    say(err, errlen, "%s", why.c_str());
    return nullptr;
  }
  auto* rt = new Runtime;
  rt->d = d;
  auto fail = [&]() -> void* {
    if (rt->stream) d->cuStreamDestroy(rt->stream);
    if (rt->module) d->cuModuleUnload(rt->module);
    if (rt->ctx) d->cuDevicePrimaryCtxRelease(rt->dev);
    delete rt;
    return nullptr;
  };
  if (failed(d, d->cuInit(0), "cuInit", err, errlen)) return fail();
  int count = 0;
  if (failed(d, d->cuDeviceGetCount(&count), "cuDeviceGetCount", err, errlen)) return fail();
  if (ordinal < 0 || ordinal >= count) {
    say(err, errlen, "CUDA device %d requested, the driver sees %d device%s", ordinal, count, count == 1 ? "" : "s");
    return fail();
  }
  if (failed(d, d->cuDeviceGet(&rt->dev, ordinal), "cuDeviceGet", err, errlen)) return fail();
  d->cuDeviceGetName(rt->name, sizeof rt->name - 1, rt->dev);
  d->cuDeviceGetAttribute(&rt->cc_major, kAttrComputeMajor, rt->dev);
  d->cuDeviceGetAttribute(&rt->cc_minor, kAttrComputeMinor, rt->dev);
  if (failed(d, d->cuDevicePrimaryCtxRetain(&rt->ctx, rt->dev), "cuDevicePrimaryCtxRetain", err, errlen)) return fail();
  if (failed(d, d->cuCtxSetCurrent(rt->ctx), "cuCtxSetCurrent", err, errlen)) return fail();
  const CUresult lr = d->cuModuleLoadData(&rt->module, chroma_fatbin);
  if (lr != kSuccess) {
    char why2[512];
    failed(d, lr, "cuModuleLoadData", why2, sizeof why2);
    say(err, errlen, "%s: the artifact's fatbin has no code this GPU (%s, sm_%d%d) and its driver can run", why2, rt->name,
        rt->cc_major, rt->cc_minor);
    return fail();
  }
  if (failed(d, d->cuStreamCreate(&rt->stream, kStreamNonBlocking), "cuStreamCreate", err, errlen)) return fail();
  return rt;
}

// "name|major|minor|total bytes|driver version"
__attribute__((visibility("default"))) int chroma_cuda_info(void* h, char* out, size_t n) {
  auto* rt = static_cast<chroma::cuda_host::Runtime*>(h);
  size_t total = 0;
  int version = 0;
  rt->d->cuDeviceTotalMem(&total, rt->dev);
  rt->d->cuDriverGetVersion(&version);
  chroma::cuda_host::say(out, n, "%s|%d|%d|%zu|%d", rt->name, rt->cc_major, rt->cc_minor, total, version);
  return 0;
}

// Allocates device buffer number `buffers.size()` of `bytes` (at least 4), zero-filled unless
// `init` (then its first `init_bytes` bytes are copied in). Returns its number in *id.
__attribute__((visibility("default"))) int chroma_cuda_buffer(void* h, uint64_t bytes, const void* init, uint64_t init_bytes,
                                                              int* id, char* err, size_t errlen) {
  auto* rt = static_cast<chroma::cuda_host::Runtime*>(h);
  if (init_bytes > bytes) {
    chroma::cuda_host::say(err, errlen, "buffer of %llu bytes initialized with %llu", (unsigned long long)bytes,
                           (unsigned long long)init_bytes);
    return 1;
  }
  chroma::cuda_host::CUdeviceptr p = 0;
  const size_t n = bytes < 4 ? 4 : static_cast<size_t>(bytes);
  if (chroma::cuda_host::failed(rt->d, rt->d->cuMemAlloc(&p, n), "cuMemAlloc", err, errlen)) return 1;
  *id = rt->core.add_buffer(p, n);
  CHROMA_CU(cuMemsetD8Async(p, 0, n, rt->stream), "cuMemsetD8Async");
  if (init != nullptr && init_bytes) CHROMA_CU(cuMemcpyHtoDAsync(p, init, init_bytes, rt->stream), "cuMemcpyHtoDAsync");
  CHROMA_CU(cuStreamSynchronize(rt->stream), "cuStreamSynchronize");
  return 0;
}

// Copies `n` host bytes into buffer `id` at `offset` (state initialization).
__attribute__((visibility("default"))) int chroma_cuda_upload(void* h, int id, uint64_t offset, const void* src, uint64_t n,
                                                              char* err, size_t errlen) {
  auto* rt = static_cast<chroma::cuda_host::Runtime*>(h);
  if (!rt->core.check_upload(id, offset, n, err, errlen)) return 1;
  CHROMA_CU(cuMemcpyHtoDAsync(rt->core.buffers[static_cast<size_t>(id)] + offset, src, n, rt->stream), "cuMemcpyHtoDAsync");
  CHROMA_CU(cuStreamSynchronize(rt->stream), "cuStreamSynchronize");
  return 0;
}

// Looks up kernel `index` of the translation unit (chroma_k<index>_main) with its block size.
__attribute__((visibility("default"))) int chroma_cuda_kernel(void* h, int index, unsigned block, char* err, size_t errlen) {
  auto* rt = static_cast<chroma::cuda_host::Runtime*>(h);
  if (!rt->core.check_kernel_order(index, err, errlen)) return 1;
  char name[64];
  std::snprintf(name, sizeof name, "chroma_k%d_main", index);
  chroma::cuda_host::CUfunction fn = nullptr;
  if (chroma::cuda_host::failed(rt->d, rt->d->cuModuleGetFunction(&fn, rt->module, name), "cuModuleGetFunction", err, errlen)) {
    return 1;
  }
  rt->core.add_kernel(fn, block);
  return 0;
}

// Adds an entry point with an empty schedule; returns its number (0, 1, ...).
__attribute__((visibility("default"))) int chroma_cuda_entry(void* h) {
  auto* rt = static_cast<chroma::cuda_host::Runtime*>(h);
  rt->graphs.emplace_back();
  return rt->core.add_entry();
}

// Appends a dispatch to entry point `entry`'s schedule (chroma_cuda_entry): kernel `kernel` on a gx x gy grid, storage slot s bound to buffer
// slot_buffers[s], then `nparams` parameter words.
__attribute__((visibility("default"))) int chroma_cuda_dispatch(void* h, int entry, int kernel, unsigned gx, unsigned gy, int nslots,
                                                                const int* slot_buffers, int nparams, const unsigned* params,
                                                                char* err, size_t errlen) {
  using namespace chroma::cuda_host;
  auto* rt = static_cast<Runtime*>(h);
  Dispatch* b = rt->core.append(entry, kernel, gx, gy, nslots, slot_buffers, nparams, params, err, errlen);
  if (b == nullptr) return 1;
  // Argument pointers into the stored dispatch's vectors: a Dispatch moved when the schedule
  // grows keeps its vectors' buffers, so they stay valid.
  for (auto& s : b->slots) b->extra.args.push_back(&s);
  for (auto& p : b->params) b->extra.args.push_back(&p);
  Runtime::Entry& en = rt->graphs[static_cast<size_t>(entry)];
  if (en.graph_exec) {  // a schedule that grows invalidates the captured graph
    rt->d->cuGraphExecDestroy(en.graph_exec);
    rt->d->cuGraphDestroy(en.graph);
    en.graph_exec = nullptr;
    en.graph = nullptr;
  }
  return 0;
}

// Appends a cuBLAS product to entry point `entry`'s schedule: row-major C = A B over `batch`
// matrices; operand x (a, b, c) lies in buffer buf[x] at word[x], with batch_stride[x],
// row_stride[x] and col_stride[x] in words (one of the last two 1; C's column stride 1).
__attribute__((visibility("default"))) int chroma_cuda_gemm(void* h, int entry, int batch, int m, int n, int k,
                                                            const int* buf, const int64_t* word, const int64_t* batch_stride,
                                                            const int64_t* row_stride, const int64_t* col_stride, char* err,
                                                            size_t errlen) {
  using namespace chroma::cuda_host;
  auto* rt = static_cast<Runtime*>(h);
  if (!rt->core.check_entry(entry, "gemm", err, errlen)) return 1;
  for (int x = 0; x < 3; ++x) {
    if (!rt->core.check_buffer(buf[x], "gemm operand", x, err, errlen)) return 1;
  }
  if (!open_blas(rt, err, errlen)) return 1;
  Dispatch d;
  d.extra.library = true;
  Gemm& g = d.extra.gemm;
  g.batch = batch;
  g.m = m;
  g.n = n;
  g.k = k;
  auto addr = [&](int x) { return rt->core.buffers[static_cast<size_t>(buf[x])] + static_cast<CUdeviceptr>(4 * word[x]); };
  g.a = addr(0);
  g.b = addr(1);
  g.c = addr(2);
  // Row-major A (m x k): column-major it is A^T (op N, ld = row stride); stored by columns
  // (row stride 1) it is A (op T, ld = column stride). The same for B.
  g.op_a = col_stride[0] == 1 ? kBlasOpN : kBlasOpT;
  g.lda = static_cast<int>(col_stride[0] == 1 ? row_stride[0] : col_stride[0]);
  g.op_b = col_stride[1] == 1 ? kBlasOpN : kBlasOpT;
  g.ldb = static_cast<int>(col_stride[1] == 1 ? row_stride[1] : col_stride[1]);
  g.ldc = static_cast<int>(row_stride[2]);
  g.stride_a = batch_stride[0];
  g.stride_b = batch_stride[1];
  g.stride_c = batch_stride[2];
  rt->core.entries[static_cast<size_t>(entry)].push_back(std::move(d));
  return 0;
}

// One call of entry point `entry`. Inputs: n_in copies into buffer 0 (the arena) at in_offset[i], from host memory or,
// where in_device[i], from a device address. The status block (status_bytes at status_offset)
// is cleared before the kernels and copied to `status` after them. Outputs: n_out copies out of
// the arena, to host memory or (out_device[i]) to a device address. `graph`: launch the
// kernels as one CUDA graph (captured on the second call in that mode). Blocks until the stream is done.
__attribute__((visibility("default"))) int chroma_cuda_run(void* h, const ChromaGpuCall* call, char* err, size_t errlen) {
  const int entry = call->entry, n_in = call->n_in, n_out = call->n_out, graph = call->graph;
  const uint64_t *in_offset = call->in_offset, *in_src = call->in_src, *in_bytes = call->in_bytes;
  const uint64_t *out_offset = call->out_offset, *out_dst = call->out_dst, *out_bytes = call->out_bytes;
  const int32_t *in_device = call->in_device, *out_device = call->out_device;
  const uint64_t status_offset = call->status_offset, status_bytes = call->status_bytes;
  void* status = call->status;
  using namespace chroma::cuda_host;
  auto* rt = static_cast<Runtime*>(h);
  if (!rt->core.check_call(*call, /*device_io=*/true, err, errlen)) return 1;
  Runtime::Entry& en = rt->graphs[static_cast<size_t>(entry)];
  std::vector<Dispatch>& schedule = rt->core.entries[static_cast<size_t>(entry)];
  CHROMA_CU(cuCtxSetCurrent(rt->ctx), "cuCtxSetCurrent");
  const CUdeviceptr arena = rt->core.buffers[0];
  for (int i = 0; i < n_in; ++i) {
    if (!in_bytes[i]) continue;
    if (in_device[i]) {
      CHROMA_CU(cuMemcpyDtoDAsync(arena + in_offset[i], in_src[i], in_bytes[i], rt->stream), "cuMemcpyDtoDAsync (input)");
    } else {
      CHROMA_CU(cuMemcpyHtoDAsync(arena + in_offset[i], reinterpret_cast<const void*>(in_src[i]), in_bytes[i], rt->stream),
                "cuMemcpyHtoDAsync (input)");
    }
  }
  auto launch_all = [&]() -> int {
    CHROMA_CU(cuMemsetD8Async(arena + status_offset, 0, status_bytes, rt->stream), "cuMemsetD8Async (status)");
    for (size_t i = 0; i < schedule.size(); ++i) {
      Dispatch& d = schedule[i];
      if (d.extra.library) {
        const Gemm& g = d.extra.gemm;
        const float one = 1.0f, zero = 0.0f;
        // C^T (n x m, column-major, ldc) = op(B view) (n x k) * op(A view) (k x m)
        const int st = rt->blas.gemm(rt->blas.handle, g.op_b, g.op_a, g.n, g.m, g.k, &one, reinterpret_cast<const void*>(g.b),
                                     kR32F, g.ldb, g.stride_b, reinterpret_cast<const void*>(g.a), kR32F, g.lda, g.stride_a,
                                     &zero, reinterpret_cast<void*>(g.c), kR32F, g.ldc, g.stride_c, g.batch, kCompute32F,
                                     kGemmDefault);
        if (st != 0) {
          say(err, errlen, "cublasGemmStridedBatchedEx (dispatch %zu: %d x %d x %d, batch %d) failed: cublasStatus_t %d", i,
              g.m, g.n, g.k, g.batch, st);
          return 1;
        }
        continue;
      }
      if (!d.gx || !d.gy) continue;
      const CUresult r = rt->d->cuLaunchKernel(d.fn, d.gx, d.gy, 1, d.threads, 1, 1, 0, rt->stream, d.extra.args.data(), nullptr);
      if (r != kSuccess) {
        char what[64];
        std::snprintf(what, sizeof what, "cuLaunchKernel (dispatch %zu)", i);
        failed(rt->d, r, what, err, errlen);
        return 1;
      }
    }
    return 0;
  };
  if (graph && !en.graph_exec && en.eager_calls == 0) {
    // The first call in graph mode runs its launches directly: libraries (cuBLAS) allocate
    // their workspaces on first use, which a stream capture does not allow.
    if (launch_all()) return 1;
    ++en.eager_calls;
  } else if (graph) {
    if (en.graph_exec && en.graph_status_offset != status_offset) {
      rt->d->cuGraphExecDestroy(en.graph_exec);
      rt->d->cuGraphDestroy(en.graph);
      en.graph_exec = nullptr;
      en.graph = nullptr;
    }
    if (!en.graph_exec) {
      CHROMA_CU(cuStreamBeginCapture(rt->stream, kCaptureThreadLocal), "cuStreamBeginCapture");
      const int lr = launch_all();
      CUgraph g = nullptr;
      const CUresult er = rt->d->cuStreamEndCapture(rt->stream, &g);
      if (lr) {
        if (g) rt->d->cuGraphDestroy(g);
        return 1;
      }
      if (failed(rt->d, er, "cuStreamEndCapture", err, errlen)) return 1;
      if (failed(rt->d, rt->d->cuGraphInstantiateWithFlags(&en.graph_exec, g, 0), "cuGraphInstantiateWithFlags", err, errlen)) {
        rt->d->cuGraphDestroy(g);
        return 1;
      }
      en.graph = g;
      en.graph_status_offset = status_offset;
    }
    CHROMA_CU(cuGraphLaunch(en.graph_exec, rt->stream), "cuGraphLaunch");
  } else if (launch_all()) {
    return 1;
  }
  CHROMA_CU(cuMemcpyDtoHAsync(status, arena + status_offset, status_bytes, rt->stream), "cuMemcpyDtoHAsync (status)");
  for (int i = 0; i < n_out; ++i) {
    if (!out_bytes[i]) continue;
    if (out_device[i]) {
      CHROMA_CU(cuMemcpyDtoDAsync(out_dst[i], arena + out_offset[i], out_bytes[i], rt->stream), "cuMemcpyDtoDAsync (output)");
    } else {
      CHROMA_CU(cuMemcpyDtoHAsync(reinterpret_cast<void*>(out_dst[i]), arena + out_offset[i], out_bytes[i], rt->stream),
                "cuMemcpyDtoHAsync (output)");
    }
  }
  CHROMA_CU(cuStreamSynchronize(rt->stream), "cuStreamSynchronize (a kernel failed)");
  return 0;
}

// Device memory the caller owns (outputs kept on the device).
__attribute__((visibility("default"))) int chroma_cuda_alloc(void* h, uint64_t bytes, uint64_t* ptr, char* err, size_t errlen) {
  auto* rt = static_cast<chroma::cuda_host::Runtime*>(h);
  chroma::cuda_host::CUdeviceptr p = 0;
  CHROMA_CU(cuCtxSetCurrent(rt->ctx), "cuCtxSetCurrent");
  CHROMA_CU(cuMemAlloc(&p, bytes ? bytes : 4), "cuMemAlloc");
  *ptr = p;
  return 0;
}

__attribute__((visibility("default"))) int chroma_cuda_free(void* h, uint64_t ptr) {
  auto* rt = static_cast<chroma::cuda_host::Runtime*>(h);
  rt->d->cuCtxSetCurrent(rt->ctx);
  return rt->d->cuMemFree(ptr) == chroma::cuda_host::kSuccess ? 0 : 1;
}

// Copies n bytes from a device address to host memory (a device output's .numpy()).
__attribute__((visibility("default"))) int chroma_cuda_download(void* h, uint64_t src, void* dst, uint64_t n, char* err,
                                                                size_t errlen) {
  auto* rt = static_cast<chroma::cuda_host::Runtime*>(h);
  CHROMA_CU(cuCtxSetCurrent(rt->ctx), "cuCtxSetCurrent");
  CHROMA_CU(cuMemcpyDtoH(dst, src, n), "cuMemcpyDtoH");
  return 0;
}

// Releases everything (device buffers, graph, stream, module, the context reference).
__attribute__((visibility("default"))) void chroma_cuda_close(void* h) {
  auto* rt = static_cast<chroma::cuda_host::Runtime*>(h);
  if (rt == nullptr) return;
  const auto* d = rt->d;
  d->cuCtxSetCurrent(rt->ctx);
  d->cuStreamSynchronize(rt->stream);
  for (auto& en : rt->graphs) {
    if (en.graph_exec) d->cuGraphExecDestroy(en.graph_exec);
    if (en.graph) d->cuGraphDestroy(en.graph);
  }
  if (rt->blas.handle) rt->blas.destroy(rt->blas.handle);
  for (auto p : rt->core.buffers) d->cuMemFree(p);
  d->cuStreamDestroy(rt->stream);
  d->cuModuleUnload(rt->module);
  d->cuDevicePrimaryCtxRelease(rt->dev);
  delete rt;
}

// Bytes of the embedded fatbin.
__attribute__((visibility("default"))) uint64_t chroma_cuda_fatbin_bytes() {
  return chroma_fatbin_size;
}

}  // extern "C"

#undef CHROMA_CU

CHROMA_GPU_CALL_LAYOUT(cuda)
