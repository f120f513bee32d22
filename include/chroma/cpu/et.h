// chroma::et: the header-only expression-template library that Chroma's generated CPU code
// is written in.
//
// An expression is a tree of small structs whose shapes and strides are template
// parameters. Leaves: Load (a strided view of a buffer), Lit (a scalar), Iota (an affine
// function of the index). Inner nodes: Map<F, T, children...> applies an elementwise
// functor from chroma/elementwise.def and converts to T. Nothing is evaluated until a
// kernel (assign, reduce, gather, ...) walks its iteration space.
//
// Evaluation is row-wise: `e.row(idx)` fixes all indices but the last and returns a small
// functor `r(j)` for the last one. With static strides the innermost loop compiles to
// plain pointer arithmetic that the C++ compiler can vectorize; every temporary of the
// fused chain stays in registers.
//
// Index convention: kernels pass `const int64_t* idx` holding one index per dimension of the
// expression's own rank (rank-0 expressions are given rank 1 with extent 1 by the compiler).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "chroma/cpu/scalar.h"
#include "chroma/half.h"
#include "chroma/cpu/threads.h"

// Loops over whole tensors (assign, reduce) prefer 512-bit vectors where the target has
// AVX-512: GCC's tuning for recent x86 cores defaults to 256 bits, which halves the
// throughput of the transcendental-heavy fused loops. Lane width never changes results.
// (noinline: inlined into the generated kernel function, the caller's tuning would apply.)
// Always noinline: the loops are compiled as functions of their own, with the destination and
// the expression as by-value parameters. Inlined into the pool's job (a lambda reached through
// a void*), GCC could no longer analyse the loads and left the loop scalar (an erf-form
// GELU, for one: bench/results/README.md).
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
#define CHROMA_ET_LOOP_ATTR __attribute__((target("prefer-vector-width=512"), noinline))
#elif defined(__GNUC__)
#define CHROMA_ET_LOOP_ATTR __attribute__((noinline))
#else
#define CHROMA_ET_LOOP_ATTR
#endif

