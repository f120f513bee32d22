// ATen pooling, padding modes, upsampling and normalization layers, decomposed into IR primitives.
//
// Pooling (max/avg over d = 1..3 trailing spatial dims): the input is padded once (Concat with
// Full), then each of the k^d kernel offsets is a strided Slice of the padded tensor; the
// slices are combined by a balanced tree of elementwise ops (maximum / add), so the whole pool
// is one fused loop. Max-pool indices are a second fused loop: the first candidate equal to
// the max (PyTorch scans the window in row-major order and keeps the first maximum; a NaN
// always wins, so the last NaN), found as a minimum over per-offset Iota indices.
// Adaptive pooling, upsampling and padding modes use Gather with constant index vectors and
// MatMul with constant matrices along each spatial axis. Index and weight tables are computed
// here with PyTorch's own formulas and arithmetic (float for float32 inputs), so they agree
// with eager bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <string>

#include "import/aten.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// ---- constants ----------------------------------------------------------------------------

Value constant_bytes(Builder& b, const TensorType& t, std::vector<uint8_t> bytes) {
  ConstantData cd;
  cd.type = t;
  cd.bytes = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  return b.graph().constant(std::move(cd));
}

Value const_i64(Builder& b, const Shape& shape, const std::vector<int64_t>& v) {
  std::vector<uint8_t> bytes(v.size() * sizeof(int64_t));
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  return constant_bytes(b, TensorType{DType::kI64, shape}, std::move(bytes));
}

// A float constant in dtype `t` (float32 or float64).
Value const_float(Builder& b, DType t, const Shape& shape, const std::vector<double>& v) {
  std::vector<uint8_t> bytes;
  if (t == DType::kF64) {
    bytes.resize(v.size() * sizeof(double));
    if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  } else {
    std::vector<float> f(v.begin(), v.end());
    bytes.resize(f.size() * sizeof(float));
    if (!f.empty()) std::memcpy(bytes.data(), f.data(), bytes.size());
  }
  return constant_bytes(b, TensorType{t, shape}, std::move(bytes));
}

// Shape of rank `rank` that is 1 everywhere except `n` at `axis` (to broadcast a per-axis
// table along that axis).
Shape along(int64_t rank, int64_t axis, int64_t n) {
  Shape s(static_cast<size_t>(rank), 1);
  s[static_cast<size_t>(axis)] = n;
  return s;
}

Value concat(Builder& b, const std::vector<Value>& parts, int64_t axis) {
  if (parts.size() == 1) return parts[0];
  Attrs a;
  a.axis = axis;
  return b.graph().add(Op::kConcat, parts, a);
}

Value pad_axis(Builder& b, Value x, int64_t axis, int64_t lo, int64_t hi, Scalar value) {
  if (lo <= 0 && hi <= 0) return x;
  const TensorType t = b.type(x);
  auto filler = [&](int64_t n) {
    Shape s = t.shape;
    s[static_cast<size_t>(axis)] = n;
    return b.full(value, t.dtype, s);
  };
  std::vector<Value> parts;
  if (lo > 0) parts.push_back(filler(lo));
  parts.push_back(x);
  if (hi > 0) parts.push_back(filler(hi));
  return concat(b, parts, axis);
}

Value gather(Builder& b, Value x, int64_t axis, Value idx) {
  Attrs a;
  a.axis = axis;
  return b.graph().add(Op::kGather, {x, idx}, a);
}

// Gathers x[..., idx[o], ...] along `axis` with a constant index vector. Identity and
// "each element repeated r times" tables become views (no copy).
Value take(Builder& b, Value x, int64_t axis, const std::vector<int64_t>& idx) {
  const Shape shape = b.type(x).shape;
  const int64_t n = shape[static_cast<size_t>(axis)], m = static_cast<int64_t>(idx.size());
  bool identity = n == m;
  for (int64_t i = 0; identity && i < m; ++i) identity = idx[static_cast<size_t>(i)] == i;
  if (identity) return x;
  if (n > 0 && m % n == 0) {
    const int64_t r = m / n;
    bool repeat = true;
    for (int64_t i = 0; repeat && i < m; ++i) repeat = idx[static_cast<size_t>(i)] == i / r;
    if (repeat) {
      Shape s1 = shape, s2 = shape, s3 = shape;
      s1.insert(s1.begin() + axis + 1, 1);
      s2.insert(s2.begin() + axis + 1, r);
      s3[static_cast<size_t>(axis)] = m;
      return b.reshape(b.expand(b.reshape(x, s1), s2), s3);
    }
  }
  return gather(b, x, axis, const_i64(b, {m}, idx));
}

