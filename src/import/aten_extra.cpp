// ATen ops outside the core opset that torch.export leaves in a graph, decomposed into IR
// primitives:
//
//  * index_reduce (prod, mean, amax, amin; include_self): IndexPut with accumulate and the
//    reduction, the indexed slots first reset to the reduction's identity when the input is
//    left out; mean divides by the number of contributions.
//  * segment_reduce (lengths or offsets; sum, mean, max, min, prod; initial): each element's
//    segment is counted at run time from the segment ends (a cumulative sum of the lengths),
//    then one IndexPut with the reduction into [rows * segments + 1] slots (the last one
//    takes the elements outside every segment and is dropped).
//  * grid_sampler_3d (bilinear, nearest; zeros, border, reflection padding; align_corners):
//    unnormalized, padded coordinates and GatherElements from the flattened volume.
//  * as_strided_scatter: IndexPut of the source at the view's Iota positions in the
//    flattened input; unfold: a Gather with an Iota table, the window axis moved last.
//  * view_copy, permute_copy, unbind_copy, as_strided_copy: the view ops' handlers (values
//    are never aliased in the IR); narrow_copy: a Slice.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chroma/half.h"
#include "import/aten.h"
#include "import/graph_util.h"
#include "import/pool_util.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

Value index_put(Builder& b, Value base, int64_t axis, Value idx, Value values, bool accumulate, ReduceKind r) {
  Attrs a;
  a.axis = axis;
  a.accumulate = accumulate;
  a.reduce = r;
  // index_reduce's CPU kernel combines in the tensor's type one source element at a time: a
  // half type rounds after each (Attrs::dtype).
  if (accumulate) a.dtype = b.type(base).dtype;
  return b.graph().add(Op::kIndexPut, {base, idx, values}, a);
}

// Identity of a reduction in dtype t (infinities, or the integer extremes, for max and min).
Scalar identity(ReduceKind r, DType t) {
  switch (r) {
    case ReduceKind::kSum: return Scalar::of_int(0);
    case ReduceKind::kProd: return Scalar::of_int(1);
    case ReduceKind::kMax:
      if (is_float(t)) return Scalar::of_float(-std::numeric_limits<double>::infinity());
      if (t == DType::kI64) return Scalar::of_int(std::numeric_limits<int64_t>::min());
      if (t == DType::kI32) return Scalar::of_int(std::numeric_limits<int32_t>::min());
      if (t == DType::kI16) return Scalar::of_int(std::numeric_limits<int16_t>::min());
      if (t == DType::kI8) return Scalar::of_int(std::numeric_limits<int8_t>::min());
      return Scalar::of_int(0);
    default:
      if (is_float(t)) return Scalar::of_float(std::numeric_limits<double>::infinity());
      if (t == DType::kI64) return Scalar::of_int(std::numeric_limits<int64_t>::max());
      if (t == DType::kI32) return Scalar::of_int(std::numeric_limits<int32_t>::max());
      if (t == DType::kI16) return Scalar::of_int(std::numeric_limits<int16_t>::max());
      if (t == DType::kI8) return Scalar::of_int(std::numeric_limits<int8_t>::max());
      if (t == DType::kU8) return Scalar::of_int(255);
      return Scalar::of_int(1);
  }
}

// ---- index_reduce ---------------------------------------------------------------------------

