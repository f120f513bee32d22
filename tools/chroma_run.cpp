// chroma_run: runs a Chroma artifact from C++ through its C ABI, with no Python.
//
//   chroma_run ARTIFACT_DIR [input0.bin ...]
//
// Before loading the library it checks manifest.json: the library it names must lie in
// ARTIFACT_DIR and match the manifest's SHA-256, and the inputs, outputs and state compiled
// into it must be the ones the manifest describes.
//
// Each input file holds the raw little-endian bytes of one input (numpy: a.tofile(path)).
// Without input files, inputs are zero-filled. Prints each output's dtype, shape and first
// values, and writes them to ARTIFACT_DIR/../<name>.out.bin when CHROMA_RUN_SAVE is set.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "artifact_check.h"
#include "chroma/chroma.h"
#include "chroma/cpu/blas_env.h"

namespace {

int64_t dtype_size(const std::string& d) {
  if (d == "float64" || d == "int64") return 8;
  if (d == "float32" || d == "int32") return 4;
  if (d == "int16") return 2;
  return 1;
}

template <class F> F sym(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (!p) {
    std::fprintf(stderr, "chroma_run: the library does not export %s\n", name);
    std::exit(2);
  }
  return reinterpret_cast<F>(p);
}

void print_values(const std::string& dtype, const void* data, int64_t n) {
  const int64_t shown = n < 8 ? n : 8;
  for (int64_t i = 0; i < shown; ++i) {
    if (dtype == "float32") std::printf(" %.6g", static_cast<const float*>(data)[i]);
    else if (dtype == "float64") std::printf(" %.9g", static_cast<const double*>(data)[i]);
    else if (dtype == "int64") std::printf(" %lld", static_cast<long long>(static_cast<const int64_t*>(data)[i]));
    else if (dtype == "int32") std::printf(" %d", static_cast<const int32_t*>(data)[i]);
    else std::printf(" %d", static_cast<const uint8_t*>(data)[i]);
  }
  std::printf(n > shown ? " ...\n" : "\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: chroma_run ARTIFACT_DIR [input0.bin ...]\n");
    return 2;
  }
  const std::string dir = argv[1];
  chroma::rt::configure_blas_env();  // before the library (and OpenBLAS with it) loads
  std::string lib_path;
  nlohmann::json manifest;
  if (const std::string why = chroma_tools::check_artifact(dir, &lib_path, &manifest); !why.empty()) {
    std::fprintf(stderr, "chroma_run: %s\n", why.c_str());
    return 1;
  }
  void* lib = dlopen(lib_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "chroma_run: cannot load %s: %s\n", lib_path.c_str(), dlerror());
    return 1;
  }
  auto abi = sym<int (*)()>(lib, "chroma_abi_version");
  if (abi() != CHROMA_ABI_VERSION) {
    std::fprintf(stderr, "chroma_run: %s has ABI %d, this program expects %d\n", lib_path.c_str(), abi(), CHROMA_ABI_VERSION);
    return 1;
  }
  auto signature = sym<const char* (*)()>(lib, "chroma_signature");
  try {
    if (chroma_tools::manifest_signature(manifest) != signature()) {
      std::fprintf(stderr, "chroma_run: %s/manifest.json describes other inputs, outputs or state than %s has:\n%s",
                   dir.c_str(), lib_path.c_str(), signature());
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chroma_run: %s/manifest.json: malformed entries (%s)\n", dir.c_str(), e.what());
    return 1;
  }
  auto open = sym<chroma_program* (*)(const char*, char*, size_t)>(lib, "chroma_open");
  auto run = sym<int (*)(chroma_program*, const void* const*, void* const*, char*, size_t)>(lib, "chroma_run");
  auto close = sym<void (*)(chroma_program*)>(lib, "chroma_close");
  auto n_in = sym<int (*)()>(lib, "chroma_num_inputs");
  auto n_out = sym<int (*)()>(lib, "chroma_num_outputs");
  auto in_name = sym<const char* (*)(int)>(lib, "chroma_input_name");
  auto in_dtype = sym<const char* (*)(int)>(lib, "chroma_input_dtype");
  auto in_rank = sym<int (*)(int)>(lib, "chroma_input_rank");
  auto in_shape = sym<const int64_t* (*)(int)>(lib, "chroma_input_shape");
  auto out_dtype = sym<const char* (*)(int)>(lib, "chroma_output_dtype");
  auto out_rank = sym<int (*)(int)>(lib, "chroma_output_rank");
  auto out_shape = sym<const int64_t* (*)(int)>(lib, "chroma_output_shape");

  char err[1024];
  chroma_program* prog = open(dir.c_str(), err, sizeof err);
  if (!prog) {
    std::fprintf(stderr, "chroma_run: %s\n", err);
    return 1;
  }
  auto numel = [](const int64_t* s, int r) {
    int64_t n = 1;
    for (int i = 0; i < r; ++i) n *= s[i];
    return n;
  };
  std::vector<std::vector<uint8_t>> inputs(static_cast<size_t>(n_in()));
  std::vector<const void*> in_ptrs;
  for (int i = 0; i < n_in(); ++i) {
    const int64_t bytes = numel(in_shape(i), in_rank(i)) * dtype_size(in_dtype(i));
    inputs[static_cast<size_t>(i)].assign(static_cast<size_t>(bytes), 0);
    if (argc > 2 + i) {
      std::ifstream f(argv[2 + i], std::ios::binary);
      std::vector<uint8_t> data((std::istreambuf_iterator<char>(f)), {});
      if (static_cast<int64_t>(data.size()) != bytes) {
        std::fprintf(stderr, "chroma_run: %s has %zu bytes, input '%s' (%s) needs %lld\n", argv[2 + i], data.size(),
                     in_name(i), in_dtype(i), static_cast<long long>(bytes));
        return 1;
      }
      inputs[static_cast<size_t>(i)] = std::move(data);
    }
    in_ptrs.push_back(inputs[static_cast<size_t>(i)].data());
  }
  std::vector<std::vector<uint8_t>> outputs(static_cast<size_t>(n_out()));
  std::vector<void*> out_ptrs;
  for (int i = 0; i < n_out(); ++i) {
    outputs[static_cast<size_t>(i)].resize(static_cast<size_t>(numel(out_shape(i), out_rank(i)) * dtype_size(out_dtype(i))));
    out_ptrs.push_back(outputs[static_cast<size_t>(i)].data());
  }
  if (run(prog, in_ptrs.data(), out_ptrs.data(), err, sizeof err) != CHROMA_OK) {
    std::fprintf(stderr, "chroma_run: %s\n", err);
    close(prog);
    return 1;
  }
  for (int i = 0; i < n_out(); ++i) {
    std::printf("output %d: %s[", i, out_dtype(i));
    for (int d = 0; d < out_rank(i); ++d) std::printf(d ? ",%lld" : "%lld", static_cast<long long>(out_shape(i)[d]));
    std::printf("]:");
    print_values(out_dtype(i), out_ptrs[static_cast<size_t>(i)], numel(out_shape(i), out_rank(i)));
    if (const char* save = std::getenv("CHROMA_RUN_SAVE")) {
      std::ofstream f(std::string(save) + "." + std::to_string(i) + ".bin", std::ios::binary);
      f.write(reinterpret_cast<const char*>(out_ptrs[static_cast<size_t>(i)]),
              static_cast<std::streamsize>(outputs[static_cast<size_t>(i)].size()));
    }
  }
  close(prog);
  dlclose(lib);
  return 0;
}
