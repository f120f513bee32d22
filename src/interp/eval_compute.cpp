// Reference kernels for the primitives that compute new values from many inputs: Reduce,
// ArgReduce, MatMul, TopK, Scan.
//
// Accumulation: float types accumulate in double; integer types accumulate in uint64_t, so
// overflow wraps modulo 2^64 (well defined) before the final conversion to the dtype, like
// the wrap-around PyTorch's integer kernels show in practice.
#include "chroma/cpu/scalar.h"
#include <limits>
#include <algorithm>
#include <numeric>
#include <string>
#include <type_traits>

#include "interp/kernels.h"

namespace chroma::interp {
namespace {

// The accumulator type for sums and products of T.
template <class T>
using Acc = std::conditional_t<std::is_floating_point_v<T>, double, uint64_t>;

template <class T> T reduce_row(ReduceKind kind, const T* row, int64_t count) {
  switch (kind) {
    case ReduceKind::kSum: {
      if constexpr (std::is_same_v<T, bool>) {
        for (int64_t j = 0; j < count; ++j) {
          if (row[j]) return true;
        }
        return false;
      } else {
        Acc<T> acc = 0;
        for (int64_t j = 0; j < count; ++j) acc += static_cast<Acc<T>>(row[j]);
        return static_cast<T>(acc);
      }
    }
    case ReduceKind::kProd: {
      if constexpr (std::is_same_v<T, bool>) {
        for (int64_t j = 0; j < count; ++j) {
          if (!row[j]) return false;
        }
        return true;
      } else {
        Acc<T> acc = 1;
        for (int64_t j = 0; j < count; ++j) acc *= static_cast<Acc<T>>(row[j]);
        return static_cast<T>(acc);
      }
    }
    case ReduceKind::kMax:
    case ReduceKind::kMin: {
      const bool is_max = kind == ReduceKind::kMax;
      T best = row[0];
      if (is_nan(best)) return best;
      for (int64_t j = 1; j < count; ++j) {
        const T v = row[j];
        if (is_nan(v)) return v;
        if (is_max ? best < v : v < best) best = v;
      }
      return best;
    }
  }
  throw CompileError("internal: unknown reduction");
}

// Strict weak order for TopK: a comes before b. NaN is the largest value; equal values keep
// index order.
template <class T> bool topk_before(T va, int64_t ia, T vb, int64_t ib, bool largest) {
  const bool na = is_nan(va), nb = is_nan(vb);
  if (na != nb) return largest ? na : nb;
  if (!na && va != vb) return largest ? vb < va : va < vb;
  return ia < ib;
}

}  // namespace

Tensors eval_Reduce(const Node& n, const Tensors& in) {
  const Tensor& x = in[0];
  const Shape& shape = x.type.shape;
  const Shape strides = contiguous_strides(shape);
  std::vector<bool> reduced(shape.size(), false);
  for (int64_t ax : n.attrs.ints) {
    if (ax < 0 || ax >= x.type.rank()) throw CompileError("reduction axis " + std::to_string(ax) + " out of range");
    reduced[static_cast<size_t>(ax)] = true;
  }
  // View the input as [kept dims..., reduced dims...] so each output element reduces one
  // contiguous row of `count` elements.
  Shape view_shape, view_strides, red_shape, red_strides;
  bool reordered = false, seen_reduced = false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (reduced[d]) {
      red_shape.push_back(shape[d]);
      red_strides.push_back(strides[d]);
      seen_reduced = true;
    } else {
      view_shape.push_back(shape[d]);
      view_strides.push_back(strides[d]);
      if (seen_reduced) reordered = true;
    }
  }
  const int64_t count = numel(red_shape);
  if (count == 0 && (n.attrs.reduce == ReduceKind::kMax || n.attrs.reduce == ReduceKind::kMin)) {
    throw CompileError("cannot take the " + std::string(reduce_name(n.attrs.reduce)) + " of an empty set of elements");
  }
  view_shape.insert(view_shape.end(), red_shape.begin(), red_shape.end());
  view_strides.insert(view_strides.end(), red_strides.begin(), red_strides.end());
  const Tensor dense = reordered ? materialize(x, view_shape, view_strides, 0) : x;
  OutBuffer out(n.type());
  const int64_t out_count = n.type().numel();
  dispatch_dtype(x.type.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = dense.data<T>();
    T* o = out.data<T>();
    for (int64_t i = 0; i < out_count; ++i) o[i] = reduce_row<T>(n.attrs.reduce, p + i * count, count);
  });
  return {out.finish()};
}

