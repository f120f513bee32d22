"""Chroma's WebGPU package against the WebGPU peers, on the same adapter, in one run.

    .venv/bin/python bench/webgpu.py --kuma KUMA_DIR            # every model, every system
    .venv/bin/python bench/webgpu.py --quick --kuma KUMA_DIR    # a short run (fewer calls)
    .venv/bin/python bench/webgpu.py --models simple32,mobilenet_v3_small --systems chroma,kuma

Systems:
  chroma       Chroma's package (`chroma.compile(..., target="webgpu")`) through its JS runtime
               (web/dist) in headless Chromium
  chroma-dawn  the same package and runtime in Node on Dawn (npm `webgpu`), SwiftShader's
               Vulkan driver (VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json)
  ort-webgpu   ONNX Runtime Web 1.30 (npm `onnxruntime-web`), WebGPU EP, in the same Chromium;
               the model exported with torch.onnx.export(..., dynamo=True)
  ort-wasm     the same, WASM EP (one thread unless --wasm-threads)
  kuma         Kuma (github.com/Slater-Victoroff/Kuma): its compiler (the checkout's src/kuma,
               run by this venv's Python on the same PyTorch model) and its runtime
               (kuma-bart/dist, `npm ci && npm run build` in the checkout), in the same
               Chromium. Pass the checkout with --kuma DIR (or $KUMA_DIR); without it Kuma
               is "not available". Kuma's code is never copied into this repository.

Models (`--models`): simple32 / simple512 (Kuma's `simple` example: conv 3->16, GELU,
conv 16->3, residual; 1x3x32x32 and 1x3x512x512; rewritten here, seeded weights),
mobilenet_v3_small (torchvision, random weights, 1x3x224x224; chroma.models.vision) and
gpt_oss (the reference model, chroma.models.gpt_oss.build(), 8 tokens). Every system runs
the same weights and inputs; its first output is compared with eager PyTorch's.

Protocol: the models are prepared first (eager output, ONNX export, Kuma and Chroma packages:
one worker process per model). Then every (model, system) runs in its own process (a fresh
Chromium with a fresh profile, so no shader cache carries over; or a fresh Node): fetch the
files, load (timed), a first call (the warm-up of systems that build pipelines lazily),
warm-up calls, then timed calls in two rounds of two modes:
  GPU-only   the work submitted, then queue.onSubmittedWorkDone(); outputs stay on the GPU
             (Chroma: the runtime's own pipelines and bind groups replayed without the
             staging copy; Kuma: runToGpu(); ORT: preferredOutputLocation "gpu-buffer")
  readback   the outputs in a typed array (Chroma run(), Kuma run(), ORT getData())
The figure is the median. `--calls` calls per mode, fewer when a call is slow (about
`--budget-s` seconds per mode; at least 3, 2 above 5 s per call, 1 above 20 s). Chroma in
Chromium also runs each dispatch alone once (its own submit): where a call's time goes. Counts (dispatches,
passes, submits, pipelines, bind groups, bytes of live GPU buffers) come from wrapping
WebGPU's prototypes in the page (bench/webgpu/harness.mjs), the same for every system.

SwiftShader is a CPU rasterizer: these figures compare implementations on the same adapter
(and the same 2 shared CPU cores), not GPUs.

The JSON report (`--json`, default bench/results/webgpu.json) keeps the environment and every
sample; a table and the targets (met / not met) are printed.

Set-up: `.venv/bin/python -m pip install -r bench/requirements.txt -c requirements.txt`
(onnx, onnxscript), `npm ci` in bench/webgpu/ (onnxruntime-web, playwright-core, webgpu),
`npm ci && npm run build` in web/, `apt-get install -y chromium`.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NODE_DIR = os.path.join(HERE, "webgpu")
sys.path.insert(0, os.path.join(ROOT, "python"))

MODELS = ["simple32", "simple512", "mobilenet_v3_small", "gpt_oss"]
SYSTEMS = ["chroma", "chroma-dawn", "ort-webgpu", "ort-wasm", "kuma"]
LABELS = {"chroma": "Chroma (Chromium)", "chroma-dawn": "Chroma (Node/Dawn)", "ort-webgpu": "ORT Web WebGPU",
          "ort-wasm": "ORT Web WASM", "kuma": "Kuma (Chromium)"}
SWIFTSHADER_ICD = "/usr/lib/chromium/vk_swiftshader_icd.json"
CHROMIUM = "/usr/bin/chromium"


def log(msg=""):
    print(msg, flush=True)


# ----------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------

def simple_model(seed: int = 0):
    """Kuma's `simple` example (examples/simple.py in its repository), rewritten:
    x -> Conv2d(3, 16, 3x3, padding 1) -> GELU (exact) -> Conv2d(16, 3, 3x3, padding 1) -> + x.
    PyTorch's default initialisation under a fixed seed."""
    import torch
    from torch import nn

    class SimpleConv(nn.Module):
        def __init__(self, channels: int = 3, hidden: int = 16):
            super().__init__()
            self.conv1 = nn.Conv2d(channels, hidden, kernel_size=3, padding=1, bias=True)
            self.conv2 = nn.Conv2d(hidden, channels, kernel_size=3, padding=1, bias=True)
            self.act = nn.GELU()

        def forward(self, x):
            return self.conv2(self.act(self.conv1(x))) + x

    torch.manual_seed(seed)
    return SimpleConv().eval()


