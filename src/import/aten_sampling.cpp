// Embedding bags, distances and 2-D grid sampling: _embedding_bag (sum, mean, max, with
// per-sample weights and padding_idx), embedding_renorm, _cdist_forward, _pdist_forward and
// grid_sampler_2d (bilinear, nearest, bicubic; zeros, border and reflection padding).
//
// Bags are combined with an accumulating IndexPut over each index's bag number; distances are
// p-norms of broadcast differences (or PyTorch's matrix-product form for p = 2 where PyTorch
// uses it); grid sampling gathers the taps at PyTorch's unnormalized, padded coordinates, so
// the results follow PyTorch's rounding and padding rules.
#include <cmath>
#include <string>

#include "import/aten.h"
#include "import/graph_util.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

using gu::const_i64;
using gu::flat;
using gu::iota;
using gu::lowest;
using gu::where;
using gu::zeros;

// ---- embedding_bag -------------------------------------------------------------------------------

// _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
// include_last_offset, padding_idx) -> (output, offset2bag, bag_size, max_indices).
// Bag of index i: (number of offsets <= i) - 1; rows are combined with IndexPut (sum, or max
// from -inf), mean divides by the bag's count, empty bags give 0, padding_idx rows are
// skipped. Outputs 1-3 (bookkeeping for the backward pass) are offset2bag, bag sizes and
// zeros for max_indices.
std::vector<Value> embedding_bag(Call& c) {
  Builder& b = c.b;
  Value weight = c.tensor(0, "weight");
  Value indices = b.cast(c.tensor(1, "indices"), DType::kI64);
  Value offsets = b.cast(c.tensor(2, "offsets"), DType::kI64);
  const int64_t mode = c.int_or(4, "mode", 0);
  const bool has_psw = c.has(6, "per_sample_weights");
  const bool include_last = c.bool_or(7, "include_last_offset", false);
  const int64_t padding_idx = c.int_or(8, "padding_idx", -1);
  const TensorType wt = b.type(weight);
  if (b.type(indices).rank() != 1) c.fail("embedding_bag: indices must be 1-D here, got " + b.type(indices).str());
  const int64_t n = b.type(indices).numel();
  const int64_t nb = b.type(offsets).numel() - (include_last ? 1 : 0);
  const int64_t dim = wt.shape.at(1);
  const TensorType out_t = c.out_type(0);
  if (mode < 0 || mode > 2) c.fail("embedding_bag: unknown mode " + std::to_string(mode));
  if (has_psw && mode != 0) c.fail("embedding_bag: per_sample_weights is only supported with mode 'sum'");
  std::vector<Value> extras;
  auto finish = [&](Value out, Value bag, Value count) {
    std::vector<Value> r = {out};
    for (size_t k = 1; k < 4; ++k) {
      const TensorType want = c.out_type(k);
      if (k == 1 && bag.valid() && b.type(bag) == want) r.push_back(bag);
      else if (k == 2 && count.valid() && b.type(b.cast(count, DType::kI64)) == want) r.push_back(b.cast(count, DType::kI64));
      else r.push_back(zeros(b, want.dtype, want.shape));
    }
    return r;
  };
  if (nb <= 0 || n == 0) return finish(zeros(b, out_t.dtype, out_t.shape), Value{}, Value{});
  Value offs = b.slice(offsets, 0, 0, nb, 1);
  // bag[i] = sum_j (offsets[j] <= i) - 1
  Value pos = iota(b, DType::kI64, {n, nb}, {1.0, 0.0}, 0);
  Value le = b.ew(EwOp::k_le, b.expand(b.reshape(offs, {1, nb}), {n, nb}), pos);
  Value bag = b.ew(EwOp::k_sub, b.sum(b.cast(le, DType::kI64), {1}, false), Scalar::of_int(1));
  Attrs ga;
  ga.axis = 0;
  Value rows = b.graph().add(Op::kGather, {weight, indices}, ga);  // [n, dim]
  Value valid = padding_idx >= 0 ? b.ew(EwOp::k_ne, indices, Scalar::of_int(padding_idx)) : b.full(Scalar::of_int(1), DType::kBool, {n});
  Value valid2 = b.expand(b.reshape(valid, {n, 1}), {n, dim});
  Attrs ia;
  ia.axis = 0;
  ia.accumulate = true;
  Value count = b.graph().add(Op::kIndexPut, {zeros(b, wt.dtype, {nb}), bag, b.cast(valid, wt.dtype)}, ia);
  Value out;
  if (mode == 2) {
    ia.reduce = ReduceKind::kMax;
    Value vals = where(b, valid2, rows, lowest(wt.dtype));
    out = b.graph().add(Op::kIndexPut, {b.full(lowest(wt.dtype), wt.dtype, {nb, dim}), bag, vals}, ia);
    Value nonempty = b.expand(b.reshape(b.ew(EwOp::k_gt, count, Scalar::of_int(0)), {nb, 1}), {nb, dim});
    out = where(b, nonempty, out, Scalar::of_int(0));
  } else {
    Value vals = where(b, valid2, rows, Scalar::of_int(0));
    if (has_psw) vals = b.ew(EwOp::k_mul, vals, b.expand(b.reshape(b.cast(c.tensor(6, "per_sample_weights"), wt.dtype), {n, 1}), {n, dim}));
    out = b.graph().add(Op::kIndexPut, {zeros(b, wt.dtype, {nb, dim}), bag, vals}, ia);
    if (mode == 1) {
      Value cnt = b.ew(EwOp::k_maximum, count, b.full(Scalar::of_int(1), wt.dtype, {nb}));
      out = b.ew(EwOp::k_div, out, b.expand(b.reshape(cnt, {nb, 1}), {nb, dim}));
    }
  }
  return finish(out, bag, count);
}