namespace chroma::et {

template <int64_t... D> struct Shape {
  static constexpr int kRank = sizeof...(D);
  static constexpr int64_t kDims[sizeof...(D)] = {D...};
  static constexpr int64_t kNumel = (int64_t{1} * ... * D);
  static constexpr int64_t kLast = kDims[sizeof...(D) - 1];
};

template <int64_t... S> struct St {
  static constexpr int kRank = sizeof...(S);
  static constexpr int64_t kS[sizeof...(S)] = {S...};
  static constexpr int64_t kLast = kS[sizeof...(S) - 1];
  // Offset of all but the last index.
  static inline int64_t outer(const int64_t* idx) {
    int64_t o = 0;
    for (int k = 0; k + 1 < kRank; ++k) o += idx[k] * kS[k];
    return o;
  }
  static inline int64_t full(const int64_t* idx) { return outer(idx) + idx[kRank - 1] * kLast; }
};

// ---- leaves --------------------------------------------------------------------------------

// A row whose value does not depend on the last index (a broadcast along it). Inner nodes
// whose operands are all invariant evaluate once per row instead of once per element: a
// layer norm's rsqrt(var + eps) runs per row, not per element.
template <class T> struct InvariantRow {
  static constexpr bool kInvariant = true;
  T v;
  CHROMA_ALWAYS_INLINE T operator()(int64_t) const { return v; }
};
template <class R> concept InvariantRowType = requires { requires R::kInvariant; };
template <class R> inline constexpr bool kInvariantRow = InvariantRowType<R>;

template <class T, class S, int64_t Off> struct Load {
  const T* p;
  struct Row {
    const T* p;
    CHROMA_ALWAYS_INLINE T operator()(int64_t j) const { return p[j * S::kLast]; }
  };
  auto row(const int64_t* idx) const {
    if constexpr (S::kLast == 0) return InvariantRow<T>{p[Off + S::outer(idx)]};
    else return Row{p + Off + S::outer(idx)};
  }
  T at(const int64_t* idx) const { return p[Off + S::full(idx)]; }
};
template <class T, class S, int64_t Off> Load<T, S, Off> load(const void* p) { return {static_cast<const T*>(p)}; }

template <class T> struct Lit {
  T v;
  InvariantRow<T> row(const int64_t*) const { return {v}; }
  T at(const int64_t*) const { return v; }
};
template <class T> Lit<T> lit(T v) { return {v}; }

// value = base + sum_k c_k * i_k. Integer types compute in int64 (exact over the whole
// range, like PyTorch's integer arange); floating types in double (PyTorch's arange also
// computes in a wider type), converted to T.
template <class T, int R> struct Iota {
  using Acc = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
  Acc base;
  Acc c[R];
  struct Row {
    Acc b, cl;
    CHROMA_ALWAYS_INLINE T operator()(int64_t j) const { return static_cast<T>(b + cl * static_cast<Acc>(j)); }
  };
  Row row(const int64_t* idx) const {
    Acc b = base;
    for (int k = 0; k + 1 < R; ++k) b += c[k] * static_cast<Acc>(idx[k]);
    return Row{b, c[R - 1]};
  }
  T at(const int64_t* idx) const { return row(idx)(idx[R - 1]); }
};

// ---- elementwise ---------------------------------------------------------------------------

// apply is always inlined: GCC's -O2 inliner leaves a large one (erf, tanh, a select of two
// polynomials) as a call when it sits inside a bigger expression, and a call in the loop body
// stops the loop from vectorizing (tanh-form GELU vectorized, erf-form GELU did not).
namespace op {
#define CHROMA_EW(name, arity, result, expr) \
  struct name {                              \
    template <class A, class B = A, class C = A> static CHROMA_ALWAYS_INLINE auto apply([[maybe_unused]] A a, [[maybe_unused]] B b = B(), [[maybe_unused]] C c = C()) { return expr; } \
  };
#include "chroma/elementwise.def"
#undef CHROMA_EW
struct cast {};
}  // namespace op

template <class F, class T, class... E> struct Map {
  std::tuple<E...> e;
  // The per-element call chain is always inlined (no std::apply, no lambda): in a kernel file
  // of hundreds of kernels GCC's unit-growth limit otherwise leaves some of it as calls, and
  // a call stops the loop from vectorizing (later kernels of a file ran several times slower
  // than the same kernel placed first: bench/results/README.md).
  template <class... R> struct Row {
    // A float32 -> bfloat16 conversion (what a rounding's outer cast back to float32 looks for).
    static constexpr bool kToBf16FromFloat =
        std::is_same_v<F, op::cast> && std::is_same_v<T, ::chroma::bf16> && sizeof...(R) == 1 &&
        (std::is_same_v<std::invoke_result_t<const R&, int64_t>, float> && ...);
    std::tuple<R...> r;
    CHROMA_ALWAYS_INLINE T operator()(int64_t j) const { return call(j, std::index_sequence_for<R...>{}); }
    template <size_t... I> CHROMA_ALWAYS_INLINE T call(int64_t j, std::index_sequence<I...>) const {
      if constexpr (std::is_same_v<F, op::cast>) {
        using C = std::tuple_element_t<0, std::tuple<R...>>;
        if constexpr (std::is_same_v<T, float> && requires { C::kToBf16FromFloat; }) {
          // float32 -> bfloat16 -> float32 (a bfloat16 model's rounding): in 32-bit lanes.
          if constexpr (C::kToBf16FromFloat) return ::chroma::half_detail::round_to_bf16(std::get<0>(std::get<0>(r).r)(j));
          else return static_cast<T>(std::get<0>(r)(j));
        } else {
          return static_cast<T>(std::get<0>(r)(j));
        }
      } else {
        return static_cast<T>(F::apply(std::get<I>(r)(j)...));
      }
    }
  };
  auto row(const int64_t* idx) const {
    return std::apply([idx](const auto&... x) {
      using R = Row<decltype(x.row(idx))...>;
      if constexpr ((kInvariantRow<decltype(x.row(idx))> && ...)) {
        return InvariantRow<T>{R{{x.row(idx)...}}(0)};
      } else {
        return R{{x.row(idx)...}};
      }
    }, e);
  }
  T at(const int64_t* idx) const {
    if constexpr (std::is_same_v<F, op::cast>) return static_cast<T>(std::get<0>(e).at(idx));
    else return std::apply([idx](const auto&... x) { return static_cast<T>(F::apply(x.at(idx)...)); }, e);
  }
};
template <class F, class T, class... E> Map<F, T, E...> map(E... e) { return {{e...}}; }
template <class T, class E> Map<op::cast, T, E> cast(E e) { return {{e}}; }

// ---- destinations and loops ----------------------------------------------------------------

template <class T, class S, int64_t Off> struct Out {
  using Strides = S;
  static constexpr int64_t kStrideLast = S::kLast;
  T* p;
  T* row(const int64_t* idx) const { return p + Off + S::outer(idx); }
  T& at(const int64_t* idx) const { return p[Off + S::full(idx)]; }
};
template <class T, class S, int64_t Off> Out<T, S, Off> out(void* p) { return {static_cast<T*>(p)}; }

// Calls f(idx) for every index of Sh with the last index left 0: one call per row.
template <class Sh, class F> inline void for_rows(F&& f) {
  constexpr int R = Sh::kRank;
  int64_t idx[R] = {};
  if constexpr (Sh::kNumel == 0) return;
  for (;;) {
    f(static_cast<const int64_t*>(idx));
    int k = R - 2;
    for (; k >= 0; --k) {
      if (++idx[k] < Sh::kDims[k]) break;
      idx[k] = 0;
    }
    if (k < 0) return;
  }
}

// Calls f(idx) for rows [r0, r1) of Sh (rows numbered in row-major order).
template <class Sh, class F> inline void for_rows_in(int64_t r0, int64_t r1, F&& f) {
  constexpr int R = Sh::kRank;
  if constexpr (Sh::kNumel == 0) return;
  int64_t idx[R] = {};
  int64_t q = r0;
  for (int k = R - 2; k >= 0; --k) {
    idx[k] = q % Sh::kDims[k];
    q /= Sh::kDims[k];
  }
  for (int64_t r = r0; r < r1; ++r) {
    f(static_cast<const int64_t*>(idx));
    for (int k = R - 2; k >= 0; --k) {
      if (++idx[k] < Sh::kDims[k]) break;
      idx[k] = 0;
    }
  }
}

// Calls f(idx) for rows [r0, r1) of Sh numbered with row dimension K varying fastest, then
// the others from the innermost out (K = Sh::kRank - 2 is for_rows_in's order).
template <class Sh, int K, class F> inline void for_rows_in_order(int64_t r0, int64_t r1, F&& f) {
  constexpr int R = Sh::kRank;
  if constexpr (Sh::kNumel == 0) return;
  int64_t idx[R] = {};
  int64_t q = r0;
  idx[K] = q % Sh::kDims[K];
  q /= Sh::kDims[K];
  for (int k = R - 2; k >= 0; --k) {
    if (k == K) continue;
    idx[k] = q % Sh::kDims[k];
    q /= Sh::kDims[k];
  }
  for (int64_t r = r0; r < r1; ++r) {
    f(static_cast<const int64_t*>(idx));
    if (++idx[K] < Sh::kDims[K]) continue;
    idx[K] = 0;
    for (int k = R - 2; k >= 0; --k) {
      if (k == K) continue;
      if (++idx[k] < Sh::kDims[k]) break;
      idx[k] = 0;
    }
  }
}

// A transposing copy: the row dimension along which a load of E (or the destination's
// strides S) steps by one element while its last index steps by at least 16, so a row
// touches a cache line per element. Rows taken in row-major order would leave each line for
// a whole pass over the tensor before coming back for its next element (a channels-last ->
// row-major relayout of 256 x 256 x 256 ran at 4 ns an element); taken with that dimension
// fastest (for_rows_in_order), the next rows read the lines the last one brought in. -1: none
// (or it is already the innermost row dimension).
template <class S, int R> inline constexpr int kUnitStrideRowDim = [] {
  if constexpr (S::kRank != R) {
    return -1;
  } else {
    if ((S::kLast) < 16 && (S::kLast) > -16) return -1;
    for (int k = R - 2; k >= 0; --k)
      if (S::kS[k] == 1 || S::kS[k] == -1) return k;
    return -1;
  }
}();
template <class E, int R> struct TransposedRowDim {
  static constexpr int value = -1;
};
template <class T, class S, int64_t Off, int R> struct TransposedRowDim<Load<T, S, Off>, R> {
  static constexpr int value = kUnitStrideRowDim<S, R>;
};

template <class F, class T, class... E, int R> struct TransposedRowDim<Map<F, T, E...>, R> {
  static constexpr int value = [] {
    int v = -1;
    ((v = v >= 0 ? v : TransposedRowDim<E, R>::value), ...);
    return v;
  }();
};

template <class Sh> inline constexpr int64_t kRows = Sh::kLast == 0 ? 0 : Sh::kNumel / Sh::kLast;

// Kernels of at least this many elements split their rows over the pool.
inline constexpr int64_t kParallelElems = 32768;

// body(r0, r1) over the rows of Sh: split over the pool when the kernel is large enough,
// else on the calling thread.
template <class Sh, class B> inline void over_rows(rt::ThreadPool* pool, B&& body) {
  constexpr int64_t rows = kRows<Sh>;
  if constexpr (Sh::kNumel >= kParallelElems && rows >= 2) {
    if (pool && pool->size() > 1) {
      pool->parallel_for(rows, body);
      return;
    }
  }
  body(int64_t{0}, rows);
}

// True when no two indices of Sh map to one element of S (no stride 0 on a dimension longer
// than 1): rows may then be written in any order.
template <class Sh, class S> inline constexpr bool kDistinct = [] {
  for (int k = 0; k < Sh::kRank; ++k) if (Sh::kDims[k] > 1 && S::kS[k] == 0) return false;
  return true;
}();

// dst[i] = e[i] over Sh.
//
// The inner loops carry `#pragma GCC ivdep`: GCC's -O2 vectorizer (cost model "very cheap")
// will not emit the runtime overlap checks between the destination row and the source rows,
// so without it no kernel loop vectorizes. It is sound because a destination never overlaps a
// source except element for element (in place): the arena planner gives buffers live in the
// same kernel disjoint ranges, and the Python wrapper copies inputs that alias an out= array.
// A destination with stride 0 along the row is left alone (the last write must win).
// A transposing assign (TransposedRowDim: the destination's strides first, then E's loads)
// is taken in groups of kTransposeRows rows along the unit-stride row dimension and in
// chunks of kTransposeCols columns: a chunk of one row touches at most kTransposeCols lines,
// which the group's next rows then read from L1. The dimension, or -1 where the plain row
// order is as good (it is already the innermost row dimension and rows are short) or rows
// may not be written in any order.
inline constexpr int64_t kTransposeRows = 16, kTransposeCols = 256;
template <class Sh, class D, class E> inline constexpr int kAssignRowDim = [] {
  constexpr int R = Sh::kRank;
  if constexpr (R < 2 || !kDistinct<Sh, typename D::Strides>) {
    return -1;
  } else {
    int k = kUnitStrideRowDim<typename D::Strides, R>;
    if (k < 0) k = TransposedRowDim<E, R>::value;
    if (k < 0 || Sh::kDims[k] < 2) return -1;
    return k != R - 2 || Sh::kLast > kTransposeCols ? k : -1;
  }
}();

template <class Sh, class D, class E> CHROMA_ET_LOOP_ATTR inline void assign_rows(int64_t r0, int64_t r1, D d, E e) {
  if constexpr (kAssignRowDim<Sh, D, E> >= 0) {
    using Row = decltype(e.row(static_cast<const int64_t*>(nullptr)));
    using Dst = decltype(d.row(static_cast<const int64_t*>(nullptr)));
    Row rows[kTransposeRows];
    Dst dst[kTransposeRows];
    int64_t n = 0;
    auto flush = [&] {
      for (int64_t j0 = 0; j0 < Sh::kLast; j0 += kTransposeCols) {
        const int64_t j1 = std::min<int64_t>(Sh::kLast, j0 + kTransposeCols);
        for (int64_t i = 0; i < n; ++i) {
          const Row r = rows[i];
          auto* w = dst[i];
#pragma GCC ivdep
          for (int64_t j = j0; j < j1; ++j) w[j * D::kStrideLast] = r(j);
        }
      }
      n = 0;
    };
    for_rows_in_order<Sh, kAssignRowDim<Sh, D, E>>(r0, r1, [&](const int64_t* idx) {
      rows[n] = e.row(idx);
      dst[n] = d.row(idx);
      if (++n == kTransposeRows) flush();
    });
    if (n) flush();
  } else {
    for_rows_in<Sh>(r0, r1, [&](const int64_t* idx) {
      auto r = e.row(idx);
      auto* w = d.row(idx);
      if constexpr (D::kStrideLast != 0) {
#pragma GCC ivdep
        for (int64_t j = 0; j < Sh::kLast; ++j) w[j * D::kStrideLast] = r(j);
      } else {
        for (int64_t j = 0; j < Sh::kLast; ++j) w[j * D::kStrideLast] = r(j);
      }
    });
  }
}
template <class Sh, class D, class E> inline void assign(D d, E e) { assign_rows<Sh>(0, kRows<Sh>, d, e); }
// The same, rows split over the pool when large (and no two rows write one element).
template <class Sh, class D, class E> inline void assign(rt::ThreadPool* pool, D d, E e) {
  if constexpr (kDistinct<Sh, typename D::Strides>) {
    over_rows<Sh>(pool, [&](int64_t r0, int64_t r1) { assign_rows<Sh>(r0, r1, d, e); });
  } else {
    assign_rows<Sh>(0, kRows<Sh>, d, e);
  }
}

// Calls f(idx) for every index of Sh (all dimensions).
template <class Sh, class F> inline void for_each_index(F&& f) {
  for_rows<Sh>([&](const int64_t* row) {
    int64_t idx[Sh::kRank];
    std::copy(row, row + Sh::kRank, idx);
    for (int64_t j = 0; j < Sh::kLast; ++j) {
      idx[Sh::kRank - 1] = j;
      f(static_cast<const int64_t*>(idx));
    }
  });
}

// ---- reductions ----------------------------------------------------------------------------

struct Sum {
  template <class T> static T identity() { return T(0); }
  template <class T> static T combine(T a, T b) { return ::chroma::scalar::add(a, b); }
};
struct Prod {
  template <class T> static T identity() { return T(1); }
  template <class T> static T combine(T a, T b) { return ::chroma::scalar::mul(a, b); }
};
struct Max {
  template <class T> static T identity() {
    if constexpr (std::numeric_limits<T>::has_infinity) return -std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::lowest();
  }
  template <class T> static T combine(T a, T b) { return ::chroma::scalar::maximum(a, b); }
};
struct Min {
  template <class T> static T identity() {
    if constexpr (std::numeric_limits<T>::has_infinity) return std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::max();
  }
  template <class T> static T combine(T a, T b) { return ::chroma::scalar::minimum(a, b); }
};

template <bool... M> struct Mask {
  static constexpr bool kM[sizeof...(M)] = {M...};
  static constexpr bool kLast = kM[sizeof...(M) - 1];
};

// Reduces E over the dimensions of Sh flagged in Mk into D. D is addressed with the input's
// rank and stride 0 on reduced dimensions, so every input index maps to its output element.
// A row reduced along the last dimension uses 8 partial accumulators, as vectorized
// reductions do.
template <class Sh, class Mk, class Op, class T, class D, class E>
CHROMA_ET_LOOP_ATTR inline void reduce_rows(int64_t r0, int64_t r1, D d, E e);
template <class Sh, class Mk, class Op, class T, class D, class E> inline void reduce(D d, E e) {
  reduce_rows<Sh, Mk, Op, T>(0, kRows<Sh>, d, e);
}
// With a pool: a reduction along the last dimension only (one output element per row) splits
// its rows over the pool when large.
template <class Sh, class Mk, class Op, class T, class D, class E> inline void reduce(rt::ThreadPool* pool, D d, E e) {
  constexpr bool last_only = [] {
    for (int k = 0; k + 1 < Sh::kRank; ++k) if (Mk::kM[k] && Sh::kDims[k] > 1) return false;
    return Mk::kLast;
  }();
  if constexpr (last_only) {
    over_rows<Sh>(pool, [&](int64_t r0, int64_t r1) { reduce_rows<Sh, Mk, Op, T>(r0, r1, d, e); });
  } else {
    reduce_rows<Sh, Mk, Op, T>(0, kRows<Sh>, d, e);
  }
}

template <class Sh, class Mk, class Op, class T, class D, class E>
CHROMA_ET_LOOP_ATTR inline void reduce_rows(int64_t r0, int64_t r1, D d, E e) {
  constexpr int R = Sh::kRank;
  auto first_visit = [](const int64_t* idx) {
    for (int k = 0; k + 1 < R; ++k) if (Mk::kM[k] && idx[k] != 0) return false;
    return true;
  };
  if constexpr (Sh::kNumel == 0) {
    return;  // the compiler emits a fill for empty reductions
  } else {
  for_rows_in<Sh>(r0, r1, [&](const int64_t* idx) {
    auto r = e.row(idx);
    if constexpr (Mk::kLast) {
      constexpr int kLanes = 8;
      T acc[kLanes];
      for (int l = 0; l < kLanes; ++l) acc[l] = Op::template identity<T>();
      int64_t j = 0;
      for (; j + kLanes <= Sh::kLast; j += kLanes) {
        for (int l = 0; l < kLanes; ++l) acc[l] = Op::combine(acc[l], static_cast<T>(r(j + l)));
      }
      for (; j < Sh::kLast; ++j) acc[0] = Op::combine(acc[0], static_cast<T>(r(j)));
      T total = acc[0];
      for (int l = 1; l < kLanes; ++l) total = Op::combine(total, acc[l]);
      T* w = d.row(idx);
      *w = first_visit(idx) ? total : Op::combine(*w, total);
    } else {
      T* w = d.row(idx);
      if (first_visit(idx)) {
        for (int64_t j = 0; j < Sh::kLast; ++j) w[j * D::kStrideLast] = static_cast<T>(r(j));
      } else {
        for (int64_t j = 0; j < Sh::kLast; ++j) w[j * D::kStrideLast] = Op::combine(w[j * D::kStrideLast], static_cast<T>(r(j)));
      }
    }
  });
  }
}

// Softmax (Log: log_softmax) of E along Axis into D (same shape). Each row is visited three
// times while it is in cache: max, exp (stored) with a sum in 8 partial lanes, then scale.
// Computes exactly what the reference kernel (src/interp eval_Softmax) computes.
// With a pool, the rows of a last-axis softmax are split over it when large.
template <class Sh, int Axis, bool Log, class T, class D, class E>
CHROMA_ET_LOOP_ATTR inline void softmax_rows(int64_t r0, int64_t r1, D d, E e);
template <class Sh, int Axis, bool Log, class T, class D, class E> inline void softmax(rt::ThreadPool* pool, D d, E e) {
  if constexpr (Axis == Sh::kRank - 1 && kDistinct<Sh, typename D::Strides>) {
    over_rows<Sh>(pool, [&](int64_t r0, int64_t r1) { softmax_rows<Sh, Axis, Log, T>(r0, r1, d, e); });
  } else {
    softmax_rows<Sh, Axis, Log, T>(0, kRows<Sh>, d, e);
  }
}
template <class Sh, int Axis, bool Log, class T, class D, class E> inline void softmax(D d, E e) {
  softmax<Sh, Axis, Log, T>(static_cast<rt::ThreadPool*>(nullptr), d, e);
}

// Rows [r0, r1) when Axis is the last; the whole tensor (r0, r1 ignored) otherwise.
template <class Sh, int Axis, bool Log, class T, class D, class E>
CHROMA_ET_LOOP_ATTR inline void softmax_rows(int64_t r0, int64_t r1, D d, E e) {
  constexpr int R = Sh::kRank;
  if constexpr (Sh::kNumel > 0) {
    if constexpr (Axis == R - 1) {
      constexpr int64_t n = Sh::kLast;
      constexpr int64_t ws = D::kStrideLast;
      for_rows_in<Sh>(r0, r1, [&](const int64_t* idx) {
        auto r = e.row(idx);
        T* w = d.row(idx);
        // Max in 16 independent lanes (NaN propagates whatever the order).
        T ml[16];
        for (int l = 0; l < 16; ++l) ml[l] = -std::numeric_limits<T>::infinity();
        int64_t jm = 0;
        for (; jm + 16 <= n; jm += 16) {
          for (int l = 0; l < 16; ++l) ml[l] = ::chroma::scalar::maximum(ml[l], static_cast<T>(r(jm + l)));
        }
        for (; jm < n; ++jm) ml[0] = ::chroma::scalar::maximum(ml[0], static_cast<T>(r(jm)));
        T m = ml[0];
        for (int l = 1; l < 16; ++l) m = ::chroma::scalar::maximum(m, ml[l]);
#pragma GCC ivdep
        for (int64_t j = 0; j < n; ++j) w[j * ws] = ::chroma::scalar::exp_(static_cast<T>(static_cast<T>(r(j)) - m));
        T lanes[8] = {};
        int64_t j = 0;
        if constexpr (ws == 1) {
          // The 8 lanes in one register (a vector of 8 in GCC's extension: the same adds,
          // lane by lane): an array here stays in memory, and each block's adds wait on
          // the last block's stores (the figure: bench/results/README.md).
          typedef T lanes_v __attribute__((vector_size(8 * sizeof(T))));
          lanes_v acc = {};
          for (; j + 8 <= n; j += 8) {
            lanes_v v;
            std::memcpy(&v, w + j, sizeof v);
            acc += v;
          }
          std::memcpy(lanes, &acc, sizeof acc);
        } else {
          for (; j + 8 <= n; j += 8) {
            for (int l = 0; l < 8; ++l) lanes[l] += w[(j + l) * ws];
          }
        }
        for (; j < n; ++j) lanes[0] += w[j * ws];
        T s = lanes[0];
        for (int l = 1; l < 8; ++l) s += lanes[l];
        if constexpr (Log) {
          const T ls = ::chroma::scalar::log_(s);
#pragma GCC ivdep
          for (int64_t k = 0; k < n; ++k) w[k * ws] = static_cast<T>(static_cast<T>(static_cast<T>(r(k)) - m) - ls);
        } else {
          for (int64_t k = 0; k < n; ++k) w[k * ws] = static_cast<T>(w[k * ws] / s);
        }
      });
    } else {
      constexpr int64_t n = Sh::kDims[Axis];
      for_each_index<Sh>([&](const int64_t* idx) {
        if (idx[Axis] != 0) return;
        int64_t i[R];
        std::copy(idx, idx + R, i);
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          i[Axis] = j;
          m = ::chroma::scalar::maximum(m, static_cast<T>(e.at(i)));
        }
        T lanes[8] = {};
        for (int64_t j = 0; j < n; ++j) {
          i[Axis] = j;
          const T v = ::chroma::scalar::exp_(static_cast<T>(static_cast<T>(e.at(i)) - m));
          d.at(i) = v;
          lanes[j < (n / 8) * 8 ? j % 8 : 0] += v;
        }
        T s = lanes[0];
        for (int l = 1; l < 8; ++l) s += lanes[l];
        const T ls = Log ? ::chroma::scalar::log_(s) : T(0);
        for (int64_t j = 0; j < n; ++j) {
          i[Axis] = j;
          if constexpr (Log) d.at(i) = static_cast<T>(static_cast<T>(static_cast<T>(e.at(i)) - m) - ls);
          else d.at(i) = static_cast<T>(d.at(i) / s);
        }
      });
    }
  }
}

