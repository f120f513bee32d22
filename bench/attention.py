"""Attention in one kernel against eager PyTorch's scaled_dot_product_attention (its CPU flash
kernel), in float32 and in bfloat16.

    .venv/bin/python bench/attention.py                       # 1088 tokens, 24 heads of 128 (the
                                                              # text-to-image transformer at 512 x 512)
    .venv/bin/python bench/attention.py --shape 1,12,4096,64 --threads 1,2

Systems, for each thread count: eager in float32 and in bfloat16 (the inputs converted), Chroma
on the float32 model (float32 products), on the float32 model with weights={"attention": "bf16"}
(both products on AMX's bfloat16 tiles where the CPU has them) and on the bfloat16 model (its
q, k, v are bfloat16 values: AMX without an option). Each cell: the median of --calls calls
after two warm-ups; the systems alternate call by call. Errors: max abs difference from the same
attention in float64 of the float32 inputs, over the output's max abs. The JSON report
(--json, default bench/results/attention.json) keeps the environment and every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="1,24,1088,128", help="batch, heads, tokens, head width")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--json", default=os.path.join(HERE, "results", "attention.json"))
    a = ap.parse_args()

    import numpy as np
    import torch

    import chroma
    from chroma.arrays import to_numpy

    class Sdpa(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    b, h, n, d = (int(x) for x in a.shape.split(","))
    g = torch.Generator().manual_seed(0)
    qkv = tuple(torch.randn(b, h, n, d, generator=g) for _ in range(3))
    qkv16 = tuple(x.to(torch.bfloat16) for x in qkv)
    with torch.no_grad():
        exact = Sdpa()(*[x.double() for x in qkv]).numpy()
    scale = float(np.abs(exact).max())
    work = tempfile.mkdtemp(prefix="chroma-attention-")
    rows = []
    print(f"attention [{a.shape}] on {platform.processor() or platform.machine()}, torch {torch.__version__}; "
          f"median of {a.calls} calls, ms")
    for t in (int(x) for x in a.threads.split(",")):
        torch.set_num_threads(t)
        n32 = [x.numpy() for x in qkv]
        n16 = [to_numpy(x) for x in qkv16]
        fp32 = chroma.compile(Sdpa(), qkv, out=os.path.join(work, f"fp32-{t}"), threads=t)
        att16 = chroma.compile(Sdpa(), qkv, out=os.path.join(work, f"att16-{t}"), threads=t, weights={"attention": "bf16"})
        model16 = chroma.compile(Sdpa(), qkv16, out=os.path.join(work, f"model16-{t}"), threads=t)
        systems = {
            "eager fp32": lambda: Sdpa()(*qkv),
            "eager bf16": lambda: Sdpa()(*qkv16),
            "chroma fp32": lambda: fp32(*n32),
            "chroma attention=bf16": lambda: att16(*n32),
            "chroma bf16 model": lambda: model16(*n16),
        }
        samples = {k: [] for k in systems}
        outs = {}
        with torch.no_grad():
            for name, fn in systems.items():
                fn()
                out = fn()
                outs[name] = (out.float().numpy() if isinstance(out, torch.Tensor) else np.asarray(out).astype(np.float32))
            for _ in range(a.calls):
                for name, fn in systems.items():
                    t0 = time.perf_counter()
                    fn()
                    samples[name].append((time.perf_counter() - t0) * 1e3)
        for name in systems:
            ms = statistics.median(samples[name])
            err = float(np.abs(outs[name] - exact).max()) / scale
            rows.append({"threads": t, "system": name, "ms": ms, "samples_ms": samples[name], "max_err": err})
            print(f"{t}T  {name:24} {ms:9.2f}  err {err:.1e}", flush=True)
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w", encoding="utf-8") as f:
        json.dump({"shape": a.shape, "calls": a.calls, "machine": platform.processor() or platform.machine(),
                   "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
