// ATen upsampling: nearest, nearest-exact, linear, bilinear and trilinear (1-3 spatial dims,
// sizes or scale factors), and antialiased bilinear/bicubic (2 spatial dims). Each axis is a
// constant Gather (nearest), a Gather of both neighbours plus constant weights (linear), or a
// Gather of the whole window plus constant weights, summed (antialiased); the index and
// weight tables are computed here with PyTorch's own formulas and arithmetic (float for
// float32 inputs), so the tables agree with eager bit for bit.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "import/aten.h"
#include "import/graph_util.h"
#include "import/pool_util.h"

namespace chroma {
namespace {

using pool::along;
using pool::const_float;
using pool::const_i64;
using pool::gather;
using pool::take;

std::vector<Value> one(Value v) { return {v}; }

// ---- upsampling -------------------------------------------------------------------------

// Scale factors of an upsample call (per spatial dim; nullopt when not given).
struct Upsample {
  int d = 2;
  std::vector<int64_t> in, out;
  std::vector<std::optional<double>> scales;
  bool align = false;
};

std::optional<double> json_double(const json& e) {
  if (e.is_null()) return std::nullopt;
  if (e.is_number()) return e.get<double>();
  if (e.is_object() && e.contains("float") && e["float"].is_number()) return e["float"].get<double>();
  return std::nullopt;
}

// `.vec` overloads: (input, output_size?, [align_corners,] scale_factors?); `.default`:
// (self, output_size, [align_corners,] scales_1?, ..., scales_d?). The output size is the one
// the exporter recorded (PyTorch computed it from the scale factors).
Upsample upsample_args(Call& c, int d, bool vec, bool has_align, const char* what) {
  Builder& b = c.b;
  Value x = c.tensor(0, "input");
  const TensorType t = b.type(x);
  if (t.rank() != d + 2) c.fail(std::string(what) + " expects a " + std::to_string(d + 2) + "-D input, got " + t.str());
  if (!is_float(t.dtype) && std::string(what).rfind("upsample_nearest", 0) != 0) {
    c.fail(std::string(what) + " needs floating-point input, got " + t.str());
  }
  Upsample u;
  u.d = d;
  const TensorType ot = c.out_type(0);
  for (int a = 0; a < d; ++a) {
    u.in.push_back(t.shape[static_cast<size_t>(2 + a)]);
    u.out.push_back(ot.shape[static_cast<size_t>(2 + a)]);
  }
  size_t next = 2;
  if (has_align) {
    u.align = c.bool_or(2, "align_corners", false);
    next = 3;
  }
  u.scales.assign(static_cast<size_t>(d), std::nullopt);
  if (vec) {
    if (const json* j = c.get(next, "scale_factors")) {
      if (!j->is_array() || j->size() != static_cast<size_t>(d)) {
        c.fail(std::string(what) + ": scale_factors must be a list of " + std::to_string(d) + " numbers");
      }
      for (int a = 0; a < d; ++a) {
        u.scales[static_cast<size_t>(a)] = json_double((*j)[static_cast<size_t>(a)]);
        if (!u.scales[static_cast<size_t>(a)]) c.fail(std::string(what) + ": scale_factors must be numbers");
      }
    }
  } else {
    static const char* names1[] = {"scales"};
    static const char* names2[] = {"scales_h", "scales_w"};
    static const char* names3[] = {"scales_d", "scales_h", "scales_w"};
    const char** names = d == 1 ? names1 : d == 2 ? names2 : names3;
    for (int a = 0; a < d; ++a) {
      if (c.has(next + static_cast<size_t>(a), names[a])) u.scales[static_cast<size_t>(a)] = c.float_or(next + static_cast<size_t>(a), names[a], 0.0);
    }
  }
  for (int a = 0; a < d; ++a) {
    if (u.in[static_cast<size_t>(a)] <= 0 || u.out[static_cast<size_t>(a)] <= 0) {
      c.fail(std::string(what) + ": input and output sizes must be positive, got input " + t.str() + " and output " + ot.str());
    }
  }
  return u;
}

// PyTorch's area_pixel_compute_scale and area_pixel_compute_source_index (UpSample.h), in the
// kernel's opmath type T (float for float32 inputs).
template <class T>
T pixel_scale(int64_t in, int64_t out, bool align, std::optional<double> scale) {
  if (align) return out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0);
  return (scale && *scale > 0.) ? static_cast<T>(1.0 / *scale) : static_cast<T>(in) / static_cast<T>(out);
}

template <class T>
T source_index(T scale, int64_t dst, bool align, bool cubic) {
  if (align) return scale * static_cast<T>(dst);
  const T src = scale * (static_cast<T>(dst) + static_cast<T>(0.5)) - static_cast<T>(0.5);
  return (!cubic && src < T(0)) ? T(0) : src;
}

template <class T>
std::vector<int64_t> nearest_table(int64_t in, int64_t out, std::optional<double> scale, bool exact, bool shortcut) {
  const T s = pixel_scale<T>(in, out, false, scale);
  std::vector<int64_t> idx;
  for (int64_t o = 0; o < out; ++o) {
    int64_t i;
    if (shortcut && out == in) {
      i = o;  // the 2-d kernel's nearest_idx copies for scale 1 and halves for scale 2
    } else if (shortcut && out == 2 * in) {
      i = o >> 1;
    } else if (exact) {
      const T real = source_index<T>(s, o, false, false);
      i = static_cast<int64_t>(std::floor(static_cast<float>(static_cast<double>(real) + 0.5)));
    } else {
      i = static_cast<int64_t>(std::floor(static_cast<float>(source_index<T>(s, o, true, false))));
    }
    idx.push_back(std::min(i, in - 1));
  }
  return idx;
}

// upsample_nearest{1,2,3}d and _upsample_nearest_exact{1,2,3}d: a constant Gather per axis
// (a view when the table is the identity or a plain repeat).
Value upsample_nearest(Call& c, int d, bool vec, bool exact) {
  Builder& b = c.b;
  const Upsample u = upsample_args(c, d, vec, false, exact ? "upsample_nearest_exact" : "upsample_nearest");
  Value x = c.tensor(0, "input");
  const bool f64 = b.type(x).dtype == DType::kF64;
  for (int a = 0; a < d; ++a) {
    const size_t i = static_cast<size_t>(a);
    // PyTorch's 2-d nearest kernel (not 1-d/3-d, not exact) special-cases scales 1 and 2.
    const bool shortcut = d == 2 && !exact;
    const auto tab = f64 ? nearest_table<double>(u.in[i], u.out[i], u.scales[i], exact, shortcut)
                         : nearest_table<float>(u.in[i], u.out[i], u.scales[i], exact, shortcut);
    x = take(b, x, 2 + a, tab);
  }
  return x;
}

// upsample_linear1d / upsample_bilinear2d / upsample_trilinear3d: separable, innermost axis
// first (the order of PyTorch's nested interpolation): y = w0 * x[i0] + w1 * x[i1] per axis,
// with PyTorch's indices and weights (compute_source_index_and_lambda).
template <class T>
Value linear_axis(Builder& b, Value x, int64_t axis, int64_t in, int64_t out, bool align, std::optional<double> scale) {
  if (in == out) return x;  // PyTorch copies (lambda 1, 0)
  const T ratio = pixel_scale<T>(in, out, align, scale);
  std::vector<int64_t> tab;
  std::vector<double> w0, w1;
  for (int64_t o = 0; o < out; ++o) {
    const T real = source_index<T>(ratio, o, align, false);
    const int64_t i0 = std::min(static_cast<int64_t>(std::floor(static_cast<float>(real))), in - 1);
    const T l1 = std::min(std::max(real - static_cast<T>(i0), T(0)), T(1));
    const T l0 = T(1) - l1;
    tab.push_back(i0);
    tab.push_back(i0 + (i0 < in - 1 ? 1 : 0));
    w0.push_back(static_cast<double>(l0));
    w1.push_back(static_cast<double>(l1));
  }
  const DType dt = b.type(x).dtype;
  const int64_t r = b.type(x).rank();
  Value g = gather(b, x, axis, const_i64(b, {out, 2}, tab));  // [..., out, 2, ...]
  Shape s = b.type(x).shape;
  s[static_cast<size_t>(axis)] = out;
  Value g0 = b.reshape(b.slice(g, axis + 1, 0, 1, 1), s);
  Value g1 = b.reshape(b.slice(g, axis + 1, 1, 2, 1), s);
  Value c0 = const_float(b, dt, along(r, axis, out), w0);
  Value c1 = const_float(b, dt, along(r, axis, out), w1);
  return b.ew(EwOp::k_add, b.ew(EwOp::k_mul, g0, c0), b.ew(EwOp::k_mul, g1, c1));
}

Value upsample_linear(Call& c, int d, bool vec) {
  Builder& b = c.b;
  const char* what = d == 1 ? "upsample_linear1d" : d == 2 ? "upsample_bilinear2d" : "upsample_trilinear3d";
  const Upsample u = upsample_args(c, d, vec, true, what);
  Value x = c.tensor(0, "input");
  const bool f64 = b.type(x).dtype == DType::kF64;
  for (int a = d - 1; a >= 0; --a) {
    const size_t i = static_cast<size_t>(a);
    x = f64 ? linear_axis<double>(b, x, 2 + a, u.in[i], u.out[i], u.align, u.scales[i])
            : linear_axis<float>(b, x, 2 + a, u.in[i], u.out[i], u.align, u.scales[i]);
  }
  return x;
}

// ---- antialiased bilinear / bicubic (_upsample_{bilinear,bicubic}2d_aa) --------------------

// PyTorch's antialias filters (HelperInterpLinear/HelperInterpCubic::aa_filter): the triangle
// and Keys' cubic with a = -0.5, in the kernel's scalar type.
template <class T>
T aa_triangle(T x) {
  x = std::abs(x);
  return x < 1.0 ? static_cast<T>(1.0 - x) : T(0);
}
template <class T>
T aa_cubic(T x) {
  constexpr T a = T(-0.5);
  x = std::abs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return T(0);
}

// One axis of an antialiased resize: output o reads inputs index[o][0..size[o]) with weights
// weight[o][...] (zero past size[o]); K is the widest window.
struct AaTable {
  int64_t k = 0;
  std::vector<int64_t> index;  // [out, k], clamped into the input
  std::vector<double> weight;  // [out, k]
  std::vector<uint8_t> used;   // [out, k]: 1 inside the window
};

// HelperInterpBase::_compute_index_ranges_weights + _compute_indices_min_size_weights_aa, with
// the same mixed float/double promotions as the C++ source (T = float for float32 inputs).
template <class T>
AaTable aa_table(int64_t in, int64_t out, bool align, std::optional<double> scale_arg, bool cubic) {
  const int interp = cubic ? 4 : 2;
  const T scale = pixel_scale<T>(in, out, align, scale_arg);
  const T support = scale >= 1.0 ? static_cast<T>((interp * 0.5) * scale) : static_cast<T>(interp * 0.5);
  const int64_t max_size = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  const T invscale = scale >= 1.0 ? static_cast<T>(1.0 / scale) : T(1);
  std::vector<int64_t> xmin(static_cast<size_t>(out)), xsize(static_cast<size_t>(out));
  std::vector<std::vector<T>> w(static_cast<size_t>(out));
  int64_t k = 1;
  for (int64_t o = 0; o < out; ++o) {
    const size_t oi = static_cast<size_t>(o);
    const T center = static_cast<T>(scale * (static_cast<double>(o) + 0.5));
    const int64_t lo = std::max(static_cast<int64_t>(static_cast<double>(center - support) + 0.5), int64_t{0});
    int64_t n = std::min(static_cast<int64_t>(static_cast<double>(center + support) + 0.5), in) - lo;
    n = std::clamp(n, int64_t{0}, max_size);
    T total = 0;
    for (int64_t j = 0; j < n; ++j) {
      const T arg = static_cast<T>((static_cast<double>(static_cast<T>(j + lo) - center) + 0.5) * invscale);
      const T v = cubic ? aa_cubic<T>(arg) : aa_triangle<T>(arg);
      w[oi].push_back(v);
      total += v;
    }
    if (total != 0.0)
      for (T& v : w[oi]) v /= total;
    xmin[oi] = lo;
    xsize[oi] = n;
    k = std::max(k, n);
  }
  AaTable t;
  t.k = k;
  for (int64_t o = 0; o < out; ++o) {
    const size_t oi = static_cast<size_t>(o);
    for (int64_t j = 0; j < k; ++j) {
      const bool in_window = j < xsize[oi];
      t.index.push_back(std::clamp(xmin[oi] + j, int64_t{0}, in - 1));
      t.weight.push_back(in_window ? static_cast<double>(w[oi][static_cast<size_t>(j)]) : 0.0);
      t.used.push_back(in_window ? 1 : 0);
    }
  }
  return t;
}

// y[o] = sum_j x[index[o][j]] * weight[o][j] along `axis`: the window gathered as a new axis
// after `axis`, weighted (entries outside the window are zero, not 0 * x, so infinities
// elsewhere in the input stay out), then summed in window order as PyTorch does.
Value aa_axis(Builder& b, Value x, int64_t axis, const AaTable& tab, int64_t out) {
  const DType dt = b.type(x).dtype;
  const int64_t r = b.type(x).rank();
  Value g = gather(b, x, axis, const_i64(b, {out, tab.k}, tab.index));  // [..., out, k, ...]
  Shape ws(static_cast<size_t>(r + 1), 1);
  ws[static_cast<size_t>(axis)] = out;
  ws[static_cast<size_t>(axis + 1)] = tab.k;
  Value prod = b.ew(EwOp::k_mul, g, const_float(b, dt, ws, tab.weight));
  std::vector<uint8_t> used = tab.used;
  Value mask = pool::constant_bytes(b, TensorType{DType::kBool, ws}, std::move(used));
  prod = gu::where(b, mask, prod, Scalar::of_float(0.0));
  return b.sum(prod, {axis + 1}, false);
}

// _upsample_bilinear2d_aa / _upsample_bicubic2d_aa (.default and .vec): separable, the width
// first, then the height (PyTorch's order); an axis whose size does not change is left alone.
Value upsample_aa(Call& c, bool vec, bool cubic) {
  Builder& b = c.b;
  const char* what = cubic ? "_upsample_bicubic2d_aa" : "_upsample_bilinear2d_aa";
  const Upsample u = upsample_args(c, 2, vec, true, what);
  Value x = c.tensor(0, "input");
  const bool f64 = b.type(x).dtype == DType::kF64;
  for (int a = 1; a >= 0; --a) {
    const size_t i = static_cast<size_t>(a);
    if (u.in[i] == u.out[i]) continue;
    const AaTable tab = f64 ? aa_table<double>(u.in[i], u.out[i], u.align, u.scales[i], cubic)
                            : aa_table<float>(u.in[i], u.out[i], u.align, u.scales[i], cubic);
    x = aa_axis(b, x, 2 + a, tab, u.out[i]);
  }
  return x;
}

}  // namespace

