// Entry points of a compiled artifact's library: the C ABI (chroma/chroma.h) and the Python
// extension module `chroma_model`, both in the same shared library.
//
// Included once, by the generated host.cpp (which defines CHROMA_WITH_BLAS first). It reads
// the model only through the tables of chroma/cpu/program_tables.h, which program.cpp
// defines: host.cpp is the same file for every model, and the build cache compiles it once
// per compiler command.
//
// The Python half references the CPython API through weak symbols: inside a Python process
// they resolve to the interpreter, elsewhere they stay null and are never called, so the
// same library loads in a plain C/C++ program that has no libpython.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <chrono>
#include <string>
#include <thread>

#include "chroma/chroma.h"
#include "chroma/cpu/program_tables.h"
#include "chroma/cpu/runtime.h"
#include "chroma/cpu/threads.h"
#include "chroma/cpu/scalar.h"
#include "chroma/detail/sha256.h"

#if CHROMA_WITH_BLAS
extern "C" void openblas_set_num_threads(int);
#endif

struct chroma_program {
  const uint8_t* weights = nullptr;
  size_t weights_len = 0;
  bool weights_copied = false;  // in private huge-page memory (std::free), else the file mapping
  uint8_t* arena = nullptr;
  uint8_t* state = nullptr;
  chroma::rt::ThreadPool* pool = nullptr;
};

