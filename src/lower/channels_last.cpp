// Channels-last activations (Lowerer, lowerer.h, "channels-last activations"): which
// buffers are laid out channels-last (LowerOptions::channels_last), a convolution's input in
// that layout, and the relayout copies, made once per value and layout, for readers that need
// the other one.
#include "lower/lowerer.h"

namespace chroma::lowering {

bool Lowerer::prefers_channels_last(const Expr& e, const Shape& shape) const {
  if (e.kind == Expr::kLoad) {
    return p_.buffers[static_cast<size_t>(e.buffer)].channels_last() && e.layout.shape.size() == shape.size() &&
           e.layout.shape == shape;
  }
  for (const Expr& c : e.children) {
    if (prefers_channels_last(c, shape)) return true;
  }
  return false;
}

std::vector<int64_t> Lowerer::strides_for(const Expr& e, const Shape& shape, Value v, Want want) const {
  if (!opts_.channels_last || shape.size() < 3 || output_slot_.count(v)) return {};
  if (want == Want::kChannelsLast || (want == Want::kAny && prefers_channels_last(e, shape))) return channels_last_strides(shape);
  return {};
}

int32_t Lowerer::copy_of(Value v, int32_t b, bool channels_last) {
  const auto key = std::make_pair(v, channels_last);
  if (auto it = copies_.find(key); it != copies_.end()) return it->second;
  std::vector<int32_t> saved;
  saved.swap(fused_into_);
  const Node& n = g_.node(v);
  Kernel k = start(n, Kernel::kAssign);
  k.shape = g_.type(v).shape;
  k.inputs.push_back(load(b));
  const int32_t out = new_buffer_of(g_.type(v), Region::kArena, n.name);
  if (channels_last) p_.buffers[static_cast<size_t>(out)].strides = channels_last_strides(k.shape);
  k.outputs.push_back(out);
  k.out_layouts.push_back(p_.buffers[static_cast<size_t>(out)].layout());
  push(std::move(k), n);
  p_.kernels.back().label = std::string(channels_last ? "Relayout.channels_last" : "Relayout.row_major") + " <- " +
                            std::string(op_info(n.op).name);
  fused_into_.swap(saved);
  copies_.emplace(key, out);
  return out;
}

Expr Lowerer::buffer_load(Value v, Want want) {
  materialize(v, want);
  const int32_t b = buffer_of_.at(v);
  const bool cl = p_.buffers[static_cast<size_t>(b)].channels_last();
  if (want == Want::kContiguous && cl) return load(copy_of(v, b, false));
  if (want == Want::kChannelsLast && !cl && !is_channels_last(load(b).layout)) return load(copy_of(v, b, true));
  return load(b);
}

Expr Lowerer::channels_last_operand(Value v) {
  const size_t mark = fused_into_.size();
  Expr e = expr_of(v);
  if (e.kind == Expr::kLoad && is_channels_last(e.layout)) return e;
  fused_into_.resize(mark);
  return buffer_load(v, Want::kChannelsLast);
}

}  // namespace chroma::lowering
