// Dense linear algebra through LAPACK (OpenBLAS ships LAPACK's Fortran symbols): the run-time
// kernels of the IR primitive Linalg (src/ir/ops.def), shared by the generated code and the
// reference interpreter (src/interp/eval_linalg.cpp), so folding and run time compute the same.
//
// Tensors are row-major; LAPACK is column-major. Every matrix is transposed into a
// column-major scratch copy, factored, and transposed back, so the logical matrix (and its
// "upper"/"lower" triangle) is the same on both sides. Matrices are batched over the leading
// dims; each matrix is processed independently. LAPACK's `info` is returned where the op has
// an info output (cholesky, lu); otherwise failures give whatever LAPACK leaves (NaN, inf).
//
// Kinds (outputs; a vector counts as a [1, k] matrix in `dims`):
//   kCholesky  a[n,n]                 -> factor[n,n] (other triangle zero), info i32
//   kLu        a[m,n]                 -> lu[m,n], pivots i32[min(m,n)] (1-based), info i32
//   kTriSolve  a[s,s], b[m,k]         -> x[m,k]: op(A) X = B (kLeft) or X op(A) = B, op = A or A^T
//   kGeqrf     a[m,n]                 -> qr[m,n], tau[min(m,n)]
//   kOrgqr     a[m,n], tau[k]         -> q[m,n] (Householder product, k <= n <= m)
//   kOrmqr     a[r,c], tau[k], x[m,n] -> op(Q) X (kLeft) or X op(Q), op = Q or Q^T (kTrans)
//   kEigh      a[n,n]                 -> w[n] ascending (, v[n,n] eigenvectors as columns with kVectors)
//   kSvd       a[m,n]                 -> s[min(m,n)] descending (, u, vh with kVectors; kFull: square u, vh)
//   kLdl       a[n,n]                 -> ld[n,n] (L and D of Bunch-Kaufman, lower; upper zero), pivots i32[n]
//                                        (LAPACK's: 1-based, negative for 2x2 blocks), info i32
//   kLdlSolve  ld[n,n], pivots i32[n] (the only non-float input), b[n,k] -> x with A x = b
//   kExpm      a[n,n]                 -> exp(a): scaling and squaring with the [13/13] Pade
//                                        approximant (Higham 2005), computed in double
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "chroma/linalg_kinds.h"

extern "C" {
#define CHROMA_LAPACK_DECL(T, p)                                                                                        \
  void p##potrf_(const char*, const int*, T*, const int*, int*, size_t);                                               \
  void p##getrf_(const int*, const int*, T*, const int*, int*, int*);                                                  \
  void p##trsm_(const char*, const char*, const char*, const char*, const int*, const int*, const T*, const T*,        \
                const int*, T*, const int*, size_t, size_t, size_t, size_t);                                           \
  void p##geqrf_(const int*, const int*, T*, const int*, T*, T*, const int*, int*);                                    \
  void p##orgqr_(const int*, const int*, const int*, T*, const int*, const T*, T*, const int*, int*);                  \
  void p##ormqr_(const char*, const char*, const int*, const int*, const int*, const T*, const int*, const T*, T*,     \
                 const int*, T*, const int*, int*, size_t, size_t);                                                    \
  void p##syevd_(const char*, const char*, const int*, T*, const int*, T*, T*, const int*, int*, const int*, int*,     \
                 size_t, size_t);                                                                                      \
  void p##gesdd_(const char*, const int*, const int*, T*, const int*, T*, T*, const int*, T*, const int*, T*,          \
                 const int*, int*, int*, size_t);                                                               \
  void p##sytrf_(const char*, const int*, T*, const int*, int*, T*, const int*, int*, size_t);                         \
  void p##sytrs_(const char*, const int*, const int*, const T*, const int*, const int*, T*, const int*, int*, size_t);
CHROMA_LAPACK_DECL(float, s)
CHROMA_LAPACK_DECL(double, d)
#undef CHROMA_LAPACK_DECL
void dgetrs_(const char*, const int*, const int*, const double*, const int*, const int*, double*, const int*, int*, size_t);
}

