"""Chroma's CUDA target against PyTorch on the same NVIDIA GPU, in one run (issue 15's benchmark;
run by scripts/gpu_check.sh).

    python3 bench/cuda_gpu.py --out $OUT/cuda.json          # on a machine with an NVIDIA GPU

The reference model (chroma.models.gpt_oss.build(), 8 tokens; the protocol of docs/models.md,
"Benchmark protocol") through:
  chroma        the CUDA artifact (chroma.compile(..., target="cuda")), one launch per dispatch
  chroma-graph  the same artifact replaying each call as one CUDA graph (cuda_graph=True)
  eager         PyTorch eager on the GPU
  inductor      torch.compile (Inductor, Triton), default mode
  inductor-ro   torch.compile(mode="reduce-overhead") (CUDA graphs)
Every timing includes the host-to-device copy of the tokens, the call, the device-to-host copy
of the logits and the synchronization (NumPy in, NumPy out, as the predecessor measured).
Each for every --weights format (default fp32, bf16, q4: docs/quantization.md, "GPU targets";
the float32 artifact is "chroma", the others "chroma-q4" and so on), with the logits' relative
L2 error and top-1 agreement against eager FP32 on the CPU. Decode (decode()): prefill, cached
step per dispatch and as a CUDA graph, uncached step. Median of --calls calls after
--warmup calls. Also: Chroma's kernel (dispatch) count per call, each
kernel's device time (kernel_profile(), torch.profiler) and CUDA kernel launches per eager call, each system's max abs error against
eager FP32 on the CPU, and the targets (met / not met): at least 6x faster than eager, faster
than torch.compile in both modes, cached decode step at least 10x faster than uncached.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import chroma  # noqa: E402
from chroma.models import gpt_oss  # noqa: E402


def timed(fn, warmup: int, calls: int):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3, ts


def eager_launches(model, tokens_gpu) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as p, torch.no_grad():
        model(tokens_gpu)
        torch.cuda.synchronize()
    return sum(e.count for e in p.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)


def kernel_profile(prog, tok: np.ndarray, kernels: list, calls: int = 3, top: int = 15) -> dict:
    """Device time per call of every kernel a Chroma call runs, from torch.profiler (CUPTI sees
    the driver-API launches of the artifact's host library in the same process): the total,
    the time by kernel kind (the manifest's kernels[i].kind; cuBLAS and copies are "other")
    and the `top` kernels with their labels, so a run on a GPU says where the call's time goes."""
    from torch.profiler import ProfilerActivity, profile

    prog(tok)
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            prog(tok)
        torch.cuda.synchronize()
    rows = []
    for e in p.key_averages():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = float(getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)) / calls
        row = {"name": e.key[:120], "us_per_call": us, "launches_per_call": e.count / calls}
        m = re.search(r"chroma_k(\d+)_main", e.key)
        if m and int(m.group(1)) < len(kernels):
            k = kernels[int(m.group(1))]
            row.update(kind=k.get("kind"), label=str(k.get("label", ""))[:160], node=k.get("node"))
        rows.append(row)
    rows.sort(key=lambda r: -r["us_per_call"])
    by_kind: dict = {}
    for r in rows:
        kind = r.get("kind") or "other"
        by_kind[kind] = by_kind.get(kind, 0.0) + r["us_per_call"]
    return {"device_us_per_call": sum(r["us_per_call"] for r in rows),
            "by_kind_us": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])), "top": rows[:top]}


