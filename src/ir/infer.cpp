// Shape and dtype rules for each IR primitive. Each rule checks its inputs and attributes
// and throws CompileError with a message naming what does not fit. Dispatch goes through a
// table generated from ops.def, so a new op without a rule does not compile.
#include <algorithm>
#include <array>

#include "chroma/linalg_kinds.h"
#include "ir/graph.h"

namespace chroma {
namespace {

using Types = std::vector<TensorType>;
using Inputs = std::vector<Value>;

[[noreturn]] void fail(const std::string& msg) { throw CompileError(msg); }

void expect_arity(const OpInfo& info, const Inputs& in) {
  if (info.arity >= 0 && static_cast<int>(in.size()) != info.arity) {
    fail("expects " + std::to_string(info.arity) + " inputs, got " + std::to_string(in.size()));
  }
}

Types infer_Input(const Graph&, const Inputs&, const Attrs& a) { return {TensorType{a.dtype, a.ints}}; }
Types infer_Constant(const Graph&, const Inputs&, const Attrs& a) { return {TensorType{a.dtype, a.ints}}; }
Types infer_Full(const Graph&, const Inputs&, const Attrs& a) { return {TensorType{a.dtype, a.ints}}; }

Types infer_Iota(const Graph&, const Inputs&, const Attrs& a) {
  if (a.coeffs.size() != a.ints.size()) fail("needs one coefficient per dimension");
  return {TensorType{a.dtype, a.ints}};
}

Types infer_Map(const Graph& g, const Inputs& in, const Attrs& a) {
  if (a.ew == EwOp::kCount) fail("has no elementwise operation");
  const EwInfo& ew = ew_info(a.ew);
  if (static_cast<int>(in.size()) != ew.arity) {
    fail(std::string(ew.name) + " expects " + std::to_string(ew.arity) + " operands, got " +
         std::to_string(in.size()));
  }
  // Operands carry the output shape (broadcasts are explicit Expand nodes) and, except
  // where's condition, one dtype (promotions are explicit Cast nodes).
  const size_t first_value = a.ew == EwOp::k_where ? 1 : 0;
  const TensorType& t0 = g.type(in[first_value]);
  for (size_t i = 0; i < in.size(); ++i) {
    const TensorType& t = g.type(in[i]);
    if (t.shape != t0.shape) fail(std::string(ew.name) + ": operand shapes differ: " + t0.str() + " vs " + t.str());
    if (i >= first_value && t.dtype != t0.dtype) {
      fail(std::string(ew.name) + ": operand dtypes differ: " + t0.str() + " vs " + t.str());
    }
  }
  if (a.ew == EwOp::k_where && g.type(in[0]).dtype != DType::kBool) fail("where: condition must be bool");
  if (ew.result == EwResult::kFloat && !is_float(t0.dtype)) {
    fail(std::string(ew.name) + " needs floating-point operands, got " + t0.str());
  }
  DType out = ew.result == EwResult::kBool ? DType::kBool : t0.dtype;
  return {TensorType{out, t0.shape}};
}

Types infer_Cast(const Graph& g, const Inputs& in, const Attrs& a) {
  return {TensorType{a.dtype, g.type(in[0]).shape}};
}

Types infer_Permute(const Graph& g, const Inputs& in, const Attrs& a) {
  const TensorType& t = g.type(in[0]);
  if (static_cast<int64_t>(a.ints.size()) != t.rank()) fail("permutation rank differs from input " + t.str());
  std::vector<bool> seen(a.ints.size(), false);
  Shape out;
  for (int64_t p : a.ints) {
    if (p < 0 || p >= t.rank() || seen[static_cast<size_t>(p)]) fail("invalid permutation " + shape_str(a.ints));
    seen[static_cast<size_t>(p)] = true;
    out.push_back(t.shape[static_cast<size_t>(p)]);
  }
  return {TensorType{t.dtype, out}};
}

Types infer_Expand(const Graph& g, const Inputs& in, const Attrs& a) {
  const TensorType& t = g.type(in[0]);
  if (static_cast<int64_t>(a.ints.size()) != t.rank()) fail("expand must keep the rank: " + t.str() + " to " + shape_str(a.ints));
  for (size_t i = 0; i < a.ints.size(); ++i) {
    if (t.shape[i] != a.ints[i] && t.shape[i] != 1) fail("cannot expand " + t.str() + " to " + shape_str(a.ints));
  }
  return {TensorType{t.dtype, a.ints}};
}

Types infer_Slice(const Graph& g, const Inputs& in, const Attrs& a) {
  const TensorType& t = g.type(in[0]);
  if (a.axis < 0 || a.axis >= t.rank()) fail("slice axis out of range for " + t.str());
  const int64_t dim = t.shape[static_cast<size_t>(a.axis)];
  if (a.step <= 0 || a.start < 0 || a.end < a.start || a.end > dim) {
    fail("invalid slice [" + std::to_string(a.start) + ":" + std::to_string(a.end) + ":" +
         std::to_string(a.step) + "] of a dimension of size " + std::to_string(dim));
  }
  Shape out = t.shape;
  out[static_cast<size_t>(a.axis)] = (a.end - a.start + a.step - 1) / a.step;
  return {TensorType{t.dtype, out}};
}

Types infer_Reshape(const Graph& g, const Inputs& in, const Attrs& a) {
  const TensorType& t = g.type(in[0]);
  if (numel(a.ints) != t.numel()) fail("cannot reshape " + t.str() + " to " + shape_str(a.ints));
  return {TensorType{t.dtype, a.ints}};
}

Types infer_Flip(const Graph& g, const Inputs& in, const Attrs& a) {
  const TensorType& t = g.type(in[0]);
  for (int64_t ax : a.ints) {
    if (ax < 0 || ax >= t.rank()) fail("flip axis " + std::to_string(ax) + " out of range for " + t.str());
  }
  return {t};
}

Types infer_Reduce(const Graph& g, const Inputs& in, const Attrs& a) {
  const TensorType& t = g.type(in[0]);
  Shape out;
  for (int64_t d = 0; d < t.rank(); ++d) {
    bool reduced = std::find(a.ints.begin(), a.ints.end(), d) != a.ints.end();
    if (!reduced) out.push_back(t.shape[static_cast<size_t>(d)]);
    else if (a.keepdim) out.push_back(1);
  }
  for (int64_t ax : a.ints) {
    if (ax < 0 || ax >= t.rank()) fail("reduction axis " + std::to_string(ax) + " out of range for " + t.str());
  }
  return {TensorType{t.dtype, out}};
}

Types infer_Softmax(const Graph& g, const Inputs& in, const Attrs& a) {
  const TensorType& t = g.type(in[0]);
  if (!is_float(t.dtype)) fail("softmax needs a floating-point input, got " + t.str());
  if (a.axis < 0 || a.axis >= std::max<int64_t>(t.rank(), 1)) fail("axis out of range for " + t.str());
  return {t};
}

Types infer_ArgReduce(const Graph& g, const Inputs& in, const Attrs& a) {
  const TensorType& t = g.type(in[0]);
  if (a.axis < 0 || a.axis >= t.rank()) fail("axis out of range for " + t.str());
  if (t.shape[static_cast<size_t>(a.axis)] == 0) fail("cannot take argmax/argmin of an empty dimension");
  Shape out;
  for (int64_t d = 0; d < t.rank(); ++d) {
    if (d != a.axis) out.push_back(t.shape[static_cast<size_t>(d)]);
    else if (a.keepdim) out.push_back(1);
  }
  return {TensorType{DType::kI64, out}};
}

Types infer_MatMul(const Graph& g, const Inputs& in, const Attrs&) {
  const TensorType& x = g.type(in[0]);
  const TensorType& y = g.type(in[1]);
  if (x.rank() < 2 || x.rank() != y.rank()) fail("operands must have equal rank >= 2: " + x.str() + " @ " + y.str());
  if (x.dtype != y.dtype) fail("operand dtypes differ: " + x.str() + " @ " + y.str());
  const size_t r = static_cast<size_t>(x.rank());
  if (x.shape[r - 1] != y.shape[r - 2]) fail("inner dimensions differ: " + x.str() + " @ " + y.str());
  Shape out(x.shape.begin(), x.shape.end() - 2);
  for (size_t i = 0; i + 2 < r; ++i) {
    if (x.shape[i] != y.shape[i]) fail("batch dimensions differ: " + x.str() + " @ " + y.str());
  }
  out.push_back(x.shape[r - 2]);
  out.push_back(y.shape[r - 1]);
  return {TensorType{x.dtype, out}};
}

Types infer_Gather(const Graph& g, const Inputs& in, const Attrs& a) {
  const TensorType& src = g.type(in[0]);
  const TensorType& idx = g.type(in[1]);
  if (idx.dtype != DType::kI64) fail("indices must be int64, got " + idx.str());
  if (a.axis < 0 || a.axis >= src.rank()) fail("axis out of range for " + src.str());
  Shape out(src.shape.begin(), src.shape.begin() + a.axis);
  out.insert(out.end(), idx.shape.begin(), idx.shape.end());
  out.insert(out.end(), src.shape.begin() + a.axis + 1, src.shape.end());
  return {TensorType{src.dtype, out}};
}

Types infer_GatherElements(const Graph& g, const Inputs& in, const Attrs& a) {
  const TensorType& src = g.type(in[0]);
  const TensorType& idx = g.type(in[1]);
  if (idx.dtype != DType::kI64) fail("indices must be int64, got " + idx.str());
  if (src.rank() != idx.rank()) fail("index rank differs from source: " + idx.str() + " vs " + src.str());
  if (a.axis < 0 || a.axis >= src.rank()) fail("axis out of range for " + src.str());
  for (int64_t d = 0; d < src.rank(); ++d) {
    if (d != a.axis && idx.shape[static_cast<size_t>(d)] > src.shape[static_cast<size_t>(d)]) {
      fail("index " + idx.str() + " is larger than source " + src.str() + " off the gather axis");
    }
  }
  return {TensorType{src.dtype, idx.shape}};
}

Types infer_IndexPut(const Graph& g, const Inputs& in, const Attrs& a) {
  const TensorType& base = g.type(in[0]);
  const TensorType& idx = g.type(in[1]);
  const TensorType& val = g.type(in[2]);
  if (idx.dtype != DType::kI64 || idx.rank() != 1) fail("indices must be 1-D int64, got " + idx.str());
  if (a.axis < 0 || a.axis >= base.rank()) fail("axis out of range for " + base.str());
  if (val.dtype != base.dtype) fail("values " + val.str() + " differ in dtype from " + base.str());
  Shape want = base.shape;
  want[static_cast<size_t>(a.axis)] = idx.shape[0];
  if (val.shape != want) fail("values " + val.str() + " do not match indices " + idx.str() + " into " + base.str());
  return {base};
}

Types infer_Concat(const Graph& g, const Inputs& in, const Attrs& a) {
  if (in.empty()) fail("needs at least one input");
  TensorType out = g.type(in[0]);
  if (a.axis < 0 || a.axis >= out.rank()) fail("axis out of range for " + out.str());
  out.shape[static_cast<size_t>(a.axis)] = 0;
  for (const Value& v : in) {
    const TensorType& t = g.type(v);
    if (t.rank() != out.rank() || t.dtype != out.dtype) fail("inputs differ in rank or dtype: " + t.str());
    for (int64_t d = 0; d < t.rank(); ++d) {
      if (d != a.axis && t.shape[static_cast<size_t>(d)] != out.shape[static_cast<size_t>(d)]) {
        fail("input " + t.str() + " does not match the others off the concatenation axis");
      }
    }
    out.shape[static_cast<size_t>(a.axis)] += t.shape[static_cast<size_t>(a.axis)];
  }
  return {out};
}

Types infer_Conv(const Graph& g, const Inputs& in, const Attrs& a) {
  const TensorType& x = g.type(in[0]);
  const TensorType& w = g.type(in[1]);
  const int64_t d = x.rank() - 2;
  if (d < 1 || d > 3) fail("input " + x.str() + " is not [N, C, S...] with 1 to 3 spatial dims");
  if (w.rank() != x.rank()) fail("weight " + w.str() + " does not have the input's rank");
  if (w.dtype != x.dtype || !is_float(x.dtype)) {
    fail("input " + x.str() + " and weight " + w.str() + " must have one floating type");
  }
  if (static_cast<int64_t>(a.ints.size()) != 3 * d) fail("needs stride, padding and dilation for each spatial dim");
  const int64_t groups = a.k;
  if (groups < 1 || x.shape[1] % groups || w.shape[0] % groups || w.shape[1] * groups != x.shape[1]) {
    fail("groups=" + std::to_string(groups) + " does not fit input " + x.str() + " and weight " + w.str());
  }
  Shape out = {x.shape[0], w.shape[0]};
  for (int64_t i = 0; i < d; ++i) {
    const size_t u = static_cast<size_t>(i);
    const int64_t s = a.ints[u], p = a.ints[static_cast<size_t>(d) + u], dl = a.ints[2 * static_cast<size_t>(d) + u];
    if (s < 1 || p < 0 || dl < 1) fail("stride and dilation must be positive, padding non-negative");
    const int64_t span = dl * (w.shape[2 + u] - 1) + 1, padded = x.shape[2 + u] + 2 * p;
    if (padded < span) fail("kernel " + w.str() + " larger than the padded input " + x.str());
    out.push_back((padded - span) / s + 1);
  }
  return {TensorType{x.dtype, out}};
}

Types infer_TopK(const Graph& g, const Inputs& in, const Attrs& a) {
  const TensorType& t = g.type(in[0]);
  if (a.axis < 0 || a.axis >= t.rank()) fail("axis out of range for " + t.str());
  if (a.k < 0 || a.k > t.shape[static_cast<size_t>(a.axis)]) {
    fail("k=" + std::to_string(a.k) + " out of range for " + t.str());
  }
  Shape out = t.shape;
  out[static_cast<size_t>(a.axis)] = a.k;
  return {TensorType{t.dtype, out}, TensorType{DType::kI64, out}};
}

Types infer_Scan(const Graph& g, const Inputs& in, const Attrs& a) {
  const TensorType& t = g.type(in[0]);
  if (a.axis < 0 || a.axis >= t.rank()) fail("axis out of range for " + t.str());
  if (a.log && (!is_float(t.dtype) || a.reduce != ReduceKind::kSum)) fail("log-sum-exp scan needs a floating-point input and sum");
  return {t};
}

// Attention: q [B..., L, D], kt [B..., D, S], v [B..., S, E], optional bias [B..., L, S] (all
// float32, equal batch dims) -> [B..., L, E].
Types infer_Attention(const Graph& g, const Inputs& in, const Attrs& a) {
  if (in.size() != 3 && in.size() != 4) fail("attention expects q, kt, v and an optional bias, got " + std::to_string(in.size()) + " inputs");
  if (a.k != 0 && a.k != 1) fail("attention: k must be 0 (scale) or 1 (divide)");
  const TensorType& q = g.type(in[0]);
  const TensorType& kt = g.type(in[1]);
  const TensorType& v = g.type(in[2]);
  const std::string all = q.str() + ", " + kt.str() + ", " + v.str();
  for (Value x : in) {
    if (g.type(x).dtype != DType::kF32) fail("attention computes in float32: " + g.type(x).str());
  }
  if (q.rank() < 2 || kt.rank() != q.rank() || v.rank() != q.rank()) fail("attention operands need equal rank >= 2: " + all);
  const size_t r = static_cast<size_t>(q.rank());
  for (size_t i = 0; i + 2 < r; ++i) {
    if (kt.shape[i] != q.shape[i] || v.shape[i] != q.shape[i]) fail("attention batch dimensions differ: " + all);
  }
  if (kt.shape[r - 2] != q.shape[r - 1] || v.shape[r - 2] != kt.shape[r - 1]) fail("attention inner dimensions differ: " + all);
  Shape scores(q.shape.begin(), q.shape.end() - 1);
  scores.push_back(kt.shape[r - 1]);
  if (in.size() == 4 && g.type(in[3]).shape != scores) {
    fail("attention bias " + g.type(in[3]).str() + " is not the scores' shape " + shape_str(scores));
  }
  Shape out(q.shape.begin(), q.shape.end() - 1);
  out.push_back(v.shape[r - 1]);
  return {TensorType{DType::kF32, out}};
}

// Linalg: see include/chroma/cpu/linalg.h for each kind's inputs and outputs.
Types infer_Linalg(const Graph& g, const Inputs& in, const Attrs& a) {
  namespace la = linalg;
  if (a.k < 0 || a.k >= la::kKindCount) fail("unknown factorization kind " + std::to_string(a.k));
  const std::string kname = la::kKindNames[a.k];
  if (static_cast<int>(in.size()) != la::kKindArity[a.k]) {
    fail(kname + " expects " + std::to_string(la::kKindArity[a.k]) + " inputs, got " + std::to_string(in.size()));
  }
  const TensorType& x = g.type(in[0]);
  if (x.dtype != DType::kF32 && x.dtype != DType::kF64) fail(kname + " of " + x.str() + ": f32 or f64 only");
  if (x.rank() < 2) fail(kname + " of " + x.str() + ": needs a matrix (rank >= 2)");
  const size_t r = static_cast<size_t>(x.rank());
  const Shape batch(x.shape.begin(), x.shape.end() - 2);
  const int64_t m = x.shape[r - 2], n = x.shape[r - 1], mn = std::min(m, n);
  auto with = [&](std::initializer_list<int64_t> tail, DType d) {
    Shape s = batch;
    s.insert(s.end(), tail);
    return TensorType{d, s};
  };
  // Input i: the same dtype and batch dims, `mat_rank` trailing dims.
  auto operand = [&](size_t i, size_t mat_rank, bool pivots = false) -> const TensorType& {
    const TensorType& t = g.type(in[i]);
    if (t.dtype != (pivots ? DType::kI32 : x.dtype) || t.shape.size() != batch.size() + mat_rank ||
        !std::equal(batch.begin(), batch.end(), t.shape.begin())) {
      fail(kname + ": operand " + t.str() + " does not match " + x.str() + " (dtype, batch dims)");
    }
    return t;
  };
  auto square = [&] {
    if (m != n) fail(kname + " of " + x.str() + ": needs square matrices");
  };
  const int64_t f = a.start;
  switch (a.k) {
    case la::kCholesky: square(); return {x, with({}, DType::kI32)};
    case la::kLu: return {x, with({mn}, DType::kI32), with({}, DType::kI32)};
    case la::kTriSolve: {
      square();
      const TensorType& b = operand(1, 2);
      const int64_t side = (f & la::kLeft) ? b.shape[r - 2] : b.shape[r - 1];
      if (side != n) fail("trisolve: " + x.str() + " does not fit right-hand side " + b.str());
      return {b};
    }
    case la::kGeqrf: return {x, with({mn}, x.dtype)};
    case la::kOrgqr: {
      const TensorType& tau = operand(1, 1);
      if (n > m || tau.shape[r - 2] > n) fail("orgqr: needs k <= n <= m, got " + x.str() + " and tau " + tau.str());
      return {x};
    }
    case la::kOrmqr: {
      const TensorType& tau = operand(1, 1);
      const TensorType& c = operand(2, 2);
      const int64_t nq = (f & la::kLeft) ? c.shape[r - 2] : c.shape[r - 1];
      if (m != nq || tau.shape[r - 2] > std::min(nq, n)) {
        fail("ormqr: reflectors " + x.str() + " and tau " + tau.str() + " do not fit " + c.str());
      }
      return {c};
    }
    case la::kEigh:
      square();
      if (f & la::kVectors) return {with({n}, x.dtype), x};
      return {with({n}, x.dtype)};
    case la::kSvd: {
      if (!(f & la::kVectors)) return {with({mn}, x.dtype)};
      const bool full = f & la::kFull;
      return {with({mn}, x.dtype), with({m, full ? m : mn}, x.dtype), with({full ? n : mn, n}, x.dtype)};
    }
    case la::kExpm: square(); return {x};
    case la::kLdl: square(); return {x, with({n}, DType::kI32), with({}, DType::kI32)};
    case la::kLdlSolve: {
      square();
      const TensorType& piv = operand(1, 1, true);
      const TensorType& b = operand(2, 2);
      if (piv.shape[r - 2] != n || b.shape[r - 2] != n) fail("ldl_solve: " + x.str() + ", pivots " + piv.str() + " and " + b.str() + " do not fit");
      return {b};
    }
    default: break;
  }
  fail("unknown factorization kind");
}

using Rule = Types (*)(const Graph&, const Inputs&, const Attrs&);
constexpr std::array<Rule, static_cast<size_t>(Op::kCount)> kRules = {{
#define CHROMA_OP(name, cls, arity, outs) &infer_##name,
#include "ir/ops.def"
#undef CHROMA_OP
}};

}  // namespace

std::vector<TensorType> infer_types(const Graph& g, Op op, const std::vector<Value>& inputs, const Attrs& attrs) {
  const OpInfo& info = op_info(op);
  expect_arity(info, inputs);
  for (const Value& v : inputs) {
    (void)g.type(v);
  }
  Types t = kRules[static_cast<size_t>(op)](g, inputs, attrs);
  for (const TensorType& tt : t) {
    for (int64_t d : tt.shape) {
      if (d < 0) fail("negative dimension in " + tt.str());
    }
  }
  return t;
}

}  // namespace chroma