namespace chroma::linalg {

namespace detail {

// Overloads picking the s/d routine.
#define CHROMA_LAPACK_WRAP(T, p)                                                                                        \
  inline void potrf(char u, int n, T* a, int lda, int* info) { p##potrf_(&u, &n, a, &lda, info, 1); }                  \
  inline void getrf(int m, int n, T* a, int lda, int* piv, int* info) { p##getrf_(&m, &n, a, &lda, piv, info); }       \
  inline void trsm(char side, char uplo, char tr, char diag, int m, int n, T* a, int lda, T* b, int ldb) {             \
    const T one = 1;                                                                                                   \
    p##trsm_(&side, &uplo, &tr, &diag, &m, &n, &one, a, &lda, b, &ldb, 1, 1, 1, 1);                                    \
  }                                                                                                                    \
  inline void geqrf(int m, int n, T* a, int lda, T* tau, T* w, int lw, int* info) {                                    \
    p##geqrf_(&m, &n, a, &lda, tau, w, &lw, info);                                                                     \
  }                                                                                                                    \
  inline void orgqr(int m, int n, int k, T* a, int lda, const T* tau, T* w, int lw, int* info) {                       \
    p##orgqr_(&m, &n, &k, a, &lda, tau, w, &lw, info);                                                                 \
  }                                                                                                                    \
  inline void ormqr(char side, char tr, int m, int n, int k, const T* a, int lda, const T* tau, T* c, int ldc, T* w,  \
                    int lw, int* info) {                                                                               \
    p##ormqr_(&side, &tr, &m, &n, &k, a, &lda, tau, c, &ldc, w, &lw, info, 1, 1);                                      \
  }                                                                                                                    \
  inline void syevd(char jobz, char uplo, int n, T* a, int lda, T* w, T* wk, int lw, int* iw, int liw, int* info) {    \
    p##syevd_(&jobz, &uplo, &n, a, &lda, w, wk, &lw, iw, &liw, info, 1, 1);                                            \
  }                                                                                                                    \
  inline void gesdd(char jobz, int m, int n, T* a, int lda, T* s, T* u, int ldu, T* vt, int ldvt, T* w, int lw,       \
                    int* iw, int* info) {                                                                              \
    p##gesdd_(&jobz, &m, &n, a, &lda, s, u, &ldu, vt, &ldvt, w, &lw, iw, info, 1);                                     \
  }                                                                                                                    \
  inline void sytrf(int n, T* a, int lda, int* piv, T* w, int lw, int* info) {                                         \
    const char u = 'L';                                                                                                \
    p##sytrf_(&u, &n, a, &lda, piv, w, &lw, info, 1);                                                                  \
  }                                                                                                                    \
  inline void sytrs(int n, int nrhs, const T* a, int lda, const int* piv, T* b, int ldb, int* info) {                  \
    const char u = 'L';                                                                                                \
    p##sytrs_(&u, &n, &nrhs, a, &lda, piv, b, &ldb, info, 1);                                                          \
  }
CHROMA_LAPACK_WRAP(float, s)
CHROMA_LAPACK_WRAP(double, d)
#undef CHROMA_LAPACK_WRAP

inline int ld(int64_t rows) { return static_cast<int>(std::max<int64_t>(rows, 1)); }

// Row-major [rows, cols] -> column-major with leading dimension `rows`.
template <class T> void to_col(const T* src, int64_t rows, int64_t cols, T* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * rows + i] = src[i * cols + j];
}
// Column-major (leading dimension ldc) -> row-major [rows, cols].
template <class T> void from_col(const T* src, int64_t rows, int64_t cols, int64_t ldc, T* dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = src[j * ldc + i];
}
// A LAPACK workspace size returned by a query (as a float value).
template <class T> int work_size(T w) { return std::max(1, static_cast<int>(w)); }

}  // namespace detail

// exp of the n x n column-major matrix a (in place), in double.
inline void expm(int64_t n, double* a) {
  static constexpr double b[14] = {64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0,
                                   129060195264000.0,   10559470521600.0,    670442572800.0,     33522128640.0,
                                   1323241920.0,        40840800.0,          960960.0,           16380.0,
                                   182.0,               1.0};
  constexpr double theta13 = 5.371920351148152;
  const size_t nn = static_cast<size_t>(n * n);
  auto mul = [n](const double* x, const double* y, double* z) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < n; ++i) z[j * n + i] = 0;
      for (int64_t k = 0; k < n; ++k) {
        const double ykj = y[j * n + k];
        for (int64_t i = 0; i < n; ++i) z[j * n + i] += x[k * n + i] * ykj;
      }
    }
  };
  double norm1 = 0;
  for (int64_t j = 0; j < n; ++j) {
    double c = 0;
    for (int64_t i = 0; i < n; ++i) c += a[j * n + i] < 0 ? -a[j * n + i] : a[j * n + i];
    norm1 = c > norm1 ? c : norm1;
  }
  int s = 0;
  while (norm1 > theta13 && s < 1000) {
    norm1 /= 2;
    ++s;
  }
  const double scale = std::ldexp(1.0, -s);
  for (size_t i = 0; i < nn; ++i) a[i] *= scale;
  std::vector<double> a2(nn), a4(nn), a6(nn), t(nn), u(nn), v(nn);
  mul(a, a, a2.data());
  mul(a2.data(), a2.data(), a4.data());
  mul(a4.data(), a2.data(), a6.data());
  for (size_t i = 0; i < nn; ++i) t[i] = b[13] * a6[i] + b[11] * a4[i] + b[9] * a2[i];
  mul(a6.data(), t.data(), u.data());
  for (size_t i = 0; i < nn; ++i) u[i] += b[7] * a6[i] + b[5] * a4[i] + b[3] * a2[i];
  for (int64_t i = 0; i < n; ++i) u[static_cast<size_t>(i * n + i)] += b[1];
  mul(a, u.data(), t.data());  // U
  for (size_t i = 0; i < nn; ++i) u[i] = b[12] * a6[i] + b[10] * a4[i] + b[8] * a2[i];
  mul(a6.data(), u.data(), v.data());
  for (size_t i = 0; i < nn; ++i) v[i] += b[6] * a6[i] + b[4] * a4[i] + b[2] * a2[i];
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i * n + i)] += b[0];
  // (V - U) R = (V + U)
  for (size_t i = 0; i < nn; ++i) {
    u[i] = v[i] - t[i];
    a[i] = v[i] + t[i];
  }
  std::vector<int> piv(static_cast<size_t>(n));
  int info = 0;
  const int ni = static_cast<int>(n);
  dgetrf_(&ni, &ni, u.data(), &ni, piv.data(), &info);
  const char tr = 'N';
  dgetrs_(&tr, &ni, &ni, u.data(), &ni, piv.data(), a, &ni, &info, 1);
  for (int k = 0; k < s; ++k) {
    mul(a, a, t.data());
    std::copy(t.begin(), t.end(), a);
  }
}

