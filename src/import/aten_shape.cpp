// ATen view and shape ops: view/reshape, permute/transpose, expand, slice/select,
// squeeze/unsqueeze, split, cat/stack, padding, and the value generators arange/tril/triu.
#include <algorithm>
#include <numeric>

#include "import/aten.h"
#include "import/graph_util.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

Shape infer_view_shape(Call& c, const TensorType& t, std::vector<int64_t> shape) {
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer_at >= 0) c.fail("only one dimension can be -1 in " + shape_str(shape));
      infer_at = static_cast<int64_t>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer_at >= 0) shape[static_cast<size_t>(infer_at)] = known ? t.numel() / known : 0;
  if (numel(shape) != t.numel()) c.fail("cannot view " + t.str() + " as " + shape_str(shape));
  return shape;
}

Value view(Call& c) {
  Value x = c.tensor(0, "self");
  return c.b.reshape(x, infer_view_shape(c, c.b.type(x), c.ints(1, "size")));
}

Value squeeze(Call& c, std::vector<int64_t> dims) {
  Value x = c.tensor(0, "self");
  const TensorType& t = c.b.type(x);
  if (dims.empty()) {
    for (int64_t d = 0; d < t.rank(); ++d) dims.push_back(d);
  }
  std::vector<bool> drop(static_cast<size_t>(t.rank()), false);
  for (int64_t d : dims) {
    if (t.rank() == 0) continue;
    const int64_t n = c.b.dim(d, t.rank());
    if (t.shape[static_cast<size_t>(n)] == 1) drop[static_cast<size_t>(n)] = true;
  }
  Shape out;
  for (int64_t d = 0; d < t.rank(); ++d) {
    if (!drop[static_cast<size_t>(d)]) out.push_back(t.shape[static_cast<size_t>(d)]);
  }
  return c.b.reshape(x, out);
}

std::vector<Value> split_sizes(Call& c, Value x, const std::vector<int64_t>& sizes, int64_t axis) {
  std::vector<Value> outs;
  int64_t start = 0;
  for (int64_t s : sizes) {
    outs.push_back(c.b.slice(x, axis, start, start + s, 1));
    start += s;
  }
  if (start != c.b.type(x).shape[static_cast<size_t>(axis)]) c.fail("split sizes do not add up to the dimension");
  return outs;
}

Value cat(Call& c) {
  std::vector<Value> xs = c.tensors(0, "tensors");
  // PyTorch skips legacy empty 1-D tensors and promotes dtypes.
  std::vector<Operand> ops;
  std::vector<Value> kept;
  for (Value v : xs) {
    const TensorType& t = c.b.type(v);
    if (t.rank() == 1 && t.shape[0] == 0 && xs.size() > 1) continue;
    kept.push_back(v);
    ops.push_back(Operand::of(v));
  }
  if (kept.empty()) kept.push_back(xs[0]);
  if (kept.size() == 1) return kept[0];
  const DType t = c.b.promote(ops);
  for (Value& v : kept) v = c.b.cast(v, t);
  Attrs a;
  a.axis = c.b.dim(c.int_or(1, "dim", 0), c.b.type(kept[0]).rank());
  return c.b.graph().add(Op::kConcat, kept, a);
}

Value arange(Call& c, Scalar start, Scalar end, Scalar step) {
  const bool all_int = start.is_int && end.is_int && step.is_int;
  auto ty = c.dtype(3, "dtype");
  const DType t = ty ? *ty : (all_int ? DType::kI64 : DType::kF32);
  if (step.as_double() == 0) c.fail("arange step must be nonzero");
  int64_t n;
  if (all_int) {
    // Exact for the whole int64 range: ceil((end - start) / step) in integers.
    __extension__ using i128 = __int128;  // end - start can exceed int64
    const i128 span = static_cast<i128>(end.i) - start.i;
    i128 q = span / step.i;
    if (span % step.i != 0 && ((span < 0) == (step.i < 0))) ++q;
    n = static_cast<int64_t>(q < 0 ? 0 : q);
  } else {
    n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((end.as_double() - start.as_double()) / step.as_double())));
  }
  Attrs a;
  a.scalar = start.is_int ? start : Scalar::of_float(start.f);
  a.coeffs = {step.as_double()};
  a.ints = {n};
  a.dtype = t;
  return c.b.graph().add(Op::kIota, {}, a);
}

