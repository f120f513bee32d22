"""Batch ranges against programs compiled for exactly one batch size (chroma.compile(batch=...)).

    .venv/bin/python bench/batching.py [--models mlp,resnet18,bert] [--sizes 3,12,24,40,48,63] [--threads 1]

For each model: one artifact compiled for the range 1-64 (entries 1, 2, 4, ... 64; a batch
between them padded or split: chroma/runtime/batched.py), and, for each size measured, a
program compiled for exactly that size. Rows per second of each (median of --calls calls,
after a warm-up), their ratio, and the target from the issue: the range's throughput within
1.15x of the exact program's at every size between the compiled ones. Models: a 3-layer MLP
(512 wide), torchvision's resnet18 at 64 x 64 (seeded weights), a small BERT encoder
(random weights, 32 tokens). Prints the CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import chroma  # noqa: E402
from chroma.cpuinfo import info  # noqa: E402


def build(name):
    torch.manual_seed(0)
    if name == "mlp":
        m = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10)).eval()
        return m, lambda b: (torch.randn(b, 256),)
    if name == "resnet18":
        from chroma.models.vision import build as vision

        return vision("resnet18").eval(), lambda b: (torch.randn(b, 3, 64, 64),)
    if name == "bert":
        from transformers import BertConfig, BertModel

        cfg = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                         vocab_size=2000, max_position_embeddings=64)
        bert = BertModel(cfg).eval()

        class Last(nn.Module):
            def __init__(self):
                super().__init__()
                self.m = bert

            def forward(self, ids):
                return self.m(input_ids=ids).last_hidden_state

        return Last().eval(), lambda b: (torch.randint(0, 2000, (b, 32)),)
    raise SystemExit(f"unknown model {name}")


def rate(fn, rows, calls):
    fn()
    fn()
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return rows / statistics.median(ts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,resnet18,bert")
    ap.add_argument("--sizes", default="3,12,24,40,48,63")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=15)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    sizes = [int(s) for s in a.sizes.split(",")]
    cpu = info()
    print(f"{cpu['cpu']}, {a.threads} thread(s); range 1-64 against exact-size programs; rows/s (median of {a.calls})")
    print(f"{'model':10s} {'batch':>5s} {'plan':28s} {'exact':>10s} {'range':>10s} {'exact/range':>11s}")
    worst = []
    with tempfile.TemporaryDirectory(prefix="chroma-bench-batching-") as work:
        for name in a.models.split(","):
            model, make = build(name)
            rng = chroma.compile(model, make(4), batch=(1, 64), out=os.path.join(work, f"{name}-range"),
                                 threads=a.threads)
            for b in sizes:
                x = [t.numpy() for t in make(b)]
                exact = chroma.compile(model, tuple(torch.from_numpy(v) for v in x),
                                       out=os.path.join(work, f"{name}-{b}"), threads=a.threads)
                want = exact(*x)
                got = rng(*x)
                err = float(np.max(np.abs(np.asarray(got) - np.asarray(want))))
                re_, rr = rate(lambda: exact(*x), b, a.calls), rate(lambda: rng(*x), b, a.calls)
                ratio = re_ / rr
                worst.append((ratio, name, b))
                plan = "+".join(f"{s}" if s == r else f"{r}/{s}" for s, r in rng.plan(b))
                print(f"{name:10s} {b:5d} {plan:28s} {re_:10.1f} {rr:10.1f} {ratio:11.3f}  (max diff {err:.1e})",
                      flush=True)
                del exact
    r, name, b = max(worst)
    print(f"\n[{'met' if r <= 1.15 else 'NOT met'}] the range within 1.15x of the exact-size program at every size: "
          f"worst {r:.3f}x ({name}, batch {b})")


if __name__ == "__main__":
    main()
