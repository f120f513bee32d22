#include "lower/layout.h"

#include <cstring>

namespace chroma {

Layout contiguous_layout(const Shape& shape, int64_t offset) {
  Layout l;
  l.shape = shape;
  l.strides = contiguous_strides(shape);
  l.offset = offset;
  return l;
}

bool is_contiguous(const Layout& l) {
  const Shape want = contiguous_strides(l.shape);
  for (size_t i = 0; i < l.shape.size(); ++i) {
    if (l.shape[i] != 1 && l.strides[i] != want[i]) return false;
  }
  return true;
}

std::vector<uint8_t> gather_strided(const uint8_t* src, size_t elem_bytes, const Layout& l, const Shape& extent,
                                    const std::vector<size_t>& order) {
  int64_t total = 1;
  for (size_t d : order) total *= extent[d];
  std::vector<uint8_t> out(static_cast<size_t>(total) * elem_bytes);
  std::vector<int64_t> idx(order.size(), 0);  // over `order`
  for (int64_t i = 0; i < total; ++i) {
    int64_t o = l.offset;
    for (size_t j = 0; j < order.size(); ++j) o += idx[j] * l.strides[order[j]];
    std::memcpy(out.data() + static_cast<size_t>(i) * elem_bytes, src + static_cast<size_t>(o) * elem_bytes, elem_bytes);
    for (size_t j = order.size(); j-- > 0;) {
      if (++idx[j] < extent[order[j]]) break;
      idx[j] = 0;
    }
  }
  return out;
}

std::vector<int64_t> dense_strides(const Shape& extent, const std::vector<size_t>& order) {
  std::vector<int64_t> strides(extent.size(), 0);
  int64_t st = 1;
  for (size_t j = order.size(); j-- > 0;) {
    const size_t d = order[j];
    if (extent[d] == 1) continue;
    strides[d] = st;
    st *= extent[d];
  }
  return strides;
}

std::vector<int64_t> channels_last_strides(const Shape& shape) {
  const size_t r = shape.size();
  std::vector<int64_t> st(r, 0);
  int64_t s = 1;
  st[1] = s;
  s *= shape[1];
  for (size_t d = r; d-- > 2;) {
    st[d] = s;
    s *= shape[d];
  }
  st[0] = s;
  return st;
}

bool is_channels_last(const Layout& l) {
  if (l.shape.size() < 3 || l.strides.size() != l.shape.size()) return false;
  const std::vector<int64_t> cl = channels_last_strides(l.shape);
  for (size_t d = 0; d < l.shape.size(); ++d) {
    if (l.shape[d] != 1 && l.strides[d] != cl[d]) return false;
  }
  return true;
}

namespace {

// Reshape as a view: walk the old dims in groups whose product matches groups of new dims;
// inside a group the old dims must be mergeable (stride[k] == stride[k+1] * size[k+1]).
template <class T> std::optional<BasicLayout<T>> reshape_view(const BasicLayout<T>& in, const Shape& out_shape) {
  BasicLayout<T> out;
  out.shape = out_shape;
  out.offset = in.offset;
  out.strides.assign(out_shape.size(), T{});
  // Drop size-1 source dims: their strides never matter.
  Shape s;
  std::vector<T> st;
  for (size_t i = 0; i < in.shape.size(); ++i) {
    if (in.shape[i] != 1) {
      s.push_back(in.shape[i]);
      st.push_back(in.strides[i]);
    }
  }
  if (numel(in.shape) == 0) {
    out.strides = std::vector<T>(out_shape.size(), T{});
    return out;
  }
  size_t oi = 0;  // next output dim
  size_t si = 0;  // next source dim
  while (oi < out_shape.size() || si < s.size()) {
    if (oi < out_shape.size() && out_shape[oi] == 1) {
      out.strides[oi++] = T{};
      continue;
    }
    if (si >= s.size() || oi >= out_shape.size()) return std::nullopt;
    // Take a chunk of source dims [si, sj) and output dims [oi, oj) with equal products.
    size_t sj = si + 1, oj = oi + 1;
    int64_t sp = s[si], op = out_shape[oi];
    while (sp != op) {
      if (sp < op) {
        if (sj >= s.size()) return std::nullopt;
        sp *= s[sj++];
      } else {
        if (oj >= out_shape.size()) return std::nullopt;
        op *= out_shape[oj++];
      }
    }
    for (size_t k = si; k + 1 < sj; ++k) {
      if (st[k] != st[k + 1] * static_cast<T>(s[k + 1])) return std::nullopt;
    }
    // The chunk behaves like one dim of stride st[sj-1] (innermost); split it over [oi, oj).
    T stride = st[sj - 1];
    for (size_t k = oj; k-- > oi;) {
      out.strides[k] = out_shape[k] == 1 ? T{} : stride;
      stride = stride * static_cast<T>(out_shape[k]);
    }
    si = sj;
    oi = oj;
  }
  return out;
}

}  // namespace

template <class T> std::optional<BasicLayout<T>> apply_view(const Node& n, const BasicLayout<T>& in) {
  const Attrs& a = n.attrs;
  BasicLayout<T> out = in;
  switch (n.op) {
    case Op::kPermute:
      for (size_t i = 0; i < a.ints.size(); ++i) {
        out.shape[i] = in.shape[static_cast<size_t>(a.ints[i])];
        out.strides[i] = in.strides[static_cast<size_t>(a.ints[i])];
      }
      return out;
    case Op::kExpand:
      for (size_t i = 0; i < a.ints.size(); ++i) {
        if (in.shape[i] != a.ints[i]) out.strides[i] = T{};
        out.shape[i] = a.ints[i];
      }
      return out;
    case Op::kSlice: {
      const auto ax = static_cast<size_t>(a.axis);
      out.offset = in.offset + static_cast<T>(a.start) * in.strides[ax];
      out.strides[ax] = in.strides[ax] * static_cast<T>(a.step);
      out.shape[ax] = n.types[0].shape[ax];
      return out;
    }
    case Op::kReshape:
      return reshape_view(in, a.ints);
    case Op::kFlip:
      for (int64_t ax : a.ints) {
        const auto d = static_cast<size_t>(ax);
        if (in.shape[d] > 0) out.offset = out.offset + static_cast<T>(in.shape[d] - 1) * out.strides[d];
        out.strides[d] = -out.strides[d];
      }
      return out;
    default:
      return std::nullopt;
  }
}

template std::optional<BasicLayout<int64_t>> apply_view(const Node&, const BasicLayout<int64_t>&);
template std::optional<BasicLayout<double>> apply_view(const Node&, const BasicLayout<double>&);

}  // namespace chroma