// Index of the first maximum (IsMax) or minimum along Axis; NaN counts as the extreme, as in
// PyTorch. D is addressed like reduce's destination (stride 0 on Axis).
template <class Sh, int Axis, bool IsMax, class D, class E> inline void arg_reduce(D d, E e) {
  for_each_index<Sh>([&](const int64_t* idx) {
    if (idx[Axis] != 0) return;
    int64_t i[Sh::kRank];
    std::copy(idx, idx + Sh::kRank, i);
    auto best = e.at(i);
    int64_t best_j = 0;
    for (int64_t j = 1; j < Sh::kDims[Axis]; ++j) {
      i[Axis] = j;
      auto v = e.at(i);
      if (::chroma::scalar::isnan_(best)) break;
      const bool better = ::chroma::scalar::isnan_(v) || (IsMax ? v > best : v < best);
      if (better) { best = v; best_j = j; }
    }
    d.at(idx) = best_j;
  });
}

// ---- indexing ------------------------------------------------------------------------------

// index_select: out[o] = src[o[:Axis], idx[o[Axis:Axis+IR]], o[Axis+IR:]]. Returns false and
// stores the offending index in *bad when an index is outside [0, SrcDim).
template <class OutSh, int Axis, int IR, int64_t SrcDim, class D, class S, class I>
inline bool gather(D d, S s, I ix, int64_t* bad) {
  constexpr int RO = OutSh::kRank;
  constexpr int RS = RO - IR + 1;
  bool ok = true;
  for_each_index<OutSh>([&](const int64_t* o) {
    if (!ok) return;
    const int64_t v = static_cast<int64_t>(ix.at(o + Axis));
    if (v < 0 || v >= SrcDim) { *bad = v; ok = false; return; }
    int64_t si[RS > 0 ? RS : 1];
    for (int k = 0; k < Axis; ++k) si[k] = o[k];
    si[Axis] = v;
    for (int k = Axis + 1; k < RS; ++k) si[k] = o[k + IR - 1];
    d.at(o) = s.at(si);
  });
  return ok;
}

