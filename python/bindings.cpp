// chroma._compiler: the C++ compiler exposed to the Python package.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "import/importer.h"
#include "pipeline.h"
#include "targets/target.h"
#include "quant/quant.h"

namespace nb = nanobind;

namespace {

chroma::CompileOptions options(const std::string& target, bool blas, const std::string& include_dir,
                               const std::string& python_include, const std::string& cache_dir, int jobs, int max_depth,
                               const std::string& golden = "", const std::string& weights = "") {
  chroma::CompileOptions o;
  o.target = target;
  o.blas = blas;
  o.include_dir = include_dir;
  o.python_include = python_include;
  o.cache_dir = cache_dir;
  o.jobs = jobs;
  o.max_expression_depth = max_depth;
  o.golden_path = golden;
  o.weights = weights;
  return o;
}

}  // namespace

NB_MODULE(_compiler, m) {
  m.doc() = "Chroma's C++ compiler: graph file -> artifact directory";
  static nb::exception<chroma::CompileError> compile_error(m, "CompileError", PyExc_RuntimeError);
  // A CompileError saying only that the target lacks a capability (Target::supports); its
  // `refusals` are (what, node, source, reason) tuples, one per part the target refused.
  static nb::exception<chroma::UnsupportedError> unsupported(m, "UnsupportedError", compile_error);
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* type) {
        try {
          std::rethrow_exception(p);
        } catch (const chroma::UnsupportedError& e) {
          nb::list refusals;
          for (const chroma::Refusal& r : e.refusals()) refusals.append(nb::make_tuple(r.what, r.node, r.source, r.reason));
          nb::object exc = nb::borrow(static_cast<PyObject*>(type))(nb::str(e.what()));
          nb::setattr(exc, "refusals", refusals);
          PyErr_SetObject(static_cast<PyObject*>(type), exc.ptr());
        }
      },
      unsupported.ptr());
  m.def(
      "compile_graph",
      [](const std::string& graph, const std::string& out, const std::string& target, bool blas,
         const std::string& include_dir, const std::string& python_include, const std::string& cache_dir, int jobs,
         int max_depth, const std::string& golden, const std::string& weights) {
        const chroma::CompileOptions o =
            options(target, blas, include_dir, python_include, cache_dir, jobs, max_depth, golden, weights);
        nb::gil_scoped_release release;
        return chroma::compile_graph_file(graph, out, o);
      },
      nb::arg("graph"), nb::arg("out"), nb::arg("target") = "cpu", nb::arg("blas") = true, nb::arg("include_dir"),
      nb::arg("python_include") = "", nb::arg("cache_dir") = "", nb::arg("jobs") = 0, nb::arg("max_depth") = 32,
      nb::arg("golden") = "", nb::arg("weights") = "",
      "Compiles a .cgraph file into an artifact directory (target 'webgpu': also <out>.chroma-web, with the golden "
      "data described by the JSON file `golden`); returns the manifest JSON text.");
  m.def(
      "compile_graphs",
      [](const std::vector<std::string>& names, const std::vector<std::string>& graphs, const std::string& out,
         const std::string& target, bool blas, const std::string& include_dir, const std::string& python_include,
         const std::string& cache_dir, int jobs, int max_depth, const std::string& weights) {
        if (names.size() != graphs.size()) throw chroma::CompileError("compile_graphs: one name per graph file");
        const chroma::CompileOptions o = options(target, blas, include_dir, python_include, cache_dir, jobs, max_depth, "", weights);
        std::vector<chroma::EntrySpec> specs;
        for (size_t i = 0; i < names.size(); ++i) specs.push_back({names[i], graphs[i]});
        nb::gil_scoped_release release;
        return chroma::compile_graph_files(specs, out, o);
      },
      nb::arg("names"), nb::arg("graphs"), nb::arg("out"), nb::arg("target") = "cpu", nb::arg("blas") = true,
      nb::arg("include_dir"), nb::arg("python_include") = "", nb::arg("cache_dir") = "", nb::arg("jobs") = 0,
      nb::arg("max_depth") = 32, nb::arg("weights") = "",
      "Compiles several .cgraph files into one artifact with one entry point each (shared weights and state).");
  m.def(
      "plan_graph",
      [](const std::string& graph, const std::string& scratch, const std::string& target, bool blas,
         const std::string& include_dir, int max_depth, const std::string& weights) {
        const chroma::CompileOptions o = options(target, blas, include_dir, "", "", 0, max_depth, "", weights);
        nb::gil_scoped_release release;
        return chroma::plan_graph_files({{"forward", graph}}, scratch, o);
      },
      nb::arg("graph"), nb::arg("scratch"), nb::arg("target") = "cpu", nb::arg("blas") = true, nb::arg("include_dir"),
      nb::arg("max_depth") = 32, nb::arg("weights") = "",
      "What compiling a .cgraph file would plan (JSON: per entry its arena, kernels and constant bytes), with no "
      "code generated and nothing written.");
  m.def(
      "dump_graph",
      [](const std::string& graph, const std::string& stage, int max_depth) {
        return chroma::dump_graph_file(graph, stage, max_depth);
      },
      nb::arg("graph"), nb::arg("stage") = "optimized", nb::arg("max_depth") = 32,
      "The IR of a graph file after 'import' or 'optimized', or the 'lowered' kernels and plan.");
  m.def(
      "run_ir",
      [](const std::string& text, const std::vector<std::string>& passes, int max_depth) {
        return chroma::run_ir_text(text, passes, max_depth);
      },
      nb::arg("text"), nb::arg("passes"), nb::arg("max_depth") = 32,
      "Parses IR text, runs the passes (fold_constants, dce, cse, optimize, lower), returns the result as text.");
