"""Reference-model benchmark: Chroma against its peers on the gpt-oss model (docs/models.md,
"Benchmark protocol").

    .venv/bin/python bench/gpt_oss.py [--quick] [--out bench/results/gpt_oss.json]

Protocol: one call runs 8 tokens in FP32 and returns all 8 rows of logits; identical weights
(chroma.models.gpt_oss.build(), seeded) and inputs on every side; medians pool two runs of
100 calls, each after 10 warm-ups (--quick: 2 runs of 10 after 2). Systems, with 1 and 2
threads, each in its own process (thread settings and peak memory isolated): Chroma, eager
PyTorch, torch.compile (Inductor), an AOTInductor package, ONNX Runtime. Outputs are checked
against eager (max abs error). The floor is the weight bytes one call must read divided by
this machine's DRAM read bandwidth (bench/membw.cpp, built and run here). Decode: a 256-row
cache, a 32-token prompt, 32 cached steps, against recomputing the 256-token window. The
prefill's floor is the larger of its bandwidth floor (the weights its 32 tokens read, as
above) and its compute floor (the operations it needs, prefill_flops(), at the best float32
product rate reached here on a 2048-cube by torch's BLAS or by Chroma's product library,
measured in the same run).

The JSON report holds the environment, the weight digest, Chroma's source digest, every
sample, the medians and the ratios; a summary table and the targets are printed.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)

REQUIREMENTS = os.path.join("bench", "requirements.txt")
INSTALL = f"{os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT) else sys.executable} -m pip install -r {REQUIREMENTS}"

SYSTEMS = ["chroma", "eager", "torch_compile", "aoti", "onnxruntime"]
LABELS = {"chroma": "Chroma", "eager": "PyTorch eager", "torch_compile": "torch.compile (Inductor)",
          "aoti": "AOTInductor", "onnxruntime": "ONNX Runtime"}
# Python packages each system needs beyond numpy (module name -> pip name).
NEEDS = {"chroma": {"torch": "torch"}, "eager": {"torch": "torch"}, "torch_compile": {"torch": "torch"},
         "aoti": {"torch": "torch"}, "onnxruntime": {"torch": "torch", "onnx": "onnx", "onnxruntime": "onnxruntime"}}
OPTIONAL = {"onnxscript": "onnxscript"}  # the dynamo ONNX exporter; the TorchScript exporter is the fallback

TARGETS_DOC = [
    ("8-token FP32, 1 thread: Chroma within 1.3x of the floor", "floor"),
    ("8-token FP32, 1 thread: Chroma >= 3x faster than eager PyTorch", "eager"),
    ("8-token FP32, 1 thread: Chroma >= 2x faster than ONNX Runtime", "onnxruntime"),
    ("8-token FP32, 1 thread: Chroma faster than torch.compile", "torch_compile"),
    ("8-token FP32, 1 thread: Chroma faster than AOTInductor", "aoti"),
    ("cached decode step, 1 thread: within 1.3x of its floor", "step_floor"),
    ("prefill (32 tokens), 1 thread: within 1.5x of the larger of its compute and bandwidth floors", "prefill_floor"),
    ("cached decode step, 1 thread: >= 10x faster than the uncached step", "uncached"),
]


def log(msg=""):
    print(msg, flush=True)


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _version(dist: str):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_message(pkgs) -> str:
    return (f"missing Python package{'s' if len(pkgs) > 1 else ''}: {', '.join(pkgs)}; install with:\n"
            f"    {INSTALL}")


# ----------------------------------------------------------------------------------------
# Environment, bandwidth, model facts
# ----------------------------------------------------------------------------------------

def _read(path):
    try:
        with open(path, "r", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def environment():
    cpu = None
    flags = ""
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name") and cpu is None:
            cpu = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            flags = line.split(":", 1)[1]
    cxx = shutil.which(os.environ.get("CXX", "g++")) or "g++"
    try:
        cxx_version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        cxx_version = None
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True).stdout.strip())
    except OSError:
        commit, dirty = None, None
    import chroma

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_model": cpu,
        "cpu_flags": sorted(f for f in flags.split() if f.startswith(("avx", "fma", "amx"))),
        "cores": os.cpu_count(),
        "cores_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "l3_cache": _read("/sys/devices/system/cpu/cpu0/cache/index3/size"),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "onnx": _version("onnx"),
        "onnxruntime": _version("onnxruntime"),
        "onnxscript": _version("onnxscript"),
        "chroma": getattr(chroma, "__version__", None),
        "compiler": cxx_version,
        "git_commit": commit,
        "git_dirty": dirty,
        "nice": os.nice(0),
        "loadavg_start": list(os.getloadavg()),
    }


def measure_bandwidth(work, threads, mib, passes):
    exe = os.path.join(work, "membw")
    src = os.path.join(HERE, "membw.cpp")
    cxx = os.environ.get("CXX", "g++")
    cmd = [cxx, "-O2", "-march=native", "-pthread", src, "-o", exe]
    subprocess.run(cmd, check=True)
    out = subprocess.run([exe, str(mib), str(passes)] + [str(t) for t in threads],
                         check=True, capture_output=True, text=True).stdout
    per = {}
    for line in out.splitlines():
        d = json.loads(line)
        per[str(d["threads"])] = d
    return {"program": "bench/membw.cpp", "build": " ".join(cmd[:4] + ["bench/membw.cpp"]), "buffer_mib": mib,
            "passes": passes, "threads": per}


def floor_bytes(model, tokens, selected):
    """Weight bytes one call reads: embedding rows of the distinct tokens, every attention
    weight, norm, gate and the unembedding, and the selected experts of each layer."""
    cfg = model.cfg
    parts = {"embedding": 0, "attention": 0, "norms": 0, "gates": 0, "experts": 0, "unembedding": 0}
    distinct_tokens = len(set(int(t) for t in tokens))
    for name, p in model.named_parameters():
        b = p.numel() * p.element_size()
        if name == "embedding.weight":
            parts["embedding"] += distinct_tokens * cfg.hidden_size * p.element_size()
        elif name == "unembedding.weight":
            parts["unembedding"] += b
        elif ".mlp.mlp" in name:
            layer = int(name.split(".")[1])
            parts["experts"] += b // cfg.num_experts * len(selected[layer])
        elif ".mlp.gate." in name:
            parts["gates"] += b
        elif name.endswith("norm.scale"):
            parts["norms"] += b
        elif ".attn." in name:
            parts["attention"] += b
        else:
            raise ValueError(f"floor: parameter {name} is not classified")
    return {"bytes": sum(parts.values()), "parts": parts, "distinct_tokens": distinct_tokens,
            "experts_read": sum(len(s) for s in selected)}


def prefill_flops(cfg, p):
    """Floating-point operations a p-token prefill needs: every linear layer on p rows (the
    selected experts only), causal attention (p(p+1)/2 query-key pairs per head, scores and
    the weighted sum), the unembedding of all p rows. Elementwise work is not counted."""
    hd, nq, nkv, h = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    per_layer = (p * h * hd * (nq + 2 * nkv) + p * hd * nq * h          # qkv and out projections
                 + 2 * nq * (p * (p + 1) // 2) * hd                     # q k^T and p v, causal
                 + p * h * cfg.num_experts                              # router
                 + p * cfg.experts_per_token * (h * 2 * cfg.intermediate_size + cfg.intermediate_size * h))
    return 2 * (cfg.num_layers * per_layer + p * h * cfg.vocab_size)


def measure_compute_peak(threads, n=2048, reps=5):
    """The best float32 product rate reached here on n x n x n, per thread count: torch's BLAS
    (MKL, which may not use every instruction set on a non-Intel CPU) and the product library
    Chroma links (oneDNN's sgemm, through a compiled one-product program), the faster counts."""
    import numpy as np
    import torch

    import chroma

    out = {}
    a, b = torch.randn(n, n), torch.randn(n, n)
    an, bn = a.numpy(), b.numpy()
    work = tempfile.mkdtemp(prefix="chroma-peak-")
    try:
        for t in threads:
            torch.set_num_threads(t)
            torch.mm(a, b)
            rates = {"torch": 2 * n ** 3 / min(_timed(lambda: torch.mm(a, b)) for _ in range(reps)) / 1e9}
            prog = chroma.compile(lambda x, y: x @ y, (a, b), out=os.path.join(work, f"mm{t}"), threads=t)
            y = np.empty((n, n), np.float32)
            prog(an, bn, out=y)
            rates["chroma"] = 2 * n ** 3 / min(_timed(lambda: prog(an, bn, out=y)) for _ in range(reps)) / 1e9
            out[str(t)] = {"gflops": max(rates.values()), "by_library": rates, "n": n, "reps": reps}
    finally:
        torch.set_num_threads(1)
        shutil.rmtree(work, ignore_errors=True)
    return out


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def selected_experts(model, tokens):
    """The distinct experts each layer's routing picks for these tokens (eager torch)."""
    import torch

    with torch.no_grad():
        positions = torch.arange(tokens.shape[0], dtype=torch.int64)
        cos, sin = model.cos_sin(positions)
        x = model.embedding(tokens)
        sel = []
        for blk in model.blocks:
            x = blk.attn(x, cos, sin, positions)
            _, idx = blk.mlp.route(blk.mlp.norm(x))
            sel.append(sorted(set(int(i) for i in idx.flatten())))
            x = blk.mlp(x)
        y = model.unembedding(model.norm(x))
        if not torch.equal(y, model(tokens)):
            raise RuntimeError("floor: the routing walk does not reproduce model(tokens); update selected_experts")
    return sel


# ----------------------------------------------------------------------------------------
# Running workers
# ----------------------------------------------------------------------------------------

class Runner:
    def __init__(self, work, base_spec, timeout):
        self.work = work
        self.base = base_spec
        self.timeout = timeout
        self.n = 0

    def __call__(self, task, threads=1, extra_env=None, **spec):
        self.n += 1
        tag = f"{self.n:02d}_{task}_{spec.get('system', '')}_{threads}t".replace("__", "_")
        s = dict(self.base, task=task, threads=threads, **spec)
        s["result"] = os.path.join(self.work, "logs", tag + ".json")
        spath = os.path.join(self.work, "logs", tag + ".spec.json")
        with open(spath, "w", encoding="utf-8") as f:
            json.dump(s, f)
        env = dict(os.environ)
        n = str(threads)
        env.update(OMP_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, MKL_NUM_THREADS=n,
                   PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python")] +
                                              ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])))
        env.update(extra_env or {})
        logpath = os.path.join(self.work, "logs", tag + ".log")
        t0 = time.perf_counter()
        try:
            with open(logpath, "w", encoding="utf-8") as logf:
                p = subprocess.run([sys.executable, os.path.join(HERE, "_peers.py"), spath], env=env, cwd=ROOT,
                                   stdout=logf, stderr=subprocess.STDOUT, timeout=self.timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        wall = time.perf_counter() - t0
        res = None
        if os.path.isfile(s["result"]):
            with open(s["result"], "r", encoding="utf-8") as f:
                res = json.load(f)
        if res is None:
            tail = (_read(logpath) or "").splitlines()[-15:]
            why = f"timed out after {self.timeout} s" if rc == "timeout" else f"exit status {rc}"
            res = {"ok": False, "error": f"worker died ({why}): " + (tail[-1] if tail else ""), "log_tail": tail}
        res["process_wall_s"] = wall
        if not res.get("ok") and "skipped" not in res:
            res.setdefault("log_tail", (_read(logpath) or "").splitlines()[-15:])
        return res


def describe_failure(res, lines=4):
    """The reason a worker failed, cut to its first few lines (the log and JSON keep it all)."""
    if res.get("missing_module"):
        return missing_message([res["missing_module"]])
    text = res.get("error", "failed").splitlines() or ["failed"]
    return "\n      ".join(text[:lines]) + (f"\n      ... ({len(text) - lines} more lines in the JSON report)"
                                           if len(text) > lines else "")


# ----------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------

def fmt_ms(v):
    return "-" if v is None else (f"{v:.2f}" if v < 100 else f"{v:.1f}")


def fmt_x(v):
    return "-" if v is None else f"{v:.2f}x"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def summarize(report):
    thr = report["protocol"]["threads"]
    fl = report["floor"]
    log("")
    log("=" * 100)
    env = report["environment"]
    log(f"gpt-oss reference model, 8-token FP32 call -> logits [8, {report['model']['config']['vocab_size']}]  "
        f"({env['cpu_model']}, {env['cores']} cores, torch {env['torch']}, onnxruntime {env['onnxruntime']})")
    bw = report["bandwidth"]["threads"]
    log("DRAM read bandwidth (membw, best pass): " +
        ", ".join(f"{t} thread{'s' if t != '1' else ''} {bw[t]['best_gbps']:.1f} GB/s" for t in bw))
    log(f"floor: {fl['call8']['bytes'] / 1e6:.1f} MB of weights per 8-token call "
        f"({fl['call8']['experts_read']} expert reads over {report['model']['config']['num_layers']} layers, "
        f"unembedding {fl['call8']['parts']['unembedding'] / 1e6:.1f} MB): " +
        ", ".join(f"{fmt_ms(fl['call8']['ms'].get(str(t)))} ms ({t}t)" for t in thr))
    log("")
    head = f"{'system':<26}" + "".join(f"{f'{t}t ms':>10}{'x floor':>9}{'vs Chroma':>10}" for t in thr) + \
        f"{'max|err|':>10}{'peak MiB':>10}  setup"
    log(head)
    log("-" * len(head))
    for sysname in report["protocol"]["systems"]:
        per = report["systems"].get(sysname, {})
        row = f"{LABELS[sysname]:<26}"
        errs, rss, setup = [], None, ""
        failed = None
        for t in thr:
            r = per.get(str(t))
            if not r or not r.get("ok"):
                row += f"{'failed' if r else '-':>10}{'':>9}{'':>10}"
                failed = failed or (r and describe_failure(r))
                continue
            row += f"{fmt_ms(r['median_ms']):>10}{fmt_x(r.get('x_floor')):>9}{fmt_x(r.get('x_chroma')):>10}"
            errs.append(r["max_abs_error"])
            if t == thr[0]:
                rss = r.get("peak_rss_mib_call8", r["peak_rss_mib"])
                st = r.get("setup", {})
                if "compile_s" in st:
                    setup = f"compile {st['compile_s']:.1f} s"
                elif "load_s" in st:
                    setup = f"load {st['load_s']:.2f} s"
        row += f"{(f'{max(errs):.1e}' if errs else '-'):>10}{(f'{rss:.0f}' if rss else '-'):>10}  {setup}"
        log(row)
        if failed:
            log(f"    -> {failed.splitlines()[0][:160]}")
    cc = report.get("chroma_compile", {})
    if cc.get("ok"):
        log("")
        log(f"Chroma compile: cold {cc['compile_cold_s']:.1f} s, cached {cc['compile_cached_s']:.1f} s"
            f"{'' if cc.get('cached_hit') else ' (cache NOT hit)'}; load " +
            ", ".join(f"{report['systems']['chroma'][str(t)]['setup']['load_s']:.2f} s ({t}t)"
                      for t in thr if report['systems'].get('chroma', {}).get(str(t), {}).get('ok')) +
            f"; {cc['stats'].get('kernels')} kernels, arena {cc['stats'].get('arena_bytes')} B; "
            f"source digest {cc['source_digest'][:16]}")
    ex = report.get("onnx_export", {})
    if ex:
        log(f"ONNX export: {ex.get('exporter', 'failed')}" +
            (f", {ex['export_s']:.1f} s" if ex.get("ok") else f": {describe_failure(ex)}"))
    log("")
    log(f"Decode (cache {report['protocol']['decode']['cache_size']}, prompt {report['protocol']['decode']['prompt_len']}, "
        f"{report['protocol']['decode']['steps']} steps); step floor {fl['step']['bytes'] / 1e6:.1f} MB: " +
        ", ".join(f"{fmt_ms(fl['step']['ms'].get(str(t)))} ms ({t}t)" for t in thr) +
        (f"; compile_decoder {report['decode_compile']['compile_s']:.1f} s"
         if report.get("decode_compile", {}).get("ok") else ""))
    for t in thr:
        d = report["decode"].get(str(t), {})
        u = report["uncached"].get(str(t), {})
        uc = u.get("chroma_ms")
        ue = u.get("eager_ms")
        line = f"  {t} thread{'s' if t != 1 else ' '}: "
        if d.get("ok"):
            line += (f"prefill {fmt_ms(d['prefill_median_ms'])} ms ({fmt_x(d.get('prefill_x_floor'))} floor), step {fmt_ms(d['step_median_ms'])} ms "
                     f"({fmt_x(d.get('x_floor'))} floor, max|err| {d.get('step_max_abs_error', 0):.1e}, "
                     f"peak {d['peak_rss_mib']:.0f} MiB); ")
        elif "skipped" in d:
            line += f"cached decode skipped: {d['skipped']}; "
        else:
            line += f"cached decode failed: {describe_failure(d).splitlines()[0][:120]}; " if d else ""
        line += f"uncached 256-token step: Chroma {fmt_ms(uc)} ms, eager {fmt_ms(ue)} ms"
        if d.get("ok") and uc:
            line += f" ({fmt_x(uc / d['step_median_ms'])} speedup from the cache)"
        log(line)
    log("")
    log("Targets:")
    for t in report["targets"]:
        status = {True: "met", False: "NOT met", None: "n/a"}[t["met"]]
        log(f"  [{status:^7}] {t['name']}: {t['detail']}")
    log("=" * 100)


def evaluate_targets(report):
    sys1 = {k: v.get("1", {}) for k, v in report["systems"].items()}
    ch = sys1.get("chroma", {}).get("median_ms") if sys1.get("chroma", {}).get("ok") else None
    floor1 = report["floor"]["call8"]["ms"].get("1")

    def peer(name):
        r = sys1.get(name, {})
        return r.get("median_ms") if r.get("ok") else None

    out = []
    for name, key in TARGETS_DOC:
        met, detail = None, "not measured"
        if key == "floor":
            x = ratio(ch, floor1)
            if x is not None:
                met, detail = x <= 1.3, f"{x:.2f}x the floor ({fmt_ms(ch)} vs {fmt_ms(floor1)} ms)"
        elif key in ("eager", "onnxruntime", "torch_compile", "aoti"):
            need = {"eager": 3.0, "onnxruntime": 2.0}.get(key)
            s = ratio(peer(key), ch)
            if s is not None:
                met = s >= need if need else s > 1.0
                detail = f"{s:.2f}x ({fmt_ms(peer(key))} vs {fmt_ms(ch)} ms)"
        elif key in ("step_floor", "uncached", "prefill_floor"):
            d = report["decode"].get("1", {})
            if d.get("ok"):
                step = d["step_median_ms"]
                if key == "prefill_floor":
                    pf = report["floor"]["prefill"]
                    x = ratio(d["prefill_median_ms"], pf["ms"].get("1"))
                    if x is not None:
                        met, detail = x <= 1.5, (f"{x:.2f}x the floor ({fmt_ms(d['prefill_median_ms'])} ms vs "
                                                 f"{fmt_ms(pf['ms']['1'])} ms: compute {fmt_ms(pf['compute_ms'].get('1'))}, "
                                                 f"bandwidth {fmt_ms(pf['bandwidth_ms'].get('1'))})")
                elif key == "step_floor":
                    x = ratio(step, report["floor"]["step"]["ms"].get("1"))
                    if x is not None:
                        met, detail = x <= 1.3, f"{x:.2f}x the floor ({fmt_ms(step)} ms)"
                else:
                    u = report["uncached"].get("1", {}).get("chroma_ms")
                    s = ratio(u, step)
                    if s is not None:
                        met, detail = s >= 10.0, f"{s:.1f}x ({fmt_ms(u)} ms uncached vs {fmt_ms(step)} ms)"
            elif "skipped" in d:
                detail = "skipped: " + d["skipped"]
        out.append({"name": name, "met": met, "detail": detail})
    return out


# ----------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke test: fewer calls and passes")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "gpt_oss.json"))
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode benchmark")
    ap.add_argument("--workdir", help="keep artifacts and worker logs here (default: a temporary directory, removed)")
    ap.add_argument("--timeout", type=int, default=None, help="seconds per worker process (default 1800; quick 900)")
    a = ap.parse_args(argv)

    threads = [int(t) for t in a.threads.split(",") if t.strip()]
    systems = [s for s in a.systems.split(",") if s.strip()]
    for s in systems:
        if s not in SYSTEMS:
            ap.error(f"unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
    if a.quick:
        proto = dict(warmup=2, calls=10, runs=2, long_warmup=1, long_calls=3, membw_passes=3,
                     prefill_warmup=1, prefill_calls=5, decode_warmup=1)
    else:
        proto = dict(warmup=10, calls=100, runs=2, long_warmup=2, long_calls=10, membw_passes=7,
                     prefill_warmup=3, prefill_calls=20, decode_warmup=2)
    timeout = a.timeout or (900 if a.quick else 1800)

    # Dependencies: required ones stop here; a missing peer's package skips that peer.
    if not _have("numpy") or not _have("torch"):
        log(missing_message([m for m in ("numpy", "torch") if not _have(m)]))
        return 2
    skipped = {}
    for s in list(systems):
        miss = [pip for mod, pip in NEEDS[s].items() if not _have(mod)]
        if miss:
            skipped[s] = missing_message(miss)
            log(f"{LABELS[s]}: skipped, " + skipped[s])
    opt_missing = [pip for mod, pip in OPTIONAL.items() if not _have(mod)]
    if opt_missing and "onnxruntime" in systems and "onnxruntime" not in skipped:
        log(f"note: {missing_message(opt_missing)}\n    (the TorchScript ONNX exporter is used instead)")

    import numpy as np
    import torch

    from _peers import weight_digest
    from chroma.models import gpt_oss

    keep = a.workdir is not None
    work = os.path.abspath(a.workdir) if keep else tempfile.mkdtemp(prefix="chroma-bench-")
    os.makedirs(os.path.join(work, "logs"), exist_ok=True)
    t_start = time.perf_counter()
    try:
        log(f"work directory: {work}{'' if keep else ' (removed at the end; --workdir keeps it)'}")
        env = environment()

        log(f"[bandwidth] membw, {1024} MiB, {proto['membw_passes']} passes, threads {threads}")
        bandwidth = measure_bandwidth(work, threads, 1024, proto["membw_passes"])
        for t, d in bandwidth["threads"].items():
            log(f"    {t} thread(s): {d['best_gbps']:.1f} GB/s")

        log("[reference] eager PyTorch, 1 thread: weights, tokens, logits, routing")
        torch.set_num_threads(1)
        model = gpt_oss.build()
        cfg = model.cfg
        digest = weight_digest(model)
        tok8 = gpt_oss.sample_tokens(cfg, 8)
        tok64 = gpt_oss.sample_tokens(cfg, 64, seed=2)
        tok256 = gpt_oss.sample_tokens(cfg, 256, seed=3)
        paths = {k: os.path.join(work, k + ".npy") for k in ("tokens8", "ref8", "tokens64", "ref64", "tokens256", "ref256")}
        with torch.no_grad():
            np.save(paths["tokens8"], tok8.numpy())
            np.save(paths["ref8"], model(tok8).numpy())
            np.save(paths["tokens64"], tok64.numpy())
            np.save(paths["ref64"], model(tok64).numpy())
            np.save(paths["tokens256"], tok256.numpy())
            np.save(paths["ref256"], model(tok256).numpy())
        sel = selected_experts(model, tok8)
        call8 = floor_bytes(model, tok8.tolist(), sel)
        call8["selected_experts"] = sel
        step = floor_bytes(model, [int(tok64[32])], [list(range(cfg.experts_per_token))] * cfg.num_layers)
        step["note"] = (f"one token: {cfg.experts_per_token} experts per layer; KV cache reads "
                        f"({2 * cfg.num_layers * 256 * cfg.num_key_value_heads * cfg.head_dim * 4} B at 256 rows) not counted")
        prompt = tok64[:32]
        prefill = floor_bytes(model, prompt.tolist(), selected_experts(model, prompt))
        for f in (call8, step, prefill):
            f["ms"] = {t: f["bytes"] / (bandwidth["threads"][t]["best_gbps"] * 1e9) * 1e3 for t in bandwidth["threads"]}
        # The prefill's compute floor: its operations at the best product rate measured here.
        peak = measure_compute_peak(threads)
        prefill["flops"] = prefill_flops(cfg, 32)
        prefill["compute_peak"] = peak
        prefill["bandwidth_ms"] = prefill.pop("ms")
        prefill["compute_ms"] = {t: prefill["flops"] / (peak[t]["gflops"] * 1e9) * 1e3 for t in peak}
        prefill["ms"] = {t: max(prefill["bandwidth_ms"][t], prefill["compute_ms"].get(t, 0.0))
                         for t in prefill["bandwidth_ms"]}
        log(f"    prefill floor: {prefill['bytes'] / 1e6:.1f} MB, {prefill['flops'] / 1e9:.2f} GFLOP; compute peak " +
            ", ".join(f"{peak[t]['gflops']:.0f} GFLOP/s ({t}t)" for t in peak) +
            f" -> {fmt_ms(prefill['ms'].get('1'))} ms (1t)")
        n_params = sum(p.numel() for p in model.parameters())
        log(f"    weight digest {digest[:16]}, {n_params:,} parameters; "
            f"floor {call8['bytes'] / 1e6:.1f} MB -> {fmt_ms(call8['ms'].get('1'))} ms (1t)")
        del model

        base = dict(weight_digest=digest, **paths, **proto,
                    chroma8_cold=os.path.join(work, "chroma8_cold"), chroma8=os.path.join(work, "chroma8"),
                    chroma256=os.path.join(work, "chroma256"), onnx=os.path.join(work, "onnx", "model.onnx"),
                    prompt_len=32, cache_size=256, steps=32, decoder_dir=os.path.join(work, "decoder"))
        run = Runner(work, base, timeout)
        report = {
            "benchmark": "gpt_oss",
            "quick": a.quick,
            "protocol": {**proto, "threads": threads, "systems": systems, "tokens": 8, "dtype": "float32",
                         "timer": "time.perf_counter_ns around each call, gc disabled while timing",
                         "call": "each system's plain call returning all 8 rows of logits as a new array/tensor",
                         "decode": {"cache_size": 256, "prompt_len": 32, "steps": 32,
                                    "uncached": "the full 256-token window recomputed (one 256-token call)"}},
            "environment": env,
            "model": {"module": "chroma.models.gpt_oss", "config": cfg.as_dict(), "parameters": n_params,
                      "weight_digest": digest, "weight_digest_method": "sha256 over state_dict in name order: name, dtype, shape, bytes",
                      "tokens8": tok8.tolist(), "tokens_seed": {"call8": 1, "decode": 2, "call256": 3}},
            "bandwidth": bandwidth,
            "floor": {"call8": call8, "step": step, "prefill": prefill},
            "systems": {s: {} for s in systems},
            "decode": {},
            "uncached": {},
            "skipped": skipped,
        }

        # Preparation, each in its own process.
        need_chroma = "chroma" in systems and "chroma" not in skipped
        chroma_env = {"CHROMA_CACHE_DIR": os.path.join(work, "chroma_cache")}
        if need_chroma:
            cache = chroma_env["CHROMA_CACHE_DIR"]
            log(f"[prepare] Chroma compile: 8 tokens cold (CHROMA_CACHE_DIR={cache}, empty), cached, 256 tokens")
            cc = run("chroma_compile", 1, extra_env=chroma_env)
            report["chroma_compile"] = cc
            if cc.get("ok"):
                report["source_digest"] = cc["source_digest"]
                log(f"    cold {cc['compile_cold_s']:.1f} s, cached {cc['compile_cached_s']:.1f} s, "
                    f"256 tokens {cc['compile_256_s']:.1f} s; source digest {cc['source_digest'][:16]}")
            else:
                log(f"    FAILED: {describe_failure(cc)}")
        if "onnxruntime" in systems and "onnxruntime" not in skipped:
            log("[prepare] ONNX export")
            ex = run("onnx_export", 1)
            report["onnx_export"] = ex
            log(f"    {ex.get('exporter')} exporter, {ex['export_s']:.1f} s" if ex.get("ok") else f"    FAILED: {describe_failure(ex)}")

        for t in threads:
            for s in systems:
                if s in skipped:
                    continue
                label = f"{LABELS[s]}, {t} thread{'s' if t > 1 else ''}"
                if s == "chroma" and not report.get("chroma_compile", {}).get("ok"):
                    report["systems"][s][str(t)] = {"ok": False, "error": "Chroma compile failed: " + describe_failure(
                        report.get("chroma_compile", {}), 1)}
                    continue
                if s == "onnxruntime" and not report.get("onnx_export", {}).get("ok"):
                    report["systems"][s][str(t)] = {"ok": False, "error": "ONNX export failed: " + describe_failure(
                        report.get("onnx_export", {}), 1)}
                    continue
                extra = {"TORCHINDUCTOR_CACHE_DIR": os.path.join(work, f"inductor_{s}_{t}")}
                spec = {}
                if s == "aoti":
                    log(f"[prepare] AOTInductor compile, {t} thread(s) (cold Inductor cache)")
                    spec["aoti"] = os.path.join(work, f"aoti_{t}.pt2")
                    ac = run("aoti_compile", t, extra_env=extra, aoti=spec["aoti"])
                    report.setdefault("aoti_compile", {})[str(t)] = ac
                    if not ac.get("ok"):
                        log(f"    FAILED: {describe_failure(ac)}")
                        report["systems"][s][str(t)] = {"ok": False, "error": "AOTInductor compile failed: " + describe_failure(ac, 1)}
                        continue
                    log(f"    {ac['compile_s']:.1f} s")
                log(f"[run] {label}")
                r = run("run", t, extra_env=extra, system=s, **spec)
                if s == "aoti" and r.get("ok"):
                    r["setup"]["compile_s"] = report["aoti_compile"][str(t)]["compile_s"]
                report["systems"][s][str(t)] = r
                if r.get("ok"):
                    log(f"    median {fmt_ms(r['median_ms'])} ms, max|err| {r['max_abs_error']:.1e}, "
                        f"peak {r.get('peak_rss_mib_call8', r['peak_rss_mib']):.0f} MiB" +
                        (f", 256-token call {fmt_ms(r['call256']['median_ms'])} ms" if r.get("call256") else ""))
                else:
                    log(f"    FAILED: {describe_failure(r)}")
            if not a.no_decode and need_chroma:
                dc = report.get("decode_compile")
                if dc is None:
                    log(f"[prepare] Chroma compile_decoder (prompt 32, cache 256), {t} thread(s)")
                    dc = report["decode_compile"] = run("decode_compile", t, extra_env=chroma_env)
                    if dc.get("ok"):
                        log(f"    {dc['compile_s']:.1f} s")
                if not dc.get("ok"):
                    d = dc if "skipped" in dc else {"ok": False, "error": "compile_decoder failed: " + describe_failure(dc, 1)}
                else:
                    log(f"[decode] Chroma decoder, {t} thread(s)")
                    d = run("decode", t)
                    d["compile_s"] = dc["compile_s"]
                report["decode"][str(t)] = d
                if d.get("ok"):
                    log(f"    prefill {fmt_ms(d['prefill_median_ms'])} ms, step {fmt_ms(d['step_median_ms'])} ms, "
                        f"max|err| {d['step_max_abs_error']:.1e}, peak {d['peak_rss_mib']:.0f} MiB")
                elif "skipped" in d:
                    log(f"    skipped: {d['skipped']}")
                else:
                    log(f"    FAILED: {describe_failure(d)}")

        # Ratios.
        for s, per in report["systems"].items():
            for t, r in per.items():
                if r.get("ok"):
                    r["x_floor"] = ratio(r["median_ms"], call8["ms"].get(t))
                    ch = report["systems"].get("chroma", {}).get(t, {})
                    r["x_chroma"] = ratio(r["median_ms"], ch.get("median_ms")) if ch.get("ok") else None
        for t in map(str, threads):
            u = {}
            ch = report["systems"].get("chroma", {}).get(t, {})
            eg = report["systems"].get("eager", {}).get(t, {})
            if ch.get("ok") and ch.get("call256"):
                u["chroma_ms"] = ch["call256"]["median_ms"]
            if eg.get("ok") and eg.get("call256"):
                u["eager_ms"] = eg["call256"]["median_ms"]
            d = report["decode"].get(t, {})
            if d.get("ok"):
                d["x_floor"] = ratio(d["step_median_ms"], step["ms"].get(t))
                d["prefill_x_floor"] = ratio(d["prefill_median_ms"], prefill["ms"].get(t))
                u["chroma_speedup_from_cache"] = ratio(u.get("chroma_ms"), d["step_median_ms"])
                u["eager_uncached_over_cached"] = ratio(u.get("eager_ms"), d["step_median_ms"])
            report["uncached"][t] = u
        report["targets"] = evaluate_targets(report)
        env["loadavg_end"] = list(os.getloadavg())
        report["wall_s"] = time.perf_counter() - t_start

        out = os.path.abspath(a.out)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
        summarize(report)
        log(f"report: {os.path.relpath(out, os.getcwd())}  ({report['wall_s']:.0f} s)")
        return 0
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
