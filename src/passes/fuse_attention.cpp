#include "passes/fuse_attention.h"

#include <cstring>
#include <optional>

#include "passes/dce.h"
#include "passes/rewrite.h"

namespace chroma {
namespace {

struct Match {
  Value q, kt, v, bias;  // bias.node < 0: none
  double scale = 1.0;
  bool divide = false;
  Shape domain;  // the softmax's shape [B..., L, S]
};

class Finder {
 public:
  Finder(const Graph& g, int64_t max_width) : g_(g), uses_(g.size(), 0), max_width_(max_width) {
    for (const Node& n : g.nodes()) {
      for (Value in : n.inputs) ++uses_[static_cast<size_t>(in.node)];
    }
    for (Value out : g.outputs) uses_[static_cast<size_t>(out.node)] += 2;  // an output is never fused away
  }

  // The attention whose second product is node `id`, if it is one.
  std::optional<Match> at(int32_t id) const {
    const Node& mm2 = g_.node(id);
    if (mm2.op != Op::kMatMul || mm2.type().dtype != DType::kF32) return std::nullopt;
    Value p = strip(mm2.inputs[0]);
    const Node& sm = g_.node(p);
    if (sm.op != Op::kSoftmax || sm.attrs.log || !single(p) || sm.type().rank() < 2 ||
        sm.attrs.axis != sm.type().rank() - 1 || sm.type().dtype != DType::kF32) {
      return std::nullopt;
    }
    Match m;
    m.domain = sm.type().shape;
    Value s = strip(sm.inputs[0]);
    // [+ bias]: either operand may be the scores.
    const Node& add = g_.node(s);
    if (add.op == Op::kMap && add.attrs.ew == EwOp::k_add && add.inputs.size() == 2 && single(s)) {
      for (int side = 0; side < 2; ++side) {
        if (auto found = scores(add.inputs[static_cast<size_t>(side)], &m)) {
          m.bias = add.inputs[static_cast<size_t>(1 - side)];
          return finish(*found, mm2, m);
        }
      }
      return std::nullopt;
    }
    if (auto found = scores(s, &m)) return finish(*found, mm2, m);
    return std::nullopt;
  }

 private:
  bool single(Value v) const { return uses_[static_cast<size_t>(v.node)] == 1; }

  // Through single-use reshapes and float32-to-float32 casts.
  Value strip(Value v) const {
    for (;;) {
      const Node& n = g_.node(v);
      const bool view = n.op == Op::kReshape || (n.op == Op::kCast && n.type().dtype == g_.type(n.inputs[0]).dtype);
      if (!view || !single(v)) return v;
      v = n.inputs[0];
    }
  }

  // The value every element of `v` has, when it is one scalar (a Full, or a one-element
  // float32 constant, through expands and reshapes).
  std::optional<double> literal(Value v) const {
    for (;;) {
      const Node& n = g_.node(v);
      if (n.op == Op::kExpand || n.op == Op::kReshape) {
        v = n.inputs[0];
        continue;
      }
      if (n.op == Op::kFull && !n.attrs.scalar.is_int) return n.attrs.scalar.f;
      if (n.op == Op::kFull) return static_cast<double>(n.attrs.scalar.i);
      if (n.op == Op::kConstant && n.type().dtype == DType::kF32 && n.type().numel() == 1) {
        float f;
        std::memcpy(&f, g_.constants.at(static_cast<size_t>(n.attrs.index)).data(), sizeof f);
        return f;
      }
      return std::nullopt;
    }
  }

  // The first product behind `v` ([* or / a scalar] of a single-use float32 MatMul whose
  // batch dimensions flatten the softmax's); fills the scale.
  std::optional<int32_t> scores(Value v, Match* m) const {
    v = strip(v);
    const Node& n = g_.node(v);
    if (n.op == Op::kMap && (n.attrs.ew == EwOp::k_mul || n.attrs.ew == EwOp::k_div) && n.inputs.size() == 2 && single(v)) {
      for (int side = 0; side < 2; ++side) {
        if (n.attrs.ew == EwOp::k_div && side == 0) continue;  // c / scores is no scale
        auto c = literal(n.inputs[static_cast<size_t>(side)]);
        if (!c) continue;
        auto mm = product(n.inputs[static_cast<size_t>(1 - side)], m->domain);
        if (!mm) return std::nullopt;
        m->scale = *c;
        m->divide = n.attrs.ew == EwOp::k_div;
        return mm;
      }
      return std::nullopt;
    }
    return product(v, m->domain);
  }