#ifdef CHROMA_DNNL_LIBRARY
  m.def("dnnl_library", [] { return std::string(CHROMA_DNNL_LIBRARY); },
        "The oneDNN 3 library artifacts link (CMakeLists.txt), or '' when Chroma was built without it.");
#else
  m.def("dnnl_library", [] { return std::string(); },
        "The oneDNN 3 library artifacts link (CMakeLists.txt), or '' when Chroma was built without it.");
#endif
  m.def("target_names", &chroma::target_names, "Every registered target's name (src/targets/registry.cpp).");
  m.def(
      "gpu_kernel_sources",
      [](const std::string& graph, const std::string& target) { return chroma::gpu_kernel_sources(graph, target); },
      nb::arg("graph"), nb::arg("target") = "webgpu",
      "The GPU kernels of a .cgraph file as the GPU target ('webgpu', 'cuda', 'metal', 'null') generates them: "
      "each distinct module's text.");
  m.def(
      "quantize",
      [](nb::bytes data, int64_t rows, int64_t k, int bits) {
        if (static_cast<int64_t>(data.size()) != rows * k * 4) throw chroma::CompileError("quantize: expected rows * k float32 values");
        if (bits != 4 && bits != 6 && bits != 8) throw chroma::CompileError("quantize: bits must be 4, 6 or 8");
        const chroma::quant::Quantized q =
            chroma::quant::quantize_matrix(reinterpret_cast<const float*>(data.c_str()), rows, k, k, 1, bits);
        if (!q.ok) throw chroma::CompileError("quantize: a group's scale or bias does not fit float16");
        return nb::make_tuple(nb::bytes(reinterpret_cast<const char*>(q.q.data()), q.q.size()),
                              nb::bytes(reinterpret_cast<const char*>(q.scales.data()), q.scales.size() * 2),
                              nb::bytes(reinterpret_cast<const char*>(q.biases.data()), q.biases.size() * 2));
      },
      nb::arg("data"), nb::arg("rows"), nb::arg("k"), nb::arg("bits"),
      "MLX affine quantization of a row-major float32 [rows, k] matrix along k (groups of 64, float16 scales and "
      "biases): (q as uint8 [rows, k], scales float16 bits [rows, groups], biases likewise), as raw bytes.");
  m.def(
      "decide_weight",
      [](const std::string& spec, const std::string& name, const std::string& role, int64_t k, int64_t n, int64_t matrices) {
        const chroma::quant::Decision d = chroma::quant::decide(chroma::quant::parse_policy(spec), name, role, k, n, matrices);
        return nb::make_tuple(std::string(chroma::quant::format_name(d.format)), d.reason, d.bytes);
      },
      nb::arg("spec"), nb::arg("name"), nb::arg("role"), nb::arg("k"), nb::arg("n"), nb::arg("matrices") = 1,
      "The compiler's decision for one weight (K x N, `matrices` of them) under a weights policy string: "
      "(format, reason, stored bytes).");
  m.def(
      "pack_weights",
      [](nb::bytes data, int64_t k, int64_t n, const std::string& format) {
        const auto f = chroma::quant::parse_format(format);
        if (!f || *f == chroma::quant::Format::kF32) throw chroma::CompileError("pack_weights: format must be bf16, q8, q6 or q4");
        if (static_cast<int64_t>(data.size()) != k * n * 4) throw chroma::CompileError("pack_weights: expected k * n float32 values");
        std::vector<uint8_t> packed(static_cast<size_t>(chroma::quant::matrix_bytes(*f, k, n)));
        if (!chroma::quant::pack(*f, reinterpret_cast<const float*>(data.c_str()), k, n, n, 1, packed.data())) {
          throw chroma::CompileError("pack_weights: a group's scale or bias does not fit float16");
        }
        const std::vector<float> w = chroma::quant::unpack(*f, packed.data(), k, n);
        return nb::make_tuple(nb::bytes(reinterpret_cast<const char*>(packed.data()), packed.size()),
                              nb::bytes(reinterpret_cast<const char*>(w.data()), w.size() * 4));
      },
      nb::arg("data"), nb::arg("k"), nb::arg("n"), nb::arg("format"),
      "Packs a row-major float32 [k, n] product operand as the CPU kernels read it; returns (packed bytes, the "
      "float32 [k, n] weights they stand for).");
  m.def("supported_aten_targets", &chroma::supported_aten_targets);
  m.def("refusal", &chroma::refusal, nb::arg("target"),
        "Why an ATen target cannot be compiled by design (random numbers, data-dependent shapes, complex "
        "numbers), or '' when nothing rules it out.");
  m.attr("__version__") = CHROMA_VERSION;
}