// embedding_renorm(weight, indices, max_norm, norm_type): rows that indices reference and
// whose norm exceeds max_norm are scaled by max_norm / (norm + 1e-7), as
// embedding(max_norm=...) does in place before the lookup.
Value pnorm_last(Builder& b, Value d, double p);
Value embedding_renorm(Call& c) {
  Builder& b = c.b;
  Value w = c.tensor(0, "self");
  Value idx = b.cast(c.tensor(1, "indices"), DType::kI64);
  const double max_norm = c.float_or(2, "max_norm", 0.0);
  const double p = c.float_or(3, "norm_type", 2.0);
  const TensorType wt = b.type(w);
  if (wt.rank() != 2) c.fail("embedding_renorm needs a 2-D weight, got " + wt.str());
  const int64_t n = b.type(idx).numel(), rows = wt.shape[0], d = wt.shape[1];
  if (n == 0 || wt.numel() == 0) return w;
  Attrs a;
  a.axis = 0;
  Value used = b.graph().add(Op::kIndexPut, {zeros(b, DType::kBool, {rows}), flat(b, idx), b.full(Scalar::of_int(1), DType::kBool, {n})}, a);
  Value norm = pnorm_last(b, w, p);
  Value scale = b.ew(EwOp::k_div, b.full(Scalar::of_float(max_norm), wt.dtype, {rows}), b.ew(EwOp::k_add, norm, Scalar::of_float(1e-7)));
  Value cond = b.ew(EwOp::k_logical_and, used, b.ew(EwOp::k_gt, norm, Scalar::of_float(max_norm)));
  auto rowwise = [&](Value v) { return b.expand(b.reshape(v, {rows, 1}), {rows, d}); };
  return where(b, rowwise(cond), b.ew(EwOp::k_mul, w, rowwise(scale)), w);
}

// ---- distances -------------------------------------------------------------------------------

