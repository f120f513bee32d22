// libFuzzer target: a graph file (.cgraph bytes) through the importer, the optimizing passes,
// lowering and CPU code generation. Every input must end in a result or a CompileError: any
// other exception, a crash, a hang or a sanitizer report is a bug (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "codegen/cpu/emit.h"
#include "import/importer.h"
#include "lower/program.h"
#include "passes/optimize.h"

namespace {

// Counts printed at exit (scripts/fuzz.sh quotes them): inputs compiled, CompileErrors.
size_t g_compiled = 0, g_errors = 0;
void report() { std::fprintf(stderr, "fuzz_graph: %zu inputs compiled, %zu clean CompileErrors\n", g_compiled, g_errors); }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit(report);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    chroma::Graph g = chroma::import_graph_bytes(data, size, "fuzz.cgraph");
    g = chroma::optimize(g);
    chroma::LowerOptions lo;
    const chroma::Program p = chroma::lower(g, lo);
    (void)chroma::describe(p);
    chroma::CpuArtifactInfo info;
    info.weights_digest = "0";
    (void)chroma::generate_cpu({chroma::CpuEntry{"forward", &p}}, info, chroma::CpuCodegenOptions{});
    ++g_compiled;
  } catch (const chroma::CompileError&) {
    ++g_errors;
  }
  return 0;
}
