// Searching and counting: searchsorted / bucketize (a fixed number of binary-search steps, so
// the result is PyTorch's for every input, NaNs included), histc / histogram (bin positions by
// PyTorch's linear interpolation, counted with an accumulating IndexPut), nonzero_static (a
// scan of the mask gives every hit its row), dist, and _trilinear (nn.functional.bilinear).
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "import/aten.h"
#include "import/graph_util.h"

namespace chroma {
namespace {

using gu::flat;
using gu::iota;
using gu::where;
using gu::zeros;

std::vector<Value> one(Value v) { return {v}; }

Value select_where(Builder& b, Value cond, Value x, Value y) { return where(b, cond, x, y); }

// Index of `x`'s elements in the sorted last dimension of `seq` (1-D: for every element),
// PyTorch's lower bound (`right`: upper bound) binary search, step for step: while
// start < end: mid = start + (end - start) / 2; go right when !(seq[mid] >= x) (upper
// bound: !(seq[mid] > x)). ceil(log2(m + 1)) steps finish every search; finished lanes keep
// their value.
Value binary_search(Call& c, Value seq, Value x, bool right, DType out) {
  Builder& b = c.b;
  const TensorType st = b.type(seq), xt = b.type(x);
  if (st.rank() == 0) c.fail("the sorted sequence must have at least one dimension");
  const int64_t m = st.shape.back();
  const bool one_d = st.rank() == 1;
  if (!one_d) {
    if (st.rank() != xt.rank() || !std::equal(st.shape.begin(), st.shape.end() - 1, xt.shape.begin()))
      c.fail("the sorted sequence " + st.str() + " and the values " + xt.str() +
             " must have the same leading dimensions (or the sequence must be 1-D)");
  }
  const DType ct = b.promote({Operand::of(seq), Operand::of(x)});
  seq = b.cast(seq, ct);
  x = b.cast(x, ct);
  Value start = zeros(b, DType::kI64, xt.shape);
  if (m == 0 || xt.numel() == 0) return b.cast(start, out);
  Value end = b.full(Scalar::of_int(m), DType::kI64, xt.shape);
  const int steps = std::bit_width(static_cast<uint64_t>(m));
  const int64_t axis = one_d ? 0 : xt.rank() - 1;
  for (int s = 0; s < steps; ++s) {
    Value active = b.ew(EwOp::k_lt, start, end);
    Value mid = b.ew(EwOp::k_add, start, b.ew(EwOp::k_floor_divide, b.ew(EwOp::k_sub, end, start), Scalar::of_int(2)));
    Value at = b.ew(EwOp::k_minimum, mid, Scalar::of_int(m - 1));
    Attrs a;
    a.axis = axis;
    Value v;
    if (one_d) {
      v = b.graph().add(Op::kGather, {seq, xt.rank() == 0 ? b.reshape(at, {1}) : at}, a);
      if (xt.rank() == 0) v = b.reshape(v, {});
    } else {
      v = b.graph().add(Op::kGatherElements, {seq, at}, a);
    }
    Value go_right = b.ew(EwOp::k_logical_not, b.ew(right ? EwOp::k_gt : EwOp::k_ge, v, x));
    Value take_right = b.ew(EwOp::k_logical_and, active, go_right);
    Value take_left = b.ew(EwOp::k_logical_and, active, b.ew(EwOp::k_logical_not, go_right));
    start = select_where(b, take_right, b.ew(EwOp::k_add, mid, Scalar::of_int(1)), start);
    end = select_where(b, take_left, mid, end);
  }
  return b.cast(start, out);
}

bool side_right(Call& c, size_t right_pos, size_t side_pos) {
  bool right = c.bool_or(right_pos, "right", false);
  if (c.has(side_pos, "side")) {
    const std::string side = c.str_or(side_pos, "side", "left");
    if (side != "left" && side != "right") c.fail("side must be 'left' or 'right', not '" + side + "'");
    if (right && side == "left") c.fail("side='left' contradicts right=True");
    right = side == "right";
  }
  return right;
}

// searchsorted(sorted_sequence, self, *, out_int32, right, side, sorter)
std::vector<Value> searchsorted(Call& c, bool scalar_self) {
  Builder& b = c.b;
  Value seq = c.tensor(0, "sorted_sequence");
  Value x = scalar_self ? b.full(c.scalar(1, "self"), b.type(seq).dtype, {}) : c.tensor(1, "self");
  const bool right = side_right(c, 3, 4);
  if (c.is_tensor(5, "sorter")) {
    Value sorter = c.tensor(5, "sorter");
    Attrs a;
    a.axis = b.type(seq).rank() - 1;
    if (b.type(sorter).shape != b.type(seq).shape) c.fail("sorter must have the sorted sequence's shape");
    seq = b.graph().add(Op::kGatherElements, {seq, b.cast(sorter, DType::kI64)}, a);
  }
  const DType out = c.bool_or(2, "out_int32", false) ? DType::kI32 : DType::kI64;
  return one(binary_search(c, seq, x, right, out));
}

// histc / histogram bin of every element: PyTorch's linear interpolation
// (x - lo) * bins / (hi - lo) in the input type, truncated; x == hi goes to the last bin.
// With `edges` (histogram), the position is then corrected against the neighbouring edges
// (PyTorch's local search). Elements outside [lo, hi] (and NaN) get the index `bins`.
// For a half input every step is rounded to the type, as PyTorch's kernel computes it.
Value bin_index(Builder& b, Value x, Value lo, Value hi, int64_t bins, Value edges) {
  Value num = b.round_half(b.ew(EwOp::k_mul, b.round_half(b.ew(EwOp::k_sub, x, lo)),
                                b.round_half(b.full(Scalar::of_int(bins), b.type(x).dtype, {}))));
  Value q = b.round_half(b.ew(EwOp::k_div, num, b.round_half(b.ew(EwOp::k_sub, hi, lo))));
  Value pos = b.cast(b.ew(EwOp::k_trunc, q), DType::kI64);
  Value inside = b.ew(EwOp::k_logical_and, b.ew(EwOp::k_ge, x, lo), b.ew(EwOp::k_le, x, hi));
  pos = where(b, inside, pos, Scalar::of_int(0));
  if (edges.valid()) {
    // upper_bound over edges[max(0, pos - 1), min(pos + 2, bins + 1)) minus one.
    Value base = b.ew(EwOp::k_maximum, b.ew(EwOp::k_sub, pos, Scalar::of_int(1)), Scalar::of_int(0));
    Value cnt = zeros(b, DType::kI64, b.type(x).shape);
    for (int k = -1; k <= 1; ++k) {
      Value j = b.ew(EwOp::k_add, pos, Scalar::of_int(k));
      Value valid = b.ew(EwOp::k_logical_and, b.ew(EwOp::k_ge, j, Scalar::of_int(0)), b.ew(EwOp::k_le, j, Scalar::of_int(bins)));
      Value jc = b.ew(EwOp::k_minimum, b.ew(EwOp::k_maximum, j, Scalar::of_int(0)), Scalar::of_int(bins));
      Attrs a;
      a.axis = 0;
      Value e = b.graph().add(Op::kGather, {edges, jc}, a);
      Value hit = b.ew(EwOp::k_logical_and, valid, b.ew(EwOp::k_le, e, x));
      cnt = b.ew(EwOp::k_add, cnt, b.cast(hit, DType::kI64));
    }
    pos = b.ew(EwOp::k_sub, b.ew(EwOp::k_add, base, cnt), Scalar::of_int(1));
  }
  pos = b.ew(EwOp::k_minimum, pos, Scalar::of_int(bins - 1));
  return where(b, inside, pos, Scalar::of_int(bins));
}

// Counts (or sums of weights) per bin: an accumulating IndexPut into bins + 1 slots, the last
// one collecting the elements outside the range.
Value bin_counts(Builder& b, Value pos, Value weight, int64_t bins, DType t) {
  const int64_t n = b.type(pos).numel();
  Value w = weight.valid() ? b.cast(flat(b, weight), t) : b.full(Scalar::of_int(1), t, {n});
  Attrs a;
  a.axis = 0;
  a.accumulate = true;
  Value h = b.graph().add(Op::kIndexPut, {zeros(b, t, {bins + 1}), flat(b, pos), w}, a);
  return b.slice(h, 0, 0, bins, 1);
}

// torch.linspace(lo, hi, steps) in the values' type, PyTorch's symmetric formula: the first
// half counts up from lo, the second down from hi.
Value linspace(Builder& b, Value lo, Value hi, int64_t steps, DType t) {
  if (steps == 1) return b.reshape(lo, {1});
  Value step = b.ew(EwOp::k_div, b.ew(EwOp::k_sub, hi, lo), Scalar::of_float(static_cast<double>(steps - 1)));
  Value i = b.cast(iota(b, DType::kI64, {steps}, {1.0}, 0), t);
  Value up = b.ew(EwOp::k_add, lo, b.ew(EwOp::k_mul, step, i));
  Value back = b.cast(iota(b, DType::kI64, {steps}, {-1.0}, steps - 1), t);
  Value down = b.ew(EwOp::k_sub, hi, b.ew(EwOp::k_mul, step, back));
  Value first = b.ew(EwOp::k_lt, iota(b, DType::kI64, {steps}, {1.0}, 0), Scalar::of_int(steps / 2));
  return where(b, first, up, down);
}

// A density histogram: PyTorch divides by the total, then by each bin's width.
Value density(Builder& b, Value hist, Value edges) {
  const int64_t bins = b.type(hist).numel();
  Value widths = b.ew(EwOp::k_sub, b.slice(edges, 0, 1, bins + 1, 1), b.slice(edges, 0, 0, bins, 1));
  Value total = b.sum(hist, {0}, false);
  return b.ew(EwOp::k_div, b.ew(EwOp::k_div, hist, total), widths);
}

// The range of the data when none is given ([0, 1] for no data); an empty range widens by
// `pad` each side. Both ends in the input's type (rounded to it for a half input: PyTorch
// computes them in double and stores them as the first and last bin edge).
std::pair<Value, Value> data_range(Builder& b, Value x, double lo, double hi, double pad) {
  const DType t = b.type(x).dtype;
  Value l, h;
  if (lo == hi) {
    if (b.type(x).numel() == 0) {  // PyTorch's default range for no data is [0, 1]
      l = b.full(Scalar::of_float(0), t, {});
      h = b.full(Scalar::of_float(1), t, {});
    } else {
      l = b.reduce(ReduceKind::kMin, flat(b, x), {0}, false);
      h = b.reduce(ReduceKind::kMax, flat(b, x), {0}, false);
    }
  } else {
    l = b.full(Scalar::of_float(lo), t, {});
    h = b.full(Scalar::of_float(hi), t, {});
  }
  Value same = b.ew(EwOp::k_eq, l, h);
  l = where(b, same, b.ew(EwOp::k_sub, l, Scalar::of_float(pad)), l);
  h = where(b, same, b.ew(EwOp::k_add, h, Scalar::of_float(pad)), h);
  return {b.round_half(l), b.round_half(h)};
}

std::vector<Value> histc(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const DType t = b.type(x).dtype;
  if (!is_float(t)) c.fail("histc needs a floating-point tensor, got " + b.type(x).str());
  const int64_t bins = c.int_or(1, "bins", 100);
  if (bins <= 0) c.fail("bins must be positive, got " + std::to_string(bins));
  const double lo = c.float_or(2, "min", 0.0), hi = c.float_or(3, "max", 0.0);
  if (lo > hi) c.fail("max must be larger than min");
  auto [l, h] = data_range(b, x, lo, hi, 1.0);
  Value pos = bin_index(b, flat(b, x), l, h, bins, Value{});
  return one(bin_counts(b, pos, Value{}, bins, t));
}

// histogram.bin_ct(self, bins, *, range, weight, density) -> (hist, bin_edges)
std::vector<Value> histogram(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const DType t = b.type(x).dtype;
  if (!is_float(t)) c.fail("histogram needs a floating-point tensor, got " + b.type(x).str());
  const int64_t bins = c.int_or(1, "bins", 100);
  if (bins <= 0) c.fail("bins must be positive, got " + std::to_string(bins));
  double lo = 0.0, hi = 0.0;
  if (c.has(2, "range")) {
    const json* r = c.get(2, "range");
    std::vector<double> v;
    if (!r->is_array()) c.fail("range must be a list of two numbers");
    for (const auto& e : *r) {
      if (e.is_number()) v.push_back(e.get<double>());
      else if (e.is_object() && e.contains("float") && e["float"].is_number()) v.push_back(e["float"].get<double>());
      else c.fail("range must be two finite numbers");
    }
    if (v.size() != 2) c.fail("range must be two numbers");
    lo = v[0];
    hi = v[1];
    if (lo > hi) c.fail("range's max must not be smaller than its min");
  }
  auto [l, h] = data_range(b, x, lo, hi, 0.5);
  Value edges = linspace(b, l, h, bins + 1, t);
  Value le = b.reshape(b.slice(edges, 0, 0, 1, 1), {}), he = b.reshape(b.slice(edges, 0, bins, bins + 1, 1), {});
  Value pos = bin_index(b, flat(b, x), le, he, bins, edges);
  Value w = c.is_tensor(3, "weight") ? c.tensor(3, "weight") : Value{};
  if (w.valid() && b.type(w).shape != b.type(x).shape) c.fail("weight must have the input's shape");
  Value hist = bin_counts(b, pos, w, bins, t);
  if (c.bool_or(4, "density", false)) hist = density(b, hist, edges);
  return {hist, edges};
}

// histogram.bins_tensor(self, bins, *, weight, density) -> (hist, bin_edges): the edges are a
// tensor (known at run time only), so every element's bin is PyTorch's binary search,
// upper_bound(edges, x) - 1, the last bin closed on the right; elements outside
// [edges[0], edges[-1]] and NaN count nowhere.
std::vector<Value> histogram_edges(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  Value edges = c.tensor(1, "bins");
  const DType t = b.type(x).dtype;
  if (!is_float(t)) c.fail("histogram needs a floating-point tensor, got " + b.type(x).str());
  if (b.type(edges).dtype != t) c.fail("histogram: bins " + b.type(edges).str() + " must have the input's dtype " + std::string(dtype_name(t)));
  if (b.type(edges).rank() != 1 || b.type(edges).numel() < 2)
    c.fail("histogram: bins must be a 1-D tensor of at least two edges, got " + b.type(edges).str());
  const int64_t bins = b.type(edges).numel() - 1;
  Value xs = flat(b, x);
  Value ub = binary_search(c, edges, xs, /*right=*/true, DType::kI64);
  Value pos = b.ew(EwOp::k_minimum, b.ew(EwOp::k_sub, ub, Scalar::of_int(1)), Scalar::of_int(bins - 1));
  Value lo = b.reshape(b.slice(edges, 0, 0, 1, 1), {}), hi = b.reshape(b.slice(edges, 0, bins, bins + 1, 1), {});
  Value inside = b.ew(EwOp::k_logical_and, b.ew(EwOp::k_ge, xs, lo), b.ew(EwOp::k_le, xs, hi));
  pos = where(b, inside, pos, Scalar::of_int(bins));
  Value w = c.is_tensor(2, "weight") ? c.tensor(2, "weight") : Value{};
  if (w.valid() && b.type(w).shape != b.type(x).shape) c.fail("weight must have the input's shape");
  Value hist = bin_counts(b, pos, w, bins, t);
  if (c.bool_or(3, "density", false)) hist = density(b, hist, edges);
  return {hist, b.ew(EwOp::k_add, edges, Scalar::of_float(0.0))};
}

// nonzero_static(self, *, size, fill_value=-1): the first `size` hits in row-major order, one
// row of coordinates each, then fill_value rows. Hit i goes to row cumsum(mask)[i] - 1; the
// rest (misses and hits past `size`) go to a spare row that is cut off.
std::vector<Value> nonzero_static(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const TensorType xt = b.type(x);
  const int64_t size = c.int_(1, "size");
  if (size < 0) c.fail("size must be non-negative, got " + std::to_string(size));
  const int64_t fill = c.int_or(2, "fill_value", -1);
  const int64_t nd = xt.rank(), n = xt.numel();
  if (n == 0 || size == 0 || nd == 0) {
    if (nd == 0 && n == 1 && size > 0) {
      // A 0-d tensor has one element and no coordinates: rows of width 0.
      return one(b.full(Scalar::of_int(fill), DType::kI64, {size, 0}));
    }
    return one(b.full(Scalar::of_int(fill), DType::kI64, {size, nd}));
  }
  Value hit = b.ew(EwOp::k_ne, flat(b, x), Scalar::of_int(0));
  Value rank = b.ew(EwOp::k_sub, gu::scan(b, b.cast(hit, DType::kI64), 0, ReduceKind::kSum), Scalar::of_int(1));
  Value row = where(b, b.ew(EwOp::k_logical_and, hit, b.ew(EwOp::k_lt, rank, Scalar::of_int(size))), rank, Scalar::of_int(size));
  // Coordinates of flat element i: (i / stride_d) % size_d per dim.
  const Shape strides = contiguous_strides(xt.shape);
  std::vector<Value> cols;
  Value i = iota(b, DType::kI64, {n, 1}, {1.0, 0.0}, 0);
  for (int64_t d = 0; d < nd; ++d) {
    Value q = b.ew(EwOp::k_floor_divide, i, Scalar::of_int(strides[static_cast<size_t>(d)]));
    cols.push_back(b.ew(EwOp::k_remainder, q, Scalar::of_int(xt.shape[static_cast<size_t>(d)])));
  }
  Attrs ca;
  ca.axis = 1;
  Value coords = nd == 1 ? cols[0] : b.graph().add(Op::kConcat, cols, ca);
  Attrs a;
  a.axis = 0;
  Value out = b.graph().add(Op::kIndexPut, {b.full(Scalar::of_int(fill), DType::kI64, {size + 1, nd}), row, coords}, a);
  return one(b.slice(out, 0, 0, size, 1));
}

// dist(self, other, p): the p-norm of the difference over all elements.
std::vector<Value> dist(Call& c) {
  Builder& b = c.b;
  Value d = b.ew(EwOp::k_sub, c.tensor(0, "self"), c.tensor(1, "other"));
  const DType t = b.type(d).dtype;
  if (!is_float(t)) c.fail("dist needs floating-point tensors");
  const double p = c.has(2, "p") ? c.scalar(2, "p").as_double() : 2.0;
  Value a = flat(b, b.ew(EwOp::k_abs, d));
  if (b.type(a).numel() == 0) return one(b.full(Scalar::of_float(0.0), t, {}));
  if (std::isinf(p)) return one(b.reduce(p > 0 ? ReduceKind::kMax : ReduceKind::kMin, a, {0}, false));
  if (p == 0.0) return one(b.cast(b.sum(b.cast(b.ew(EwOp::k_ne, a, Scalar::of_float(0.0)), t), {0}, false), t));
  if (p == 1.0) return one(b.sum(a, {0}, false));
  if (p == 2.0) return one(b.ew(EwOp::k_sqrt, b.sum(b.ew(EwOp::k_mul, a, a), {0}, false)));
  Value s = b.sum(b.ew(EwOp::k_pow, a, Scalar::of_float(p)), {0}, false);
  return one(b.ew(EwOp::k_pow, s, Scalar::of_float(1.0 / p)));
}

// _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim) (nn.functional.bilinear):
// each input gets size-1 dims inserted at its expand positions, the three are multiplied with
// broadcasting and the sumdim dims are summed away.
std::vector<Value> trilinear(Call& c) {
  Builder& b = c.b;
  Value in[3] = {c.tensor(0, "i1"), c.tensor(1, "i2"), c.tensor(2, "i3")};
  const char* names[3] = {"expand1", "expand2", "expand3"};
  const int64_t rank = b.type(in[0]).rank() + static_cast<int64_t>(c.ints(3, "expand1").size());
  for (int k = 0; k < 3; ++k) {
    std::vector<int64_t> ex = c.ints(static_cast<size_t>(3 + k), names[k]);
    std::sort(ex.begin(), ex.end());
    const Shape& s = b.type(in[k]).shape;
    if (static_cast<int64_t>(s.size() + ex.size()) != rank) c.fail("input " + std::to_string(k + 1) + " " + b.type(in[k]).str() +
                                                                    " with its expand dims does not have rank " + std::to_string(rank));
    Shape shape;
    size_t src = 0, e = 0;
    for (int64_t d = 0; d < rank; ++d) {
      if (e < ex.size() && ex[e] == d) {
        shape.push_back(1);
        ++e;
      } else {
        shape.push_back(s[src++]);
      }
    }
    in[k] = b.reshape(in[k], shape);
  }
  Value p = b.ew(EwOp::k_mul, b.ew(EwOp::k_mul, in[0], in[1]), in[2]);
  std::vector<int64_t> sum = c.ints(6, "sumdim");
  if (sum.empty()) return one(p);
  for (auto& d : sum) d = b.dim(d, rank);
  return one(b.sum(p, sum, false));
}

// mode(self, dim, keepdim) -> (values, indices): the most frequent value along `dim` (equal
// counts: the smallest value) and the last index holding it, PyTorch's choices. Counts come
// from an n x n equality table per slice, so NaN (never equal to itself) counts once.
std::vector<Value> mode(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const TensorType t = b.type(x);
  const bool keep = c.bool_or(2, "keepdim", false);
  if (t.rank() == 0) return {x, zeros(b, DType::kI64, {})};
  const int64_t axis = b.dim(c.int_or(1, "dim", -1), t.rank());
  const int64_t n = t.shape[static_cast<size_t>(axis)];
  if (n == 0) c.fail("mode: dim " + std::to_string(axis) + " of " + t.str() + " is empty");
  // Move the axis last: xs [R..., n].
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < t.rank(); ++d)
    if (d != axis) perm.push_back(d);
  perm.push_back(axis);
  Value xs = b.permute(x, perm);
  Shape rs = b.type(xs).shape;
  Shape row = rs, col = rs;
  row.insert(row.end() - 1, 1);  // [R..., 1, n]: x_j
  col.push_back(1);              // [R..., n, 1]: x_i
  Shape sq = rs;
  sq.push_back(n);
  const int64_t last = static_cast<int64_t>(sq.size()) - 1;
  Value xi = b.expand(b.reshape(xs, col), sq), xj = b.expand(b.reshape(xs, row), sq);
  Value eq = b.ew(EwOp::k_eq, xi, xj);
  Value count = b.sum(b.cast(eq, DType::kI64), {last}, false);  // [R..., n]
  const int64_t ax = static_cast<int64_t>(rs.size()) - 1;
  Value best = b.reduce(ReduceKind::kMax, count, {ax}, true);
  Value cand = b.ew(EwOp::k_eq, count, best);
  if (is_float(t.dtype)) cand = b.ew(EwOp::k_logical_and, cand, b.ew(EwOp::k_logical_not, b.ew(EwOp::k_isnan, xs)));
  Value any = b.reduce(ReduceKind::kMax, b.cast(cand, DType::kI32), {ax}, true);
  Value v = b.reduce(ReduceKind::kMin, where(b, cand, xs, gu::highest(t.dtype)), {ax}, true);  // [R..., 1]
  if (is_float(t.dtype))
    v = where(b, b.ew(EwOp::k_gt, any, Scalar::of_int(0)), v, Scalar::of_float(std::numeric_limits<double>::quiet_NaN()));
  Value hit = b.ew(EwOp::k_eq, xs, b.expand(v, rs));
  if (is_float(t.dtype)) hit = b.ew(EwOp::k_logical_or, hit, b.ew(EwOp::k_logical_and, b.ew(EwOp::k_isnan, xs),
                                                                     b.expand(b.ew(EwOp::k_isnan, v), rs)));
  Value j = b.reduce(ReduceKind::kMax, where(b, hit, gu::axis_iota(b, rs, ax), Scalar::of_int(-1)), {ax}, true);
  // Back to the input's layout with a size-1 (or no) dim at `axis`.
  Shape out = t.shape;
  out[static_cast<size_t>(axis)] = 1;
  std::vector<int64_t> inv(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) inv[static_cast<size_t>(perm[k])] = static_cast<int64_t>(k);
  v = b.permute(v, inv);
  j = b.permute(j, inv);
  if (!keep) out.erase(out.begin() + axis);
  return {b.reshape(v, out), b.reshape(j, out)};
}

}  // namespace

