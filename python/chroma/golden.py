"""Generated golden inputs of WebGPU packages (docs/webgpu_package.md, "Golden data"): the
compiler writes a seed instead of the values, and every runtime computes the same float32
values from it, bit for bit (web/src/tensors.ts goldenUniform). NumPy only."""

from __future__ import annotations

import numpy as np


def golden_uniform(n: int, seed: int, low: float, high: float) -> np.ndarray:
    """The float32 values a package's generated golden input holds (the runtimes compute the
    same, bit for bit): element i is low + (high - low) * u_i in float32 arithmetic, with
    u_i = (lowbias32(seed + i * 0x9E3779B9) >> 8) * 2^-24."""
    with np.errstate(over="ignore"):
        x = (np.uint32(seed) + np.arange(n, dtype=np.uint32) * np.uint32(0x9E3779B9)).astype(np.uint32)
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x7FEB352D)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x846CA68B)
        x ^= x >> np.uint32(16)
    u = (x >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)
    lo, hi = np.float32(low), np.float32(high)
    return (lo + (hi - lo) * u).astype(np.float32)