namespace detail {

// One matrix of run()'s batch, for the function of its kind: its index bi in the batch, the
// first input's sizes (m x n, mn = min(m, n)), run()'s dims, flags and pointers, src (this
// matrix of the first input) and a, a column-major scratch of m x n elements (at least one)
// shared by the batch.
template <class T> struct Job {
  int64_t bi, m, n, mn;
  const int64_t* dims;
  int flags;
  char uplo;
  const T* src;
  const T* const* in;
  void* const* out;
  T* a;
};

template <class T> void run_cholesky(const Job<T>& job) {
  const int64_t bi = job.bi, n = job.n;
  const char uplo = job.uplo;
  const int flags = job.flags;
  const T* src = job.src;
  void* const* out = job.out;
  T* a = job.a;
  int info = 0;
  to_col(src, n, n, a);
  if (n > 0) potrf(uplo, static_cast<int>(n), a, ld(n), &info);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < n; ++i)
      if ((flags & kUpper) ? i > j : i < j) a[static_cast<size_t>(j * n + i)] = T(0);
  from_col(a, n, n, n, static_cast<T*>(out[0]) + bi * n * n);
  static_cast<int32_t*>(out[1])[bi] = n > 0 ? info : 0;
}

template <class T> void run_lu(const Job<T>& job) {
  const int64_t bi = job.bi, m = job.m, n = job.n, mn = job.mn;
  const T* src = job.src;
  void* const* out = job.out;
  T* a = job.a;
  int info = 0;
  to_col(src, m, n, a);
  int32_t* piv = static_cast<int32_t*>(out[1]) + bi * mn;
  if (mn > 0) getrf(static_cast<int>(m), static_cast<int>(n), a, ld(m), piv, &info);
  from_col(a, m, n, m, static_cast<T*>(out[0]) + bi * m * n);
  static_cast<int32_t*>(out[2])[bi] = info;
}

