#include "pipeline.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <nlohmann/json.hpp>

#include "artifact/build.h"
#include "chroma/chroma.h"
#include "chroma/detail/sha256.h"
#include "codegen/cpu/emit.h"
#include "import/importer.h"
#include "lower/program.h"
#include "passes/cse.h"
#include "passes/dce.h"
#include "passes/fold_constants.h"
#include "passes/rewrite.h"

namespace chroma {
namespace fs = std::filesystem;
using json = nlohmann::json;

Graph optimize(const Graph& g) {
  Graph r = run_pass("fold_constants", &fold_constants, g);
  r = run_pass("eliminate_dead_code", &eliminate_dead_code, r);
  r = run_pass("eliminate_common_subexpressions", &eliminate_common_subexpressions, r);
  r = run_pass("eliminate_dead_code", &eliminate_dead_code, r);
  return r;
}

namespace {

struct WeightsFile {
  std::vector<uint8_t> bytes;
  std::string digest;  // sha256-tree-16MiB (chroma/detail/sha256.h)
  json tensors = json::array();
};

// Lays out every constant a kernel of any entry reads, 64-byte aligned, in first-use order;
// identical contents are stored once (across entries too).
struct WeightsLayout {
  WeightsFile w;
  std::map<std::string, int64_t> by_digest;

  int64_t add(const ConstantData& c, const std::string& name) {
    const auto nb = static_cast<size_t>(c.type.nbytes());
    const std::string digest = chroma::detail::sha256_hex(c.data(), nb) + c.type.str();
    int64_t off;
    auto d = by_digest.find(digest);
    if (d != by_digest.end()) {
      off = d->second;
    } else {
      off = static_cast<int64_t>((w.bytes.size() + 63) / 64 * 64);
      w.bytes.resize(static_cast<size_t>(off), 0);
      w.bytes.insert(w.bytes.end(), c.data(), c.data() + nb);
      by_digest[digest] = off;
    }
    w.tensors.push_back({{"name", name}, {"dtype", dtype_name(c.type.dtype)}, {"shape", c.type.shape}, {"offset", off}, {"nbytes", nb}});
    return off;
  }

  void add_program(Program& p) {
    std::map<int32_t, int64_t> slot_offset;
    // Constants no kernel reads (weights replaced by their packed form) are not stored.
    std::vector<bool> read(p.buffers.size(), false);
    auto mark = [&](auto&& self, const Expr& e) -> void {
      if (e.kind == Expr::kLoad) read[static_cast<size_t>(e.buffer)] = true;
      for (const Expr& c : e.children) self(self, c);
    };
    for (const Kernel& k : p.kernels) {
      for (const Expr& e : k.inputs) mark(mark, e);
    }
    for (Buffer& b : p.buffers) {
      if (b.region != Region::kConstant || !read[static_cast<size_t>(&b - p.buffers.data())]) continue;
      auto it = slot_offset.find(b.slot);
      if (it != slot_offset.end()) {
        b.offset = it->second;
        continue;
      }
      const ConstantData& c = p.constants[static_cast<size_t>(b.slot)];
      b.offset = slot_offset[b.slot] = add(c, c.name.empty() ? "folded_" + std::to_string(b.slot) : c.name);
    }
  }

  void finish() {
    w.bytes.resize((w.bytes.size() + 63) / 64 * 64, 0);
    w.digest = chroma::detail::sha256_tree_hex(w.bytes.data(), w.bytes.size(),
                                               static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  }
};

std::string file_sha256(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> buf(1 << 20);
  chroma::detail::Sha256 h;
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<size_t>(f.gcount()));
  }
  return h.hex_digest();
}

// Writes through a temporary file and a rename, so a process that has the old file mapped
// (a loaded program's weights) keeps a consistent view.
void write_file(const fs::path& p, const void* data, size_t n) {
  const fs::path tmp = p.string() + unique_suffix();
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
    if (!f) throw CompileError("cannot write " + tmp.string());
  }
  fs::rename(tmp, p);
}

const char* kernel_kind(Kernel::Kind k) {
  static const char* names[] = {"assign", "reduce",   "arg_reduce", "matmul",        "gather",   "gather_elements",
                                "concat", "topk",     "softmax",    "matmul_packed", "index_put", "scan", "conv", "linalg",
                                "matmul_gathered"};
  return names[k];
}

}  // namespace

