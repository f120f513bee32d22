"""Dense linear algebra (LAPACK through OpenBLAS) against torch eager (MKL's LAPACK here).

Inputs are seeded and well conditioned: symmetric positive-definite matrices A A^T + n I,
general matrices randn + 3 I (condition numbers about 10), so LU pivots are unambiguous and
two LAPACK implementations agree to rounding.

Tolerances: float64 rtol = atol = 1e-9; float32 rtol = atol = 1e-4 (a factorization of an
n = 5 matrix with condition number ~10 moves results by a few hundred ulp at most;
inverses, solves and pseudo-inverses amplify rounding by the condition number).
Eigenvectors and singular vectors are unique only up to sign: the tests compare them after
aligning each vector's sign with PyTorch's (and check the raw values too where both
libraries agree, which they do for these inputs; see test_raw_vectors_match).

Run: .venv/bin/python -m pytest tests/python/test_linalg.py -q
"""

import numpy as np
import pytest
import torch

from conftest import compare, to_numpy

import chroma

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float64: dict(rtol=1e-9, atol=1e-9)}


def rand(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def general(batch, n, seed=0, dtype=torch.float64):
    return (rand(*batch, n, n, seed=seed) + 3 * torch.eye(n, dtype=torch.float64)).to(dtype)


def spd(batch, n, seed=0, dtype=torch.float64):
    a = rand(*batch, n, n, seed=seed)
    return (a @ a.mT + n * torch.eye(n, dtype=torch.float64)).to(dtype)


def triangular(batch, n, upper, seed=0, dtype=torch.float64):
    a = general(batch, n, seed)
    return (a.triu() if upper else a.tril()).to(dtype)


def run(compile_to, fn, *inputs):
    prog = compile_to(fn, *inputs)
    got = prog(*[to_numpy(x) for x in inputs])
    with torch.no_grad():
        want = fn(*inputs)
    return got, want


def check(compile_to, fn, *inputs, tol):
    got, want = run(compile_to, fn, *inputs)
    compare(got, want, **tol)


def align_columns(got, want):
    """Flips the sign of each column of got (..., m, k) to match want's."""
    s = np.sign(np.sum(got * want, axis=-2, keepdims=True))
    s[s == 0] = 1
    return got * s


# name -> (fn, input builder (batch, dtype) -> tuple)
CASES = {
    "cholesky": (lambda a: torch.linalg.cholesky(a), lambda bt, dt: (spd(bt, 5, dtype=dt),)),
    "cholesky_upper": (lambda a: torch.linalg.cholesky(a, upper=True), lambda bt, dt: (spd(bt, 4, dtype=dt),)),
    "cholesky_ex": (lambda a: torch.linalg.cholesky_ex(a), lambda bt, dt: (spd(bt, 5, dtype=dt),)),
    "cholesky_solve": (lambda l, b: torch.cholesky_solve(b, l),
                       lambda bt, dt: (torch.linalg.cholesky(spd(bt, 4)).to(dt), rand(*bt, 4, 3, seed=1, dtype=dt))),
    "cholesky_solve_upper": (lambda u, b: torch.cholesky_solve(b, u, upper=True),
                             lambda bt, dt: (torch.linalg.cholesky(spd(bt, 4), upper=True).to(dt),
                                             rand(*bt, 4, 2, seed=1, dtype=dt))),
    "cholesky_inverse": (lambda l: torch.cholesky_inverse(l), lambda bt, dt: (torch.linalg.cholesky(spd(bt, 4)).to(dt),)),
    "lu_factor": (lambda a: torch.linalg.lu_factor(a), lambda bt, dt: (general(bt, 5, dtype=dt),)),
    "lu_factor_ex": (lambda a: torch.linalg.lu_factor_ex(a), lambda bt, dt: (general(bt, 4, dtype=dt),)),
    "lu_factor_wide": (lambda a: torch.linalg.lu_factor(a), lambda bt, dt: (rand(*bt, 3, 5, dtype=dt),)),
    "lu": (lambda a: torch.linalg.lu(a), lambda bt, dt: (rand(*bt, 5, 5, dtype=dt),)),
    "lu_tall": (lambda a: torch.linalg.lu(a), lambda bt, dt: (rand(*bt, 6, 4, dtype=dt),)),
    "lu_unpack": (lambda lu, p: torch.lu_unpack(lu, p),
                  lambda bt, dt: tuple(x.to(dt) if x.is_floating_point() else x for x in torch.linalg.lu_factor(rand(*bt, 5, 5)))),
    "lu_solve": (lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b),
                 lambda bt, dt: (general(bt, 4, dtype=dt), rand(*bt, 4, 3, seed=1, dtype=dt))),
    "lu_solve_adjoint": (lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, adjoint=True),
                         lambda bt, dt: (general(bt, 4, dtype=dt), rand(*bt, 4, 3, seed=1, dtype=dt))),
    "lu_solve_right": (lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, left=False),
                       lambda bt, dt: (general(bt, 4, dtype=dt), rand(*bt, 2, 4, seed=1, dtype=dt))),
    "det": (lambda a: torch.linalg.det(a), lambda bt, dt: (rand(*bt, 5, 5, dtype=dt),)),
    "slogdet": (lambda a: torch.linalg.slogdet(a), lambda bt, dt: (rand(*bt, 5, 5, dtype=dt),)),
    "logdet": (lambda a: torch.logdet(a), lambda bt, dt: (spd(bt, 4, dtype=dt),)),
    "inv": (lambda a: torch.linalg.inv(a), lambda bt, dt: (general(bt, 5, dtype=dt),)),
    "inv_ex": (lambda a: torch.linalg.inv_ex(a), lambda bt, dt: (general(bt, 4, dtype=dt),)),
    "solve": (lambda a, b: torch.linalg.solve(a, b), lambda bt, dt: (general(bt, 4, dtype=dt), rand(*bt, 4, 2, seed=1, dtype=dt))),
    "solve_vector": (lambda a, b: torch.linalg.solve(a, b), lambda bt, dt: (general(bt, 4, dtype=dt), rand(*bt, 4, seed=1, dtype=dt))),
    "solve_right": (lambda a, b: torch.linalg.solve(a, b, left=False),
                    lambda bt, dt: (general(bt, 4, dtype=dt), rand(*bt, 3, 4, seed=1, dtype=dt))),
    "solve_broadcast": (lambda a, b: torch.linalg.solve(a, b), lambda bt, dt: (general((), 3, dtype=dt), rand(2, 3, 2, seed=1, dtype=dt))),
    "solve_triangular_upper": (lambda a, b: torch.linalg.solve_triangular(a, b, upper=True),
                               lambda bt, dt: (triangular(bt, 4, True, dtype=dt), rand(*bt, 4, 3, seed=1, dtype=dt))),
    "solve_triangular_lower_right_unit": (lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, left=False, unitriangular=True),
                                          lambda bt, dt: (triangular(bt, 4, False, dtype=dt), rand(*bt, 2, 4, seed=1, dtype=dt))),
    "triangular_solve": (lambda b, a: torch.triangular_solve(b, a),
                         lambda bt, dt: (rand(*bt, 4, 3, seed=1, dtype=dt), triangular(bt, 4, True, dtype=dt))),
    "triangular_solve_transpose_lower": (lambda b, a: torch.triangular_solve(b, a, upper=False, transpose=True),
                                         lambda bt, dt: (rand(*bt, 4, 2, seed=1, dtype=dt), triangular(bt, 4, False, dtype=dt))),
    "eigvalsh": (lambda a: torch.linalg.eigvalsh(a), lambda bt, dt: (spd(bt, 5, dtype=dt),)),
    "eigvalsh_upper": (lambda a: torch.linalg.eigvalsh(a, UPLO="U"), lambda bt, dt: (rand(*bt, 4, 4, dtype=dt),)),
    "svdvals": (lambda a: torch.linalg.svdvals(a), lambda bt, dt: (rand(*bt, 5, 3, dtype=dt),)),
    "geqrf": (lambda a: torch.geqrf(a), lambda bt, dt: (rand(*bt, 5, 3, dtype=dt),)),
    "geqrf_wide": (lambda a: torch.geqrf(a), lambda bt, dt: (rand(*bt, 3, 5, dtype=dt),)),
    "qr": (lambda a: torch.linalg.qr(a), lambda bt, dt: (rand(*bt, 5, 3, dtype=dt),)),
    "qr_complete": (lambda a: torch.linalg.qr(a, mode="complete"), lambda bt, dt: (rand(*bt, 5, 3, dtype=dt),)),
    "qr_wide": (lambda a: torch.linalg.qr(a), lambda bt, dt: (rand(*bt, 3, 5, dtype=dt),)),
    "qr_r": (lambda a: torch.linalg.qr(a, mode="r")[1], lambda bt, dt: (rand(*bt, 4, 4, dtype=dt),)),
    "householder_product": (lambda a: torch.linalg.householder_product(*torch.geqrf(a)), lambda bt, dt: (rand(*bt, 5, 3, dtype=dt),)),
    "ormqr": (lambda a, c: torch.ormqr(*torch.geqrf(a), c), lambda bt, dt: (rand(*bt, 4, 3, dtype=dt), rand(*bt, 4, 2, seed=1, dtype=dt))),
    "ormqr_right_transpose": (lambda a, c: torch.ormqr(*torch.geqrf(a), c, left=False, transpose=True),
                              lambda bt, dt: (rand(*bt, 4, 3, dtype=dt), rand(*bt, 2, 4, seed=1, dtype=dt))),
    "pinv": (lambda a: torch.linalg.pinv(a), lambda bt, dt: (rand(*bt, 5, 3, dtype=dt),)),
    "pinv_hermitian": (lambda a: torch.linalg.pinv(a, hermitian=True), lambda bt, dt: (spd(bt, 4, dtype=dt),)),
    "pinv_rtol": (lambda a: torch.linalg.pinv(a, rtol=0.5), lambda bt, dt: (rand(*bt, 4, 4, dtype=dt),)),
    "pinverse": (lambda a: torch.pinverse(a), lambda bt, dt: (rand(*bt, 3, 4, dtype=dt),)),
    "matrix_rank": (lambda a: torch.linalg.matrix_rank(a), lambda bt, dt: (rand(*bt, 4, 3, dtype=dt) @ rand(*bt, 3, 5, seed=1, dtype=dt),)),
    "cond": (lambda a: torch.linalg.cond(a), lambda bt, dt: (general(bt, 4, dtype=dt),)),
    "matrix_norm_2_nuc": (lambda a: (torch.linalg.matrix_norm(a, 2), torch.linalg.matrix_norm(a, "nuc")),
                          lambda bt, dt: (rand(*bt, 4, 3, dtype=dt),)),
    "matrix_sqrth": (lambda a: torch.linalg.matrix_sqrth(a), lambda bt, dt: (spd(bt, 4, dtype=dt),)),
    "polar": (lambda a: torch.linalg.polar(a), lambda bt, dt: (rand(*bt, 5, 3, dtype=dt),)),
    "ldl_factor": (lambda a: torch.linalg.ldl_factor(a), lambda bt, dt: (rand(*bt, 5, 5, dtype=dt) + rand(*bt, 5, 5, dtype=dt).mT,)),
    "ldl_solve": (lambda a, b: torch.linalg.ldl_solve(*torch.linalg.ldl_factor(a), b),
                  lambda bt, dt: (rand(*bt, 4, 4, dtype=dt) + rand(*bt, 4, 4, dtype=dt).mT, rand(*bt, 4, 2, seed=1, dtype=dt))),
    "matrix_exp": (lambda a: torch.linalg.matrix_exp(a), lambda bt, dt: (rand(*bt, 4, 4, dtype=dt),)),
    "matrix_exp_scaled": (lambda a: torch.linalg.matrix_exp(a), lambda bt, dt: (3 * rand(*bt, 5, 5, dtype=dt),)),
    "matrix_power_negative": (lambda a: torch.linalg.matrix_power(a, -2), lambda bt, dt: (general(bt, 3, dtype=dt),)),
}