template <class T> void run_tri_solve(const Job<T>& job) {
  const int64_t bi = job.bi, m = job.m;
  const char uplo = job.uplo;
  const int64_t* dims = job.dims;
  const int flags = job.flags;
  const T* src = job.src;
  const T* const* in = job.in;
  void* const* out = job.out;
  T* a = job.a;
  const int64_t bm = dims[2], bk = dims[3];
  std::vector<T> x(static_cast<size_t>(std::max<int64_t>(bm * bk, 1)));
  to_col(src, m, m, a);
  to_col(in[1] + bi * bm * bk, bm, bk, x.data());
  if (bm > 0 && bk > 0) {
    trsm((flags & kLeft) ? 'L' : 'R', uplo, (flags & kTrans) ? 'T' : 'N', (flags & kUnit) ? 'U' : 'N',
         static_cast<int>(bm), static_cast<int>(bk), a, ld(m), x.data(), ld(bm));
  }
  from_col(x.data(), bm, bk, bm, static_cast<T*>(out[0]) + bi * bm * bk);
}

template <class T> void run_geqrf(const Job<T>& job) {
  const int64_t bi = job.bi, m = job.m, n = job.n, mn = job.mn;
  const T* src = job.src;
  void* const* out = job.out;
  T* a = job.a;
  int info = 0;
  to_col(src, m, n, a);
  T* tau = static_cast<T*>(out[1]) + bi * mn;
  if (mn > 0) {
    T q = 0;
    geqrf(static_cast<int>(m), static_cast<int>(n), a, ld(m), tau, &q, -1, &info);
    std::vector<T> w(static_cast<size_t>(work_size(q)));
    geqrf(static_cast<int>(m), static_cast<int>(n), a, ld(m), tau, w.data(), static_cast<int>(w.size()), &info);
  }
  from_col(a, m, n, m, static_cast<T*>(out[0]) + bi * m * n);
}

template <class T> void run_orgqr(const Job<T>& job) {
  const int64_t bi = job.bi, m = job.m, n = job.n;
  const int64_t* dims = job.dims;
  const T* src = job.src;
  const T* const* in = job.in;
  void* const* out = job.out;
  T* a = job.a;
  int info = 0;
  const int64_t k = dims[3];
  to_col(src, m, n, a);
  if (n > 0) {
    const T* tau = in[1] + bi * k;
    T q = 0;
    orgqr(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), a, ld(m), tau, &q, -1, &info);
    std::vector<T> w(static_cast<size_t>(work_size(q)));
    orgqr(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), a, ld(m), tau, w.data(),
          static_cast<int>(w.size()), &info);
  }
  from_col(a, m, n, m, static_cast<T*>(out[0]) + bi * m * n);
}

