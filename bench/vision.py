"""Convolutional models and layers: Chroma against eager PyTorch (oneDNN), one thread.

    .venv/bin/python bench/vision.py                 # resnet18 + mobilenet_v3_small + layers
    .venv/bin/python bench/vision.py --models resnet18,squeezenet1_0 --no-layers
    .venv/bin/python bench/vision.py --systems chroma,eager,ort --threads 1,2

Protocol (docs/models.md, "Benchmark protocol"): per system, `--runs` runs of `--calls` timed calls, each run after
`--warmup` untimed ones; the runs of the systems alternate (eager, Chroma, eager, Chroma...)
so slow drift of the machine hits both; the reported figure is the median pooled over all
runs. Random weights (seeded), batch 1, 224x224 float32 input, torch.inference_mode() for
eager. Batch norms have random running statistics so nothing is an identity. The report
(JSON, `--json`, default bench/results/vision.json) keeps every sample and the environment.

Target (issue 4): Chroma no slower than eager on resnet18 and mobilenet_v3_small, 1 thread.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

from _peers import pooled_median, time_calls  # noqa: E402

TARGET_MODELS = ("resnet18", "mobilenet_v3_small")

# Layers of resnet18 and mobilenet_v3_small (cin, cout, hw, kernel, stride, groups): where
# the time goes, one convolution each (bias-free, like the models' convolutions).
LAYERS = [
    ("resnet18 stem 7x7/2", 3, 64, 224, 7, 2, 1),
    ("resnet18 3x3 64@56", 64, 64, 56, 3, 1, 1),
    ("resnet18 3x3/2 64->128@56", 64, 128, 56, 3, 2, 1),
    ("resnet18 3x3 128@28", 128, 128, 28, 3, 1, 1),
    ("resnet18 3x3 256@14", 256, 256, 14, 3, 1, 1),
    ("resnet18 3x3 512@7", 512, 512, 7, 3, 1, 1),
    ("resnet18 1x1/2 128->256@28", 128, 256, 28, 1, 2, 1),
    ("mobilenet 1x1 96->576@7", 96, 576, 7, 1, 1, 1),
    ("mobilenet 1x1 16->72@56", 16, 72, 56, 1, 1, 1),
    ("mobilenet dw 3x3 72@56/2", 72, 72, 56, 3, 2, 72),
    ("mobilenet dw 5x5 96@14", 96, 96, 14, 5, 1, 96),
    ("mobilenet dw 3x3 16@112/2", 16, 16, 112, 3, 2, 16),
]


def log(msg=""):
    print(msg, flush=True)


def randomize_batch_norms(model, torch, seed=0):
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)


def build_model(name, torch):
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None)
    randomize_batch_norms(model, torch)
    return model.eval()


def alternate(systems, warmup, calls, runs):
    """{name: samples}: the systems' runs interleaved."""
    samples = {name: [] for name in systems}
    for _ in range(runs):
        for name, fn in systems.items():
            samples[name] += time_calls(fn, warmup, calls, 1)
    return samples


def ort_session(model, x, threads, workdir, torch):
    import onnxruntime as ort

    path = os.path.join(workdir, "model.onnx")
    if not os.path.exists(path):
        torch.onnx.export(model, (x,), path, dynamo=True)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return lambda a: sess.run(None, {name: a})[0]


def bench_one(label, model, x, threads, args, torch, chroma, workdir):
    xn = x.numpy()
    with torch.inference_mode():
        ref = model(x).numpy()
    t0 = time.perf_counter()
    prog = chroma.compile(model, (x,), out=os.path.join(workdir, "chroma"), threads=threads)
    compile_s = time.perf_counter() - t0
    got = prog(xn)
    err = float(np.max(np.abs(got - ref)))
    scale = float(np.max(np.abs(ref)))
    systems = {}

    def eager():
        with torch.inference_mode():
            model(x)

    systems["eager"] = eager
    systems["chroma"] = lambda: prog(xn)
    if "ort" in args.systems:
        try:
            run = ort_session(model, x, threads, workdir, torch)
            systems["ort"] = lambda: run(xn)
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            log(f"  {label}: ONNX Runtime unavailable: {type(e).__name__}: {str(e)[:200]}")
    samples = alternate(systems, args.warmup, args.calls, args.runs)
    med = {k: pooled_median(v) for k, v in samples.items()}
    return {
        "name": label,
        "threads": threads,
        "compile_s": compile_s,
        "max_abs_error": err,
        "max_abs_output": scale,
        "kernels": prog.stats.get("kernels"),
        "arena_bytes": prog.stats.get("arena_bytes"),
        "median_ms": med,
        "samples_ms": samples,
        "speedup_vs_eager": med["eager"] / med["chroma"],
    }


