#include "passes/routed_experts.h"

#include <algorithm>
#include <vector>

#include "passes/rewrite.h"

namespace chroma {

namespace {

// Where the expert index lies in a tensor: e = (index along axis / step) % experts, with the
// axis's size a multiple of step * experts (then e is also (row-major flat index / (step *
// the axes after `axis`)) % experts, which a Reshape keeps).
struct ExpertAxis {
  int64_t axis = 0, step = 1, experts = 0;
  bool operator==(const ExpertAxis&) const = default;
};

int64_t inner_size(const Shape& s, int64_t axis) {
  int64_t r = 1;
  for (size_t d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) r *= s[d];
  return r;
}

// The same expert index seen in a Reshape's input (of shape `in`); false when it does not
// lie along one axis there.
bool through_reshape(const Shape& out, const ExpertAxis& x, const Shape& in, ExpertAxis* y) {
  const int64_t flat = x.step * inner_size(out, x.axis);
  if (flat <= 0 || numel(in) <= 0) return false;  // nothing to skip in an empty tensor
  int64_t inner = 1;
  for (int64_t b = static_cast<int64_t>(in.size()); b-- > 0;) {
    const int64_t dim = in[static_cast<size_t>(b)];
    if (flat % inner == 0 && flat < inner * dim) {
      const int64_t t = flat / inner;
      if (dim % (t * x.experts) != 0) return false;
      *y = ExpertAxis{b, t, x.experts};
      return true;
    }
    inner *= dim;
  }
  return false;
}

bool float_or_bool(DType t) { return is_float(t) || t == DType::kBool; }

// v is a constant seen through views and casts (a product's weight).
bool constant_source(const Graph& g, Value v) {
  for (;;) {
    const Node& n = g.node(v);
    if (n.op == Op::kConstant) return true;
    if (n.op != Op::kPermute && n.op != Op::kReshape && n.op != Op::kExpand && n.op != Op::kSlice && n.op != Op::kCast) return false;
    v = n.inputs[0];
  }
}

// R is a selection's result: computed (at most 64 nodes back) from a TopK or an ArgReduce
// (argmax), as a router's weights are, and not a constant. Weights that no selection made
// (attention probabilities, a learned mixing matrix) are rarely zero; nothing is gained there.
bool selects(const Graph& g, Value r) {
  if (constant_source(g, r)) return false;
  std::vector<int32_t> queue{r.node};  // breadth first: the nearest nodes
  std::vector<bool> seen(g.size(), false);
  seen[static_cast<size_t>(r.node)] = true;
  for (size_t q = 0; q < queue.size() && q < 64; ++q) {
    const Node& n = g.node(queue[q]);
    if (n.op == Op::kTopK || n.op == Op::kArgReduce) return true;
    for (Value in : n.inputs) {
      if (!seen[static_cast<size_t>(in.node)]) {
        seen[static_cast<size_t>(in.node)] = true;
        queue.push_back(in.node);
      }
    }
  }
  return false;
}

// One contraction over the expert axis and what follows from it.
struct Plan {
  int32_t contraction = -1;
  int side = 0;                 // which operand of the contraction is H
  Value routing;                // R
  int64_t routing_axis = 0;     // e's axis in R
  int64_t h_axis = 0;           // e's axis in H
  int64_t experts = 0;
  std::map<int32_t, ExpertAxis> products;  // product node -> e over its output
  Value mask;                   // in the rewritten graph
};

// Walks back from H (e along `start`): the nodes that keep each element's e (the slice) and
// the products at its sources. False when the pattern does not hold.
bool find_slice(const Graph& g, Value h, ExpertAxis start, const std::vector<std::vector<int32_t>>& readers,
                const std::vector<bool>& is_output, Plan* plan) {
  std::map<int32_t, ExpertAxis> slice;
  std::vector<std::pair<Value, ExpertAxis>> todo{{h, start}};
  while (!todo.empty()) {
    auto [v, x] = todo.back();
    todo.pop_back();
    const Node& n = g.node(v);
    const TensorType& t = n.type(v.index);
    if (v.index != 0 || n.types.size() != 1) return false;
    bool transparent = true;
    switch (n.op) {
      case Op::kMatMul:
      case Op::kMap:
      case Op::kCast:
      case Op::kPermute:
      case Op::kReshape:
      case Op::kExpand:
      case Op::kSlice: break;
      default: transparent = false;  // computed independently of the products: read as it is
    }
    if (!transparent) continue;
    if (!float_or_bool(t.dtype)) return false;
    if (auto it = slice.find(v.node); it != slice.end()) {
      if (!(it->second == x)) return false;  // reached again with e elsewhere
      continue;
    }
    slice.emplace(v.node, x);
    switch (n.op) {
      case Op::kMatMul: {
        if (!is_float(t.dtype)) return false;
        plan->products.emplace(v.node, x);
        // An operand that carries e too (the experts' own activations, computed by earlier
        // products: an expert's second layer reads its first) is part of the slice; one
        // that does not (the tokens, a weight broadcast over the experts) is read as it is.
        const int64_t rank = t.rank();
        for (int i = 0; i < 2; ++i) {
          const Value in = n.inputs[static_cast<size_t>(i)];
          const Shape& s = g.type(in).shape;
          if (static_cast<int64_t>(s.size()) != rank || constant_source(g, in)) continue;
          int64_t ax = x.axis;
          if (ax == rank - 1) {
            if (i == 0) continue;  // e along the columns: B's columns
          } else if (ax == rank - 2) {
            if (i == 1) continue;  // e along the rows: A's rows
          }
          if (s[static_cast<size_t>(ax)] != t.shape[static_cast<size_t>(ax)]) continue;  // broadcast batch
          todo.push_back({in, x});
        }
        break;
      }
      case Op::kMap:
        for (Value in : n.inputs) todo.push_back({in, x});
        break;
      case Op::kCast:
        if (!float_or_bool(g.type(n.inputs[0]).dtype)) return false;
        todo.push_back({n.inputs[0], x});
        break;
      case Op::kPermute:
        todo.push_back({n.inputs[0], ExpertAxis{n.attrs.ints[static_cast<size_t>(x.axis)], x.step, x.experts}});
        break;
      case Op::kReshape: {
        ExpertAxis y;
        if (!through_reshape(t.shape, x, g.type(n.inputs[0]).shape, &y)) return false;
        todo.push_back({n.inputs[0], y});
        break;
      }
      case Op::kExpand:
        // A broadcast along e: the input does not depend on it (a bias, a scale).
        if (g.type(n.inputs[0]).shape[static_cast<size_t>(x.axis)] != 1) todo.push_back({n.inputs[0], x});
        break;
      case Op::kSlice:
        if (n.attrs.axis == x.axis) return false;
        todo.push_back({n.inputs[0], x});
        break;
      default: break;
    }
  }
  // Everything in the slice is read only by the slice, or (H) by the contraction as H.
  for (const auto& [id, x] : slice) {
    if (is_output[static_cast<size_t>(id)]) return false;
    for (int32_t r : readers[static_cast<size_t>(id)]) {
      if (slice.count(r)) continue;
      if (r != plan->contraction || id != h.node) return false;
    }
  }
  const Node& c = g.node(plan->contraction);
  if (c.inputs[0].node == c.inputs[1].node || slice.count(c.inputs[static_cast<size_t>(1 - plan->side)].node) ||
      slice.count(plan->routing.node)) {
    return false;
  }
  return true;
}

// The contraction `id` over the expert axis (H's axis h_axis, R's r_axis), if it fits the
// pattern with H on `side`.
bool plan_for(const Graph& g, int32_t id, int side, int64_t h_axis, int64_t r_axis,
              const std::vector<std::vector<int32_t>>& readers, const std::vector<bool>& is_output, Plan* plan) {
  const Node& n = g.node(id);
  const Value h = n.inputs[static_cast<size_t>(side)], r = n.inputs[static_cast<size_t>(1 - side)];
  const TensorType& th = g.type(h);
  const TensorType& tr = g.type(r);
  if (!is_float(th.dtype) || !is_float(tr.dtype) || th.rank() < 2 || tr.rank() < 2) return false;
  plan->contraction = id;
  plan->side = side;
  plan->routing = r;
  plan->h_axis = h_axis;
  plan->routing_axis = r_axis;
  plan->experts = th.shape[static_cast<size_t>(plan->h_axis)];
  if (plan->experts < 2) return false;
  // R's values where they are computed: back through the views that keep each element's e
  // (the mask is computed right after them, before the products that wait for it).
  for (;;) {
    const Node& rn = g.node(plan->routing);
    if (plan->routing.index != 0 || rn.inputs.empty()) break;
    const Value in = rn.inputs[0];
    const Shape& is = g.type(in).shape;
    ExpertAxis y{plan->routing_axis, 1, plan->experts};
    if (rn.op == Op::kPermute) {
      y.axis = rn.attrs.ints[static_cast<size_t>(y.axis)];
    } else if (rn.op == Op::kReshape) {
      if (!through_reshape(rn.type().shape, y, is, &y) || y.step != 1 || is[static_cast<size_t>(y.axis)] != plan->experts) break;
    } else if (rn.op == Op::kExpand || (rn.op == Op::kCast && is_float(g.type(in).dtype))) {
      if (is[static_cast<size_t>(y.axis)] != plan->experts) break;
    } else {
      break;
    }
    plan->routing = in;
    plan->routing_axis = y.axis;
  }
  plan->products.clear();
  if (!find_slice(g, h, ExpertAxis{plan->h_axis, 1, plan->experts}, readers, is_output, plan)) return false;
  // The products whose experts can be skipped: a constant B (packed, each expert's matrix or
  // block of columns apart), e along a batch axis or along the columns in blocks of whole
  // 16-column panels, computed after R (they wait for the mask).
  for (auto it = plan->products.begin(); it != plan->products.end();) {
    const Node& p = g.node(it->first);
    const int64_t rank = p.type().rank(), cols = p.type().shape.back();
    const ExpertAxis& x = it->second;
    const bool splits = x.axis < rank - 2 || (x.axis == rank - 1 && x.step % 16 == 0 && x.step < cols);
    if (!splits || !constant_source(g, p.inputs[1]) || it->first < plan->routing.node) it = plan->products.erase(it);
    else ++it;
  }
  return !plan->products.empty() && selects(g, plan->routing);
}

}  // namespace

RoutedGraph route_experts(const Graph& g) {
  std::vector<std::vector<int32_t>> readers(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    for (Value v : g.nodes()[i].inputs) readers[static_cast<size_t>(v.node)].push_back(static_cast<int32_t>(i));
  }
  std::vector<bool> is_output(g.size(), false);
  for (Value v : g.outputs) is_output[static_cast<size_t>(v.node)] = true;
  for (const StateBinding& s : g.states) {
    if (s.output >= 0) is_output[static_cast<size_t>(g.outputs[static_cast<size_t>(s.output)].node)] = true;
  }
  std::vector<Plan> plans;
  for (size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    const int32_t id = static_cast<int32_t>(i);
    if (n.op == Op::kMatMul) {
      // C = A @ B contracting e: H = A (e along its columns) and R = B (its rows), or the reverse.
      const int64_t r = n.type().rank();
      for (int side = 0; side < 2; ++side) {
        Plan p;
        if (plan_for(g, id, side, side == 0 ? r - 1 : r - 2, side == 0 ? r - 2 : r - 1, readers, is_output, &p)) {
          plans.push_back(std::move(p));
          break;
        }
      }
    } else if (n.op == Op::kMap && n.attrs.ew == EwOp::k_mul) {
      // sum_e H * R written as a Map.mul summed by a Reduce over the axis e (read through
      // Casts: a half-precision model rounds the product before summing it).
      std::vector<int32_t> sums;
      for (std::vector<int32_t> next = readers[i]; !next.empty();) {
        const int32_t rd = next.back();
        next.pop_back();
        const Node& rn = g.node(rd);
        const std::vector<int32_t>& after = readers[static_cast<size_t>(rd)];
        if (rn.op == Op::kCast && is_float(rn.type().dtype)) next.insert(next.end(), after.begin(), after.end());
        else if (rn.op == Op::kReduce && rn.attrs.reduce == ReduceKind::kSum) sums.push_back(rd);
      }
      bool found = false;
      for (int32_t rd : sums) {
        const Node& red = g.node(rd);
        for (int64_t ax : red.attrs.ints) {
          for (int side = 0; side < 2 && !found; ++side) {
            Plan p;
            if (plan_for(g, id, side, ax, ax, readers, is_output, &p)) {
              plans.push_back(std::move(p));
              found = true;
            }
          }
        }
        if (found) break;
      }
    }
  }
  RoutedGraph out;
  if (plans.empty()) {
    out.graph = g;
    return out;
  }
  GraphRewriter rw(g);
  Graph& d = rw.out();
  for (size_t i = 0; i < g.size(); ++i) {
    const int32_t id = static_cast<int32_t>(i);
    const Node& n = g.nodes()[i];
    Plan* contraction = nullptr;
    for (Plan& p : plans) {
      if (p.contraction == id) contraction = &p;
    }
    if (contraction) {
      // H' = where(mask[e] != 0, H, 0), then the contraction reads H'.
      const Plan& p = *contraction;
      d.set_origin(n.name, n.source);
      const Value h = rw.map(n.inputs[static_cast<size_t>(p.side)]);
      const TensorType th = d.type(h);
      Attrs ra;
      ra.ints = Shape(th.shape.size(), 1);
      ra.ints[static_cast<size_t>(p.h_axis)] = p.experts;
      Attrs ea;
      ea.ints = th.shape;
      const Value m = d.add(Op::kExpand, {d.add(Op::kReshape, {p.mask}, ra)}, ea);
      const Value on = d.map(EwOp::k_ne, {m, d.full(Scalar::of_float(0.0), TensorType{DType::kF32, th.shape})});
      const Value hm = d.map(EwOp::k_where, {on, h, d.full(Scalar::of_float(0.0), th)});
      const Value r = rw.map(n.inputs[static_cast<size_t>(1 - p.side)]);
      const Value c = d.add(n.op, p.side == 0 ? std::vector<Value>{hm, r} : std::vector<Value>{r, hm}, n.attrs);
      rw.replace(id, {c});
    } else {
      rw.copy(id);
    }
    for (Plan& p : plans) {
      if (p.routing.node == id) {
        // mask[e] = max over R's other axes of (R != 0), as float32 [E].
        d.set_origin(n.name, n.source);
        const Value r = rw.map(p.routing);
        const TensorType tr = d.type(r);
        const Value r32 = d.cast(r, DType::kF32);  // exact; bfloat16 and float16 have no != of their own
        const Value nz = d.map(EwOp::k_ne, {r32, d.full(Scalar::of_float(0.0), TensorType{DType::kF32, tr.shape})});
        Attrs a;
        a.reduce = ReduceKind::kMax;
        for (int64_t ax = 0; ax < tr.rank(); ++ax) {
          if (ax != p.routing_axis) a.ints.push_back(ax);
        }
        p.mask = d.add(Op::kReduce, {d.cast(nz, DType::kF32)}, a);
      }
      if (auto it = p.products.find(id); it != p.products.end()) {
        out.products[rw.map(Value{id, 0}).node] = RoutedProduct{p.mask, it->second.axis, it->second.step, p.experts};
      }
    }
  }
  out.graph = rw.finish();
  return out;
}

}  // namespace chroma
