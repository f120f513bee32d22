"""Half-precision models as people bring them: a model converted with .to(torch.bfloat16) or
.to(torch.float16), compiled as it is, against eager PyTorch in the same dtype, in one run
(src/passes/README.md, "Half types (widen_half)": how float16 and bfloat16 are computed, the
products' bf16 kernels; docs/cpu_kernels.md, "bfloat16 models on oneDNN").

    .venv/bin/python bench/half_models.py [--threads 1] [--calls 20] [--models llama,moe,...]
                                          [--out bench/results/half_models.json]

Models (seeded random weights; inputs fixed):
  llama     a Llama-style decoder (nn.Linear, RMSNorm, SDPA, SwiGLU), hidden 1024, 4 layers,
            vocab 32000, 8 tokens
  moe       experts picked from stacked weights by a router (OpenAI's reference form:
            W = w1[expert_indices], then einsum), 8 experts of 1024 x 512, top 2, 8 tokens
  encoder   nn.TransformerEncoder, 4 layers of d 512, 8 heads, 64 tokens
  resnet18, mobilenet_v3_small   torchvision, 1 x 3 x 224 x 224 (and any other torchvision
            classifier by its constructor's name: --models convnext_tiny,densenet121)
Each in bfloat16 and float16: eager's median, Chroma's median (same threads), the ratio, the
relative L2 difference of the outputs (both in the model's dtype; a model whose eager output
is all zeros in that dtype (float16 underflow) reports none), Chroma's weight and arena bytes.
Median of --calls calls after 3 warm-ups; eager under torch.no_grad().
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

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import chroma  # noqa: E402
from chroma.arrays import to_numpy  # noqa: E402


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


class LlamaBlock(nn.Module):
    def __init__(self, h, ff, heads):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = RMSNorm(h), RMSNorm(h)
        self.q, self.k, self.v, self.o = (nn.Linear(h, h, bias=False) for _ in range(4))
        self.g, self.u, self.d = nn.Linear(h, ff, bias=False), nn.Linear(h, ff, bias=False), nn.Linear(ff, h, bias=False)

    def forward(self, x):
        b, t, h = x.shape
        y = self.n1(x)
        q, k, v = (m(y).view(b, t, self.heads, h // self.heads).transpose(1, 2) for m in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, h)
        x = x + self.o(a)
        y = self.n2(x)
        return x + self.d(F.silu(self.g(y)) * self.u(y))


class Llama(nn.Module):
    def __init__(self, h=1024, layers=4, ff=2816, vocab=32000, heads=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(LlamaBlock(h, ff, heads) for _ in range(layers))
        self.norm, self.head = RMSNorm(h), nn.Linear(h, vocab, bias=False)

    def forward(self, tokens):
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


class PickedExperts(nn.Module):
    def __init__(self, experts=8, hidden=512, inner=1024, k=2):
        super().__init__()
        self.k = k
        self.gate = nn.Linear(hidden, experts)
        self.w1 = nn.Parameter(torch.randn(experts, inner, hidden) * 0.02)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, inner) * 0.02)

    def forward(self, x):
        top = torch.topk(self.gate(x), self.k, dim=-1)
        h = F.silu(torch.einsum("tkfh,th->tkf", self.w1[top.indices], x))
        o = torch.einsum("tkhf,tkf->tkh", self.w2[top.indices], h)
        return (o * torch.softmax(top.values, -1)[..., None]).sum(1)


class _Models(dict):
    """The named models, and any other torchvision classifier by its constructor's name
    (torchvision.models.<name>(), 1 x 3 x 224 x 224)."""

    def __missing__(self, name):
        import torchvision

        ctor = getattr(torchvision.models, name, None)
        if ctor is None or not callable(ctor):
            raise KeyError(f"unknown model {name!r}: neither one of {sorted(self)} nor a torchvision.models constructor")
        return (ctor, lambda: (torch.randn(1, 3, 224, 224),))


def models():
    import torchvision

    torch.manual_seed(0)
    return _Models({
        "llama": (Llama, lambda: (torch.randint(0, 32000, (1, 8)),)),
        "moe": (PickedExperts, lambda: (torch.randn(8, 512),)),
        "encoder": (lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True), 4),
                    lambda: (torch.randn(1, 64, 512),)),
        "resnet18": (torchvision.models.resnet18, lambda: (torch.randn(1, 3, 224, 224),)),
        "mobilenet_v3_small": (torchvision.models.mobilenet_v3_small, lambda: (torch.randn(1, 3, 224, 224),)),
    })


def median_ms(fn, calls):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3, [t * 1e3 for t in ts]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--models", default=",".join(["llama", "moe", "encoder", "resnet18", "mobilenet_v3_small"]))
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "half_models.json"))
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    zoo = models()
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": platform.processor() or platform.machine(),
              "torch": torch.__version__, "threads": a.threads, "calls": a.calls, "results": []}
    print(f"{'model':20s} {'dtype':9s} {'eager ms':>9s} {'chroma ms':>9s} {'x eager':>8s} {'rel L2':>8s} "
          f"{'weights MB':>10s} {'arena MB':>8s}")
    with tempfile.TemporaryDirectory(prefix="chroma-half-") as work:
        for name in a.models.split(","):
            make, inputs = zoo[name]
            for dname in a.dtypes.split(","):
                dt = getattr(torch, dname)
                torch.manual_seed(0)
                m = make().eval().to(dt)
                args = tuple(x.to(dt) if x.is_floating_point() else x for x in inputs())
                with torch.no_grad():
                    want = m(*args).float().numpy()
                    eager, es = median_ms(lambda: m(*args), a.calls)
                    prog = chroma.compile(m, args, out=os.path.join(work, f"{name}-{dname}"), threads=a.threads)
                nargs = [to_numpy(x) for x in args]
                got = np.asarray(prog(*nargs)).astype(np.float32)
                ours, cs = median_ms(lambda: prog(*nargs), a.calls)
                scale = float(np.linalg.norm(want))
                err = float(np.linalg.norm(got - want) / scale) if scale > 0 and np.isfinite(scale) else None
                st = prog.manifest["stats"]
                row = {"model": name, "dtype": dname, "eager_ms": eager, "chroma_ms": ours, "speedup": eager / ours,
                       "rel_l2": err, "weight_bytes": st["weight_bytes"], "arena_bytes": st["arena_bytes"],
                       "eager_samples_ms": es, "chroma_samples_ms": cs}
                report["results"].append(row)
                print(f"{name:20s} {dname:9s} {eager:9.2f} {ours:9.2f} {eager / ours:8.2f} "
                      f"{'-' if err is None else f'{err:.1e}':>8s} {st['weight_bytes'] / 1e6:10.1f} "
                      f"{st['arena_bytes'] / 1e6:8.2f}", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"report: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