# Each case is compiled once for two variants side by side (a single float64 matrix and a
# batch of float32 ones): one program per case keeps the test time down.
VARIANTS = [((), torch.float64), ((2, 3), torch.float32)]


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _both(fn, n1):
    return lambda *xs: tuple(_flat(fn(*xs[:n1])) + _flat(fn(*xs[n1:])))


@pytest.mark.parametrize("name", sorted(CASES))
def test_op(name, compile_to):
    fn, make = CASES[name]
    ins = [make(bt, dt) for bt, dt in VARIANTS]
    got, want = run(compile_to, _both(fn, len(ins[0])), *ins[0], *ins[1])
    n_out = len(want) // 2
    for v in range(2):
        sl = slice(v * n_out, (v + 1) * n_out)
        compare(list(got[sl]), list(want[sl]), what=f"{name} variant {v}", **TOL[VARIANTS[v][1]])


@pytest.mark.parametrize("batch,dtype", VARIANTS, ids=["single_f64", "batched_f32"])
@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh(uplo, batch, dtype, compile_to):
    a = spd(batch, 5, dtype=dtype)
    (w, v), (wt, vt) = run(compile_to, lambda x: torch.linalg.eigh(x, UPLO=uplo), a)
    tol = TOL[dtype]
    np.testing.assert_allclose(w, wt.numpy(), **tol)
    np.testing.assert_allclose(align_columns(v, vt.numpy()), vt.numpy(), **tol)
    # V diag(w) V^T reconstructs A.
    np.testing.assert_allclose((v * w[..., None, :]) @ np.swapaxes(v, -1, -2), a.numpy(), rtol=tol["rtol"], atol=tol["atol"] * 10)


