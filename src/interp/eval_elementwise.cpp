// Reference kernels for the deferred elementwise primitives: Map, Cast, Full, Iota.
//
// Map's per-operation functors are generated from chroma/elementwise.def with the same
// expressions the generated CPU code uses (helpers from chroma/cpu/scalar.h), so constant
// folding and the compiled model compute identical values.
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "chroma/cpu/scalar.h"
#include "interp/kernels.h"

namespace chroma::interp {
namespace {

// One functor per elementwise.def row. `apply` evaluates the row's expression on one element;
// A is the first operand's type (bool for where's condition, else the value type T).
#define CHROMA_EW(name, arity, result, expr)                                              \
  struct Ew_##name {                                                                      \
    static constexpr EwOp kOp = EwOp::k_##name;                                           \
    static constexpr int kArity = arity;                                                  \
    static constexpr EwResult kResult = EwResult::result;                                 \
    template <class A, class T>                                                           \
    static auto apply([[maybe_unused]] A a, [[maybe_unused]] T b, [[maybe_unused]] T c) { \
      return expr;                                                                        \
    }                                                                                     \
  };
#include "chroma/elementwise.def"
#undef CHROMA_EW

// Integer division by zero is a compile-time error when folding (the scalar helpers leave it
// to the runtime's flag); x / -1 is handled inside the helpers, as at run time.
template <class Fn> constexpr bool kIsDivision =
    Fn::kOp == EwOp::k_floor_divide || Fn::kOp == EwOp::k_remainder || Fn::kOp == EwOp::k_fmod;

template <class Fn, class T> Tensor map_loop(const Tensors& in, const TensorType& out_type) {
  constexpr bool kWhere = Fn::kOp == EwOp::k_where;
  using A = std::conditional_t<kWhere, bool, T>;
  using Out = std::conditional_t<Fn::kResult == EwResult::kBool, bool, T>;
  OutBuffer out(out_type);
  Out* o = out.data<Out>();
  const int64_t n = out_type.numel();
  const A* a = in[0].data<A>();
  if constexpr (Fn::kArity == 1) {
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(Fn::apply(a[i], T{}, T{}));
  } else if constexpr (Fn::kArity == 2) {
    const T* b = in[1].data<T>();
    constexpr bool kGuard = kIsDivision<Fn> && std::is_integral_v<T> && !std::is_same_v<T, bool>;
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (kGuard) {
        if (b[i] == T(0)) throw CompileError("integer division by zero");
      }
      o[i] = static_cast<Out>(Fn::apply(a[i], b[i], T{}));
    }
  } else {
    const T* b = in[1].data<T>();
    const T* c = in[2].data<T>();
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(Fn::apply(a[i], b[i], c[i]));
  }
  return out.finish();
}

template <class Fn> Tensor map_op(const Tensors& in, const TensorType& out_type) {
  if (static_cast<int>(in.size()) != Fn::kArity) throw CompileError("internal: wrong operand count");
  const DType value_dtype = in[Fn::kOp == EwOp::k_where ? 1 : 0].type.dtype;
  const DType expected = Fn::kResult == EwResult::kBool ? DType::kBool : value_dtype;
  if (out_type.dtype != expected) throw CompileError("internal: unexpected output type " + out_type.str());
  return dispatch_dtype(value_dtype, [&](auto tag) -> Tensor {
    using T = typename decltype(tag)::type;
    if constexpr (Fn::kResult == EwResult::kFloat && !std::is_floating_point_v<T>) {
      throw CompileError("needs floating-point operands, got " + in[0].type.str());
    } else {
      return map_loop<Fn, T>(in, out_type);
    }
  });
}

}  // namespace

Tensors eval_Map(const Node& n, const Tensors& in) {
  switch (n.attrs.ew) {
#define CHROMA_EW(name, arity, result, expr) \
  case EwOp::k_##name: return {map_op<Ew_##name>(in, n.type())};
#include "chroma/elementwise.def"
#undef CHROMA_EW
    case EwOp::kCount: break;
  }
  throw CompileError("internal: Map without an elementwise operation");
}

