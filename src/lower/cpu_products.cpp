// The CPU's forms of matrix products, convolutions and gathers of constant weights
// (Lowerer, lowerer.h, "CPU products and weights"): packed, quantized, gathered and routed
// products (chroma/cpu/gemm_packed.h, gemm_quant.h), a bfloat16 model's own weights kept
// bfloat16 (its convolutions, and its products of many rows on oneDNN's bfloat16 matmul), and
// quantized embedding tables. The weights are packed here, at compile time, into new constants; the
// weights policy's decisions go to Program::weight_decisions.
#include "lower/lowerer.h"

namespace chroma::lowering {

int32_t Lowerer::add_packed_constant(std::string name, Shape shape, const std::vector<float>& data) {
  std::vector<uint8_t> bytes(data.size() * sizeof(float));
  std::memcpy(bytes.data(), data.data(), bytes.size());
  return add_packed_bytes(std::move(name), TensorType{DType::kF32, std::move(shape)}, std::move(bytes));
}

int32_t Lowerer::add_packed_bytes(std::string name, TensorType type, std::vector<uint8_t> data) {
  ConstantData pc;
  pc.name = std::move(name);
  pc.type = std::move(type);
  pc.bytes = make_blob(std::move(data), opts_.spill.get());
  p_.constants.push_back(std::move(pc));
  Buffer pb;
  pb.region = Region::kConstant;
  pb.slot = static_cast<int32_t>(p_.constants.size() - 1);
  pb.type = p_.constants.back().type;
  pb.name = p_.constants.back().name;
  p_.buffers.push_back(pb);
  return static_cast<int32_t>(p_.buffers.size() - 1);
}

int32_t Lowerer::add_packed_bytes(std::string name, std::vector<uint8_t> data) {
  TensorType t{DType::kU8, {static_cast<int64_t>(data.size())}};
  return add_packed_bytes(std::move(name), std::move(t), std::move(data));
}

// quant::pack refused a weight: which one, read where, and how to keep it.
[[noreturn]] void unstorable(const std::string& cname, const Node& n, quant::Format f) {
  const std::string name = cname.empty() ? "folded" : cname;
  throw CompileError("weights: '" + name + "' read by node " + n.name + " cannot be stored as " + quant::format_name(f) +
                     ": a group holds a NaN or an infinity, or its scale or bias does not fit float16 (keep it exact "
                     "with a rule '" + name + "': 'fp32')");
}

quant::Format Lowerer::weight_format(const Node& n, const std::string& name, int64_t K, int64_t N, int64_t matrices) {
  if (!opts_.weights.quantizes()) return quant::Format::kF32;
  const int32_t id = static_cast<int32_t>(&n - g_.nodes().data());
  quant::Decision d = quant::decide(opts_.weights, name.empty() ? "folded" : name, final_[static_cast<size_t>(id)] ? "unembedding" : "",
                                    K, N, matrices);
  const quant::Format f = d.format;
  p_.weight_decisions.push_back(std::move(d));
  return f;
}

std::optional<Lowerer::WeightSource> Lowerer::weight_source(Value v) {
  const int32_t src = source_of(v.node);
  WeightSource w;
  w.bf16 = widened_bf16_weight(src);
  if (g_.node(src).op != Op::kConstant && !w.bf16) return std::nullopt;
  const size_t mark = fused_into_.size();
  Expr e = expr_of(v);
  fused_into_.resize(mark);
  if (w.bf16) {
    if (e.kind != Expr::kCast || e.children.size() != 1 || e.children[0].kind != Expr::kLoad ||
        e.children[0].dtype != DType::kBF16) {
      return std::nullopt;
    }
    Expr ld = std::move(e.children[0]);
    e = std::move(ld);
  }
  if (e.kind != Expr::kLoad || p_.buffers[static_cast<size_t>(e.buffer)].region != Region::kConstant) return std::nullopt;
  w.constant = &p_.constants[static_cast<size_t>(p_.buffers[static_cast<size_t>(e.buffer)].slot)];
  if (w.bf16) {  // widened: exact
    w.widened.resize(w.constant->bytes->size() / 2);
    for (size_t i = 0; i < w.widened.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, w.constant->data() + 2 * i, 2);
      w.widened[i] = half_detail::bf16_to_f32(h);
    }
  }
  w.load = std::move(e);
  return w;
}

