// The CPU code generator's internals: the Emitter class and the text helpers its parts share,
// internal to src/codegen/cpu (generate_cpu() in emit.h is the way in).
//
// One class whose methods are defined in several files, one part per file; the declarations
// below are grouped by part, each with its contract. The core (emitter.cpp) holds the state
// (the entries, the options, the entry being emitted and the oneDNN sites) and prints what
// every part prints through: buffer pointers, expressions, outputs and shapes; kernel_body()
// sends each kernel kind to the one method of its part that prints its body. The parts:
//  - emitter.cpp: the core: text helpers, pointers, expressions, the kernel-kind dispatch;
//  - emit_elementwise.cpp: expression-template kernels (assign, concat, reductions, softmax,
//    scans, arg-reductions, top-k), their iteration spaces in memory order;
//  - emit_indexing.cpp: gathers and index_put, the kernels that check their indices;
//  - emit_products.cpp: matrix products (BLAS, oneDNN's sgemm and bfloat16 matmul, packed,
//    quantized, routed and gathered) and the LAPACK factorizations;
//  - emit_conv.cpp: convolutions (oneDNN with its post-ops and epilogue, or GEMMs);
//  - emit_attention.cpp: attention in one kernel (chroma/cpu/attention.h);
//  - emit.cpp: the files: oneDNN sites, kernels grouped by signature, program.cpp's tables,
//    host.cpp and dnnl.cpp, the digest; generate_cpu().
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "codegen/cpu/emit.h"

namespace chroma::cpu_codegen {

// ---- text helpers (emitter.cpp) ----------------------------------------------------------------
//
// Spellings of the compiler's values in generated C++: each a pure function of its arguments.
std::string ctype(DType t);
std::string quant_acts(quant::Activations a);  // a quantized product's option as et::QuantActs
std::string int_list(const std::vector<int64_t>& v);  // "1, 2, 3"
std::string float_lit(float f);                       // round-trips the float's bits
std::string double_lit(double d);                     // round-trips the double's bits
std::string scalar_lit(const Scalar& s, DType t);

// Rank-0 iteration spaces run as rank 1 with extent 1.
inline std::vector<int64_t> norm_shape(const Shape& s) { return s.empty() ? Shape{1} : s; }
template <class T> std::vector<T> norm_strides(const std::vector<T>& s) { return s.empty() ? std::vector<T>{T{}} : s; }

class Emitter {
 public:
  Emitter(const std::vector<CpuEntry>& entries, const CpuCodegenOptions& o) : entries_(entries), o_(o) {}

  // ---- the files (emit.cpp) --------------------------------------------------------------------
  //
  // run() is the whole generator: it picks the oneDNN sites, prints every entry's kernels
  // (setting p_ to each entry in turn), groups them into files by signature and writes
  // program.cpp, host.cpp and dnnl.cpp; the digest covers every file's name and text.
  GeneratedSource run(const CpuArtifactInfo& info);

 private:
  void choose_dnnl_sites();
  static std::string prelude();
  static std::string kernel_signature(const std::string& body);
  static std::string fn_name(size_t e, size_t ki);
  static std::string c_str(const std::string& s);
  static std::string comment(const std::string& s);
  std::string io_table(const char* name, const std::vector<int32_t>& ids, bool inputs) const;
  std::string host_file() const;
  static std::string dnnl_file(bool conv, bool mm);
  std::string main_file(const CpuArtifactInfo& info);

  // ---- the core (emitter.cpp) ------------------------------------------------------------------
  //
  // Read p_ (the entry being emitted); print C++ expressions, no statements. kernel_body()
  // returns the statements of kernel `ki` of p_, each line indented by two spaces, ending
  // with a newline; the caller wraps them in the kernel's function.
  std::string ptr(int32_t buf, bool mut) const;
  std::string expr(const Expr& e) const;
  std::string out(int32_t buf, const Layout& l) const;
  static std::string shape_t(const Shape& s);
  std::string kernel_body(size_t ki) const;

  // ---- expression-template kernels (emit_elementwise.cpp) --------------------------------------
  //
  // One call into chroma/cpu/et.h each (concat: one per non-empty part); elementwise kernels
  // and reductions iterate in their operands' memory order.
  std::string assign(const Kernel& k) const;
  std::string concat(const Kernel& k) const;
  std::string reduce(const Kernel& k) const;
  std::string softmax(const Kernel& k) const;
  std::string scan(const Kernel& k) const;
  std::string arg_reduce(const Kernel& k) const;
  std::string topk(const Kernel& k) const;

  // ---- indexed kernels (emit_indexing.cpp) -----------------------------------------------------
  //
  // Each checks its indices and, on one out of range, returns cx.index_error(ki, index) from
  // the kernel's function (`ki`: the kernel's number in its entry).
  std::string gather(const Kernel& k, size_t ki) const;
  std::string index_put(const Kernel& k, size_t ki) const;

  // ---- products and factorizations (emit_products.cpp) -----------------------------------------
  //
  // matmul() picks oneDNN's bfloat16 matmul (a site in mm_sites_), oneDNN's sgemm, CBLAS or
  // the reference GEMM from o_ and the dtype; linalg() needs o_.blas (LAPACK) and refuses
  // without it.
  std::string matmul(const Kernel& k) const;
  std::string matmul_bf16(const Kernel& k) const;
  std::string matmul_packed(const Kernel& k) const;
  std::string matmul_gathered(const Kernel& k, size_t ki) const;
  std::string linalg(const Kernel& k) const;

  // ---- attention (emit_attention.cpp) ----------------------------------------------------------
  //
  // attention() calls et::attention with the GEMM the other products use; scalar_expr()
  // prints an expression over the scores at given coordinates (the bias).
  std::string attention(const Kernel& k) const;
  std::string scalar_expr(const Expr& e, const std::vector<std::string>& idx) const;

  // ---- convolutions (emit_conv.cpp) ------------------------------------------------------------
  //
  // conv() calls the kernel's oneDNN site (dnnl_sites_) with its post-ops and epilogue, or
  // et::conv with a GEMM; a channels-last or fused convolution must have a site.
  static bool conv_input_channels_last(const Kernel& k, const Program& p);
  std::string conv_epilogue(const Kernel& k) const;
  std::string conv(const Kernel& k) const;

  // ---- the state (the core's) ------------------------------------------------------------------
  const std::vector<CpuEntry>& entries_;
  const Program* p_ = nullptr;  // the entry being emitted
  const CpuCodegenOptions& o_;
  std::map<const Kernel*, int> dnnl_sites_;  // convolutions run by oneDNN -> cache slot
  std::map<const Kernel*, int> mm_sites_;    // bfloat16 products run by oneDNN -> cache slot
};

}  // namespace chroma::cpu_codegen
