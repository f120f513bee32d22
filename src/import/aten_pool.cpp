// ATen pooling, padding modes and upsampling, decomposed into IR primitives (normalization
// layers: aten_norm.cpp).
//
// Pooling (max/avg over d = 1..3 trailing spatial dims): the input is padded once (Concat with
// Full), then each of the k^d kernel offsets is a strided Slice of the padded tensor; the
// slices are combined by a balanced tree of elementwise ops (maximum / add), so the whole pool
// is one fused loop. Max-pool indices are a second fused loop: the first candidate equal to
// the max (PyTorch scans the window in row-major order and keeps the first maximum; a NaN
// always wins, so the last NaN), found as a minimum over per-offset Iota indices. Windows of
// more than kMaxTreeWindow elements are gathered ([.., o, k, ..] per axis) and reduced
// instead: far less generated code.
// Adaptive pooling gathers each window with a constant [out, L] table per axis (masked sums
// for the average, so a NaN or inf stays in its own windows); upsampling is a constant Gather
// (nearest) or a Gather of both neighbours plus constant weights (linear) per axis. Index and
// weight tables are computed here with PyTorch's own formulas and arithmetic (float for
// float32 inputs), so they agree with eager bit for bit. The pooling backward ops scatter
// the gradient back over the windows with IndexPut (accumulate). Reflect / replicate /
// circular padding export as index ops (aten_index.cpp, aten.slice_scatter, empty here).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <string>

#include "import/aten.h"
#include "import/graph_util.h"
#include "import/pool_util.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

using pool::along;
using pool::concat;
using pool::const_float;
using pool::const_i64;
using pool::constant_bytes;
using pool::gather;
using pool::pad_axis;
using pool::take;