def build_model(name):
    """name -> (module, example inputs tuple)."""
    import torch

    if name in ("simple32", "simple512"):
        hw = int(name[len("simple"):])
        g = torch.Generator().manual_seed(1)
        return simple_model(), (torch.randn(1, 3, hw, hw, generator=g),)
    if name == "mobilenet_v3_small":
        from chroma.models import vision

        return vision.build(name), (vision.example_input(name),)
    if name == "gpt_oss":
        from chroma.models import gpt_oss

        model = gpt_oss.build().eval()
        return model, (gpt_oss.sample_tokens(model.cfg, 8),)
    raise KeyError(f"unknown model {name!r} (known: {', '.join(MODELS)})")


# ----------------------------------------------------------------------------------------
# The preparation worker: one model -> eager output, ONNX file, Kuma package, Chroma package
# ----------------------------------------------------------------------------------------

def _digest(model):
    h = hashlib.sha256()
    sd = model.state_dict()
    for k in sorted(sd):
        t = sd[k].detach().contiguous().cpu()
        h.update(k.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(memoryview(t.numpy()).cast("B"))
    return h.hexdigest()


def _err(e):
    return f"{type(e).__name__}: {e}"[:3000]


def prepare_worker(spec):
    """Runs in its own process. The Chroma compile comes last: it returns a program on the
    `wgpu` package, which loads a Vulkan driver into the process."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    name, work = spec["model"], spec["work"]
    os.makedirs(work, exist_ok=True)
    res = {"model": name}
    t0 = time.perf_counter()
    model, inputs = build_model(name)
    res["build_s"] = round(time.perf_counter() - t0, 2)
    res["parameters"] = int(sum(p.numel() for p in model.parameters()))
    res["weight_digest"] = _digest(model)
    x = inputs[0]
    with torch.inference_mode():
        y = model(*inputs)
    if isinstance(y, (tuple, list)):
        y = y[0]
    y = y.detach().float().contiguous()
    x.detach().contiguous().numpy().tofile(os.path.join(work, "input.bin"))
    y.numpy().astype(np.float32).tofile(os.path.join(work, "ref.bin"))
    res["input"] = {"dtype": str(x.dtype).replace("torch.", ""), "shape": list(x.shape)}
    res["output"] = {"dtype": "float32", "shape": list(y.shape)}
    res["ref_max_abs"] = float(y.abs().max())

    if spec.get("onnx"):
        onnx_path = os.path.join(work, "model.onnx")
        t0 = time.perf_counter()
        try:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                prog = torch.onnx.export(model, inputs, dynamo=True, verbose=False)
            prog.save(onnx_path, external_data=False)
            res["onnx"] = {"path": onnx_path, "bytes": os.path.getsize(onnx_path),
                           "export_s": round(time.perf_counter() - t0, 2)}
        except Exception as e:  # noqa: BLE001
            res["onnx"] = {"error": _err(e), "traceback": traceback.format_exc()[-3000:]}

    if spec.get("kuma"):
        iph = os.path.join(work, "model.iph")
        t0 = time.perf_counter()
        try:
            sys.path.insert(0, os.path.join(spec["kuma"], "src"))
            import kuma
            from kuma.export import export_program  # Kuma's checks (float32 inputs), then torch.export

            ep = export_program(model, inputs)
            pkg = kuma.compile(ep, inputs)
            pkg.save(iph)
            res["kuma"] = {"path": iph, "bytes": os.path.getsize(iph), "compile_s": round(time.perf_counter() - t0, 2),
                           "weight_bytes": len(pkg.weights_blob),
                           "graph_nodes": len(pkg.manifest.get("graph", {}).get("nodes", [])),
                           "warnings": pkg.manifest.get("warnings", [])[:20],
                           "unsupported_ops": kuma_unsupported(spec["kuma"], pkg.manifest)}
        except Exception as e:  # noqa: BLE001
            res["kuma"] = {"error": _err(e), "traceback": traceback.format_exc()[-3000:]}

    if spec.get("chroma"):
        import chroma

        out = os.path.join(work, "chroma", "m")
        t0 = time.perf_counter()
        try:
            prog = chroma.compile(model, inputs, target="webgpu", out=out)
            path = out + ".chroma-web"
            stats = dict(prog.stats)
            manifest = read_manifest(path)
            res["chroma"] = {"path": path, "bytes": os.path.getsize(path), "compile_s": round(time.perf_counter() - t0, 2),
                             "stats": stats, "package": _package_summary(path, manifest)}
            try:
                prog.close()
            except Exception:  # noqa: BLE001
                pass
        except Exception as e:  # noqa: BLE001
            res["chroma"] = {"error": _err(e), "traceback": traceback.format_exc()[-3000:]}
    return res


def read_manifest(path):
    """The manifest of a .chroma-web file (docs/webgpu_package.md: u64 offset at 16, u64 size at 24)."""
    import struct

    with open(path, "rb") as f:
        head = f.read(96)
        if head[:8] != b"CHROMAWB":
            raise ValueError(f"{path} is not a .chroma-web package")
        off, size = struct.unpack_from("<QQ", head, 16)
        f.seek(off)
        return json.loads(f.read(size).rstrip(b"\0").decode())


def kuma_unsupported(kuma_dir, manifest):
    """The ops of a Kuma package that its runtime has no handler for (kuma-bart/src/ops/index.ts's
    opRegistry), with their counts: Kuma's runtime stops at the first."""
    import re

    try:
        with open(os.path.join(kuma_dir, "kuma-bart", "src", "ops", "index.ts")) as f:
            known = set(re.findall(r'\[\s*"([^"]+)"\s*,', f.read()))
    except OSError:
        return None
    counts = {}

    def walk(nodes):
        for n in nodes:
            if n.get("op") == "call_function" and n.get("target") not in known:
                counts[n["target"]] = counts.get(n["target"], 0) + 1
            for br in n.get("branches") or []:
                walk(br.get("nodes", []))

    walk(manifest.get("graph", {}).get("nodes", []))
    return counts


def _package_summary(path, manifest):
    """What the package holds: sizes of its sections and the GPU buffers a runtime creates."""
    m = manifest
    golden = sum(t.get("bytes", 0) for t in m["golden"]["inputs"] + m["golden"]["outputs"])
    wgsl = sum(len(k["code"].encode()) for k in m["kernels"])
    weights = sum(s["bytes"] for s in m["weights"]["shards"])
    size = os.path.getsize(path)
    status = 256
    staging = status + sum(o["bytes"] for o in m["outputs"])
    gpu = {"arena": m["arena"]["bytes"], "state": m["state"]["bytes"], "weights": weights, "params": m["params"]["bytes"],
           "staging": staging}
    gpu["total"] = sum(gpu.values())
    return {"file_bytes": size, "weight_shard_bytes": weights, "golden_bytes": golden, "wgsl_bytes": wgsl,
            "params_bytes": m["params"]["bytes"], "kernels": len(m["kernels"]), "dispatches": len(m["dispatches"]),
            "gpu_buffers": gpu, "limits": m["requirements"]["limits"], "features": m["requirements"]["features"],
            "dispatch_labels": _label_counts(m)}


def _label_counts(m):
    counts = {}
    for d in m["dispatches"]:
        k = m["kernels"][d["kernel"]]["name"]
        counts[k] = counts.get(k, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:40])