// tril/triu: keep element (i, j) where j - i <= k (tril) or j - i >= k (triu).
Value tri(Call& c, bool upper) {
  Value x = c.tensor(0, "self");
  const int64_t k = c.int_or(1, "diagonal", 0);
  const TensorType t = c.b.type(x);
  if (t.rank() < 2) c.fail("tril/triu need at least 2 dimensions");
  const int64_t rows = t.shape[static_cast<size_t>(t.rank() - 2)], cols = t.shape.back();
  Attrs a;
  a.scalar = Scalar::of_int(0);
  a.coeffs = {-1.0, 1.0};
  a.ints = {rows, cols};
  a.dtype = DType::kI64;
  Value diff = c.b.graph().add(Op::kIota, {}, a);
  Value keep = c.b.ew(upper ? EwOp::k_ge : EwOp::k_le, diff, Scalar::of_int(k));
  Value zero = c.b.full(Scalar::of_int(0), t.dtype, {});
  return c.b.ew(EwOp::k_where, {Operand::of(keep), Operand::of(x), Operand::of(zero)}, t.dtype);
}

Value constant_pad(Call& c) {
  Value x = c.tensor(0, "self");
  std::vector<int64_t> pad = c.ints(1, "pad");
  Scalar value = c.has(2, "value") ? c.scalar(2, "value") : Scalar::of_int(0);
  if (pad.size() % 2) c.fail("pad needs an even number of values");
  const int64_t r = c.b.type(x).rank();
  for (size_t p = 0; p < pad.size() / 2; ++p) {
    const int64_t axis = r - 1 - static_cast<int64_t>(p);
    int64_t lo = pad[2 * p], hi = pad[2 * p + 1];
    // Negative padding crops.
    const int64_t n = c.b.type(x).shape[static_cast<size_t>(axis)];
    if (lo < 0 || hi < 0) {
      x = c.b.slice(x, axis, lo < 0 ? -lo : 0, hi < 0 ? n + hi : n, 1);
      lo = std::max<int64_t>(lo, 0);
      hi = std::max<int64_t>(hi, 0);
    }
    std::vector<Value> parts;
    const TensorType t = c.b.type(x);
    auto filler = [&](int64_t size) {
      Shape s = t.shape;
      s[static_cast<size_t>(axis)] = size;
      return c.b.full(value, t.dtype, s);
    };
    if (lo) parts.push_back(filler(lo));
    parts.push_back(x);
    if (hi) parts.push_back(filler(hi));
    if (parts.size() > 1) {
      Attrs a;
      a.axis = axis;
      x = c.b.graph().add(Op::kConcat, parts, a);
    }
  }
  return x;
}

}  // namespace