// Balanced tree of a binary elementwise op over `xs` (in order).
Value tree(Builder& b, EwOp op, std::vector<Value> xs) {
  while (xs.size() > 1) {
    std::vector<Value> next;
    for (size_t i = 0; i + 1 < xs.size(); i += 2) next.push_back(b.ew(op, xs[i], xs[i + 1]));
    if (xs.size() % 2) next.push_back(xs.back());
    xs = std::move(next);
  }
  return xs[0];
}

Scalar lowest(DType t) {
  switch (t) {
    case DType::kF32: case DType::kF64: return Scalar::of_float(-INFINITY);
    case DType::kI64: return Scalar::of_int(std::numeric_limits<int64_t>::lowest());
    case DType::kI32: return Scalar::of_int(std::numeric_limits<int32_t>::lowest());
    case DType::kI16: return Scalar::of_int(std::numeric_limits<int16_t>::lowest());
    case DType::kI8: return Scalar::of_int(std::numeric_limits<int8_t>::lowest());
    default: return Scalar::of_int(0);
  }
}

int64_t div_floor(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// ---- pooling geometry ---------------------------------------------------------------------

// The `d` trailing dims of x are spatial; x has rank d+1 (unbatched) or d+2.
void check_rank(Call& c, Value x, int d, const char* what) {
  const int64_t r = c.b.type(x).rank();
  if (r != d + 1 && r != d + 2) {
    c.fail(std::string(what) + " expects a " + std::to_string(d + 1) + "-D or " + std::to_string(d + 2) +
           "-D input, got " + c.b.type(x).str());
  }
}

// An int list argument with d entries (a single value is repeated); `dflt` when empty.
std::vector<int64_t> int_list(Call& c, size_t i, const char* name, int d, const std::vector<int64_t>& dflt) {
  std::vector<int64_t> v = c.ints(i, name);
  if (v.empty()) v = dflt;
  if (v.size() == 1) v.assign(static_cast<size_t>(d), v[0]);
  if (v.size() != static_cast<size_t>(d)) {
    c.fail(std::string("argument '") + name + "' must have 1 or " + std::to_string(d) + " values, got " + list_str(v));
  }
  return v;
}

struct Pool {
  int d = 2;
  std::vector<int64_t> in, k, s, p, dil, out;
  bool ceil = false;
};

int64_t pool_out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t dil, bool ceil) {
  int64_t o = div_floor(in + 2 * p - dil * (k - 1) - 1 + (ceil ? s - 1 : 0), s) + 1;
  if (ceil && (o - 1) * s >= in + p) --o;  // the last window must start inside input + left pad
  return o;
}

Pool pool_geometry(Call& c, Value x, int d, const char* what, bool has_dilation) {
  check_rank(c, x, d, what);
  Pool g;
  g.d = d;
  const Shape shape = c.b.type(x).shape;
  for (int a = 0; a < d; ++a) g.in.push_back(shape[shape.size() - static_cast<size_t>(d - a)]);
  g.k = int_list(c, 1, "kernel_size", d, {});
  g.s = int_list(c, 2, "stride", d, g.k);
  g.p = int_list(c, 3, "padding", d, {0});
  if (has_dilation) {
    g.dil = int_list(c, 4, "dilation", d, {1});
    g.ceil = c.bool_or(5, "ceil_mode", false);
  } else {
    g.dil.assign(static_cast<size_t>(d), 1);
    g.ceil = c.bool_or(4, "ceil_mode", false);
  }
  for (int a = 0; a < d; ++a) {
    const size_t i = static_cast<size_t>(a);
    if (g.k[i] <= 0) c.fail(std::string(what) + ": kernel size must be positive, got " + list_str(g.k));
    if (g.s[i] <= 0) c.fail(std::string(what) + ": stride must be positive, got " + list_str(g.s));
    if (g.dil[i] <= 0) c.fail(std::string(what) + ": dilation must be positive, got " + list_str(g.dil));
    if (g.p[i] < 0 || g.p[i] > g.k[i] / 2) {
      c.fail(std::string(what) + ": padding must be between 0 and half the kernel size, got padding " + list_str(g.p) +
             " for kernel " + list_str(g.k));
    }
    g.out.push_back(pool_out_size(g.in[i], g.k[i], g.s[i], g.p[i], g.dil[i], g.ceil));
    if (g.out[i] < 1) {
      c.fail(std::string(what) + ": output size is too small (input " + list_str(g.in) + ", kernel " + list_str(g.k) +
             ", stride " + list_str(g.s) + ", padding " + list_str(g.p) + ", dilation " + list_str(g.dil) + ")");
    }
  }
  return g;
}