def decode(a, model, work: str, report: dict, save) -> None:
    """The decode protocol (docs/models.md, "Benchmark protocol") on the GPU: a 256-row KV
    cache, a 32-token prompt, then --steps cached steps (chroma.compile_decoder: prefill and
    step share the weights and the cache on the device), per dispatch and as one CUDA graph per
    call; against the uncached step, the full 256-token window recomputed in one call (the
    float32 artifact for 256 tokens, as one CUDA graph), and eager PyTorch on that window."""
    from chroma.decoder import Decoder

    rep = report["decode"] = {"cache_size": 256, "prompt_len": 32, "steps": a.steps}
    toks = gpt_oss.sample_tokens(model.cfg, 256, seed=5)
    prompt = toks[:32].numpy()
    d = os.path.join(work, "decoder")
    try:
        t0 = time.perf_counter()
        with torch.no_grad():
            chroma.compile_decoder(model, prompt_len=32, cache_size=256, out=d, target="cuda")
        rep["compile_seconds"] = time.perf_counter() - t0
        with torch.no_grad():
            want = model(toks[: 32 + a.steps]).numpy()
        for mode, graph in (("per-dispatch", False), ("graph", True)):
            dec = Decoder(chroma.load(d, cuda_graph=graph))
            pre_ms, _ = timed(lambda: dec.prefill(prompt), 3, 10)
            first = dec.prefill(prompt)
            steps, worst = [], float(np.abs(first - want[:32]).max())
            for p in range(32, 32 + a.steps):
                t0 = time.perf_counter()
                logits = dec.step(int(toks[p]))
                steps.append((time.perf_counter() - t0) * 1e3)
                worst = max(worst, float(np.abs(logits[0] - want[p]).max()))
            rep[mode] = {"prefill_ms": pre_ms, "step_ms": statistics.median(steps), "step_samples_ms": steps,
                         "max_abs_error": worst}
            print(f"decode {mode:12s} prefill {pre_ms:8.3f} ms  step {statistics.median(steps):8.3f} ms  "
                  f"max |err| vs eager {worst:.2e}")
            dec.program.close()
            save()
        u = os.path.join(work, "uncached")
        with torch.no_grad():
            chroma.compile(model, (toks,), target="cuda", out=u)
        prog = chroma.load(u, cuda_graph=True)
        tn = toks.numpy()
        ms, _ = timed(lambda: prog(tn), 3, 10)
        gm = model.cuda()
        tc = toks.cuda()

        def eager():
            with torch.no_grad():
                gm(tc)
            torch.cuda.synchronize()

        ems, _ = timed(eager, 3, 10)
        rep["uncached"] = {"ms": ms, "eager_ms": ems, "tokens": 256}
        print(f"decode uncached 256-token call: Chroma (graph) {ms:.3f} ms, eager {ems:.3f} ms")
        prog.close()
    except Exception as e:  # noqa: BLE001 - reported; the rest of the benchmark still runs
        rep["error"] = f"{type(e).__name__}: {e}"
        print(f"decode failed: {type(e).__name__}: {e}")
    save()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--out", default="bench/results/cuda.json")
    ap.add_argument("--steps", type=int, default=32, help="cached decode steps after the 32-token prompt")
    ap.add_argument("--no-decode", dest="decode", action="store_false", help="skip the decode protocol")
    ap.add_argument("--weights", default="fp32,fp32-nosplit,bf16,q4",
                    help="weight formats to compile and time (docs/quantization.md); fp32 is the baseline; "
                         "a '-nosplit' suffix compiles with CHROMA_GPU_SPLIT_K=off (the few-rows products "
                         "without their split of K: the A/B of products.cpp's split)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device visible to PyTorch: this benchmark runs on a machine with an NVIDIA GPU")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # FP32 everywhere, as Chroma computes
    torch.backends.cudnn.allow_tf32 = False
    model = gpt_oss.build().eval()
    tokens = gpt_oss.sample_tokens(model.cfg, a.tokens)
    with torch.no_grad():
        ref = model(tokens).numpy()
    work = tempfile.mkdtemp(prefix="chroma-cuda-bench-")
    variants = [w for w in a.weights.split(",") if w]
    compile_s = {}
    for w in variants:
        t0 = time.perf_counter()
        split = os.environ.pop("CHROMA_GPU_SPLIT_K", None)
        if w.endswith("-nosplit"):
            os.environ["CHROMA_GPU_SPLIT_K"] = "off"
        try:
            with torch.no_grad():
                chroma.compile(model, (tokens,), target="cuda", out=os.path.join(work, f"gpt-{w}"),
                               weights=w.removesuffix("-nosplit"))
        except Exception as e:  # noqa: BLE001 - reported; the other variants still run
            compile_s[w] = f"failed: {type(e).__name__}: {e}"
            print(f"compiling weights={w} failed: {type(e).__name__}: {e}")
            continue
        finally:
            os.environ.pop("CHROMA_GPU_SPLIT_K", None)
            if split is not None:
                os.environ["CHROMA_GPU_SPLIT_K"] = split
        compile_s[w] = time.perf_counter() - t0
    report = {"environment": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "python": platform.python_version(), "compile_seconds": compile_s},
              "model": {"name": "gpt_oss", "tokens": a.tokens}, "systems": {}}
    tok = tokens.numpy()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)

    def save():  # after every system: a run cut off by its time limit still leaves what it measured
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)

    def record(name, fn, **extra):
        try:
            out = np.asarray(fn(), np.float64)
            err = float(np.abs(out - ref).max())
            rel = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
            top1 = float((out.argmax(-1) == ref.argmax(-1)).mean())
            ms, ts = timed(fn, a.warmup, a.calls)
            report["systems"][name] = {"ms": ms, "samples_ms": [t * 1e3 for t in ts], "max_abs_error": err,
                                       "rel_l2": rel, "top1_agreement": top1, **extra}
            print(f"{name:18s} {ms:9.3f} ms   max |err| {err:.2e}  rel L2 {rel:.2e}  top-1 {top1:.3f}  {extra}")
        except Exception as e:  # noqa: BLE001 - one failing system is reported, the others still run
            report["systems"][name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{name:18s} failed: {type(e).__name__}: {e}")
        save()

    # "chroma" and "chroma-graph" are the float32 artifact; other weight formats get a suffix
    for w in variants:
        if not isinstance(compile_s.get(w), float):
            continue
        d = os.path.join(work, f"gpt-{w}")
        with open(os.path.join(d, "manifest.json")) as f:
            policy = json.load(f).get("options", {}).get("weights") or {}
        for name, graph in (("chroma", False), ("chroma-graph", True)):
            name = name if w == "fp32" else f"{name}-{w}"
            try:
                prog = chroma.load(d, cuda_graph=graph)
            except Exception as e:  # noqa: BLE001 - reported; the other systems still run
                report["systems"][name] = {"error": f"{type(e).__name__}: {e}"}
                print(f"{name:18s} failed to load: {type(e).__name__}: {e}")
                continue
            record(name, lambda p=prog: p(tok), weights=w,
                   product_weight_bytes=policy.get("product_weights_bytes"), kernels_per_call=prog.stats.get("dispatches"),
                   launches_per_call=1 if graph else prog.stats.get("dispatches"))
            if not graph and name in report["systems"] and "ms" in report["systems"][name]:
                try:
                    with open(os.path.join(d, "manifest.json")) as f:
                        kinfo = json.load(f).get("kernels", [])
                    prof = report["systems"][name]["profile"] = kernel_profile(prog, tok, kinfo)
                    print(f"{name:18s} device time {prof['device_us_per_call']:.0f} us per call: "
                          + ", ".join(f"{k} {v:.0f}" for k, v in list(prof["by_kind_us"].items())[:6]))
                except Exception as e:  # noqa: BLE001 - reported; the benchmark goes on
                    report["systems"][name]["profile"] = {"error": f"{type(e).__name__}: {e}"}
                save()
    if a.decode:  # on the CPU model (it moves it to the GPU for the eager window)
        decode(a, model, work, report, save)
    gm = model.cuda()

    def torch_call(f):
        def run():
            with torch.no_grad():
                y = f(torch.from_numpy(tok).cuda())
                return y.cpu().numpy()
        return run

    record("eager", torch_call(gm), launches_per_call=eager_launches(gm, tokens.cuda()))
    record("inductor", torch_call(torch.compile(gm)))
    record("inductor-ro", torch_call(torch.compile(gm, mode="reduce-overhead")))
    s = report["systems"]
    ms = {k: v.get("ms") for k, v in s.items()}
    best = min((ms[k] for k in ("chroma", "chroma-graph") if ms.get(k)), default=None)  # float32 weights
    targets = []
    if best and ms.get("eager"):
        targets.append(("at least 6x faster than eager", ms["eager"] / best, ms["eager"] / best >= 6))
    for k in ("inductor", "inductor-ro"):
        if best and ms.get(k):
            targets.append((f"faster than {k}", ms[k] / best, best < ms[k]))
    # quantized weights read fewer bytes: their call against the float32 artifact's, both graphs
    for w in variants:
        if w.endswith("-nosplit"):
            # not a target: the split's effect, the same weights with and without it
            fmt = w.removesuffix("-nosplit")
            base = "chroma-graph" if fmt == "fp32" else f"chroma-graph-{fmt}"
            if ms.get(base) and ms.get(f"chroma-graph-{w}"):
                r = ms[f"chroma-graph-{w}"] / ms[base]
                report.setdefault("split_k", {})[fmt] = {"with_ms": ms[base], "without_ms": ms[f"chroma-graph-{w}"],
                                                         "speedup": r}
                print(f"  split K ({base}): {r:.2f}x the speed without it")
            continue
        if w != "fp32" and ms.get(f"chroma-graph-{w}") and ms.get("chroma-graph"):
            r = ms["chroma-graph"] / ms[f"chroma-graph-{w}"]
            targets.append((f"weights={w} faster than float32 weights (CUDA graphs)", r, r > 1))
    dec = report.get("decode", {})
    step = min((dec.get(k, {}).get("step_ms") or float("inf") for k in ("per-dispatch", "graph")), default=float("inf"))
    unc = dec.get("uncached", {}).get("ms")
    if unc and step < float("inf"):
        targets.append(("cached decode step at least 10x faster than uncached", unc / step, unc / step >= 10))
    else:
        targets.append(("cached decode step at least 10x faster than uncached", None, None))
    report["targets"] = [{"target": t, "ratio": r, "met": m} for t, r, m in targets]
    for t, r, m in targets:
        print(f"  {t}: " + ("not measured (see decode in the report)" if m is None else
                            f"{r:.2f}x, {'met' if m else 'not met'}"))
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
