// The CPU generator's indexed kernels (emitter.h): gathers (of a quantized table's rows, or
// over an expression) and index_put, each a call into chroma/cpu/et.h that reports the first
// index out of range, which the kernel's function returns as cx.index_error().
#include "codegen/cpu/emitter.h"

#include <sstream>

namespace chroma::cpu_codegen {

// Gather and gather_elements; a scalar index iterates with an inserted extent-1 dimension.
std::string Emitter::gather(const Kernel& k, size_t ki) const {
  std::ostringstream o;
  const Expr& src = k.inputs[0];
  const Expr& idx = k.inputs[1];
  if (k.kind == Kernel::kGather && k.weight_format() != quant::Format::kF32) {
    // Rows of a quantized table (quant::pack_rows), the index a contiguous load.
    const Buffer& tb = p_->buffers[static_cast<size_t>(src.buffer)];
    const Shape& os0 = k.shape;
    const int64_t H = os0.back(), rows = tb.type.shape[0] / quant::row_bytes(k.weight_format(), H);
    o << "  int64_t bad = 0;\n  if (!et::gather_quant<" << static_cast<int>(k.weight_format()) << ", " << rows << ", " << H
      << ", " << numel(idx.shape()) << ">(static_cast<float*>(" << ptr(k.outputs[0], true)
      << "), static_cast<const uint8_t*>(" << ptr(src.buffer, false) << "), static_cast<const " << ctype(idx.dtype)
      << "*>(" << ptr(idx.buffer, false) << ") + " << idx.layout.offset << ", &bad)) return cx.index_error(" << ki
      << ", bad);\n";
    return o.str();
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
  return o.str();
}

// index_put: a copy of the base first unless it is updated in place.
std::string Emitter::index_put(const Kernel& k, size_t ki) const {
  std::ostringstream o;
  const Expr& base = k.inputs[0];
  const Buffer& b = p_->buffers[static_cast<size_t>(k.outputs[0])];
  const int64_t axis = k.attrs.axis;
  if (!k.index_put().in_place && numel(b.type.shape) > 0) {
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
  return o.str();
}

}  // namespace chroma::cpu_codegen
