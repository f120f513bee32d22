"""Fits the polynomials of the GPU generator's float32 special functions
(src/codegen/gpu/special.cpp) and prints them as C++ arrays, with each one's error measured in
float32 arithmetic (Horner's rule with one rounding per multiply-add, as the kernels' fma).

Each fit is a least-squares Chebyshev fit on 4000 Chebyshev nodes of its interval against
SciPy's float64 function, converted to monomial coefficients in the variable the kernel
computes. The reported error is the largest relative error over 200000 points of the
interval, evaluated in float32; a float32 function's own rounding is 6e-8.

Run: .venv/bin/python scripts/fit_gpu_special.py > src/codegen/gpu/special_fits.h
"""

import textwrap

import numpy as np
from numpy.polynomial import chebyshev as C
from numpy.polynomial import polynomial as P
from scipy import special as sp

EULER = 0.57721566490153286


def lgamma_2_plus_t(t):
    # lgamma(2 + t) / t, with its limit 1 - gamma at t = 0
    t = np.asarray(t, dtype=np.float64)
    out = np.empty_like(t)
    small = np.abs(t) < 1e-6
    out[~small] = sp.gammaln(2.0 + t[~small]) / t[~small]
    ts = t[small]
    out[small] = (1.0 - EULER) + ts * (np.pi ** 2 / 12 - 0.5)  # the series' first terms
    return out


def erfcx_q(t):
    # erfcx(x) (1 + 2x) with x = 2 (1 + t) / (1 - t); its limit at t = 1 is 2/sqrt(pi)
    t = np.asarray(t, dtype=np.float64)
    out = np.full_like(t, 2.0 / np.sqrt(np.pi))
    inside = t < 1.0 - 1e-12
    x = 2.0 * (1.0 + t[inside]) / (1.0 - t[inside])
    out[inside] = sp.erfcx(x) * (1.0 + 2.0 * x)
    return out


def erfinv_over_y_of_w(w):
    # erfinv(y) / y where w = -log(1 - y^2), from 1 - y = u / (1 + sqrt(1 - u)), u = e^-w
    w = np.maximum(np.asarray(w, dtype=np.float64), 1e-12)
    u = np.exp(-w)
    y = np.sqrt(-np.expm1(-w))
    one_minus_y = u / (1.0 + y)
    return sp.erfcinv(one_minus_y) / y


def scaled_tail(fn, scale, limit):
    # sqrt(x) fn(x) at x = scale / t, with its limit at t = 0 (x = inf)
    def g(t):
        t = np.asarray(t, dtype=np.float64)
        out = np.full_like(t, limit)
        inside = t > 1e-12
        x = scale / t[inside]
        out[inside] = np.sqrt(x) * fn(x)
        return out
    return g


def bessel_pq(nu, which):
    # P or Q of J_nu = A (P cos xi - Q sin xi), Y_nu = A (P sin xi + Q cos xi), A = sqrt(2 / (pi x)),
    # xi = x - (2 nu + 1) pi / 4, as a function of t = 8 / x (from SciPy below x = 2000, the
    # asymptotic series above, where its third term is below 1e-17)
    j, y = (sp.j0, sp.y0) if nu == 0 else (sp.j1, sp.y1)
    mu = 4.0 * nu * nu

    def g(t):
        t = np.asarray(t, dtype=np.float64)
        out = np.empty_like(t)
        x = 8.0 / np.maximum(t, 1e-12)
        near = x <= 2000.0
        xn = x[near]
        xi = xn - (2 * nu + 1) * np.pi / 4
        a = np.sqrt(2.0 / (np.pi * xn))
        jv, yv = j(xn), y(xn)
        if which == "P":
            out[near] = (jv * np.cos(xi) + yv * np.sin(xi)) / a
        else:
            out[near] = (yv * np.cos(xi) - jv * np.sin(xi)) / a
        z = 8.0 * x[~near]
        if which == "P":
            out[~near] = 1 - (mu - 1) * (mu - 9) / (2 * z**2) + (mu - 1) * (mu - 9) * (mu - 25) * (mu - 49) / (24 * z**4)
        else:
            out[~near] = (mu - 1) / z - (mu - 1) * (mu - 9) * (mu - 25) / (6 * z**3)
        return out
    return g