// Mirrors chroma::et::softmax: max pass, exp pass, sum in 8 partial lanes, then divide (or
// x - max - log(sum) for log_softmax), with the same scalar exp/log.
Tensors eval_Softmax(const Node& n, const Tensors& in) {
  const Tensor& x = in[0];
  const size_t axis = static_cast<size_t>(n.attrs.axis);
  const Shape& shape = x.type.shape;
  const int64_t outer = extent(shape, 0, axis);
  const int64_t dim = shape.empty() ? 1 : shape[axis];
  const int64_t inner = extent(shape, axis + 1, shape.size());
  OutBuffer out(n.type());
  dispatch_dtype(x.type.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T>) {
      const T* p = x.data<T>();
      T* o = out.data<T>();
      std::vector<T> e(static_cast<size_t>(dim));
      for (int64_t a = 0; a < outer; ++a) {
        for (int64_t i = 0; i < inner; ++i) {
          const T* row = p + a * dim * inner + i;
          T* dst = o + a * dim * inner + i;
          T m = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < dim; ++j) m = ::chroma::scalar::maximum(m, row[j * inner]);
          for (int64_t j = 0; j < dim; ++j) e[static_cast<size_t>(j)] = ::chroma::scalar::exp_(T(row[j * inner] - m));
          T lanes[8] = {};
          int64_t j = 0;
          for (; j + 8 <= dim; j += 8) {
            for (int l = 0; l < 8; ++l) lanes[l] += e[static_cast<size_t>(j + l)];
          }
          for (; j < dim; ++j) lanes[0] += e[static_cast<size_t>(j)];
          T s = lanes[0];
          for (int l = 1; l < 8; ++l) s += lanes[l];
          if (n.attrs.log) {
            const T ls = ::chroma::scalar::log_(s);
            for (int64_t k = 0; k < dim; ++k) dst[k * inner] = T(T(row[k * inner] - m) - ls);
          } else {
            for (int64_t k = 0; k < dim; ++k) dst[k * inner] = T(e[static_cast<size_t>(k)] / s);
          }
        }
      }
    } else {
      throw CompileError("softmax needs a floating-point input");
    }
  });
  return {out.finish()};
}

Tensors eval_ArgReduce(const Node& n, const Tensors& in) {
  const Tensor& x = in[0];
  const size_t axis = static_cast<size_t>(n.attrs.axis);
  const Shape& shape = x.type.shape;
  const int64_t outer = extent(shape, 0, axis);
  const int64_t dim = shape[axis];
  const int64_t inner = extent(shape, axis + 1, shape.size());
  if (dim == 0) throw CompileError("cannot take argmax/argmin of an empty dimension");
  if (n.attrs.reduce != ReduceKind::kMax && n.attrs.reduce != ReduceKind::kMin) {
    throw CompileError("ArgReduce supports max and min only");
  }
  const bool is_max = n.attrs.reduce == ReduceKind::kMax;
  OutBuffer out(n.type());
  int64_t* o = out.data<int64_t>();
  dispatch_dtype(x.type.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = x.data<T>();
    for (int64_t a = 0; a < outer; ++a) {
      for (int64_t i = 0; i < inner; ++i) {
        const T* row = p + a * dim * inner + i;
        T best = row[0];
        int64_t best_j = 0;
        for (int64_t j = 1; j < dim && !is_nan(best); ++j) {
          const T v = row[j * inner];
          if (is_nan(v) || (is_max ? best < v : v < best)) {
            best = v;
            best_j = j;
          }
        }
        o[a * inner + i] = best_j;
      }
    }
  });
  return {out.finish()};
}

