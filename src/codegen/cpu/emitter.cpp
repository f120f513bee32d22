// The CPU generator's core (emitter.h): the text helpers, and the buffer pointers, expressions
// and outputs every part prints through; kernel_body() sends a kernel to its part.
#include "codegen/cpu/emitter.h"

#include <cmath>
#include <cstdio>

namespace chroma::cpu_codegen {

std::string ctype(DType t) { return std::string(dtype_ctype(t)); }

std::string quant_acts(quant::Activations a) {
  switch (a) {
    case quant::Activations::kAuto: return "et::QuantActs::kAuto";
    case quant::Activations::kBF16: return "et::QuantActs::kBF16";
    case quant::Activations::kFP32: return "et::QuantActs::kFP32";
  }
  return "et::QuantActs::kFP32";
}

std::string int_list(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

std::string float_lit(float f) {
  if (std::isinf(f)) return f > 0 ? "INFINITY" : "-INFINITY";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9gf", static_cast<double>(f));
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s.insert(s.size() - 1, ".0");
  return s;
}

std::string double_lit(double d) {
  if (std::isnan(d)) return "std::numeric_limits<double>::quiet_NaN()";
  if (std::isinf(d)) return d > 0 ? "std::numeric_limits<double>::infinity()" : "-std::numeric_limits<double>::infinity()";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", d);
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string scalar_lit(const Scalar& s, DType t) {
  const std::string c = ctype(t);
  if (s.is_int) {
    if (s.i == INT64_MIN) return "static_cast<" + c + ">(INT64_MIN)";
    return "static_cast<" + c + ">(INT64_C(" + std::to_string(s.i) + "))";
  }
  return "static_cast<" + c + ">(" + double_lit(s.f) + ")";
}


std::string Emitter::ptr(int32_t buf, bool mut) const {
  const Buffer& b = p_->buffers[static_cast<size_t>(buf)];
  switch (b.region) {
    case Region::kInput: return "cx.in[" + std::to_string(b.slot) + "]";
    case Region::kOutput: return "cx.out[" + std::to_string(b.slot) + "]";
    case Region::kConstant:
      return std::string(mut ? "const_cast<void*>" : "") + "(static_cast<const void*>(cx.weights + " + std::to_string(b.offset) + "))";
    case Region::kArena: return "static_cast<void*>(cx.arena + " + std::to_string(b.offset) + ")";
    case Region::kState: return "static_cast<void*>(cx.state + " + std::to_string(b.offset) + ")";
  }
  return "nullptr";
}

std::string Emitter::expr(const Expr& e) const {
  switch (e.kind) {
    case Expr::kLoad:
      return "et::load<" + ctype(e.dtype) + ", et::St<" + int_list(norm_strides(e.layout.strides)) + ">, " +
             std::to_string(e.layout.offset) + ">(" + ptr(e.buffer, false) + ")";
    case Expr::kLiteral:
      return "et::lit<" + ctype(e.dtype) + ">(" + scalar_lit(e.literal, e.dtype) + ")";
    case Expr::kIota: {
      std::vector<double> c = norm_strides(e.affine.strides);
      std::string base;
      if (!is_float(e.dtype)) {
        const int64_t b = (e.iota_base.is_int ? e.iota_base.i : static_cast<int64_t>(e.iota_base.f)) +
                          static_cast<int64_t>(e.affine.offset);
        base = "INT64_C(" + std::to_string(b) + ")";
      } else {
        base = double_lit(e.iota_base.as_double() + e.affine.offset);
      }
      std::string s = "et::Iota<" + ctype(e.dtype) + ", " + std::to_string(c.size()) + ">{" + base + ", {";
      for (size_t i = 0; i < c.size(); ++i) {
        s += (i ? ", " : "") + (is_float(e.dtype) ? double_lit(c[i]) : std::to_string(static_cast<int64_t>(c[i])));
      }
      return s + "}}";
    }
    case Expr::kCast:
      return "et::cast<" + ctype(e.dtype) + ">(" + expr(e.children[0]) + ")";
    case Expr::kMap: {
      std::string s = "et::map<et::op::" + std::string(ew_info(e.ew).name) + ", " + ctype(e.dtype) + ">(";
      for (size_t i = 0; i < e.children.size(); ++i) s += (i ? ", " : "") + expr(e.children[i]);
      return s + ")";
    }
  }
  return "";
}

std::string Emitter::out(int32_t buf, const Layout& l) const {
  const Buffer& b = p_->buffers[static_cast<size_t>(buf)];
  return "et::out<" + ctype(b.type.dtype) + ", et::St<" + int_list(norm_strides(l.strides)) + ">, " +
         std::to_string(l.offset) + ">(" + ptr(buf, true) + ")";
}

std::string Emitter::shape_t(const Shape& s) { return "et::Shape<" + int_list(norm_shape(s)) + ">"; }

// Each kind's body is printed by one method of its part (emitter.h lists the parts).
std::string Emitter::kernel_body(size_t ki) const {
  const Kernel& k = p_->kernels[ki];
  switch (k.kind) {
    case Kernel::kAssign: return assign(k);
    case Kernel::kConcat: return concat(k);
    case Kernel::kReduce: return reduce(k);
    case Kernel::kSoftmax: return softmax(k);
    case Kernel::kScan: return scan(k);
    case Kernel::kArgReduce: return arg_reduce(k);
    case Kernel::kTopK: return topk(k);
    case Kernel::kGather:
    case Kernel::kGatherElements: return gather(k, ki);
    case Kernel::kIndexPut: return index_put(k, ki);
    case Kernel::kMatMul: return matmul(k);
    case Kernel::kMatMulPacked: return matmul_packed(k);
    case Kernel::kMatMulGathered: return matmul_gathered(k, ki);
    case Kernel::kConv: return conv(k);
    case Kernel::kLinalg: return linalg(k);
    case Kernel::kAttention: return attention(k);
  }
  return "";
}

}  // namespace chroma::cpu_codegen