// index_reduce(self, dim, index, source, reduce, include_self=True).
Value index_reduce(Call& c) {
  Builder& b = c.b;
  Value self = c.tensor(0, "self"), index = c.tensor(2, "index"), src = c.tensor(3, "source");
  const std::string reduce = c.str_or(4, "reduce", "");
  const bool include_self = c.bool_or(5, "include_self", true);
  const TensorType st = b.type(self), it = b.type(index), srt = b.type(src);
  ReduceKind r = ReduceKind::kSum;
  if (reduce == "prod") r = ReduceKind::kProd;
  else if (reduce == "amax") r = ReduceKind::kMax;
  else if (reduce == "amin") r = ReduceKind::kMin;
  else if (reduce != "mean") c.fail("index_reduce: reduce = '" + reduce + "' is not one of prod, mean, amax, amin");
  if (it.dtype != DType::kI64 && it.dtype != DType::kI32) c.fail("index_reduce: index must be int64 or int32, got " + it.str());
  if (it.rank() > 1) c.fail("index_reduce: index " + it.str() + " must be a vector");
  if (srt.dtype != st.dtype) c.fail("index_reduce: self " + st.str() + " and source " + srt.str() + " must have the same dtype");
  if (st.dtype == DType::kBool) c.fail("index_reduce of a bool tensor is not supported");
  const bool scalar = st.rank() == 0;
  const int64_t dim = b.dim(c.int_(1, "dim"), st.rank());
  Shape s1 = scalar ? Shape{1} : st.shape;
  Shape want = s1;
  want[static_cast<size_t>(dim)] = it.numel();
  if (srt.numel() != numel(want) || (srt.rank() > 0 && srt.shape != want) || (srt.rank() == 0 && want != Shape{1})) {
    c.fail("index_reduce: source " + srt.str() + " must have the shape of self " + st.str() + " with dim " +
           std::to_string(dim) + " of size " + std::to_string(it.numel()));
  }
  Value x = b.reshape(self, s1), v = b.reshape(src, want);
  Value idx = b.reshape(b.cast(index, DType::kI64), {it.numel()});
  // How many source entries land in each slot (int32 counts along `dim`, broadcast).
  Shape cs(s1.size(), 1);
  cs[static_cast<size_t>(dim)] = s1[static_cast<size_t>(dim)];
  Shape ones_s(s1.size(), 1);
  ones_s[static_cast<size_t>(dim)] = it.numel();
  Value hits = index_put(b, b.full(Scalar::of_int(0), DType::kI64, cs), dim, idx, b.full(Scalar::of_int(1), DType::kI64, ones_s),
                         true, ReduceKind::kSum);
  Value hit = b.ew(EwOp::k_gt, hits, Scalar::of_int(0));
  Value base = x;
  if (!include_self) {
    base = gu::where(b, b.expand(hit, s1), b.full(identity(r, st.dtype), st.dtype, s1), x);
  }
  Value out = index_put(b, base, dim, idx, v, true, r);
  if (reduce == "mean") {
    Value count = include_self ? b.ew(EwOp::k_add, hits, Scalar::of_int(1)) : b.ew(EwOp::k_maximum, hits, Scalar::of_int(1));
    count = b.expand(b.cast(count, st.dtype), s1);
    out = is_float(st.dtype) ? b.ew(EwOp::k_div, out, count) : b.ew(EwOp::k_floor_divide, out, count);
    if (!include_self) out = gu::where(b, b.expand(hit, s1), out, x);
  }
  return b.reshape(out, st.shape);
}

// ---- segment_reduce -------------------------------------------------------------------------

