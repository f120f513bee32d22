// The CPU target's artifact: generated C++ built into one library, weights.bin, manifest.json.
#include "quant/quant.h"
#include <cstdlib>
#include <filesystem>

#include "artifact/build.h"
#include "targets/cpu/cpu_target.h"
#include "chroma/chroma.h"
#include "chroma/detail/sha256.h"
#include "codegen/cpu/emit.h"

namespace chroma {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::string write_cpu_artifact(std::vector<CompiledEntry>& entries, const std::string& out_dir, const CompileOptions& opts,
                               PhaseTimer& timer) {
  const fs::path out(out_dir);
  fs::create_directories(out);
  WeightsLayout wl(64);
  wl.write_to((out / "weights.bin.partial").string());
  const StateLayout sl = layout_state(entries, wl, 64, [](const TensorType& t) { return t.nbytes(); });
  wl.finish();
  timer.lap("weights");
  CpuArtifactInfo info;
  for (const StateLayout::Tensor& t : sl.tensors) info.states.push_back(CpuStateInfo{t.name, t.nbytes, t.offset, t.init_offset});
  info.state_bytes = sl.bytes;
  info.weights_digest = wl.digest;
  info.weights_bytes = wl.size();
  CpuCodegenOptions co;
  co.blas = opts.blas;
  std::vector<CpuEntry> ces;
  for (const CompiledEntry& e : entries) ces.push_back(CpuEntry{e.name, &e.program});
  // float32 convolutions, matrix products and attention's blocks go through oneDNN when Chroma
  // was built with its headers and the performance libraries are on (blas). Attention counts on
  // its own: a program whose only float32 products are attention's (its projections quantized)
  // would otherwise multiply its blocks with OpenBLAS from every pool thread at once, which
  // contends for OpenBLAS's own threads (45x slower than eager SDPA at 1088 tokens, 24 heads of
  // 128, 2 threads). CHROMA_SGEMM=openblas keeps the
  // products on OpenBLAS (a diagnostic: bench/gemm.cpp and docs/cpu_kernels.md, "Threads and
  // the product library", compare them).
#ifdef CHROMA_DNNL_LIBRARY
  const char* sgemm_env = std::getenv("CHROMA_SGEMM");
  const bool sgemm_openblas = sgemm_env && std::string(sgemm_env) == "openblas";
  for (const CompiledEntry& e : entries) {
    for (const Kernel& k : e.program.kernels) {
      if (!opts.blas || e.program.buffers[static_cast<size_t>(k.outputs[0])].type.dtype != DType::kF32) continue;
      co.dnnl_sgemm = co.dnnl_sgemm || (!sgemm_openblas && (k.kind == Kernel::kConv || k.kind == Kernel::kMatMul ||
                                                            k.kind == Kernel::kAttention));
      co.dnnl = co.dnnl || k.kind == Kernel::kConv || co.dnnl_sgemm ||
                (k.kind == Kernel::kMatMul && k.weight_format() == quant::Format::kBF16);  // matmul_dnnl.h
    }
  }
#endif
  GeneratedSource src = generate_cpu(ces, info, co);
  timer.lap("codegen");
  const double compile_s = timer.total();

  fs::create_directories(out / "src");
  for (const auto& [name, body] : src.files) write_file((out / "src" / name).string(), body.data(), body.size());
  fs::rename(out / "weights.bin.partial", out / "weights.bin");
  {  // sources of an earlier compile into this directory that this one did not write
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(out / "src", ec)) {
      const std::string n = f.path().filename().string();
      bool ours = false;
      for (const auto& [name, body] : src.files) ours = ours || name == n;
      if (!ours && f.is_regular_file(ec)) fs::remove(f.path(), ec);
    }
  }
  timer.lap("write");
  BuildOptions bo;
  bo.include_dir = opts.include_dir;
  bo.python_include = opts.python_include;
  bo.cache_dir = opts.cache_dir;
  bo.blas = opts.blas;
  bo.dnnl = co.dnnl;
  bo.jobs = opts.jobs;
  bo.pch_header = "chroma/cpu/kernels.h";
  BuildResult br = build_library(src.files, (out / "src").string(), out_dir, bo);
  timer.lap("build");

  json m;
  m["format"] = "chroma.artifact";
  m["version"] = 3;
  m["compiler_version"] = CHROMA_VERSION;
  m["abi_version"] = CHROMA_ABI_VERSION;
  m["target"] = opts.target;
  m["options"] = {{"blas", opts.blas}, {"dnnl", co.dnnl}, {"sgemm", co.dnnl_sgemm ? "onednn" : opts.blas ? "openblas" : "chroma"},
                  {"max_expression_depth", opts.max_expression_depth}};
  m["options"]["weights"] = describe_weights(entries, opts.weights);
  json es = json::array();
  for (const CompiledEntry& e : entries) es.push_back(describe_entry(e, wl.size(), sl.bytes));
  // The first entry's description also sits at the top level (single-entry readers).
  for (const char* key : {"inputs", "outputs", "output_structure", "arena", "kernels", "stats"}) m[key] = es[0][key];
  m["entries"] = es;
  m["state"] = sl.manifest;
  m["library"] = {{"file", br.library_file}, {"sha256", file_sha256(br.library_path)}};
  m["weights"] = {{"file", "weights.bin"}, {"bytes", wl.size()}, {"digest", wl.digest},
                  {"digest_algorithm", chroma::detail::kTreeAlgorithm}, {"tensors", wl.tensors}};
  json files = json::array();
  for (const auto& f : src.files) files.push_back("src/" + f.first);
  m["source"] = {{"files", files}, {"digest", src.digest}};
  m["build"] = {{"command", br.command}, {"cached", br.cached}, {"build_seconds", br.seconds},
                {"compile_seconds", compile_s}, {"cache_key", br.cache_key}};
  timer.lap("manifest");
  json steps = json::array();
  for (const auto& [n, v] : br.steps) steps.push_back({{"name", n}, {"seconds", v}});
  m["build"]["phases"] = timer.json();
  m["build"]["steps"] = steps;
  const std::string text = m.dump(2);
  write_file((out / "manifest.json").string(), text.data(), text.size());
  // Libraries of earlier compiles into this directory are no longer named by the manifest.
  // (A process that has one loaded keeps its mapping.)
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(out, ec)) {
    const std::string n = f.path().filename().string();
    if (n != br.library_file && n.size() > 3 && n.compare(n.size() - 3, 3, ".so") == 0 && n.rfind("model", 0) == 0) {
      fs::remove(f.path(), ec);
    }
  }
  return text;
}

}  // namespace chroma
