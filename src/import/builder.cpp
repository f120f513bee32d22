#include "import/builder.h"

#include <algorithm>
#include <numeric>

namespace chroma {
namespace {

[[noreturn]] void fail(const std::string& m) { throw CompileError(m); }

// Type categories for promotion: bool < integer < floating.
int category(DType t) { return t == DType::kBool ? 0 : (is_float(t) ? 2 : 1); }

DType promote_pair(DType a, DType b) {
  if (a == b) return a;
  if (category(a) != category(b)) return category(a) > category(b) ? a : b;
  if (category(a) == 2) return (a == DType::kF64 || b == DType::kF64) ? DType::kF64 : DType::kF32;
  // Integers: the wider one; uint8 with a signed type of the same or smaller width -> wider signed.
  auto rank_of = [](DType t) {
    switch (t) {
      case DType::kI8: return 1; case DType::kU8: return 2; case DType::kI16: return 3;
      case DType::kI32: return 4; default: return 5;
    }
  };
  if ((a == DType::kU8 && b == DType::kI8) || (a == DType::kI8 && b == DType::kU8)) return DType::kI16;
  return rank_of(a) > rank_of(b) ? a : b;
}

}  // namespace

int64_t Builder::dim(int64_t d, int64_t rank) const {
  const int64_t r = std::max<int64_t>(rank, 1);
  if (d < -r || d >= r) fail("dimension " + std::to_string(d) + " out of range for rank " + std::to_string(rank));
  return d < 0 ? d + r : d;
}

Value Builder::reshape(Value v, const Shape& shape) {
  if (type(v).shape == shape) return v;
  Attrs a;
  a.ints = shape;
  return g_.add(Op::kReshape, {v}, a);
}

Value Builder::permute(Value v, const std::vector<int64_t>& perm) {
  std::vector<int64_t> p;
  for (int64_t d : perm) p.push_back(dim(d, type(v).rank()));
  bool identity = true;
  for (size_t i = 0; i < p.size(); ++i) identity = identity && p[i] == static_cast<int64_t>(i);
  if (identity && p.size() == static_cast<size_t>(type(v).rank())) return v;
  Attrs a;
  a.ints = p;
  return g_.add(Op::kPermute, {v}, a);
}

Value Builder::transpose(Value v, int64_t d0, int64_t d1) {
  const int64_t r = type(v).rank();
  if (r < 2) return v;
  std::vector<int64_t> p(static_cast<size_t>(r));
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[static_cast<size_t>(dim(d0, r))], p[static_cast<size_t>(dim(d1, r))]);
  return permute(v, p);
}

Value Builder::expand(Value v, const Shape& shape) {
  Shape cur = type(v).shape;
  if (cur.size() > shape.size()) fail("cannot expand " + type(v).str() + " to " + shape_str(shape));
  if (cur.size() < shape.size()) {
    Shape padded(shape.size() - cur.size(), 1);
    padded.insert(padded.end(), cur.begin(), cur.end());
    v = reshape(v, padded);
    cur = padded;
  }
  Shape target = shape;
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] == -1) target[i] = cur[i];
  }
  if (cur == target) return v;
  Attrs a;
  a.ints = target;
  return g_.add(Op::kExpand, {v}, a);
}

Value Builder::slice(Value v, int64_t axis, int64_t start, int64_t end, int64_t step) {
  const TensorType& t = type(v);
  axis = dim(axis, t.rank());
  const int64_t n = t.shape[static_cast<size_t>(axis)];
  if (step <= 0) fail("slice step must be positive, got " + std::to_string(step));
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  if (start == 0 && end == n && step == 1) return v;
  Attrs a;
  a.axis = axis;
  a.start = start;
  a.end = end;
  a.step = step;
  return g_.add(Op::kSlice, {v}, a);
}