// The p-norm over the last axis of d (differences), as PyTorch's cdist/pdist define it.
Value pnorm_last(Builder& b, Value d, double p) {
  const int64_t last = b.type(d).rank() - 1;
  if (p == 0.0) return b.sum(b.cast(b.ew(EwOp::k_ne, d, Scalar::of_int(0)), b.type(d).dtype), {last}, false);
  Value a = b.ew(EwOp::k_abs, d);
  if (std::isinf(p)) return b.reduce(ReduceKind::kMax, a, {last}, false);
  if (p == 1.0) return b.sum(a, {last}, false);
  if (p == 2.0) return b.ew(EwOp::k_sqrt, b.sum(b.ew(EwOp::k_mul, a, a), {last}, false));
  return b.ew(EwOp::k_pow, b.sum(b.ew(EwOp::k_pow, a, Scalar::of_float(p)), {last}, false), Scalar::of_float(1.0 / p));
}

// _cdist_forward(x1 [.., P, M], x2 [.., R, M], p, compute_mode) -> [.., P, R]. p = 2 uses the
// matrix-product form exactly when PyTorch does (compute_mode 1, or 0/None with P or R > 25).
Value cdist(Call& c) {
  Builder& b = c.b;
  Value x1 = c.tensor(0, "x1");
  Value x2 = c.tensor(1, "x2");
  const double p = c.float_or(2, "p", 2.0);
  const int64_t mode = c.int_or(3, "compute_mode", 0);
  if (p < 0) c.fail("cdist only supports non-negative p values");
  const TensorType t1 = b.type(x1), t2 = b.type(x2);
  const TensorType ot = c.out_type(0);
  if (ot.numel() == 0) return zeros(b, ot.dtype, ot.shape);
  const int64_t r1 = t1.shape[t1.shape.size() - 2], r2 = t2.shape[t2.shape.size() - 2];
  const int64_t m = t1.shape.back();
  Shape batch(ot.shape.begin(), ot.shape.end() - 2);
  Shape s1 = batch, s2 = batch;
  s1.insert(s1.end(), {r1, m});
  s2.insert(s2.end(), {r2, m});
  x1 = b.expand(x1, s1);
  x2 = b.expand(x2, s2);
  if (m == 0) return zeros(b, ot.dtype, ot.shape);
  if (p == 2.0 && (mode == 1 || (mode == 0 && (r1 > 25 || r2 > 25)))) {
    const int64_t r = static_cast<int64_t>(s1.size());
    Value n1 = b.sum(b.ew(EwOp::k_pow, x1, Scalar::of_int(2)), {r - 1}, true);
    Value n2 = b.sum(b.ew(EwOp::k_pow, x2, Scalar::of_int(2)), {r - 1}, true);
    Value a1 = c.b.graph().add(Op::kConcat, {b.ew(EwOp::k_mul, x1, Scalar::of_int(-2)), n1, b.full(Scalar::of_int(1), t1.dtype, b.type(n1).shape)}, [&] { Attrs a; a.axis = r - 1; return a; }());
    Value a2 = c.b.graph().add(Op::kConcat, {x2, b.full(Scalar::of_int(1), t2.dtype, b.type(n2).shape), n2}, [&] { Attrs a; a.axis = r - 1; return a; }());
    Value prod = b.matmul(a1, b.transpose(a2, -1, -2));
    return b.ew(EwOp::k_sqrt, b.ew(EwOp::k_maximum, prod, Scalar::of_int(0)));
  }
  Shape big = batch;
  big.insert(big.end(), {r1, r2, m});
  Value d = b.ew(EwOp::k_sub, b.expand(b.unsqueeze(x1, -2), big), b.expand(b.unsqueeze(x2, -3), big));
  return pnorm_last(b, d, p);
}