// reflection_pad{1,2,3}d / replication_pad{1,2,3}d: padding = [lo, hi] per trailing dim, last
// dim first (PyTorch's order). Reflection mirrors without repeating the edge (and needs
// padding < size); replication repeats the edge.
Value mode_pad(Call& c, int d, bool reflect) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const std::vector<int64_t> pad = c.ints(1, "padding");
  const char* what = reflect ? "reflection padding" : "replication padding";
  const TensorType t = b.type(x);
  if (static_cast<int>(pad.size()) != 2 * d) c.fail(std::string(what) + ": padding needs " + std::to_string(2 * d) + " values");
  if (t.rank() < d + 1) c.fail(std::string(what) + ": input " + t.str() + " has too few dims");
  for (int a = 0; a < d; ++a) {
    const int64_t axis = t.rank() - 1 - a;
    const int64_t n = t.shape[static_cast<size_t>(axis)];
    const int64_t lo = pad[2 * static_cast<size_t>(a)], hi = pad[2 * static_cast<size_t>(a) + 1];
    if (n <= 0) c.fail(std::string(what) + ": dim " + std::to_string(axis) + " of " + t.str() + " is empty");
    if (reflect && (lo >= n || hi >= n || lo < 0 || hi < 0)) {
      c.fail("reflection padding (" + std::to_string(lo) + ", " + std::to_string(hi) + ") must be non-negative and smaller than dim " +
             std::to_string(axis) + " of " + t.str());
    }
    if (n + lo + hi < 0) c.fail(std::string(what) + ": padding leaves dim " + std::to_string(axis) + " with negative size");
    std::vector<int64_t> idx;
    for (int64_t i = -lo; i < n + hi; ++i) {
      int64_t j = i;
      if (reflect) j = i < 0 ? -i : (i >= n ? 2 * (n - 1) - i : i);
      else j = std::clamp<int64_t>(i, 0, n - 1);
      idx.push_back(j);
    }
    x = take(b, x, axis, idx);
  }
  return x;
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
  if (is_float(t)) return Scalar::of_float(-INFINITY);
  switch (t) {
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
    c.fail(std::string("argument '") + name + "' must have 1 or " + std::to_string(d) + " values, got " + gu::ints_str(v));
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

// `base`: position of the kernel_size argument minus 1 (0 for the forward ops, whose args
// are (self, kernel_size, ...); 1 for the backward ops, (grad_output, self, kernel_size, ...)).
Pool pool_geometry(Call& c, Value x, int d, const char* what, bool has_dilation, size_t base = 0) {
  check_rank(c, x, d, what);
  Pool g;
  g.d = d;
  const Shape shape = c.b.type(x).shape;
  for (int a = 0; a < d; ++a) g.in.push_back(shape[shape.size() - static_cast<size_t>(d - a)]);
  g.k = int_list(c, base + 1, "kernel_size", d, {});
  g.s = int_list(c, base + 2, "stride", d, g.k);
  g.p = int_list(c, base + 3, "padding", d, {0});
  if (has_dilation) {
    g.dil = int_list(c, base + 4, "dilation", d, {1});
    g.ceil = c.bool_or(base + 5, "ceil_mode", false);
  } else {
    g.dil.assign(static_cast<size_t>(d), 1);
    g.ceil = c.bool_or(base + 4, "ceil_mode", false);
  }
  for (int a = 0; a < d; ++a) {
    const size_t i = static_cast<size_t>(a);
    if (g.k[i] <= 0) c.fail(std::string(what) + ": kernel size must be positive, got " + gu::ints_str(g.k));
    if (g.s[i] <= 0) c.fail(std::string(what) + ": stride must be positive, got " + gu::ints_str(g.s));
    if (g.dil[i] <= 0) c.fail(std::string(what) + ": dilation must be positive, got " + gu::ints_str(g.dil));
    if (g.p[i] < 0 || g.p[i] > g.k[i] / 2) {
      c.fail(std::string(what) + ": padding must be between 0 and half the kernel size, got padding " + gu::ints_str(g.p) +
             " for kernel " + gu::ints_str(g.k));
    }
    g.out.push_back(pool_out_size(g.in[i], g.k[i], g.s[i], g.p[i], g.dil[i], g.ceil));
    if (g.out[i] < 1) {
      c.fail(std::string(what) + ": output size is too small (input " + gu::ints_str(g.in) + ", kernel " + gu::ints_str(g.k) +
             ", stride " + gu::ints_str(g.s) + ", padding " + gu::ints_str(g.p) + ", dilation " + gu::ints_str(g.dil) + ")");
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

std::vector<Value> window_max(Builder& b, Value g, int d, Value flat, const Shape& out_shape);
Value gather_windows(Builder& b, Value x, int d, const std::vector<std::vector<int64_t>>& tabs,
                     const std::vector<int64_t>& out, const std::vector<int64_t>& len);
Value flat_table(Builder& b, int d, const std::vector<std::vector<int64_t>>& pos, const std::vector<int64_t>& in,
                 const std::vector<int64_t>& out, const std::vector<int64_t>& len);

// Windows of up to this many elements are combined by a tree of elementwise ops (one fused
// loop); larger ones are gathered and reduced.
constexpr int64_t kMaxTreeWindow = 9;

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
      if (!any) c.fail(std::string(what) + ": a pooling window lies entirely in the padding (dilation " + gu::ints_str(g.dil) + ")");
    }
  }
  Value xp = pool_pad(b, x, g, lowest(dt));
  int64_t window = 1;
  for (int64_t k : g.k) window *= k;
  if (window > kMaxTreeWindow) {
    // Large windows: gather them ([.., o, k, ..] per axis) and reduce; compiles to far less
    // code than a tree of k^d candidates.
    std::vector<std::vector<int64_t>> tabs(static_cast<size_t>(d)), pos(static_cast<size_t>(d));
    for (int a = 0; a < d; ++a) {
      const size_t i = static_cast<size_t>(a);
      for (int64_t o = 0; o < g.out[i]; ++o) {
        for (int64_t j = 0; j < g.k[i]; ++j) {
          const int64_t q = o * g.s[i] + j * g.dil[i];  // padded coordinates
          tabs[i].push_back(q);
          pos[i].push_back(q - g.p[i] >= 0 && q - g.p[i] < g.in[i] ? q - g.p[i] : -1);
        }
      }
    }
    Value win = gather_windows(b, xp, d, tabs, g.out, g.k);
    return window_max(b, win, d, flat_table(b, d, pos, g.in, g.out, g.k), out_shape);
  }
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

// The divisor of each output position of an average pool (row-major over the spatial output):
// the window clipped to input + padding (count_include_pad) or to the input; at least 1 (an
// empty window sums to 0).
std::vector<double> avg_divisors(const Pool& g, bool include_pad) {
  const int d = g.d;
  std::vector<std::vector<int64_t>> sizes(static_cast<size_t>(d));
  for (int a = 0; a < d; ++a) {
    const size_t i = static_cast<size_t>(a);
    for (int64_t o = 0; o < g.out[i]; ++o) {
      int64_t lo = o * g.s[i] - g.p[i];
      int64_t hi = std::min(lo + g.k[i], g.in[i] + g.p[i]);
      if (!include_pad) {
        lo = std::max<int64_t>(lo, 0);
        hi = std::min(hi, g.in[i]);
      }
      sizes[i].push_back(std::max<int64_t>(hi - lo, 1));
    }
  }
  std::vector<double> div(static_cast<size_t>(numel(Shape(g.out.begin(), g.out.end()))), 1.0);
  for (size_t f = 0; f < div.size(); ++f) {
    int64_t rest = static_cast<int64_t>(f), n = 1;
    for (int a = d - 1; a >= 0; --a) {
      const size_t i = static_cast<size_t>(a);
      n *= sizes[i][static_cast<size_t>(rest % g.out[i])];
      rest /= g.out[i];
    }
    div[f] = static_cast<double>(n);
  }
  return div;
}

// avg_pool{1,2,3}d. PyTorch's divisor: divisor_override, else the window clipped to
// input + padding (count_include_pad) or to the input; a window entirely in the padding gives 0.
Value avg_pool(Call& c, int d) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const char* what = d == 1 ? "avg_pool1d" : d == 2 ? "avg_pool2d" : "avg_pool3d";
  const DType dt = b.type(x).dtype;
  if (dt == DType::kBool) c.fail(std::string(what) + " does not support bool input");
  const Pool g = pool_geometry(c, x, d, what, false);
  const bool include_pad = c.bool_or(5, "count_include_pad", true);
  std::optional<int64_t> override_;
  if (c.has(6, "divisor_override")) {
    override_ = c.int_(6, "divisor_override");
    if (*override_ == 0) c.fail(std::string(what) + ": divisor_override must be nonzero");
  }
  Value xp = pool_pad(b, x, g, Scalar::of_int(0));
  int64_t window = 1;
  for (int64_t k : g.k) window *= k;
  Value sum;
  if (window > kMaxTreeWindow) {
    std::vector<std::vector<int64_t>> tabs(static_cast<size_t>(d));
    for (int a = 0; a < d; ++a) {
      const size_t i = static_cast<size_t>(a);
      for (int64_t o = 0; o < g.out[i]; ++o) {
        for (int64_t j = 0; j < g.k[i]; ++j) tabs[i].push_back(o * g.s[i] + j);
      }
    }
    Value win = gather_windows(b, xp, d, tabs, g.out, g.k);
    const int64_t r = b.type(win).rank();
    std::vector<int64_t> axes;
    for (int a = 0; a < d; ++a) axes.push_back(r - 2 * d + 2 * a + 1);
    const Shape xs = b.type(x).shape;
    Shape out_shape(xs.begin(), xs.end() - d);
    out_shape.insert(out_shape.end(), g.out.begin(), g.out.end());
    sum = b.reshape(b.sum(win, axes, false), out_shape);
  } else {
    std::vector<Value> cands;
    for (const auto& off : offsets(g.k)) cands.push_back(pool_candidate(b, xp, g, off));
    sum = tree(b, EwOp::k_add, cands);
  }
  // Integer inputs: PyTorch sums in the input type and divides in integers (truncating).
  auto divide = [&](Value by) {
    if (is_float(dt)) return b.ew(EwOp::k_div, sum, by);
    Value q = b.ew(EwOp::k_trunc, b.ew(EwOp::k_div, b.cast(sum, DType::kF64), b.cast(by, DType::kF64)));
    return b.cast(q, dt);
  };
  auto divide_by = [&](int64_t n) {
    return divide(b.full(is_float(dt) ? Scalar::of_float(static_cast<double>(n)) : Scalar::of_int(n), dt, {}));
  };
  if (override_) return divide_by(*override_);
  const std::vector<double> div = avg_divisors(g, include_pad);
  bool uniform = true;
  for (double v : div) uniform = uniform && v == div[0];
  if (uniform) return divide_by(static_cast<int64_t>(div[0]));
  return divide(const_float(b, is_float(dt) ? dt : DType::kF64, Shape(g.out.begin(), g.out.end()), div));
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
    if (out[static_cast<size_t>(a)] <= 0) c.fail(std::string(what) + ": output size must be positive, got " + gu::ints_str(out));
    if (in <= 0) c.fail(std::string(what) + ": input spatial dims must be non-empty, got " + c.b.type(x).str());
  }
  return out;
}

