// Reference kernels for the primitives that only move elements: the views (Permute, Expand,
// Slice, Reshape), Concat, and the indexing ops Gather and GatherElements.
//
// Views are evaluated as strided reads of the input (the same shape/strides/offset metadata
// lowering gives them) materialized into a dense result; Reshape shares the input's bytes.
// Element moves go through unsigned integers of the element's width, so one instantiation
// serves all dtypes of that size.
#include <cstring>
#include <type_traits>
#include <string>

#include "chroma/cpu/scalar.h"
#include "interp/kernels.h"

namespace chroma::interp {

Tensor materialize(const Tensor& src, const Shape& shape, const Shape& strides, int64_t offset) {
  OutBuffer out(TensorType{src.type.dtype, shape});
  dispatch_bits(src.type.dtype, [&](auto tag) {
    using U = typename decltype(tag)::type;
    const U* s = src.data<U>();
    U* d = out.data<U>();
    int64_t k = 0;
    for_each_offset(shape, strides, offset, [&](int64_t off) { d[k++] = s[off]; });
  });
  return out.finish();
}

namespace {

[[noreturn]] void index_error(int64_t index, int64_t axis, int64_t size) {
  throw CompileError("index " + std::to_string(index) + " is out of range for dimension " +
                     std::to_string(axis) + " of size " + std::to_string(size));
}

}  // namespace

Tensors eval_Permute(const Node& n, const Tensors& in) {
  const Shape in_strides = contiguous_strides(in[0].type.shape);
  Shape strides;
  for (int64_t p : n.attrs.ints) strides.push_back(in_strides[static_cast<size_t>(p)]);
  return {materialize(in[0], n.type().shape, strides, 0)};
}

Tensors eval_Expand(const Node& n, const Tensors& in) {
  Shape strides = contiguous_strides(in[0].type.shape);
  for (size_t d = 0; d < strides.size(); ++d) {
    if (in[0].type.shape[d] == 1) strides[d] = 0;
  }
  return {materialize(in[0], n.type().shape, strides, 0)};
}

Tensors eval_Slice(const Node& n, const Tensors& in) {
  Shape strides = contiguous_strides(in[0].type.shape);
  const size_t axis = static_cast<size_t>(n.attrs.axis);
  const int64_t offset = n.attrs.start * strides[axis];
  strides[axis] *= n.attrs.step;
  return {materialize(in[0], n.type().shape, strides, offset)};
}

Tensors eval_Flip(const Node& n, const Tensors& in) {
  const Shape& shape = in[0].type.shape;
  Shape strides = contiguous_strides(shape);
  int64_t offset = 0;
  for (int64_t ax : n.attrs.ints) {
    const auto a = static_cast<size_t>(ax);
    if (shape[a] > 0) offset += (shape[a] - 1) * strides[a];
    strides[a] = -strides[a];
  }
  return {materialize(in[0], shape, strides, offset)};
}

Tensors eval_Reshape(const Node& n, const Tensors& in) {
  // Row-major reshape keeps the element order: share the bytes under the new type.
  return {Tensor{n.type(), in[0].bytes}};
}

Tensors eval_Concat(const Node& n, const Tensors& in) {
  const TensorType& t = n.type();
  const size_t axis = static_cast<size_t>(n.attrs.axis);
  const int64_t outer = extent(t.shape, 0, axis);
  const int64_t elem = dtype_size(t.dtype);
  const int64_t inner_bytes = extent(t.shape, axis + 1, t.shape.size()) * elem;
  OutBuffer out(t);
  uint8_t* dst = out.data<uint8_t>();
  for (int64_t o = 0; o < outer; ++o) {
    for (const Tensor& x : in) {
      const int64_t chunk = x.type.shape[axis] * inner_bytes;
      if (chunk == 0) continue;
      std::memcpy(dst, x.data<uint8_t>() + o * chunk, static_cast<size_t>(chunk));
      dst += chunk;
    }
  }
  return {out.finish()};
}

// index_select: out[o, j..., i] = src[o, idx[j...], i] with o over src[:axis], i over
// src[axis+1:].
Tensors eval_Gather(const Node& n, const Tensors& in) {
  const Tensor& src = in[0];
  const Tensor& idx = in[1];
  const size_t axis = static_cast<size_t>(n.attrs.axis);
  const int64_t dim = src.type.shape[axis];
  const int64_t outer = extent(src.type.shape, 0, axis);
  const int64_t inner_bytes = extent(src.type.shape, axis + 1, src.type.shape.size()) * dtype_size(src.type.dtype);
  const int64_t count = idx.type.numel();
  const int64_t* ix = idx.data<int64_t>();
  for (int64_t j = 0; j < count; ++j) {
    if (ix[j] < 0 || ix[j] >= dim) index_error(ix[j], n.attrs.axis, dim);
  }
  OutBuffer out(n.type());
  uint8_t* dst = out.data<uint8_t>();
  const uint8_t* s = src.data<uint8_t>();
  if (inner_bytes == 0) return {out.finish()};
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < count; ++j) {
      std::memcpy(dst, s + (o * dim + ix[j]) * inner_bytes, static_cast<size_t>(inner_bytes));
      dst += inner_bytes;
    }
  }
  return {out.finish()};
}

