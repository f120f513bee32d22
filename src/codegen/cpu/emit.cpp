#include "codegen/cpu/emit.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <functional>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "chroma/detail/sha256.h"

namespace chroma {
namespace {

std::string ctype(DType t) { return std::string(dtype_ctype(t)); }

// A quantized product's activations option as the runtime's et::QuantActs.
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

// Rank-0 iteration spaces run as rank 1 with extent 1.
std::vector<int64_t> norm_shape(const Shape& s) { return s.empty() ? Shape{1} : s; }

// The stride lists of an expression's leaves (loads and iotas), for reshaping its iteration
// space.
void leaf_strides(Expr& e, std::vector<std::vector<int64_t>*>* is, std::vector<std::vector<double>*>* ds) {
  if (e.kind == Expr::kLoad) is->push_back(&e.layout.strides);
  if (e.kind == Expr::kIota) ds->push_back(&e.affine.strides);
  for (Expr& c : e.children) leaf_strides(c, is, ds);
}

// An elementwise kernel's iteration space as its loops want it: the dimensions in the
// destination's memory order (a channels-last destination is written in one contiguous pass,
// not with a stride of C per element), extent-1 dimensions dropped (a permute ending in
// [.., 32, 1, 1] ran rows of one element), and a last dimension shorter than 256 merged with
// the one before it while every operand (loads, iotas, the destination) is contiguous across
// the two. The same elements, each written once; rows stay many enough to split over threads.
Kernel simplified_assign(const Kernel& k) {
  Kernel s = k;
  std::vector<std::vector<int64_t>*> is;
  std::vector<std::vector<double>*> ds;
  leaf_strides(s.inputs[0], &is, &ds);
  is.push_back(&s.out_layouts[0].strides);
  for (const auto* v : is) if (v->size() != s.shape.size()) return k;
  for (const auto* v : ds) if (v->size() != s.shape.size()) return k;
  {
    const std::vector<int64_t>& os = s.out_layouts[0].strides;
    std::vector<size_t> order(os.size());
    for (size_t d = 0; d < order.size(); ++d) order[d] = d;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return std::llabs(os[a]) > std::llabs(os[b]); });
    auto permute = [&](auto& v) {
      auto old = v;
      for (size_t d = 0; d < order.size(); ++d) v[d] = old[order[d]];
    };
    for (auto* v : is) permute(*v);
    for (auto* v : ds) permute(*v);
    permute(s.shape);
  }
  auto erase = [&](size_t d) {
    for (auto* v : is) v->erase(v->begin() + static_cast<std::ptrdiff_t>(d));
    for (auto* v : ds) v->erase(v->begin() + static_cast<std::ptrdiff_t>(d));
    s.shape.erase(s.shape.begin() + static_cast<std::ptrdiff_t>(d));
  };
  for (size_t d = s.shape.size(); d-- > 0;) {
    if (s.shape.size() > 1 && s.shape[d] == 1) erase(d);
  }
  while (s.shape.size() >= 2 && s.shape.back() < 256) {
    const size_t d = s.shape.size() - 2;
    const int64_t n = s.shape[d + 1];
    bool ok = true;
    for (const auto* v : is) ok = ok && (*v)[d] == (*v)[d + 1] * n;
    for (const auto* v : ds) ok = ok && (*v)[d] == (*v)[d + 1] * static_cast<double>(n);
    if (!ok) break;
    for (auto* v : is) (*v)[d] = (*v)[d + 1];
    for (auto* v : ds) (*v)[d] = (*v)[d + 1];
    s.shape[d + 1] *= s.shape[d];
    erase(d);
  }
  s.out_layouts[0].shape = s.shape;
  return s;
}
// A reduction's iteration space in its input's memory order: the dimensions sorted by the
// strides of the first operand read over the whole space (a channels-last activation's
// spatial mean then reads memory in one pass, the channels innermost, instead of with a
// stride of C per element). `mask` (the reduced dimensions) is permuted with them. A kernel
// whose operands are already in order is returned as it is.
Kernel in_memory_order(const Kernel& k, std::vector<bool>* mask) {
  Kernel s = k;
  std::vector<std::vector<int64_t>*> is;
  std::vector<std::vector<double>*> ds;
  leaf_strides(s.inputs[0], &is, &ds);
  const size_t r = s.shape.size();
  if (r < 2 || mask->size() != r || s.out_layouts[0].strides.size() != r) return k;
  for (const auto* v : is) if (v->size() != r) return k;
  for (const auto* v : ds) if (v->size() != r) return k;
  if (is.empty()) return k;
  const std::vector<int64_t> ref = *is.front();
  std::vector<size_t> order(r);
  for (size_t d = 0; d < r; ++d) order[d] = d;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int64_t sa = k.shape[a] == 1 ? INT64_MAX : std::llabs(ref[a]), sb = k.shape[b] == 1 ? INT64_MAX : std::llabs(ref[b]);
    return sa > sb;
  });
  bool in_order = true;  // the dims of extent > 1 already by non-increasing stride
  int64_t prev = INT64_MAX;
  for (size_t d = 0; d < r; ++d) {
    if (k.shape[d] == 1) continue;
    in_order = in_order && std::llabs(ref[d]) <= prev;
    prev = std::llabs(ref[d]);
  }
  if (in_order) return k;
  auto permute = [&](auto& v) {
    auto old = v;
    for (size_t d = 0; d < r; ++d) v[d] = old[order[d]];
  };
  is.push_back(&s.out_layouts[0].strides);
  for (auto* v : is) permute(*v);
  for (auto* v : ds) permute(*v);
  permute(s.shape);
  permute(*mask);
  s.out_layouts[0].shape = s.shape;
  return s;
}