void register_aten_search(HandlerTable& t) {
  t["aten.searchsorted.Tensor"] = [](Call& c) { return searchsorted(c, false); };
  t["aten.searchsorted.Scalar"] = [](Call& c) { return searchsorted(c, true); };
  t["aten.bucketize.Tensor"] = [](Call& c) {
    const DType out = c.bool_or(2, "out_int32", false) ? DType::kI32 : DType::kI64;
    return one(binary_search(c, c.tensor(1, "boundaries"), c.tensor(0, "self"), c.bool_or(3, "right", false), out));
  };
  t["aten.bucketize.Scalar"] = [](Call& c) {
    Value bounds = c.tensor(1, "boundaries");
    Value x = c.b.full(c.scalar(0, "self"), c.b.type(bounds).dtype, {});
    const DType out = c.bool_or(2, "out_int32", false) ? DType::kI32 : DType::kI64;
    return one(binary_search(c, bounds, x, c.bool_or(3, "right", false), out));
  };
  t["aten.histc.default"] = [](Call& c) { return histc(c); };
  t["aten.histogram.bin_ct"] = [](Call& c) { return histogram(c); };
  t["aten.histogram.bins_tensor"] = [](Call& c) { return histogram_edges(c); };
  t["aten.nonzero_static.default"] = [](Call& c) { return nonzero_static(c); };
  t["aten.dist.default"] = [](Call& c) { return dist(c); };
  t["aten._trilinear.default"] = [](Call& c) { return trilinear(c); };
  t["aten.mode.default"] = [](Call& c) { return mode(c); };
}

}  // namespace chroma
