// Matrix products and convolutions (Lowerer, lowerer.h, "products"): which form each takes
// (a gathered or packed product on the CPU, cpu_products.cpp; else a BLAS product, or a
// convolution, channels-last where the target keeps activations so, with its post-ops and
// epilogue, epilogue.cpp), and operands in the layouts BLAS and oneDNN address.
#include "lower/lowerer.h"

#include <algorithm>

namespace chroma::lowering {

bool Lowerer::blas_layout(Layout& l) {
  const size_t r = l.shape.size();
  int64_t& sr = l.strides[r - 2];
  int64_t& sc = l.strides[r - 1];
  const int64_t rows = l.shape[r - 2], cols = l.shape[r - 1];
  if (cols == 1 && sc != 1 && !(rows > 1 && sr == 1)) sc = 1;
  if (rows == 1 && sr != 1) sr = std::max<int64_t>(cols, 1);
  if (sc == 1 && sr >= std::max<int64_t>(cols, 1)) return true;
  if (sr == 1 && sc >= std::max<int64_t>(rows, 1)) return true;
  return false;
}

Expr Lowerer::dense_operand(Value v) {
  const size_t mark = fused_into_.size();
  Expr e = expr_of(v);
  if (e.kind == Expr::kLoad && e.layout.strides == contiguous_strides(e.layout.shape)) return e;
  fused_into_.resize(mark);
  return buffer_load(v, Want::kContiguous);
}

Expr Lowerer::matmul_operand(Value v) {
  const size_t mark = fused_into_.size();
  Expr e = expr_of(v);
  if (e.kind == Expr::kLoad && blas_layout(e.layout)) return e;
  fused_into_.resize(mark);
  // A view of an expression not yet written (attention's q split into heads after its rotary
  // embedding: [B, S, H, D] read as [B, H, S, D]): the expression written in its own order and
  // the view read through strides, when BLAS can address them. Written in the view's order
  // instead, each row of the kernel would read its sources a whole row of heads apart.
  std::vector<const Node*> views;
  Value src = v;
  while (is_view(g_.node(src).op)) {
    views.push_back(&g_.node(src));
    src = g_.node(src).inputs[0];
  }
  if (!views.empty() && !buffer_of_.count(src) && (g_.node(src).op == Op::kMap || g_.node(src).op == Op::kCast)) {
    std::optional<Layout> l = contiguous_layout(g_.type(src).shape);
    for (size_t i = views.size(); l && i-- > 0;) l = apply_view(*views[i], *l);
    if (l && blas_layout(*l)) {
      buffer_load(src, Want::kContiguous);
      e = expr_of(v);
      if (e.kind == Expr::kLoad && blas_layout(e.layout)) return e;
      fused_into_.resize(mark);
    }
  }
  // An expression, or a view BLAS cannot address: copy it into a contiguous buffer.
  e = buffer_load(v, Want::kContiguous);
  blas_layout(e.layout);
  return e;
}

void Lowerer::visit_matmul(const Node& n, Value v) {
  if (gathered_matmul(n, v)) return;
  if (packed_matmul(n, v)) return;
  Kernel k = start(n, Kernel::kMatMul);
  k.inputs.push_back(matmul_operand(n.inputs[0]));
  reduced_weight(n, &k.inputs.back(), "", true);
  k.inputs.push_back(matmul_operand(n.inputs[1]));
  reduced_weight(n, &k.inputs.back(), "");
  if (opts_.row_major_constant_b) row_major_constant(&k.inputs.back());
  if (opts_.pitch_constant_b) row_major_constant(&k.inputs.back(), true);
  if (opts_.product_epilogues && n.type().dtype == DType::kF32 && !output_slot_.count(v)) {
    push_with_epilogue(std::move(k), n, v, {});
    return;
  }
  push_over_output(std::move(k), n, v);
}

void Lowerer::visit_conv(const Node& n, Value v) {
  // Float32 on oneDNN: channels-last in and out (a graph output is written row-major);
  // otherwise (float64, no oneDNN) row-major for conv.h.
  Kernel k = start(n, Kernel::kConv);
  const bool cl = opts_.channels_last && n.type().dtype == DType::kF32 && n.type().shape.size() >= 3;
  if (cl && conv_bf16(n)) {
    k.weights().format = quant::Format::kBF16;
    k.weights().activations = quant::Activations::kBF16;
  }
  k.inputs.push_back(cl ? channels_last_operand(n.inputs[0]) : dense_operand(n.inputs[0]));
  k.inputs.push_back(dense_operand(n.inputs[1]));
  const bool epilogue = opts_.product_epilogues && n.type().dtype == DType::kF32;
  if ((!cl && !epilogue) || output_slot_.count(v)) {
    push_over_output(std::move(k), n, v);
    return;
  }
  push_with_epilogue(std::move(k), n, v, cl ? channels_last_strides(n.type().shape) : std::vector<int64_t>{});
}

}  // namespace chroma::lowering
