#include "passes/widen_half.h"

#include <map>

#include "passes/rewrite.h"

namespace chroma {

namespace {

bool touches_half(const Graph& g, const Node& n) {
  for (Value v : n.inputs) {
    if (is_half(g.type(v).dtype)) return true;
  }
  for (const TensorType& t : n.types) {
    if (is_half(t.dtype)) return true;
  }
  return (n.op == Op::kCast || n.op == Op::kFull || n.op == Op::kIota) && is_half(n.attrs.dtype);
}

// The Full node v is (seen through views: an expanded scalar), or -1.
int32_t source_of_full(const Graph& g, Value v) {
  int32_t id = v.node;
  while (is_view(g.node(id).op)) id = g.node(id).inputs[0].node;
  return g.node(id).op == Op::kFull ? id : -1;
}

}  // namespace

Graph widen_half(const Graph& g) {
  GraphRewriter rw(g);
  Graph& d = rw.out();
  std::map<Value, Value> wide;     // half value -> its float32 value, not rounded
  std::map<Value, Value> rounded;  // half value -> its float32 value after rounding to its type
  // Half values whose float32 value holds their type's values already: inputs, constants, and
  // what views, gathers and concatenations (which move values, never change them) make of
  // values read rounded or exact. Reading one needs no rounding: a weight's transpose, the
  // experts a router picked from a stack, an activation's reshape between two operations add
  // no float32 -> half -> float32 round trip.
  std::map<Value, bool> exact;
  auto is_exact = [&](Value v) {
    const Op op = g.node(v).op;
    return op == Op::kInput || op == Op::kConstant || exact.count(v) > 0;
  };
  // The float32 value a consumer in ATen operation `name` reads for half value v.
  auto read = [&](Value v, const std::string& name) -> Value {
    const Node& p = g.node(v);
    const Value w = wide.at(v);
    if (is_exact(v)) return w;  // exact already
    if (!name.empty() && p.name == name) return w;  // inside one ATen operation: not rounded
    auto it = rounded.find(v);
    if (it == rounded.end()) it = rounded.emplace(v, d.cast(rw.map(v), DType::kF32)).first;
    return it->second;
  };
  for (size_t i = 0; i < g.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    const Node& n = g.node(id);
    if (!touches_half(g, n)) {
      rw.copy(id);
      continue;
    }
    if (n.op == Op::kInput || n.op == Op::kConstant) {
      rw.copy(id);
      d.set_origin(n.name, n.source);
      wide[Value{id, 0}] = d.cast(rw.map(Value{id, 0}), DType::kF32);
      continue;
    }
    d.set_origin(n.name, n.source);
    std::vector<Value> ins;
    for (Value v : n.inputs) ins.push_back(is_half(g.type(v).dtype) ? read(v, n.name) : rw.map(v));
    // An operation that only moves values (a view, a gather, a concatenation) of half values
    // read exact (or rounded: another operation's result) makes exact values.
    bool exact_copy = false;
    if (is_view(n.op) || n.op == Op::kGather || n.op == Op::kGatherElements || n.op == Op::kConcat) {
      const size_t data = n.op == Op::kConcat ? n.inputs.size() : 1;  // the others: input 0 holds the values
      exact_copy = data > 0;
      for (size_t k = 0; k < data && k < n.inputs.size(); ++k) {
        const Value in = n.inputs[k];
        exact_copy = exact_copy && is_half(g.type(in).dtype) && g.type(in).dtype == n.types[0].dtype &&
                     (is_exact(in) || g.node(in).name != n.name || n.name.empty());
      }
    }
    // An operation that picks one of its operands' values (relu, maximum, minimum, abs, neg,
    // where) makes a value of the type when every value it picks from is one: an exact value,
    // one read rounded (another ATen operation's result), or a scalar the type represents.
    // Its rounding would change nothing, so its readers read it as it is (a bfloat16 model's
    // relu6 after a batch norm: one rounding fewer per element in the convolution's epilogue).
    if (n.op == Op::kMap && n.types.size() == 1 && is_half(n.types[0].dtype) && !exact_copy) {
      const EwOp ew = n.attrs.ew;
      bool all = ew_picks_operand(ew);
      for (size_t k = ew == EwOp::k_where ? 1 : 0; all && k < n.inputs.size(); ++k) {
        const Value in = n.inputs[k];
        const int32_t full = source_of_full(g, in);
        all = g.type(in).dtype == n.types[0].dtype &&
              (is_exact(in) || g.node(in).name != n.name || n.name.empty() ||
               (full >= 0 && half_value(g.node(full).attrs.scalar.as_double(), n.types[0].dtype)));
      }
      exact_copy = all;
    }
    Attrs a = n.attrs;
    if ((n.op == Op::kCast || n.op == Op::kFull || n.op == Op::kIota) && is_half(a.dtype)) a.dtype = DType::kF32;
    std::vector<Value> outs;
    if (n.op == Op::kCast && d.type(ins[0]).dtype == a.dtype) {
      outs.push_back(ins[0]);  // half <-> float32, or float16 <-> bfloat16: float32 already
    } else {
      const Value nv = d.add(n.op, ins, a);
      for (size_t k = 0; k < n.types.size(); ++k) outs.push_back(Value{nv.node, static_cast<int32_t>(k)});
    }
    // Each half output: its float32 value, and the value rounded to its type (what the graph's
    // outputs and the rounding reads see).
    for (size_t k = 0; k < n.types.size(); ++k) {
      if (!is_half(n.types[k].dtype)) continue;
      const Value old{id, static_cast<int32_t>(k)};
      wide[old] = outs[k];
      if (exact_copy) exact[old] = true;
      outs[k] = d.cast(outs[k], n.types[k].dtype);
    }
    rw.replace(id, outs);
  }
  return rw.finish();
}

}  // namespace chroma
