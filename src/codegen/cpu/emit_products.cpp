// The CPU generator's products and factorizations (emitter.h): matrix products on oneDNN's
// bfloat16 matmul or sgemm, CBLAS or the reference GEMM; packed, quantized and routed products
// over a batch of offset tables; gathered products (chroma/cpu/gemm_packed.h, gemm_quant.h);
// LAPACK factorizations (chroma/cpu/linalg.h).
#include "codegen/cpu/emitter.h"

#include <algorithm>
#include <sstream>

namespace chroma::cpu_codegen {

std::string Emitter::matmul(const Kernel& k) const {
  if (k.weight_format() == quant::Format::kBF16) return matmul_bf16(k);
  const Expr& a = k.inputs[0];
  const Expr& b = k.inputs[1];
  const Buffer& c = p_->buffers[static_cast<size_t>(k.outputs[0])];
  const size_t r = k.shape.size();
  const int64_t m = k.shape[r - 2], n = k.shape[r - 1], kk = a.layout.shape[r - 1];
  const std::string t = ctype(c.type.dtype);
  auto op = [](const Layout& l, bool* trans, int64_t* ld) {
    const size_t rr = l.shape.size();
    // Row-major needs a row stride of at least the row length: a [1, n] view of a column
    // (strides 1, 1) is column-major with ld 1, not row-major with an illegal ld.
    if (l.strides[rr - 1] == 1 && l.strides[rr - 2] >= std::max<int64_t>(l.shape[rr - 1], 1)) {
      *trans = false;
      *ld = l.strides[rr - 2];
    } else {
      *trans = true;
      *ld = l.strides[rr - 1];
    }
  };
  bool ta = false, tb = false;
  int64_t lda = 0, ldb = 0;
  op(a.layout, &ta, &lda);
  op(b.layout, &tb, &ldb);
  std::ostringstream o;
  o << "  const " << t << "* A = static_cast<const " << t << "*>(" << ptr(a.buffer, false) << ") + " << a.layout.offset << ";\n";
  o << "  const " << t << "* B = static_cast<const " << t << "*>(" << ptr(b.buffer, false) << ") + " << b.layout.offset << ";\n";
  o << "  " << t << "* C = static_cast<" << t << "*>(" << ptr(k.outputs[0], true) << ");\n";
  if (numel(k.shape) == 0) return o.str() + "  (void)A; (void)B; (void)C;\n";
  const Shape cs = contiguous_strides(k.shape);
  if (o_.dnnl_sgemm && c.type.dtype == DType::kF32 && kk > 0) {
    // oneDNN's sgemm on the program's pool (chroma/cpu/sgemm.h): the batch dimensions are
    // one flat index q, products side by side when they are small.
    const std::string args = std::string(ta ? "true" : "false") + ", " + (tb ? "true" : "false") + ", " +
                             std::to_string(m) + ", " + std::to_string(n) + ", " + std::to_string(kk);
    if (r == 2) {
      o << "  et::sgemm(cx.pool, " << args << ", A, " << lda << ", B, " << ldb << ", C, " << n << ");\n";
      return o.str();
    }
    o << "  et::sgemm_batch(cx.pool, " << numel(Shape(k.shape.begin(), k.shape.end() - 2)) << ", " << m << ", " << n << ", "
      << kk << ", [&](int64_t q, ::chroma::rt::ThreadPool* pool) {\n";
    std::string ao, bo, co;
    for (size_t d = r - 2; d-- > 0;) {
      const std::string i = "b" + std::to_string(d);
      o << "    const int64_t " << i << " = q % " << k.shape[d] << ";\n";
      if (d > 0) o << "    q /= " << k.shape[d] << ";\n";
      ao += " + " + i + " * " + std::to_string(a.layout.strides[d]);
      bo += " + " + i + " * " + std::to_string(b.layout.strides[d]);
      co += " + " + i + " * " + std::to_string(cs[d]);
    }
    o << "    et::sgemm(pool, " << args << ", A" << ao << ", " << lda << ", B" << bo << ", " << ldb << ", C" << co << ", " << n
      << ");\n  });\n";
    return o.str();
  }
  std::string ao = "", bo = "", co = "";
  std::string indent = "  ";
  for (size_t d = 0; d + 2 < r; ++d) {
    const std::string i = "b" + std::to_string(d);
    o << indent << "for (int64_t " << i << " = 0; " << i << " < " << k.shape[d] << "; ++" << i << ") {\n";
    indent += "  ";
    ao += " + " + i + " * " + std::to_string(a.layout.strides[d]);
    bo += " + " + i + " * " + std::to_string(b.layout.strides[d]);
    co += " + " + i + " * " + std::to_string(cs[d]);
  }
  const bool use_blas = o_.blas && (c.type.dtype == DType::kF32 || c.type.dtype == DType::kF64) && kk > 0;
  if (use_blas) {
    o << indent << (c.type.dtype == DType::kF32 ? "cblas_sgemm" : "cblas_dgemm") << "(CblasRowMajor, "
      << (ta ? "CblasTrans" : "CblasNoTrans") << ", " << (tb ? "CblasTrans" : "CblasNoTrans") << ", " << m << ", " << n
      << ", " << kk << ", 1, A" << ao << ", " << lda << ", B" << bo << ", " << ldb << ", 0, C" << co << ", " << n << ");\n";
  } else {
    o << indent << "et::gemm_ref<" << t << ">(" << (ta ? "true" : "false") << ", " << (tb ? "true" : "false") << ", " << m
      << ", " << n << ", " << kk << ", A" << ao << ", " << lda << ", B" << bo << ", " << ldb << ", C" << co << ", " << n
      << ");\n";
  }
  for (size_t d = 0; d + 2 < r; ++d) {
    indent.resize(indent.size() - 2);
    o << indent << "}\n";
  }
  return o.str();
}

// A bfloat16 model's product on oneDNN's bfloat16 matmul (Lowerer::bf16_dnnl_matmul): A's
// rows evenly spaced over its batch, B one bfloat16 matrix (any strides), C contiguous.
std::string Emitter::matmul_bf16(const Kernel& k) const {
  const Expr& a = k.inputs[0];
  const Expr& b = k.inputs[1];
  const size_t r = k.shape.size();
  const int64_t n = k.shape[r - 1], kk = a.layout.shape[r - 1], rows = numel(k.shape) / std::max<int64_t>(n, 1);
  auto site = mm_sites_.find(&k);
  if (site == mm_sites_.end()) throw CompileError("internal: a bfloat16 oneDNN product (" + k.name + ") without a site");
  std::ostringstream o;
  o << "  matmul_dnnl_site(" << site->second << ", " << rows << ", " << n << ", " << kk << ", static_cast<const float*>("
    << ptr(a.buffer, false) << ") + " << a.layout.offset << ", " << a.layout.strides[r - 2] << ", static_cast<const uint16_t*>("
    << ptr(b.buffer, false) << ") + " << b.layout.offset << ", " << b.layout.strides[r - 2] << ", " << b.layout.strides[r - 1]
    << ", static_cast<float*>(" << ptr(k.outputs[0], true) << "), " << n << ", cx.pool);\n";
  return o.str();
}

std::string Emitter::matmul_packed(const Kernel& k) const {
  const Expr& a = k.inputs[0];
  const Expr& b = k.inputs[1];
  const size_t r = k.shape.size();
  const int64_t m = k.shape[r - 2], ldc = k.shape[r - 1], kk = a.layout.shape[r - 1];
  const bool routed = !k.packed().routed.experts.empty();
  const int64_t n = routed && k.packed().routed.n > 0 ? k.packed().routed.n : ldc;
  std::ostringstream o;
  o << "  static constexpr int64_t ao[] = {" << int_list(k.batches().a) << "};\n";
  o << "  static constexpr int64_t bo[] = {" << int_list(k.batches().b) << "};\n";
  o << "  static constexpr int64_t co[] = {" << int_list(k.batches().c) << "};\n";
  std::string offs = "ao", boffs = "bo", coffs = "co", count;
  if (routed) {
    // Only the batches whose expert some token selected (Kernel::routed).
    const Expr& mk = k.inputs[2];
    const size_t nb = k.batches().a.size();
    o << "  static constexpr int64_t ex[] = {" << int_list(k.packed().routed.experts) << "};\n";
    o << "  const float* mk = static_cast<const float*>(" << ptr(mk.buffer, false) << ") + " << mk.layout.offset << ";\n";
    o << "  int64_t ra[" << nb << "], rb[" << nb << "], rc[" << nb << "], nb = 0;\n";
    o << "  for (int64_t b = 0; b < " << nb << "; ++b) {\n    if (mk[ex[b] * " << mk.layout.strides[0]
      << "] == 0.0f) continue;\n    ra[nb] = ao[b];\n    rb[nb] = bo[b];\n    rc[nb] = co[b];\n    ++nb;\n  }\n";
    offs = "ra", boffs = "rb", coffs = "rc", count = ", nb";
  }
  if (k.weight_format() != quant::Format::kF32) {
    o << "  et::gemm_quant<" << static_cast<int>(k.weight_format()) << ", " << k.batches().a.size() << ", " << m << ", " << n << ", "
      << kk << ">(static_cast<const float*>(" << ptr(a.buffer, false) << "), " << offs << ", " << a.layout.strides[r - 2] << ", "
      << a.layout.strides[r - 1] << ",\n      static_cast<const uint8_t*>(" << ptr(b.buffer, false)
      << "), " << boffs << ", static_cast<float*>(" << ptr(k.outputs[0], true) << "), " << coffs << ", " << ldc << ", cx.pool, "
      << quant_acts(k.activations()) << count << ");\n";
    return o.str();
  }
  o << "  et::gemm_packed<" << k.batches().a.size() << ", " << m << ", " << n << ", " << kk << ">(static_cast<const float*>("
    << ptr(a.buffer, false) << "), " << offs << ", " << a.layout.strides[r - 2] << ", " << a.layout.strides[r - 1]
    << ",\n      static_cast<const float*>(" << ptr(b.buffer, false) << "), " << boffs << ", static_cast<float*>("
    << ptr(k.outputs[0], true) << "), " << coffs << ", " << ldc << ", cx.pool" << count << ");\n";
  return o.str();
}

// Packed experts chosen per job by the index buffer (Kernel::Gathered); an index out of range
// is reported.
std::string Emitter::matmul_gathered(const Kernel& k, size_t ki) const {
  const Kernel::Gathered& gg = k.gathered().job;
  const Expr& idx = k.inputs[2];
  std::ostringstream o;
  o << "  static constexpr int64_t ao[] = {" << int_list(k.batches().a) << "};\n";
  o << "  static constexpr int64_t io[] = {" << int_list(k.batches().b) << "};\n";
  o << "  static constexpr int64_t co[] = {" << int_list(k.batches().c) << "};\n";
  const bool q = k.weight_format() != quant::Format::kF32;
  o << "  int64_t bad = 0;\n  if (!et::" << (q ? "gemm_quant_gathered<" + std::to_string(static_cast<int>(k.weight_format())) + ", " : "gemm_packed_gathered<")
    << k.batches().a.size() << ", " << gg.m << ", " << gg.n << ", "
    << gg.k << ", " << gg.experts << ">(static_cast<const float*>(" << ptr(k.inputs[0].buffer, false) << "), ao, "
    << gg.sar << ", " << gg.sac << ",\n      static_cast<const " << (q ? "uint8_t" : "float") << "*>(" << ptr(k.inputs[1].buffer, false)
    << "), static_cast<const " << ctype(idx.dtype) << "*>(" << ptr(idx.buffer, false) << "), io, static_cast<float*>("
    << ptr(k.outputs[0], true) << "), co, " << gg.ldc << ", cx.pool, " << (q ? quant_acts(k.activations()) + ", " : "")
    << "&bad)) return cx.index_error(" << ki << ", bad);\n";
  return o.str();
}

// Linalg: one call into chroma/cpu/linalg.h (LAPACK), which needs OpenBLAS at link time.
std::string Emitter::linalg(const Kernel& k) const {
  if (!o_.blas) {
    throw CompileError("node '" + k.name + "' (" + k.label + ", " + k.source +
                       "): linear-algebra factorizations run through LAPACK (OpenBLAS); compile with blas=True");
  }
  const Shape& xs = k.inputs[0].layout.shape;
  const size_t r = xs.size();
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < r; ++i) batch *= xs[i];
  std::vector<int64_t> dims(6, 0);
  for (size_t i = 0; i < k.inputs.size() && i < 3; ++i) {
    const Shape& s = k.inputs[i].layout.shape;
    const bool vec = i > 0 && s.size() == r - 1;
    dims[2 * i] = vec ? 1 : s[s.size() - 2];
    dims[2 * i + 1] = s.back();
  }
  const std::string t = ctype(k.inputs[0].dtype);
  std::ostringstream o;
  o << "  static constexpr int64_t dims[] = {" << int_list(dims) << "};\n  const " << t << "* in[] = {";
  for (size_t i = 0; i < k.inputs.size(); ++i) {
    // Offsets count elements of the input's own type (ldl_solve's pivots are int32).
    const std::string it = ctype(k.inputs[i].dtype);
    o << (i ? ", " : "") << "static_cast<const " << t << "*>(static_cast<const void*>(static_cast<const " << it << "*>("
      << ptr(k.inputs[i].buffer, false) << ") + " << k.inputs[i].layout.offset << "))";
  }
  o << "};\n  void* out[] = {";
  for (size_t i = 0; i < k.outputs.size(); ++i) o << (i ? ", " : "") << ptr(k.outputs[i], true);
  o << "};\n  ::chroma::linalg::run<" << t << ">(" << k.attrs.k << ", " << k.attrs.start << ", " << batch
    << ", dims, in, out);\n";
  return o.str();
}

}  // namespace chroma::cpu_codegen