  std::optional<int32_t> product(Value v, const Shape& domain) const {
    v = strip(v);
    const Node& n = g_.node(v);
    if (n.op != Op::kMatMul || !single(v) || n.type().dtype != DType::kF32 || n.type().numel() != numel(domain)) return std::nullopt;
    const Shape& s = n.type().shape;
    const size_t r = s.size(), d = domain.size();
    if (s[r - 2] != domain[d - 2] || s[r - 1] != domain[d - 1]) return std::nullopt;
    return v.node;
  }

  std::optional<Match> finish(int32_t mm1_id, const Node& mm2, Match m) const {
    const Node& mm1 = g_.node(mm1_id);
    m.q = mm1.inputs[0];
    m.kt = mm1.inputs[1];
    m.v = mm2.inputs[1];
    // Products over the same batch: the second's columns and the first's rows line up.
    const Shape& s2 = mm2.type().shape;
    if (s2[s2.size() - 2] != m.domain[m.domain.size() - 2]) return std::nullopt;
    if (m.bias.valid() && g_.type(m.bias).dtype != DType::kF32) return std::nullopt;
    if (max_width_ > 0 && (g_.type(m.q).shape.back() > max_width_ || g_.type(m.v).shape.back() > max_width_)) return std::nullopt;
    return m;
  }

  const Graph& g_;
  std::vector<int32_t> uses_;
  int64_t max_width_;
};

// `v` (of `src`) in the new graph with shape `shape` (its batch dimensions split as the
// softmax's): the value before a reshape that flattened them, else a reshape of it.
Value reshaped(GraphRewriter& rw, Value v, const Shape& shape) {
  const Graph& src = rw.src();
  if (src.type(v).shape == shape) return rw.map(v);
  const Node& n = src.node(v);
  if (n.op == Op::kReshape && src.type(n.inputs[0]).shape == shape) return rw.map(n.inputs[0]);
  Attrs a;
  a.ints = shape;
  return rw.out().add(Op::kReshape, {rw.map(v)}, a);
}

}  // namespace

Graph fuse_attention(const Graph& g, int64_t max_width) {
  Finder finder(g, max_width);
  GraphRewriter rw(g);
  bool any = false;
  for (int32_t id = 0; id < static_cast<int32_t>(g.size()); ++id) {
    std::optional<Match> m = finder.at(id);
    if (!m) {
      rw.copy(id);
      continue;
    }
    const Node& mm2 = g.node(id);
    rw.out().set_origin(mm2.name, mm2.source);
    const Shape& dom = m->domain;
    const size_t r = dom.size();
    const int64_t D = g.type(m->q).shape.back(), E = g.type(m->v).shape.back();
    Shape qs(dom.begin(), dom.end() - 1), ks(dom.begin(), dom.end() - 2), vs(dom.begin(), dom.end() - 2);
    qs.push_back(D);
    ks.push_back(D);
    ks.push_back(dom[r - 1]);
    vs.push_back(dom[r - 1]);
    vs.push_back(E);
    std::vector<Value> args = {reshaped(rw, m->q, qs), reshaped(rw, m->kt, ks), reshaped(rw, m->v, vs)};
    if (m->bias.valid()) args.push_back(reshaped(rw, m->bias, dom));
    Attrs a;
    a.scalar = Scalar::of_float(m->scale);
    a.k = m->divide ? 1 : 0;
    Value att = rw.out().add(Op::kAttention, std::move(args), a);
    if (rw.out().type(att).shape != mm2.type().shape) {
      Attrs ra;
      ra.ints = mm2.type().shape;
      att = rw.out().add(Op::kReshape, {att}, ra);
    }
    rw.replace(id, {att});
    any = true;
  }
  Graph r = rw.finish();
  return any ? eliminate_dead_code(r) : r;
}

}  // namespace chroma