def q_over_t(nu):
    # Q / t at t = v + 1/2, with its limit (mu - 1) / 64 at t = 0
    def g(v):
        t = np.asarray(v, dtype=np.float64) + 0.5
        out = np.full_like(t, (4.0 * nu * nu - 1.0) / 64.0)
        inside = t > 1e-9
        out[inside] = bessel_pq(nu, "Q")(t[inside]) / t[inside]
        return out
    return g


def near_zero(fn, limit):
    # fn of x = sqrt(32 (u + 1)) for u in [-1, 1] (x in [0, 8]), with its limit at x = 0
    def g(u):
        u = np.asarray(u, dtype=np.float64)
        x = np.sqrt(np.maximum(32.0 * (u + 1.0), 0.0))
        out = np.full_like(x, limit)
        inside = x > 1e-4
        out[inside] = fn(x[inside])
        return out
    return g


def airy_near(v):
    # Ai(x) at x = 2.25 v - 0.25 (x in [-2.5, 2])
    return sp.airy(2.25 * np.asarray(v, dtype=np.float64) - 0.25)[0]


ZETA_2 = 2.0 / 3.0 * 2.0 ** 1.5      # zeta at x = 2
ZETA_25 = 2.0 / 3.0 * 2.5 ** 1.5     # zeta at x = -2.5


def airy_right(v):
    # Ai(x) e^zeta x^(1/4) at zeta = ZETA_2 / t, t = v + 1/2 (x >= 2); its limit 1 / (2 sqrt(pi))
    t = np.asarray(v, dtype=np.float64) + 0.5
    out = np.full_like(t, 0.5 / np.sqrt(np.pi))
    inside = t > 1e-9
    zeta = ZETA_2 / t[inside]
    x = (1.5 * zeta) ** (2.0 / 3.0)
    out[inside] = sp.airye(x)[0] * x ** 0.25  # airye: Ai(x) e^zeta
    return out


def airy_left(which):
    # Ai(-y) = y^(-1/4) (P sin theta - Q cos theta), Bi(-y) = y^(-1/4) (P cos theta + Q sin theta),
    # theta = zeta + pi/4, at zeta = ZETA_25 / t, t = v + 1/2 (y >= 2.5): P, or Q / t; from
    # SciPy below y = 200, the asymptotic series above
    def g(v):
        t = np.asarray(v, dtype=np.float64) + 0.5
        out = np.empty_like(t)
        zeta = ZETA_25 / np.maximum(t, 1e-12)
        y = (1.5 * zeta) ** (2.0 / 3.0)
        near = y <= 200.0
        ai, _, bi, _ = sp.airy(-y[near])
        th = zeta[near] + np.pi / 4
        amp = y[near] ** -0.25
        if which == "P":
            out[near] = (ai * np.sin(th) + bi * np.cos(th)) / amp
        else:
            out[near] = (bi * np.sin(th) - ai * np.cos(th)) / amp / t[near]
        z = zeta[~near]
        # u_k of the asymptotic series: 1, 5/72, 385/10368, 85085/2239488
        u1, u2, u3 = 5.0 / 72, 385.0 / 10368, 85085.0 / 2239488
        if which == "P":
            out[~near] = (1 - u2 / z**2) / np.sqrt(np.pi)
        else:
            tt = t[~near]  # (u1 / zeta - u3 / zeta^3) / t, zeta = ZETA_25 / t
            out[~near] = (u1 / ZETA_25 - u3 * tt**2 / ZETA_25**3) / np.sqrt(np.pi)
        return out
    return g


