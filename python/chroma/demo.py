"""The README's main job: compile a built-in transformer model and run it against PyTorch.

    python -m chroma.demo [--out build/demo] [--layers 2]

Seeded random weights and tokens; prints the agreement of the outputs (max abs and
relative error), both timings (medians, one thread each), the kernel count and the arena
against the total size of the temporaries.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np


def build_model(vocab=1000, hidden=64, heads=4, layers=2, seq=8):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.proj = nn.Linear(hidden, hidden)
            self.norm2 = nn.LayerNorm(hidden)
            self.fc1 = nn.Linear(hidden, 4 * hidden)
            self.fc2 = nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.norm1(x)).split(c, dim=-1)
            q = q.view(b, t, heads, c // heads).transpose(1, 2)
            k = k.view(b, t, heads, c // heads).transpose(1, 2)
            v = v.view(b, t, heads, c // heads).transpose(1, 2)
            att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(c // heads))
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, c)
            x = x + self.proj(y)
            return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, vocab, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    model = Model().eval()
    tokens = torch.randint(0, vocab, (1, seq), generator=torch.Generator().manual_seed(1))
    return model, tokens


def median_ms(fn, iters=50, warmup=5):
    """Median wall time of fn() in milliseconds."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2] * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join("build", "demo"))
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args(argv)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import torch

    import chroma

    torch.set_num_threads(1)
    model, tokens = build_model(layers=a.layers)
    t0 = time.perf_counter()
    prog = chroma.compile(model, (tokens,), out=a.out)
    compile_s = time.perf_counter() - t0
    with torch.no_grad():
        ref = model(tokens).numpy()
    got = prog(tokens.numpy())
    err = np.abs(got - ref)
    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    s = prog.stats
    print(f"model: {a.layers}-layer transformer, logits {list(ref.shape)}; artifact {a.out}")
    print(f"compile: {compile_s:.2f} s (build {'cached' if prog.manifest['build']['cached'] else 'fresh'})")
    print(f"agreement: max abs error {err.max():.3e}, relative L2 error {rel:.3e}")
    print(f"kernels: {s['kernels']}, fused expressions: {s['fused_expressions']}, "
          f"arena {s['arena_bytes']} B for {s['temporaries_bytes']} B of temporaries")
    with torch.no_grad():
        t_torch = median_ms(lambda: model(tokens))
    tok_np = tokens.numpy()
    t_chroma = median_ms(lambda: prog(tok_np))
    print(f"time per call (1 thread, median): torch eager {t_torch:.3f} ms, chroma {t_chroma:.3f} ms "
          f"({t_torch / t_chroma:.2f}x)")
    ok = rel < 1e-5 and err.max() < 1e-4
    print("PASS" if ok else "FAIL: outputs differ from PyTorch beyond tolerance (max abs 1e-4, rel L2 1e-5)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