@pytest.mark.parametrize("batch,dtype", VARIANTS, ids=["single_f64", "batched_f32"])
@pytest.mark.parametrize("shape,full", [((5, 3), False), ((5, 3), True), ((3, 4), False), ((3, 4), True), ((4, 4), False)])
def test_svd(shape, full, batch, dtype, compile_to):
    a = rand(*batch, *shape, dtype=dtype)
    (u, s, vh), (ut, st, vht) = run(compile_to, lambda x: torch.linalg.svd(x, full_matrices=full), a)
    tol = TOL[dtype]
    assert u.shape == tuple(ut.shape) and vh.shape == tuple(vht.shape)
    np.testing.assert_allclose(s, st.numpy(), **tol)
    k = s.shape[-1]
    # The first k singular vectors are unique up to sign (distinct singular values); the
    # completion of a full U or Vh is any orthonormal basis: check orthonormality instead.
    np.testing.assert_allclose(align_columns(u[..., :k], ut.numpy()[..., :k]), ut.numpy()[..., :k], **tol)
    v, vt = np.swapaxes(vh, -1, -2), np.swapaxes(vht.numpy(), -1, -2)
    np.testing.assert_allclose(align_columns(v[..., :k], vt[..., :k]), vt[..., :k], **tol)
    for q in (u, v):
        np.testing.assert_allclose(np.swapaxes(q, -1, -2) @ q, np.broadcast_to(np.eye(q.shape[-1]), q.shape[:-2] + (q.shape[-1],) * 2),
                                   rtol=0, atol=tol["atol"] * 10)