// index_put: d[o with o[Axis] = idx[o[Axis]]] = vals[o] (Acc: +=), o over the values'
// shape ValSh. Every index is checked before anything is written.
// Red (with Acc) combines like chroma::scalar::scan_combine: 0 sum, 1 prod, 2 max, 3 min.
// Round (with Acc, on a float32 destination that holds a half tensor's values): 1 rounds each
// combination to bfloat16, 2 to float16, as eager's index_put and index_reduce kernels do.
template <class ValSh, int Axis, int64_t Dim, bool Acc, int Red = 0, int Round = 0, class D, class I, class V>
inline bool index_put(D d, I ix, V vals, int64_t* bad) {
  constexpr int R = ValSh::kRank;
  for (int64_t j = 0; j < ValSh::kDims[Axis]; ++j) {
    const int64_t v = static_cast<int64_t>(ix.at(&j));
    if (v < 0 || v >= Dim) {
      *bad = v;
      return false;
    }
  }
  for_each_index<ValSh>([&](const int64_t* o) {
    int64_t di[R];
    std::copy(o, o + R, di);
    di[Axis] = static_cast<int64_t>(ix.at(o + Axis));
    auto& dst = d.at(di);
    using T = std::remove_reference_t<decltype(dst)>;
    if constexpr (!Acc) {
      dst = vals.at(o);
    } else {
      dst = ::chroma::scalar::scan_combine<Red, T>(dst, static_cast<T>(vals.at(o)));
      if constexpr (Round == 1) dst = static_cast<T>(::chroma::half_detail::round_to_bf16(static_cast<float>(dst)));
      if constexpr (Round == 2) dst = static_cast<T>(static_cast<float>(::chroma::f16(static_cast<float>(dst))));
    }
  });
  return true;
}

