// The CPU generator's attention kernels (emitter.h): one call of et::attention
// (chroma/cpu/attention.h) with the operands of each batch and the bias as a function over a
// row of scores, printed as scalar C++ over the scores' coordinates.
#include <sstream>

#include "codegen/cpu/emitter.h"

namespace chroma::cpu_codegen {

// Expression `e` over the scores' shape at coordinates idx (C++ expressions, one per
// dimension), as one scalar C++ expression: loads address their buffer through their layout,
// the operations are the expression templates' scalar functions (the same bits).
std::string Emitter::scalar_expr(const Expr& e, const std::vector<std::string>& idx) const {
  switch (e.kind) {
    case Expr::kLoad: {
      std::string at = std::to_string(e.layout.offset);
      for (size_t d = 0; d < idx.size(); ++d) {
        if (e.layout.shape[d] != 1 && e.layout.strides[d] != 0) at += " + " + idx[d] + " * " + std::to_string(e.layout.strides[d]);
      }
      const std::string t = ctype(e.dtype);
      return "static_cast<const " + t + "*>(" + ptr(e.buffer, false) + ")[" + at + "]";
    }
    case Expr::kLiteral:
      return scalar_lit(e.literal, e.dtype);
    case Expr::kIota: {
      std::string v = "(" + double_lit(e.iota_base.as_double() + e.affine.offset);
      for (size_t d = 0; d < idx.size(); ++d) {
        if (e.affine.strides[d] != 0) v += " + " + double_lit(e.affine.strides[d]) + " * static_cast<double>(" + idx[d] + ")";
      }
      return "static_cast<" + ctype(e.dtype) + ">" + v + ")";
    }
    case Expr::kMap: {
      std::string r = "et::op::" + std::string(ew_info(e.ew).name) + "::apply(";
      for (size_t i = 0; i < e.children.size(); ++i) r += (i ? ", " : "") + scalar_expr(e.children[i], idx);
      return "static_cast<" + ctype(e.dtype) + ">(" + r + "))";
    }
    case Expr::kCast: {
      const std::string x = scalar_expr(e.children[0], idx);
      if (e.dtype == DType::kBF16) return "::chroma::bf16(static_cast<float>(" + x + "))";
      if (e.dtype == DType::kF16) return "::chroma::f16(static_cast<float>(" + x + "))";
      return "static_cast<" + ctype(e.dtype) + ">(static_cast<float>(" + x + "))";
    }
  }
  throw CompileError("internal: an attention bias with an expression the generator cannot print");
}

std::string Emitter::attention(const Kernel& k) const {
  const size_t r = k.shape.size();
  const Expr &q = k.inputs[0], &kt = k.inputs[1], &v = k.inputs[2];
  const int64_t L = k.shape[r - 2], E = k.shape[r - 1], D = q.layout.shape[r - 1], S = kt.layout.shape[r - 1];
  const int64_t batches = numel(Shape(k.shape.begin(), k.shape.end() - 2));
  const char* gemm = o_.dnnl_sgemm ? "kDnnl" : o_.blas ? "kBlas" : "kRef";
  std::ostringstream o;
  // Batch b's coordinates, the last batch dimension fastest.
  std::string coords;
  std::vector<std::string> idx;
  for (size_t d = 0; d + 2 < r; ++d) idx.push_back("c" + std::to_string(d));
  if (r > 2) {
    coords += "      int64_t rest = b;\n";
    for (size_t d = r - 2; d-- > 0;) {
      coords += "      const int64_t c" + std::to_string(d) + " = rest % " + std::to_string(k.shape[d]) + ";\n";
      if (d > 0) coords += "      rest /= " + std::to_string(k.shape[d]) + ";\n";
    }
  }
  auto operand = [&](const Expr& x, const char* name) {
    std::string at = std::to_string(x.layout.offset);
    for (size_t d = 0; d + 2 < r; ++d) at += " + c" + std::to_string(d) + " * " + std::to_string(x.layout.strides[d]);
    return std::string("      *") + name + " = {static_cast<const float*>(" + ptr(x.buffer, false) + ") + " + at + ", " +
           std::to_string(x.layout.strides[r - 2]) + ", " + std::to_string(x.layout.strides[r - 1]) + "};\n";
  };
  o << "  float* O = static_cast<float*>(" << ptr(k.outputs[0], true) << ");\n";
  o << "  et::attention<et::AttnGemm::" << gemm << (k.attrs.dtype == DType::kBF16 ? ", true" : "") << ">(cx.pool, " << batches << ", " << L << ", " << S << ", " << D << ", " << E
    << ", " << float_lit(static_cast<float>(k.attrs.scalar.as_double())) << ", " << (k.attrs.k ? "true" : "false") << ", O,\n";
  o << "    [&]([[maybe_unused]] int64_t b, et::AttnOperand* q, et::AttnOperand* kt, et::AttnOperand* v) {\n"
    << coords << operand(q, "q") << operand(kt, "kt") << operand(v, "v") << "    },\n";
  if (k.inputs.size() > 3) {
    std::vector<std::string> at = idx;
    at.push_back("i");
    at.push_back("(j0 + j)");
    o << "    [&]([[maybe_unused]] int64_t b, int64_t i, int64_t j0, int64_t n, float* s) {\n"
      << coords << "      for (int64_t j = 0; j < n; ++j) s[j] = et::op::add::apply(s[j], static_cast<float>("
      << scalar_expr(k.inputs[3], at) << "));\n    });\n";
  } else {
    o << "    [](int64_t, int64_t, int64_t, int64_t, float*) {});\n";
  }
  return o.str();
}

}  // namespace chroma::cpu_codegen