def test_raw_vectors_match(compile_to):
    """OpenBLAS and MKL agree on the signs for these inputs: the raw outputs match too."""
    a = spd((), 5)
    check(compile_to, lambda x: torch.linalg.eigh(x), a, tol=TOL[torch.float64])
    check(compile_to, lambda x: torch.linalg.svd(x, full_matrices=False), rand(5, 3), tol=TOL[torch.float64])


def test_info_reports_failure(compile_to):
    """No exception at run time: the _ex ops return LAPACK's info (the leading minor that fails)."""
    a = spd((), 4)
    a[2, 2] = -50.0
    got, want = run(compile_to, lambda x: torch.linalg.cholesky_ex(x).info, a)
    assert int(got) == int(want) == 3
    sing = torch.tensor([[1.0, 2.0], [2.0, 4.0]], dtype=torch.float64)
    got, want = run(compile_to, lambda x: torch.linalg.lu_factor_ex(x).info, sing)
    assert int(got) == int(want) == 2
    got, want = run(compile_to, lambda x: torch.linalg.det(x), sing)
    assert float(got) == 0.0 and float(want) == 0.0


def test_checked_op_compiles_without_error_check(compile_to):
    """torch.linalg.inv wraps an error check in effect tokens: the exporter drops them."""
    a = general((), 4)
    prog = compile_to(lambda x: torch.linalg.inv(x), a)
    assert len(prog.manifest["inputs"]) == 1 and len(prog.manifest["outputs"]) == 1


def test_constant_folded(compile_to):
    """A factorization of a constant is evaluated by the interpreter at compile time."""
    c = spd((), 4)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c", c)

        def forward(self, x):
            return torch.linalg.cholesky(self.c) @ x

    x = rand(4, 2, seed=3)
    check(compile_to, M(), x, tol=TOL[torch.float64])


def test_outer_product_operand_layout(compile_to):
    """b.mT of a column b is a [1, n] view with strides (1, 1): BLAS must see it as column-major
    (found through pinv(a @ b.mT), OpInfo's linalg.pinv.singular)."""
    a, b = rand(3, 1), rand(4, 1, seed=1)
    check(compile_to, lambda x, y: x @ y.mT, a.float(), b.float(), tol=TOL[torch.float32])
    check(compile_to, lambda x, y: torch.linalg.pinv(x @ y.mT), a, b, tol=TOL[torch.float64])


def test_needs_blas(compile_to):
    with pytest.raises(Exception, match=r"LAPACK.*blas=True"):
        compile_to(lambda x: torch.linalg.inv(x), general((), 3), blas=False)


def test_lu_without_pivoting_is_refused(compile_to):
    with pytest.raises(Exception, match=r"without pivoting"):
        compile_to(lambda x: torch.linalg.lu_factor(x, pivot=False), general((), 3))