Value Builder::select(Value v, int64_t axis, int64_t index) {
  const TensorType& t = type(v);
  axis = dim(axis, t.rank());
  const int64_t n = t.shape[static_cast<size_t>(axis)];
  if (index < -n || index >= n) fail("index " + std::to_string(index) + " out of range for dimension of size " + std::to_string(n));
  if (index < 0) index += n;
  Value s = slice(v, axis, index, index + 1, 1);
  Shape out = t.shape;
  out.erase(out.begin() + axis);
  return reshape(s, out);
}

Value Builder::unsqueeze(Value v, int64_t axis) {
  Shape s = type(v).shape;
  axis = dim(axis, static_cast<int64_t>(s.size()) + 1);
  s.insert(s.begin() + axis, 1);
  return reshape(v, s);
}

Value Builder::full(Scalar s, DType t, const Shape& shape) { return g_.full(s, TensorType{t, shape}); }


DType Builder::promote(const std::vector<Operand>& ops) const {
  std::optional<DType> dim_t, zero_t;
  int scalar_cat = -1;
  for (const Operand& o : ops) {
    if (o.tensor.valid()) {
      const TensorType& t = type(o.tensor);
      auto& slot = t.rank() > 0 ? dim_t : zero_t;
      slot = slot ? promote_pair(*slot, t.dtype) : t.dtype;
    } else if (o.scalar) {
      scalar_cat = std::max(scalar_cat, o.scalar->is_int ? 1 : 2);
    }
  }
  std::optional<DType> r = dim_t;
  if (zero_t && (!r || category(*zero_t) > category(*r))) r = r ? promote_pair(*r, *zero_t) : *zero_t;
  if (!r || scalar_cat > category(*r)) {
    if (scalar_cat == 2) return DType::kF32;
    if (scalar_cat == 1) return r && category(*r) == 1 ? *r : DType::kI64;
  }
  return r ? *r : DType::kF32;
}

Shape Builder::broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n, 1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) fail("shapes " + shape_str(a) + " and " + shape_str(b) + " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Value Builder::ew(EwOp op, const std::vector<Operand>& ops, std::optional<DType> compute) {
  const EwInfo& info = ew_info(op);
  // where's condition takes no part in promotion.
  const size_t first = op == EwOp::k_where ? 1 : 0;
  std::vector<Operand> values(ops.begin() + static_cast<long>(first), ops.end());
  DType t = compute ? *compute : promote(values);
  if (info.result == EwResult::kFloat && !is_float(t)) t = DType::kF32;
  Shape shape;
  for (const Operand& o : ops) {
    if (o.tensor.valid()) shape = broadcast_shapes(shape, type(o.tensor).shape);
  }
  std::vector<Value> args;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Operand& o = ops[i];
    const DType want = i < first ? DType::kBool : t;
    Value v = o.tensor.valid() ? cast(o.tensor, want) : full(*o.scalar, want, shape);
    args.push_back(expand(v, shape));
  }
  return g_.map(op, args);
}

Value Builder::reduce(ReduceKind k, Value v, std::vector<int64_t> axes, bool keepdim) {
  const int64_t r = type(v).rank();
  if (axes.empty()) {
    for (int64_t d = 0; d < r; ++d) axes.push_back(d);
  }
  for (int64_t& a : axes) a = dim(a, r);
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  if (r == 0) return v;
  Attrs at;
  at.reduce = k;
  at.ints = axes;
  at.keepdim = keepdim;
  return g_.add(Op::kReduce, {v}, at);
}

// Elements each output of a reduction over `axes` (normalized, deduplicated) combines; a 0-d
// tensor reduces over nothing (dims 0 and -1 name the tensor itself): 1.
int64_t Builder::reduced_count(const TensorType& t, std::vector<int64_t> axes) const {
  if (t.rank() == 0) return 1;
  for (int64_t& a : axes) a = dim(a, t.rank());
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  int64_t n = 1;
  for (int64_t a : axes) n *= t.shape[static_cast<size_t>(a)];
  return n;
}

