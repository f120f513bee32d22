// The CPU generator's expression-template kernels (emitter.h): assign, concat, reductions,
// softmax, scans, arg-reductions and top-k, each one call into chroma/cpu/et.h over the
// expressions the core prints; elementwise kernels and reductions first put their iteration
// space in their operands' memory order.
#include "codegen/cpu/emitter.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace chroma::cpu_codegen {
namespace {

// The stride lists of an expression's leaves (loads and iotas), for reshaping its iteration
// space.
void leaf_strides(Expr& e, std::vector<std::vector<int64_t>*>* is, std::vector<std::vector<double>*>* ds) {
  if (e.kind == Expr::kLoad) is->push_back(&e.layout.strides);
  if (e.kind == Expr::kIota) ds->push_back(&e.affine.strides);
  for (Expr& c : e.children) leaf_strides(c, is, ds);
}

// An elementwise kernel's iteration space as its loops want it: the dimensions in the
// destination's memory order (a channels-last destination is written in one contiguous pass,
// not with a stride of C per element), extent-1 dimensions dropped (a permute ending in
// [.., 32, 1, 1] ran rows of one element), and a last dimension shorter than 256 merged with
// the one before it while every operand (loads, iotas, the destination) is contiguous across
// the two. The same elements, each written once; rows stay many enough to split over threads.
Kernel simplified_assign(const Kernel& k) {
  Kernel s = k;
  std::vector<std::vector<int64_t>*> is;
  std::vector<std::vector<double>*> ds;
  leaf_strides(s.inputs[0], &is, &ds);
  is.push_back(&s.out_layouts[0].strides);
  for (const auto* v : is) if (v->size() != s.shape.size()) return k;
  for (const auto* v : ds) if (v->size() != s.shape.size()) return k;
  {
    const std::vector<int64_t>& os = s.out_layouts[0].strides;
    std::vector<size_t> order(os.size());
    for (size_t d = 0; d < order.size(); ++d) order[d] = d;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return std::llabs(os[a]) > std::llabs(os[b]); });
    auto permute = [&](auto& v) {
      auto old = v;
      for (size_t d = 0; d < order.size(); ++d) v[d] = old[order[d]];
    };
    for (auto* v : is) permute(*v);
    for (auto* v : ds) permute(*v);
    permute(s.shape);
  }
  auto erase = [&](size_t d) {
    for (auto* v : is) v->erase(v->begin() + static_cast<std::ptrdiff_t>(d));
    for (auto* v : ds) v->erase(v->begin() + static_cast<std::ptrdiff_t>(d));
    s.shape.erase(s.shape.begin() + static_cast<std::ptrdiff_t>(d));
  };
  for (size_t d = s.shape.size(); d-- > 0;) {
    if (s.shape.size() > 1 && s.shape[d] == 1) erase(d);
  }
  while (s.shape.size() >= 2 && s.shape.back() < 256) {
    const size_t d = s.shape.size() - 2;
    const int64_t n = s.shape[d + 1];
    bool ok = true;
    for (const auto* v : is) ok = ok && (*v)[d] == (*v)[d + 1] * n;
    for (const auto* v : ds) ok = ok && (*v)[d] == (*v)[d + 1] * static_cast<double>(n);
    if (!ok) break;
    for (auto* v : is) (*v)[d] = (*v)[d + 1];
    for (auto* v : ds) (*v)[d] = (*v)[d + 1];
    s.shape[d + 1] *= s.shape[d];
    erase(d);
  }
  s.out_layouts[0].shape = s.shape;
  return s;
}
// A reduction's iteration space in its input's memory order: the dimensions sorted by the
// strides of the operand read over the most of the space (the first of those broadcast along
// the fewest dimensions: a bias added before the reduction, read with stride 0 along the
// tokens, must not put the tokens innermost, where the activation's stride is a whole row:
// q's RMS norm in a transformer's attention ran 27 ms a call that way, on one thread). A
// channels-last activation's spatial mean then reads memory in one pass, the channels
// innermost, instead of with a stride of C per element. `mask` (the reduced dimensions) is
// permuted with them. A kernel whose operands are already in order is returned as it is.
Kernel in_memory_order(const Kernel& k, std::vector<bool>* mask) {
  Kernel s = k;
  std::vector<std::vector<int64_t>*> is;
  std::vector<std::vector<double>*> ds;
  leaf_strides(s.inputs[0], &is, &ds);
  const size_t r = s.shape.size();
  if (r < 2 || mask->size() != r || s.out_layouts[0].strides.size() != r) return k;
  for (const auto* v : is) if (v->size() != r) return k;
  for (const auto* v : ds) if (v->size() != r) return k;
  if (is.empty()) return k;
  auto broadcast_dims = [&](const std::vector<int64_t>& st) {
    int n = 0;
    for (size_t d = 0; d < r; ++d) n += k.shape[d] > 1 && st[d] == 0;
    return n;
  };
  const std::vector<int64_t>* best = is.front();
  for (const auto* v : is) if (broadcast_dims(*v) < broadcast_dims(*best)) best = v;
  const std::vector<int64_t> ref = *best;
  std::vector<size_t> order(r);
  for (size_t d = 0; d < r; ++d) order[d] = d;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int64_t sa = k.shape[a] == 1 ? INT64_MAX : std::llabs(ref[a]), sb = k.shape[b] == 1 ? INT64_MAX : std::llabs(ref[b]);
    return sa > sb;
  });
  bool in_order = true;  // the dims of extent > 1 already by non-increasing stride
  int64_t prev = INT64_MAX;
  for (size_t d = 0; d < r; ++d) {
    if (k.shape[d] == 1) continue;
    in_order = in_order && std::llabs(ref[d]) <= prev;
    prev = std::llabs(ref[d]);
  }
  if (in_order) return k;
  auto permute = [&](auto& v) {
    auto old = v;
    for (size_t d = 0; d < r; ++d) v[d] = old[order[d]];
  };
  is.push_back(&s.out_layouts[0].strides);
  for (auto* v : is) permute(*v);
  for (auto* v : ds) permute(*v);
  permute(s.shape);
  permute(*mask);
  s.out_layouts[0].shape = s.shape;
  return s;
}

}  // namespace