Tensors eval_MatMul(const Node& n, const Tensors& in) {
  const Tensor& x = in[0];
  const Tensor& y = in[1];
  const size_t r = x.type.shape.size();
  const int64_t batch = extent(x.type.shape, 0, r - 2);
  const int64_t m = x.type.shape[r - 2];
  const int64_t k = x.type.shape[r - 1];
  const int64_t nn = y.type.shape[r - 1];
  OutBuffer out(n.type());
  dispatch_dtype(x.type.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = Acc<T>;
    const T* xp = x.data<T>();
    const T* yp = y.data<T>();
    T* o = out.data<T>();
    std::vector<A> acc(static_cast<size_t>(nn));
    for (int64_t b = 0; b < batch; ++b) {
      const T* xb = xp + b * m * k;
      const T* yb = yp + b * k * nn;
      for (int64_t i = 0; i < m; ++i) {
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t l = 0; l < k; ++l) {
          const A xv = static_cast<A>(xb[i * k + l]);
          const T* yrow = yb + l * nn;
          for (int64_t j = 0; j < nn; ++j) acc[static_cast<size_t>(j)] += xv * static_cast<A>(yrow[j]);
        }
        T* orow = o + (b * m + i) * nn;
        for (int64_t j = 0; j < nn; ++j) orow[j] = convert<T>(acc[static_cast<size_t>(j)]);
      }
    }
  });
  return {out.finish()};
}

// Direct convolution over the dense definition (constant folding only; the runtime uses
// include/chroma/cpu/conv.h).
Tensors eval_Conv(const Node& n, const Tensors& in) {
  const Tensor& x = in[0];
  const Tensor& w = in[1];
  const size_t d = x.type.shape.size() - 2;
  int64_t is[3] = {1, 1, 1}, ks[3] = {1, 1, 1}, os[3] = {1, 1, 1}, st[3] = {1, 1, 1}, pd[3] = {0, 0, 0}, dl[3] = {1, 1, 1};
  for (size_t i = 0; i < d; ++i) {
    const size_t j = 3 - d + i;
    is[j] = x.type.shape[2 + i];
    ks[j] = w.type.shape[2 + i];
    os[j] = n.type().shape[2 + i];
    st[j] = n.attrs.ints[i];
    pd[j] = n.attrs.ints[d + i];
    dl[j] = n.attrs.ints[2 * d + i];
  }
  const int64_t nb = x.type.shape[0], c = x.type.shape[1], cout = w.type.shape[0], groups = n.attrs.k;
  const int64_t cin_g = c / groups, cout_g = cout / groups;
  OutBuffer out(n.type());
  dispatch_dtype(x.type.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T>) {
      using A = Acc<T>;
      const T* xp = x.data<T>();
      const T* wp = w.data<T>();
      T* o = out.data<T>();
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t co = 0; co < cout; ++co) {
          const int64_t grp = co / cout_g;
          for (int64_t od = 0; od < os[0]; ++od)
            for (int64_t oh = 0; oh < os[1]; ++oh)
              for (int64_t ow = 0; ow < os[2]; ++ow) {
                A acc = 0;
                for (int64_t ci = 0; ci < cin_g; ++ci) {
                  const int64_t cx = grp * cin_g + ci;
                  for (int64_t kd = 0; kd < ks[0]; ++kd) {
                    const int64_t id = od * st[0] - pd[0] + kd * dl[0];
                    if (id < 0 || id >= is[0]) continue;
                    for (int64_t kh = 0; kh < ks[1]; ++kh) {
                      const int64_t ih = oh * st[1] - pd[1] + kh * dl[1];
                      if (ih < 0 || ih >= is[1]) continue;
                      for (int64_t kw = 0; kw < ks[2]; ++kw) {
                        const int64_t iw = ow * st[2] - pd[2] + kw * dl[2];
                        if (iw < 0 || iw >= is[2]) continue;
                        acc += static_cast<A>(xp[(((b * c + cx) * is[0] + id) * is[1] + ih) * is[2] + iw]) *
                               static_cast<A>(wp[(((co * cin_g + ci) * ks[0] + kd) * ks[1] + kh) * ks[2] + kw]);
                      }
                    }
                  }
                }
                o[(((b * cout + co) * os[0] + od) * os[1] + oh) * os[2] + ow] = convert<T>(acc);
              }
        }
    } else {
      throw CompileError("Conv of " + x.type.str() + ": floating point only");
    }
  });
  return {out.finish()};
}