Value Builder::mean(Value v, std::vector<int64_t> axes, bool keepdim) {
  const TensorType t = type(v);
  if (axes.empty()) {
    for (int64_t d = 0; d < t.rank(); ++d) axes.push_back(d);
  }
  const int64_t n = reduced_count(t, axes);
  Value s = sum(v, axes, keepdim);
  return ew(EwOp::k_div, s, Scalar::of_float(static_cast<double>(n)));
}

Value Builder::var(Value v, std::vector<int64_t> axes, double correction, bool keepdim) {
  const TensorType t = type(v);
  if (axes.empty()) {
    for (int64_t d = 0; d < t.rank(); ++d) axes.push_back(d);
  }
  const int64_t n = reduced_count(t, axes);
  Value m = mean(v, axes, true);
  Value d = ew(EwOp::k_sub, v, m);
  Value sq = ew(EwOp::k_mul, d, d);
  Value s = sum(sq, axes, keepdim);
  const double denom = std::max(0.0, static_cast<double>(n) - correction);
  return ew(EwOp::k_div, s, Scalar::of_float(denom));
}

Value Builder::softmax(Value v, int64_t axis, bool log) {
  axis = dim(axis, type(v).rank());
  const TensorType t = type(v);
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(axis) + 1; d < t.shape.size(); ++d) inner *= t.shape[d];
  if (log && is_half(t.dtype) && inner == 1) {
    // PyTorch's CPU log_softmax over a half tensor's last dimension keeps the row's sum of
    // exponentials and its logarithm in the half type (each rounded), then computes
    // x - max - log(sum) in float32 and rounds once; over other dimensions it keeps them in
    // float32, which the one primitive below does.
    Value m = reduce(ReduceKind::kMax, v, {axis}, true);
    Value shifted = ew(EwOp::k_sub, v, m);
    Value s = round_half(sum(ew(EwOp::k_exp, shifted), {axis}, true));
    return ew(EwOp::k_sub, shifted, round_half(ew(EwOp::k_log, s)));
  }
  if (is_float(t.dtype)) {
    // One primitive: the kernel keeps each row in cache across its three passes.
    const Shape shape = type(v).shape;
    Attrs a;
    a.axis = axis;
    a.log = log;
    return reshape(g_.add(Op::kSoftmax, {reshape(v, shape.empty() ? Shape{1} : shape)}, a), shape);
  }
  Value m = reduce(ReduceKind::kMax, v, {axis}, true);
  Value shifted = ew(EwOp::k_sub, v, m);
  if (log) {
    Value s = sum(ew(EwOp::k_exp, shifted), {axis}, true);
    return ew(EwOp::k_sub, shifted, ew(EwOp::k_log, s));
  }
  Value e = ew(EwOp::k_exp, shifted);
  Value s = sum(e, {axis}, true);
  return ew(EwOp::k_div, e, s);
}

Value Builder::matmul(Value a, Value b) {
  const TensorType ta = type(a), tb = type(b);
  if (ta.rank() == 0 || tb.rank() == 0) fail("matmul operands must have at least one dimension");
  if (ta.dtype != tb.dtype) fail("matmul operand dtypes differ: " + ta.str() + " @ " + tb.str());
  const bool a1 = ta.rank() == 1, b1 = tb.rank() == 1;
  if (a1) a = reshape(a, {1, ta.shape[0]});
  if (b1) b = reshape(b, {tb.shape[0], 1});
  Shape sa = type(a).shape, sb = type(b).shape;
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  Shape batch = broadcast_shapes(ba, bb);
  Shape ea = batch, eb = batch;
  ea.insert(ea.end(), sa.end() - 2, sa.end());
  eb.insert(eb.end(), sb.end() - 2, sb.end());
  a = expand(a, ea);
  b = expand(b, eb);
  Value r = g_.add(Op::kMatMul, {a, b});
  Shape out = batch;
  if (!a1) out.push_back(sa[sa.size() - 2]);
  if (!b1) out.push_back(sb.back());
  return reshape(r, out);
}

}  // namespace chroma