template <class T> void run_ormqr(const Job<T>& job) {
  const int64_t bi = job.bi, m = job.m, n = job.n;
  const int64_t* dims = job.dims;
  const int flags = job.flags;
  const T* src = job.src;
  const T* const* in = job.in;
  void* const* out = job.out;
  T* a = job.a;
  int info = 0;
  const int64_t k = dims[3], cm = dims[4], cn = dims[5];
  std::vector<T> c(static_cast<size_t>(std::max<int64_t>(cm * cn, 1)));
  to_col(src, m, n, a);
  to_col(in[2] + bi * cm * cn, cm, cn, c.data());
  if (cm > 0 && cn > 0) {
    const T* tau = in[1] + bi * k;
    const char side = (flags & kLeft) ? 'L' : 'R', tr = (flags & kTrans) ? 'T' : 'N';
    T q = 0;
    ormqr(side, tr, static_cast<int>(cm), static_cast<int>(cn), static_cast<int>(k), a, ld(m), tau, c.data(),
          ld(cm), &q, -1, &info);
    std::vector<T> w(static_cast<size_t>(work_size(q)));
    ormqr(side, tr, static_cast<int>(cm), static_cast<int>(cn), static_cast<int>(k), a, ld(m), tau, c.data(),
          ld(cm), w.data(), static_cast<int>(w.size()), &info);
  }
  from_col(c.data(), cm, cn, cm, static_cast<T*>(out[0]) + bi * cm * cn);
}

template <class T> void run_eigh(const Job<T>& job) {
  const int64_t bi = job.bi, n = job.n;
  const char uplo = job.uplo;
  const int flags = job.flags;
  const T* src = job.src;
  void* const* out = job.out;
  T* a = job.a;
  int info = 0;
  const bool vec = flags & kVectors;
  to_col(src, n, n, a);
  T* w = static_cast<T*>(out[0]) + bi * n;
  if (n > 0) {
    const char jobz = vec ? 'V' : 'N';
    T q = 0;
    int iq = 0;
    syevd(jobz, uplo, static_cast<int>(n), a, ld(n), w, &q, -1, &iq, -1, &info);
    std::vector<T> wk(static_cast<size_t>(work_size(q)));
    std::vector<int> iw(static_cast<size_t>(std::max(iq, 1)));
    syevd(jobz, uplo, static_cast<int>(n), a, ld(n), w, wk.data(), static_cast<int>(wk.size()), iw.data(),
          static_cast<int>(iw.size()), &info);
  }
  if (vec) from_col(a, n, n, n, static_cast<T*>(out[1]) + bi * n * n);
}

template <class T> void run_svd(const Job<T>& job) {
  const int64_t bi = job.bi, m = job.m, n = job.n, mn = job.mn;
  const int flags = job.flags;
  const T* src = job.src;
  void* const* out = job.out;
  T* a = job.a;
  int info = 0;
  const bool vec = flags & kVectors, full = flags & kFull;
  const int64_t uc = full ? m : mn, vr = full ? n : mn;
  to_col(src, m, n, a);
  T* s = static_cast<T*>(out[0]) + bi * mn;
  std::vector<T> u(static_cast<size_t>(vec ? std::max<int64_t>(m * uc, 1) : 1));
  std::vector<T> vt(static_cast<size_t>(vec ? std::max<int64_t>(vr * n, 1) : 1));
  if (mn > 0) {
    const char jobz = vec ? (full ? 'A' : 'S') : 'N';
    std::vector<int> iw(static_cast<size_t>(8 * mn));
    T q = 0;
    gesdd(jobz, static_cast<int>(m), static_cast<int>(n), a, ld(m), s, u.data(), ld(m), vt.data(), ld(vr), &q,
          -1, iw.data(), &info);
    std::vector<T> wk(static_cast<size_t>(work_size(q)));
    gesdd(jobz, static_cast<int>(m), static_cast<int>(n), a, ld(m), s, u.data(), ld(m), vt.data(), ld(vr),
          wk.data(), static_cast<int>(wk.size()), iw.data(), &info);
  } else if (vec && full) {
    // An empty matrix: PyTorch returns identity factors for the non-empty side.
    std::fill(u.begin(), u.end(), T(0));
    std::fill(vt.begin(), vt.end(), T(0));
    for (int64_t i = 0; i < m; ++i) u[static_cast<size_t>(i * m + i)] = T(1);
    for (int64_t i = 0; i < n; ++i) vt[static_cast<size_t>(i * n + i)] = T(1);
  }
  if (vec) {
    from_col(u.data(), m, uc, m, static_cast<T*>(out[1]) + bi * m * uc);
    from_col(vt.data(), vr, n, vr, static_cast<T*>(out[2]) + bi * vr * n);
  }
}