template <class T> std::vector<T> norm_strides(const std::vector<T>& s) { return s.empty() ? std::vector<T>{T{}} : s; }

class Emitter {
 public:
  Emitter(const std::vector<CpuEntry>& entries, const CpuCodegenOptions& o) : entries_(entries), o_(o) {}

  std::string ptr(int32_t buf, bool mut) const {
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

  std::string expr(const Expr& e) const {
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

  std::string out(int32_t buf, const Layout& l) const {
    const Buffer& b = p_->buffers[static_cast<size_t>(buf)];
    return "et::out<" + ctype(b.type.dtype) + ", et::St<" + int_list(norm_strides(l.strides)) + ">, " +
           std::to_string(l.offset) + ">(" + ptr(buf, true) + ")";
  }

  static std::string shape_t(const Shape& s) { return "et::Shape<" + int_list(norm_shape(s)) + ">"; }

  std::string kernel_body(size_t ki) const {
    const Kernel& k = p_->kernels[ki];
    std::ostringstream o;
    switch (k.kind) {
      case Kernel::kAssign: {
        const Kernel s = simplified_assign(k);
        o << "  et::assign<" << shape_t(s.shape) << ">(cx.pool, " << out(s.outputs[0], s.out_layouts[0]) << ",\n      "
          << expr(s.inputs[0]) << ");\n";
        break;
      }
      case Kernel::kConcat:
        for (size_t i = 0; i < k.inputs.size(); ++i) {
          if (numel(k.out_layouts[i].shape) == 0) continue;
          Kernel part;
          part.kind = Kernel::kAssign;
          part.shape = k.out_layouts[i].shape;
          part.inputs = {k.inputs[i]};
          part.outputs = {k.outputs[i]};
          part.out_layouts = {k.out_layouts[i]};
          const Kernel s = simplified_assign(part);
          o << "  et::assign<" << shape_t(s.shape) << ">(cx.pool, " << out(s.outputs[0], s.out_layouts[0]) << ",\n      "
            << expr(s.inputs[0]) << ");\n";
        }
        break;
      case Kernel::kReduce: {
        static const char* kOps[] = {"et::Sum", "et::Prod", "et::Max", "et::Min"};
        std::vector<bool> mask(norm_shape(k.shape).size(), false);
        for (int64_t a : k.attrs.ints) mask[static_cast<size_t>(a)] = true;
        const Kernel s = in_memory_order(k, &mask);
        std::string m;
        for (size_t i = 0; i < mask.size(); ++i) m += std::string(i ? ", " : "") + (mask[i] ? "true" : "false");
        const Buffer& b = p_->buffers[static_cast<size_t>(k.outputs[0])];
        o << "  et::reduce<" << shape_t(s.shape) << ", et::Mask<" << m << ">, " << kOps[static_cast<int>(k.attrs.reduce)]
          << ", " << ctype(b.type.dtype) << ">(cx.pool, " << out(s.outputs[0], s.out_layouts[0]) << ",\n      " << expr(s.inputs[0])
          << ");\n";
        break;
      }
      case Kernel::kSoftmax: {
        const Buffer& b = p_->buffers[static_cast<size_t>(k.outputs[0])];
        o << "  et::softmax<" << shape_t(k.shape) << ", " << k.attrs.axis << ", " << (k.attrs.log ? "true" : "false") << ", "
          << ctype(b.type.dtype) << ">(cx.pool, " << out(k.outputs[0], k.out_layouts[0]) << ",\n      " << expr(k.inputs[0]) << ");\n";
        break;
      }
      case Kernel::kScan: {
        const Buffer& b = p_->buffers[static_cast<size_t>(k.outputs[0])];
        if (numel(k.shape) == 0) break;
        o << "  et::scan<" << shape_t(k.shape) << ", " << k.attrs.axis << ", "
          << (k.attrs.log ? 4 : static_cast<int>(k.attrs.reduce)) << ", " << ctype(b.type.dtype) << ">("
          << out(k.outputs[0], k.out_layouts[0]) << ",\n      " << expr(k.inputs[0]) << ");\n";
        break;
      }
      case Kernel::kArgReduce:
        o << "  et::arg_reduce<" << shape_t(k.shape) << ", " << k.attrs.axis << ", "
          << (k.attrs.reduce == ReduceKind::kMax ? "true" : "false") << ">(" << out(k.outputs[0], k.out_layouts[0])
          << ",\n      " << expr(k.inputs[0]) << ");\n";
        break;
      case Kernel::kTopK: {
        const Buffer& b = p_->buffers[static_cast<size_t>(k.outputs[0])];
        o << "  et::topk<" << shape_t(k.shape) << ", " << k.attrs.axis << ", " << k.attrs.k << ", "
          << (k.attrs.largest ? "true" : "false") << ", " << ctype(b.type.dtype) << ">("
          << out(k.outputs[0], k.out_layouts[0]) << ", " << out(k.outputs[1], k.out_layouts[1]) << ",\n      "
          << expr(k.inputs[0]) << ");\n";
        break;
      }
      case Kernel::kGather:
      case Kernel::kGatherElements: {
        const Expr& src = k.inputs[0];
        const Expr& idx = k.inputs[1];
        if (k.kind == Kernel::kGather && k.weight_format != quant::Format::kF32) {
          // Rows of a quantized table (quant::pack_rows), the index a contiguous load.
          const Buffer& tb = p_->buffers[static_cast<size_t>(src.buffer)];
          const Shape& os0 = k.shape;
          const int64_t H = os0.back(), rows = tb.type.shape[0] / quant::row_bytes(k.weight_format, H);
          o << "  int64_t bad = 0;\n  if (!et::gather_quant<" << static_cast<int>(k.weight_format) << ", " << rows << ", " << H
            << ", " << numel(idx.shape()) << ">(static_cast<float*>(" << ptr(k.outputs[0], true)
            << "), static_cast<const uint8_t*>(" << ptr(src.buffer, false) << "), static_cast<const " << ctype(idx.dtype)
            << "*>(" << ptr(idx.buffer, false) << ") + " << idx.layout.offset << ", &bad)) return cx.index_error(" << ki
            << ", bad);\n";
          break;
        }
        const Shape src_shape = src.shape();
        const int64_t axis = k.attrs.axis;
        const int64_t dim = src_shape[static_cast<size_t>(axis)];
        Layout ol = k.out_layouts[0];
        Shape os = k.shape;
        Expr ix = idx;
        int64_t ir = static_cast<int64_t>(idx.shape().size());
        if (k.kind == Kernel::kGather && ir == 0) {
          // A scalar index: iterate with an inserted extent-1 dimension at the axis.
          os.insert(os.begin() + axis, 1);
          ol.shape = os;
          ol.strides.insert(ol.strides.begin() + axis, 0);
          ir = 1;
        }
        o << "  int64_t bad = 0;\n  if (!et::" << (k.kind == Kernel::kGather ? "gather<" : "gather_elements<") << shape_t(os)
          << ", " << axis << ", ";
        if (k.kind == Kernel::kGather) o << ir << ", ";
        o << dim << ">(" << out(k.outputs[0], ol) << ",\n      " << expr(src) << ",\n      " << expr(ix)
          << ", &bad)) return cx.index_error(" << ki << ", bad);\n";
        break;
      }
      case Kernel::kMatMul:
        o << matmul(k);
        break;
      case Kernel::kConv:
        o << conv(k);
        break;
      case Kernel::kLinalg:
        o << linalg(k);
        break;
      case Kernel::kMatMulPacked:
        o << matmul_packed(k);
        break;
      case Kernel::kMatMulGathered: {
        const Kernel::Gathered& gg = k.gathered;
        const Expr& idx = k.inputs[2];
        o << "  static constexpr int64_t ao[] = {" << int_list(k.batch_a) << "};\n";
        o << "  static constexpr int64_t io[] = {" << int_list(k.batch_b) << "};\n";
        o << "  static constexpr int64_t co[] = {" << int_list(k.batch_c) << "};\n";
        const bool q = k.weight_format != quant::Format::kF32;
        o << "  int64_t bad = 0;\n  if (!et::" << (q ? "gemm_quant_gathered<" + std::to_string(static_cast<int>(k.weight_format)) + ", " : "gemm_packed_gathered<")
          << k.batch_a.size() << ", " << gg.m << ", " << gg.n << ", "
          << gg.k << ", " << gg.experts << ">(static_cast<const float*>(" << ptr(k.inputs[0].buffer, false) << "), ao, "
          << gg.sar << ", " << gg.sac << ",\n      static_cast<const " << (q ? "uint8_t" : "float") << "*>(" << ptr(k.inputs[1].buffer, false)
          << "), static_cast<const " << ctype(idx.dtype) << "*>(" << ptr(idx.buffer, false) << "), io, static_cast<float*>("
          << ptr(k.outputs[0], true) << "), co, " << gg.ldc << ", cx.pool, " << (q ? quant_acts(k.activations) + ", " : "")
          << "&bad)) return cx.index_error(" << ki << ", bad);\n";
        break;
      }
      case Kernel::kIndexPut: {
        const Expr& base = k.inputs[0];
        const Buffer& b = p_->buffers[static_cast<size_t>(k.outputs[0])];
        const int64_t axis = k.attrs.axis;
        if (!k.in_place && numel(b.type.shape) > 0) {
          o << "  et::assign<" << shape_t(b.type.shape) << ">(" << out(k.outputs[0], k.out_layouts[0]) << ",\n      "
            << expr(base) << ");\n";
        }
        if (numel(k.shape) > 0) {
          o << "  int64_t bad = 0;\n  if (!et::index_put<" << shape_t(k.shape) << ", " << axis << ", "
            << b.type.shape[static_cast<size_t>(axis)] << ", " << (k.attrs.accumulate ? "true" : "false") << ", "
            << static_cast<int>(k.attrs.reduce) << ", "
            << (!k.attrs.accumulate ? 0 : k.attrs.dtype == DType::kBF16 ? 1 : k.attrs.dtype == DType::kF16 ? 2 : 0) << ">("
            << out(k.outputs[0], k.out_layouts[0]) << ",\n      " << expr(k.inputs[1]) << ",\n      " << expr(k.inputs[2])
            << ", &bad)) return cx.index_error(" << ki << ", bad);\n";
        }
        break;
      }
    }
    return o.str();
  }

  std::string matmul_packed(const Kernel& k) const {
    const Expr& a = k.inputs[0];
    const Expr& b = k.inputs[1];
    const size_t r = k.shape.size();
    const int64_t m = k.shape[r - 2], ldc = k.shape[r - 1], kk = a.layout.shape[r - 1];
    const bool routed = !k.routed.experts.empty();
    const int64_t n = routed && k.routed.n > 0 ? k.routed.n : ldc;
    std::ostringstream o;
    o << "  static constexpr int64_t ao[] = {" << int_list(k.batch_a) << "};\n";
    o << "  static constexpr int64_t bo[] = {" << int_list(k.batch_b) << "};\n";
    o << "  static constexpr int64_t co[] = {" << int_list(k.batch_c) << "};\n";
    std::string offs = "ao", boffs = "bo", coffs = "co", count;
    if (routed) {
      // Only the batches whose expert some token selected (Kernel::routed).
      const Expr& mk = k.inputs[2];
      const size_t nb = k.batch_a.size();
      o << "  static constexpr int64_t ex[] = {" << int_list(k.routed.experts) << "};\n";
      o << "  const float* mk = static_cast<const float*>(" << ptr(mk.buffer, false) << ") + " << mk.layout.offset << ";\n";
      o << "  int64_t ra[" << nb << "], rb[" << nb << "], rc[" << nb << "], nb = 0;\n";
      o << "  for (int64_t b = 0; b < " << nb << "; ++b) {\n    if (mk[ex[b] * " << mk.layout.strides[0]
        << "] == 0.0f) continue;\n    ra[nb] = ao[b];\n    rb[nb] = bo[b];\n    rc[nb] = co[b];\n    ++nb;\n  }\n";
      offs = "ra", boffs = "rb", coffs = "rc", count = ", nb";
    }
    if (k.weight_format != quant::Format::kF32) {
      o << "  et::gemm_quant<" << static_cast<int>(k.weight_format) << ", " << k.batch_a.size() << ", " << m << ", " << n << ", "
        << kk << ">(static_cast<const float*>(" << ptr(a.buffer, false) << "), " << offs << ", " << a.layout.strides[r - 2] << ", "
        << a.layout.strides[r - 1] << ",\n      static_cast<const uint8_t*>(" << ptr(b.buffer, false)
        << "), " << boffs << ", static_cast<float*>(" << ptr(k.outputs[0], true) << "), " << coffs << ", " << ldc << ", cx.pool, "
        << quant_acts(k.activations) << count << ");\n";
      return o.str();
    }
    o << "  et::gemm_packed<" << k.batch_a.size() << ", " << m << ", " << n << ", " << kk << ">(static_cast<const float*>("
      << ptr(a.buffer, false) << "), " << offs << ", " << a.layout.strides[r - 2] << ", " << a.layout.strides[r - 1]
      << ",\n      static_cast<const float*>(" << ptr(b.buffer, false) << "), " << boffs << ", static_cast<float*>("
      << ptr(k.outputs[0], true) << "), " << coffs << ", " << ldc << ", cx.pool" << count << ");\n";
    return o.str();
  }

  // Linalg: one call into chroma/cpu/linalg.h (LAPACK), which needs OpenBLAS at link time.
  std::string linalg(const Kernel& k) const {
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

  // Conv: geometry normalised to 3 spatial dims, GEMMs through BLAS (or the reference GEMM).
  // A convolution's input is read channels-last; where both descriptions fit the memory (one
  // channel, or spatial extent 1), as the output is written.
  static bool conv_input_channels_last(const Kernel& k, const Program& p) {
    const Layout& x = k.inputs[0].layout;
    return is_channels_last(x) && (!is_contiguous(x) || p.buffers[static_cast<size_t>(k.outputs[0])].channels_last());
  }

  // A channels-last convolution's epilogue (Kernel::epilogue) as a function over a block of
  // its stored result, whole pixels [i0, i0 + n): the expression's loads of the output are
  // y[p + c], of a per-channel or scalar constant its element c or its one element, of
  // another channels-last buffer of the same shape the same element; the operations are the
  // scalar functions the expression templates use, so the values are the same bits.
  std::string conv_epilogue(const Kernel& k) const {
    const Expr& e = k.inputs[static_cast<size_t>(k.epilogue)];
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

  std::string conv(const Kernel& k) const {
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
      << (k.weight_format == quant::Format::kBF16 && dnnl_sites_.count(&k) ? ", true" : "") << "};\n";
    const std::string args = "static_cast<const " + t + "*>(" + ptr(x.buffer, false) + ") + " + std::to_string(x.layout.offset) +
                             ", static_cast<const " + t + "*>(" + ptr(w.buffer, false) + ") + " + std::to_string(w.layout.offset) +
                             ", static_cast<" + t + "*>(" + ptr(k.outputs[0], true) + ")";
    if (auto site = dnnl_sites_.find(&k); site != dnnl_sites_.end()) {
      // oneDNN's glue (a heavy header) is compiled once, in program.cpp.
      const bool const_w = p_->buffers[static_cast<size_t>(w.buffer)].region == Region::kConstant;
      static const char* kKinds[] = {"kBias", "kLinear", "kAddC", "kMulC", "kSubC"};
      if (!k.post_ops.empty()) {
        o << "  const et::ConvPostOp po[] = {";
        for (size_t i = 0; i < k.post_ops.size(); ++i) {
          const Kernel::PostOp& q = k.post_ops[i];
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
      if (k.epilogue >= 0) o << conv_epilogue(k);
      o << "  conv_dnnl_site(" << site->second << ", g, " << d << ", " << args << ", " << (const_w ? "true" : "false")
        << ", " << (k.post_ops.empty() ? "nullptr, 0" : "po, " + std::to_string(k.post_ops.size())) << ", "
        << (k.epilogue >= 0 ? "&epi" : "nullptr") << ", cx.pool);\n";
      return o.str();
    }
    if (x_cl || y_cl || !k.post_ops.empty() || k.epilogue >= 0) throw CompileError("internal: a channels-last convolution (" + k.name + ") without oneDNN");
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

  // A bfloat16 model's product on oneDNN's bfloat16 matmul (Lowerer::bf16_dnnl_matmul): A's
  // rows evenly spaced over its batch, B one bfloat16 matrix (any strides), C contiguous.
  std::string matmul_bf16(const Kernel& k) const {
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

  std::string matmul(const Kernel& k) const {
    if (k.weight_format == quant::Format::kBF16) return matmul_bf16(k);
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

  // The first include of every kernel file: chroma/cpu/kernels.h, the one header the build
  // precompiles (nothing but comments may come before it).
  static std::string prelude() {
    return "// Generated by Chroma " CHROMA_VERSION ". Do not edit: recompile the model instead.\n"
           "#include \"chroma/cpu/kernels.h\"\n\n";
  }

  GeneratedSource run(const CpuArtifactInfo& info) {
    GeneratedSource g;
    // float32 convolutions with more than one kernel tap go through oneDNN (pointwise ones
    // are a plain GEMM on the input: no layout reorders, faster at these sizes).
    for (const CpuEntry& e : entries_) {
      for (const Kernel& k : e.program->kernels) {
        if (!o_.dnnl || k.kind != Kernel::kConv) continue;
        if (e.program->buffers[static_cast<size_t>(k.outputs[0])].type.dtype != DType::kF32) continue;
        // Channels-last ones always (conv.h reads row-major only).
        const Shape& ws = k.inputs[1].layout.shape;
        const bool cl = conv_input_channels_last(k, *e.program) || e.program->buffers[static_cast<size_t>(k.outputs[0])].channels_last();
        if (cl || numel(Shape(ws.begin() + 2, ws.end())) > 1) dnnl_sites_.emplace(&k, static_cast<int>(dnnl_sites_.size()));
      }
      // A bfloat16 model's many-row products on oneDNN's bfloat16 matmul (matmul_dnnl.h).
      for (const Kernel& k : e.program->kernels) {
        if (k.kind != Kernel::kMatMul || k.weight_format != quant::Format::kBF16) continue;
        if (!o_.dnnl) throw CompileError("internal: a bfloat16 oneDNN product (" + k.name + ") without oneDNN");
        mm_sites_.emplace(&k, static_cast<int>(mm_sites_.size()));
      }
    }
    // Kernels of every entry, grouped into files by signature: kernels that differ only in
    // their buffer and weight offsets (a model's repeated layers) instantiate the same
    // templates, which the compiler then builds once per file instead of once per file each
    // copy landed in (gpt-oss's 340 kernels have 28 signatures; the build times:
    // bench/results/README.md). A file takes whole groups, in order of first appearance, up to
    // kernels_per_file signatures; more than 16 signatures are spread over at least two files
    // so that two compiler processes share the work.
    struct Item {
      size_t e, ki;
      std::string body;
    };
    std::vector<Item> items;
    std::map<std::string, size_t> group_of;  // signature -> group
    std::vector<std::vector<size_t>> groups;  // group -> items, in program order
    for (size_t e = 0; e < entries_.size(); ++e) {
      p_ = entries_[e].program;
      for (size_t ki = 0; ki < p_->kernels.size(); ++ki) {
        items.push_back(Item{e, ki, kernel_body(ki)});
        auto [it, fresh] = group_of.emplace(kernel_signature(items.back().body), groups.size());
        if (fresh) groups.emplace_back();
        groups[it->second].push_back(items.size() - 1);
      }
    }
    const size_t per_file = std::max<size_t>(
        1, std::min(static_cast<size_t>(std::max(1, o_.kernels_per_file)),
                    std::max<size_t>(8, (groups.size() + 1) / 2)));
    std::vector<std::vector<size_t>> files;  // file -> groups
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      if (files.empty() || files.back().size() >= per_file) files.emplace_back();
      files.back().push_back(gi);
    }
    if (files.empty()) files.emplace_back();
    for (size_t f = 0; f < files.size(); ++f) {
      std::ostringstream o;
      o << prelude() << "namespace chroma_gen {\nnamespace et = ::chroma::et;\n\n";
      if (!dnnl_sites_.empty()) {
        o << "int conv_dnnl_site(int site, const et::ConvGeom& g, int d, const float* x, const float* w, float* y, bool const_w,\n"
             "                   const et::ConvPostOp* ops, int nops, const et::ConvEpilogue* epi, ::chroma::rt::ThreadPool* pool);\n\n";
      }
      if (!mm_sites_.empty()) {
        o << "int matmul_dnnl_site(int site, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint16_t* b,\n"
             "                     int64_t sk, int64_t sn, float* c, int64_t ldc, ::chroma::rt::ThreadPool* pool);\n\n";
      }
      for (size_t gi : files[f]) {
        for (size_t j : groups[gi]) {
          const Item& it = items[j];
          const Kernel& k = entries_[it.e].program->kernels[it.ki];
          o << "// " << comment(entries_[it.e].name) << " k" << it.ki << ": " << comment(k.label);
          if (!k.source.empty()) o << "\n//   from " << comment(k.source);
          o << "\nint " << fn_name(it.e, it.ki) << "(::chroma::rt::Ctx& cx) {\n" << it.body << "  return 0;\n}\n\n";
        }
      }
      o << "}  // namespace chroma_gen\n";
      char name[48];
      std::snprintf(name, sizeof name, "kernels_%03zu.cpp", f);
      g.files.emplace_back(name, o.str());
    }
    // The entry points and the oneDNN glue read the model only through program.cpp's tables:
    // the same files for every model, so the build cache compiles them once.
    if (!dnnl_sites_.empty() || !mm_sites_.empty()) g.files.emplace_back("dnnl.cpp", dnnl_file(!dnnl_sites_.empty(), !mm_sites_.empty()));
    g.files.emplace_back("host.cpp", host_file());
    g.files.emplace_back("program.cpp", main_file(info));
    chroma::detail::Sha256 h;
    for (const auto& [n, c] : g.files) {
      h.update(n.data(), n.size());
      h.update(c.data(), c.size());
    }
    g.digest = h.hex_digest();
    // The digest is embedded in program.cpp after hashing: replace the placeholder.
    auto& main = g.files.back().second;
    const std::string ph = "@SOURCE_DIGEST@";
    main.replace(main.find(ph), ph.size(), g.digest);
    return g;
  }

  // A kernel body with the numbers that are only run-time data masked: offsets into the
  // arena and the weights, the contents of offset tables, oneDNN site numbers. Two kernels
  // with one signature instantiate the same templates (a grouping heuristic: nothing depends
  // on it being exact).
  static std::string kernel_signature(const std::string& body) {
    std::string s;
    s.reserve(body.size());
    for (size_t i = 0; i < body.size();) {
      auto masked_number_after = [&](const char* tag) {
        const size_t n = std::char_traits<char>::length(tag);
        if (body.compare(i, n, tag) != 0) return false;
        s.append(tag, n);
        i += n;
        while (i < body.size() && (std::isdigit(static_cast<unsigned char>(body[i])) || body[i] == ',' ||
                                   body[i] == ' ' || body[i] == '-')) {
          ++i;
        }
        s += '#';
        return true;
      };
      if (masked_number_after("arena + ") || masked_number_after("weights + ") || masked_number_after("[] = {") ||
          masked_number_after("conv_dnnl_site(") || masked_number_after("matmul_dnnl_site(")) {
        continue;
      }
      s += body[i++];
    }
    return s;
  }

  static std::string fn_name(size_t e, size_t ki) { return "e" + std::to_string(e) + "_k" + std::to_string(ki); }

  // A C++ string literal holding exactly the bytes of `s`. Text from the graph file (source
  // lines, node names, labels, state and entry names) reaches generated code only through
  // this and comment(): every byte outside printable ASCII, and the quote and backslash,
  // becomes a three-digit octal escape, which cannot run into a following digit or end the
  // literal. "??" is split so no trigraph can form, whatever the compiler's mode.
  static std::string c_str(const std::string& s) {
    std::string r = "\"";
    char prev = 0;
    for (char ch : s) {
      const auto u = static_cast<unsigned char>(ch);
      if (u < 0x20 || u > 0x7e || ch == '"' || ch == '\\' || (ch == '?' && prev == '?')) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\%03o", u);
        r += buf;
      } else {
        r += ch;
      }
      prev = ch;
    }
    return r + "\"";
  }

  // Text for a `//` comment: one line of printable ASCII. Anything else (a newline would end
  // the comment, a trailing backslash would splice the next line into it) becomes '?'.
  static std::string comment(const std::string& s) {
    std::string r;
    for (char ch : s) {
      const auto u = static_cast<unsigned char>(ch);
      r += (u < 0x20 || u > 0x7e || ch == '\\') ? '?' : ch;
    }
    return r;
  }

  std::string io_table(const char* name, const std::vector<int32_t>& ids, bool inputs) const {
    std::ostringstream o;
    o << "inline constexpr ::chroma::rt::IoSpec " << name << "[" << std::max<size_t>(1, ids.size()) << "] = {\n";
    for (size_t i = 0; i < ids.size(); ++i) {
      const Buffer& b = p_->buffers[static_cast<size_t>(ids[i])];
      const std::string nm = inputs ? p_->input_names[i] : "output" + std::to_string(i);
      if (b.type.rank() > 8) {
        throw CompileError(std::string(inputs ? "input" : "output") + " " + std::to_string(i) + " ('" + nm + "') has rank " +
                           std::to_string(b.type.rank()) + ": the artifact's C ABI describes inputs and outputs of rank 8 at most");
      }
      o << "    {" << c_str(nm) << ", \"" << dtype_name(b.type.dtype) << "\", " << b.type.rank() << ", {"
        << int_list(b.type.shape) << "}, " << b.type.nbytes() << "},\n";
    }
    if (ids.empty()) o << "    {\"\", \"\", 0, {}, 0},\n";
    o << "};\n";
    return o.str();
  }

  std::string host_file() const {
    return std::string("// Generated by Chroma " CHROMA_VERSION ": the C ABI and the Python module (the same for every model).\n") +
           "#define CHROMA_WITH_BLAS " + (o_.blas ? "1" : "0") + "\n#include \"chroma/cpu/program_main.h\"\n";
  }

  // oneDNN's glue: one cache per convolution site and per bfloat16 product site.
  static std::string dnnl_file(bool conv, bool mm) {
    std::string o = "// Generated by Chroma " CHROMA_VERSION ": the oneDNN convolutions' and products' glue (the same for every model).\n"
                    "#include <memory>\n#include \"chroma/cpu/conv_dnnl.h\"\n#include \"chroma/cpu/matmul_dnnl.h\"\n"
                    "#include \"chroma/cpu/sgemm.h\"\n\nnamespace chroma_gen {\n\n";
    if (conv) {
      o += "extern const int kNumDnnlSites;  // program.cpp\n\n"
           "// One primitive cache per call site.\n"
           "int conv_dnnl_site(int site, const ::chroma::et::ConvGeom& g, int d, const float* x, const float* w, float* y,\n"
           "                   bool const_w, const ::chroma::et::ConvPostOp* ops, int nops, const ::chroma::et::ConvEpilogue* epi,\n"
           "                   ::chroma::rt::ThreadPool* pool) {\n"
           "  static const std::unique_ptr<::chroma::et::DnnlCache[]> caches(new ::chroma::et::DnnlCache[kNumDnnlSites]);\n"
           "  ::chroma::et::conv_dnnl(caches[site], g, d, x, w, y, const_w, ops, nops, epi, pool,\n"
           "      [pool](int64_t m, int64_t n, int64_t kk, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,\n"
           "             int64_t ldc) { ::chroma::et::sgemm(pool, false, false, m, n, kk, A, lda, B, ldb, C, ldc); });\n"
           "  return 0;\n}\n\n";
    }
    if (mm) {
      o += "extern const int kNumDnnlMatmulSites;  // program.cpp\n\n"
           "int matmul_dnnl_site(int site, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const uint16_t* b,\n"
           "                     int64_t sk, int64_t sn, float* c, int64_t ldc, ::chroma::rt::ThreadPool* pool) {\n"
           "  static const std::unique_ptr<::chroma::et::MatmulCache[]> caches(new ::chroma::et::MatmulCache[kNumDnnlMatmulSites]);\n"
           "  ::chroma::et::matmul_bf16_dnnl(caches[site], m, n, k, a, lda, b, sk, sn, c, ldc, pool);\n"
           "  return 0;\n}\n\n";
    }
    return o + "}  // namespace chroma_gen\n";
  }

  // The model's tables (chroma/cpu/program_tables.h), defined with external linkage.
  std::string main_file(const CpuArtifactInfo& info) {
    std::ostringstream o;
    o << "// Generated by Chroma " CHROMA_VERSION ": the program's tables and kernel sequences.\n";
    o << "#include <cstdint>\n#include \"chroma/cpu/program_tables.h\"\n";
    o << "\nnamespace chroma_gen {\n\n";
    if (!dnnl_sites_.empty()) o << "extern const int kNumDnnlSites = " << dnnl_sites_.size() << ";\n\n";
    if (!mm_sites_.empty()) o << "extern const int kNumDnnlMatmulSites = " << mm_sites_.size() << ";\n\n";
    int64_t arena = 0;
    for (size_t e = 0; e < entries_.size(); ++e) {
      p_ = entries_[e].program;
      arena = std::max(arena, p_->arena_bytes);
      for (size_t ki = 0; ki < p_->kernels.size(); ++ki) o << "int " << fn_name(e, ki) << "(::chroma::rt::Ctx& cx);\n";
      o << "\nnamespace e" << e << " {\n";
      o << io_table("kInputs", p_->inputs, true) << io_table("kOutputs", p_->outputs, false);
      const size_t nk = std::max<size_t>(1, p_->kernels.size());
      o << "inline constexpr ::chroma::rt::KernelInfo kKernels[" << nk << "] = {\n";
      for (const Kernel& k : p_->kernels) {
        int64_t dim = 0;
        if (k.kind == Kernel::kGather || k.kind == Kernel::kGatherElements) dim = k.inputs[0].shape()[static_cast<size_t>(k.attrs.axis)];
        if (k.kind == Kernel::kIndexPut) dim = p_->buffers[static_cast<size_t>(k.outputs[0])].type.shape[static_cast<size_t>(k.attrs.axis)];
        if (k.kind == Kernel::kMatMulGathered) dim = k.gathered.experts;
        o << "    {" << c_str(k.label) << ", " << c_str(k.name) << ", " << c_str(k.source) << ", " << dim << ", "
          << k.attrs.axis << "},\n";
      }
      if (p_->kernels.empty()) o << "    {\"\", \"\", \"\", 0, 0},\n";
      o << "};\ninline constexpr ::chroma::rt::KernelFn kFns[" << nk << "] = {";
      for (size_t ki = 0; ki < p_->kernels.size(); ++ki) o << (ki ? ", " : "") << fn_name(e, ki);
      if (p_->kernels.empty()) o << "nullptr";
      o << "};\n}  // namespace e" << e << "\n\n";
    }
    o << "extern const int kNumEntries = " << entries_.size() << ";\n";
    o << "extern const ::chroma::rt::EntryInfo kEntries[" << entries_.size() << "] = {\n";
    for (size_t e = 0; e < entries_.size(); ++e) {
      const Program& p = *entries_[e].program;
      o << "    {" << c_str(entries_[e].name) << ", " << p.inputs.size() << ", e" << e << "::kInputs, " << p.outputs.size()
        << ", e" << e << "::kOutputs, " << p.kernels.size() << ", e" << e << "::kKernels, e" << e << "::kFns, "
        << p.arena_bytes << "},\n";
    }
    o << "};\n";
    o << "extern const int kNumStates = " << info.states.size() << ";\n";
    o << "extern const ::chroma::rt::StateInfo kStates[" << std::max<size_t>(1, info.states.size()) << "] = {\n";
    for (const CpuStateInfo& st : info.states) {
      o << "    {" << c_str(st.name) << ", " << st.nbytes << ", " << st.offset << ", " << st.init_offset << "},\n";
    }
    if (info.states.empty()) o << "    {\"\", 0, 0, 0},\n";
    o << "};\n";
    o << "extern const int64_t kStateBytes = " << info.state_bytes << ";\n";
    o << "extern const int64_t kArenaBytes = " << arena << ";\n";
    o << "extern const int64_t kWeightsBytes = " << info.weights_bytes << ";\n";
    o << "extern const char* const kWeightsDigest = \"" << info.weights_digest << "\";\n";
    o << "extern const char* const kSourceDigest = \"@SOURCE_DIGEST@\";\n";
    o << "\n}  // namespace chroma_gen\n";
    return o.str();
  }

 private:
  const std::vector<CpuEntry>& entries_;
  const Program* p_ = nullptr;  // the entry being emitted
  const CpuCodegenOptions& o_;
  std::map<const Kernel*, int> dnnl_sites_;  // convolutions run by oneDNN -> cache slot
  std::map<const Kernel*, int> mm_sites_;    // bfloat16 products run by oneDNN -> cache slot
};

}  // namespace

GeneratedSource generate_cpu(const std::vector<CpuEntry>& entries, const CpuArtifactInfo& info,
                             const CpuCodegenOptions& opts) {
  return Emitter(entries, opts).run(info);
}

}  // namespace chroma