bool Lowerer::widened_bf16_weight(int32_t id) const {
  const Node& n = g_.node(id);
  return n.op == Op::kCast && g_.type(n.inputs[0]).dtype == DType::kBF16 && g_.node(source_of(n.inputs[0].node)).op == Op::kConstant;
}

bool Lowerer::bf16_valued(Value v, int depth) const {
  const Node& src = g_.node(source_of(v.node));
  if (src.op == Op::kCast) return g_.type(src.inputs[0]).dtype == DType::kBF16;
  // What widen_half leaves unrounded because it picks among bfloat16 values (a relu of a
  // rounded value; widen_half.cpp): the same operations over bfloat16-valued operands or
  // literals that are bfloat16 values.
  if (src.op == Op::kFull) return half_value(src.attrs.scalar.as_double(), DType::kBF16);
  // Operations that move values: a concatenation of bfloat16-valued parts (a single block's
  // attention and MLP outputs before its projection), a gather from one.
  if (depth <= 8 && src.op == Op::kConcat) {
    for (Value in : src.inputs) {
      if (!bf16_valued(in, depth + 1)) return false;
    }
    return !src.inputs.empty();
  }
  if (depth <= 8 && (src.op == Op::kGather || src.op == Op::kGatherElements)) return bf16_valued(src.inputs[0], depth + 1);
  if (src.op != Op::kMap || depth > 8 || !ew_picks_operand(src.attrs.ew)) return false;
  const EwOp ew = src.attrs.ew;
  for (size_t k = ew == EwOp::k_where ? 1 : 0; k < src.inputs.size(); ++k) {
    if (!bf16_valued(src.inputs[k], depth + 1)) return false;
  }
  return true;
}

void Lowerer::model_bf16_format(const std::string& cname, int64_t K, int64_t N, int64_t matrices, Value activations,
                                quant::Format* wf, quant::Activations* acts) {
  if (*wf != quant::Format::kF32) return;  // the policy quantizes it: its values are what it quantizes
  // Stored as bfloat16, which loses nothing. The bf16 kernels round the activations to
  // bfloat16: exact when they are a bfloat16 tensor's values (PyTorch's bf16 product, fp32
  // accumulation); otherwise the exact float32 kernels (unless activations= says otherwise).
  *wf = quant::Format::kBF16;
  if (*acts == quant::Activations::kAuto) *acts = bf16_valued(activations) ? quant::Activations::kBF16 : quant::Activations::kFP32;
  quant::Decision d;
  d.name = cname.empty() ? "folded" : cname;
  d.shape = {K, N};
  d.matrices = matrices;
  d.format = *wf;
  d.reason = std::string("the model's bfloat16 weight, stored as it is; activations ") + quant::activations_name(*acts);
  d.bytes_f32 = 4 * K * N * matrices;
  d.bytes = quant::matrix_bytes(*wf, K, N) * matrices;
  p_.weight_decisions.push_back(std::move(d));
}

bool Lowerer::conv_bf16(const Node& n) {
  // A bfloat16 model's convolution: its input a bfloat16 tensor's values, its weights a
  // constant whose every value is a bfloat16 (folded from the model's bfloat16 weight).
  if (!bf16_valued(n.inputs[0])) return false;
  // Depthwise and narrow grouped convolutions (each output a sum of fewer than 32 products:
  // one AMX tile's depth) stay float32: their bfloat16 kernels are no faster, and the input's
  // conversion would be extra work.
  const Shape& ws = g_.type(n.inputs[1]).shape;
  if (ws.size() < 3 || numel(Shape(ws.begin() + 1, ws.end())) < 32) return false;
  std::optional<WeightSource> w = weight_source(n.inputs[1]);
  if (!w || w->constant->type.dtype != (w->bf16 ? DType::kBF16 : DType::kF32)) return false;
  if (w->bf16) return true;
  const size_t count = w->constant->bytes->size() / 4;
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, w->constant->data() + 4 * i, 4);
    if ((bits & 0xffffu) != 0) return false;
  }
  return true;
}

