"""Tensors and NumPy arrays, both ways, bfloat16 included (base layer: imports nothing from
Chroma; torch only inside the functions, which only callers that have tensors reach)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["to_numpy", "from_numpy"]


def to_numpy(t: "torch.Tensor") -> "np.ndarray":
    """A tensor's values as a NumPy array (bfloat16 as ml_dtypes.bfloat16, which NumPy lacks)."""
    import torch

    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def from_numpy(a: "np.ndarray") -> "torch.Tensor":
    """A NumPy array as a tensor sharing its memory (ml_dtypes.bfloat16 as torch.bfloat16)."""
    import numpy as np
    import torch

    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
