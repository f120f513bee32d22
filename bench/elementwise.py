"""Fused elementwise/reduction kernels against eager PyTorch, one thread.

    .venv/bin/python bench/elementwise.py [--size 1024]

For each function of a size x size float32 tensor: median call time (200 calls after 20
warm-ups) of the compiled program (writing into a preallocated out= array) and of eager
PyTorch, their ratio, and the max abs difference of the results.
"""

import argparse
import os
import sys
import tempfile

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import chroma  # noqa: E402
from chroma.demo import median_ms  # noqa: E402

CASES = [
    ("affine_relu", lambda x: torch.relu(x * 2 + 1)),
    ("gelu", lambda x: torch.nn.functional.gelu(x)),
    ("silu", lambda x: torch.nn.functional.silu(x)),
    ("tanh", lambda x: torch.tanh(x)),
    ("sum_last", lambda x: x.sum(-1)),
    ("sum_first", lambda x: x.sum(0)),
    ("softmax", lambda x: torch.softmax(x, -1)),
    ("layer_norm", lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:])),
    ("transpose_add", lambda x: x.t() + x),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=1024)
    a = ap.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(a.size, a.size, generator=torch.Generator().manual_seed(0))
    xn = x.numpy()
    print(f"{'function':<14} {'chroma ms':>10} {'torch ms':>10} {'speedup':>8} {'max abs diff':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in CASES:
            prog = chroma.compile(fn, (x,), out=os.path.join(tmp, name))
            out = np.empty_like(prog(xn))
            t_c = median_ms(lambda: prog(xn, out=out), iters=200, warmup=20)
            t_t = median_ms(lambda: fn(x), iters=200, warmup=20)
            err = float(np.abs(prog(xn) - fn(x).numpy()).max())
            print(f"{name:<14} {t_c:>10.3f} {t_t:>10.3f} {t_t / t_c:>7.2f}x {err:>13.2e}")


if __name__ == "__main__":
    main()