// The rows from which a bfloat16 model's product runs on oneDNN (chroma/cpu/matmul_dnnl.h's
// kDnnlBf16Rows; the header needs oneDNN's, so the number is repeated here).
constexpr int64_t kDnnlBf16Rows = 32;

bool Lowerer::bf16_dnnl_matmul(const Node& n, Value v, const WeightSource& src) {
  const TensorType& ct = n.type();
  const size_t r = ct.shape.size();
  const int64_t m = ct.shape[r - 2];
  // A's rows must lie evenly spaced across its batch dimensions (one [rows, K] matrix).
  auto flat_rows = [&](const Layout& l) {
    if (l.strides[r - 1] != 1) return false;
    int64_t want = l.strides[r - 2] * m;
    for (size_t d = r - 2; d-- > 0;) {
      if (l.shape[d] == 1) continue;
      if (l.strides[d] != want) return false;
      want *= l.shape[d];
    }
    return l.strides[r - 2] >= l.shape[r - 1];
  };
  // B one matrix (broadcast over the batch).
  const Layout& lb = src.load.layout;
  for (size_t d = 0; d + 2 < r; ++d) {
    if (lb.shape[d] != 1 && lb.strides[d] != 0) return false;
  }
  Expr ea = matmul_operand(n.inputs[0]);
  if (!flat_rows(ea.layout)) ea = buffer_load(n.inputs[0], Want::kContiguous);
  if (!flat_rows(ea.layout)) return false;
  Kernel k = start(n, Kernel::kMatMul);
  k.weights().format = quant::Format::kBF16;
  k.weights().activations = quant::Activations::kBF16;
  k.inputs.push_back(std::move(ea));
  k.inputs.push_back(src.load);
  push_over_output(std::move(k), n, v);
  p_.kernels.back().label.replace(0, 6, "MatMul.onednn_bf16");
  return true;
}