// _adaptive_avg_pool{2,3}d (1-d exports as 2-d): per axis, a reshape + sum when the windows
// tile the axis, else a Gather of the windows and a masked sum; then sum / window size.
Value adaptive_avg_pool(Call& c, int d) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const char* what = d == 1 ? "adaptive_avg_pool1d" : d == 2 ? "adaptive_avg_pool2d" : "adaptive_avg_pool3d";
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
    // Overlapping or uneven windows: gather each window ([o, L], the last position repeated up
    // to the longest window L), zero the repeats, sum. (Not a MatMul with a 0/1 matrix: its
    // zeros would spread a NaN or inf to every window.)
    int64_t len = 0;
    for (int64_t i = 0; i < o; ++i) len = std::max(len, adaptive_end(i, in, o) - adaptive_start(i, in, o));
    std::vector<int64_t> tab;
    std::vector<uint8_t> keep;
    for (int64_t i = 0; i < o; ++i) {
      for (int64_t j = 0; j < len; ++j) {
        tab.push_back(std::min(adaptive_start(i, in, o) + j, adaptive_end(i, in, o) - 1));
        keep.push_back(adaptive_start(i, in, o) + j < adaptive_end(i, in, o) ? 1 : 0);
      }
    }
    Value g = gather(b, x, axis, const_i64(b, {o, len}, tab));
    Shape ks(static_cast<size_t>(b.type(g).rank()), 1);
    ks[static_cast<size_t>(axis)] = o;
    ks[static_cast<size_t>(axis) + 1] = len;
    Value mask = constant_bytes(b, TensorType{DType::kBool, ks}, keep);
    Value zero = b.full(Scalar::of_float(0.0), dt, {});
    x = b.sum(b.ew(EwOp::k_where, {Operand::of(mask), Operand::of(g), Operand::of(zero)}), {axis + 1}, false);
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