# ----------------------------------------------------------------------------------------
# Running the systems
# ----------------------------------------------------------------------------------------

def _kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_node(script, task, work, timeout, env=None):
    """node bench/webgpu/<script> TASK RESULT in its own process group (Chromium dies with it)."""
    tag = f"{task['model']}-{task['system']}"
    tpath = os.path.join(work, f"task-{tag}.json")
    rpath = os.path.join(work, f"result-{tag}.json")
    if os.path.exists(rpath):
        os.remove(rpath)
    with open(tpath, "w") as f:
        json.dump(task, f)
    t0 = time.perf_counter()
    p = subprocess.Popen(["node", os.path.join(NODE_DIR, script), tpath, rpath], cwd=NODE_DIR, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(p)
        out, err = p.communicate()
        res = {"system": task["system"], "model": task["model"], "ok": False,
               "error": f"timed out after {timeout:.0f} s", "stderr": (err or "")[-2000:]}
    else:
        _kill_group(p)  # Chromium's helpers, if any outlived it
        if os.path.exists(rpath):
            with open(rpath) as f:
                res = json.load(f)
        else:
            res = {"system": task["system"], "model": task["model"], "ok": False,
                   "error": f"node exited with {p.returncode} and no result", "stderr": (err or "")[-3000:]}
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    return res


def _median(xs):
    return statistics.median(xs) if xs else None


def summarize_run(res, prep):
    """The figures of one (model, system) result."""
    s = {"ok": bool(res.get("ok")), "error": res.get("error")}
    if not res.get("ok"):
        return s
    samples = res.get("samples", {})
    s["gpu_only_ms"] = _median(samples.get("gpuOnly", []))
    s["readback_ms"] = _median(samples.get("readback", []))
    s["calls"] = {k: len(v) for k, v in samples.items()}
    s["first_call_ms"] = res.get("firstCallMs")
    s["load_ms"] = res.get("load", {}).get("wallMs")
    s["fetch_ms"] = res.get("fetchMs")
    steady = s["readback_ms"]
    system = res["system"]
    pc = res.get("perCall") or {}
    if system in ("chroma", "chroma-dawn"):
        s["warmup_ms"] = res["load"]["warmupMs"]  # every pipeline, created at load
        s["warmup_what"] = "pipeline creation at load"
        s["dispatches"] = res["info"]["dispatches"]
        s["pipelines"] = res["info"]["pipelines"]
    else:
        # Pipelines created lazily by the first call: its cost above a steady call.
        s["warmup_ms"] = (res["firstCallMs"] - steady) if steady is not None else None
        s["warmup_what"] = "first call - steady call"
        if system == "ort-wasm":
            s["dispatches"] = None
            s["pipelines"] = None
        else:
            s["dispatches"] = (pc.get("dispatches", 0) + pc.get("indirectDispatches", 0))
            s["pipelines"] = res.get("memory", {}).get("totals", {}).get("pipelines")
    s["submits_per_call"] = pc.get("submits")
    s["map_reads_per_call"] = pc.get("mapReads")
    s["passes_per_call"] = pc.get("passes")
    s["bind_groups_per_call"] = pc.get("bindGroups")
    s["buffers_per_call"] = pc.get("buffers")
    s["measured_peak_gpu_bytes"] = res.get("memory", {}).get("peakBytes")
    fl = res.get("floor") or {}
    s["sync_floor_ms"] = fl.get("submitDoneMs")
    s["map_floor_ms"] = fl.get("mapReadMs")
    chk = res.get("check") or {}
    s["max_abs_err"] = chk.get("maxAbsError")
    s["check_note"] = chk.get("note")
    s["trivial_dispatch_ms"] = fl.get("trivialDispatchMs")
    if system in ("chroma", "chroma-dawn"):
        s["self_check"] = res.get("selfCheck")
        s["gpu_buffer_bytes"] = res["info"]["bufferBytes"]
        if res.get("dispatchMs") and prep.get("chroma", {}).get("path"):
            manifest = read_manifest(prep["chroma"]["path"])
            s["profile"] = dispatch_profile(res["dispatchMs"], manifest)
            if res.get("pipelineMs"):
                ks = manifest["kernels"]
                rows = sorted(({"kernel": ks[i]["name"], "ms": round(t, 1), "wgsl_bytes": len(ks[i]["code"].encode())}
                               for i, t in enumerate(res["pipelineMs"])), key=lambda r: -r["ms"])
                s["pipeline_compile"] = {"sum_ms": round(sum(res["pipelineMs"]), 1), "slowest": rows[:10]}
    return s


def dispatch_profile(ms, manifest):
    """Each dispatch run alone (harness.mjs chromaProfile): the slowest dispatches and the time by kernel."""
    rows = []
    for i, (d, t) in enumerate(zip(manifest["dispatches"], ms)):
        k = manifest["kernels"][d["kernel"]]
        rows.append({"index": i, "ms": round(t, 3), "kernel": k["name"], "label": d.get("label"), "node": d.get("node"),
                     "source": d.get("source"), "grid": d["grid"], "workgroup_size": k.get("workgroup_size")})
    by_kernel = {}
    for r in rows:
        e = by_kernel.setdefault(r["kernel"], {"kernel": r["kernel"], "dispatches": 0, "ms": 0.0})
        e["dispatches"] += 1
        e["ms"] = round(e["ms"] + r["ms"], 3)
    return {"sum_ms": round(sum(ms), 2), "slowest": sorted(rows, key=lambda r: -r["ms"])[:10],
            "by_kernel": sorted(by_kernel.values(), key=lambda e: -e["ms"])[:15], "all_ms": [round(t, 3) for t in ms]}


# ----------------------------------------------------------------------------------------
# Environment
# ----------------------------------------------------------------------------------------

def _cmd(args, cwd=None):
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=cwd).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