bool Lowerer::packed_matmul(const Node& n, Value v) {
  const TensorType& ct = n.type();
  const size_t r = ct.shape.size();
  if (ct.dtype != DType::kF32 || r < 2 || opts_.packed_max_rows <= 0) return false;
  const int64_t m = ct.shape[r - 2], nn = ct.shape[r - 1];
  const int64_t kk = g_.type(n.inputs[0]).shape[r - 1];
  if (m < 1 || nn < 1 || kk < 1) return false;
  std::optional<WeightSource> src = weight_source(n.inputs[1]);
  if (!src) return false;
  const Expr& eb = src->load;
  const ConstantData& cb = *src->constant;
  const std::string cname = weight_name(cb);
  const Shape batch(ct.shape.begin(), ct.shape.end() - 2);
  const int64_t nb = numel(batch);
  // Each batch's matrix, by its offset in the constant (broadcast batches share one).
  std::map<int64_t, int64_t> packed_of;  // source offset -> packed index
  std::vector<int64_t> b_of(static_cast<size_t>(nb));
  std::vector<int64_t> order;  // source offsets in packed order
  {
    std::vector<int64_t> idx(batch.size(), 0);
    for (int64_t b = 0; b < nb; ++b) {
      int64_t bo = eb.layout.offset;
      for (size_t d = 0; d < batch.size(); ++d) bo += idx[d] * eb.layout.strides[d];
      auto [pit, fresh] = packed_of.emplace(bo, static_cast<int64_t>(packed_of.size()));
      if (fresh) order.push_back(bo);
      b_of[static_cast<size_t>(b)] = pit->second;
      for (size_t d = batch.size(); d-- > 0;) {
        if (++idx[d] < batch[d]) break;
        idx[d] = 0;
      }
    }
  }
  quant::Format wf = weight_format(n, cname, kk, nn, static_cast<int64_t>(order.size()));
  quant::Activations acts = opts_.weights.activations;
  if (src->bf16) model_bf16_format(cname, kk, nn, static_cast<int64_t>(order.size()), n.inputs[0], &wf, &acts);
  // Many rows of bfloat16 activations times the model's bfloat16 weight: oneDNN's bfloat16
  // matmul (AMX), which outruns the packed kernels once the product is compute-bound.
  if (src->bf16 && wf == quant::Format::kBF16 && acts == quant::Activations::kBF16 && order.size() == 1 &&
      opts_.channels_last && nb * m >= kDnnlBf16Rows && bf16_dnnl_matmul(n, v, *src)) {
    return true;
  }
  // A quantized weight is never stored in float32: its products take the packed kernel at any
  // number of rows (panels dequantized a few at a time when there are many rows).
  if (wf == quant::Format::kF32 && m > opts_.packed_max_rows) return false;
  Kernel k = start(n, Kernel::kMatMulPacked);
  Expr ea = matmul_operand(n.inputs[0]);
  const float* bsrc = src->values();
  const int64_t sk = eb.layout.strides[r - 2], sn = eb.layout.strides[r - 1];
  const int64_t panels = (nn + 15) / 16;
  const int64_t panel_elems = panels * kk * 16;
  const int64_t mbytes = quant::matrix_bytes(wf, kk, nn);
  std::vector<float> packed;
  std::vector<uint8_t> qpacked;
  for (int64_t bo : order) {
    if (wf == quant::Format::kF32) {
      packed.resize(packed.size() + static_cast<size_t>(panel_elems), 0.0f);
      float* dst = packed.data() + packed.size() - static_cast<size_t>(panel_elems);
      for (int64_t p = 0; p < panels; ++p)
        for (int64_t q = 0; q < kk; ++q)
          for (int64_t j = 0; j < 16 && p * 16 + j < nn; ++j) dst[(p * kk + q) * 16 + j] = bsrc[bo + q * sk + (p * 16 + j) * sn];
    } else {
      qpacked.resize(qpacked.size() + static_cast<size_t>(mbytes));
      if (!quant::pack(wf, bsrc + bo, kk, nn, sk, sn, qpacked.data() + qpacked.size() - static_cast<size_t>(mbytes))) {
        unstorable(cname, n, wf);
      }
    }
  }
  std::vector<int64_t> idx(batch.size(), 0);
  for (int64_t b = 0; b < nb; ++b) {
    int64_t ao = ea.layout.offset;
    for (size_t d = 0; d < batch.size(); ++d) ao += idx[d] * ea.layout.strides[d];
    k.batches().a.push_back(ao);
    k.batches().b.push_back(b_of[static_cast<size_t>(b)] * (wf == quant::Format::kF32 ? panel_elems : mbytes));
    k.batches().c.push_back(b * m * nn);
    for (size_t d = batch.size(); d-- > 0;) {
      if (++idx[d] < batch[d]) break;
      idx[d] = 0;
    }
  }
  const auto routed_it = opts_.routed.find(v.node);
  if (routed_it != opts_.routed.end()) routed_jobs(routed_it->second, batch, kk, nn, wf, &k);
  const std::string base = cname.empty() ? "folded" : cname;
  const int32_t pb = wf == quant::Format::kF32
                         ? add_packed_constant(base + ".packed16", {static_cast<int64_t>(order.size()), panels, kk, 16}, packed)
                         : add_packed_bytes(base + "." + quant::format_name(wf), std::move(qpacked));
  k.weights().format = wf;
  k.weights().activations = acts;
  k.inputs.push_back(std::move(ea));
  k.inputs.push_back(load(pb));
  if (!k.packed().routed.experts.empty()) k.inputs.push_back(buffer_load(routed_it->second.mask, Want::kContiguous));
  const bool routed = !k.packed().routed.experts.empty();
  push_over_output(std::move(k), n, v);
  p_.kernels.back().label.replace(0, 6, (wf == quant::Format::kF32 ? "MatMul.packed" : std::string("MatMul.") + quant::format_name(wf)) +
                                            (routed ? ".routed" : ""));
  return true;
}

