#include "passes/narrow_float64.h"

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "passes/dce.h"
#include "passes/rewrite.h"

namespace chroma {
namespace {

// Node `id`'s readers, each (reader, input index); a graph output reads as (-1, 0).
std::vector<std::vector<std::pair<int32_t, size_t>>> readers_of(const Graph& g) {
  std::vector<std::vector<std::pair<int32_t, size_t>>> r(g.size());
  for (size_t u = 0; u < g.size(); ++u) {
    const Node& n = g.node(static_cast<int32_t>(u));
    for (size_t k = 0; k < n.inputs.size(); ++k) r[static_cast<size_t>(n.inputs[k].node)].push_back({static_cast<int32_t>(u), k});
  }
  for (Value v : g.outputs) r[static_cast<size_t>(v.node)].push_back({-1, 0});
  return r;
}

// The Casts to float32 that end every chain of views from constant `id`, or nothing when
// some reader is anything else (an operation computing in float64, a graph output).
bool only_float32_casts(const Graph& g, const std::vector<std::vector<std::pair<int32_t, size_t>>>& readers, int32_t id,
                        std::vector<int32_t>* casts) {
  std::vector<int32_t> todo = {id};
  bool any = false;
  while (!todo.empty()) {
    const int32_t x = todo.back();
    todo.pop_back();
    for (const auto& [u, k] : readers[static_cast<size_t>(x)]) {
      if (u < 0) return false;
      const Node& n = g.node(u);
      if (is_view(n.op) && k == 0) {
        todo.push_back(u);
      } else if (n.op == Op::kCast && n.type().dtype == DType::kF32) {
        casts->push_back(u);
        any = true;
      } else {
        return false;
      }
    }
  }
  return any;
}

ConstantData to_float32(const ConstantData& c) {
  const int64_t n = c.type.numel();
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * 4);
  for (int64_t i = 0; i < n; ++i) {
    double d;
    std::memcpy(&d, c.data() + 8 * i, 8);
    const auto f = static_cast<float>(d);  // round to nearest, as the Cast does
    std::memcpy(bytes.data() + 4 * i, &f, 4);
  }
  ConstantData r;
  r.type = TensorType{DType::kF32, c.type.shape};
  r.name = c.name;
  r.bytes = make_blob(std::move(bytes));
  return r;
}

}  // namespace

Graph narrow_float64_constants(const Graph& g) {
  const auto readers = readers_of(g);
  std::vector<bool> narrow(g.size(), false), identity(g.size(), false);
  bool any = false;
  for (size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.node(static_cast<int32_t>(i));
    if (n.op != Op::kConstant || n.type().dtype != DType::kF64) continue;
    std::vector<int32_t> casts;
    if (!only_float32_casts(g, readers, static_cast<int32_t>(i), &casts)) continue;
    narrow[i] = any = true;
    for (int32_t c : casts) identity[static_cast<size_t>(c)] = true;
  }
  if (!any) return g;
  GraphRewriter rw(g);
  for (int32_t id = 0; id < static_cast<int32_t>(g.size()); ++id) {
    const Node& n = g.node(id);
    if (narrow[static_cast<size_t>(id)]) {
      rw.out().set_origin(n.name, n.source);
      rw.replace(id, {rw.out().constant(to_float32(g.constants.at(static_cast<size_t>(n.attrs.index))))});
    } else if (identity[static_cast<size_t>(id)]) {
      rw.replace(id, {rw.map(n.inputs[0])});  // its input is float32 now: the Cast is the identity
    } else {
      rw.copy(id);  // the views between them take their input's float32 type
    }
  }
  return eliminate_dead_code(rw.finish());
}

}  // namespace chroma
