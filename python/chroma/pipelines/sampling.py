"""Sampling arithmetic in NumPy: the two sigma schedules, latent packing, the initial noise,
classifier-free guidance and the Euler step. Float32 throughout, in the order diffusers
computes it, so that the `diffusers` schedule and a step are bit-exact with diffusers'.

Schedules (each returns the sigmas, steps + 1 values ending in 0, and the timesteps the
transformer is given, one per step, both float32):

- "beta" (the default; the official ComfyUI workflow for Chroma1-HD): ComfyUI's
  `beta_scheduler` over its flux model sampling (`ModelSamplingFlux`, shift 1): a table of
  10000 sigmas `sigma(t) = e^shift / (e^shift + (1/t - 1))` at `t = i / 10000`, i = 1..10000,
  indexed at `rint(ppf(1 - linspace(0, 1, steps, endpoint=False)) * 9999)` with `ppf` the
  Beta(alpha, beta) inverse CDF (alpha = beta = 0.45), repeated indices dropped, 0 appended.
  The transformer's timestep is the sigma itself (ComfyUI's flux `timestep(sigma) = sigma`).
  The inverse CDF is computed here (beta_ppf: bisection on the regularized incomplete beta
  function, a continued fraction, to double precision; no SciPy needed).
- "diffusers": FlowMatchEulerDiscreteScheduler.set_timesteps as ChromaPipeline calls it:
  `linspace(1, 1/steps, steps)` in float64, cast to float32, shifted with the directory's
  scheduler config (Chroma1-HD: dynamic shifting, mu from the image's token count between
  base_shift and max_shift; static `shift` when dynamic shifting is off), timesteps
  `sigma * 1000`; the transformer is given `timestep / 1000` in float32 as the pipeline does.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import numpy as np

__all__ = ["beta_ppf", "beta_schedule", "diffusers_schedule", "schedule", "pack", "unpack", "noise", "cfg_combine",
           "euler_step", "latent_shape", "SCHEDULES", "FLUX_TIMESTEPS"]

SCHEDULES = ("beta", "diffusers")
FLUX_TIMESTEPS = 10000  # ComfyUI's ModelSamplingFlux table
LATENT_CHANNELS = 16


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10000):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the Beta(a, b) distribution's CDF at x."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def beta_ppf(q: float, a: float, b: float) -> float:
    """The Beta(a, b) inverse CDF at q: bisection on [0, 1] until the interval stops shrinking."""
    if not (a > 0 and b > 0):
        raise ValueError(f"beta schedule: alpha and beta must be positive (got {a}, {b})")
    if q <= 0.0:
        return 0.0
    if q >= 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            return mid
        if _betainc(a, b, mid) < q:
            lo = mid
        else:
            hi = mid


def flux_sigmas(shift: float = 1.0, timesteps: int = FLUX_TIMESTEPS) -> np.ndarray:
    """ComfyUI's ModelSamplingFlux table (float32, ascending)."""
    t = np.arange(1, timesteps + 1, dtype=np.float32) / np.float32(timesteps)
    e = np.float32(math.exp(shift))
    return (e / (e + (np.float32(1.0) / t - np.float32(1.0)))).astype(np.float32)


def beta_schedule(steps: int, alpha: float = 0.45, beta: float = 0.45,
                  shift: float = 1.0) -> Tuple[np.ndarray, np.ndarray]:
    table = flux_sigmas(shift)
    total = len(table) - 1
    qs = 1.0 - np.linspace(0.0, 1.0, steps, endpoint=False)
    idx = np.rint(np.array([beta_ppf(float(q), alpha, beta) for q in qs]) * total)
    sigmas, last = [], -1.0
    for t in idx:
        if t != last:
            sigmas.append(table[int(t)])
        last = t
    sig = np.array(sigmas + [0.0], dtype=np.float32)
    return sig, sig[:-1].copy()


def _calculate_shift(seq_len: int, cfg: Dict[str, Any]) -> float:
    base_len, max_len = cfg.get("base_image_seq_len", 256), cfg.get("max_image_seq_len", 4096)
    base_shift, max_shift = cfg.get("base_shift", 0.5), cfg.get("max_shift", 1.15)
    m = (max_shift - base_shift) / (max_len - base_len)
    return seq_len * m + (base_shift - m * base_len)