// out = base; out[o, idx[j], i] = values[o, j, i] (or +=), o over base[:axis], i after it.
Tensors eval_IndexPut(const Node& n, const Tensors& in) {
  const Tensor& base = in[0];
  const Tensor& idx = in[1];
  const Tensor& val = in[2];
  const size_t axis = static_cast<size_t>(n.attrs.axis);
  const int64_t dim = base.type.shape[axis];
  const int64_t outer = extent(base.type.shape, 0, axis);
  const int64_t inner = extent(base.type.shape, axis + 1, base.type.shape.size());
  const int64_t count = idx.type.numel();
  const int64_t* ix = idx.data<int64_t>();
  for (int64_t j = 0; j < count; ++j) {
    if (ix[j] < 0 || ix[j] >= dim) index_error(ix[j], n.attrs.axis, dim);
  }
  OutBuffer out(n.type());
  dispatch_dtype(base.type.dtype, [&](auto tag) {
    using U = typename decltype(tag)::type;
    U* d = out.data<U>();
    std::memcpy(d, base.data<U>(), static_cast<size_t>(base.type.nbytes()));
    const U* v = val.data<U>();
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t j = 0; j < count; ++j) {
        U* row = d + (o * dim + ix[j]) * inner;
        const U* src = v + (o * count + j) * inner;
        for (int64_t i = 0; i < inner; ++i) {
          if (!n.attrs.accumulate) {
            row[i] = src[i];
            continue;
          }
          switch (n.attrs.reduce) {
            case ReduceKind::kSum: row[i] = scalar::scan_combine<0, U>(row[i], src[i]); break;
            case ReduceKind::kProd: row[i] = scalar::scan_combine<1, U>(row[i], src[i]); break;
            case ReduceKind::kMax: row[i] = scalar::scan_combine<2, U>(row[i], src[i]); break;
            case ReduceKind::kMin: row[i] = scalar::scan_combine<3, U>(row[i], src[i]); break;
          }
          if constexpr (std::is_same_v<U, float>) {  // a widened half tensor: each step rounded
            if (n.attrs.dtype == DType::kBF16) row[i] = static_cast<float>(bf16(row[i]));
            if (n.attrs.dtype == DType::kF16) row[i] = static_cast<float>(f16(row[i]));
          }
        }
      }
    }
  });
  return {out.finish()};
}

// torch.gather: out[i] = src[i with i[axis] replaced by idx[i]]; out has idx's shape, which
// may be smaller than src off the axis.
Tensors eval_GatherElements(const Node& n, const Tensors& in) {
  const Tensor& src = in[0];
  const Tensor& idx = in[1];
  const size_t axis = static_cast<size_t>(n.attrs.axis);
  const int64_t dim = src.type.shape[axis];
  Shape strides = contiguous_strides(src.type.shape);
  const int64_t axis_stride = strides[axis];
  strides[axis] = 0;  // the axis position comes from the index instead
  const int64_t* ix = idx.data<int64_t>();
  OutBuffer out(n.type());
  dispatch_bits(src.type.dtype, [&](auto tag) {
    using U = typename decltype(tag)::type;
    const U* s = src.data<U>();
    U* d = out.data<U>();
    int64_t k = 0;
    for_each_offset(idx.type.shape, strides, 0, [&](int64_t off) {
      const int64_t v = ix[k];
      if (v < 0 || v >= dim) index_error(v, n.attrs.axis, dim);
      d[k++] = s[off + v * axis_stride];
    });
  });
  return {out.finish()};
}

}  // namespace chroma::interp
