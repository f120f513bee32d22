"""torchvision's classification models with seeded random weights, and their check against
eager PyTorch (used by tests/python/test_vision_models.py, tools/vision_models.py and
bench/vision.py).

No checkpoint can be downloaded here, so every model gets torchvision's own random
initialisation under a fixed seed, and its batch norms get random running statistics (mean
N(0, 0.1), variance U(0.5, 1.5)) so that no normalisation is an identity. torchvision is
imported lazily: the rest of chroma does not need it.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

import numpy as np

# Default input size per model: 224 x 224 unless the architecture fixes another.
INPUT_SIZE = {"inception_v3": 299}

# Tolerance of the check (relative to the largest eager logit): float32 rounding differs
# from oneDNN's in summation order and in folded batch norms; through tens of layers that
# compounds to about 1e-6 .. 1e-5 of the output's scale.
RTOL_SCALE = 1e-4


def classification_models() -> List[str]:
    import torchvision
    from torchvision.models import list_models

    return list(list_models(module=torchvision.models))


def build(name: str, seed: int = 0):
    """The model `name` in eval mode with seeded random weights and batch norm statistics."""
    import torch
    import torchvision

    torch.manual_seed(seed)
    kwargs: Dict[str, Any] = {}
    if name in ("inception_v3", "googlenet"):
        kwargs["aux_logits"] = False
        kwargs["init_weights"] = True
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    g = torch.Generator().manual_seed(seed + 1)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
        # Layers torchvision initializes to zero (the ViT classification heads) would make
        # every logit equal its bias and the comparison vacuous: random weights instead.
        if isinstance(m, torch.nn.Linear) and not m.weight.any():
            with torch.no_grad():
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.02)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.02)
    return model.eval()


def example_input(name: str, batch: int = 1, seed: int = 1):
    import torch

    s = INPUT_SIZE.get(name, 224)
    return torch.randn(batch, 3, s, s, generator=torch.Generator().manual_seed(seed))


def check(name: str, *, batch: int = 1, out: Optional[str] = None, threads: int = 1, timing_calls: int = 0) -> Dict[str, Any]:
    """Compiles `name`, runs it and compares with eager. Returns a result dict (never raises
    for a model failure: the error goes into result["error"])."""
    import torch

    import chroma

    r: Dict[str, Any] = {"model": name, "batch": batch}
    try:
        model = build(name)
        x = example_input(name, batch)
        r["input"] = list(x.shape)
        r["parameters"] = sum(p.numel() for p in model.parameters())
        with torch.inference_mode():
            ref = model(x).numpy()
        t0 = time.perf_counter()
        prog = chroma.compile(model, (x,), out=out, threads=threads)
        r["compile_s"] = time.perf_counter() - t0
        got = prog(x.numpy())
        scale = float(np.max(np.abs(ref)))
        err = float(np.max(np.abs(got - ref)))
        r.update(max_abs_error=err, max_abs_output=scale, relative_error=err / max(scale, 1e-30),
                 kernels=prog.stats.get("kernels"), arena_bytes=prog.stats.get("arena_bytes"),
                 same_top1=bool(np.array_equal(got.argmax(-1), ref.argmax(-1))))
        r["passed"] = bool(got.shape == ref.shape and np.isfinite(got).all() and err <= RTOL_SCALE * scale)
        if float(np.ptp(ref)) == 0.0:  # constant logits: nothing was compared
            r["passed"] = False
            r["error"] = "eager's logits are all equal: the model's weights make the comparison vacuous"
        if timing_calls:
            def med(fn):
                for _ in range(3):
                    fn()
                ts = []
                for _ in range(timing_calls):
                    t = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t)
                return float(np.median(ts)) * 1e3

            torch.set_num_threads(threads)
            with torch.inference_mode():
                r["eager_ms"] = med(lambda: model(x))
            xn = x.numpy()
            r["chroma_ms"] = med(lambda: prog(xn))
    except Exception as e:  # noqa: BLE001 - the failure is the result
        r["passed"] = False
        r["error"] = f"{type(e).__name__}: {e}"
    return r