// segment_reduce(data, reduce, lengths=None, indices=None, offsets=None, axis=0, unsafe=False,
// initial=None): lengths / offsets are [data.shape[:axis]..., S] / [..., S + 1].
Value segment_reduce(Call& c) {
  Builder& b = c.b;
  Value data = c.tensor(0, "data");
  const std::string reduce = c.str_or(1, "reduce", "");
  const TensorType dt = b.type(data);
  if (!is_float(dt.dtype)) c.fail("segment_reduce needs floating-point data, got " + dt.str());
  if (dt.rank() == 0) c.fail("segment_reduce needs data with at least one dim, got " + dt.str());
  ReduceKind r = ReduceKind::kSum;
  if (reduce == "prod") r = ReduceKind::kProd;
  else if (reduce == "max") r = ReduceKind::kMax;
  else if (reduce == "min") r = ReduceKind::kMin;
  else if (reduce != "sum" && reduce != "mean") c.fail("segment_reduce: reduce = '" + reduce + "' is not one of sum, mean, max, min, prod");
  if (c.is_tensor(3, "indices")) c.fail("segment_reduce: the indices form is not supported (PyTorch does not implement it either)");
  const bool has_len = c.is_tensor(2, "lengths"), has_off = c.is_tensor(4, "offsets");
  if (has_len == has_off) c.fail("segment_reduce needs exactly one of lengths and offsets");
  Value seg = has_len ? c.tensor(2, "lengths") : c.tensor(4, "offsets");
  const TensorType lt = b.type(seg);
  const char* what = has_len ? "lengths" : "offsets";
  if (lt.dtype != DType::kI64 && lt.dtype != DType::kI32) c.fail(std::string("segment_reduce: ") + what + " must be int64 or int32, got " + lt.str());
  const int64_t axis = b.dim(c.int_or(5, "axis", 0), dt.rank());
  if (lt.rank() != axis + 1 || !std::equal(dt.shape.begin(), dt.shape.begin() + axis, lt.shape.begin())) {
    c.fail(std::string("segment_reduce: ") + what + " " + lt.str() + " must have the data's leading dims " + dt.str() +
           " before axis " + std::to_string(axis) + " and one more");
  }
  std::optional<Scalar> initial;
  if (c.has(7, "initial")) initial = c.scalar(7, "initial");
  int64_t rows = 1, inner = 1;
  for (int64_t a = 0; a < axis; ++a) rows *= dt.shape[static_cast<size_t>(a)];
  for (int64_t a = axis + 1; a < dt.rank(); ++a) inner *= dt.shape[static_cast<size_t>(a)];
  const int64_t p = dt.shape[static_cast<size_t>(axis)];
  const int64_t s = has_len ? lt.shape.back() : lt.shape.back() - 1;
  if (s < 0) c.fail("segment_reduce: offsets " + lt.str() + " must hold at least one value");
  Shape out_shape(dt.shape.begin(), dt.shape.begin() + axis);
  out_shape.push_back(s);
  out_shape.insert(out_shape.end(), dt.shape.begin() + axis + 1, dt.shape.end());
  if (rows * s * inner == 0) return b.full(Scalar::of_int(0), dt.dtype, out_shape);
  Value segs = b.reshape(b.cast(seg, DType::kI64), {rows, lt.shape.back()});
  // ends [rows, S] (exclusive), start [rows, 1], lengths [rows, S]
  Value ends, start, lengths;
  if (has_len) {
    Attrs sa;
    sa.axis = 1;
    sa.reduce = ReduceKind::kSum;
    lengths = segs;
    ends = b.graph().add(Op::kScan, {segs}, sa);
    start = b.full(Scalar::of_int(0), DType::kI64, {rows, 1});
  } else {
    ends = b.slice(segs, 1, 1, s + 1, 1);
    start = b.slice(segs, 1, 0, 1, 1);
    lengths = b.ew(EwOp::k_sub, ends, b.slice(segs, 1, 0, s, 1));
  }
  // element position q [1, P, 1] against the ends [rows, 1, S]: its segment is the number of
  // ends at or before it; it lies in a segment when start <= q < the last end.
  Value q = gu::iota(b, DType::kI64, {1, p, 1}, {0.0, 1.0, 0.0}, 0);
  Value id = b.sum(b.cast(b.ew(EwOp::k_le, b.reshape(ends, {rows, 1, s}), q), DType::kI64), {2}, false);  // [rows, P]
  Value q2 = b.reshape(q, {1, p});
  Value inside = b.ew(EwOp::k_logical_and, b.ew(EwOp::k_ge, q2, start), b.ew(EwOp::k_lt, q2, b.slice(ends, 1, s - 1, s, 1)));
  Value row_base = gu::iota(b, DType::kI64, {rows, 1}, {static_cast<double>(s), 0.0}, 0);
  Value slot = gu::where(b, inside, b.ew(EwOp::k_add, id, row_base), Scalar::of_int(rows * s));
  Scalar init = initial ? *initial : identity(r, dt.dtype);
  Value base = b.full(init, dt.dtype, {rows * s + 1, inner});
  Value vals = b.reshape(data, {rows * p, inner});
  Value acc = index_put(b, base, 0, b.reshape(slot, {rows * p}), vals, true, r);
  acc = b.reshape(b.slice(acc, 0, 0, rows * s, 1), {rows, s, inner});
  if (reduce == "mean") {
    Value len = b.reshape(lengths, {rows, s, 1});
    Value fl = b.cast(len, dt.dtype);
    Value empty = initial ? b.full(*initial, dt.dtype, {rows, s, inner})
                          : b.full(Scalar::of_float(std::numeric_limits<double>::quiet_NaN()), dt.dtype, {rows, s, inner});
    acc = gu::where(b, b.expand(b.ew(EwOp::k_gt, len, Scalar::of_int(0)), {rows, s, inner}), b.ew(EwOp::k_div, acc, fl), empty);
  }
  return b.reshape(acc, out_shape);
}