std::string Emitter::assign(const Kernel& k) const {
  const Kernel s = simplified_assign(k);
  std::ostringstream o;
  o << "  et::assign<" << shape_t(s.shape) << ">(cx.pool, " << out(s.outputs[0], s.out_layouts[0]) << ",\n      "
    << expr(s.inputs[0]) << ");\n";
  return o.str();
}

// Each non-empty part an assign of its own.
std::string Emitter::concat(const Kernel& k) const {
  std::string o;
  for (size_t i = 0; i < k.inputs.size(); ++i) {
    if (numel(k.out_layouts[i].shape) == 0) continue;
    Kernel part;
    part.kind = Kernel::kAssign;
    part.shape = k.out_layouts[i].shape;
    part.inputs = {k.inputs[i]};
    part.outputs = {k.outputs[i]};
    part.out_layouts = {k.out_layouts[i]};
    o += assign(part);
  }
  return o;
}

std::string Emitter::reduce(const Kernel& k) const {
  static const char* kOps[] = {"et::Sum", "et::Prod", "et::Max", "et::Min"};
  std::vector<bool> mask(norm_shape(k.shape).size(), false);
  for (int64_t a : k.attrs.ints) mask[static_cast<size_t>(a)] = true;
  const Kernel s = in_memory_order(k, &mask);
  std::string m;
  for (size_t i = 0; i < mask.size(); ++i) m += std::string(i ? ", " : "") + (mask[i] ? "true" : "false");
  const Buffer& b = p_->buffers[static_cast<size_t>(k.outputs[0])];
  std::ostringstream o;
  o << "  et::reduce<" << shape_t(s.shape) << ", et::Mask<" << m << ">, " << kOps[static_cast<int>(k.attrs.reduce)]
    << ", " << ctype(b.type.dtype) << ">(cx.pool, " << out(s.outputs[0], s.out_layouts[0]) << ",\n      " << expr(s.inputs[0])
    << ");\n";
  return o.str();
}

std::string Emitter::softmax(const Kernel& k) const {
  const Buffer& b = p_->buffers[static_cast<size_t>(k.outputs[0])];
  std::ostringstream o;
  o << "  et::softmax<" << shape_t(k.shape) << ", " << k.attrs.axis << ", " << (k.attrs.log ? "true" : "false") << ", "
    << ctype(b.type.dtype) << ">(cx.pool, " << out(k.outputs[0], k.out_layouts[0]) << ",\n      " << expr(k.inputs[0]) << ");\n";
  return o.str();
}

// An empty scan has no body.
std::string Emitter::scan(const Kernel& k) const {
  const Buffer& b = p_->buffers[static_cast<size_t>(k.outputs[0])];
  if (numel(k.shape) == 0) return "";
  std::ostringstream o;
  o << "  et::scan<" << shape_t(k.shape) << ", " << k.attrs.axis << ", "
    << (k.attrs.log ? 4 : static_cast<int>(k.attrs.reduce)) << ", " << ctype(b.type.dtype) << ">("
    << out(k.outputs[0], k.out_layouts[0]) << ",\n      " << expr(k.inputs[0]) << ");\n";
  return o.str();
}

std::string Emitter::arg_reduce(const Kernel& k) const {
  std::ostringstream o;
  o << "  et::arg_reduce<" << shape_t(k.shape) << ", " << k.attrs.axis << ", "
    << (k.attrs.reduce == ReduceKind::kMax ? "true" : "false") << ">(" << out(k.outputs[0], k.out_layouts[0])
    << ",\n      " << expr(k.inputs[0]) << ");\n";
  return o.str();
}

std::string Emitter::topk(const Kernel& k) const {
  const Buffer& b = p_->buffers[static_cast<size_t>(k.outputs[0])];
  std::ostringstream o;
  o << "  et::topk<" << shape_t(k.shape) << ", " << k.attrs.axis << ", " << k.attrs.k << ", "
    << (k.attrs.largest ? "true" : "false") << ", " << ctype(b.type.dtype) << ">("
    << out(k.outputs[0], k.out_layouts[0]) << ", " << out(k.outputs[1], k.out_layouts[1]) << ",\n      "
    << expr(k.inputs[0]) << ");\n";
  return o.str();
}

}  // namespace chroma::cpu_codegen
