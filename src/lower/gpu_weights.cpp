// Constant operands stored for the GPU targets' kernels (Lowerer, lowerer.h, "GPU
// weights"): weights in the format the weights policy decides, read by loads the kernels
// convert or dequantize (there are no pre-packed panels on these targets), and constant
// right operands of products stored row-major; also, for the CPU's sgemm, with a row pitch it
// reads without copying (row_major_constant's pitch_only). Each is a new constant made at
// compile time.
#include "lower/lowerer.h"

#include <algorithm>
#include <numeric>

namespace chroma::lowering {

void Lowerer::reduced_weight(const Node& n, Expr* e, const std::string& role, bool left) {
  if (!opts_.weights.quantizes() || opts_.packed_max_rows > 0) return;
  if (e->kind != Expr::kLoad || e->dtype != DType::kF32) return;
  const Buffer& buf = p_.buffers[static_cast<size_t>(e->buffer)];
  if (buf.region != Region::kConstant) return;
  const Layout l = e->layout;
  const size_t r = l.shape.size();
  if (r < 2 || numel(l.shape) == 0 || (role == "embedding" && r != 2)) return;
  // The values the layout selects, each broadcast dimension once.
  Shape stored = l.shape;
  for (size_t d = 0; d < r; ++d) {
    if (l.strides[d] == 0) stored[d] = 1;
  }
  const ConstantData& c = p_.constants[static_cast<size_t>(buf.slot)];
  const std::string name = weight_name(c);
  // A grouped format stores rows along K: a product's B [K, N] as N rows, its A [M, K] (the
  // transposed case, N = M) and an embedding [rows, H] (K = H) as they are.
  const bool along_last = left || role == "embedding";
  const size_t kdim = along_last ? r - 1 : r - 2;
  const int64_t K = l.shape[kdim], N = l.shape[along_last ? r - 2 : r - 1];
  quant::Format f;
  if (role == "embedding") {
    quant::Decision d = quant::decide(opts_.weights, name, "embedding", K, N, 1);
    d.shape = {N, K};
    f = d.format;
    p_.weight_decisions.push_back(std::move(d));
  } else {
    f = weight_format(n, name, K, N, numel(stored) / std::max<int64_t>(1, stored[r - 2] * stored[r - 1]));
  }
  if (f == quant::Format::kF32) return;
  quant::Decision& dec = p_.weight_decisions.back();
  // Rows whose length is not a multiple of the group size would leave the groups off 4-byte
  // boundaries: those take bf16, and the reason says so.
  if (f != quant::Format::kBF16 && (K % quant::kGroup != 0 || stored[kdim] != K)) {
    f = quant::Format::kBF16;
    dec.format = f;
    dec.reason += "; bf16 on GPU targets: K = " + std::to_string(K) + " is not a multiple of " + std::to_string(quant::kGroup);
  }
  // The values in storage order: natural for bf16; for the rows of a grouped format, the
  // stored dimensions with K moved last (B's N before its K).
  std::vector<size_t> order(r);
  std::iota(order.begin(), order.end(), size_t{0});
  if (f != quant::Format::kBF16 && !along_last) std::rotate(order.begin() + static_cast<long>(r - 2), order.begin() + static_cast<long>(r - 1), order.end());
  const std::vector<uint8_t> dense = gather_strided(c.data(), 4, l, stored, order);
  const auto* values = reinterpret_cast<const float*>(dense.data());
  const int64_t total = numel(stored);
  Expr ld;
  ld.kind = Expr::kLoad;
  ld.layout.shape = l.shape;
  ld.layout.offset = 0;
  ld.layout.strides = dense_strides(stored, order);
  if (f == quant::Format::kBF16) {
    std::vector<uint8_t> bytes(static_cast<size_t>(total * 2));
    for (int64_t i = 0; i < total; ++i) {
      const uint16_t h = half_detail::f32_to_bf16(values[i]);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
    dec.bytes = total * 2;
    ld.dtype = DType::kBF16;
    ld.buffer = add_packed_bytes(name + ".bf16", TensorType{DType::kBF16, stored}, std::move(bytes));
    Expr cast;
    cast.kind = Expr::kCast;
    cast.dtype = DType::kF32;
    cast.children.push_back(std::move(ld));
    *e = std::move(cast);
    return;
  }
  std::vector<uint8_t> packed(static_cast<size_t>(total / K * quant::row_bytes(f, K)));
  if (!quant::pack_rows(f, values, total / K, K, packed.data())) unstorable(name, n, f);
  dec.bytes = static_cast<int64_t>(packed.size());
  ld.dtype = DType::kF32;
  ld.quant = f;
  ld.quant_k = K;
  ld.buffer = add_packed_bytes(name + ".rows." + quant::format_name(f), std::move(packed));
  *e = std::move(ld);
}

void Lowerer::row_major_constant(Expr* e, bool pitch_only) {
  constexpr int64_t kAliasPitch = 1024;  // et::sgemm's sgemm_detail::kAliasPitch
  if (e->kind != Expr::kLoad || dtype_size(e->dtype) != 4 || e->quant != quant::Format::kF32) return;
  const Buffer& buf = p_.buffers[static_cast<size_t>(e->buffer)];
  if (buf.region != Region::kConstant) return;
  const Layout& l = e->layout;
  const size_t r = l.shape.size();
  if (r < 2 || numel(l.shape) == 0) return;
  if (pitch_only ? (l.strides[r - 1] != 1 || l.strides[r - 2] % kAliasPitch != 0 || l.shape[r - 2] < 2)
                 : l.strides[r - 1] == 1) {
    return;
  }
  const Shape batch(l.shape.begin(), l.shape.end() - 2);
  bool broadcast = true, distinct = true;
  for (size_t d = 0; d < batch.size(); ++d) {
    if (batch[d] == 1) continue;
    broadcast = broadcast && l.strides[d] == 0;
    distinct = distinct && l.strides[d] != 0;
  }
  if (!broadcast && !distinct) return;
  const int64_t kk = l.shape[r - 2], nn = l.shape[r - 1];
  // Row pitch: nn, or (pitch_only) 16 more, and 16 more again if that is still a multiple.
  int64_t pitch = nn;
  if (pitch_only) {
    pitch = (nn + 15) / 16 * 16 + 16;
    if (pitch % kAliasPitch == 0) pitch += 16;
  }
  const int64_t nb = broadcast ? 1 : numel(batch);
  const ConstantData& c = p_.constants[static_cast<size_t>(buf.slot)];
  const auto* src = reinterpret_cast<const uint32_t*>(c.data());
  std::vector<float> out(static_cast<size_t>(nb * kk * pitch), 0.0f);
  auto* dst = reinterpret_cast<uint32_t*>(out.data());
  std::vector<int64_t> idx(batch.size(), 0);
  for (int64_t b = 0; b < nb; ++b) {
    int64_t o = l.offset;
    for (size_t d = 0; d < batch.size(); ++d) o += idx[d] * l.strides[d];
    for (int64_t q = 0; q < kk; ++q)
      for (int64_t j = 0; j < nn; ++j) dst[(b * kk + q) * pitch + j] = src[o + q * l.strides[r - 2] + j * l.strides[r - 1]];
    for (size_t d = batch.size(); d-- > 0;) {
      if (++idx[d] < batch[d]) break;
      idx[d] = 0;
    }
  }
  Shape shape = broadcast ? Shape{kk, pitch} : l.shape;
  shape[shape.size() - 1] = pitch;
  const int32_t nbuf =
      add_packed_constant((c.name.empty() ? "folded" : c.name) + (pitch_only ? ".pitched" : ".row_major"), shape, out);
  p_.buffers[static_cast<size_t>(nbuf)].type.dtype = e->dtype;  // the bits of any 4-byte type
  p_.constants.back().type.dtype = e->dtype;
  Layout nl;
  nl.shape = l.shape;
  nl.strides.assign(r, 0);
  nl.strides[r - 1] = 1;
  nl.strides[r - 2] = pitch;
  if (!broadcast) {
    int64_t st = kk * pitch;
    for (size_t d = batch.size(); d-- > 0;) {
      nl.strides[d] = batch[d] == 1 ? 0 : st;
      st *= batch[d];
    }
  }
  e->buffer = nbuf;
  e->layout = nl;
}

}  // namespace chroma::lowering