// ---- grid_sampler_3d ------------------------------------------------------------------------

// [-1, 1] to voxel coordinates along an axis of `size`.
Value to_pixels(Builder& b, Value g, int64_t size, bool align) {
  const double n = static_cast<double>(size);
  if (align) return b.ew(EwOp::k_mul, b.ew(EwOp::k_add, g, Scalar::of_float(1.0)), Scalar::of_float((n - 1) / 2));
  return b.ew(EwOp::k_div, b.ew(EwOp::k_sub, b.ew(EwOp::k_mul, b.ew(EwOp::k_add, g, Scalar::of_float(1.0)), Scalar::of_float(n)),
                                Scalar::of_float(1.0)),
              Scalar::of_float(2.0));
}

Value clamp_to(Builder& b, Value v, int64_t size) {
  return b.ew(EwOp::k_minimum, b.ew(EwOp::k_maximum, v, Scalar::of_float(0.0)), Scalar::of_float(static_cast<double>(size - 1)));
}

// Reflects v about lo and hi (lo < hi) until it lies in [lo, hi].
Value mirror(Builder& b, Value v, double lo, double hi) {
  const double span = hi - lo;
  Value d = b.ew(EwOp::k_abs, b.ew(EwOp::k_sub, v, Scalar::of_float(lo)));
  Value rem = b.ew(EwOp::k_fmod, d, Scalar::of_float(span));
  Value k = b.ew(EwOp::k_floor, b.ew(EwOp::k_div, d, Scalar::of_float(span)));
  Value even = b.ew(EwOp::k_eq, b.ew(EwOp::k_fmod, k, Scalar::of_float(2.0)), Scalar::of_float(0.0));
  Value fwd = b.ew(EwOp::k_add, rem, Scalar::of_float(lo));
  Value back = b.ew(EwOp::k_sub, b.full(Scalar::of_float(hi), b.type(v).dtype, b.type(v).shape), rem);
  return gu::where(b, even, fwd, back);
}

// The padding mode applied to voxel coordinates (0 zeros: unchanged, 1 border, 2 reflection).
Value padded(Builder& b, Value v, int64_t size, int64_t mode, bool align) {
  if (mode == 0) return v;
  if (mode == 2) {
    if (align) {
      v = size == 1 ? b.full(Scalar::of_int(0), b.type(v).dtype, b.type(v).shape) : mirror(b, v, 0.0, static_cast<double>(size - 1));
    } else {
      v = mirror(b, v, -0.5, static_cast<double>(size) - 0.5);
    }
  }
  return clamp_to(b, v, size);
}

