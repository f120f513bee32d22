"""Fits the polynomials of the GPU generator's float32 special functions
(src/codegen/gpu/special.cpp) and prints them as C++ arrays, with each one's error measured in
float32 arithmetic (Horner's rule with one rounding per multiply-add, as the kernels' fma).

Each fit is a least-squares Chebyshev fit on 4000 Chebyshev nodes of its interval against
SciPy's float64 function, converted to monomial coefficients in the variable the kernel
computes. The reported error is the largest relative error over 200000 points of the
interval, evaluated in float32; a float32 function's own rounding is 6e-8.

Run: .venv/bin/python scripts/fit_gpu_special.py
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
]


def horner_f32(coef, v):
    v = v.astype(np.float32)
    acc = np.full_like(v, np.float32(coef[-1]))
    for c in coef[-2::-1]:
        # one rounding per step, as fma
        acc = (acc.astype(np.float64) * v.astype(np.float64) + np.float64(np.float32(c))).astype(np.float32)
    return acc


def main():
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
        err = np.max(np.abs(got - want) / np.abs(want))
        fit = np.max(np.abs(P.polyval(v, mono_v) - want) / np.abs(want))
        print(f"// {what}: degree {deg}, float32 relative error {err:.2e} (the fit's own {fit:.1e})")
        body = textwrap.fill(", ".join(f"{c:.9g}" for c in mono_v), 100, initial_indent="    ",
                             subsequent_indent="    ")
        print(f"constexpr double {name}[] = {{\n{body}}};")


if __name__ == "__main__":
    main()