// Windows gathered into g [lead..., o_1, L_1, ..., o_d, L_d] (L_a: window positions along
// axis a): the max over each window, and PyTorch's index of it: the first position holding
// the max, or the last NaN. `flat` [o_1, L_1, ...] holds each position's flat index in the
// input plane (int64 max for padding, which then never wins).
std::vector<Value> window_max(Builder& b, Value g, int d, Value flat, const Shape& out_shape) {
  const int64_t r = b.type(g).rank();
  const DType dt = b.type(g).dtype;
  std::vector<int64_t> win;
  for (int a = 0; a < d; ++a) win.push_back(r - 2 * d + 2 * a + 1);
  Value m = b.reduce(ReduceKind::kMax, g, win, true);
  Value idx = b.expand(flat, b.type(g).shape);
  const Scalar big = Scalar::of_int(std::numeric_limits<int64_t>::max());
  Value miss = b.full(big, DType::kI64, {});
  if (is_float(dt)) {
    miss = b.ew(EwOp::k_where, {Operand::of(b.ew(EwOp::k_isnan, g)), Operand::of(b.ew(EwOp::k_neg, idx)), Operand::of(big)});
  }
  Value key = b.ew(EwOp::k_where, {Operand::of(b.ew(EwOp::k_eq, g, m)), Operand::of(idx), Operand::of(miss)});
  key = b.reduce(ReduceKind::kMin, key, win, false);
  if (is_float(dt)) key = b.ew(EwOp::k_abs, key);
  return {b.reshape(m, out_shape), b.reshape(key, out_shape)};
}

// Gathers along each of the d trailing axes of x with tables tabs[a] ([o_a, L_a], row-major):
// x [lead..., n_1, ..., n_d] -> [lead..., o_1, L_1, ..., o_d, L_d].
Value gather_windows(Builder& b, Value x, int d, const std::vector<std::vector<int64_t>>& tabs,
                     const std::vector<int64_t>& out, const std::vector<int64_t>& len) {
  const int64_t r = b.type(x).rank();
  for (int a = 0; a < d; ++a) {
    const size_t i = static_cast<size_t>(a);
    x = gather(b, x, r - d + 2 * a, const_i64(b, {out[i], len[i]}, tabs[i]));  // earlier axes already split in two
  }
  return x;
}