void Lowerer::routed_jobs(const RoutedProduct& rp, const Shape& batch, int64_t kk, int64_t nn, quant::Format wf, Kernel* k) {
  const size_t r = batch.size() + 2;
  const int64_t nb = static_cast<int64_t>(k->batches().a.size());
  if (rp.axis < static_cast<int64_t>(r) - 2) {
    // A batch axis: batch b's expert from its index along that axis.
    std::vector<int64_t> idx(batch.size(), 0);
    for (int64_t b = 0; b < nb; ++b) {
      k->packed().routed.experts.push_back(idx[static_cast<size_t>(rp.axis)] / rp.step % rp.experts);
      for (size_t d = batch.size(); d-- > 0;) {
        if (++idx[d] < batch[d]) break;
        idx[d] = 0;
      }
    }
    return;
  }
  // The columns: blocks of `step` columns, each one expert's, as jobs of whole panels.
  if (rp.axis != static_cast<int64_t>(r) - 1 || rp.step % 16 != 0 || nn % rp.step != 0 || rp.step >= nn) return;
  const int64_t per = nn / rp.step;
  const int64_t panel_step = rp.step / 16 * (wf == quant::Format::kF32 ? kk * 16 : quant::panel_bytes(wf, kk));
  std::vector<int64_t> a, bb, c;
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t j = 0; j < per; ++j) {
      a.push_back(k->batches().a[static_cast<size_t>(b)]);
      bb.push_back(k->batches().b[static_cast<size_t>(b)] + j * panel_step);
      c.push_back(k->batches().c[static_cast<size_t>(b)] + j * rp.step);
      k->packed().routed.experts.push_back(j % rp.experts);
    }
  }
  k->batches().a = std::move(a);
  k->batches().b = std::move(bb);
  k->batches().c = std::move(c);
  k->packed().routed.n = rp.step;
}