// Pads the spatial dims of x so that every window lies inside; returns the padded tensor.
Value pool_pad(Builder& b, Value x, const Pool& g, Scalar value) {
  const int64_t r = b.type(x).rank();
  for (int a = 0; a < g.d; ++a) {
    const size_t i = static_cast<size_t>(a);
    const int64_t axis = r - g.d + a;
    const int64_t reach = (g.out[i] - 1) * g.s[i] + g.dil[i] * (g.k[i] - 1) + 1;  // padded extent used
    x = pad_axis(b, x, axis, g.p[i], reach - g.p[i] - g.in[i], value);
  }
  return x;
}

// Each kernel offset (row-major over the spatial dims): its offsets per axis.
std::vector<std::vector<int64_t>> offsets(const std::vector<int64_t>& k) {
  std::vector<std::vector<int64_t>> r{{}};
  for (int64_t n : k) {
    std::vector<std::vector<int64_t>> next;
    for (const auto& pre : r) {
      for (int64_t j = 0; j < n; ++j) {
        auto v = pre;
        v.push_back(j);
        next.push_back(v);
      }
    }
    r = std::move(next);
  }
  return r;
}

// The candidate of kernel offset `off`: a strided slice of the padded input.
Value pool_candidate(Builder& b, Value xp, const Pool& g, const std::vector<int64_t>& off) {
  const int64_t r = b.type(xp).rank();
  for (int a = 0; a < g.d; ++a) {
    const size_t i = static_cast<size_t>(a);
    const int64_t start = off[i] * g.dil[i];
    xp = b.slice(xp, r - g.d + a, start, start + (g.out[i] - 1) * g.s[i] + 1, g.s[i]);
  }
  return xp;
}

// Iota over the spatial output shape: scalar + sum_a coeffs[a] * o_a.
Value iota(Builder& b, const Shape& shape, int64_t base, const std::vector<int64_t>& coeffs) {
  Attrs a;
  a.dtype = DType::kI64;
  a.ints = shape;
  a.scalar = Scalar::of_int(base);
  for (int64_t k : coeffs) a.coeffs.push_back(static_cast<double>(k));
  return b.graph().add(Op::kIota, {}, a);
}

