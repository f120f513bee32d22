// What a product or convolution applies to its result as it stores it (Lowerer, lowerer.h,
// "post-ops and epilogues"): the post-op prefix oneDNN applies in registers
// (Kernel::post_ops), then the epilogue, a region of elementwise Maps run on each stored
// slice (Kernel::epilogue). The Maps taken in are marked absorbed_: visit() never computes
// them again.
#include "lower/lowerer.h"

#include <algorithm>

namespace chroma::lowering {

bool Lowerer::literal_operand(Value o, float* out) const {
  const Node& src = g_.node(source_of(o.node));
  if (src.op != Op::kFull || !is_float(src.type().dtype)) return false;
  *out = static_cast<float>(src.attrs.scalar.as_double());
  return !std::isnan(*out);
}

bool Lowerer::constant_operand(Value o, const Shape& shape, Expr* e) {
  const int32_t src = source_of(o.node);
  if (g_.node(src).op != Op::kConstant || g_.type(o).dtype != DType::kF32) return false;
  if (!buffer_of_.count(Value{src, 0})) new_buffer(Value{src, 0}, Region::kConstant, static_cast<int32_t>(g_.node(src).attrs.index));
  const size_t mark = fused_into_.size();
  *e = expr_of(o);
  fused_into_.resize(mark);
  return e->kind == Expr::kLoad && p_.buffers[static_cast<size_t>(e->buffer)].region == Region::kConstant &&
         e->layout.shape == shape;
}

bool Lowerer::per_channel(const Expr& e, const Shape& shape) {
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] != 1 && e.layout.strides[d] != (d == 1 ? 1 : 0)) return false;
  }
  return true;
}

bool Lowerer::same_shape_map(const Node& m, const Shape& shape) {
  return m.op == Op::kMap && m.type().dtype == DType::kF32 && m.type().shape == shape;
}

Value Lowerer::conv_post_ops(Kernel& k, Value v, Value* epilogue_root) {
  const Value cur = post_op_prefix(k, v);
  *epilogue_root = Value{grow_epilogue(k.shape, v, cur), 0};
  return cur;
}

Value Lowerer::post_op_prefix(Kernel& k, Value v) {
  const Shape& shape = k.shape;
  using P = Kernel::PostOp;
  Value cur = v;
  if (opts_.product_epilogues) return cur;
  for (;;) {
    if (output_slot_.count(cur)) break;
    const std::vector<int32_t>& cs = consumers_[static_cast<size_t>(cur.node)];
    if (cs.size() != 1) break;
    const Node& m = g_.node(cs[0]);
    if (!same_shape_map(m, shape) || m.inputs.size() != 2) break;
    const EwOp ew = m.attrs.ew;
    if (ew != EwOp::k_add && ew != EwOp::k_sub && ew != EwOp::k_mul) break;
    const bool first = m.inputs[0] == cur;
    const Value o = m.inputs[first ? 1 : 0];
    P op;
    float c = 0;
    Expr e;
    if (literal_operand(o, &c)) {
      if (ew == EwOp::k_add) op = P{P::kLinear, 1.0f, c, -1};
      else if (ew == EwOp::k_mul) op = P{P::kLinear, c, 0.0f, -1};
      else op = first ? P{P::kLinear, 1.0f, -c, -1} : P{P::kLinear, -1.0f, c, -1};
    } else if (constant_operand(o, shape, &e) && per_channel(e, shape) && (ew != EwOp::k_sub || first)) {
      op.kind = ew == EwOp::k_mul ? P::kMulC : ew == EwOp::k_sub ? P::kSubC : P::kAddC;
      if (op.kind == P::kAddC && k.conv().post_ops.empty()) op.kind = P::kBias;
      k.inputs.push_back(std::move(e));
      op.input = static_cast<int32_t>(k.inputs.size() - 1);
    } else {
      break;
    }
    k.conv().post_ops.push_back(op);
    absorbed_[static_cast<size_t>(cs[0])] = true;
    fused_into_.push_back(cs[0]);
    cur = Value{cs[0], 0};
  }
  return cur;
}