// The [o_1, L_1, ..., o_d, L_d] table of flat input indices for per-axis input positions
// pos[a][o * L_a + j] (-1: padding).
Value flat_table(Builder& b, int d, const std::vector<std::vector<int64_t>>& pos, const std::vector<int64_t>& in,
                 const std::vector<int64_t>& out, const std::vector<int64_t>& len) {
  Shape shape;
  for (int a = 0; a < d; ++a) {
    shape.push_back(out[static_cast<size_t>(a)]);
    shape.push_back(len[static_cast<size_t>(a)]);
  }
  std::vector<int64_t> v(static_cast<size_t>(numel(shape)));
  for (size_t f = 0; f < v.size(); ++f) {
    int64_t rest = static_cast<int64_t>(f), flat = 0, stride = 1;
    bool pad = false;
    for (int a = d - 1; a >= 0; --a) {
      const size_t i = static_cast<size_t>(a);
      const int64_t j = rest % len[i];
      rest /= len[i];
      const int64_t o = rest % out[i];
      rest /= out[i];
      const int64_t q = pos[i][static_cast<size_t>(o * len[i] + j)];
      pad = pad || q < 0;
      flat += q * stride;
      stride *= in[i];
    }
    v[f] = pad ? std::numeric_limits<int64_t>::max() : flat;
  }
  return const_i64(b, shape, v);
}

// adaptive_max_pool{2,3}d: per axis, one Gather with an [out, L] table (window positions, the
// last one repeated up to the longest window L), then window_max.
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
  std::vector<std::vector<int64_t>> tabs(static_cast<size_t>(d));
  for (int a = 0; a < d; ++a) {
    const size_t i = static_cast<size_t>(a);
    in[i] = xs[static_cast<size_t>(r - d + a)];
    for (int64_t o = 0; o < out[i]; ++o) len[i] = std::max(len[i], adaptive_end(o, in[i], out[i]) - adaptive_start(o, in[i], out[i]));
    for (int64_t o = 0; o < out[i]; ++o) {
      for (int64_t j = 0; j < len[i]; ++j) {
        tabs[i].push_back(std::min(adaptive_start(o, in[i], out[i]) + j, adaptive_end(o, in[i], out[i]) - 1));
      }
    }
  }
  Shape out_shape(xs.begin(), xs.end() - d);
  out_shape.insert(out_shape.end(), out.begin(), out.end());
  Value g = gather_windows(b, x, d, tabs, out, len);
  return window_max(b, g, d, flat_table(b, d, tabs, in, out, len), out_shape);
}

// ---- pooling backward ---------------------------------------------------------------------

Value index_put_add(Builder& b, Value base, int64_t axis, Value idx, Value values) {
  Attrs a;
  a.axis = axis;
  a.accumulate = true;
  return b.graph().add(Op::kIndexPut, {base, idx, values}, a);
}

// The transpose of "window sums along `axis`": out[pos[t]] += v[src[t]] for each window entry
// t, over an axis of size n (src: the window of entry t, pos: its input position).
Value scatter_windows(Builder& b, Value v, int64_t axis, int64_t n, const std::vector<int64_t>& src,
                      const std::vector<int64_t>& pos) {
  const int64_t m = static_cast<int64_t>(src.size());
  Value vals = gather(b, v, axis, const_i64(b, {m}, src));
  Shape zs = b.type(v).shape;
  zs[static_cast<size_t>(axis)] = n;
  return index_put_add(b, b.full(Scalar::of_int(0), b.type(v).dtype, zs), axis, const_i64(b, {m}, pos), vals);
}