// grid_sampler_3d(input [N, C, D, H, W], grid [N, Do, Ho, Wo, 3], interpolation_mode,
// padding_mode, align_corners); grid's last dim is (x, y, z) = (W, H, D).
Value grid_sampler_3d(Call& c) {
  Builder& b = c.b;
  Value input = c.tensor(0, "input"), grid = c.tensor(1, "grid");
  const int64_t interp = c.int_(2, "interpolation_mode"), mode = c.int_(3, "padding_mode");
  const bool align = c.bool_or(4, "align_corners", false);
  if (interp == 2) c.fail("grid_sampler_3d: bicubic interpolation is only defined for 4-d (2-d spatial) input");
  if (interp < 0 || interp > 1 || mode < 0 || mode > 2) {
    c.fail("grid_sampler_3d: interpolation_mode " + std::to_string(interp) + " or padding_mode " + std::to_string(mode) + " is unknown");
  }
  const TensorType it = b.type(input), gt = b.type(grid);
  if (it.rank() != 5 || gt.rank() != 5 || gt.shape[4] != 3 || gt.shape[0] != it.shape[0]) {
    c.fail("grid_sampler_3d expects input [N, C, D, H, W] and grid [N, D', H', W', 3], got " + it.str() + " and " + gt.str());
  }
  if (!is_float(it.dtype)) c.fail("grid_sampler_3d needs floating-point input, got " + it.str());
  const int64_t n = it.shape[0], ch = it.shape[1], dd = it.shape[2], hh = it.shape[3], ww = it.shape[4];
  const int64_t m = gt.shape[1] * gt.shape[2] * gt.shape[3];
  const Shape out_shape = {n, ch, gt.shape[1], gt.shape[2], gt.shape[3]};
  if (n * ch * m == 0 || dd * hh * ww == 0) return b.full(Scalar::of_int(0), it.dtype, out_shape);
  const DType ft = it.dtype;
  grid = b.cast(grid, ft);
  auto coord = [&](int64_t k, int64_t size) {
    return padded(b, to_pixels(b, b.reshape(b.slice(grid, 4, k, k + 1, 1), {n, m}), size, align), size, mode, align);
  };
  Value ix = coord(0, ww), iy = coord(1, hh), iz = coord(2, dd);
  Value src = b.reshape(input, {n, ch, dd * hh * ww});
  const Shape full = {n, ch, m};
  auto bc = [&](Value v) { return b.expand(b.reshape(v, {n, 1, m}), full); };
  auto within = [&](Value v, int64_t size) {
    return b.ew(EwOp::k_logical_and, b.ew(EwOp::k_ge, v, Scalar::of_float(0.0)),
                b.ew(EwOp::k_le, v, Scalar::of_float(static_cast<double>(size - 1))));
  };
  // The value at integer voxel (x, y, z) (float tensors [n, m]); 0 outside the volume.
  auto fetch = [&](Value x, Value y, Value z) {
    Value inb = b.ew(EwOp::k_logical_and, b.ew(EwOp::k_logical_and, within(x, ww), within(y, hh)), within(z, dd));
    Value xc = b.cast(clamp_to(b, x, ww), DType::kI64), yc = b.cast(clamp_to(b, y, hh), DType::kI64);
    Value zc = b.cast(clamp_to(b, z, dd), DType::kI64);
    Value pos = b.ew(EwOp::k_add, b.ew(EwOp::k_mul, b.ew(EwOp::k_add, b.ew(EwOp::k_mul, zc, Scalar::of_int(hh)), yc), Scalar::of_int(ww)), xc);
    Attrs a;
    a.axis = 2;
    Value v = b.graph().add(Op::kGatherElements, {src, bc(pos)}, a);
    return gu::where(b, bc(inb), v, Scalar::of_int(0));
  };
  Value out;
  if (interp == 1) {
    out = fetch(b.ew(EwOp::k_round, ix), b.ew(EwOp::k_round, iy), b.ew(EwOp::k_round, iz));
  } else {
    Value x0 = b.ew(EwOp::k_floor, ix), y0 = b.ew(EwOp::k_floor, iy), z0 = b.ew(EwOp::k_floor, iz);
    Value x1 = b.ew(EwOp::k_add, x0, Scalar::of_float(1.0)), y1 = b.ew(EwOp::k_add, y0, Scalar::of_float(1.0));
    Value z1 = b.ew(EwOp::k_add, z0, Scalar::of_float(1.0));
    // distances to the far and near corners along each axis
    Value fx = b.ew(EwOp::k_sub, x1, ix), nx = b.ew(EwOp::k_sub, ix, x0);
    Value fy = b.ew(EwOp::k_sub, y1, iy), ny = b.ew(EwOp::k_sub, iy, y0);
    Value fz = b.ew(EwOp::k_sub, z1, iz), nz = b.ew(EwOp::k_sub, iz, z0);
    const Value xs[2] = {x0, x1}, ys[2] = {y0, y1}, zs[2] = {z0, z1};
    const Value wx[2] = {fx, nx}, wy[2] = {fy, ny}, wz[2] = {fz, nz};
    for (int k = 0; k < 2; ++k) {
      for (int j = 0; j < 2; ++j) {
        for (int i = 0; i < 2; ++i) {
          Value w = b.ew(EwOp::k_mul, b.ew(EwOp::k_mul, wx[i], wy[j]), wz[k]);
          Value term = b.ew(EwOp::k_mul, fetch(xs[i], ys[j], zs[k]), bc(w));
          out = out.valid() ? b.ew(EwOp::k_add, out, term) : term;
        }
      }
    }
  }
  return b.reshape(out, out_shape);
}