// max_pool{1,2,3}d_with_indices.
std::vector<Value> max_pool(Call& c, int d) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const char* what = d == 1 ? "max_pool1d" : d == 2 ? "max_pool2d" : "max_pool3d";
  const DType dt = b.type(x).dtype;
  if (dt == DType::kBool) c.fail(std::string(what) + " does not support bool input");
  const Pool g = pool_geometry(c, x, d, what, true);
  const Shape xs = b.type(x).shape;
  Shape out_spatial(g.out.begin(), g.out.end());
  Shape out_shape(xs.begin(), xs.end() - d);
  out_shape.insert(out_shape.end(), g.out.begin(), g.out.end());
  // A window with no input element at all (possible only with dilation) has no PyTorch-defined index.
  for (int a = 0; a < d; ++a) {
    const size_t i = static_cast<size_t>(a);
    for (int64_t o : {int64_t{0}, g.out[i] - 1}) {
      bool any = false;
      for (int64_t j = 0; j < g.k[i]; ++j) {
        const int64_t pos = o * g.s[i] - g.p[i] + j * g.dil[i];
        any = any || (pos >= 0 && pos < g.in[i]);
      }
      if (!any) c.fail(std::string(what) + ": a pooling window lies entirely in the padding (dilation " + list_str(g.dil) + ")");
    }
  }
  Value xp = pool_pad(b, x, g, lowest(dt));
  const auto offs = offsets(g.k);
  std::vector<Value> cands;
  for (const auto& off : offs) cands.push_back(pool_candidate(b, xp, g, off));
  Value m = tree(b, EwOp::k_maximum, cands);

  // Indices: flat position in the unpadded plane of the first candidate equal to the max, or,
  // when the max is NaN, of the last NaN (negated, so one minimum finds both).
  std::vector<int64_t> stride(static_cast<size_t>(d), 1);
  for (int a = d - 2; a >= 0; --a) stride[static_cast<size_t>(a)] = stride[static_cast<size_t>(a) + 1] * g.in[static_cast<size_t>(a) + 1];
  const Scalar big = Scalar::of_int(std::numeric_limits<int64_t>::max());
  std::vector<Value> keys;
  for (size_t j = 0; j < offs.size(); ++j) {
    int64_t base = 0;
    std::vector<int64_t> coeffs;
    std::optional<Value> valid;
    for (int a = 0; a < d; ++a) {
      const size_t i = static_cast<size_t>(a);
      const int64_t first = offs[j][i] * g.dil[i] - g.p[i];  // input position for o = 0
      base += first * stride[i];
      coeffs.push_back(g.s[i] * stride[i]);
      const int64_t last = first + (g.out[i] - 1) * g.s[i];
      if (first < 0 || last >= g.in[i]) {
        std::vector<int64_t> unit(static_cast<size_t>(d), 0);
        unit[i] = g.s[i];
        Value pos = iota(b, out_spatial, first, unit);
        Value ok = b.ew(EwOp::k_logical_and, b.ew(EwOp::k_ge, pos, Scalar::of_int(0)),
                        b.ew(EwOp::k_lt, pos, Scalar::of_int(g.in[i])));
        valid = valid ? b.ew(EwOp::k_logical_and, *valid, ok) : ok;
      }
    }
    Value idx = b.expand(iota(b, out_spatial, base, coeffs), out_shape);
    Value hit = b.ew(EwOp::k_eq, cands[j], m);
    if (valid) hit = b.ew(EwOp::k_logical_and, hit, b.expand(*valid, out_shape));
    Value miss = b.full(big, DType::kI64, {});
    if (is_float(dt)) {
      miss = b.ew(EwOp::k_where, {Operand::of(b.ew(EwOp::k_isnan, cands[j])), Operand::of(b.ew(EwOp::k_neg, idx)),
                                  Operand::of(big)});
    }
    keys.push_back(b.ew(EwOp::k_where, {Operand::of(hit), Operand::of(idx), Operand::of(miss)}));
  }
  Value key = tree(b, EwOp::k_minimum, keys);
  Value indices = is_float(dt) ? b.ew(EwOp::k_abs, key) : key;
  return {m, indices};
}