int32_t Lowerer::grow_epilogue(const Shape& shape, Value v, Value cur) {
  const bool gpu = opts_.product_epilogues;
  // In the CPU's epilogue also the conversions between float32 and a half type of the same
  // shape: a bfloat16 model's roundings (widen_half's float32 -> bfloat16 -> float32 pairs)
  // between a convolution, its batch norm and its activation.
  auto epilogue_node = [&](const Node& m) {
    if (same_shape_map(m, shape)) return true;
    if (gpu || m.op != Op::kCast || m.type().shape != shape) return false;
    const DType to = m.type().dtype, from = g_.type(m.inputs[0]).dtype;
    return (to == DType::kF32 && is_half(from)) || (is_half(to) && from == DType::kF32);
  };
  // Grow the set of Maps reading `cur` until one node of it (the root) is the only one read
  // from outside; then try to take the root's readers in too, and so on.
  if (output_slot_.count(cur) || consumers_[static_cast<size_t>(cur.node)].empty()) return -1;
  constexpr size_t kMaxNodes = 16;
  auto in = [](const std::vector<int32_t>& r, int32_t id) { return std::find(r.begin(), r.end(), id) != r.end(); };
  // Every operand from outside: cur, a literal, a constant per channel or scalar, or a
  // channels-last float32 buffer of the same shape, read directly (no view).
  auto leaf_ok = [&](const std::vector<int32_t>& r, Value x) {
    if (x == cur || in(r, x.node)) return true;
    float c = 0;
    Expr e;
    if (literal_operand(x, &c)) return true;
    if (gpu) {
      const int32_t src = source_of(x.node);
      const Op op = g_.node(src).op;
      if (op == Op::kConstant && !buffer_of_.count(Value{src, 0})) {
        new_buffer(Value{src, 0}, Region::kConstant, static_cast<int32_t>(g_.node(src).attrs.index));
      }
      return op == Op::kConstant || op == Op::kFull || op == Op::kIota || x.node < v.node;
    }
    if (g_.node(source_of(x.node)).op == Op::kConstant) {
      return constant_operand(x, shape, &e) &&
             (per_channel(e, shape) ||
              std::all_of(e.layout.strides.begin(), e.layout.strides.end(), [](int64_t st) { return st == 0; }));
    }
    auto it = buffer_of_.find(x);
    if (it == buffer_of_.end()) return false;
    const Buffer& b = p_.buffers[static_cast<size_t>(it->second)];
    return b.channels_last() && b.type.shape == shape && b.type.dtype == DType::kF32;
  };
  // The root of the smallest closed region containing `seed`, growing it in place; -1 if
  // there is none within kMaxNodes.
  auto close = [&](std::vector<int32_t>& r) -> int32_t {
    for (;;) {
      if (r.size() > kMaxNodes) return -1;
      std::vector<int32_t> open;     // read from outside the region, or a graph output
      std::vector<int32_t> missing;  // operands the region must compute too
      for (int32_t id : r) {
        if (!epilogue_node(g_.node(id))) return -1;
        for (Value x : g_.node(id).inputs) {
          if (leaf_ok(r, x)) continue;
          // An operation after the convolution that the region's nodes read (hardswish's
          // x * relu6(x + 3) / 6 reads x and relu6(x + 3)): pulled in, then checked as any.
          if (x.node > v.node && !absorbed_[static_cast<size_t>(x.node)] && epilogue_node(g_.node(x.node)) &&
              !output_slot_.count(x) && !in(missing, x.node)) {
            missing.push_back(x.node);
            continue;
          }
          return -1;
        }
        bool outside = output_slot_.count(Value{id, 0}) > 0 || consumers_[static_cast<size_t>(id)].empty();
        for (int32_t c : consumers_[static_cast<size_t>(id)]) outside = outside || !in(r, c);
        if (outside) open.push_back(id);
      }
      if (!missing.empty()) {
        r.insert(r.end(), missing.begin(), missing.end());
        continue;
      }
      if (open.size() == 1) return open[0];
      if (open.empty()) return -1;
      // Pull in the readers of every open node but the latest in node order (the root to be).
      const int32_t latest = *std::max_element(open.begin(), open.end());
      bool grew = false;
      for (int32_t id : open) {
        if (id == latest) continue;
        if (output_slot_.count(Value{id, 0})) return -1;
        for (int32_t c : consumers_[static_cast<size_t>(id)]) {
          if (!in(r, c)) {
            r.push_back(c);
            grew = true;
          }
        }
      }
      if (!grew) return -1;
    }
  };
  std::vector<int32_t> region, trial = consumers_[static_cast<size_t>(cur.node)];
  int32_t root = -1;
  for (;;) {
    const int32_t r = close(trial);
    if (r < 0) break;
    if (g_.type(Value{r, 0}).dtype == DType::kF32) {  // a half root (a rounding's first half) grows on
      region = trial;
      root = r;
    }
    if (output_slot_.count(Value{r, 0}) || consumers_[static_cast<size_t>(r)].empty()) break;
    for (int32_t c : consumers_[static_cast<size_t>(r)]) {
      if (!in(trial, c)) trial.push_back(c);
    }
  }
  if (root < 0) return -1;
  for (int32_t id : region) absorbed_[static_cast<size_t>(id)] = true;
  return root;
}

void Lowerer::push_with_epilogue(Kernel k, const Node& n, Value v, std::vector<int64_t> strides) {
  k.shape = n.type().shape;
  Value root;
  const Value last = conv_post_ops(k, v, &root);
  // A row-major root that is a graph output is written there directly.
  const int32_t out = new_buffer(root.node >= 0 ? root : last, Region::kArena, -1, std::move(strides));
  buffer_of_[last] = out;
  k.outputs.push_back(out);
  k.out_layouts.push_back(p_.buffers[static_cast<size_t>(out)].layout());
  if (root.node >= 0) {
    // The epilogue's expression, `last` read from the buffer itself; the buffer then
    // holds the root's value.
    Expr e = compute(root);
    buffer_of_.erase(last);
    buffer_of_[root] = out;
    k.inputs.push_back(std::move(e));
    k.set_epilogue(static_cast<int32_t>(k.inputs.size() - 1));
  }
  push(std::move(k), n);
}

}  // namespace chroma::lowering