def diffusers_schedule(steps: int, image_seq_len: int, config: Dict[str, Any]) -> Tuple[np.ndarray, np.ndarray]:
    for key in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "invert_sigmas",
                "stochastic_sampling"):
        if config.get(key):
            raise ValueError(f"scheduler/scheduler_config.json: {key}=true is not supported by the diffusers schedule")
    n_train = config.get("num_train_timesteps", 1000)
    sigmas = np.array(np.linspace(1.0, 1 / steps, steps)).astype(np.float32)
    if config.get("use_dynamic_shifting", False):
        mu = _calculate_shift(image_seq_len, config)
        if config.get("time_shift_type", "exponential") == "exponential":
            sigmas = math.exp(mu) / (math.exp(mu) + (1 / sigmas - 1) ** 1.0)
        else:
            sigmas = mu / (mu + (1 / sigmas - 1) ** 1.0)
    else:
        shift = config.get("shift", 1.0)
        sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    sigmas = np.asarray(sigmas, dtype=np.float32)
    if config.get("shift_terminal"):
        one_minus = np.float32(1) - sigmas
        scale = one_minus[-1] / np.float32(1 - config["shift_terminal"])
        sigmas = (np.float32(1) - one_minus / scale).astype(np.float32)
    timesteps = (sigmas * np.float32(n_train)).astype(np.float32)
    model_t = (timesteps / np.float32(1000)).astype(np.float32)
    return np.concatenate([sigmas, np.zeros(1, np.float32)]), model_t


def schedule(name: str, steps: int, image_seq_len: int, scheduler_config: Optional[Dict[str, Any]] = None,
             alpha: float = 0.45, beta: float = 0.45, shift: float = 1.0) -> Tuple[np.ndarray, np.ndarray]:
    """(sigmas [n + 1], transformer timesteps [n]) of schedule `name`."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer (got {steps!r})")
    if name == "beta":
        return beta_schedule(steps, alpha, beta, shift)
    if name == "diffusers":
        return diffusers_schedule(steps, image_seq_len, scheduler_config or {})
    raise ValueError(f"unknown schedule {name!r} (expected one of {', '.join(SCHEDULES)})")


def latent_shape(height: int, width: int) -> Tuple[int, int]:
    """The latent image's (h, w): 1/8 of the image (the FLUX VAE), even (2x2 packing)."""
    return 2 * (height // 16), 2 * (width // 16)


def pack(latents: np.ndarray) -> np.ndarray:
    """[B, C, h, w] -> [B, (h/2)(w/2), 4C], diffusers' _pack_latents."""
    b, c, h, w = latents.shape
    x = latents.reshape(b, c, h // 2, 2, w // 2, 2).transpose(0, 2, 4, 1, 3, 5)
    return np.ascontiguousarray(x.reshape(b, (h // 2) * (w // 2), c * 4))


def unpack(packed: np.ndarray, height: int, width: int) -> np.ndarray:
    """diffusers' _unpack_latents: [B, N, 4C] -> [B, C, h, w] for an image of height x width."""
    b, n, ch = packed.shape
    h, w = latent_shape(height, width)
    if n != (h // 2) * (w // 2):
        raise ValueError(f"latents of {n} tokens do not belong to a {width}x{height} image "
                         f"({(h // 2) * (w // 2)} tokens)")
    x = packed.reshape(b, h // 2, w // 2, ch // 4, 2, 2).transpose(0, 3, 1, 4, 2, 5)
    return np.ascontiguousarray(x.reshape(b, ch // 4, h, w))


def noise(seed: int, height: int, width: int, torch_noise: bool = False) -> np.ndarray:
    """The packed initial latents [1, N, 64] (float32). NumPy's PCG64 standard normals by
    default; torch_noise: diffusers' prepare_latents with a CPU torch.Generator seeded with
    `seed` (randn of [1, 16, h, w], then packed): the same noise diffusers starts from."""
    h, w = latent_shape(height, width)
    if torch_noise:
        import torch

        g = torch.Generator("cpu").manual_seed(int(seed))
        x = torch.randn((1, LATENT_CHANNELS, h, w), generator=g, dtype=torch.float32).numpy()
    else:
        x = np.random.default_rng(int(seed)).standard_normal((1, LATENT_CHANNELS, h, w), dtype=np.float32)
    return pack(x)


def cfg_combine(v_pos: np.ndarray, v_neg: np.ndarray, cfg: float) -> np.ndarray:
    """v_neg + cfg (v_pos - v_neg), float32 as diffusers computes it."""
    return (v_neg + np.float32(cfg) * (v_pos - v_neg)).astype(np.float32, copy=False)


def euler_step(x: np.ndarray, v: np.ndarray, sigma: np.float32, sigma_next: np.float32) -> np.ndarray:
    """x + (sigma_next - sigma) v, the FlowMatchEuler step (dt in float32)."""
    dt = np.float32(sigma_next) - np.float32(sigma)
    return (x + dt * v).astype(np.float32, copy=False)