// torch.gather: out[o] = src[o with o[Axis] = idx[o]].
template <class Sh, int Axis, int64_t SrcDim, class D, class S, class I>
inline bool gather_elements(D d, S s, I ix, int64_t* bad) {
  bool ok = true;
  for_each_index<Sh>([&](const int64_t* o) {
    if (!ok) return;
    const int64_t v = static_cast<int64_t>(ix.at(o));
    if (v < 0 || v >= SrcDim) { *bad = v; ok = false; return; }
    int64_t si[Sh::kRank];
    std::copy(o, o + Sh::kRank, si);
    si[Axis] = v;
    d.at(o) = s.at(si);
  });
  return ok;
}

// Top-k along Axis of the input shape Sh. Ties go to the lower index; NaN is the largest.
template <class Sh, int Axis, int64_t K, bool Largest, class T, class DV, class DI, class E>
inline void topk(DV dv, DI di, E e) {
  std::vector<std::pair<T, int64_t>> buf(static_cast<size_t>(Sh::kDims[Axis]));
  auto before = [](const std::pair<T, int64_t>& a, const std::pair<T, int64_t>& b) {
    const bool an = ::chroma::scalar::isnan_(a.first), bn = ::chroma::scalar::isnan_(b.first);
    if (an || bn) {
      if (an && bn) return a.second < b.second;
      return Largest ? an : bn;
    }
    if (a.first != b.first) return Largest ? a.first > b.first : a.first < b.first;
    return a.second < b.second;
  };
  for_each_index<Sh>([&](const int64_t* idx) {
    if (idx[Axis] != 0) return;
    int64_t i[Sh::kRank];
    std::copy(idx, idx + Sh::kRank, i);
    for (int64_t j = 0; j < Sh::kDims[Axis]; ++j) {
      i[Axis] = j;
      buf[static_cast<size_t>(j)] = {static_cast<T>(e.at(i)), j};
    }
    // `before` is a total order (ties broken by index), so both give the same result; a full
    // sort (sort/argsort lower to k = n) is faster than a heap-based partial sort.
    if constexpr (K == Sh::kDims[Axis]) std::sort(buf.begin(), buf.end(), before);
    else std::partial_sort(buf.begin(), buf.begin() + K, buf.end(), before);
    for (int64_t j = 0; j < K; ++j) {
      i[Axis] = j;
      dv.at(i) = buf[static_cast<size_t>(j)].first;
      di.at(i) = buf[static_cast<size_t>(j)].second;
    }
  });
}

