"""The zoo on the WebGPU target: every model of bench/zoo.py compiled for WebGPU, run, and
compared with eager PyTorch. Where bench/webgpu.py measures a few models against the WebGPU
peers, this one asks of many models as people write them: does it compile, does it match, how
many dispatches against the CPU's kernels, how many pipelines, how big is the package.

    .venv/bin/python bench/webgpu_zoo.py --quick
    .venv/bin/python bench/webgpu_zoo.py --models resnet50,bert,vgg11_bn --runtime node
    .venv/bin/python bench/webgpu_zoo.py --torchvision all --image-size 96

Runtimes (`--runtime`): `python` (chroma.runtime.webgpu through the `wgpu` package on Mesa's lavapipe,
VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json unless set: the outputs compared
with eager's, relative to eager's largest |output|) or `node` (web/bin/chroma-web.mjs check on
Dawn + SwiftShader: the package's self-check against the golden outputs PyTorch computed at
compile time; needs web/dist and web/node_modules). Each model runs in its own process.
`ms` is the median of `--calls` calls (after one warm-up call) on a software adapter: it
compares models and versions of Chroma on this machine, not GPUs. The JSON report (`--json`,
default bench/results/webgpu_zoo.json) keeps every row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)

LAVAPIPE = "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"
SWIFTSHADER = "/usr/lib/chromium/vk_swiftshader_icd.json"
QUICK = ["resnet18", "resnet50", "mobilenet_v3_small", "efficientnet_b0", "densenet121", "convnext_tiny",
         "vit_b_16", "bert", "llama", "gpt_oss"]


def worker(spec):
    """One model: compile for WebGPU, run, compare. Returns a row (dict)."""
    import numpy as np
    import torch

    import chroma
    import zoo
    from chroma.runtime import webgpu

    name, runtime, calls, size = spec["model"], spec["runtime"], spec["calls"], spec["image_size"]
    row = {"model": name, "runtime": runtime}
    model, inputs = zoo.build(name)
    if size and len(inputs) == 1 and inputs[0].dim() == 4 and inputs[0].is_floating_point():
        inputs = (torch.randn(inputs[0].shape[0], inputs[0].shape[1], size, size, generator=torch.Generator().manual_seed(1)),)
    with torch.no_grad():
        want = model(*inputs)
    want = [t.numpy() for t in (want if isinstance(want, (tuple, list)) else (want,))]
    out = os.path.join(spec["work"], name)
    t0 = time.perf_counter()
    package = out + ".chroma-web"
    prog = None
    try:
        with torch.no_grad():
            prog = chroma.compile(model, inputs, target="webgpu", out=out)
    except webgpu.RunError as e:
        # the package is written; Python's adapter could not load it (a limit): Node may
        if runtime != "node" or not os.path.isfile(package):
            row["error"] = f"load: {str(e)[:400]}"
            return row
    except Exception as e:  # noqa: BLE001 - the row reports it
        row["error"] = f"compile: {type(e).__name__}: {str(e)[:400]}"
        return row
    row["compile_s"] = time.perf_counter() - t0
    st = webgpu.read_package(package).manifest["stats"]
    row.update(dispatches=st["dispatches"], cpu_kernels=st["cpu_kernels"], pipelines=st["pipelines"],
               weight_bytes=st["weight_bytes"], package_bytes=os.path.getsize(package))
    if runtime == "node":
        env = dict(os.environ, VK_ICD_FILENAMES=os.environ.get("VK_ICD_FILENAMES", SWIFTSHADER))
        r = subprocess.run(["node", os.path.join(ROOT, "web", "bin", "chroma-web.mjs"), "check", package],
                           capture_output=True, text=True, env=env, timeout=1800)
        report = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {"error": r.stderr[-400:]}
        if "error" in report:
            row["error"] = "run: " + report["error"]
        row.update(ok=report.get("ok", False), max_error=report.get("maxError"), ms=report.get("runMs"),
                   warmup_ms=report.get("warmupMs"))
        return row
    np_inputs = [t.numpy() for t in inputs]
    try:
        got = prog(*np_inputs)
        samples = []
        for _ in range(calls):
            t1 = time.perf_counter()
            got = prog(*np_inputs)
            samples.append(1e3 * (time.perf_counter() - t1))
    except Exception as e:  # noqa: BLE001
        row["error"] = f"run: {type(e).__name__}: {str(e)[:400]}"
        return row
    got = got if isinstance(got, (tuple, list)) else [got]
    err = max(float(np.abs(g.astype(np.float64) - w).max()) for g, w in zip(got, want))
    scale = max(float(np.abs(w).max()) for w in want) or 1.0
    row.update(ms=statistics.median(samples), max_error=err, rel_error=err / scale, ok=err / scale <= 1e-4)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a subset: " + ",".join(QUICK))
    ap.add_argument("--models", default="", help="comma-separated names (bench/zoo.py's; default: its whole zoo)")
    ap.add_argument("--torchvision", choices=["none", "all"], default="none", help="also every torchvision classifier")
    ap.add_argument("--runtime", choices=["python", "node"], default="python")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--image-size", type=int, default=0, help="square images of this size (default: each model's own)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per model")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "webgpu_zoo.json"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print("ROW " + json.dumps(worker(json.loads(a.worker))), flush=True)
        return 0
    import zoo

    names = [m for m in a.models.split(",") if m] or (QUICK if a.quick else zoo.TV_FAMILIES + zoo.TRANSFORMERS + zoo.OWN)
    if a.torchvision == "all":
        from chroma.models import vision

        names += [m for m in vision.classification_models() if m not in names]
    if a.runtime == "python":
        os.environ.setdefault("VK_ICD_FILENAMES", LAVAPIPE)
    rows = []
    with tempfile.TemporaryDirectory(prefix="chroma-webgpu-zoo-") as work:
        for name in names:
            spec = {"model": name, "runtime": a.runtime, "calls": a.calls, "image_size": a.image_size, "work": work}
            try:
                r = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True,
                                   text=True, timeout=a.timeout)
                lines = [x for x in r.stdout.splitlines() if x.startswith("ROW ")]
                row = json.loads(lines[-1][4:]) if lines else {"model": name, "error": f"worker exited {r.returncode}: {r.stderr[-400:]}"}
            except subprocess.TimeoutExpired:
                row = {"model": name, "error": f"timed out after {a.timeout:.0f} s"}
            rows.append(row)
            if "error" in row:
                print(f"{name:24s} FAILED {row['error']}", flush=True)
            else:
                rel = row.get("rel_error", row.get("max_error"))
                print(f"{name:24s} {'ok' if row['ok'] else 'MISMATCH':8s} err {rel:.1e}  dispatches {row['dispatches']:4d} "
                      f"(CPU kernels {row['cpu_kernels']:4d})  pipelines {row['pipelines']:4d}  "
                      f"package/weights {row['package_bytes'] / max(row['weight_bytes'], 1):.3f}  "
                      f"{row['ms']:.1f} ms  compile {row['compile_s']:.1f} s", flush=True)
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w", encoding="utf-8") as f:
        json.dump({"runtime": a.runtime, "image_size": a.image_size, "rows": rows}, f, indent=1)
    bad = [r["model"] for r in rows if "error" in r or not r.get("ok")]
    print(f"{len(rows) - len(bad)} of {len(rows)} models compile and match" + (f"; not: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
