"""The accuracy of a transformer weight variant: the relative L2 error of the guided velocity
it gives at every step of a float32 trajectory (the float32 transformer's own steps), against
the float32 velocity at the same point.

    errs = velocity_errors(pipe, "q4", "a red fox in snow", seed=1, width=256, height=256, steps=8)
"""

from __future__ import annotations

from typing import List

import numpy as np

from .components_np import KEY_MASKED
from .memory import transformer_rules
from .sampling import cfg_combine, euler_step, latent_shape, noise, schedule
from .text import bucket_for

__all__ = ["velocity_errors"]


def velocity_errors(pipe, variant: str, prompt: str, *, seed: int = 0, width: int = 256, height: int = 256,
                    steps: int = 8, cfg: float = 3.8, schedule_name: str = "beta") -> List[float]:
    """||v_variant - v_fp32|| / ||v_fp32|| per step (guided: cfg with the official negative)."""
    pos, neg = pipe.encode_many([prompt, pipe.official_negative().prompt])
    h, w = latent_shape(height, width)
    n_img = (h // 2) * (w // 2)
    length = bucket_for(max(len(pos), len(neg)), pipe.buckets)
    shapes = {"batch": 1, "h2": h // 2, "w2": w // 2, "length": length}
    ctx = np.zeros((2, length, pipe.dim), np.float32)
    bias = np.full((2, length), KEY_MASKED, np.float32)
    for i, t in enumerate((pos, neg)):
        ctx[i, : len(t)] = t.embeds
        bias[i, : len(t)] = 0.0
    sig, tm = schedule(schedule_name, steps, n_img, pipe.model.scheduler_config())
    points, ref, got = [noise(seed, height, width)], [], []
    for v, out in (("fp32", ref), (variant, got)):  # one program in memory at a time: the fp32 trajectory first
        pipe.release()
        prog = pipe.store.get("transformer", transformer_rules(v), shapes)[0]
        for i in range(len(tm)):
            x, ts = points[i], tm[i:i + 1]
            out.append(cfg_combine(np.asarray(prog(x, ts, ctx[:1], bias[:1])),
                                   np.asarray(prog(x, ts, ctx[1:], bias[1:])), cfg))
            if v == "fp32" and i + 1 < len(tm):
                points.append(euler_step(x, out[-1], sig[i], sig[i + 1]))
        del prog
    return [float(np.linalg.norm(g - r) / np.linalg.norm(r)) for g, r in zip(got, ref)]
