"""One quantized product by its number of rows: the default kernels (int8 activations for q4
and q6 where the CPU has AVX512-VNNI, bfloat16 otherwise, 8 rows a register block) against
the exact float32 path (`"activations": "fp32"`: panels dequantized into a buffer and multiplied
by float32 tiles) and against PyTorch eager on the float32 weights (docs/quantization.md,
"Rows in blocks of 8").

    .venv/bin/python bench/quant_rows.py [--k 2880] [--n 2880] [--formats q4,q6,q8,bf16]
                                         [--rows 1,8,16,32,64,128,256] [--threads 1]

Each cell: the median of 30 calls after 5 warm-ups of an nn.Linear(K, N, bias=False) compiled
for that format and row count. Ratios are float32 path / default and eager / default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def median_ms(fn, warmup=5, calls=30):
    for _ in range(warmup):
        fn()
    s = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        s.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=2880)
    ap.add_argument("--n", type=int, default=2880)
    ap.add_argument("--formats", default="q4,q6,q8,bf16")
    ap.add_argument("--rows", default="1,8,16,32,64,128,256")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch

    import chroma

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    lin = torch.nn.Linear(args.k, args.n, bias=False).eval()
    print(f"K = {args.k}, N = {args.n}, {args.threads} thread(s); median ms of 30 calls")
    print("| format | rows | default ms | fp32 path ms | eager fp32 ms | fp32 path / default | eager / default |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for fmt in args.formats.split(","):
            for m in (int(r) for r in args.rows.split(",")):
                x = torch.randn(m, args.k)
                xn = x.numpy()
                t = {}
                for act in ("auto", "fp32"):
                    prog = chroma.compile(lin, (x,), out=os.path.join(work, f"{fmt}_{m}_{act}"), threads=args.threads,
                                          weights={"default": fmt, "activations": act})
                    t[act] = median_ms(lambda: prog(xn))
                with torch.no_grad():
                    t["eager"] = median_ms(lambda: lin(x))
                print(f"| {fmt} | {m} | {t['auto']:.3f} | {t['fp32']:.3f} | {t['eager']:.3f} | "
                      f"{t['fp32'] / t['auto']:.2f}x | {t['eager'] / t['auto']:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