// Casts between a half type and float32 (the only ones widen_half leaves): exact one way,
// rounded to nearest even the other, as chroma/half.h does in the generated code.
template <class H> void cast_half(const Tensor& x, DType to, OutBuffer& out, int64_t count) {
  if (to == DType::kF32) {
    const H* src = x.data<H>();
    float* dst = out.data<float>();
    for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(src[i]);
  } else if (x.type.dtype == DType::kF32) {
    const float* src = x.data<float>();
    H* dst = out.data<H>();
    for (int64_t i = 0; i < count; ++i) dst[i] = H(src[i]);
  } else {
    throw CompileError("internal: a cast from " + std::string(dtype_name(x.type.dtype)) + " to " +
                       std::string(dtype_name(to)) + " (half types convert to and from float32 only)");
  }
}

Tensors eval_Cast(const Node& n, const Tensors& in) {
  OutBuffer out(n.type());
  const int64_t count = n.type().numel();
  const DType from = in[0].type.dtype, to = n.type().dtype;
  if (from == DType::kF16 || to == DType::kF16) {
    cast_half<f16>(in[0], to, out, count);
    return {out.finish()};
  }
  if (from == DType::kBF16 || to == DType::kBF16) {
    cast_half<bf16>(in[0], to, out, count);
    return {out.finish()};
  }
  dispatch_dtype(in[0].type.dtype, [&](auto from_tag) {
    using From = typename decltype(from_tag)::type;
    dispatch_dtype(n.type().dtype, [&](auto to_tag) {
      using To = typename decltype(to_tag)::type;
      const From* src = in[0].data<From>();
      To* dst = out.data<To>();
      for (int64_t i = 0; i < count; ++i) dst[i] = convert<To>(src[i]);
    });
  });
  return {out.finish()};
}

Tensors eval_Full(const Node& n, const Tensors&) {
  OutBuffer out(n.type());
  const int64_t count = n.type().numel();
  const Scalar& s = n.attrs.scalar;
  dispatch_dtype(n.type().dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = s.is_int ? convert<T>(s.i) : convert<T>(s.f);
    T* dst = out.data<T>();
    for (int64_t i = 0; i < count; ++i) dst[i] = v;
  });
  return {out.finish()};
}

Tensors eval_Iota(const Node& n, const Tensors&) {
  const TensorType& t = n.type();
  if (n.attrs.coeffs.size() != t.shape.size()) throw CompileError("needs one coefficient per dimension");
  OutBuffer out(t);
  const double base = n.attrs.scalar.as_double();
  const std::vector<double>& coeffs = n.attrs.coeffs;
  dispatch_dtype(t.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dst = out.data<T>();
    std::vector<int64_t> idx(t.shape.size(), 0);
    const int64_t count = t.numel();
    for (int64_t i = 0; i < count; ++i) {
      if constexpr (std::is_integral_v<T>) {
        // Integers are exact over the whole int64 range (as in chroma::et::Iota).
        int64_t v = n.attrs.scalar.is_int ? n.attrs.scalar.i : static_cast<int64_t>(base);
        for (size_t k = 0; k < idx.size(); ++k) v += static_cast<int64_t>(coeffs[k]) * idx[k];
        dst[i] = static_cast<T>(v);
      } else {
        double v = base;
        for (size_t k = 0; k < idx.size(); ++k) v += coeffs[k] * static_cast<double>(idx[k]);
        dst[i] = convert<T>(v);
      }
      for (size_t k = idx.size(); k-- > 0;) {
        if (++idx[k] < t.shape[k]) break;
        idx[k] = 0;
      }
    }
  });
  return {out.finish()};
}

}  // namespace chroma::interp