std::string compile_graph_file(const std::string& graph_path, const std::string& out_dir, const CompileOptions& opts) {
  return compile_graph_files({{"forward", graph_path}}, out_dir, opts);
}

std::string compile_graph_files(const std::vector<EntrySpec>& specs, const std::string& out_dir, const CompileOptions& opts) {
  if (opts.target != "cpu") throw CompileError("target '" + opts.target + "' is not supported (available: cpu)");
  if (specs.empty()) throw CompileError("nothing to compile: no entry points");
  const auto t0 = std::chrono::steady_clock::now();
  // Seconds per phase, summed over the entries, for the manifest (`chroma compile --timings`).
  std::vector<std::pair<std::string, double>> phases;
  auto lap_start = t0;
  auto lap = [&](const char* name) {
    const auto now = std::chrono::steady_clock::now();
    const double sec = std::chrono::duration<double>(now - lap_start).count();
    lap_start = now;
    for (auto& [n, v] : phases) {
      if (n == name) {
        v += sec;
        return;
      }
    }
    phases.emplace_back(name, sec);
  };
  struct Entry {
    std::string name;
    size_t imported_nodes = 0;
    Graph graph;
    Program program;
  };
  std::vector<Entry> entries;
  for (const EntrySpec& s : specs) {
    for (const Entry& e : entries) {
      if (e.name == s.name) throw CompileError("entry point '" + s.name + "' is given twice");
    }
    Entry e;
    e.name = s.name;
    Graph imported = import_graph_file(s.graph_path);
    e.imported_nodes = imported.size();
    lap("import");
    e.graph = optimize(imported);
    lap("optimize");
    LowerOptions lo;
    lo.max_expression_depth = opts.max_expression_depth;
#if __has_include(<oneapi/dnnl/dnnl.hpp>)
    lo.channels_last = opts.blas;  // float32 convolutions run on oneDNN (codegen below)
#endif
    e.program = lower(e.graph, lo);
    lap("lower");
    entries.push_back(std::move(e));
  }

  // Persistent state: one tensor per name across all entries, 64-byte aligned.
  WeightsLayout wl;
  CpuArtifactInfo info;
  std::map<std::string, size_t> state_index;
  std::vector<TensorType> state_types;
  json states = json::array();
  for (Entry& e : entries) {
    for (const StateBinding& st : e.program.states) {
      auto it = state_index.find(st.name);
      if (it != state_index.end()) {
        if (state_types[it->second] != st.init.type) {
          throw CompileError("state '" + st.name + "' is " + st.init.type.str() + " in entry '" + e.name +
                             "' but has another type in an earlier entry");
        }
        continue;
      }
      CpuStateInfo si;
      si.name = st.name;
      si.nbytes = st.init.type.nbytes();
      si.offset = (info.state_bytes + 63) / 64 * 64;
      info.state_bytes = si.offset + si.nbytes;
      state_index[st.name] = info.states.size();
      info.states.push_back(si);
      state_types.push_back(st.init.type);
      states.push_back({{"name", st.name}, {"dtype", dtype_name(st.init.type.dtype)}, {"shape", st.init.type.shape},
                        {"offset", si.offset}, {"bytes", si.nbytes}});
    }
  }
  for (Entry& e : entries) {
    for (Buffer& b : e.program.buffers) {
      if (b.region == Region::kState) {
        b.offset = info.states[state_index.at(e.program.states[static_cast<size_t>(b.slot)].name)].offset;
      }
    }
    wl.add_program(e.program);
  }
  // Initial values of the state live in the weights file.
  std::vector<bool> have_init(info.states.size(), false);
  for (Entry& e : entries) {
    for (const StateBinding& st : e.program.states) {
      const size_t i = state_index.at(st.name);
      if (have_init[i]) continue;
      have_init[i] = true;
      info.states[i].init_offset = wl.add(st.init, "state:" + st.name);
      states[i]["init_offset"] = info.states[i].init_offset;
    }
  }
  info.state_bytes = (info.state_bytes + 63) / 64 * 64;
  wl.finish();
  lap("weights");
  const WeightsFile& w = wl.w;
  info.weights_digest = w.digest;
  info.weights_bytes = static_cast<int64_t>(w.bytes.size());
  CpuCodegenOptions co;
  co.blas = opts.blas;
  std::vector<CpuEntry> ces;
  for (const Entry& e : entries) ces.push_back(CpuEntry{e.name, &e.program});
  // float32 convolutions and matrix products go through oneDNN when Chroma was built with its
  // headers and the performance libraries are on (blas). CHROMA_SGEMM=openblas keeps the
  // products on OpenBLAS (a diagnostic: bench/gemm.cpp and docs/architecture.md compare them).
#if __has_include(<oneapi/dnnl/dnnl.hpp>)
  const char* sgemm_env = std::getenv("CHROMA_SGEMM");
  const bool sgemm_openblas = sgemm_env && std::string(sgemm_env) == "openblas";
  for (const Entry& e : entries) {
    for (const Kernel& k : e.program.kernels) {
      if (!opts.blas || e.program.buffers[static_cast<size_t>(k.outputs[0])].type.dtype != DType::kF32) continue;
      co.dnnl_sgemm = co.dnnl_sgemm || (!sgemm_openblas && (k.kind == Kernel::kConv || k.kind == Kernel::kMatMul));
      co.dnnl = co.dnnl || k.kind == Kernel::kConv || co.dnnl_sgemm;
    }
  }
#endif
  GeneratedSource src = generate_cpu(ces, info, co);
  lap("codegen");
  const double compile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const fs::path out(out_dir);
  fs::create_directories(out / "src");
  for (const auto& [name, body] : src.files) write_file(out / "src" / name, body.data(), body.size());
  write_file(out / "weights.bin", w.bytes.data(), w.bytes.size());
  {  // sources of an earlier compile into this directory that this one did not write
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(out / "src", ec)) {
      const std::string n = f.path().filename().string();
      bool ours = false;
      for (const auto& [name, body] : src.files) ours = ours || name == n;
      if (!ours && f.is_regular_file(ec)) fs::remove(f.path(), ec);
    }
  }
  lap("write");
  BuildOptions bo;
  bo.include_dir = opts.include_dir;
  bo.python_include = opts.python_include;
  bo.cache_dir = opts.cache_dir;
  bo.blas = opts.blas;
  bo.dnnl = co.dnnl;
  bo.jobs = opts.jobs;
  bo.pch_header = "chroma/cpu/kernels.h";
  BuildResult br = build_library(src.files, (out / "src").string(), out_dir, bo);
  lap("build");

  auto describe_entry = [&](const Entry& e) {
    const Program& p = e.program;
    json m;
    m["name"] = e.name;
    auto io = [&](const std::vector<int32_t>& ids, bool inputs) {
      json a = json::array();
      for (size_t i = 0; i < ids.size(); ++i) {
        const Buffer& b = p.buffers[static_cast<size_t>(ids[i])];
        a.push_back({{"name", inputs ? p.input_names[i] : "output" + std::to_string(i)},
                     {"dtype", dtype_name(b.type.dtype)},
                     {"shape", b.type.shape}});
      }
      return a;
    };
    m["inputs"] = io(p.inputs, true);
    m["outputs"] = io(p.outputs, false);
    m["output_structure"] = p.output_structure;
    json used = json::array();
    for (const StateBinding& st : p.states) {
      used.push_back({{"name", st.name}, {"updated", st.output >= 0}});
    }
    m["state"] = used;
    json bufs = json::array();
    int64_t in_bytes = 0, out_bytes = 0;
    for (size_t i = 0; i < p.buffers.size(); ++i) {
      const Buffer& b = p.buffers[i];
      if (b.region == Region::kInput) in_bytes += b.type.nbytes();
      if (b.region == Region::kOutput) out_bytes += b.type.nbytes();
      if (b.region != Region::kArena) continue;
      bufs.push_back({{"id", i}, {"name", b.name}, {"dtype", dtype_name(b.type.dtype)}, {"shape", b.type.shape},
                      {"offset", b.offset}, {"bytes", b.type.nbytes()}, {"first", b.first}, {"last", b.last}});
    }
    m["arena"] = {{"bytes", p.arena_bytes}, {"lower_bound", p.arena_lower_bound}, {"temporaries_bytes", p.temporaries_bytes},
                  {"buffers", bufs}, {"plan", p.plan_description}};
    json ks = json::array();
    for (size_t i = 0; i < p.kernels.size(); ++i) {
      const Kernel& k = p.kernels[i];
      ks.push_back({{"index", i}, {"kind", kernel_kind(k.kind)}, {"label", k.label}, {"node", k.name}, {"source", k.source}});
    }
    m["kernels"] = ks;
    m["stats"] = {{"kernels", p.kernels.size()},
                  {"fused_expressions", p.fused_expressions},
                  {"folded_constants", e.graph.folded_constants},
                  {"ir_nodes_imported", e.imported_nodes},
                  {"ir_nodes_optimized", e.graph.size()},
                  {"arena_bytes", p.arena_bytes},
                  {"temporaries_bytes", p.temporaries_bytes},
                  {"weight_bytes", w.bytes.size()},
                  {"state_bytes", info.state_bytes},
                  {"input_bytes", in_bytes},
                  {"output_bytes", out_bytes}};
    return m;
  };

  json m;
  m["format"] = "chroma.artifact";
  m["version"] = 3;
  m["compiler_version"] = CHROMA_VERSION;
  m["abi_version"] = CHROMA_ABI_VERSION;
  m["target"] = opts.target;
  m["options"] = {{"blas", opts.blas}, {"dnnl", co.dnnl}, {"sgemm", co.dnnl_sgemm ? "onednn" : opts.blas ? "openblas" : "chroma"}, {"max_expression_depth", opts.max_expression_depth}};
  json es = json::array();
  for (const Entry& e : entries) es.push_back(describe_entry(e));
  // The first entry's description also sits at the top level (single-entry readers).
  for (const char* key : {"inputs", "outputs", "output_structure", "arena", "kernels", "stats"}) m[key] = es[0][key];
  m["entries"] = es;
  m["state"] = states;
  m["library"] = {{"file", br.library_file}, {"sha256", file_sha256(br.library_path)}};
  m["weights"] = {{"file", "weights.bin"}, {"bytes", w.bytes.size()}, {"digest", w.digest},
                  {"digest_algorithm", chroma::detail::kTreeAlgorithm}, {"tensors", w.tensors}};
  json files = json::array();
  for (const auto& f : src.files) files.push_back("src/" + f.first);
  m["source"] = {{"files", files}, {"digest", src.digest}};
  m["build"] = {{"command", br.command}, {"cached", br.cached}, {"build_seconds", br.seconds},
                {"compile_seconds", compile_s}, {"cache_key", br.cache_key}};
  lap("manifest");
  json ph = json::object(), steps = json::array();
  for (const auto& [n, v] : phases) ph[n] = v;
  for (const auto& [n, v] : br.steps) steps.push_back({{"name", n}, {"seconds", v}});
  m["build"]["phases"] = ph;
  m["build"]["steps"] = steps;
  const std::string text = m.dump(2);
  write_file(out / "manifest.json", text.data(), text.size());
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