// _pdist_forward(x [N, M], p) -> [N (N - 1) / 2]: rows i < j in row-major order.
Value pdist(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const double p = c.float_or(1, "p", 2.0);
  const TensorType t = b.type(x);
  if (t.rank() != 2) c.fail("pdist only supports 2-D tensors, got " + t.str());
  const int64_t n = t.shape[0];
  std::vector<int64_t> ii, jj;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = i + 1; j < n; ++j) {
      ii.push_back(i);
      jj.push_back(j);
    }
  }
  const int64_t k = static_cast<int64_t>(ii.size());
  if (k == 0 || t.shape[1] == 0) return zeros(b, t.dtype, {k});
  Attrs a;
  a.axis = 0;
  Value xi = b.graph().add(Op::kGather, {x, const_i64(b, ii, {k})}, a);
  Value xj = b.graph().add(Op::kGather, {x, const_i64(b, jj, {k})}, a);
  return pnorm_last(b, b.ew(EwOp::k_sub, xi, xj), p);
}

// ---- grid_sampler_2d ---------------------------------------------------------------------------

// PyTorch's reflect_coordinates: reflect `in` into [twice_low / 2, twice_high / 2].
Value reflect(Builder& b, Value in, int64_t twice_low, int64_t twice_high) {
  if (twice_low == twice_high) return b.full(Scalar::of_int(0), b.type(in).dtype, b.type(in).shape);
  const double mn = static_cast<double>(twice_low) / 2, span = static_cast<double>(twice_high - twice_low) / 2;
  Value a = b.ew(EwOp::k_abs, b.ew(EwOp::k_sub, in, Scalar::of_float(mn)));
  Value extra = b.ew(EwOp::k_fmod, a, Scalar::of_float(span));
  Value flips = b.ew(EwOp::k_floor, b.ew(EwOp::k_div, a, Scalar::of_float(span)));
  Value even = b.ew(EwOp::k_eq, b.ew(EwOp::k_fmod, flips, Scalar::of_float(2.0)), Scalar::of_float(0.0));
  Value up = b.ew(EwOp::k_add, extra, Scalar::of_float(mn));
  Value down = b.ew(EwOp::k_add, b.ew(EwOp::k_sub, b.full(Scalar::of_float(span), b.type(in).dtype, b.type(in).shape), extra), Scalar::of_float(mn));
  return where(b, even, up, down);
}

Value clip(Builder& b, Value v, int64_t size) {
  Value lo = b.ew(EwOp::k_maximum, v, Scalar::of_float(0.0));
  return b.ew(EwOp::k_minimum, lo, Scalar::of_float(static_cast<double>(size - 1)));
}

// grid_sampler_unnormalize: [-1, 1] to pixel coordinates.
Value unnormalize(Builder& b, Value coord, int64_t size, bool align) {
  if (align) {
    return b.ew(EwOp::k_mul, b.ew(EwOp::k_div, b.ew(EwOp::k_add, coord, Scalar::of_float(1.0)), Scalar::of_float(2.0)),
                Scalar::of_float(static_cast<double>(size - 1)));
  }
  return b.ew(EwOp::k_div, b.ew(EwOp::k_sub, b.ew(EwOp::k_mul, b.ew(EwOp::k_add, coord, Scalar::of_float(1.0)), Scalar::of_float(static_cast<double>(size))), Scalar::of_float(1.0)),
              Scalar::of_float(2.0));
}

// compute_coordinates: the padding mode applied to pixel coordinates.
Value pad_coordinates(Builder& b, Value v, int64_t size, int64_t padding, bool align) {
  if (padding == 1) return clip(b, v, size);
  if (padding == 2) {
    v = align ? reflect(b, v, 0, 2 * (size - 1)) : reflect(b, v, -1, 2 * size - 1);
    return clip(b, v, size);
  }
  return v;
}