Tensors eval_TopK(const Node& n, const Tensors& in) {
  const Tensor& x = in[0];
  const size_t axis = static_cast<size_t>(n.attrs.axis);
  const Shape& shape = x.type.shape;
  const int64_t outer = extent(shape, 0, axis);
  const int64_t dim = shape[axis];
  const int64_t inner = extent(shape, axis + 1, shape.size());
  const int64_t k = n.attrs.k;
  if (k < 0 || k > dim) throw CompileError("k=" + std::to_string(k) + " out of range for " + x.type.str());
  const bool largest = n.attrs.largest;
  OutBuffer values(n.type(0));
  OutBuffer indices(n.type(1));
  int64_t* oi = indices.data<int64_t>();
  dispatch_dtype(x.type.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = x.data<T>();
    T* ov = values.data<T>();
    std::vector<T> row(static_cast<size_t>(dim));
    std::vector<int64_t> order(static_cast<size_t>(dim));
    for (int64_t a = 0; a < outer; ++a) {
      for (int64_t i = 0; i < inner; ++i) {
        for (int64_t j = 0; j < dim; ++j) row[static_cast<size_t>(j)] = p[(a * dim + j) * inner + i];
        std::iota(order.begin(), order.end(), int64_t{0});
        auto before = [&](int64_t u, int64_t v) {
          return topk_before(row[static_cast<size_t>(u)], u, row[static_cast<size_t>(v)], v, largest);
        };
        if (k == dim) std::sort(order.begin(), order.end(), before);  // same result: `before` is total
        else std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t src = order[static_cast<size_t>(j)];
          ov[(a * k + j) * inner + i] = row[static_cast<size_t>(src)];
          oi[(a * k + j) * inner + i] = src;
        }
      }
    }
  });
  return {values.finish(), indices.finish()};
}

// Mirrors chroma::et::scan: the same combine functions and accumulator types.
Tensors eval_Scan(const Node& n, const Tensors& in) {
  const Tensor& x = in[0];
  const size_t axis = static_cast<size_t>(n.attrs.axis);
  const Shape& shape = x.type.shape;
  const int64_t outer = extent(shape, 0, axis);
  const int64_t dim = shape[axis];
  const int64_t inner = extent(shape, axis + 1, shape.size());
  const int kind = n.attrs.log ? 4 : static_cast<int>(n.attrs.reduce);
  OutBuffer out(n.type());
  dispatch_dtype(x.type.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = x.data<T>();
    T* o = out.data<T>();
    auto run = [&](auto kind_tag) {
      constexpr int K = decltype(kind_tag)::value;
      if constexpr (K == 4 && !std::is_floating_point_v<T>) {
        throw CompileError("log-sum-exp scan of a non-float tensor");
      } else {
        using A = scalar::ScanAcc<K, T>;
        for (int64_t a = 0; a < outer; ++a) {
          for (int64_t i = 0; i < inner; ++i) {
            A acc{};
            for (int64_t j = 0; j < dim; ++j) {
              const int64_t off = (a * dim + j) * inner + i;
              const A v = static_cast<A>(p[off]);
              acc = j == 0 ? v : scalar::scan_combine<K, A>(acc, v);
              o[off] = static_cast<T>(acc);
            }
          }
        }
      }
    };
    switch (kind) {
      case 0: run(std::integral_constant<int, 0>{}); break;
      case 1: run(std::integral_constant<int, 1>{}); break;
      case 2: run(std::integral_constant<int, 2>{}); break;
      case 3: run(std::integral_constant<int, 3>{}); break;
      default: run(std::integral_constant<int, 4>{}); break;
    }
  });
  return {out.finish()};
}

}  // namespace chroma::interp