bool Lowerer::gathered_matmul(const Node& n, Value v) {
  const TensorType& ct = n.type();
  const size_t r = ct.shape.size();
  if (ct.dtype != DType::kF32 || r < 2 || opts_.packed_max_rows <= 0) return false;
  const Shape batch(ct.shape.begin(), ct.shape.end() - 2);
  const int64_t nb = numel(batch), m = ct.shape[r - 2], nn = ct.shape[r - 1];
  if (nb < 1 || m < 1 || nn < 1) return false;
  for (int side = 1; side >= 0; --side) {
    // The views from the Gather to the operand, applied to the gathered tensor's layout.
    std::vector<int32_t> chain;
    int32_t gid = n.inputs[static_cast<size_t>(side)].node;
    while (is_view(g_.node(gid).op)) {
      chain.push_back(gid);
      gid = g_.node(gid).inputs[0].node;
    }
    const Node& gn = g_.node(gid);
    if (gn.op != Op::kGather || !deferred_gather_[static_cast<size_t>(gid)] || buffer_of_.count(Value{gid, 0})) continue;
    std::optional<Layout> xl = contiguous_layout(gn.type().shape);
    for (size_t i = chain.size(); xl && i-- > 0;) xl = apply_view(g_.node(chain[i]), *xl);
    if (!xl || xl->shape.size() != r) continue;
    const Shape& ws = g_.type(gn.inputs[0]).shape;
    const int64_t experts = ws[0], R = ws[1], C = ws[2], RC = R * C;
    const int64_t slots = numel(g_.type(gn.inputs[1]).shape);
    const Shape ys = g_.type(n.inputs[static_cast<size_t>(1 - side)]).shape;
    if (experts < 1 || R < 1 || C < 1 || slots > 4096 || ys.size() != r ||
        !std::equal(ys.begin(), ys.end() - 2, batch.begin())) {
      continue;
    }
    // How each batch's matrix sits in the gathered tensor.
    const int64_t xr = xl->shape[r - 2], xc = xl->shape[r - 1], sr = xl->strides[r - 2], sc = xl->strides[r - 1];
    // Row-major: W[e] rows, experts stacked by rows; transposed: W[e]^T, stacked by columns.
    const bool row_major = xc == C && (sc == 1 || C == 1) && xr % R == 0 && (sr == C || xr == 1);
    const bool transposed = !row_major && xr == C && xc % R == 0 && (sr == 1 || C == 1) && (sc == C || xc == 1);
    if (!row_major && !transposed) continue;
    const int64_t per = row_major ? xr / R : xc / R;  // expert matrices per batch
    // Experts stacked along the contracted dimension would be a sum of products: not here.
    if (side == 1 && ((row_major && per != 1) || m > opts_.packed_max_rows)) continue;
    if (side == 0 && (nn != 1 || (transposed && per != 1))) continue;
    std::vector<int64_t> base(static_cast<size_t>(nb));  // each batch's first slot
    {
      std::vector<int64_t> idx(batch.size(), 0);
      bool ok = true;
      for (int64_t b = 0; b < nb && ok; ++b) {
        int64_t off = xl->offset;
        for (size_t d = 0; d < batch.size(); ++d) off += idx[d] * xl->strides[d];
        ok = off % RC == 0 && off / RC + per <= slots;
        base[static_cast<size_t>(b)] = off / RC;
        for (size_t d = batch.size(); d-- > 0;) {
          if (++idx[d] < batch[d]) break;
          idx[d] = 0;
        }
      }
      if (!ok) continue;
    }
    // The constant, seen through views (W[e][i][j] at offset + e*s0 + i*s1 + j*s2): float32, or
    // the model's bfloat16 weight.
    std::optional<WeightSource> src = weight_source(gn.inputs[0]);
    if (!src) continue;
    const Expr& ew = src->load;
    Kernel k = start(n, Kernel::kMatMulGathered);
    Expr ey = matmul_operand(n.inputs[static_cast<size_t>(1 - side)]);
    Expr ei = dense_operand(gn.inputs[1]);
    const ConstantData& cw = *src->constant;
    const float* w = src->values() + ew.layout.offset;
    const int64_t s0 = ew.layout.strides[0], s1 = ew.layout.strides[1], s2 = ew.layout.strides[2];
    // The packed product: B side, m x K times K x N with B_b itself; A side, one row (B_b^T)
    // times A_b^T. Packed as stored (W[e], K = R) or transposed (W[e]^T, K = C).
    const bool stored = (side == 1) == row_major;
    Kernel::Gathered& gg = k.gathered().job;
    gg.m = side == 1 ? m : 1;
    gg.k = stored ? R : C;
    gg.n = stored ? C : R;
    gg.experts = experts;
    gg.sar = side == 1 ? ey.layout.strides[r - 2] : 0;
    gg.sac = side == 1 ? ey.layout.strides[r - 1] : ey.layout.strides[r - 2];
    gg.ldc = side == 1 ? nn : gg.n;
    const int64_t panels = (gg.n + 15) / 16, panel_elems = panels * gg.k * 16;
    const std::string cname = cw.name;
    quant::Format wf = weight_format(n, cname, gg.k, gg.n, experts);
    quant::Activations acts = opts_.weights.activations;
    if (src->bf16) model_bf16_format(cname, gg.k, gg.n, experts, n.inputs[static_cast<size_t>(1 - side)], &wf, &acts);
    std::vector<float> packed;
    std::vector<uint8_t> qpacked;
    if (wf == quant::Format::kF32) {
      packed.assign(static_cast<size_t>(experts * panel_elems), 0.0f);
      for (int64_t e = 0; e < experts; ++e) {
        const float* we = w + e * s0;
        float* dst = packed.data() + e * panel_elems;
        for (int64_t p = 0; p < panels; ++p)
          for (int64_t q = 0; q < gg.k; ++q)
            for (int64_t j = 0; j < 16 && p * 16 + j < gg.n; ++j) {
              const int64_t col = p * 16 + j;
              dst[(p * gg.k + q) * 16 + j] = stored ? we[q * s1 + col * s2] : we[col * s1 + q * s2];
            }
      }
    } else {
      const int64_t mbytes = quant::matrix_bytes(wf, gg.k, gg.n);
      qpacked.resize(static_cast<size_t>(experts * mbytes));
      for (int64_t e = 0; e < experts; ++e) {
        if (!quant::pack(wf, w + e * s0, gg.k, gg.n, stored ? s1 : s2, stored ? s2 : s1, qpacked.data() + e * mbytes)) {
          unstorable(cname, n, wf);
        }
      }
    }
    std::vector<int64_t> idx(batch.size(), 0);
    for (int64_t b = 0; b < nb; ++b) {
      int64_t yo = ey.layout.offset;
      for (size_t d = 0; d < batch.size(); ++d) yo += idx[d] * ey.layout.strides[d];
      for (int64_t i = 0; i < per; ++i) {
        k.batches().a.push_back(yo);
        k.batches().b.push_back(ei.layout.offset + base[static_cast<size_t>(b)] + i);
        k.batches().c.push_back(b * m * nn + i * gg.n);
      }
      for (size_t d = batch.size(); d-- > 0;) {
        if (++idx[d] < batch[d]) break;
        idx[d] = 0;
      }
    }
    const std::string stem = (cname.empty() ? "folded" : cname) + (stored ? "" : ".t");
    const int32_t pb = wf == quant::Format::kF32 ? add_packed_constant(stem + ".packed16", {experts, panels, gg.k, 16}, packed)
                                                 : add_packed_bytes(stem + "." + quant::format_name(wf), std::move(qpacked));
    k.weights().format = wf;
    k.weights().activations = acts;
    k.attrs.axis = 0;
    k.inputs.push_back(std::move(ey));
    k.inputs.push_back(load(pb));
    k.inputs.push_back(std::move(ei));
    push_over_output(std::move(k), n, v);
    p_.kernels.back().label.replace(0, 6, wf == quant::Format::kF32 ? "MatMul.gathered" : std::string("MatMul.gathered.") + quant::format_name(wf));
    return true;
  }
  return false;
}