std::string dump_graph_file(const std::string& graph_path, const std::string& stage, int max_expression_depth) {
  Graph g = import_graph_file(graph_path);
  if (stage == "import") return print(g);
  g = optimize(g);
  if (stage == "optimized") return print(g);
  if (stage == "lowered") {
    LowerOptions lo;
    lo.max_expression_depth = max_expression_depth;
    return describe(lower(g, lo));
  }
  throw CompileError("unknown stage '" + stage + "' (import, optimized, lowered)");
}

std::string run_ir_text(const std::string& text, const std::vector<std::string>& passes, int max_expression_depth) {
  Graph g = parse(text);
  if (std::string err = verify(g); !err.empty()) throw CompileError("invalid IR: " + err);
  for (size_t i = 0; i < passes.size(); ++i) {
    const std::string& p = passes[i];
    if (p == "fold_constants") g = run_pass("fold_constants", &fold_constants, g);
    else if (p == "dce") g = run_pass("eliminate_dead_code", &eliminate_dead_code, g);
    else if (p == "cse") g = run_pass("eliminate_common_subexpressions", &eliminate_common_subexpressions, g);
    else if (p == "optimize") g = optimize(g);
    else if (p == "lower") {
      if (i + 1 != passes.size()) throw CompileError("'lower' must be the last pass");
      LowerOptions lo;
      lo.max_expression_depth = max_expression_depth;
      return describe(lower(g, lo));
    } else {
      throw CompileError("unknown pass '" + p + "' (fold_constants, dce, cse, optimize, lower)");
    }
  }
  return print(g);
}

}  // namespace chroma