namespace chroma_gen_detail {

inline void set_err(char* err, size_t len, const std::string& msg) {
  if (err && len) std::snprintf(err, len, "%s", msg.c_str());
}

// threads <= 0: $CHROMA_NUM_THREADS if set, else one per core.
inline int resolve_threads(int threads) {
  if (threads > 0) return threads;
  if (const char* env = std::getenv("CHROMA_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  const unsigned hc = std::thread::hardware_concurrency();
  return hc ? static_cast<int>(hc) : 1;
}

// Replaces the program's worker pool (the caller counts as one of the threads). OpenBLAS,
// used for the larger products, is set to the same count (a process-wide setting).
inline bool set_threads(chroma_program* p, int threads, std::string* why) {
  threads = resolve_threads(threads);
  if (threads > 1024) {
    *why = "threads=" + std::to_string(threads) + " is out of range (1..1024)";
    return false;
  }
  delete p->pool;
  p->pool = nullptr;
  try {
    p->pool = new chroma::rt::ThreadPool(threads);
  } catch (const std::exception& e) {
    *why = std::string("cannot start ") + std::to_string(threads) + " threads: " + e.what();
    return false;
  }
#if CHROMA_WITH_BLAS
  openblas_set_num_threads(threads);
#endif
  return true;
}

inline void close_program(chroma_program* p) {
  if (!p) return;
  delete p->pool;
  if (p->weights_copied) std::free(const_cast<uint8_t*>(p->weights));
  else if (p->weights) ::munmap(const_cast<uint8_t*>(p->weights), p->weights_len);
  std::free(p->arena);
  std::free(p->state);
  delete p;
}

// Every state tensor back to its initial value (from the weights file).
inline void reset_state(chroma_program* p) {
  for (int s = 0; s < chroma_gen::kNumStates; ++s) {
    const chroma::rt::StateInfo& st = chroma_gen::kStates[s];
    std::memcpy(p->state + st.offset, p->weights + st.init_offset, static_cast<size_t>(st.nbytes));
  }
}

inline chroma_program* open_program(const char* dir, int threads, std::string* why) {
  auto* p = new (std::nothrow) chroma_program();
  if (!p) {
    *why = "out of memory";
    return nullptr;
  }
  const std::string path = std::string(dir) + "/weights.bin";
  if (chroma_gen::kWeightsBytes > 0) {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      *why = "cannot open " + path + ": " + std::strerror(errno);
      delete p;
      return nullptr;
    }
    struct stat st{};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      *why = path + " is not a regular file";
      ::close(fd);
      delete p;
      return nullptr;
    }
    if (static_cast<int64_t>(st.st_size) != chroma_gen::kWeightsBytes) {
      *why = path + " has " + std::to_string(st.st_size) + " bytes, this library expects " +
             std::to_string(chroma_gen::kWeightsBytes) + " (truncated or from another build)";
      ::close(fd);
      delete p;
      return nullptr;
    }
    p->weights_len = static_cast<size_t>(st.st_size);
    // Large weights are read into 2 MiB-aligned private memory backed by transparent huge
    // pages: streaming them (every call reads them all) then misses the TLB 512x less often
    // and the prefetchers run further (the memory-bound products ran faster than from the
    // 4 KiB-page file mapping: bench/results/README.md). Each of the program's threads reads 16 MiB
    // chunks and hashes each one as soon as it is in (sha256-tree-16MiB: the digest is
    // checked on the copy, while the bytes are still in cache). Smaller weights, or
    // CHROMA_WEIGHTS_MMAP=1, keep the shared page-cache mapping and are hashed in place.
    const int hash_threads = resolve_threads(threads);
    std::string digest;
    const size_t kHuge = size_t{2} << 20;
    if (p->weights_len >= 8 * kHuge && !std::getenv("CHROMA_WEIGHTS_MMAP")) {
      const size_t len = (p->weights_len + kHuge - 1) / kHuge * kHuge;
      if (auto* a = static_cast<uint8_t*>(std::aligned_alloc(kHuge, len))) {
#ifdef MADV_HUGEPAGE
        ::madvise(a, len, MADV_HUGEPAGE);
#endif
        auto read_chunk = [&](size_t off, size_t n) {
          size_t done = 0;
          while (done < n) {
            const ssize_t r = ::pread(fd, a + off + done, n - done, static_cast<off_t>(off + done));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return false;
            done += static_cast<size_t>(r);
          }
          return true;
        };
        digest = chroma::detail::sha256_tree_hex_filled(a, p->weights_len, hash_threads, read_chunk);
        if (!digest.empty()) {
          p->weights = a;
          p->weights_copied = true;
        } else {
          std::free(a);  // a read failed: fall back to the mapping below
        }
      }
    }
    if (!p->weights_copied) {
      void* m = ::mmap(nullptr, p->weights_len, PROT_READ, MAP_PRIVATE, fd, 0);
      if (m == MAP_FAILED) {
        ::close(fd);
        *why = "cannot map " + path;
        delete p;
        return nullptr;
      }
      p->weights = static_cast<const uint8_t*>(m);
      digest = chroma::detail::sha256_tree_hex(p->weights, p->weights_len, hash_threads);
    }
    ::close(fd);
    if (digest != chroma_gen::kWeightsDigest) {
      *why = path + " is corrupt or from another build: digest " + digest + ", expected " + chroma_gen::kWeightsDigest;
      close_program(p);
      return nullptr;
    }
  }
  if (chroma_gen::kArenaBytes > 0) {
    p->arena = static_cast<uint8_t*>(std::aligned_alloc(64, static_cast<size_t>((chroma_gen::kArenaBytes + 63) / 64 * 64)));
    if (!p->arena) {
      *why = "cannot allocate the " + std::to_string(chroma_gen::kArenaBytes) + "-byte arena";
      close_program(p);
      return nullptr;
    }
  }
  if (chroma_gen::kStateBytes > 0) {
    p->state = static_cast<uint8_t*>(std::aligned_alloc(64, static_cast<size_t>((chroma_gen::kStateBytes + 63) / 64 * 64)));
    if (!p->state) {
      *why = "cannot allocate the " + std::to_string(chroma_gen::kStateBytes) + "-byte state";
      close_program(p);
      return nullptr;
    }
    reset_state(p);
  }
  if (!set_threads(p, threads, why)) {
    close_program(p);
    return nullptr;
  }
  return p;
}

// The compiled-in signature of every entry point and state tensor, one line each:
//   entry forward(x:float32[4,7])->(output0:float32[4,16])
//   state cache:1024
// Loaders compare it with the manifest's, so an edited manifest is refused instead of
// feeding the kernels arrays of another dtype or shape.
inline std::string signature() {
  auto spec = [](const chroma::rt::IoSpec& s) {
    std::string r = std::string(s.name) + ":" + s.dtype + "[";
    for (int d = 0; d < s.rank; ++d) r += (d ? "," : "") + std::to_string(s.shape[d]);
    return r + "]";
  };
  std::string r;
  for (int e = 0; e < chroma_gen::kNumEntries; ++e) {
    const chroma::rt::EntryInfo& en = chroma_gen::kEntries[e];
    r += std::string("entry ") + en.name + "(";
    for (int i = 0; i < en.num_inputs; ++i) r += (i ? "," : "") + spec(en.inputs[i]);
    r += ")->(";
    for (int i = 0; i < en.num_outputs; ++i) r += (i ? "," : "") + spec(en.outputs[i]);
    r += ")\n";
  }
  for (int s = 0; s < chroma_gen::kNumStates; ++s) {
    r += std::string("state ") + chroma_gen::kStates[s].name + ":" + std::to_string(chroma_gen::kStates[s].nbytes) + "\n";
  }
  return r;
}

// Runs entry `entry`'s kernels in order. seconds (optional): per-kernel wall time is added.
inline int run_program(chroma_program* p, int entry, const void* const* in, void* const* out, std::string* why,
                       double* seconds = nullptr) {
  if (entry < 0 || entry >= chroma_gen::kNumEntries) {
    *why = "entry " + std::to_string(entry) + " does not exist (the artifact has " + std::to_string(chroma_gen::kNumEntries) + ")";
    return CHROMA_ERR_INVALID;
  }
  const chroma::rt::EntryInfo& e = chroma_gen::kEntries[entry];
  chroma::rt::Ctx cx{in, out, p->weights, p->arena};
  cx.state = p->state;
  cx.pool = p->pool;
  chroma::scalar::int_division_by_zero = false;
  int rc = 0;
  if (!seconds) {
    for (int k = 0; k < e.num_kernels && rc == 0; ++k) rc = e.fns[k](cx);
  } else {
    for (int k = 0; k < e.num_kernels && rc == 0; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      rc = e.fns[k](cx);
      seconds[k] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  }
  if (rc == 0 && chroma::scalar::int_division_by_zero) rc = CHROMA_ERR_ZERO_DIVISION;
  if (rc == CHROMA_ERR_ZERO_DIVISION) {
    *why = "integer division by zero";
  } else if (rc == CHROMA_ERR_INDEX) {
    const chroma::rt::KernelInfo& k = e.kernels[cx.err_kernel];
    *why = "index " + std::to_string(cx.err_value) + " is out of range for dimension " + std::to_string(k.axis) +
           " of size " + std::to_string(k.dim_size) + " in node '" + k.node + "'" +
           (k.source[0] ? std::string(" at ") + k.source : std::string());
  } else if (rc) {
    *why = "kernel failed";
  }
  return rc;
}

}  // namespace chroma_gen_detail

extern "C" {

__attribute__((visibility("default"))) int chroma_abi_version(void) { return CHROMA_ABI_VERSION; }

__attribute__((visibility("default"))) chroma_program* chroma_open(const char* dir, char* err, size_t err_len) {
  std::string why;
  chroma_program* p = chroma_gen_detail::open_program(dir ? dir : ".", 0, &why);
  if (!p) chroma_gen_detail::set_err(err, err_len, why);
  return p;
}

__attribute__((visibility("default"))) void chroma_close(chroma_program* p) { chroma_gen_detail::close_program(p); }

__attribute__((visibility("default"))) int chroma_set_threads(chroma_program* p, int threads, char* err, size_t err_len) {
  std::string why;
  if (!p) {
    chroma_gen_detail::set_err(err, err_len, "chroma_set_threads: program is NULL");
    return CHROMA_ERR_INVALID;
  }
  if (!chroma_gen_detail::set_threads(p, threads, &why)) {
    chroma_gen_detail::set_err(err, err_len, why);
    return CHROMA_ERR_INVALID;
  }
  return CHROMA_OK;
}

__attribute__((visibility("default"))) int chroma_num_threads(const chroma_program* p) { return p && p->pool ? p->pool->size() : 1; }

__attribute__((visibility("default"))) int chroma_run(chroma_program* p, const void* const* inputs, void* const* outputs,
                                                      char* err, size_t err_len) {
  if (!p) {
    chroma_gen_detail::set_err(err, err_len, "chroma_run: program is NULL");
    return CHROMA_ERR_INVALID;
  }
  std::string why;
  const int rc = chroma_gen_detail::run_program(p, 0, inputs, outputs, &why);
  if (rc) chroma_gen_detail::set_err(err, err_len, why);
  return rc;
}

__attribute__((visibility("default"))) int chroma_run_entry(chroma_program* p, int entry, const void* const* inputs,
                                                            void* const* outputs, char* err, size_t err_len) {
  if (!p) {
    chroma_gen_detail::set_err(err, err_len, "chroma_run_entry: program is NULL");
    return CHROMA_ERR_INVALID;
  }
  std::string why;
  const int rc = chroma_gen_detail::run_program(p, entry, inputs, outputs, &why);
  if (rc) chroma_gen_detail::set_err(err, err_len, why);
  return rc;
}

__attribute__((visibility("default"))) void chroma_reset_state(chroma_program* p) {
  if (p && p->state) chroma_gen_detail::reset_state(p);
}

__attribute__((visibility("default"))) int chroma_num_entries(void) { return chroma_gen::kNumEntries; }
__attribute__((visibility("default"))) const char* chroma_entry_name(int e) {
  return e >= 0 && e < chroma_gen::kNumEntries ? chroma_gen::kEntries[e].name : nullptr;
}
__attribute__((visibility("default"))) int chroma_entry_index(const char* name) {
  for (int e = 0; name && e < chroma_gen::kNumEntries; ++e) {
    if (std::strcmp(chroma_gen::kEntries[e].name, name) == 0) return e;
  }
  return -1;
}
__attribute__((visibility("default"))) int chroma_entry_num_inputs(int e) { return chroma_gen::kEntries[e].num_inputs; }
__attribute__((visibility("default"))) int chroma_entry_num_outputs(int e) { return chroma_gen::kEntries[e].num_outputs; }
__attribute__((visibility("default"))) const chroma_tensor_spec* chroma_entry_input(int e, int i) {
  return &chroma_gen::kEntries[e].inputs[i];
}
__attribute__((visibility("default"))) const chroma_tensor_spec* chroma_entry_output(int e, int i) {
  return &chroma_gen::kEntries[e].outputs[i];
}

__attribute__((visibility("default"))) int chroma_num_inputs(void) { return chroma_gen::kEntries[0].num_inputs; }
__attribute__((visibility("default"))) int chroma_num_outputs(void) { return chroma_gen::kEntries[0].num_outputs; }
__attribute__((visibility("default"))) const char* chroma_input_name(int i) { return chroma_gen::kEntries[0].inputs[i].name; }
__attribute__((visibility("default"))) const char* chroma_input_dtype(int i) { return chroma_gen::kEntries[0].inputs[i].dtype; }
__attribute__((visibility("default"))) int chroma_input_rank(int i) { return chroma_gen::kEntries[0].inputs[i].rank; }
__attribute__((visibility("default"))) const int64_t* chroma_input_shape(int i) { return chroma_gen::kEntries[0].inputs[i].shape; }
__attribute__((visibility("default"))) const char* chroma_output_dtype(int i) { return chroma_gen::kEntries[0].outputs[i].dtype; }
__attribute__((visibility("default"))) int chroma_output_rank(int i) { return chroma_gen::kEntries[0].outputs[i].rank; }
__attribute__((visibility("default"))) const int64_t* chroma_output_shape(int i) { return chroma_gen::kEntries[0].outputs[i].shape; }
__attribute__((visibility("default"))) const char* chroma_source_digest(void) { return chroma_gen::kSourceDigest; }
__attribute__((visibility("default"))) const char* chroma_signature(void) {
  static const std::string s = chroma_gen_detail::signature();
  return s.c_str();
}

}  // extern "C"

#if CHROMA_WITH_PYTHON
#include "chroma/cpu/python_module.h"
#endif
