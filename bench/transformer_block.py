"""Compile-side figures for a transformer block and the demo model.

    .venv/bin/python bench/transformer_block.py [--json out.json]

Reports, for one pre-norm transformer block (hidden 64, 4 heads, 8 tokens) and for the
2-layer demo model: kernel count, fused expressions, arena bytes against the total bytes of
temporaries (and the planner's lower bound), compile time cold (empty build cache) and
cached (same model again, new artifact directory), and the median call time against eager
PyTorch with one thread (medians of 200 calls after 20 warm-ups).
"""

import argparse
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
from chroma.demo import build_model, median_ms  # noqa: E402


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
        demo, tok = build_model(layers=2)
        results.append(measure("demo_2_layers", demo, (tok,), cache))
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