void register_aten_upsample(HandlerTable& t) {
  t["aten.upsample_nearest1d.default"] = [](Call& c) { return one(upsample_nearest(c, 1, false, false)); };
  t["aten.upsample_nearest2d.default"] = [](Call& c) { return one(upsample_nearest(c, 2, false, false)); };
  t["aten.upsample_nearest3d.default"] = [](Call& c) { return one(upsample_nearest(c, 3, false, false)); };
  t["aten.upsample_nearest1d.vec"] = [](Call& c) { return one(upsample_nearest(c, 1, true, false)); };
  t["aten.upsample_nearest2d.vec"] = [](Call& c) { return one(upsample_nearest(c, 2, true, false)); };
  t["aten.upsample_nearest3d.vec"] = [](Call& c) { return one(upsample_nearest(c, 3, true, false)); };
  t["aten._upsample_nearest_exact1d.default"] = [](Call& c) { return one(upsample_nearest(c, 1, false, true)); };
  t["aten._upsample_nearest_exact2d.default"] = [](Call& c) { return one(upsample_nearest(c, 2, false, true)); };
  t["aten._upsample_nearest_exact3d.default"] = [](Call& c) { return one(upsample_nearest(c, 3, false, true)); };
  t["aten._upsample_nearest_exact1d.vec"] = [](Call& c) { return one(upsample_nearest(c, 1, true, true)); };
  t["aten._upsample_nearest_exact2d.vec"] = [](Call& c) { return one(upsample_nearest(c, 2, true, true)); };
  t["aten._upsample_nearest_exact3d.vec"] = [](Call& c) { return one(upsample_nearest(c, 3, true, true)); };
  t["aten.upsample_linear1d.default"] = [](Call& c) { return one(upsample_linear(c, 1, false)); };
  t["aten.upsample_bilinear2d.default"] = [](Call& c) { return one(upsample_linear(c, 2, false)); };
  t["aten.upsample_trilinear3d.default"] = [](Call& c) { return one(upsample_linear(c, 3, false)); };
  t["aten.upsample_linear1d.vec"] = [](Call& c) { return one(upsample_linear(c, 1, true)); };
  t["aten.upsample_bilinear2d.vec"] = [](Call& c) { return one(upsample_linear(c, 2, true)); };
  t["aten.upsample_trilinear3d.vec"] = [](Call& c) { return one(upsample_linear(c, 3, true)); };
  t["aten._upsample_bilinear2d_aa.default"] = [](Call& c) { return one(upsample_aa(c, false, false)); };
  t["aten._upsample_bilinear2d_aa.vec"] = [](Call& c) { return one(upsample_aa(c, true, false)); };
  t["aten._upsample_bicubic2d_aa.default"] = [](Call& c) { return one(upsample_aa(c, false, true)); };
  t["aten._upsample_bicubic2d_aa.vec"] = [](Call& c) { return one(upsample_aa(c, true, true)); };
}

}  // namespace chroma
