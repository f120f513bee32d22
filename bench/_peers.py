"""Worker for bench/gpt_oss.py: one task per process, so each system's thread settings and
peak memory (ru_maxrss) are its own.

    python bench/_peers.py SPEC.json      # writes the result JSON to SPEC["result"]

The orchestrator sets OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS in the
environment before this process starts. Tasks that do not need torch (ONNX Runtime, Chroma)
never import it, so their peak memory is that of their runtime alone (VmHWM, see
peak_rss_mib).

Tasks:
  chroma_compile  compile the 8-token model cold (fresh $CHROMA_CACHE_DIR) and cached, and
                  the 256-token model (the uncached decode baseline)
  onnx_export     torch.onnx.export (dynamo exporter, else the TorchScript one)
  aoti_compile    torch._inductor.aoti_compile_and_package with N threads
  run             time one system on the 8-token call (and, for eager and Chroma, the
                  256-token call)
  decode_compile  chroma.compile_decoder (prompt 32, cache 256)
  decode          chroma.Decoder.load with N threads: prefill and cached decode steps
"""

from __future__ import annotations

import gc
import hashlib
import inspect
import json
import os
import resource
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402


# ----------------------------------------------------------------------------------------
# Helpers shared with the orchestrator (no torch at import time)
# ----------------------------------------------------------------------------------------