// Cubic convolution weights of PyTorch's upsampling (A = -0.75) for the four taps around t.
std::vector<Value> cubic_coefficients(Builder& b, Value t) {
  const double A = -0.75;
  auto conv1 = [&](Value x) {  // ((A + 2) x - (A + 3)) x x + 1
    Value r = b.ew(EwOp::k_sub, b.ew(EwOp::k_mul, x, Scalar::of_float(A + 2)), Scalar::of_float(A + 3));
    return b.ew(EwOp::k_add, b.ew(EwOp::k_mul, b.ew(EwOp::k_mul, r, x), x), Scalar::of_float(1.0));
  };
  auto conv2 = [&](Value x) {  // ((A x - 5A) x + 8A) x - 4A
    Value r = b.ew(EwOp::k_sub, b.ew(EwOp::k_mul, x, Scalar::of_float(A)), Scalar::of_float(5 * A));
    r = b.ew(EwOp::k_add, b.ew(EwOp::k_mul, r, x), Scalar::of_float(8 * A));
    return b.ew(EwOp::k_sub, b.ew(EwOp::k_mul, r, x), Scalar::of_float(4 * A));
  };
  auto minus = [&](double a) { return b.ew(EwOp::k_sub, b.full(Scalar::of_float(a), b.type(t).dtype, b.type(t).shape), t); };
  return {conv2(b.ew(EwOp::k_add, t, Scalar::of_float(1.0))), conv1(t), conv1(minus(1.0)), conv2(minus(2.0))};
}