template <class T> void run_ldl(const Job<T>& job) {
  const int64_t bi = job.bi, n = job.n;
  const T* src = job.src;
  void* const* out = job.out;
  T* a = job.a;
  int info = 0;
  to_col(src, n, n, a);
  int32_t* piv = static_cast<int32_t*>(out[1]) + bi * n;
  if (n > 0) {
    T q = 0;
    sytrf(static_cast<int>(n), a, ld(n), piv, &q, -1, &info);
    std::vector<T> w(static_cast<size_t>(work_size(q)));
    sytrf(static_cast<int>(n), a, ld(n), piv, w.data(), static_cast<int>(w.size()), &info);
  }
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < j; ++i) a[static_cast<size_t>(j * n + i)] = T(0);
  from_col(a, n, n, n, static_cast<T*>(out[0]) + bi * n * n);
  static_cast<int32_t*>(out[2])[bi] = info;
}

template <class T> void run_ldl_solve(const Job<T>& job) {
  const int64_t bi = job.bi, n = job.n;
  const int64_t* dims = job.dims;
  const T* src = job.src;
  const T* const* in = job.in;
  void* const* out = job.out;
  T* a = job.a;
  int info = 0;
  const int64_t bm = dims[4], bk = dims[5];
  std::vector<T> x(static_cast<size_t>(std::max<int64_t>(bm * bk, 1)));
  to_col(src, n, n, a);
  to_col(in[2] + bi * bm * bk, bm, bk, x.data());
  const int32_t* piv = reinterpret_cast<const int32_t*>(in[1]) + bi * n;
  if (n > 0 && bk > 0) sytrs(static_cast<int>(n), static_cast<int>(bk), a, ld(n), piv, x.data(), ld(bm), &info);
  from_col(x.data(), bm, bk, bm, static_cast<T*>(out[0]) + bi * bm * bk);
}

template <class T> void run_expm(const Job<T>& job) {
  const int64_t bi = job.bi, n = job.n;
  const T* src = job.src;
  void* const* out = job.out;
  std::vector<double> w(static_cast<size_t>(std::max<int64_t>(n * n, 1)));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) w[static_cast<size_t>(j * n + i)] = static_cast<double>(src[i * n + j]);
  if (n > 0) expm(n, w.data());
  T* o = static_cast<T*>(out[0]) + bi * n * n;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) o[i * n + j] = static_cast<T>(w[static_cast<size_t>(j * n + i)]);
}

}  // namespace detail

// Runs `kind` over `batch` matrices. dims: the last two dims of each input, in order (a
// vector as [1, k]). in: the inputs (dense, row-major); out: the outputs (T, or int32 for
// pivots and info).
template <class T>
void run(int kind, int flags, int64_t batch, const int64_t* dims, const T* const* in, void* const* out) {
  using namespace detail;
  const int64_t m = dims[0], n = dims[1], mn = std::min(m, n);
  const char uplo = (flags & kUpper) ? 'U' : 'L';
  std::vector<T> a(static_cast<size_t>(std::max<int64_t>(m * n, 1)));
  for (int64_t bi = 0; bi < batch; ++bi) {
    const Job<T> job{bi, m, n, mn, dims, flags, uplo, in[0] + bi * m * n, in, out, a.data()};
    switch (kind) {
      case kCholesky: run_cholesky(job); break;
      case kLu: run_lu(job); break;
      case kTriSolve: run_tri_solve(job); break;
      case kGeqrf: run_geqrf(job); break;
      case kOrgqr: run_orgqr(job); break;
      case kOrmqr: run_ormqr(job); break;
      case kEigh: run_eigh(job); break;
      case kSvd: run_svd(job); break;
      case kLdl: run_ldl(job); break;
      case kLdlSolve: run_ldl_solve(job); break;
      case kExpm: run_expm(job); break;
      default: break;
    }
  }
}

}  // namespace chroma::linalg