// avg_pool{1,2,3}d. PyTorch's divisor: divisor_override, else the window clipped to
// input + padding (count_include_pad) or to the input; a window entirely in the padding gives 0.
Value avg_pool(Call& c, int d) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const char* what = d == 1 ? "avg_pool1d" : d == 2 ? "avg_pool2d" : "avg_pool3d";
  const DType dt = b.type(x).dtype;
  if (!is_float(dt)) c.fail(std::string(what) + " needs floating-point input, got " + b.type(x).str());
  const Pool g = pool_geometry(c, x, d, what, false);
  const bool include_pad = c.bool_or(5, "count_include_pad", true);
  std::optional<int64_t> override_;
  if (c.has(6, "divisor_override")) {
    override_ = c.int_(6, "divisor_override");
    if (*override_ == 0) c.fail(std::string(what) + ": divisor_override must be nonzero");
  }
  Value xp = pool_pad(b, x, g, Scalar::of_float(0.0));
  std::vector<Value> cands;
  for (const auto& off : offsets(g.k)) cands.push_back(pool_candidate(b, xp, g, off));
  Value sum = tree(b, EwOp::k_add, cands);
  if (override_) return b.ew(EwOp::k_div, sum, Scalar::of_float(static_cast<double>(*override_)));
  // Per-axis window sizes; the divisor is their product.
  std::vector<std::vector<int64_t>> sizes(static_cast<size_t>(d));
  bool uniform = true;
  for (int a = 0; a < d; ++a) {
    const size_t i = static_cast<size_t>(a);
    for (int64_t o = 0; o < g.out[i]; ++o) {
      int64_t lo = o * g.s[i] - g.p[i];
      int64_t hi = std::min(lo + g.k[i], g.in[i] + g.p[i]);
      if (!include_pad) {
        lo = std::max<int64_t>(lo, 0);
        hi = std::min(hi, g.in[i]);
      }
      sizes[i].push_back(std::max<int64_t>(hi - lo, 1));  // empty windows sum to 0: any divisor
      uniform = uniform && sizes[i].back() == g.k[i];
    }
  }
  if (uniform) {
    int64_t n = 1;
    for (int64_t k : g.k) n *= k;
    return b.ew(EwOp::k_div, sum, Scalar::of_float(static_cast<double>(n)));
  }
  Shape out_spatial(g.out.begin(), g.out.end());
  std::vector<double> div(static_cast<size_t>(numel(out_spatial)), 1.0);
  for (size_t f = 0; f < div.size(); ++f) {
    int64_t rest = static_cast<int64_t>(f), n = 1;
    for (int a = d - 1; a >= 0; --a) {
      const size_t i = static_cast<size_t>(a);
      n *= sizes[i][static_cast<size_t>(rest % g.out[i])];
      rest /= g.out[i];
    }
    div[f] = static_cast<double>(n);
  }
  return b.ew(EwOp::k_div, sum, const_float(b, dt, out_spatial, div));
}

// ---- adaptive pooling ---------------------------------------------------------------------

int64_t adaptive_start(int64_t i, int64_t in, int64_t out) { return (i * in) / out; }
int64_t adaptive_end(int64_t i, int64_t in, int64_t out) { return ((i + 1) * in + out - 1) / out; }

std::vector<int64_t> adaptive_sizes(Call& c, Value x, int d, const char* what) {
  check_rank(c, x, d, what);
  std::vector<int64_t> out = int_list(c, 1, "output_size", d, {});
  const Shape s = c.b.type(x).shape;
  for (int a = 0; a < d; ++a) {
    const int64_t in = s[s.size() - static_cast<size_t>(d - a)];
    if (out[static_cast<size_t>(a)] <= 0) c.fail(std::string(what) + ": output size must be positive, got " + list_str(out));
    if (in <= 0) c.fail(std::string(what) + ": input spatial dims must be non-empty, got " + c.b.type(x).str());
  }
  return out;
}