def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB.

    VmHWM from /proc/self/status: ru_maxrss survives execve on Linux, so a worker started by
    a large parent would report at least the parent's peak. ru_maxrss where /proc is absent.
    """
    try:
        with open("/proc/self/status", "r", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024.0, 1)  # kB
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)  # KiB on Linux


def time_calls(fn, warmup: int, calls: int, runs: int):
    """`runs` runs of `calls` timed calls, each run after `warmup` untimed ones: [[ms, ...], ...]."""
    out = []
    for _ in range(runs):
        for _ in range(warmup):
            fn()
        enabled = gc.isenabled()
        gc.disable()
        try:
            run = []
            for _ in range(calls):
                t0 = time.perf_counter_ns()
                fn()
                run.append((time.perf_counter_ns() - t0) / 1e6)
        finally:
            if enabled:
                gc.enable()
        out.append(run)
    return out


def pooled_median(samples):
    flat = [x for run in samples for x in run]
    return statistics.median(flat) if flat else None


def max_abs_error(got, ref) -> float:
    got = np.asarray(got, dtype=np.float32)
    if got.shape != ref.shape:
        raise ValueError(f"output shape {got.shape} differs from eager's {ref.shape}")
    return float(np.max(np.abs(got - ref)))


def weight_digest(model) -> str:
    """SHA-256 over the state_dict in name order: name, dtype, shape, then the raw bytes."""
    h = hashlib.sha256()
    sd = model.state_dict()
    for name in sorted(sd):
        t = sd[name].detach().contiguous().cpu()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(memoryview(t.numpy()).cast("B"))
    return h.hexdigest()


def chroma_load(chroma, path: str, threads: int):
    """chroma.load(path, threads=N); falls back to the default where `threads=` is not there yet."""
    if "threads" in inspect.signature(chroma.load).parameters:
        return chroma.load(path, threads=threads), True
    return chroma.load(path), False


# ----------------------------------------------------------------------------------------
# Tasks
# ----------------------------------------------------------------------------------------

def _torch_setup(threads: int):
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    return torch


def _build_model(spec):
    from chroma.models import gpt_oss

    t0 = time.perf_counter()
    model = gpt_oss.build()
    build_s = time.perf_counter() - t0
    digest = weight_digest(model)
    if digest != spec["weight_digest"]:
        raise RuntimeError(f"weights differ from the orchestrator's: digest {digest} != {spec['weight_digest']}")
    return model, build_s


def task_chroma_compile(spec):
    torch = _torch_setup(1)
    import chroma

    model, _ = _build_model(spec)
    tok8 = torch.from_numpy(np.load(spec["tokens8"]))
    tok256 = torch.from_numpy(np.load(spec["tokens256"]))
    res = {"cache_dir": os.environ.get("CHROMA_CACHE_DIR")}
    t0 = time.perf_counter()
    prog = chroma.compile(model, (tok8,), out=spec["chroma8_cold"])
    res["compile_cold_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    prog2 = chroma.compile(model, (tok8,), out=spec["chroma8"])
    res["compile_cached_s"] = time.perf_counter() - t0
    res["cached_hit"] = bool(prog2.manifest.get("build", {}).get("cached"))
    res["build_cold_s"] = prog.manifest.get("build", {}).get("build_seconds")
    res["source_digest"] = prog.manifest["source"]["digest"]
    res["source_files"] = len(prog.manifest["source"].get("files", []))
    res["stats"] = prog.stats
    res["arena_lower_bound"] = prog.manifest.get("arena", {}).get("lower_bound")
    res["compiler_version"] = prog.manifest.get("compiler_version")
    res["options"] = prog.manifest.get("options")
    del prog, prog2
    t0 = time.perf_counter()
    p256 = chroma.compile(model, (tok256,), out=spec["chroma256"])
    res["compile_256_s"] = time.perf_counter() - t0
    res["stats_256"] = p256.stats
    res["source_digest_256"] = p256.manifest["source"]["digest"]
    return res


def task_onnx_export(spec):
    torch = _torch_setup(1)
    model, _ = _build_model(spec)
    tok8 = torch.from_numpy(np.load(spec["tokens8"]))
    path = spec["onnx"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    errors = {}
    try:
        import onnxscript  # noqa: F401  (the dynamo exporter needs it)

        t0 = time.perf_counter()
        with torch.no_grad():
            prog = torch.onnx.export(model, (tok8,), dynamo=True, external_data=True, verbose=False)
        prog.save(path, external_data=True)
        return {"exporter": "dynamo", "export_s": time.perf_counter() - t0}
    except Exception as e:  # noqa: BLE001 - fall back to the TorchScript exporter, keep the reason
        errors["dynamo"] = f"{type(e).__name__}: {e}"[:2000]
    t0 = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(model, (tok8,), path, dynamo=False, input_names=["tokens"], output_names=["logits"],
                          opset_version=17)
    return {"exporter": "torchscript", "export_s": time.perf_counter() - t0, "errors": errors}


def task_aoti_compile(spec):
    torch = _torch_setup(spec["threads"])
    model, _ = _build_model(spec)
    tok8 = torch.from_numpy(np.load(spec["tokens8"]))
    t0 = time.perf_counter()
    with torch.no_grad():
        ep = torch.export.export(model, (tok8,))
        export_s = time.perf_counter() - t0
        path = torch._inductor.aoti_compile_and_package(ep, package_path=spec["aoti"])
    return {"export_s": export_s, "compile_s": time.perf_counter() - t0, "package": path,
            "package_bytes": os.path.getsize(path)}


def _long_calls(spec, fn, ref_path):
    """The 256-token call (uncached decode baseline): a few timed calls and the error."""
    ref = np.load(ref_path, mmap_mode="r")
    got = fn()
    err = max_abs_error(got, ref)
    del got
    samples = time_calls(fn, spec["long_warmup"], spec["long_calls"], spec["runs"])
    return {"samples_ms": samples, "median_ms": pooled_median(samples), "max_abs_error": err}


def task_run(spec):
    system, threads = spec["system"], spec["threads"]
    tok8_np = np.load(spec["tokens8"])
    ref8 = np.load(spec["ref8"])
    res = {"system": system, "threads": threads, "setup": {}}
    setup = res["setup"]

    if system == "chroma":
        import chroma

        t0 = time.perf_counter()
        prog, threads_api = chroma_load(chroma, spec["chroma8"], threads)
        setup["load_s"] = time.perf_counter() - t0
        setup["threads_keyword"] = threads_api
        setup["runtime_threads"] = getattr(prog, "threads", None)  # what the runtime says it runs on
        if not threads_api:
            setup["note"] = "chroma.load has no threads= yet: ran with its default threads"
        fn = lambda: prog(tok8_np)  # noqa: E731
        out = lambda y: y  # noqa: E731
        long = None
        if spec.get("chroma256"):
            tok256 = np.load(spec["tokens256"])
            p256, _ = chroma_load(chroma, spec["chroma256"], threads)
            long = (lambda: p256(tok256), spec["ref256"])
    elif system == "onnxruntime":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        t0 = time.perf_counter()
        sess = ort.InferenceSession(spec["onnx"], so, providers=["CPUExecutionProvider"])
        setup["load_s"] = time.perf_counter() - t0
        setup["providers"] = sess.get_providers()
        name = sess.get_inputs()[0].name
        feed = {name: tok8_np}
        fn = lambda: sess.run(None, feed)  # noqa: E731
        out = lambda y: y[0]  # noqa: E731
        long = None
    else:
        torch = _torch_setup(threads)
        model, setup["build_s"] = _build_model(spec)
        tok8 = torch.from_numpy(tok8_np)
        torch.set_grad_enabled(False)
        long = None
        if system == "eager":
            fn = lambda: model(tok8)  # noqa: E731
            tok256 = torch.from_numpy(np.load(spec["tokens256"]))
            long = (lambda: model(tok256).numpy(), spec["ref256"])
        elif system == "torch_compile":
            compiled = torch.compile(model)
            t0 = time.perf_counter()
            compiled(tok8)
            setup["compile_s"] = time.perf_counter() - t0  # first call: Dynamo + Inductor, cold cache
            setup["options"] = "torch.compile(model) (Inductor, default mode)"
            fn = lambda: compiled(tok8)  # noqa: E731
        elif system == "aoti":
            del model
            gc.collect()
            t0 = time.perf_counter()
            runner = torch._inductor.aoti_load_package(spec["aoti"])
            setup["load_s"] = time.perf_counter() - t0
            fn = lambda: runner(tok8)  # noqa: E731
        else:
            raise ValueError(f"unknown system {system!r}")

        def out(y):
            if isinstance(y, (list, tuple)):
                y = y[0]
            return y.numpy()

        setup["torch_threads"] = torch.get_num_threads()

    res["max_abs_error"] = max_abs_error(out(fn()), ref8)
    samples = time_calls(fn, spec["warmup"], spec["calls"], spec["runs"])
    res["samples_ms"] = samples
    res["median_ms"] = pooled_median(samples)
    res["peak_rss_mib_call8"] = peak_rss_mib()  # before the 256-token call below adds its own
    if long is not None:
        res["call256"] = _long_calls(spec, long[0], long[1])
    res["torch_imported"] = "torch" in sys.modules
    return res


def task_decode_compile(spec):
    """chroma.compile_decoder into spec["decoder_dir"] (the decode runs load it, without torch)."""
    import chroma

    if not (hasattr(chroma, "Decoder") and hasattr(chroma, "compile_decoder")):
        return {"skipped": "chroma.Decoder / chroma.compile_decoder do not exist yet in this checkout"}
    _torch_setup(spec["threads"])
    model, _ = _build_model(spec)
    kw = dict(prompt_len=spec["prompt_len"], cache_size=spec["cache_size"], out=spec["decoder_dir"])
    res = {"cache_dir": os.environ.get("CHROMA_CACHE_DIR")}
    if "threads" in inspect.signature(chroma.compile_decoder).parameters:
        kw["threads"] = spec["threads"]
    t0 = time.perf_counter()
    dec = chroma.compile_decoder(model, **kw)
    res["compile_s"] = time.perf_counter() - t0
    prog = getattr(dec, "program", None)
    if prog is not None:
        res["stats"] = prog.stats
        res["source_digest"] = prog.manifest.get("source", {}).get("digest")
    return res


def task_decode(spec):
    """Prefill and cached decode steps on the compiled decoder, loaded with N threads."""
    threads = spec["threads"]
    import chroma

    if not hasattr(chroma, "Decoder"):
        return {"skipped": "chroma.Decoder does not exist yet in this checkout"}
    tok = np.load(spec["tokens64"]).astype(np.int64)
    ref = np.load(spec["ref64"])
    prompt_len, steps = spec["prompt_len"], spec["steps"]
    res = {"threads": threads}
    t0 = time.perf_counter()
    load = getattr(chroma.Decoder, "load", None)
    if load is not None and "threads" in inspect.signature(load).parameters:
        dec = load(spec["decoder_dir"], threads=threads)
        res["threads_keyword"] = True
    else:
        dec = chroma.Decoder(chroma.load(spec["decoder_dir"]))
        res["threads_keyword"] = False
        res["note"] = "chroma.Decoder.load has no threads= yet: ran with its default threads"
    res["load_s"] = time.perf_counter() - t0
    prog = getattr(dec, "program", None)
    res["runtime_threads"] = getattr(prog, "threads", None)
    prompt = np.ascontiguousarray(tok[:prompt_len])
    cont = [int(t) for t in tok[prompt_len:prompt_len + steps]]

    def sequence(check):
        pre = dec.prefill(prompt)
        pre_err = max_abs_error(pre, ref[:prompt_len]) if check else None
        step_ms, errs = [], []
        for i, t in enumerate(cont):
            t0 = time.perf_counter_ns()
            y = dec.step(t)
            step_ms.append((time.perf_counter_ns() - t0) / 1e6)
            if check:
                errs.append(max_abs_error(np.asarray(y).reshape(1, -1), ref[prompt_len + i:prompt_len + i + 1]))
        return step_ms, pre_err, errs

    # First sequence: warm-up, and the check against eager on the same tokens (positions
    # 0..63 lie inside the 256-row cache, so eager's 64-token call gives the same logits).
    _, res["prefill_max_abs_error"], errs = sequence(True)
    res["step_max_abs_error"] = max(errs) if errs else None
    for _ in range(max(0, spec["decode_warmup"] - 1)):
        sequence(False)
    res["prefill_samples_ms"] = time_calls(lambda: dec.prefill(prompt), spec["prefill_warmup"],
                                           spec["prefill_calls"], 1)
    res["prefill_median_ms"] = pooled_median(res["prefill_samples_ms"])
    step_runs = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(spec["runs"]):
            step_ms, _, _ = sequence(False)  # prefill (untimed), then 32 timed steps
            step_runs.append(step_ms)
    finally:
        if enabled:
            gc.enable()
    res["step_samples_ms"] = step_runs
    res["step_median_ms"] = pooled_median(step_runs)
    res["torch_imported"] = "torch" in sys.modules
    return res


TASKS = {"chroma_compile": task_chroma_compile, "onnx_export": task_onnx_export, "aoti_compile": task_aoti_compile,
         "run": task_run, "decode_compile": task_decode_compile, "decode": task_decode}


def main(argv):
    with open(argv[1], "r", encoding="utf-8") as f:
        spec = json.load(f)
    t0 = time.perf_counter()
    try:
        res = TASKS[spec["task"]](spec)
        res["ok"] = "skipped" not in res
    except ImportError as e:
        res = {"ok": False, "error": f"{type(e).__name__}: {e}", "missing_module": getattr(e, "name", None),
               "traceback": traceback.format_exc()[-4000:]}
    except Exception as e:  # noqa: BLE001 - the orchestrator reports it and goes on
        res = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-4000:]}
    res["task_wall_s"] = time.perf_counter() - t0
    res["peak_rss_mib"] = peak_rss_mib()
    res["env_threads"] = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    with open(spec["result"], "w", encoding="utf-8") as f:
        json.dump(res, f)
    return 0 if res.get("ok") or "skipped" in res else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