// Inclusive scan along Axis of Sh: d[.., j, ..] = combine(d[.., j - 1, ..], e[.., j, ..]),
// Kind as in chroma::scalar::scan_combine, accumulated in scalar::ScanAcc.
template <class Sh, int Axis, int Kind, class T, class D, class E> inline void scan(D d, E e) {
  using A = ::chroma::scalar::ScanAcc<Kind, T>;
  for_each_index<Sh>([&](const int64_t* idx) {
    if (idx[Axis] != 0) return;
    int64_t i[Sh::kRank];
    std::copy(idx, idx + Sh::kRank, i);
    A acc = static_cast<A>(static_cast<T>(e.at(i)));
    d.at(i) = static_cast<T>(acc);
    for (int64_t j = 1; j < Sh::kDims[Axis]; ++j) {
      i[Axis] = j;
      acc = ::chroma::scalar::scan_combine<Kind, A>(acc, static_cast<A>(static_cast<T>(e.at(i))));
      d.at(i) = static_cast<T>(acc);
    }
  });
}

// ---- matrix products -----------------------------------------------------------------------

// Portable C = op(A) op(B) (row-major, beta = 0), the `blas=False` path and the integer path.
// Accumulates in T; i-k-j order so the inner loop streams rows of B and C.
template <class T>
inline void gemm_ref(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                     const T* b, int64_t ldb, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    T* ci = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) ci[j] = T(0);
    for (int64_t p = 0; p < k; ++p) {
      const T av = ta ? a[p * lda + i] : a[i * lda + p];
      if (!tb) {
        const T* bp = b + p * ldb;
        for (int64_t j = 0; j < n; ++j) ci[j] += av * bp[j];
      } else {
        for (int64_t j = 0; j < n; ++j) ci[j] += av * b[j * ldb + p];
      }
    }
  }
}

}  // namespace chroma::et
