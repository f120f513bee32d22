"""The text-to-image pipeline: Chroma (fp32, bf16, q8, q6, q4 transformer) against diffusers'
ChromaPipeline in float32, on the same random weights of Chroma1-HD's architecture at a
medium size (chroma.pipelines.random_model.MEDIUM: T5 4 layers d_model 512, transformer 2 double
+ 4 single blocks of 8 heads x 64, the VAE at channels 32-128), 256x256, 4 steps, CFG 3.8.
The whole comparison runs in minutes (the first run also compiles each variant once).
`--config wide` runs Chroma1-HD's widths (random_model.WIDE: T5-XXL's width at 2 layers, the
transformer's 24 heads of 128 at 2 double and 4 single blocks, the real VAE): what a step
costs at the real width, where the full depth in float32 (35.6 GB) does not fit this machine.

    .venv/bin/python bench/text_to_image.py
    .venv/bin/python bench/text_to_image.py --size 512 --steps 8 --variants fp32,q4 --threads 4

Each measurement is a fresh process (so its peak memory is its own; each Chroma variant is
compiled once first, unmeasured), `--repeat` rounds over all systems, medians reported: the
per-step time (the mean over the steps: two transformer calls and the Euler step), the
whole run from loading to the image (Chroma: from cached artifacts; diffusers: from_pretrained), and the peak
resident memory (/proc's VmHWM, the interpreter and its imports included). diffusers runs as
it does by default (text padded to 512 tokens) and with max_sequence_length 64 (the same
text length as Chroma's bucket: the like-for-like transformer cost).

With fp32 among the variants, each other variant's accuracy follows: the relative L2 error
of its guided velocity at every step of the fp32 trajectory (chroma.pipelines.accuracy).

Targets: a denoising step >= 2x faster than diffusers fp32, >= 3x with q4/q6; peak memory
<= half of diffusers'.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

PROMPT = "a red fox in snow"


def _vmhwm() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def worker_chroma(a) -> dict:
    t0 = time.perf_counter()
    from chroma.pipelines import TextToImage

    pipe = TextToImage(a.model, transformer=a.variant, text_encoder="fp32", cache_dir=a.cache, threads=a.threads)
    res = pipe.run(PROMPT, seed=1, width=a.size, height=a.size, steps=a.steps, cfg=3.8, schedule="diffusers")
    total = time.perf_counter() - t0
    return {"step": res.timings["step_mean"], "total": total, "peak": _vmhwm(),
            "compiled": "transformer.compile" in res.timings}


def worker_diffusers(a) -> dict:
    t0 = time.perf_counter()
    import torch
    from diffusers import ChromaPipeline
    from diffusers.utils import logging

    from chroma.pipelines import OFFICIAL_NEGATIVE

    logging.set_verbosity_error()
    torch.set_num_threads(a.threads)
    dp = ChromaPipeline.from_pretrained(a.model, dtype=torch.float32)
    dp.set_progress_bar_config(disable=True)
    stamps = []

    def cb(pipe, i, t, kw):
        stamps.append(time.perf_counter())
        return kw

    with torch.inference_mode():
        t_start = time.perf_counter()
        dp(PROMPT, negative_prompt=OFFICIAL_NEGATIVE, height=a.size, width=a.size, num_inference_steps=a.steps,
           guidance_scale=3.8, generator=torch.Generator("cpu").manual_seed(1), max_sequence_length=a.max_seq,
           callback_on_step_end=cb)
    # The first step's time counts from the loop's start, after encoding: stamps[0] - encode end is
    # not observable, so the steps' mean is taken over the differences (steps 2..n).
    steps = [b - a_ for a_, b in zip(stamps, stamps[1:])] or [stamps[0] - t_start]
    return {"step": sum(steps) / len(steps), "total": time.perf_counter() - t0, "peak": _vmhwm()}


def _run(args, extra) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--model", args.model, "--cache", args.cache, "--size",
           str(args.size), "--steps", str(args.steps), "--threads", str(args.threads), *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(extra)} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a model directory (default: a random one of --config in a temp dir)")
    ap.add_argument("--config", choices=("medium", "wide"), default="medium",
                    help="the random model's size: medium (minutes), or wide: Chroma1-HD's widths at 2 double and 4 "
                    "single blocks, T5-XXL's at 2 layers, the real VAE (random_model.WIDE)")
    ap.add_argument("--cache", default=None, help="the compiled components' cache (default: beside the model)")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--variants", default="fp32,bf16,q8,q6,q4")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds over every system (interleaved); the medians are reported")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--worker", choices=("chroma", "diffusers"), help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="fp32", help=argparse.SUPPRESS)
    ap.add_argument("--max-seq", type=int, default=512, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker_chroma(a) if a.worker == "chroma" else worker_diffusers(a)))
        return
    work = tempfile.mkdtemp(prefix="chroma-t2i-bench-")
    if a.model is None:
        from chroma.pipelines import random_model

        a.model = random_model.write_random_model(os.path.join(work, a.config),
                                                  config=getattr(random_model, a.config.upper()), seed=0)
    a.cache = a.cache or os.path.join(work, "cache")
    systems = [("diffusers fp32 (512 text tokens)", ["--worker", "diffusers"]),
               ("diffusers fp32 (64 text tokens)", ["--worker", "diffusers", "--max-seq", "64"])]
    systems += [(f"chroma {v}", ["--worker", "chroma", "--variant", v]) for v in a.variants.split(",")]
    for label, extra in systems[2:]:  # compile each variant once, unmeasured
        _run(a, extra)
    samples = {label: [] for label, _ in systems}
    for _ in range(a.repeat):  # rounds alternate the systems, so drift of the machine hits all
        for label, extra in systems:
            samples[label].append(_run(a, extra))
    results = {}
    for label, rs in samples.items():
        med = lambda k: sorted(r[k] for r in rs)[len(rs) // 2]  # noqa: E731
        results[label] = {"step": med("step"), "total": med("total"), "peak": max(r["peak"] for r in rs),
                          "samples": rs}
    print(f"{a.size}x{a.size}, {a.steps} steps, CFG 3.8, {a.threads} threads, {a.repeat} round(s), model {a.model}")
    print(f"{'system':36} {'step s':>9} {'run s':>9} {'peak MiB':>9}")
    for k, r in results.items():
        print(f"{k:36} {r['step']:9.4f} {r['total']:9.2f} {r['peak'] / 2 ** 20:9.1f}")
    base = results["diffusers fp32 (512 text tokens)"]
    like = results["diffusers fp32 (64 text tokens)"]
    for k, r in results.items():
        if not k.startswith("chroma"):
            continue
        want = 3.0 if k.endswith(("q4", "q6")) else 2.0
        sp, sp_like = base["step"] / r["step"], like["step"] / r["step"]
        mem = r["peak"] / base["peak"]
        print(f"{k}: step {sp:.2f}x diffusers (default), {sp_like:.2f}x (64 tokens): target >= {want:.0f}x "
              f"{'met' if sp_like >= want else 'NOT met'} (like for like); peak {mem:.2f} of diffusers': target <= 0.5 "
              f"{'met' if mem <= 0.5 else 'NOT met'}")
    accuracy = {}
    if "fp32" in a.variants.split(","):
        from chroma.pipelines import TextToImage
        from chroma.pipelines.accuracy import velocity_errors

        pipe = TextToImage(a.model, text_encoder="fp32", cache_dir=a.cache, threads=a.threads)
        for v in a.variants.split(","):
            if v != "fp32":
                accuracy[v] = velocity_errors(pipe, v, PROMPT, seed=1, width=a.size, height=a.size, steps=a.steps)
                print(f"chroma {v}: relative L2 of the guided velocity against fp32 per step of the fp32 trajectory: "
                      + " ".join(f"{e:.4f}" for e in accuracy[v]))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"size": a.size, "steps": a.steps, "threads": a.threads, "repeat": a.repeat, "results": results,
                       "velocity_rel_l2": accuracy}, f, indent=2)


if __name__ == "__main__":
    main()