// avg_pool{2,3}d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
// count_include_pad, divisor_override): grad / divisor scattered back over each window,
// one axis at a time, in padded coordinates; then the padding is cut off.
Value avg_pool_backward(Call& c, int d) {
  Builder& b = c.b;
  Value gy = c.tensor(0, "grad_output"), x = c.tensor(1, "self");
  const char* what = d == 2 ? "avg_pool2d_backward" : "avg_pool3d_backward";
  const DType dt = b.type(x).dtype;
  if (!is_float(dt)) c.fail(std::string(what) + " needs floating-point input, got " + b.type(x).str());
  const Pool g = pool_geometry(c, x, d, what, false, 1);
  const bool include_pad = c.bool_or(6, "count_include_pad", true);
  Shape want(b.type(x).shape.begin(), b.type(x).shape.end() - d);
  want.insert(want.end(), g.out.begin(), g.out.end());
  if (b.type(gy).shape != want) c.fail(std::string(what) + ": grad_output is " + b.type(gy).str() + ", expected shape " + shape_str(want));
  if (c.has(7, "divisor_override")) {
    const int64_t v = c.int_(7, "divisor_override");
    if (v == 0) c.fail(std::string(what) + ": divisor_override must be nonzero");
    gy = b.ew(EwOp::k_div, gy, Scalar::of_float(static_cast<double>(v)));
  } else {
    gy = b.ew(EwOp::k_div, gy, const_float(b, dt, Shape(g.out.begin(), g.out.end()), avg_divisors(g, include_pad)));
  }
  const int64_t r = b.type(gy).rank();
  for (int a = 0; a < d; ++a) {
    const size_t i = static_cast<size_t>(a);
    const int64_t reach = (g.out[i] - 1) * g.s[i] + g.k[i];
    const int64_t n = std::max(reach, g.p[i] + g.in[i]);
    std::vector<int64_t> src, pos;
    for (int64_t o = 0; o < g.out[i]; ++o) {
      for (int64_t j = 0; j < g.k[i]; ++j) {
        src.push_back(o);
        pos.push_back(o * g.s[i] + j);
      }
    }
    gy = b.slice(scatter_windows(b, gy, r - d + a, n, src, pos), r - d + a, g.p[i], g.p[i] + g.in[i], 1);
  }
  return gy;
}

// max_pool{2,3}d_with_indices_backward(grad_output, self, kernel_size, stride, padding,
// dilation, ceil_mode, indices): each gradient is added at its index in its own (n, c) plane:
// one IndexPut over the flattened input.
Value max_pool_backward(Call& c, int d) {
  Builder& b = c.b;
  Value gy = c.tensor(0, "grad_output"), x = c.tensor(1, "self"), idx = c.tensor(7, "indices");
  const char* what = d == 2 ? "max_pool2d_with_indices_backward" : "max_pool3d_with_indices_backward";
  const TensorType xt = b.type(x);
  check_rank(c, x, d, what);
  if (b.type(gy).shape != b.type(idx).shape) {
    c.fail(std::string(what) + ": grad_output " + b.type(gy).str() + " and indices " + b.type(idx).str() + " differ in shape");
  }
  const Shape is = b.type(idx).shape;
  int64_t plane = 1;
  for (int a = 0; a < d; ++a) plane *= xt.shape[xt.shape.size() - static_cast<size_t>(d - a)];
  // offset of each (n, c) plane, broadcast over the output positions
  const int64_t lead = static_cast<int64_t>(is.size()) - d;
  std::vector<double> coeffs(is.size(), 0.0);
  int64_t stride = plane;
  for (int64_t a = lead - 1; a >= 0; --a) {
    coeffs[static_cast<size_t>(a)] = static_cast<double>(stride);
    stride *= is[static_cast<size_t>(a)];
  }
  Attrs at;
  at.dtype = DType::kI64;
  at.ints = is;
  at.scalar = Scalar::of_int(0);
  at.coeffs = coeffs;
  Value offset = b.graph().add(Op::kIota, {}, at);
  // An index outside its plane would land in another one: make it out of range instead.
  Value i64 = b.cast(idx, DType::kI64);
  Value bad = b.ew(EwOp::k_logical_or, b.ew(EwOp::k_lt, i64, Scalar::of_int(0)), b.ew(EwOp::k_ge, i64, Scalar::of_int(plane)));
  Value flat = b.ew(EwOp::k_where, {Operand::of(bad), Operand::of(Scalar::of_int(xt.numel())),
                                    Operand::of(b.ew(EwOp::k_add, i64, offset))});
  const int64_t m = numel(is);
  Value zeros = b.full(Scalar::of_int(0), xt.dtype, {xt.numel()});
  Value r = index_put_add(b, zeros, 0, b.reshape(flat, {m}), b.reshape(b.cast(gy, xt.dtype), {m}));
  return b.reshape(r, xt.shape);
}