def _npm_version(pkg_dir):
    try:
        with open(os.path.join(pkg_dir, "package.json")) as f:
            return json.load(f)["version"]
    except Exception:  # noqa: BLE001
        return None


def environment(kuma):
    import importlib.metadata as md

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
           "loadavg": os.getloadavg(), "node": _cmd(["node", "--version"]), "chromium": _cmd([CHROMIUM, "--version"]),
           "swiftshader_icd": SWIFTSHADER_ICD, "chroma_git": _cmd(["git", "describe", "--always", "--dirty"], cwd=ROOT),
           "cpu_model": None}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    env["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    for dist in ("torch", "torchvision", "onnx", "onnxscript", "wgpu", "numpy"):
        try:
            env[dist] = md.version(dist)
        except Exception:  # noqa: BLE001
            env[dist] = None
    nm = os.path.join(NODE_DIR, "node_modules")
    env["npm"] = {p: _npm_version(os.path.join(nm, p)) for p in ("onnxruntime-web", "playwright-core", "webgpu")}
    if kuma:
        env["kuma"] = {"dir": kuma, "commit": _cmd(["git", "rev-parse", "HEAD"], cwd=kuma),
                       "runtime": _npm_version(os.path.join(kuma, "kuma-bart"))}
    return env


# ----------------------------------------------------------------------------------------
# Table and targets
# ----------------------------------------------------------------------------------------

def _fmt_ms(v):
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 1000 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _fmt_warm(v):
    return "<0" if v is not None and v < 0 else _fmt_ms(v)  # first call faster than the median: noise


def _fmt_n(v):
    return "-" if v is None else str(v)


def _fmt_bytes(v):
    if v is None:
        return "-"
    for unit, d in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if v >= d:
            return f"{v / d:.1f} {unit}"
    return f"{v} B"


def table(report):
    lines = []
    head = (f"{'model':20s} {'system':20s} {'GPU-only':>9s} {'readback':>9s} {'load':>8s} {'warm-up':>8s} "
            f"{'first':>8s} {'disp':>6s} {'pipes':>6s} {'subm':>5s} {'maps':>5s} {'peak GPU':>9s} {'max err':>8s} {'floor':>6s}")
    lines += ["ms per call (median); load, warm-up and first call in ms; disp, subm, maps (buffers mapped for reading):",
              "per call; pipes: pipelines created in all; peak GPU: the most bytes of live GPU buffers; floor: an empty",
              "submit + onSubmittedWorkDone (the implementation's fixed wait). Warm-up: Chroma's pipeline creation at load;",
              "the others create pipelines in their first call: first call - steady call.",
              head, "-" * len(head)]
    for m in report["models"]:
        for sysname in report["systems"]:
            r = m["systems"].get(sysname)
            if r is None:
                continue
            label = LABELS[sysname]
            if not r.get("ok"):
                why = r.get("status") or "failed"
                err = (r.get("error") or "").strip().splitlines()
                lines.append(f"{m['model']:20s} {label:20s} {why}: {(err[0] if err else '')[:110]}")
                continue
            disp = "n/a" if r.get("dispatches") is None else str(r["dispatches"])
            pipes = "n/a" if r.get("pipelines") is None else str(r["pipelines"])
            err = "-" if r.get("max_abs_err") is None else f"{r['max_abs_err']:.1e}"
            lines.append(f"{m['model']:20s} {label:20s} {_fmt_ms(r.get('gpu_only_ms')):>9s} {_fmt_ms(r.get('readback_ms')):>9s} "
                         f"{_fmt_ms(r.get('load_ms')):>8s} {_fmt_warm(r.get('warmup_ms')):>8s} {_fmt_ms(r.get('first_call_ms')):>8s} "
                         f"{disp:>6s} {pipes:>6s} {_fmt_n(r.get('submits_per_call')):>5s} {_fmt_n(r.get('map_reads_per_call')):>5s} "
                         f"{_fmt_bytes(r.get('measured_peak_gpu_bytes')):>9s} {err:>8s} {_fmt_ms(r.get('sync_floor_ms')):>6s}")
    lines += ["", "Files and GPU memory. Chroma's package, from its manifest: GPU bufs = GPU arena + weights + params + staging",
              "(what the runtime allocates); the GPU arena holds the status block, inputs, outputs and the planned temporaries",
              "(plan: stats.arena_bytes), against temps: the sum of every temporary's bytes (stats.temporaries_bytes);",
              "no golden: (file - golden inputs and outputs) / weights. Peers' files: the ONNX model, Kuma's .iph."]
    head = (f"{'model':20s} {'file':>9s} {'weights':>9s} {'file/w':>8s} {'no golden':>9s} {'WGSL':>8s} {'GPU bufs':>9s} "
            f"{'GPU arena':>9s} {'plan':>9s} {'temps':>9s} {'kern':>5s} {'disp':>5s} {'compile':>8s} {'ONNX file':>9s} {'Kuma file':>9s}")
    lines += [head, "-" * len(head)]
    for m in report["models"]:
        prep = m.get("prep", {})
        c = prep.get("chroma") or {}
        peers = []
        for k in ("onnx", "kuma"):
            v = prep.get(k) or {}
            peers.append(_fmt_bytes(v["bytes"]) if "bytes" in v else ("failed" if "error" in v else "-"))
        if "stats" not in c:
            lines.append(f"{m['model']:20s} Chroma failed: {(c.get('error') or prep.get('failed') or 'not built')[:100]}"
                         f" {peers[0]:>9s} {peers[1]:>9s}")
            continue
        st, pk = c["stats"], c["package"]
        w = st["weight_bytes"]
        ratio = f"{pk['file_bytes'] / w:8.3f}" if w else f"{'-':>8s}"
        nog = f"{(pk['file_bytes'] - pk['golden_bytes']) / w:9.3f}" if w else f"{'-':>9s}"
        lines.append(f"{m['model']:20s} {_fmt_bytes(pk['file_bytes']):>9s} {_fmt_bytes(w):>9s} {ratio} {nog} "
                     f"{_fmt_bytes(pk['wgsl_bytes']):>8s} {_fmt_bytes(pk['gpu_buffers']['total']):>9s} "
                     f"{_fmt_bytes(st.get('device_arena_bytes')):>9s} {_fmt_bytes(st.get('arena_bytes')):>9s} "
                     f"{_fmt_bytes(st.get('temporaries_bytes')):>9s} "
                     f"{st['kernels']:>5d} {st['dispatches']:>5d} {c['compile_s']:>7.1f}s {peers[0]:>9s} {peers[1]:>9s}")
    prof = []
    for m in report["models"]:
        r = m["systems"].get("chroma") or {}
        p = r.get("profile")
        if not p:
            continue
        top = "; ".join(f"#{x['index']} {x['kernel']} ({x['label']}, grid {'x'.join(map(str, x['grid']))}) {_fmt_ms(x['ms'])} ms"
                        for x in p["slowest"][:3])
        prof.append(f"{m['model']:20s} sum {_fmt_ms(p['sum_ms'])} ms over {len(p['all_ms'])} dispatches "
                    f"(trivial dispatch {_fmt_ms(r.get('trivial_dispatch_ms'))} ms); slowest: {top}")
        pc = r.get("pipeline_compile")
        if pc:
            top = "; ".join(f"{x['kernel']} {_fmt_ms(x['ms'])} ms" for x in pc["slowest"][:3])
            prof.append(f"{'':20s} pipelines one at a time: {_fmt_ms(pc['sum_ms'])} ms (at load, in parallel: "
                        f"{_fmt_ms(r.get('warmup_ms'))} ms); slowest: {top}")
    if prof:
        lines += ["", "Chroma in Chromium, each dispatch submitted alone (where a call's time goes), and each pipeline",
                  "created alone (where the warm-up goes):"] + prof
    return "\n".join(lines)


def targets(report):
    out = []
    if "chroma" not in report["systems"]:
        return [("every target compares Chroma in Chromium", None, "Chroma (Chromium) not run")]
    models = report["models"]
    by = {m["model"]: m["systems"] for m in models}
    have_kuma = "kuma" in report["systems"] and report.get("kuma_available")

    # Fewer dispatches than Kuma on every model.
    vals, ok = [], True
    for name, sy in by.items():
        c, k = sy.get("chroma") or {}, sy.get("kuma") or {}
        if not have_kuma:
            break
        if c.get("ok") and k.get("ok") and k.get("dispatches") is not None:
            good = c["dispatches"] < k["dispatches"]
            ok &= good
            vals.append(f"{name} {c['dispatches']} vs {k['dispatches']}")
        elif c.get("ok") and not k.get("ok"):
            vals.append(f"{name} {c['dispatches']} vs Kuma failed")
        else:
            ok = False
            vals.append(f"{name}: Chroma failed")
    out.append(("fewer dispatches than Kuma on every model", ok if have_kuma and vals else None,
                "; ".join(vals) if have_kuma else "Kuma not available"))

    # Faster than Kuma and ORT WebGPU on every model both run (GPU-only and with readback).
    for peer in ("kuma", "ort-webgpu"):
        vals, ok, any_ = [], True, False
        for name, sy in by.items():
            c, p = sy.get("chroma") or {}, sy.get(peer) or {}
            if not (c.get("ok") and p.get("ok")):
                if not c.get("ok") and p.get("ok"):
                    ok = False
                    vals.append(f"{name}: Chroma failed")
                continue
            any_ = True
            parts = []
            for mode in ("gpu_only_ms", "readback_ms"):
                if c.get(mode) and p.get(mode):
                    ratio = p[mode] / c[mode]
                    ok &= ratio > 1
                    parts.append(f"{'GPU-only' if mode == 'gpu_only_ms' else 'readback'} {ratio:.2f}x")
            vals.append(f"{name} " + ", ".join(parts))
        label = LABELS[peer]
        avail = peer in report["systems"] and (peer != "kuma" or report.get("kuma_available"))
        out.append((f"faster than {label} on every model both run (peer ms / Chroma ms)",
                    ok if any_ else None, "; ".join(vals) if avail else f"{label} not run"))

    # Package size within 1.05x of the weight bytes.
    vals, ok, any_ = [], True, False
    for m in models:
        c = m.get("prep", {}).get("chroma") or {}
        if "stats" not in c:
            continue
        any_ = True
        r = c["package"]["file_bytes"] / c["stats"]["weight_bytes"]
        ok &= r <= 1.05
        ng = (c["package"]["file_bytes"] - c["package"]["golden_bytes"]) / c["stats"]["weight_bytes"]
        vals.append(f"{m['model']} {r:.3f}x ({ng:.3f}x without the golden data)")
    out.append(("package size within 1.05x of the weight bytes", ok if any_ else None, "; ".join(vals)))

    # Warm-up under 2 s for the reference model on SwiftShader.
    g = by.get("gpt_oss", {})
    vals, ok, any_ = [], True, False
    for sysname in ("chroma", "chroma-dawn"):
        r = g.get(sysname) or {}
        if r.get("ok"):
            any_ = True
            ok &= r["warmup_ms"] < 2000
            vals.append(f"{LABELS[sysname]} {r['warmup_ms']:.0f} ms")
        elif r:
            ok = False
            any_ = True
            vals.append(f"{LABELS[sysname]} failed")
    out.append(("warm-up (every pipeline) under 2 s for the reference model on SwiftShader", ok if any_ else None,
                "; ".join(vals) if vals else "gpt_oss not run"))
    return out


# ----------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------

def check_setup(systems, kuma):
    """Returns {system: reason} for the systems that cannot run here."""
    missing = {}
    nm = os.path.join(NODE_DIR, "node_modules")
    if shutil.which("node") is None:
        return {s: "node is not installed" for s in systems}
    if not os.path.exists(os.path.join(ROOT, "web", "dist", "index.js")):
        for s in ("chroma", "chroma-dawn"):
            missing[s] = "web/dist is not built (npm ci && npm run build in web/)"
    if not os.path.exists(CHROMIUM):
        for s in ("chroma", "ort-webgpu", "ort-wasm", "kuma"):
            missing.setdefault(s, f"{CHROMIUM} is missing (apt-get install -y chromium)")
    for pkg, users in (("playwright-core", ("chroma", "ort-webgpu", "ort-wasm", "kuma")), ("webgpu", ("chroma-dawn",)),
                       ("onnxruntime-web", ("ort-webgpu", "ort-wasm"))):
        if not os.path.exists(os.path.join(nm, pkg)):
            for s in users:
                missing.setdefault(s, f"bench/webgpu/node_modules/{pkg} is missing (npm ci in bench/webgpu)")
    import importlib.util

    if importlib.util.find_spec("onnxscript") is None or importlib.util.find_spec("onnx") is None:
        for s in ("ort-webgpu", "ort-wasm"):
            missing.setdefault(s, "onnx/onnxscript are not installed (pip install -r bench/requirements.txt)")
    if not kuma:
        missing.setdefault("kuma", "no Kuma checkout (--kuma DIR or $KUMA_DIR)")
    else:
        for p in (os.path.join(kuma, "src", "kuma", "__init__.py"), os.path.join(kuma, "kuma-bart", "dist", "index.js"),
                  os.path.join(kuma, "kuma-bart", "node_modules", "fflate", "esm", "browser.js")):
            if not os.path.exists(p):
                missing.setdefault("kuma", f"{p} is missing (npm ci && npm run build in the checkout's kuma-bart/)")
    return {s: r for s, r in missing.items() if s in systems}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", help=f"comma-separated, from {','.join(MODELS)} (default: all)")
    ap.add_argument("--systems", help=f"comma-separated, from {','.join(SYSTEMS)} (default: all)")
    ap.add_argument("--kuma", default=os.environ.get("KUMA_DIR"), help="a Kuma checkout (built kuma-bart/dist)")
    ap.add_argument("--quick", action="store_true", help="fewer calls (5 per mode, 1 warm-up, 4 s per mode)")
    ap.add_argument("--calls", type=int, help="timed calls per mode (default 20, --quick 5)")
    ap.add_argument("--warmup", type=int, help="warm-up calls (default 3, --quick 1)")
    ap.add_argument("--budget-s", type=float, help="seconds of timed calls per mode before the count is cut (default 10, --quick 4)")
    ap.add_argument("--wasm-threads", type=int, default=1, help="ONNX Runtime Web WASM threads (default 1)")
    ap.add_argument("--timeout", type=float, default=420, help="seconds per (model, system) before it is killed")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench-webgpu"), help="artifacts (git-ignored)")
    ap.add_argument("--reuse", action="store_true", help="reuse the prepared artifacts of an earlier run when present")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "webgpu.json"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.worker:
        with open(a.worker) as f:
            spec = json.load(f)
        try:
            res = prepare_worker(spec)
        except Exception as e:  # noqa: BLE001
            res = {"model": spec["model"], "failed": _err(e), "traceback": traceback.format_exc()[-4000:]}
        with open(spec["result"], "w") as f:
            json.dump(res, f)
        return 0

    models = [m for m in (a.models.split(",") if a.models else MODELS) if m]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m} (known: {', '.join(MODELS)})")
    systems = [s for s in (a.systems.split(",") if a.systems else SYSTEMS) if s]
    for s in systems:
        if s not in SYSTEMS:
            ap.error(f"unknown system {s} (known: {', '.join(SYSTEMS)})")
    kuma = os.path.abspath(a.kuma) if a.kuma else None
    if kuma and not os.path.isdir(kuma):
        kuma = None
    calls = a.calls or (5 if a.quick else 20)
    warmup = a.warmup if a.warmup is not None else (1 if a.quick else 3)
    budget_s = a.budget_s or (4.0 if a.quick else 10.0)

    unavailable = check_setup(systems, kuma)
    report = {"environment": environment(kuma), "systems": systems, "models": [], "kuma_available": "kuma" not in unavailable,
              "protocol": {"calls": calls, "warmup": warmup, "budget_s_per_mode": budget_s, "rounds": 2, "quick": a.quick,
                           "wasm_threads": a.wasm_threads, "chromium_args": "see bench/webgpu/browser.mjs",
                           "note": "SwiftShader is a CPU rasterizer: the figures compare implementations on the same "
                                   "adapter and CPU, not GPUs"}}
    for s, why in unavailable.items():
        log(f"{LABELS[s]}: {why}")
    log(f"models: {', '.join(models)}; systems: {', '.join(systems)}; {calls} calls per mode, {warmup} warm-up")
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    t_start = time.perf_counter()

    def save():
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)

    for name in models:
        work = os.path.join(a.work, name)
        os.makedirs(work, exist_ok=True)
        entry = {"model": name, "systems": {}}
        report["models"].append(entry)
        # Prepare.
        spec = {"model": name, "work": work, "result": os.path.join(work, "prep.json"),
                "onnx": any(s.startswith("ort") and s not in unavailable for s in systems),
                "kuma": kuma if "kuma" in systems and "kuma" not in unavailable else None,
                "chroma": any(s.startswith("chroma") and s not in unavailable for s in systems)}
        prep = None
        if a.reuse and os.path.exists(spec["result"]):
            with open(spec["result"]) as f:
                prep = json.load(f)
            if "failed" in prep or any(spec[k] and k not in prep for k in ("onnx", "kuma", "chroma")):
                prep = None
        if prep is None:
            with open(os.path.join(work, "prep-spec.json"), "w") as f:
                json.dump(spec, f)
            t0 = time.perf_counter()
            env = dict(os.environ, VK_ICD_FILENAMES=SWIFTSHADER_ICD, OMP_NUM_THREADS="1")
            try:
                p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", os.path.join(work, "prep-spec.json")],
                                   capture_output=True, text=True, timeout=1800, env=env)
                if os.path.exists(spec["result"]) and p.returncode == 0:
                    with open(spec["result"]) as f:
                        prep = json.load(f)
                else:
                    prep = {"model": name, "failed": f"preparation worker exited with {p.returncode}", "stderr": p.stderr[-3000:]}
            except subprocess.TimeoutExpired:
                prep = {"model": name, "failed": "preparation timed out after 1800 s"}
            prep["prep_s"] = round(time.perf_counter() - t0, 1)
        entry["prep"] = prep
        brief = []
        for k in ("onnx", "kuma", "chroma"):
            v = prep.get(k)
            if v:
                brief.append(f"{k} " + ("failed" if "error" in v else _fmt_bytes(v.get("bytes"))))
        log(f"[{name}] prepared in {prep.get('prep_s', 0)} s: {prep.get('failed') or ', '.join(brief)}")
        save()
        if "failed" in prep:
            for s in systems:
                entry["systems"][s] = {"ok": False, "status": "failed", "error": prep["failed"]}
            continue

        for sysname in systems:
            if sysname in unavailable:
                entry["systems"][sysname] = {"ok": False, "status": "not available", "error": unavailable[sysname]}
                continue
            need = {"chroma": "chroma", "chroma-dawn": "chroma", "ort-webgpu": "onnx", "ort-wasm": "onnx", "kuma": "kuma"}[sysname]
            art = prep.get(need) or {}
            if "error" in art:
                entry["systems"][sysname] = {"ok": False, "status": "failed",
                                             "error": f"{'ONNX export' if need == 'onnx' else need + ' compile'}: {art['error']}"}
                log(f"  {LABELS[sysname]:20s} failed before running: {art['error'][:150]}")
                continue
            task = {"system": sysname, "model": name, "input": prep["input"], "output": prep["output"], "calls": calls,
                    "warmup": warmup, "budgetMs": budget_s * 1000, "rounds": 2, "wasmThreads": a.wasm_threads,
                    "profile": sysname == "chroma"}
            if sysname == "chroma-dawn":
                task["chromaWeb"] = os.path.join(ROOT, "web", "dist")
                task["paths"] = {"input": os.path.join(work, "input.bin"), "ref": os.path.join(work, "ref.bin"),
                                 "package": art["path"]}
                env = dict(os.environ, VK_ICD_FILENAMES=SWIFTSHADER_ICD)
                res = run_node("dawn.mjs", task, work, a.timeout, env=env)
            else:
                mounts = {"/harness/": NODE_DIR, "/files/": work, "/chroma-web/": os.path.join(ROOT, "web", "dist"),
                          "/ort/": os.path.join(NODE_DIR, "node_modules", "onnxruntime-web", "dist")}
                if kuma:
                    mounts["/kuma/"] = os.path.join(kuma, "kuma-bart", "dist")
                    mounts["/fflate/"] = os.path.join(kuma, "kuma-bart", "node_modules", "fflate")
                task["mounts"] = mounts
                task["chromium"] = CHROMIUM
                rel = lambda p: "/files/" + os.path.relpath(p, work)  # noqa: E731
                task["files"] = {"input": "/files/input.bin", "ref": "/files/ref.bin"}
                if sysname == "chroma":
                    task["files"]["package"] = rel(art["path"])
                elif sysname == "kuma":
                    task["files"]["kuma"] = rel(art["path"])
                else:
                    task["files"]["onnx"] = rel(art["path"])
                    task["ep"] = "webgpu" if sysname == "ort-webgpu" else "wasm"
                res = run_node("browser.mjs", task, work, a.timeout)
            summary = summarize_run(res, prep)
            summary["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]  # the machine is shared: noise
            if not res.get("ok"):
                summary["status"] = "failed"
                unsup = (prep.get("kuma") or {}).get("unsupported_ops") if sysname == "kuma" else None
                if unsup:
                    summary["unsupported_ops"] = unsup
                    summary["error"] = ("no kernel in kuma-bart for " + ", ".join(f"{k} ({v})" for k, v in unsup.items())
                                        + "; the runtime said: " + (summary.get("error") or ""))
            summary["wall_s"] = res.get("wall_s")
            summary["raw"] = res
            entry["systems"][sysname] = summary
            if summary["ok"]:
                log(f"  {LABELS[sysname]:20s} GPU-only {_fmt_ms(summary['gpu_only_ms'])} ms, readback {_fmt_ms(summary['readback_ms'])} ms, "
                    f"load {_fmt_ms(summary['load_ms'])} ms, first call {_fmt_ms(summary['first_call_ms'])} ms, "
                    f"dispatches {summary['dispatches']}, max err {summary['max_abs_err']} ({res['wall_s']} s)")
            else:
                log(f"  {LABELS[sysname]:20s} failed: {(summary.get('error') or '')[:400]} ({res.get('wall_s')} s)")
            save()

    report["wall_s"] = round(time.perf_counter() - t_start, 1)
    report["environment"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    text = table(report)
    log("")
    log(text)
    tg = targets(report)
    report["targets"] = [{"target": n, "met": ok, "value": v} for n, ok, v in tg]
    log("\nTargets:")
    for n, ok, v in tg:
        state = "n/a" if ok is None else ("met" if ok else "NOT met")
        log(f"  [{state}] {n}: {v}")
    log("\nSwiftShader is a CPU rasterizer: these figures compare implementations on the same adapter "
        "(and the same CPU cores), not GPUs.")
    save()
    log(f"\nreport: {a.json} ({report['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
