// Builds generated source into a shared library with the system C++ compiler.
//
// Each source file compiles in its own process, `jobs` at a time; objects link into one
// library. Results are cached by content: the key is the SHA-256 of every source file, the
// compiler command and flags, and the header library's contents, so an unchanged model
// never rebuilds (the library is copied from the cache). Object files are cached the same
// way, one per source file, so files that are the same for every model compile once, and
// `pch_header` is precompiled once per command. Progress goes to stderr when it is a terminal.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace chroma {

struct BuildOptions {
  std::string compiler = "c++";        // $CXX when set
  std::string include_dir;             // chroma's header-only runtime (contains chroma/cpu/et.h)
  std::string python_include;          // CPython headers ("" builds without the Python module)
  std::string cache_dir;               // "" disables the cache
  bool blas = true;
  bool dnnl = false;                   // link oneDNN (and its OpenMP runtime)
  bool crypto = true;                  // link libcrypto (chroma/detail/sha256.h)
  int jobs = 0;                        // 0: one per core
  std::vector<std::string> extra_flags;
  // Header directories outside include_dir the sources include (-I each); their contents join
  // the cache key as include_dir's do. The Metal host: Apple's metal-cpp ($CHROMA_METAL_CPP).
  std::vector<std::string> header_dirs;
  std::vector<std::string> link_flags;  // after the libraries on the link line (-framework Metal)
  // A header (relative to include_dir) that source files include first: with a cache_dir and
  // GCC it is precompiled once per compiler command and used by the files that include it.
  std::string pch_header;
};

struct BuildResult {
  std::string library_path;  // <out_dir>/<library_file>
  std::string library_file;  // model-<first 16 hex digits of cache_key>.so
  bool cached = false;
  double seconds = 0;
  std::string command;                 // one compile command, for the manifest
  std::string cache_key;
  // Wall seconds of each compiler process (a source file, the precompiled header) and of the
  // link, in the order they finished; empty when the library came from the cache.
  std::vector<std::pair<std::string, double>> steps;
};

// ".tmp<pid>-<thread>-<n>": a suffix for temporary files in shared directories (the build
// cache, an artifact directory two processes compile into) that no other process, thread
// or call uses.
std::string unique_suffix();

// Writes nothing but `out_dir/<library_file>` (and the object files under a temporary
// directory of its own, so builds into one directory may run concurrently).
BuildResult build_library(const std::vector<std::pair<std::string, std::string>>& files, const std::string& src_dir,
                          const std::string& out_dir, const BuildOptions& opts);

// The CUDA toolkit's nvcc: $CHROMA_NVCC ("off" for none), else nvcc on PATH, else
// /usr/local/cuda/bin/nvcc; "" when there is none.
std::string find_nvcc();

// nvcc's -gencode flags for a CUDA artifact's fatbin: sm_80 and sm_90 cubins and compute_90 PTX
// (which newer GPUs' drivers compile at load).
std::vector<std::string> fatbin_architectures();

struct FatbinResult {
  std::string path;     // the fatbin written
  std::string command;  // the nvcc command (file names without directories)
  std::string log;      // nvcc's output (ptxas warnings: register spills)
  bool cached = false;
  double seconds = 0;
};

// Compiles `cu_path` with nvcc into the fatbin `out_path`, cached by content under cache_dir.
FatbinResult build_fatbin(const std::string& cu_path, const std::string& out_path, const std::string& nvcc,
                          const std::string& cache_dir);

}  // namespace chroma
