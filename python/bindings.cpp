// chroma._compiler: the C++ compiler exposed to the Python package.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "import/importer.h"
#include "pipeline.h"

namespace nb = nanobind;

namespace {

chroma::CompileOptions options(const std::string& target, bool blas, const std::string& include_dir,
                               const std::string& python_include, const std::string& cache_dir, int jobs, int max_depth,
                               const std::string& golden = "") {
  chroma::CompileOptions o;
  o.target = target;
  o.blas = blas;
  o.include_dir = include_dir;
  o.python_include = python_include;
  o.cache_dir = cache_dir;
  o.jobs = jobs;
  o.max_expression_depth = max_depth;
  o.golden_path = golden;
  return o;
}

}  // namespace

NB_MODULE(_compiler, m) {
  m.doc() = "Chroma's C++ compiler: graph file -> artifact directory";
  static nb::exception<chroma::CompileError> compile_error(m, "CompileError", PyExc_RuntimeError);
  m.def(
      "compile_graph",
      [](const std::string& graph, const std::string& out, const std::string& target, bool blas,
         const std::string& include_dir, const std::string& python_include, const std::string& cache_dir, int jobs,
         int max_depth, const std::string& golden) {
        const chroma::CompileOptions o = options(target, blas, include_dir, python_include, cache_dir, jobs, max_depth, golden);
        nb::gil_scoped_release release;
        return chroma::compile_graph_file(graph, out, o);
      },
      nb::arg("graph"), nb::arg("out"), nb::arg("target") = "cpu", nb::arg("blas") = true, nb::arg("include_dir"),
      nb::arg("python_include") = "", nb::arg("cache_dir") = "", nb::arg("jobs") = 0, nb::arg("max_depth") = 32,
      nb::arg("golden") = "",
      "Compiles a .cgraph file into an artifact directory (target 'webgpu': also <out>.chroma-web, with the golden "
      "data described by the JSON file `golden`); returns the manifest JSON text.");
  m.def(
      "compile_graphs",
      [](const std::vector<std::string>& names, const std::vector<std::string>& graphs, const std::string& out,
         const std::string& target, bool blas, const std::string& include_dir, const std::string& python_include,
         const std::string& cache_dir, int jobs, int max_depth) {
        if (names.size() != graphs.size()) throw chroma::CompileError("compile_graphs: one name per graph file");
        const chroma::CompileOptions o = options(target, blas, include_dir, python_include, cache_dir, jobs, max_depth);
        std::vector<chroma::EntrySpec> specs;
        for (size_t i = 0; i < names.size(); ++i) specs.push_back({names[i], graphs[i]});
        nb::gil_scoped_release release;
        return chroma::compile_graph_files(specs, out, o);
      },
      nb::arg("names"), nb::arg("graphs"), nb::arg("out"), nb::arg("target") = "cpu", nb::arg("blas") = true,
      nb::arg("include_dir"), nb::arg("python_include") = "", nb::arg("cache_dir") = "", nb::arg("jobs") = 0,
      nb::arg("max_depth") = 32,
      "Compiles several .cgraph files into one artifact with one entry point each (shared weights and state).");
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
  m.def(
      "gpu_kernel_sources",
      [](const std::string& graph, const std::string& dialect) { return chroma::gpu_kernel_sources(graph, dialect); },
      nb::arg("graph"), nb::arg("dialect") = "wgsl",
      "The GPU kernels of a .cgraph file in one dialect ('wgsl', 'cuda'): each distinct module's text.");
  m.def("supported_aten_targets", &chroma::supported_aten_targets);
  m.def("refusal", &chroma::refusal, nb::arg("target"),
        "Why an ATen target cannot be compiled by design (random numbers, data-dependent shapes, complex "
        "numbers), or '' when nothing rules it out.");
  m.attr("__version__") = CHROMA_VERSION;
}