// ---- strided copies, unfold -----------------------------------------------------------------

// as_strided_scatter(self, src, size, stride, storage_offset=None): self with the elements
// of its (size, stride, offset) view replaced by src.
Value as_strided_scatter(Call& c) {
  Builder& b = c.b;
  Value self = c.tensor(0, "self"), src = c.tensor(1, "src");
  const std::vector<int64_t> size = c.ints(2, "size"), stride = c.ints(3, "stride");
  const int64_t offset = c.int_or(4, "storage_offset", 0);
  const TensorType st = b.type(self), srt = b.type(src);
  if (size.size() != stride.size()) c.fail("as_strided_scatter: size " + gu::ints_str(size) + " and stride " + gu::ints_str(stride) + " differ in length");
  if (srt.shape != Shape(size.begin(), size.end())) c.fail("as_strided_scatter: src " + srt.str() + " does not have the view's size " + gu::ints_str(size));
  if (numel(Shape(size.begin(), size.end())) == 0) return self;
  int64_t last = offset;
  for (size_t d = 0; d < size.size(); ++d) {
    if (stride[d] < 0) c.fail("as_strided_scatter: negative strides " + gu::ints_str(stride) + " are not supported");
    last += (size[d] - 1) * stride[d];
  }
  if (offset < 0 || last >= st.numel()) {
    c.fail("as_strided_scatter: the view (size " + gu::ints_str(size) + ", stride " + gu::ints_str(stride) + ", offset " +
           std::to_string(offset) + ") reaches element " + std::to_string(last) + " of a tensor of " + std::to_string(st.numel()) +
           " elements");
  }
  const int64_t m = srt.numel();
  Value idx = size.empty() ? gu::iota(b, DType::kI64, {1}, {0.0}, offset)
                           : b.reshape(gu::iota(b, DType::kI64, Shape(size.begin(), size.end()), std::vector<double>(stride.begin(), stride.end()), offset), {m});
  Value out = index_put(b, b.reshape(self, {st.numel()}), 0, idx, b.reshape(b.cast(src, st.dtype), {m}), false, ReduceKind::kSum);
  return b.reshape(out, st.shape);
}

// unfold(self, dimension, size, step): windows of `size` along `dimension`, every `step`, as a
// new last dim.
Value unfold(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const TensorType t = b.type(x);
  const int64_t size = c.int_(2, "size"), step = c.int_(3, "step");
  const int64_t dim = b.dim(c.int_(1, "dimension"), t.rank());
  const int64_t n = t.rank() == 0 ? 1 : t.shape[static_cast<size_t>(dim)];
  if (step < 1) c.fail("unfold: step = " + std::to_string(step) + " must be positive");
  if (size < 0 || size > n) {
    c.fail("unfold: size = " + std::to_string(size) + " does not fit dim " + std::to_string(dim) + " of " + t.str());
  }
  if (t.rank() == 0) x = b.reshape(x, {1});
  const int64_t windows = (n - size) / step + 1;
  Shape out = t.rank() == 0 ? Shape{} : t.shape;
  if (t.rank() > 0) out[static_cast<size_t>(dim)] = windows;
  out.push_back(size);
  if (numel(out) == 0) return b.full(Scalar::of_int(0), t.dtype, out);
  Attrs a;
  a.axis = dim;
  Value g = b.graph().add(Op::kGather, {x, gu::iota(b, DType::kI64, {windows, size}, {static_cast<double>(step), 1.0}, 0)}, a);
  if (t.rank() == 0) return b.reshape(g, out);
  // [pre, windows, size, post] -> [pre, windows, post, size]
  const int64_t r = t.rank() + 1;
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < r; ++i) {
    if (i != dim + 1) perm.push_back(i);
  }
  perm.push_back(dim + 1);
  return b.permute(g, perm);
}

// narrow_copy(self, dim, start, length).
Value narrow_copy(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const TensorType t = b.type(x);
  if (t.rank() == 0) c.fail("narrow_copy: cannot narrow a 0-d tensor");
  const int64_t dim = b.dim(c.int_(1, "dim"), t.rank());
  const int64_t n = t.shape[static_cast<size_t>(dim)];
  int64_t start = c.int_(2, "start");
  const int64_t length = c.int_(3, "length");
  if (start < 0) start += n;
  if (start < 0 || start > n || length < 0 || start + length > n) {
    c.fail("narrow_copy: start " + std::to_string(c.int_(2, "start")) + " and length " + std::to_string(length) +
           " do not fit dim " + std::to_string(dim) + " of " + t.str());
  }
  return b.slice(x, dim, start, start + length, 1);
}

}  // namespace