void register_aten_shape(HandlerTable& t) {
  for (const char* n : {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}) {
    t[n] = [](Call& c) { return one(view(c)); };
  }
  t["aten.permute.default"] = [](Call& c) { return one(c.b.permute(c.tensor(0, "self"), c.ints(1, "dims"))); };
  t["aten.transpose.int"] = [](Call& c) {
    return one(c.b.transpose(c.tensor(0, "self"), c.int_(1, "dim0"), c.int_(2, "dim1")));
  };
  t["aten.t.default"] = [](Call& c) { return one(c.b.transpose(c.tensor(0, "self"), 0, 1)); };
  t["aten.expand.default"] = [](Call& c) { return one(c.b.expand(c.tensor(0, "self"), c.ints(1, "size"))); };
  t["aten.slice.Tensor"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    const int64_t axis = c.b.dim(c.int_or(1, "dim", 0), c.b.type(x).rank());
    const int64_t n = c.b.type(x).shape[static_cast<size_t>(axis)];
    const int64_t start = c.int_or(2, "start", 0);
    int64_t end = c.int_or(3, "end", n);
    end = std::min(end, n);  // INT64_MAX stands for "to the end"
    return one(c.b.slice(x, axis, start, end, c.int_or(4, "step", 1)));
  };
  t["aten.select.int"] = [](Call& c) {
    Builder& b = c.b;
    Value x = c.tensor(0, "self");
    if (!c.is_tensor(2, "index")) return one(b.select(x, c.int_(1, "dim"), c.int_(2, "index")));
    // An index read at run time (Tensor.item(), torch.take of a 0-d tensor): a one-element
    // Gather, which raises on an out-of-range index; negative indices count from the end.
    const TensorType xt = b.type(x);
    if (xt.rank() == 0) c.fail("select of a 0-d tensor");
    const int64_t axis = b.dim(c.int_(1, "dim"), xt.rank());
    const int64_t n = xt.shape[static_cast<size_t>(axis)];
    Value i = gu::wrap_negative(b, b.reshape(c.tensor(2, "index"), {1}), n);
    Attrs a;
    a.axis = axis;
    Shape out = xt.shape;
    out.erase(out.begin() + axis);
    return one(b.reshape(b.graph().add(Op::kGather, {x, i}, a), out));
  };
  t["aten.unsqueeze.default"] = [](Call& c) { return one(c.b.unsqueeze(c.tensor(0, "self"), c.int_(1, "dim"))); };
  t["aten.squeeze.dim"] = [](Call& c) { return one(squeeze(c, {c.int_(1, "dim")})); };
  t["aten.squeeze.dims"] = [](Call& c) {
    const std::vector<int64_t> dims = c.ints(1, "dim");
    if (dims.empty()) return one(c.tensor(0, "self"));  // squeeze(x, ()) squeezes nothing
    return one(squeeze(c, dims));
  };
  // resize(self, size): the first numel(size) elements in row-major order, reshaped; growing
  // a tensor would expose uninitialized memory and is refused.
  t["aten.resize.default"] = [](Call& c) {
    Builder& b = c.b;
    Value x = c.tensor(0, "self");
    const Shape size = c.ints(1, "size");
    int64_t n = 1;
    for (int64_t d : size) {
      if (d < 0) c.fail("resize: negative size in " + gu::ints_str(size));
      n *= d;
    }
    const int64_t have = b.type(x).numel();
    if (n > have)
      c.fail("resize to " + gu::ints_str(size) + " needs " + std::to_string(n) + " elements but " + b.type(x).str() +
             " has " + std::to_string(have) + ": the new elements would be uninitialized memory");
    Value f = b.reshape(x, {have});
    if (n < have) f = b.slice(f, 0, 0, n, 1);
    return one(b.reshape(f, size));
  };
  t["aten.squeeze.default"] = [](Call& c) { return one(squeeze(c, {})); };
  t["aten.split_with_sizes.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    return split_sizes(c, x, c.ints(1, "split_sizes"), c.b.dim(c.int_or(2, "dim", 0), c.b.type(x).rank()));
  };
  t["aten.split.Tensor"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    const int64_t axis = c.b.dim(c.int_or(2, "dim", 0), c.b.type(x).rank());
    const int64_t n = c.b.type(x).shape[static_cast<size_t>(axis)], s = c.int_(1, "split_size");
    std::vector<int64_t> sizes;
    for (int64_t i = 0; i < n; i += s) sizes.push_back(std::min(s, n - i));
    return split_sizes(c, x, sizes, axis);
  };
  t["aten.unbind.int"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    const int64_t axis = c.b.dim(c.int_or(1, "dim", 0), c.b.type(x).rank());
    std::vector<Value> outs;
    for (int64_t i = 0; i < c.b.type(x).shape[static_cast<size_t>(axis)]; ++i) outs.push_back(c.b.select(x, axis, i));
    return outs;
  };
  t["aten.cat.default"] = [](Call& c) { return one(cat(c)); };
  t["aten.stack.default"] = [](Call& c) {
    std::vector<Value> xs = c.tensors(0, "tensors");
    const int64_t axis = c.b.dim(c.int_or(1, "dim", 0), c.b.type(xs[0]).rank() + 1);
    for (Value& v : xs) v = c.b.unsqueeze(v, axis);
    if (xs.size() == 1) return one(xs[0]);
    Attrs a;
    a.axis = axis;
    return one(c.b.graph().add(Op::kConcat, xs, a));
  };
  t["aten.arange.start_step"] = [](Call& c) {
    Scalar st = c.has(2, "step") ? c.scalar(2, "step") : Scalar::of_int(1);
    return one(arange(c, c.scalar(0, "start"), c.scalar(1, "end"), st));
  };
  t["aten.arange.start"] = [](Call& c) { return one(arange(c, c.scalar(0, "start"), c.scalar(1, "end"), Scalar::of_int(1))); };
  t["aten.arange.default"] = [](Call& c) { return one(arange(c, Scalar::of_int(0), c.scalar(0, "end"), Scalar::of_int(1))); };
  t["aten.flip.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    Attrs a;
    for (int64_t d : c.ints(1, "dims")) a.ints.push_back(c.b.dim(d, c.b.type(x).rank()));
    std::sort(a.ints.begin(), a.ints.end());
    a.ints.erase(std::unique(a.ints.begin(), a.ints.end()), a.ints.end());
    if (a.ints.empty() || c.b.type(x).rank() == 0) return one(x);
    return one(c.b.graph().add(Op::kFlip, {x}, a));
  };
  t["aten.roll.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    const Shape orig = c.b.type(x).shape;
    std::vector<int64_t> shifts = c.ints(1, "shifts"), dims = c.ints(2, "dims");
    if (dims.empty()) {
      x = c.b.reshape(x, {c.b.type(x).numel()});
      dims = {0};
    }
    if (shifts.size() != dims.size()) c.fail("roll needs one shift per dimension");
    for (size_t i = 0; i < dims.size(); ++i) {
      const int64_t d = c.b.dim(dims[i], c.b.type(x).rank());
      const int64_t n = c.b.type(x).shape[static_cast<size_t>(d)];
      if (n == 0) continue;
      const int64_t s = ((shifts[i] % n) + n) % n;
      if (s == 0) continue;
      Attrs a;
      a.axis = d;
      x = c.b.graph().add(Op::kConcat, {c.b.slice(x, d, n - s, n, 1), c.b.slice(x, d, 0, n - s, 1)}, a);
    }
    return one(c.b.reshape(x, orig));
  };
  t["aten.tril.default"] = [](Call& c) { return one(tri(c, false)); };
  t["aten.triu.default"] = [](Call& c) { return one(tri(c, true)); };
  t["aten.constant_pad_nd.default"] = [](Call& c) { return one(constant_pad(c)); };
  t["aten.repeat.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    std::vector<int64_t> reps = c.ints(1, "repeats");
    Shape s = c.b.type(x).shape;
    if (reps.size() < s.size()) c.fail("repeat needs at least as many repeats as dimensions");
    s.insert(s.begin(), reps.size() - s.size(), 1);
    x = c.b.reshape(x, s);
    // [a, b] repeated [r0, r1] -> expand [r0, a, r1, b] -> reshape [r0*a, r1*b]
    Shape inter, expanded, out;
    for (size_t i = 0; i < s.size(); ++i) {
      inter.push_back(1);
      inter.push_back(s[i]);
      expanded.push_back(reps[i]);
      expanded.push_back(s[i]);
      out.push_back(reps[i] * s[i]);
    }
    return one(c.b.reshape(c.b.expand(c.b.reshape(x, inter), expanded), out));
  };
}

}  // namespace chroma
