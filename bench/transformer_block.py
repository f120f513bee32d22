"""Compile-side figures for a transformer block and a 2-layer gpt-oss.

    .venv/bin/python bench/transformer_block.py [--json out.json]

Reports, for one pre-norm transformer block (hidden 64, 4 heads, 8 tokens) and for the
2-layer gpt-oss (vocabulary 1000): kernel count, fused expressions, arena bytes against the total bytes of
temporaries (and the planner's lower bound), compile time cold (empty build cache) and
cached (same model again, new artifact directory), and the median call time against eager
PyTorch with one thread (medians of 200 calls after 20 warm-ups).
"""

import argparse
import math
import json
import os
import platform
import sys
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import chroma  # noqa: E402
from chroma.demo import median_ms  # noqa: E402
from chroma.models import gpt_oss  # noqa: E402


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


def measure(name, model, inputs, cache):
    t0 = time.perf_counter()
    prog = chroma.compile(model, inputs, out=os.path.join(cache, name + "_cold"), cache_dir=cache)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    prog2 = chroma.compile(model, inputs, out=os.path.join(cache, name + "_cached"), cache_dir=cache)
    cached = time.perf_counter() - t0
    assert prog2.manifest["build"]["cached"]
    np_in = [i.numpy() for i in inputs]
    with torch.no_grad():
        ref = model(*inputs)
        t_torch = median_ms(lambda: model(*inputs), iters=200, warmup=20)
    got = prog(*np_in)
    t_chroma = median_ms(lambda: prog(*np_in), iters=200, warmup=20)
    s = prog.stats
    return {
        "model": name,
        "kernels": s["kernels"],
        "fused_expressions": s["fused_expressions"],
        "arena_bytes": s["arena_bytes"],
        "arena_lower_bound": prog.manifest["arena"]["lower_bound"],
        "temporaries_bytes": s["temporaries_bytes"],
        "compile_cold_s": round(cold, 3),
        "compile_cached_s": round(cached, 3),
        "build_cold_s": round(prog.manifest["build"]["build_seconds"], 3),
        "max_abs_error": float(np.abs(got - ref.numpy()).max()),
        "torch_eager_ms": round(t_torch, 4),
        "chroma_ms": round(t_chroma, 4),
        "speedup_vs_eager": round(t_torch / t_chroma, 2),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    model, tokens = build_model(layers=1)
    block = model.blocks[0]
    torch.manual_seed(0)
    x = torch.randn(1, 8, 64)
    results = []
    with tempfile.TemporaryDirectory() as cache:
        results.append(measure("transformer_block", block, (x,), cache))
        small = gpt_oss.build(num_layers=2, vocab_size=1000)
        results.append(measure("gpt_oss_2_layers_vocab_1000", small, (gpt_oss.sample_tokens(small.cfg, 8),), cache))
    report = {"environment": {"python": sys.version.split()[0], "torch": torch.__version__,
                              "machine": platform.machine(), "cpus": os.cpu_count()},
              "results": results}
    for r in results:
        print(f"{r['model']}: {r['kernels']} kernels, {r['fused_expressions']} fused expressions, "
              f"arena {r['arena_bytes']} B (lower bound {r['arena_lower_bound']} B) for {r['temporaries_bytes']} B "
              f"of temporaries; compile cold {r['compile_cold_s']} s, cached {r['compile_cached_s']} s; "
              f"call {r['chroma_ms']} ms vs eager {r['torch_eager_ms']} ms ({r['speedup_vs_eager']}x); "
              f"max abs error {r['max_abs_error']:.2e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