// _adaptive_avg_pool{2,3}d_backward(grad_output, self): grad / window size scattered back over
// each window, one axis at a time.
Value adaptive_avg_pool_backward(Call& c, int d) {
  Builder& b = c.b;
  Value gy = c.tensor(0, "grad_output"), x = c.tensor(1, "self");
  const char* what = d == 2 ? "adaptive_avg_pool2d_backward" : "adaptive_avg_pool3d_backward";
  const TensorType xt = b.type(x);
  check_rank(c, x, d, what);
  if (!is_float(xt.dtype)) c.fail(std::string(what) + " needs floating-point input, got " + xt.str());
  const TensorType gt = b.type(gy);
  if (gt.rank() != xt.rank()) c.fail(std::string(what) + ": grad_output " + gt.str() + " does not match input " + xt.str());
  const int64_t r = xt.rank();
  for (int a = 0; a < d; ++a) {
    const int64_t axis = r - d + a;
    const int64_t in = xt.shape[static_cast<size_t>(axis)], o = gt.shape[static_cast<size_t>(axis)];
    std::vector<int64_t> src, pos;
    std::vector<double> inv;
    for (int64_t i = 0; i < o; ++i) {
      inv.push_back(static_cast<double>(adaptive_end(i, in, o) - adaptive_start(i, in, o)));
      for (int64_t j = adaptive_start(i, in, o); j < adaptive_end(i, in, o); ++j) {
        src.push_back(i);
        pos.push_back(j);
      }
    }
    gy = b.ew(EwOp::k_div, gy, const_float(b, xt.dtype, along(r, axis, o), inv));
    gy = scatter_windows(b, gy, axis, in, src, pos);
  }
  return gy;
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
  t["aten.adaptive_avg_pool1d.default"] = [](Call& c) { return one(adaptive_avg_pool(c, 1)); };
  t["aten._adaptive_avg_pool2d.default"] = [](Call& c) { return one(adaptive_avg_pool(c, 2)); };
  // Reflection and replication padding: a constant index table per padded axis. (torch.export
  // decomposes F.pad into indexing before these ops reach a graph file; graph files from other
  // producers may still carry them.)
  for (int d = 1; d <= 3; ++d) {
    const std::string n = std::to_string(d);
    t["aten.reflection_pad" + n + "d.default"] = [d](Call& c) { return one(mode_pad(c, d, true)); };
    t["aten.replication_pad" + n + "d.default"] = [d](Call& c) { return one(mode_pad(c, d, false)); };
  }
  t["aten._adaptive_avg_pool3d.default"] = [](Call& c) { return one(adaptive_avg_pool(c, 3)); };
  t["aten.adaptive_max_pool2d.default"] = [](Call& c) { return adaptive_max_pool(c, 2); };
  t["aten.adaptive_max_pool3d.default"] = [](Call& c) { return adaptive_max_pool(c, 3); };
  t["aten.avg_pool2d_backward.default"] = [](Call& c) { return one(avg_pool_backward(c, 2)); };
  t["aten.avg_pool3d_backward.default"] = [](Call& c) { return one(avg_pool_backward(c, 3)); };
  t["aten.max_pool2d_with_indices_backward.default"] = [](Call& c) { return one(max_pool_backward(c, 2)); };
  t["aten.max_pool3d_with_indices_backward.default"] = [](Call& c) { return one(max_pool_backward(c, 3)); };
  t["aten._adaptive_avg_pool2d_backward.default"] = [](Call& c) { return one(adaptive_avg_pool_backward(c, 2)); };
  t["aten._adaptive_avg_pool3d_backward.default"] = [](Call& c) { return one(adaptive_avg_pool_backward(c, 3)); };


  // F.pad(mode="circular") exports as empty + slice_scatter copies that overwrite every
  // element; the uninitialized tensor becomes zeros (of the recorded type).
  t["aten.empty.memory_format"] = [](Call& c) {
    const TensorType ty = c.out_type(0);
    return one(c.b.full(Scalar::of_int(0), ty.dtype, ty.shape));
  };
}

}  // namespace chroma
