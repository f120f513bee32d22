#include "passes/cse.h"

#include <bit>
#include <cstdint>
#include <vector>

#include <map>
#include <tuple>

#include "passes/rewrite.h"

namespace chroma {
namespace {

// Key of a node for equality: op, inputs and a canonical attribute encoding.
struct Key {
  Op op;
  std::vector<Value> inputs;
  Attrs attrs;
  bool operator<(const Key& o) const {
    if (op != o.op) return op < o.op;
    if (inputs != o.inputs) return inputs < o.inputs;
    return attrs_less(attrs, o.attrs);
  }
  // Doubles are compared by bit pattern: NaN would break the strict weak order std::map
  // needs (every comparison with NaN is false, so Full(NaN) "equalled" Full(2.0) and a mean's
  // divisor became NaN), and -0.0 is a different constant from 0.0.
  static uint64_t bits(double d) { return std::bit_cast<uint64_t>(d); }
  static bool attrs_less(const Attrs& a, const Attrs& b) {
    auto t = [](const Attrs& x) {
      std::vector<uint64_t> coeffs;
      for (double c : x.coeffs) coeffs.push_back(bits(c));
      return std::make_tuple(x.ew, x.reduce, x.dtype, x.ints, coeffs, x.scalar.is_int, x.scalar.i, bits(x.scalar.f), x.axis,
                             x.start, x.end, x.step, x.k, x.index, x.keepdim, x.largest, x.sorted, x.log, x.accumulate);
    };
    return t(a) < t(b);
  }
};

}  // namespace

Graph eliminate_common_subexpressions(const Graph& g) {
  GraphRewriter rw(g);
  std::map<Key, int32_t> seen;                 // key in the new graph -> new node id
  std::map<std::string, std::vector<int32_t>> constants_by_size;  // cheap bucket before byte compare
  for (size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    const auto id = static_cast<int32_t>(i);
    if (n.op == Op::kInput) {
      rw.copy(id);
      continue;
    }
    if (n.op == Op::kConstant) {
      const ConstantData& c = g.constants[static_cast<size_t>(n.attrs.index)];
      const std::string bucket = c.type.str();
      bool merged = false;
      for (int32_t other : constants_by_size[bucket]) {
        const ConstantData& oc = rw.out().constants[static_cast<size_t>(rw.out().node(other).attrs.index)];
        if (oc.bytes == c.bytes || *oc.bytes == *c.bytes) {
          rw.replace(id, {Value{other, 0}});
          merged = true;
          break;
        }
      }
      if (!merged) {
        rw.copy(id);
        constants_by_size[bucket].push_back(rw.map(Value{id, 0}).node);
      }
      continue;
    }
    Key k{n.op, rw.map(n.inputs), n.attrs};
    auto it = seen.find(k);
    if (it != seen.end()) {
      std::vector<Value> outs;
      for (size_t o = 0; o < n.types.size(); ++o) outs.push_back(Value{it->second, static_cast<int32_t>(o)});
      rw.replace(id, outs);
      continue;
    }
    rw.copy(id);
    seen.emplace(std::move(k), rw.map(Value{id, 0}).node);
  }
  return rw.finish();
}

}  // namespace chroma