FITS = [
    # name, function of the kernel's variable v, interval of v, degree, what v is in the kernel
    ("kLgamma2PlusT", lgamma_2_plus_t, (0.0, 1.0), 8, "t = x - 2, lgamma(x) = t P(t)"),
    ("kErfcxQ", erfcx_q, (-1.0, 1.0), 15, "t = (x - 2) / (x + 2), erfcx(x) = Q(t) / (1 + 2x)"),
    ("kErfinvCentral", lambda v: erfinv_over_y_of_w(v + 2.5), (-2.5, 2.5), 9,
     "v = w - 2.5, erfinv(y) = y P(v), w = -log(1 - y^2) < 5"),
    ("kErfinvTail", lambda v: erfinv_over_y_of_w((v + 3.0) ** 2), (np.sqrt(5.0) - 3.0, 1.0), 9,
     "v = sqrt(w) - 3, erfinv(y) = y P(v), 5 <= w < 16"),
    ("kErfinvFarTail", lambda v: erfinv_over_y_of_w((v + 6.75) ** 2), (4.0 - 6.75, np.sqrt(90.0) - 6.75), 9,
     "v = sqrt(w) - 6.75, erfinv(y) = y P(v), 16 <= w <= 90"),
    ("kI0eTail", scaled_tail(sp.i0e, 8.0, 1 / np.sqrt(2 * np.pi)), (0.0, 1.0), 10, "t = 8 / |x|, i0e(x) = P(t) / sqrt|x|"),
    ("kI1eTail", scaled_tail(sp.i1e, 8.0, 1 / np.sqrt(2 * np.pi)), (0.0, 1.0), 10, "t = 8 / |x|, |i1e(x)| = P(t) / sqrt|x|"),
    ("kK0eTail", lambda v: scaled_tail(sp.k0e, 1.0, np.sqrt(np.pi / 2))(v + 0.5), (-0.5, 0.5), 14,
     "v = 1 / x - 1/2, k0e(x) = P(v) / sqrt x"),
    ("kK1eTail", lambda v: scaled_tail(sp.k1e, 1.0, np.sqrt(np.pi / 2))(v + 0.5), (-0.5, 0.5), 14,
     "v = 1 / x - 1/2, k1e(x) = P(v) / sqrt x"),
    ("kAsinOverZ", lambda v: np.where(v > 0, np.arcsin(np.sqrt(np.maximum(v, 1e-300))) / np.sqrt(np.maximum(v, 1e-300)), 1.0),
     (0.0, 0.25), 6, "v = z^2, asin(z) = z P(v) for |z| <= 1/2"),
    ("kAiryNear", airy_near, (-1.0, 1.0), 20, "v = (x + 1/4) / 2.25, Ai(x) = P(v) on [-2.5, 2]"),
    ("kAiryRight", airy_right, (-0.5, 0.5), 12, "v = zeta(2) / zeta - 1/2, Ai(x) = e^-zeta x^(-1/4) P(v) for x > 2"),
    ("kAiryLeftP", airy_left("P"), (-0.5, 0.5), 12, "v = zeta(2.5) / zeta - 1/2, P(v) for x < -2.5"),
    ("kAiryLeftQ", airy_left("Q"), (-0.5, 0.5), 12, "v as above, Q = t R(v), t = zeta(2.5) / zeta"),
    ("kJ0Near", near_zero(sp.j0, 1.0), (-1.0, 1.0), 13, "u = x^2/32 - 1, j0(x) = P(u) for |x| <= 8"),
    ("kJ1Near", near_zero(lambda x: sp.j1(x) / x, 0.5), (-1.0, 1.0), 13, "u = x^2/32 - 1, j1(x) = x P(u)"),
    ("kY0Near", near_zero(lambda x: sp.y0(x) - 2 / np.pi * np.log(x) * sp.j0(x), 2 / np.pi * (EULER - np.log(2))),
     (-1.0, 1.0), 13, "u = x^2/32 - 1, y0(x) = 2/pi log(x) j0(x) + P(u) for 0 < x <= 8"),
    ("kY1Near", near_zero(lambda x: (sp.y1(x) - 2 / np.pi * (np.log(x) * sp.j1(x) - 1 / x)) / x,
                          (2 * EULER - 2 * np.log(2) - 1) / (2 * np.pi)),
     (-1.0, 1.0), 13, "u = x^2/32 - 1, y1(x) = 2/pi (log(x) j1(x) - 1/x) + x P(u)"),
    ("kJ0P", lambda v: bessel_pq(0, "P")(v + 0.5), (-0.5, 0.5), 8, "v = 8/x - 1/2, P0(v) for x > 8"),
    ("kJ0Q", q_over_t(0), (-0.5, 0.5), 8, "v = 8/x - 1/2, Q0 = (8/x) P(v)"),
    ("kJ1P", lambda v: bessel_pq(1, "P")(v + 0.5), (-0.5, 0.5), 8, "v = 8/x - 1/2, P1(v)"),
    ("kJ1Q", q_over_t(1), (-0.5, 0.5), 8, "v = 8/x - 1/2, Q1 = (8/x) P(v)"),
]


