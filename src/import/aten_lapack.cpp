// ATen dense linear algebra over the LAPACK-backed Linalg primitive (include/chroma/cpu/linalg.h):
// Cholesky, LU, triangular solves, QR, symmetric eigen, SVD, and what decomposes over them
// (det/slogdet from the LU diagonal and the pivot sign, inv/solve through LU, pinv through
// the SVD or the eigen decomposition, cholesky_solve/inverse as two triangular solves).
//
// The checks eager PyTorch runs on the results (`_linalg_check_errors`: singular or not
// positive-definite input) are dropped by the exporter: a compiled program cannot raise.
// The `_ex` ops return LAPACK's `info` exactly; the others give what LAPACK gives.
#include "chroma/linalg_kinds.h"
#include "import/aten.h"
#include "import/graph_util.h"

namespace chroma {
namespace {

namespace la = linalg;

// A Linalg node; all of its outputs.
std::vector<Value> lapack(Call& c, int kind, int flags, std::vector<Value> ins) {
  Builder& b = c.b;
  const TensorType& x = b.type(ins[0]);
  if (x.dtype != DType::kF32 && x.dtype != DType::kF64) {
    c.fail(std::string(la::kKindNames[kind]) + " of " + x.str() + ": only float32 and float64 are supported");
  }
  for (size_t i = 0; i < ins.size(); ++i) {
    const DType want = kind == la::kLdlSolve && i == 1 ? DType::kI32 : x.dtype;  // ldl_solve's pivots
    if (b.type(ins[i]).dtype != want) ins[i] = b.cast(ins[i], want);
  }
  Attrs a;
  a.k = kind;
  a.start = flags;
  Value v = b.graph().add(Op::kLinalg, ins, a);
  std::vector<Value> r;
  for (int32_t i = 0; i < static_cast<int32_t>(b.graph().node(v).types.size()); ++i) r.push_back(Value{v.node, i});
  return r;
}

Shape batch_of(const TensorType& t, size_t mat_rank = 2) { return Shape(t.shape.begin(), t.shape.end() - static_cast<int64_t>(mat_rank)); }

// Expands the batch dims of x (matrix rank xr) to `batch`.
Value to_batch(Builder& b, Value x, const Shape& batch, size_t xr = 2) {
  const TensorType& t = b.type(x);
  Shape s = batch;
  s.insert(s.end(), t.shape.end() - static_cast<int64_t>(xr), t.shape.end());
  return s == t.shape ? x : b.expand(x, s);
}

// Matrix-shaped mask over the last two dims: col - row >= diag (triu) or <= diag (tril).
Value tri_mask(Builder& b, int64_t m, int64_t n, int64_t diag, bool upper) {
  Value d = gu::iota(b, DType::kI64, {m, n}, {-1.0, 1.0}, 0);
  return b.ew(upper ? EwOp::k_ge : EwOp::k_le, d, Scalar::of_int(diag));
}
Value tri(Builder& b, Value x, int64_t diag, bool upper) {
  const TensorType& t = b.type(x);
  const size_t r = t.shape.size();
  Value mask = b.expand(tri_mask(b, t.shape[r - 2], t.shape[r - 1], diag, upper), t.shape);
  return gu::where(b, mask, x, b.full(Scalar::of_int(0), t.dtype, t.shape));
}

Value identity(Builder& b, DType t, int64_t n, const Shape& batch) {
  Value eye = b.cast(b.ew(EwOp::k_eq, gu::iota(b, DType::kI64, {n, n}, {-1.0, 1.0}, 0), Scalar::of_int(0)), t);
  Shape s = batch;
  s.push_back(n);
  s.push_back(n);
  return b.expand(eye, s);
}

// The diagonal [..., min(m, n)] of x [..., m, n].
Value diagonal(Builder& b, Value x) {
  const TensorType& t = b.type(x);
  const size_t r = t.shape.size();
  const int64_t m = t.shape[r - 2], n = t.shape[r - 1], k = std::min(m, n);
  Shape flat = batch_of(t);
  flat.push_back(m * n);
  Value f = b.reshape(x, flat);
  if (k == 0) return b.slice(f, static_cast<int64_t>(r) - 2, 0, 0, 1);
  return b.slice(f, static_cast<int64_t>(r) - 2, 0, (k - 1) * (n + 1) + 1, n + 1);
}

// The row permutation of an LU factorization: perm[..., i] is the row of A that row i of
// L U comes from (A[perm[i]] = (L U)[i]), from LAPACK's sequential 1-based row swaps.
Value lu_perm(Builder& b, Value piv, int64_t m) {
  const TensorType& pt = b.type(piv);
  const Shape batch = batch_of(pt, 1);
  const int64_t k = pt.shape.back();
  const int64_t ax = static_cast<int64_t>(batch.size());
  Shape s = batch;
  s.push_back(m);
  std::vector<double> coeffs(s.size(), 0.0);
  coeffs.back() = 1.0;
  Value pos = gu::iota(b, DType::kI64, s, coeffs, 0);
  Value perm = pos;
  Value p64 = b.ew(EwOp::k_sub, b.cast(piv, DType::kI64), Scalar::of_int(1));
  for (int64_t i = 0; i < k; ++i) {
    Value j = b.slice(p64, ax, i, i + 1, 1);  // [batch, 1]
    Value at_i = b.slice(perm, ax, i, i + 1, 1);
    Attrs ga;
    ga.axis = ax;
    Value at_j = b.graph().add(Op::kGatherElements, {perm, j}, ga);
    Value is_i = b.ew(EwOp::k_eq, pos, Scalar::of_int(i));
    Value is_j = b.ew(EwOp::k_eq, pos, b.expand(j, s));
    perm = gu::where(b, is_i, b.expand(at_j, s), gu::where(b, is_j, b.expand(at_i, s), perm));
  }
  return perm;
}

// P [..., m, m] with A = P L U: P[r, c] = (perm[c] == r).
Value perm_matrix(Builder& b, Value perm, DType t) {
  const TensorType& pt = b.type(perm);
  const int64_t m = pt.shape.back();
  Shape s = pt.shape;
  s.insert(s.end() - 1, m);
  Value cols = b.expand(b.unsqueeze(perm, -2), s);
  std::vector<double> coeffs(s.size(), 0.0);
  coeffs[s.size() - 2] = 1.0;
  Value rows = gu::iota(b, DType::kI64, s, coeffs, 0);
  return b.cast(b.ew(EwOp::k_eq, cols, rows), t);
}

// Rows of x [..., m, n] reordered: out[..., i, :] = x[..., perm[i], :].
Value permute_rows(Builder& b, Value x, Value perm) {
  const TensorType& t = b.type(x);
  Value idx = b.expand(b.unsqueeze(perm, -1), t.shape);
  Attrs a;
  a.axis = t.rank() - 2;
  return b.graph().add(Op::kGatherElements, {x, idx}, a);
}

// (P, L, U) from LU [..., m, n] and 1-based pivots.
std::vector<Value> lu_unpack(Builder& b, Value lu, Value piv) {
  const TensorType& t = b.type(lu);
  const size_t r = t.shape.size();
  const int64_t m = t.shape[r - 2], n = t.shape[r - 1], k = std::min(m, n);
  const int64_t ax = static_cast<int64_t>(r);
  Value l = tri(b, b.slice(lu, ax - 1, 0, k, 1), -1, false);
  l = b.ew(EwOp::k_add, l, b.slice(b.slice(identity(b, t.dtype, std::max(m, k), batch_of(t)), ax - 2, 0, m, 1), ax - 1, 0, k, 1));
  Value u = tri(b, b.slice(lu, ax - 2, 0, k, 1), 0, true);
  Value p = perm_matrix(b, lu_perm(b, piv, m), t.dtype);
  return {p, l, u};
}

// Solves A X = B (adjoint: A^T X = B) given A's LU factorization; B [..., n, k], same batch.
Value lu_solve(Call& c, Value lu, Value piv, Value rhs, bool adjoint) {
  Builder& b = c.b;
  const int64_t n = b.type(lu).shape.back();
  Value perm = lu_perm(b, piv, n);
  if (!adjoint) {
    Value y = permute_rows(b, rhs, perm);
    y = lapack(c, la::kTriSolve, la::kLeft | la::kUnit, {lu, y})[0];
    return lapack(c, la::kTriSolve, la::kLeft | la::kUpper, {lu, y})[0];
  }
  Value y = lapack(c, la::kTriSolve, la::kLeft | la::kUpper | la::kTrans, {lu, rhs})[0];
  y = lapack(c, la::kTriSolve, la::kLeft | la::kUnit | la::kTrans, {lu, y})[0];
  // X = P Y: X[perm[i]] = Y[i], i.e. X = P^T-rows of Y with the inverse permutation.
  return b.matmul(perm_matrix(b, perm, b.type(y).dtype), y);
}

// Broadcasts the batch dims of a [..., p, q] and rhs [..., r, s].
void broadcast_batch(Builder& b, Value& a, Value& rhs, size_t ar = 2, size_t rr = 2) {
  const Shape batch = Builder::broadcast_shapes(batch_of(b.type(a), ar), batch_of(b.type(rhs), rr));
  a = to_batch(b, a, batch, ar);
  rhs = to_batch(b, rhs, batch, rr);
}

void need_square(Call& c, Value a, const char* op) {
  const TensorType& t = c.b.type(a);
  if (t.rank() < 2 || t.shape[t.shape.size() - 1] != t.shape[t.shape.size() - 2]) {
    c.fail(std::string(op) + ": needs square matrices, got " + t.str());
  }
}

// A X = B for B [..., n, k] (left) or X A = B (right: A^T X^T = B^T).
std::vector<Value> solve(Call& c, Value a, Value rhs, bool left, bool vector_rhs) {
  Builder& b = c.b;
  need_square(c, a, "solve");
  if (vector_rhs) rhs = b.unsqueeze(rhs, -1);
  // LU of A as given (an output); the solve runs over the broadcast batch.
  std::vector<Value> f = lapack(c, la::kLu, 0, {a});
  const Shape batch = Builder::broadcast_shapes(batch_of(b.type(a)), batch_of(b.type(rhs)));
  Value lu = to_batch(b, f[0], batch), piv = to_batch(b, f[1], batch, 1);
  rhs = to_batch(b, rhs, batch);
  Value x = left ? lu_solve(c, lu, piv, rhs, false)
                 : b.transpose(lu_solve(c, lu, piv, b.transpose(rhs, -1, -2), true), -1, -2);
  if (vector_rhs) x = b.reshape(x, Shape(b.type(x).shape.begin(), b.type(x).shape.end() - 1));
  return {x, f[0], f[1], f[2]};
}

// Cholesky solve: A X = B with A = L L^T (or U^T U).
Value cholesky_solve(Call& c, Value rhs, Value l, bool upper) {
  broadcast_batch(c.b, l, rhs);
  if (upper) {
    Value y = lapack(c, la::kTriSolve, la::kLeft | la::kUpper | la::kTrans, {l, rhs})[0];
    return lapack(c, la::kTriSolve, la::kLeft | la::kUpper, {l, y})[0];
  }
  Value y = lapack(c, la::kTriSolve, la::kLeft, {l, rhs})[0];
  return lapack(c, la::kTriSolve, la::kLeft | la::kTrans, {l, y})[0];
}

// det and slogdet pieces from an LU factorization: diag [..., n] and the pivot sign (+-1).
Value pivot_sign(Builder& b, Value piv, DType t) {
  const TensorType& pt = b.type(piv);
  std::vector<double> coeffs(pt.shape.size(), 0.0);
  coeffs.back() = 1.0;
  Value pos = gu::iota(b, DType::kI32, pt.shape, coeffs, 1);
  Value swapped = b.ew(EwOp::k_ne, piv, pos);
  Value f = b.ew(EwOp::k_where, {Operand::of(swapped), Operand::of(Scalar::of_int(-1)), Operand::of(Scalar::of_int(1))}, t);
  return b.reduce(ReduceKind::kProd, f, {pt.rank() - 1}, false);
}

std::vector<Value> svd(Call& c, Value a, bool full, bool uv) {
  std::vector<Value> r = lapack(c, la::kSvd, (full ? la::kFull : 0) | (uv ? la::kVectors : 0), {a});
  return r;
}

Value zeros_of(Call& c, size_t k) {
  const TensorType t = c.out_type(k);
  return c.b.full(Scalar::of_int(0), t.dtype, t.shape);
}

// Pseudo-inverse with PyTorch's tolerance rule: singular values <= max(atol, rtol * s_max)
// are treated as zero (rtol defaults to eps * max(m, n) when neither is given, to 0 when
// only atol is).
Value pinv(Call& c, Value a, std::optional<Value> atol, std::optional<Value> rtol, bool hermitian) {
  Builder& b = c.b;
  const TensorType t = b.type(a);
  const size_t r = t.shape.size();
  const int64_t m = t.shape[r - 2], n = t.shape[r - 1];
  const DType dt = t.dtype;
  Value s, u, vh, w;
  if (hermitian) {
    need_square(c, a, "pinv(hermitian=True)");
    std::vector<Value> e = lapack(c, la::kEigh, la::kVectors, {a});
    w = e[0];
    u = e[1];
    s = b.ew(EwOp::k_abs, w);
  } else {
    std::vector<Value> f = svd(c, a, false, true);
    s = f[0];
    u = f[1];
    vh = f[2];
  }
  const int64_t k = b.type(s).shape.back();
  const int64_t sax = b.type(s).rank() - 1;
  Shape sb = batch_of(t);
  sb.push_back(1);
  Value smax = k > 0 ? b.reduce(ReduceKind::kMax, s, {sax}, true) : b.full(Scalar::of_int(0), dt, sb);
  const double eps = dt == DType::kF32 ? 1.1920928955078125e-07 : 2.220446049250313e-16;
  Value rt = rtol ? b.cast(*rtol, dt) : b.full(Scalar::of_float(atol ? 0.0 : eps * static_cast<double>(std::max(m, n))), dt, {});
  if (b.type(rt).rank() > 0) rt = b.unsqueeze(rt, -1);
  Value tol = b.ew(EwOp::k_mul, smax, rt);
  if (atol) {
    Value at = b.cast(*atol, dt);
    if (b.type(at).rank() > 0) at = b.unsqueeze(at, -1);
    tol = b.ew(EwOp::k_maximum, tol, at);
  }
  Value keep = b.ew(EwOp::k_gt, s, tol);
  Value src = hermitian ? w : s;
  Value inv = gu::where(b, keep, b.ew(EwOp::k_reciprocal, src), b.full(Scalar::of_int(0), dt, b.type(src).shape));
  if (hermitian) {
    // V diag(1/w) V^T
    Value vs = b.ew(EwOp::k_mul, u, b.unsqueeze(inv, -2));
    return b.matmul(vs, b.transpose(u, -1, -2));
  }
  // V diag(1/s) U^T = Vh^T (inv * U^T)
  Value ut = b.ew(EwOp::k_mul, b.transpose(u, -1, -2), b.unsqueeze(inv, -1));
  return b.matmul(b.transpose(vh, -1, -2), ut);
}

std::optional<Value> opt_tensor(Call& c, size_t i, const char* name) {
  if (!c.is_tensor(i, name)) return std::nullopt;
  return c.tensor(i, name);
}

// Cholesky and LU: the factorizations, unpacking them and solving with them.
void register_cholesky_lu(HandlerTable& t) {
  t["aten.linalg_cholesky_ex.default"] = [](Call& c) {
    Value a = c.tensor(0, "self");
    need_square(c, a, "cholesky");
    return lapack(c, la::kCholesky, c.bool_or(1, "upper", false) ? la::kUpper : 0, {a});
  };
  t["aten.cholesky_solve.default"] = [](Call& c) {
    return std::vector<Value>{cholesky_solve(c, c.tensor(0, "self"), c.tensor(1, "input2"), c.bool_or(2, "upper", false))};
  };
  t["aten.cholesky_inverse.default"] = [](Call& c) {
    Value l = c.tensor(0, "self");
    need_square(c, l, "cholesky_inverse");
    const TensorType& lt = c.b.type(l);
    Value eye = identity(c.b, lt.dtype, lt.shape.back(), batch_of(lt));
    return std::vector<Value>{cholesky_solve(c, eye, l, c.bool_or(1, "upper", false))};
  };
  t["aten.linalg_lu_factor_ex.default"] = [](Call& c) {
    if (!c.bool_or(1, "pivot", true)) c.fail("LU without pivoting is not supported (LAPACK getrf always pivots)");
    return lapack(c, la::kLu, 0, {c.tensor(0, "A")});
  };
  t["aten.linalg_lu.default"] = [](Call& c) {
    if (!c.bool_or(1, "pivot", true)) c.fail("LU without pivoting is not supported (LAPACK getrf always pivots)");
    std::vector<Value> f = lapack(c, la::kLu, 0, {c.tensor(0, "A")});
    return lu_unpack(c.b, f[0], f[1]);
  };
  t["aten.lu_unpack.default"] = [](Call& c) {
    Value lu = c.tensor(0, "LU_data");
    Value piv = c.tensor(1, "LU_pivots");
    std::vector<Value> r = lu_unpack(c.b, lu, piv);
    if (!c.bool_or(2, "unpack_data", true)) r[1] = zeros_of(c, 1), r[2] = zeros_of(c, 2);
    if (!c.bool_or(3, "unpack_pivots", true)) r[0] = zeros_of(c, 0);
    return r;
  };
  t["aten.linalg_lu_solve.default"] = [](Call& c) {
    Builder& b = c.b;
    Value lu = c.tensor(0, "LU"), piv = c.tensor(1, "pivots"), rhs = c.tensor(2, "B");
    const bool left = c.bool_or(3, "left", true), adjoint = c.bool_or(4, "adjoint", false);
    need_square(c, lu, "lu_solve");
    const Shape batch = Builder::broadcast_shapes(batch_of(b.type(lu)), batch_of(b.type(rhs)));
    lu = to_batch(b, lu, batch);
    piv = to_batch(b, piv, batch, 1);
    rhs = to_batch(b, rhs, batch);
    if (left) return std::vector<Value>{lu_solve(c, lu, piv, rhs, adjoint)};
    // X A = B  <=>  A^T X^T = B^T;  X A^T = B  <=>  A X^T = B^T.
    Value x = lu_solve(c, lu, piv, b.transpose(rhs, -1, -2), !adjoint);
    return std::vector<Value>{b.transpose(x, -1, -2)};
  };
}

// Determinants, the inverse and the general and triangular solves.
void register_det_inv_solve(HandlerTable& t) {
  t["aten._linalg_det.default"] = [](Call& c) {
    Builder& b = c.b;
    Value a = c.tensor(0, "A");
    need_square(c, a, "det");
    std::vector<Value> f = lapack(c, la::kLu, 0, {a});
    const DType dt = b.type(f[0]).dtype;
    Value d = diagonal(b, f[0]);
    Value det = b.ew(EwOp::k_mul, b.reduce(ReduceKind::kProd, d, {b.type(d).rank() - 1}, false), pivot_sign(b, f[1], dt));
    return std::vector<Value>{det, f[0], f[1]};
  };
  t["aten._linalg_slogdet.default"] = [](Call& c) {
    Builder& b = c.b;
    Value a = c.tensor(0, "A");
    need_square(c, a, "slogdet");
    std::vector<Value> f = lapack(c, la::kLu, 0, {a});
    const DType dt = b.type(f[0]).dtype;
    Value d = diagonal(b, f[0]);
    const int64_t ax = b.type(d).rank() - 1;
    Value sign = b.ew(EwOp::k_mul, b.reduce(ReduceKind::kProd, b.ew(EwOp::k_sign, d), {ax}, false), pivot_sign(b, f[1], dt));
    Value logabs = b.sum(b.ew(EwOp::k_log, b.ew(EwOp::k_abs, d)), {ax}, false);
    return std::vector<Value>{sign, logabs, f[0], f[1]};
  };
  t["aten.linalg_inv_ex.default"] = [](Call& c) {
    Builder& b = c.b;
    Value a = c.tensor(0, "A");
    need_square(c, a, "inv");
    const TensorType& at = b.type(a);
    std::vector<Value> r = solve(c, a, identity(b, at.dtype, at.shape.back(), batch_of(at)), true, false);
    return std::vector<Value>{r[0], r[3]};
  };
  t["aten._linalg_solve_ex.default"] = [](Call& c) {
    Builder& b = c.b;
    Value a = c.tensor(0, "A"), rhs = c.tensor(1, "B");
    const bool left = c.bool_or(2, "left", true);
    const TensorType& at = b.type(a);
    const TensorType& bt = b.type(rhs);
    // PyTorch's rule: B is a (batch of) vector(s) if it is 1-D or has A's shape minus the last dim.
    const bool vec = bt.rank() == 1 ||
                     (bt.rank() == at.rank() - 1 && Shape(at.shape.begin(), at.shape.end() - 1) == bt.shape);
    if (vec && !left) c.fail("solve with left=False needs a matrix right-hand side");
    return solve(c, a, rhs, left, vec);
  };
  t["aten.linalg_solve_triangular.default"] = [](Call& c) {
    Builder& b = c.b;
    Value a = c.tensor(0, "self"), rhs = c.tensor(1, "B");
    need_square(c, a, "solve_triangular");
    const bool upper = c.bool_or(2, "upper", false), left = c.bool_or(3, "left", true), unit = c.bool_or(4, "unitriangular", false);
    broadcast_batch(b, a, rhs);
    return lapack(c, la::kTriSolve, (upper ? la::kUpper : 0) | (left ? la::kLeft : 0) | (unit ? la::kUnit : 0), {a, rhs});
  };
  t["aten.triangular_solve.default"] = [](Call& c) {
    Builder& b = c.b;
    Value rhs = c.tensor(0, "self"), a = c.tensor(1, "A");
    need_square(c, a, "triangular_solve");
    const bool upper = c.bool_or(2, "upper", true), tr = c.bool_or(3, "transpose", false), unit = c.bool_or(4, "unitriangular", false);
    Value a0 = a;
    broadcast_batch(b, a, rhs);
    Value x = lapack(c, la::kTriSolve, la::kLeft | (upper ? la::kUpper : 0) | (tr ? la::kTrans : 0) | (unit ? la::kUnit : 0), {a, rhs})[0];
    // The second output is a copy of A, broadcast.
    const TensorType want = c.out_type(1);
    return std::vector<Value>{x, b.type(a0).shape == want.shape ? a0 : a};
  };
}

// Eigen, singular value and QR factorizations and the functions derived from them (matrix
// square root, polar, matrix exponential, LDL, pseudo-inverse).
void register_spectral_qr(HandlerTable& t) {
  t["aten._linalg_eigh.default"] = [](Call& c) {
    Value a = c.tensor(0, "A");
    need_square(c, a, "eigh");
    const std::string uplo = c.str_or(1, "UPLO", "L");
    if (uplo != "L" && uplo != "U") c.fail("UPLO must be 'L' or 'U', got '" + uplo + "'");
    const bool vec = c.bool_or(2, "compute_v", true);
    std::vector<Value> r = lapack(c, la::kEigh, (uplo == "U" ? la::kUpper : 0) | (vec ? la::kVectors : 0), {a});
    if (!vec) r.push_back(zeros_of(c, 1));
    return r;
  };
  t["aten._linalg_svd.default"] = [](Call& c) {
    Value a = c.tensor(0, "A");
    if (c.has(3, "driver")) c.fail("svd: the `driver` argument is CUDA-only");
    const bool full = c.bool_or(1, "full_matrices", false), uv = c.bool_or(2, "compute_uv", true);
    std::vector<Value> r = svd(c, a, full, uv);
    if (!uv) return std::vector<Value>{zeros_of(c, 0), r[0], zeros_of(c, 2)};
    return std::vector<Value>{r[1], r[0], r[2]};
  };
  t["aten.geqrf.default"] = [](Call& c) { return lapack(c, la::kGeqrf, 0, {c.tensor(0, "self")}); };
  t["aten.linalg_householder_product.default"] = [](Call& c) {
    Value a = c.tensor(0, "input"), tau = c.tensor(1, "tau");
    const TensorType& at = c.b.type(a);
    const TensorType& tt = c.b.type(tau);
    if (at.rank() < 2 || tt.rank() != at.rank() - 1) c.fail("householder_product: tau " + tt.str() + " does not fit " + at.str());
    broadcast_batch(c.b, a, tau, 2, 1);
    return lapack(c, la::kOrgqr, 0, {a, tau});
  };
  t["aten.ormqr.default"] = [](Call& c) {
    Builder& b = c.b;
    Value a = c.tensor(0, "self"), tau = c.tensor(1, "input2"), x = c.tensor(2, "input3");
    const bool left = c.bool_or(3, "left", true), tr = c.bool_or(4, "transpose", false);
    const Shape batch = Builder::broadcast_shapes(Builder::broadcast_shapes(batch_of(b.type(a)), batch_of(b.type(tau), 1)),
                                                  batch_of(b.type(x)));
    a = to_batch(b, a, batch);
    tau = to_batch(b, tau, batch, 1);
    x = to_batch(b, x, batch);
    return lapack(c, la::kOrmqr, (left ? la::kLeft : 0) | (tr ? la::kTrans : 0), {a, tau, x});
  };
  t["aten.linalg_qr.default"] = [](Call& c) {
    Builder& b = c.b;
    Value a = c.tensor(0, "A");
    const std::string mode = c.str_or(1, "mode", "reduced");
    if (mode != "reduced" && mode != "complete" && mode != "r") c.fail("qr: unknown mode '" + mode + "'");
    const TensorType at = b.type(a);
    if (at.rank() < 2) c.fail("qr of " + at.str() + ": needs a matrix");
    const size_t r = at.shape.size();
    const int64_t ax = static_cast<int64_t>(r);
    const int64_t m = at.shape[r - 2], n = at.shape[r - 1], k = std::min(m, n);
    std::vector<Value> f = lapack(c, la::kGeqrf, 0, {a});
    const bool complete = mode == "complete";
    Value rr = tri(b, complete ? f[0] : b.slice(f[0], ax - 2, 0, k, 1), 0, true);
    if (mode == "r") return std::vector<Value>{zeros_of(c, 0), rr};
    Value h = b.slice(f[0], ax - 1, 0, k, 1);  // the k reflectors [.., m, k]
    if (complete && m > k) {
      Shape zs = batch_of(at);
      zs.push_back(m);
      zs.push_back(m - k);
      Attrs ca;
      ca.axis = ax - 1;
      h = b.graph().add(Op::kConcat, {h, b.full(Scalar::of_int(0), at.dtype, zs)}, ca);
    }
    Value q = lapack(c, la::kOrgqr, 0, {h, f[1]})[0];
    return std::vector<Value>{q, rr};
  };
  // Principal square root of a symmetric positive-definite matrix: V diag(sqrt w) V^T
  // (lower triangle, as eigh).
  t["aten.linalg_matrix_sqrth.default"] = [](Call& c) {
    Builder& b = c.b;
    Value a = c.tensor(0, "self");
    need_square(c, a, "matrix_sqrth");
    std::vector<Value> e = lapack(c, la::kEigh, la::kVectors, {a});
    Value vs = b.ew(EwOp::k_mul, e[1], b.unsqueeze(b.ew(EwOp::k_sqrt, e[0]), -2));
    return std::vector<Value>{b.matmul(vs, b.transpose(e[1], -1, -2))};
  };
  // Polar decomposition A = U H (m >= n) from the reduced SVD A = W S Vh: U = W Vh,
  // H = Vh^T S Vh (PyTorch's CPU path is SVD-based too).
  t["aten.linalg_polar.default"] = [](Call& c) {
    Builder& b = c.b;
    Value a = c.tensor(0, "self");
    const TensorType& at = b.type(a);
    if (at.rank() < 2 || at.shape[at.shape.size() - 2] < at.shape.back()) c.fail("polar of " + at.str() + ": needs m >= n");
    std::vector<Value> f = svd(c, a, false, true);
    Value u = b.matmul(f[1], f[2]);
    Value vht = b.transpose(f[2], -1, -2);
    Value h = b.matmul(b.ew(EwOp::k_mul, vht, b.unsqueeze(f[0], -2)), f[2]);
    return std::vector<Value>{u, h};
  };
  t["aten.linalg_matrix_exp.default"] = [](Call& c) {
    Value a = c.tensor(0, "self");
    need_square(c, a, "matrix_exp");
    return lapack(c, la::kExpm, 0, {a});
  };
  t["aten.linalg_ldl_factor_ex.default"] = [](Call& c) {
    Value a = c.tensor(0, "self");
    need_square(c, a, "ldl_factor");
    // hermitian only matters for complex inputs, which Chroma does not compute with.
    return lapack(c, la::kLdl, 0, {a});
  };
  t["aten.linalg_ldl_solve.default"] = [](Call& c) {
    Builder& b = c.b;
    Value ld = c.tensor(0, "LD"), piv = c.tensor(1, "pivots"), rhs = c.tensor(2, "B");
    need_square(c, ld, "ldl_solve");
    const Shape batch = Builder::broadcast_shapes(batch_of(b.type(ld)), batch_of(b.type(rhs)));
    return lapack(c, la::kLdlSolve, 0, {to_batch(b, ld, batch), to_batch(b, piv, batch, 1), to_batch(b, rhs, batch)});
  };
  t["aten.linalg_pinv.atol_rtol_tensor"] = [](Call& c) {
    return std::vector<Value>{pinv(c, c.tensor(0, "self"), opt_tensor(c, 1, "atol"), opt_tensor(c, 2, "rtol"),
                                   c.bool_or(3, "hermitian", false))};
  };
}

}  // namespace

void register_aten_lapack(HandlerTable& t) {
  register_cholesky_lu(t);
  register_det_inv_solve(t);
  register_spectral_qr(t);
}

}  // namespace chroma