// _adaptive_avg_pool{2,3}d (1-d exports as 2-d): per axis, a reshape + sum when the windows
// tile the axis, else a MatMul with a constant 0/1 window matrix; then sum / window size.
Value adaptive_avg_pool(Call& c, int d) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const char* what = d == 2 ? "adaptive_avg_pool2d" : "adaptive_avg_pool3d";
  const DType dt = b.type(x).dtype;
  if (!is_float(dt)) c.fail(std::string(what) + " needs floating-point input, got " + b.type(x).str());
  const std::vector<int64_t> out = adaptive_sizes(c, x, d, what);
  const int64_t r = b.type(x).rank();
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(d));
  for (int a = 0; a < d; ++a) {
    const int64_t axis = r - d + a;
    const Shape s = b.type(x).shape;
    const int64_t in = s[static_cast<size_t>(axis)], o = out[static_cast<size_t>(a)];
    for (int64_t i = 0; i < o; ++i) counts[static_cast<size_t>(a)].push_back(adaptive_end(i, in, o) - adaptive_start(i, in, o));
    if (in % o == 0) {
      Shape split = s;
      split[static_cast<size_t>(axis)] = o;
      split.insert(split.begin() + axis + 1, in / o);
      x = b.sum(b.reshape(x, split), {axis + 1}, false);
      continue;
    }
    // Move the axis last, [rows, in] @ [in, o], move it back.
    std::vector<double> w(static_cast<size_t>(in * o), 0.0);
    for (int64_t i = 0; i < o; ++i) {
      for (int64_t j = adaptive_start(i, in, o); j < adaptive_end(i, in, o); ++j) w[static_cast<size_t>(j * o + i)] = 1.0;
    }
    std::vector<int64_t> perm;
    for (int64_t q = 0; q < r; ++q) {
      if (q != axis) perm.push_back(q);
    }
    perm.push_back(axis);
    Value t = b.permute(x, perm);
    Shape ts = b.type(t).shape;
    const int64_t rows = in ? b.type(t).numel() / in : 0;
    Value mm = b.graph().add(Op::kMatMul, {b.reshape(t, {rows, in}), const_float(b, dt, {in, o}, w)});
    ts.back() = o;
    std::vector<int64_t> inv(static_cast<size_t>(r));
    for (size_t q = 0; q < perm.size(); ++q) inv[static_cast<size_t>(perm[q])] = static_cast<int64_t>(q);
    x = b.permute(b.reshape(mm, ts), inv);
  }
  Shape out_spatial(out.begin(), out.end());
  std::vector<double> div(static_cast<size_t>(numel(out_spatial)));
  bool uniform = true;
  for (size_t f = 0; f < div.size(); ++f) {
    int64_t rest = static_cast<int64_t>(f), n = 1;
    for (int a = d - 1; a >= 0; --a) {
      const size_t i = static_cast<size_t>(a);
      n *= counts[i][static_cast<size_t>(rest % out[i])];
      rest /= out[i];
    }
    div[f] = static_cast<double>(n);
    uniform = uniform && div[f] == div[0];
  }
  if (uniform) return b.ew(EwOp::k_div, x, Scalar::of_float(div[0]));
  return b.ew(EwOp::k_div, x, const_float(b, dt, out_spatial, div));
}