Value grid_sampler_2d(Call& c) {
  Builder& b = c.b;
  Value input = c.tensor(0, "input");
  Value grid = c.tensor(1, "grid");
  const int64_t interp = c.int_(2, "interpolation_mode");
  const int64_t padding = c.int_(3, "padding_mode");
  const bool align = c.bool_or(4, "align_corners", false);
  if (interp < 0 || interp > 2 || padding < 0 || padding > 2) c.fail("grid_sampler_2d: unknown interpolation or padding mode");
  const TensorType it = b.type(input), gt = b.type(grid);
  if (it.rank() != 4 || gt.rank() != 4 || gt.shape[3] != 2) c.fail("grid_sampler_2d: expects input [N, C, H, W] and grid [N, H, W, 2]");
  const int64_t n = it.shape[0], ch = it.shape[1], h = it.shape[2], w = it.shape[3];
  const int64_t ho = gt.shape[1], wo = gt.shape[2];
  const TensorType ot = c.out_type(0);
  if (ot.numel() == 0) return zeros(b, ot.dtype, ot.shape);
  if (h * w == 0) return zeros(b, ot.dtype, ot.shape);
  const DType ft = it.dtype;
  grid = b.cast(grid, ft);
  Value gx = b.reshape(b.slice(grid, 3, 0, 1, 1), {n, ho * wo});
  Value gy = b.reshape(b.slice(grid, 3, 1, 2, 1), {n, ho * wo});
  Value ux = unnormalize(b, gx, w, align), uy = unnormalize(b, gy, h, align);
  Value ix = pad_coordinates(b, ux, w, padding, align);
  Value iy = pad_coordinates(b, uy, h, padding, align);
  Value src = b.reshape(input, {n, ch, h * w});
  const Shape full = {n, ch, ho * wo};
  // Value at integer coordinates (xi, yi) (float tensors [n, ho wo]), 0 outside the image.
  auto fetch = [&](Value xi, Value yi) {
    Value inb = b.ew(EwOp::k_logical_and,
                     b.ew(EwOp::k_logical_and, b.ew(EwOp::k_ge, xi, Scalar::of_float(0.0)), b.ew(EwOp::k_le, xi, Scalar::of_float(static_cast<double>(w - 1)))),
                     b.ew(EwOp::k_logical_and, b.ew(EwOp::k_ge, yi, Scalar::of_float(0.0)), b.ew(EwOp::k_le, yi, Scalar::of_float(static_cast<double>(h - 1)))));
    Value xc = b.cast(clip(b, xi, w), DType::kI64);
    Value yc = b.cast(clip(b, yi, h), DType::kI64);
    Value pos = b.ew(EwOp::k_add, b.ew(EwOp::k_mul, yc, Scalar::of_int(w)), xc);
    pos = b.expand(b.reshape(where(b, inb, pos, Scalar::of_int(0)), {n, 1, ho * wo}), full);
    Attrs a;
    a.axis = 2;
    Value v = b.graph().add(Op::kGatherElements, {src, pos}, a);
    return where(b, b.expand(b.reshape(inb, {n, 1, ho * wo}), full), v, Scalar::of_int(0));
  };
  auto bc = [&](Value v) { return b.expand(b.reshape(v, {n, 1, ho * wo}), full); };
  Value out;
  if (interp == 1) {
    out = fetch(b.ew(EwOp::k_round, ix), b.ew(EwOp::k_round, iy));
  } else if (interp == 2) {
    // Bicubic: 4x4 taps around the unpadded coordinate, each tap's coordinates padded on
    // their own (PyTorch's get_value_bounded), rows then columns combined.
    Value x0 = b.ew(EwOp::k_floor, ux), y0 = b.ew(EwOp::k_floor, uy);
    std::vector<Value> cx = cubic_coefficients(b, b.ew(EwOp::k_sub, ux, x0));
    std::vector<Value> cy = cubic_coefficients(b, b.ew(EwOp::k_sub, uy, y0));
    for (int i = 0; i < 4; ++i) {
      Value yi = pad_coordinates(b, b.ew(EwOp::k_add, y0, Scalar::of_float(i - 1.0)), h, padding, align);
      Value row;
      for (int j = 0; j < 4; ++j) {
        Value xj = pad_coordinates(b, b.ew(EwOp::k_add, x0, Scalar::of_float(j - 1.0)), w, padding, align);
        Value term = b.ew(EwOp::k_mul, fetch(xj, yi), bc(cx[static_cast<size_t>(j)]));
        row = row.valid() ? b.ew(EwOp::k_add, row, term) : term;
      }
      Value term = b.ew(EwOp::k_mul, row, bc(cy[static_cast<size_t>(i)]));
      out = out.valid() ? b.ew(EwOp::k_add, out, term) : term;
    }
  } else {
    Value x0 = b.ew(EwOp::k_floor, ix), y0 = b.ew(EwOp::k_floor, iy);
    Value x1 = b.ew(EwOp::k_add, x0, Scalar::of_float(1.0)), y1 = b.ew(EwOp::k_add, y0, Scalar::of_float(1.0));
    Value wx = b.ew(EwOp::k_sub, ix, x0), wy = b.ew(EwOp::k_sub, iy, y0);
    Value ex = b.ew(EwOp::k_sub, b.full(Scalar::of_float(1.0), ft, b.type(wx).shape), wx);
    Value sy = b.ew(EwOp::k_sub, b.full(Scalar::of_float(1.0), ft, b.type(wy).shape), wy);
    Value nw = b.ew(EwOp::k_mul, sy, ex), ne = b.ew(EwOp::k_mul, sy, wx);
    Value sw = b.ew(EwOp::k_mul, wy, ex), se = b.ew(EwOp::k_mul, wy, wx);
    out = b.ew(EwOp::k_mul, fetch(x0, y0), bc(nw));
    out = b.ew(EwOp::k_add, out, b.ew(EwOp::k_mul, fetch(x1, y0), bc(ne)));
    out = b.ew(EwOp::k_add, out, b.ew(EwOp::k_mul, fetch(x0, y1), bc(sw)));
    out = b.ew(EwOp::k_add, out, b.ew(EwOp::k_mul, fetch(x1, y1), bc(se)));
  }
  return b.reshape(out, {n, ch, ho, wo});
}

}  // namespace

void register_aten_sampling(HandlerTable& t) {
  t["aten._embedding_bag.default"] = [](Call& c) { return embedding_bag(c); };
  t["aten._embedding_bag_forward_only.default"] = [](Call& c) { return embedding_bag(c); };
  t["aten.embedding_renorm.default"] = [](Call& c) { return one(embedding_renorm(c)); };
  t["aten._cdist_forward.default"] = [](Call& c) { return one(cdist(c)); };
  t["aten._pdist_forward.default"] = [](Call& c) { return one(pdist(c)); };
  t["aten.grid_sampler_2d.default"] = [](Call& c) { return one(grid_sampler_2d(c)); };
}

}  // namespace chroma