bool Lowerer::quantized_gather(const Node& n, Value v) {
  if (!opts_.weights.quantizes() || n.op != Op::kGather || n.attrs.axis != 0 || opts_.packed_max_rows <= 0) return false;
  const TensorType& tt = g_.type(n.inputs[0]);
  if (tt.dtype != DType::kF32 || tt.shape.size() != 2 || g_.node(n.inputs[0].node).op != Op::kConstant) return false;
  const int64_t rows = tt.shape[0], H = tt.shape[1];
  if (rows < 1 || H < 1) return false;
  const size_t mark = fused_into_.size();
  Expr et = expr_of(n.inputs[0]);
  fused_into_.resize(mark);
  if (et.kind != Expr::kLoad || p_.buffers[static_cast<size_t>(et.buffer)].region != Region::kConstant || et.layout.offset != 0 ||
      et.layout.strides != contiguous_strides(tt.shape)) {
    return false;
  }
  const ConstantData& c = p_.constants[static_cast<size_t>(p_.buffers[static_cast<size_t>(et.buffer)].slot)];
  const std::string cname = c.name.empty() ? "folded" : c.name;
  quant::Decision d = quant::decide(opts_.weights, cname, "embedding", H, rows, 1);
  d.shape = {rows, H};
  const quant::Format wf = d.format;
  p_.weight_decisions.push_back(d);
  if (wf == quant::Format::kF32) return false;
  std::vector<uint8_t> packed(static_cast<size_t>(rows * quant::row_bytes(wf, H)));
  if (!quant::pack_rows(wf, reinterpret_cast<const float*>(c.data()), rows, H, packed.data())) {
    unstorable(c.name, n, wf);
  }
  Kernel k = start(n, Kernel::kGather);
  const int32_t pb = add_packed_bytes(cname + ".rows." + quant::format_name(wf), std::move(packed));
  k.weights().format = wf;
  k.inputs.push_back(load(pb));
  k.inputs.push_back(dense_operand(n.inputs[1]));
  push_over_output(std::move(k), n, v);
  p_.kernels.back().label = std::string("Gather.") + quant::format_name(wf);
  return true;
}

void Lowerer::emit_gather(const Node& n, Value v) {
  if (quantized_gather(n, v)) return;
  Kernel k = start(n, n.op == Op::kGather ? Kernel::kGather : Kernel::kGatherElements);
  k.inputs.push_back(expr_of(n.inputs[0]));
  if (n.op == Op::kGather && n.attrs.axis == 0 && g_.node(n.inputs[0].node).op == Op::kConstant) {
    reduced_weight(n, &k.inputs.back(), "embedding");
  }
  k.inputs.push_back(expr_of(n.inputs[1]));
  push_over_output(std::move(k), n, v);
}

}  // namespace chroma::lowering