// adaptive_max_pool{2,3}d: per axis, one Gather with a [out, L] table (window positions, the
// last one repeated up to the longest window L), then the L^d candidates are combined like
// max_pool's.
std::vector<Value> adaptive_max_pool(Call& c, int d) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const char* what = d == 2 ? "adaptive_max_pool2d" : "adaptive_max_pool3d";
  const DType dt = b.type(x).dtype;
  if (dt == DType::kBool) c.fail(std::string(what) + " does not support bool input");
  const std::vector<int64_t> out = adaptive_sizes(c, x, d, what);
  const int64_t r = b.type(x).rank();
  const Shape xs = b.type(x).shape;
  std::vector<int64_t> in(static_cast<size_t>(d)), len(static_cast<size_t>(d), 0);
  std::vector<std::vector<std::vector<int64_t>>> pos(static_cast<size_t>(d));  // [axis][j][o]
  for (int a = 0; a < d; ++a) {
    const size_t i = static_cast<size_t>(a);
    in[i] = xs[static_cast<size_t>(r - d + a)];
    for (int64_t o = 0; o < out[i]; ++o) len[i] = std::max(len[i], adaptive_end(o, in[i], out[i]) - adaptive_start(o, in[i], out[i]));
    pos[i].assign(static_cast<size_t>(len[i]), std::vector<int64_t>(static_cast<size_t>(out[i])));
    for (int64_t j = 0; j < len[i]; ++j) {
      for (int64_t o = 0; o < out[i]; ++o) {
        pos[i][static_cast<size_t>(j)][static_cast<size_t>(o)] =
            std::min(adaptive_start(o, in[i], out[i]) + j, adaptive_end(o, in[i], out[i]) - 1);
      }
    }
  }
  // Gather: axis a of size in -> out * L, then split into [out, L]; candidates are slices.
  Value g = x;
  for (int a = 0; a < d; ++a) {
    const size_t i = static_cast<size_t>(a);
    const int64_t axis = r - d + a + a;  // earlier axes already split into two
    std::vector<int64_t> tab;
    for (int64_t o = 0; o < out[i]; ++o) {
      for (int64_t j = 0; j < len[i]; ++j) tab.push_back(pos[i][static_cast<size_t>(j)][static_cast<size_t>(o)]);
    }
    g = gather(b, g, axis, const_i64(b, {out[i], len[i]}, tab));
  }
  Shape out_shape(xs.begin(), xs.end() - d);
  out_shape.insert(out_shape.end(), out.begin(), out.end());
  const auto offs = offsets(len);
  std::vector<Value> cands;
  for (const auto& off : offs) {
    Value v = g;
    for (int a = 0; a < d; ++a) v = b.slice(v, r - d + 2 * a + 1, off[static_cast<size_t>(a)], off[static_cast<size_t>(a)] + 1, 1);
    cands.push_back(b.reshape(v, out_shape));
  }
  Value m = tree(b, EwOp::k_maximum, cands);
  std::vector<int64_t> stride(static_cast<size_t>(d), 1);
  for (int a = d - 2; a >= 0; --a) stride[static_cast<size_t>(a)] = stride[static_cast<size_t>(a) + 1] * in[static_cast<size_t>(a) + 1];
  const Shape out_spatial(out.begin(), out.end());
  const Scalar big = Scalar::of_int(std::numeric_limits<int64_t>::max());
  std::vector<Value> keys;
  for (size_t j = 0; j < offs.size(); ++j) {
    std::vector<int64_t> flat(static_cast<size_t>(numel(out_spatial)));
    for (size_t f = 0; f < flat.size(); ++f) {
      int64_t rest = static_cast<int64_t>(f), v = 0;
      for (int a = d - 1; a >= 0; --a) {
        const size_t i = static_cast<size_t>(a);
        v += pos[i][static_cast<size_t>(offs[j][i])][static_cast<size_t>(rest % out[i])] * stride[i];
        rest /= out[i];
      }
      flat[f] = v;
    }
    Value idx = b.expand(const_i64(b, out_spatial, flat), out_shape);
    Value hit = b.ew(EwOp::k_eq, cands[j], m);
    Value miss = b.full(big, DType::kI64, {});
    if (is_float(dt)) {
      miss = b.ew(EwOp::k_where, {Operand::of(b.ew(EwOp::k_isnan, cands[j])), Operand::of(b.ew(EwOp::k_neg, idx)),
                                  Operand::of(big)});
    }
    keys.push_back(b.ew(EwOp::k_where, {Operand::of(hit), Operand::of(idx), Operand::of(miss)}));
  }
  Value key = tree(b, EwOp::k_minimum, keys);
  return {m, is_float(dt) ? b.ew(EwOp::k_abs, key) : key};
}

}  // namespace

void register_aten_pool(HandlerTable& t) {
  t["aten.max_pool1d_with_indices.default"] = [](Call& c) { return max_pool(c, 1); };
  t["aten.max_pool2d_with_indices.default"] = [](Call& c) { return max_pool(c, 2); };
  t["aten.max_pool3d_with_indices.default"] = [](Call& c) { return max_pool(c, 3); };
  t["aten.max_pool1d.default"] = [](Call& c) { return one(max_pool(c, 1)[0]); };
  t["aten.max_pool2d.default"] = [](Call& c) { return one(max_pool(c, 2)[0]); };
  t["aten.max_pool3d.default"] = [](Call& c) { return one(max_pool(c, 3)[0]); };
  t["aten.avg_pool1d.default"] = [](Call& c) { return one(avg_pool(c, 1)); };
  t["aten.avg_pool2d.default"] = [](Call& c) { return one(avg_pool(c, 2)); };
  t["aten.avg_pool3d.default"] = [](Call& c) { return one(avg_pool(c, 3)); };
  t["aten._adaptive_avg_pool2d.default"] = [](Call& c) { return one(adaptive_avg_pool(c, 2)); };
  t["aten._adaptive_avg_pool3d.default"] = [](Call& c) { return one(adaptive_avg_pool(c, 3)); };
  t["aten.adaptive_max_pool2d.default"] = [](Call& c) { return adaptive_max_pool(c, 2); };
  t["aten.adaptive_max_pool3d.default"] = [](Call& c) { return adaptive_max_pool(c, 3); };
}

}  // namespace chroma