def horner_f32(coef, v):
    v = v.astype(np.float32)
    acc = np.full_like(v, np.float32(coef[-1]))
    for c in coef[-2::-1]:
        # one rounding per step, as fma
        acc = (acc.astype(np.float64) * v.astype(np.float64) + np.float64(np.float32(c))).astype(np.float32)
    return acc


HEADER = """// The fitted polynomials of the GPU generator's float32 special functions (special.cpp,
// special_bessel.cpp), constant term first, each with its float32 error. Generated by
// scripts/fit_gpu_special.py (do not edit: run it again).
#pragma once

namespace chroma::gpu::special_detail {"""


def main():
    print(HEADER)
    for name, fn, (lo, hi), deg, what in FITS:
        k = np.arange(4000)
        nodes = 0.5 * (lo + hi) + 0.5 * (hi - lo) * np.cos(np.pi * (k + 0.5) / 4000)
        s = (2.0 * nodes - (lo + hi)) / (hi - lo)
        cheb = C.chebfit(s, fn(nodes), deg)
        # Chebyshev in s -> monomials in v: s = a v + b
        a, b = 2.0 / (hi - lo), -(lo + hi) / (hi - lo)
        mono_s = C.cheb2poly(cheb)
        mono_v = np.zeros(deg + 1)
        lin = np.array([b, a])
        power = np.array([1.0])
        for c in mono_s:
            mono_v[: len(power)] += c * power
            power = P.polymul(power, lin)
        v = np.linspace(lo, hi, 200001)[:-1] if hi == 1.0 and name == "kErfcxQ" else np.linspace(lo, hi, 200001)
        v = v.astype(np.float32).astype(np.float64)
        want = fn(v)
        got = horner_f32(mono_v, v).astype(np.float64)
        # relative error, or absolute for a function with zeros on its interval (the Bessel
        # functions near 0, whose results need absolute accuracy there)
        absolute = np.any(want[:-1] * want[1:] <= 0)
        den = 1.0 if absolute else np.abs(want)
        err = np.max(np.abs(got - want) / den)
        fit = np.max(np.abs(P.polyval(v, mono_v) - want) / den)
        kind = "absolute" if absolute else "relative"
        print(f"\n// {what}:\n// degree {deg}, float32 {kind} error {err:.2e} (the fit's own {fit:.1e})")
        body = textwrap.fill(", ".join(f"{c:.9g}" for c in mono_v), 100, initial_indent="    ",
                             subsequent_indent="    ")
        print(f"inline constexpr double {name}[] = {{\n{body}}};")
    print("\n}  // namespace chroma::gpu::special_detail")


if __name__ == "__main__":
    main()