// linspace(start, end, steps, *, dtype) with number ends (exported as is: see
// python/chroma/frontend/decompositions.py): a constant computed as PyTorch's CPU kernel does.
// The step is (end - start) / (steps - 1) in the result type (double for integer types, whose
// ends are first converted to the integer type); the first half of the values is
// start + step * i, the second end - step * (steps - 1 - i), each one fused multiply-add (the
// kernel is compiled with FMA contraction), then converted to the result type.
template <class T>
std::vector<T> linspace_values(T start, T end, int64_t steps) {
  std::vector<T> v(static_cast<size_t>(steps));
  if (steps == 1) v[0] = start;
  if (steps <= 1) return v;
  const T step = (end - start) / static_cast<T>(steps - 1);
  for (int64_t i = 0; i < steps; ++i) {
    v[static_cast<size_t>(i)] = i < steps / 2 ? std::fma(step, static_cast<T>(i), start)
                                              : std::fma(-step, static_cast<T>(steps - 1 - i), end);
  }
  return v;
}

// The same for a half type H (bf16 or f16), whose kernel computes in H's arithmetic: every
// operation rounded to H, the integer factors (steps - 1 and the index) converted to H first.
template <class H>
std::vector<double> linspace_half(double start, double end, int64_t steps) {
  auto r = [](float x) { return static_cast<float>(H(x)); };
  const float s = r(static_cast<float>(start)), e = r(static_cast<float>(end));
  std::vector<double> v(static_cast<size_t>(steps));
  if (steps == 1) v[0] = s;
  if (steps <= 1) return v;
  const float step = r(r(e - s) / r(static_cast<float>(steps - 1)));
  for (int64_t i = 0; i < steps; ++i) {
    v[static_cast<size_t>(i)] = i < steps / 2 ? r(s + r(step * r(static_cast<float>(i))))
                                              : r(e - r(step * r(static_cast<float>(steps - 1 - i))));
  }
  return v;
}

Value linspace(Call& c) {
  Builder& b = c.b;
  const DType t = c.out_type(0).dtype;
  const int64_t steps = c.int_(2, "steps");
  if (steps < 0) c.fail("linspace: steps must be non-negative, got " + std::to_string(steps));
  const Scalar s = c.scalar(0, "start"), e = c.scalar(1, "end");
  if (t == DType::kBF16) return pool::const_float(b, t, {steps}, linspace_half<bf16>(s.as_double(), e.as_double(), steps));
  if (t == DType::kF16) return pool::const_float(b, t, {steps}, linspace_half<f16>(s.as_double(), e.as_double(), steps));
  if (is_float(t)) {
    std::vector<double> v;
    if (t != DType::kF64) {  // float32
      for (float x : linspace_values<float>(static_cast<float>(s.as_double()), static_cast<float>(e.as_double()), steps)) v.push_back(x);
    } else {
      v = linspace_values<double>(s.as_double(), e.as_double(), steps);
    }
    return pool::const_float(b, t, {steps}, v);
  }
  if (is_float(t) || t == DType::kBool) c.fail("linspace into " + std::string(dtype_name(t)) + " is not supported");
  auto to_int = [](const Scalar& x) { return x.is_int ? x.i : static_cast<int64_t>(std::trunc(x.f)); };
  std::vector<int64_t> iv;
  for (double x : linspace_values<double>(static_cast<double>(to_int(s)), static_cast<double>(to_int(e)), steps))
    iv.push_back(static_cast<int64_t>(x));
  return b.cast(gu::const_i64(b, iv, {steps}), t);
}