def fmt_row(r, systems):
    cells = [f"{r['name']:30s}", f"{r['threads']:2d}t"]
    for s in systems:
        v = r["median_ms"].get(s)
        cells.append(f"{v:9.3f}" if v is not None else f"{'-':>9s}")
    cells.append(f"{r['speedup_vs_eager']:6.2f}x")
    cells.append(f"{r['max_abs_error']:.1e} (of {r['max_abs_output']:.1f})")
    return "  ".join(cells)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(TARGET_MODELS), help="torchvision model names, comma separated")
    ap.add_argument("--no-layers", action="store_true", help="skip the per-layer table")
    ap.add_argument("--systems", default="chroma,eager", help="chroma,eager[,ort]")
    ap.add_argument("--threads", default="1", help="thread counts, comma separated")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="few calls (a smoke run, not a measurement)")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "vision.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.warmup, args.calls, args.runs = 2, 5, 1
    args.systems = args.systems.split(",")

    import torch

    import chroma
    from gpt_oss import environment

    report = {"environment": environment(), "protocol": {"warmup": args.warmup, "calls": args.calls, "runs": args.runs},
              "models": [], "layers": []}
    thread_counts = [int(t) for t in args.threads.split(",")]
    columns = ["eager", "chroma"] + (["ort"] if "ort" in args.systems else [])
    header = f"{'':30s}  {'':3s}" + "".join(f"  {c + ' ms':>9s}" for c in columns) + "  speedup  max|err| (of max|out|)"
    with tempfile.TemporaryDirectory(prefix="chroma-vision-") as work:
        for threads in thread_counts:
            torch.set_num_threads(threads)
            log(f"models, {threads} thread(s), batch 1, 3x224x224 float32")
            log(header)
            for name in [m for m in args.models.split(",") if m]:
                model = build_model(name, torch)
                x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
                wd = tempfile.mkdtemp(dir=work)
                r = bench_one(name, model, x, threads, args, torch, chroma, wd)
                r["compile_s"] = round(r["compile_s"], 2)
                report["models"].append(r)
                log(fmt_row(r, columns) + f"  compile {r['compile_s']:.1f} s")
            if args.no_layers:
                continue
            log(f"\nlayers, {threads} thread(s): one convolution each, no bias")
            log(header)
            for label, cin, cout, hw, k, stride, groups in LAYERS:
                torch.manual_seed(0)
                conv = torch.nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False).eval()
                x = torch.randn(1, cin, hw, hw, generator=torch.Generator().manual_seed(1))
                wd = tempfile.mkdtemp(dir=work)
                r = bench_one(label, conv, x, threads, args, torch, chroma, wd)
                flops = 2 * cout * (cin // groups) * k * k * ((hw + stride - 1) // stride) ** 2
                r["gflops_chroma"] = flops / r["median_ms"]["chroma"] / 1e6
                r["gflops_eager"] = flops / r["median_ms"]["eager"] / 1e6
                report["layers"].append(r)
                log(fmt_row(r, columns) + f"  {r['gflops_chroma']:.0f} vs {r['gflops_eager']:.0f} GFLOP/s")
    report["environment"]["loadavg_end"] = list(os.getloadavg())
    targets = []
    for r in report["models"]:
        if r["name"] in TARGET_MODELS and r["threads"] == 1:
            ok = r["speedup_vs_eager"] >= 1.0
            targets.append({"target": f"{r['name']} 1 thread: Chroma no slower than eager", "met": ok,
                            "speedup": r["speedup_vs_eager"]})
    report["targets"] = targets
    if targets:
        log("\nTargets:")
        for t in targets:
            log(f"  [{'  met  ' if t['met'] else 'NOT MET'}] {t['target']}: {t['speedup']:.2f}x")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    log(f"\nreport: {args.json}")


if __name__ == "__main__":
    main()
