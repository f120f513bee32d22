// The CPU generator's convolutions (emitter.h): geometry normalised to three spatial
// dimensions; a oneDNN site (dnnl.cpp's glue) with the kernel's post-ops and its epilogue as a
// function over stored pixels, or et::conv (chroma/cpu/conv.h) over a GEMM.
#include "codegen/cpu/emitter.h"

#include <functional>
#include <sstream>

namespace chroma::cpu_codegen {

// Conv: geometry normalised to 3 spatial dims, GEMMs through BLAS (or the reference GEMM).
// A convolution's input is read channels-last; where both descriptions fit the memory (one
// channel, or spatial extent 1), as the output is written.
bool Emitter::conv_input_channels_last(const Kernel& k, const Program& p) {
  const Layout& x = k.inputs[0].layout;
  return is_channels_last(x) && (!is_contiguous(x) || p.buffers[static_cast<size_t>(k.outputs[0])].channels_last());
}

// A channels-last convolution's epilogue (Kernel::epilogue) as a function over a block of
// its stored result, whole pixels [i0, i0 + n): the expression's loads of the output are
// y[p + c], of a per-channel or scalar constant its element c or its one element, of
// another channels-last buffer of the same shape the same element; the operations are the
// scalar functions the expression templates use, so the values are the same bits.
std::string Emitter::conv_epilogue(const Kernel& k) const {
  const Expr& e = k.inputs[static_cast<size_t>(k.epilogue())];
  const int32_t out = k.outputs[0];
  const std::vector<int64_t> cl = channels_last_strides(k.shape);
  std::function<std::string(const Expr&)> print = [&](const Expr& x) -> std::string {
    switch (x.kind) {
      case Expr::kLoad: {
        if (x.buffer == out) return "v";
        const std::string base = "static_cast<const float*>(" + ptr(x.buffer, false) + ")[" + std::to_string(x.layout.offset);
        bool scalar = true, channel = true;
        for (size_t d = 0; d < x.layout.shape.size(); ++d) {
          const int64_t st = x.layout.shape[d] == 1 ? 0 : x.layout.strides[d];
          scalar = scalar && st == 0;
          channel = channel && st == (d == 1 ? 1 : 0);
        }
        if (scalar) return base + "]";
        if (channel) return base + " + c]";
        if (x.layout.strides != cl) throw CompileError("internal: a convolution epilogue reads a layout it cannot address");
        return base + " + p + c]";
      }
      case Expr::kLiteral:
        return scalar_lit(x.literal, x.dtype);
      case Expr::kMap: {
        std::string r = "static_cast<float>(et::op::" + std::string(ew_info(x.ew).name) + "::apply(";
        for (size_t i = 0; i < x.children.size(); ++i) r += (i ? ", " : "") + print(x.children[i]);
        return r + "))";
      }
      case Expr::kCast: {  // float32 <-> bfloat16 / float16 (a half model's rounding)
        const DType from = x.children[0].dtype;
        const Expr& inner = x.children[0];
        if (x.dtype == DType::kF32 && from == DType::kBF16 && inner.kind == Expr::kCast &&
            inner.children[0].dtype == DType::kF32) {  // a rounding: in 32-bit lanes
          return "::chroma::half_detail::round_to_bf16(" + print(inner.children[0]) + ")";
        }
        if (x.dtype == DType::kF32 && is_half(from)) return "static_cast<float>(" + print(x.children[0]) + ")";
        if (is_half(x.dtype) && from == DType::kF32) {
          return std::string(x.dtype == DType::kBF16 ? "::chroma::bf16(" : "::chroma::f16(") + print(x.children[0]) + ")";
        }
        throw CompileError("internal: a convolution epilogue with a cast from " + std::string(dtype_name(from)));
      }
      default:
        throw CompileError("internal: a convolution epilogue with an iota");
    }
  };
  std::ostringstream o;
  o << "  const et::ConvEpilogue epi{+[](const void* ctx, float* y, int64_t i0, int64_t n) {\n"
    << "    [[maybe_unused]] const auto& cx = *static_cast<const ::chroma::rt::Ctx*>(ctx);\n"
    << "    et::epilogue_pixels<" << k.shape[1] << ">(y, i0, n, [&](float v, int64_t p, int64_t c) {\n"
    << "      return " << print(e) << ";\n    });\n  }, &cx};\n";
  return o.str();
}

std::string Emitter::conv(const Kernel& k) const {
  const Expr& x = k.inputs[0];
  const Expr& w = k.inputs[1];
  const Buffer& c = p_->buffers[static_cast<size_t>(k.outputs[0])];
  const std::string t = ctype(c.type.dtype);
  const Shape xs = x.layout.shape, ws = w.layout.shape;
  const size_t d = xs.size() - 2;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, kk[3] = {1, 1, 1}, st[3] = {1, 1, 1}, pd[3] = {0, 0, 0}, dl[3] = {1, 1, 1};
  for (size_t i = 0; i < d; ++i) {
    const size_t j = 3 - d + i;
    in[j] = xs[2 + i];
    out[j] = k.shape[2 + i];
    kk[j] = ws[2 + i];
    st[j] = k.attrs.ints[i];
    pd[j] = k.attrs.ints[d + i];
    dl[j] = k.attrs.ints[2 * d + i];
  }
  auto l3 = [](const int64_t* v) { return "{" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + ", " + std::to_string(v[2]) + "}"; };
  std::ostringstream o;
  const bool y_cl = c.channels_last(), x_cl = conv_input_channels_last(k, *p_);
  o << "  static constexpr et::ConvGeom g = {" << xs[0] << ", " << xs[1] << ", " << ws[0] << ", " << k.attrs.k << ", " << l3(in)
    << ", " << l3(out) << ", " << l3(kk) << ", " << l3(st) << ", " << l3(pd) << ", " << l3(dl) << ", "
    << (x_cl ? "true" : "false") << ", " << (y_cl ? "true" : "false")
    << (k.weight_format() == quant::Format::kBF16 && dnnl_sites_.count(&k) ? ", true" : "") << "};\n";
  const std::string args = "static_cast<const " + t + "*>(" + ptr(x.buffer, false) + ") + " + std::to_string(x.layout.offset) +
                           ", static_cast<const " + t + "*>(" + ptr(w.buffer, false) + ") + " + std::to_string(w.layout.offset) +
                           ", static_cast<" + t + "*>(" + ptr(k.outputs[0], true) + ")";
  if (auto site = dnnl_sites_.find(&k); site != dnnl_sites_.end()) {
    // oneDNN's glue (a heavy header) is compiled once, in dnnl.cpp.
    const bool const_w = p_->buffers[static_cast<size_t>(w.buffer)].region == Region::kConstant;
    static const char* kKinds[] = {"kBias", "kLinear", "kAddC", "kMulC", "kSubC"};
    if (!k.conv().post_ops.empty()) {
      o << "  const et::ConvPostOp po[] = {";
      for (size_t i = 0; i < k.conv().post_ops.size(); ++i) {
        const Kernel::PostOp& q = k.conv().post_ops[i];
        o << (i ? ",\n      " : "") << "{et::ConvPostOp::" << kKinds[q.kind] << ", " << float_lit(q.a) << ", "
          << float_lit(q.b) << ", ";
        if (q.input >= 0) {
          const Expr& vec = k.inputs[static_cast<size_t>(q.input)];
          o << "static_cast<const float*>(" << ptr(vec.buffer, false) << ") + " << vec.layout.offset;
        } else {
          o << "nullptr";
        }
        o << "}";
      }
      o << "};\n";
    }
    if (k.epilogue() >= 0) o << conv_epilogue(k);
    o << "  conv_dnnl_site(" << site->second << ", g, " << d << ", " << args << ", " << (const_w ? "true" : "false")
      << ", " << (k.conv().post_ops.empty() ? "nullptr, 0" : "po, " + std::to_string(k.conv().post_ops.size())) << ", "
      << (k.epilogue() >= 0 ? "&epi" : "nullptr") << ", cx.pool);\n";
    return o.str();
  }
  if (x_cl || y_cl || !k.conv().post_ops.empty() || k.epilogue() >= 0) throw CompileError("internal: a channels-last convolution (" + k.name + ") without oneDNN");
  o << "  et::conv<" << t << ">(g, " << args << ", cx.pool,\n      ["
    << (o_.dnnl_sgemm && c.type.dtype == DType::kF32 ? "pool = cx.pool" : "") << "](int64_t m, int64_t n, int64_t kk, const " << t
    << "* A, int64_t lda, const " << t << "* B, int64_t ldb, " << t << "* C, int64_t ldc) {\n";
  if (o_.dnnl_sgemm && c.type.dtype == DType::kF32) {
    o << "        et::sgemm(pool, false, false, m, n, kk, A, lda, B, ldb, C, ldc);\n";
  } else if (o_.blas) {
    o << "        " << (c.type.dtype == DType::kF32 ? "cblas_sgemm" : "cblas_dgemm")
      << "(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, kk, 1, A, lda, B, ldb, 0, C, ldc);\n";
  } else {
    o << "        et::gemm_ref<" << t << ">(false, false, m, n, kk, A, lda, B, ldb, C, ldc);\n";
  }
  o << "      });\n";
  return o.str();
}

}  // namespace chroma::cpu_codegen