// logspace(start, end, steps, base, *, dtype) with number ends (kept as one op: see
// python/chroma/frontend/decompositions.py), a constant computed as PyTorch's CPU kernel does:
// start and end converted to the result type T, step = double(end - start, in T) / (steps - 1),
// each value pow(base, start + step * i) in double (the second half counted down from end),
// then converted to T (half types through float32; integer types truncated). One step:
// pow(base, start) of the unconverted start.
Value logspace(Call& c) {
  Builder& b = c.b;
  const DType t = c.out_type(0).dtype;
  const int64_t steps = c.int_(2, "steps");
  if (steps < 0) c.fail("logspace: steps must be non-negative, got " + std::to_string(steps));
  const Scalar s = c.scalar(0, "start"), e = c.scalar(1, "end");
  const double base = c.float_or(3, "base", 10.0);
  double lo = s.as_double(), hi = e.as_double(), span = 0.0;
  if (t == DType::kBF16 || t == DType::kF16) {
    auto r = [t](double x) {
      return t == DType::kBF16 ? static_cast<double>(static_cast<float>(bf16(static_cast<float>(x))))
                               : static_cast<double>(static_cast<float>(f16(static_cast<float>(x))));
    };
    lo = r(lo);
    hi = r(hi);
    span = r(hi - lo);
  } else if (t == DType::kF32) {
    lo = static_cast<float>(lo);
    hi = static_cast<float>(hi);
    span = static_cast<float>(static_cast<float>(hi) - static_cast<float>(lo));
  } else if (t == DType::kF64) {
    span = hi - lo;
  } else if (t != DType::kBool) {
    auto to_int = [](const Scalar& x) { return x.is_int ? x.i : static_cast<int64_t>(std::trunc(x.f)); };
    lo = static_cast<double>(to_int(s));
    hi = static_cast<double>(to_int(e));
    span = hi - lo;
  } else {
    c.fail("logspace into bool is not supported");
  }
  std::vector<double> v(static_cast<size_t>(steps));
  if (steps == 1) v[0] = std::pow(base, s.as_double());
  const double step = steps > 1 ? span / static_cast<double>(steps - 1) : 0.0;
  for (int64_t i = 0; steps > 1 && i < steps; ++i) {
    v[static_cast<size_t>(i)] = i < steps / 2 ? std::pow(base, lo + step * static_cast<double>(i))
                                              : std::pow(base, hi - step * static_cast<double>(steps - 1 - i));
  }
  if (is_float(t)) {
    if (t != DType::kF64) {
      for (double& x : v) x = static_cast<float>(x);  // double -> float -> T, as the kernel stores it
    }
    return pool::const_float(b, t, {steps}, v);
  }
  std::vector<int64_t> iv;
  for (double x : v) {
    if (!(std::fabs(x) < 9.2e18)) c.fail("logspace: value " + std::to_string(x) + " does not fit " + std::string(dtype_name(t)));
    iv.push_back(static_cast<int64_t>(x));
  }
  return b.cast(gu::const_i64(b, iv, {steps}), t);
}

void register_aten_extra(HandlerTable& t) {
  t["aten.linspace.default"] = [](Call& c) { return one(linspace(c)); };
  t["aten.logspace.default"] = [](Call& c) { return one(logspace(c)); };
  t["aten.index_reduce.default"] = [](Call& c) { return one(index_reduce(c)); };
  t["aten.segment_reduce.default"] = [](Call& c) { return one(segment_reduce(c)); };
  t["aten.grid_sampler_3d.default"] = [](Call& c) { return one(grid_sampler_3d(c)); };
  t["aten.as_strided_scatter.default"] = [](Call& c) { return one(as_strided_scatter(c)); };
  t["aten.unfold.default"] = [](Call& c) { return one(unfold(c)); };
  t["aten.unfold_copy.default"] = [](Call& c) { return one(unfold(c)); };
  t["aten.narrow_copy.default"] = [](Call& c) { return one(narrow_copy(c)); };
  // Copies of views: the IR never aliases, so the view's handler computes the copy.
  static const std::pair<const char*, const char*> kCopies[] = {
      {"aten.view_copy.default", "aten.view.default"},
      {"aten.permute_copy.default", "aten.permute.default"},
      {"aten.unbind_copy.int", "aten.unbind.int"},
      {"aten.as_strided_copy.default", "aten.as_strided.default"}};
  for (const auto& [copy, view] : kCopies) t[copy] = t.at(view);
}

}  // namespace chroma
