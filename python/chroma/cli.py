"""The `chroma` command line: compile, run, inspect, bench.

  chroma compile MODEL -o DIR     MODEL: a .cgraph file, or module:factory where factory()
                                  returns (model_or_function, example_inputs);
                                  --target webgpu writes DIR.chroma-web
  chroma run DIR [x.npy ...]      runs with the given inputs (random ones when omitted);
                                  DIR may also be a .chroma-web package
  chroma inspect DIR              manifest summary, kernels and the memory plan (a package's:
                                  requirements, kernels, schedule)
  chroma info                     CPU features and the kernels in use (BLAS core, oneDNN ISA)
  chroma bench DIR                median call time over repeated runs
  chroma opt FILE.ir PASS...      runs passes (fold_constants, dce, cse, optimize, lower) on IR text
  chroma text-to-image --model DIR --prompt TEXT
                                  Chroma1-HD's text-to-image pipeline (docs/text_to_image.md)
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

import numpy as np

from .runtime.registry import TARGETS, describe, load


def _open(path):
    """An artifact directory (any target), or a WebGPU package file (.chroma-web)."""
    if os.path.isfile(path):
        from .runtime.webgpu import WebGPUProgram

        return WebGPUProgram(path)
    return load(path)


def _random_inputs(prog, seed=0):
    rng = np.random.default_rng(seed)
    arrays = []
    for s in prog.inputs:
        if s.dtype == np.bool_:
            arrays.append(rng.integers(0, 2, s.shape).astype(np.bool_))
        elif np.issubdtype(s.dtype, np.integer):
            arrays.append(rng.integers(0, 2, s.shape).astype(s.dtype))
        else:
            arrays.append(rng.standard_normal(s.shape).astype(s.dtype))
    return arrays


def _weights_arg(text):
    """--weights: a format (q4) or rules as key=format,... (default=q4,unembedding=q8)."""
    if text is None:
        return text
    if "=" not in text:
        return text.split(",") if "," in text else text  # several variants: one artifact each
    return dict(item.split("=", 1) for item in text.split(",") if item)


def _print_weights(m):
    """The weights policy, its decisions and the accuracy report of a manifest."""
    w = m.get("options", {}).get("weights")
    if not w or w.get("spec") in (None, "fp32"):
        print("weights: float32")
        return
    acts = {"auto": "int8 activations in q4/q6 products where the CPU has AVX512-VNNI, bfloat16 elsewhere",
            "bf16": "bfloat16 activations in the products",
            "fp32": "float32 activations in the products"}.get(w["activations"], f"{w['activations']} activations")
    if w.get("attention") == "bf16":
        acts += "; attention's products in bfloat16 where the CPU has AMX"
    print(f"weights: {w['spec']} (groups of {w['group_size']}, {w['scale_type']} scales and biases, "
          f"{acts}); product weights {w['product_weights_bytes']:,} B "
          f"(float32: {w['product_weights_bytes_fp32']:,} B)")
    for d in w["decisions"]:
        role = f" [{d['role']}]" if d.get("role") else ""
        mats = f" x{d['matrices']}" if d.get("matrices", 1) > 1 else ""
        print(f"  {d['name']}{role} {d['shape']}{mats}: {d['format']} ({d['reason']}), {d['bytes']:,} B")
    acc = m.get("accuracy")
    if acc:
        print(f"accuracy against {acc['reference']} ({acc['inputs']} input set{'s' if acc['inputs'] > 1 else ''}):")
        for o in acc["outputs"]:
            extra = ""
            if "top1_agreement" in o:
                extra = f", top-1 agreement {o['top1_agreement']:.4f}, KL {o['kl_divergence']:.3e}"
            print(f"  output {o['output']} {o['shape']}: relative L2 {o['rel_l2']:.3e}, max abs {o['max_abs']:.3e}, "
                  f"cosine {o['cosine']:.6f}{extra}")


def cmd_compile(a):
    from .compiler import compile as compile_model, compile_graph

    if a.model.endswith(".cgraph"):
        prog = compile_graph(a.model, a.out, blas=not a.no_blas, target=a.target, weights=_weights_arg(a.weights))
    else:
        mod_name, _, attr = a.model.partition(":")
        if not attr:
            sys.exit("chroma compile: MODEL must be a .cgraph file or module:factory")
        sys.path.insert(0, os.getcwd())
        model, inputs = getattr(importlib.import_module(mod_name), attr)()
        prog = compile_model(model, inputs, out=a.out, blas=not a.no_blas, target=a.target,
                             weights=_weights_arg(a.weights), batch=_batch_arg(a.batch))
    s = prog.stats
    if a.timings:
        _print_timings(prog)
    if TARGETS[a.target].gpu:
        print(f"compiled {a.model} -> {a.out.rstrip('/')}{TARGETS[a.target].package_suffix}: {s['kernels']} kernels, {s['dispatches']} "
              f"dispatches, {s['pipelines']} pipelines, arena {s['arena_bytes']} B (temporaries "
              f"{s['temporaries_bytes']} B), weights {s['weight_bytes']} B")
        return
    print(f"compiled {a.model} -> {a.out}: {s['kernels']} kernels, arena {s['arena_bytes']} B "
          f"(temporaries {s['temporaries_bytes']} B), weights {s['weight_bytes']} B, "
          f"build {'cached' if prog.manifest['build']['cached'] else 'fresh'}")
    if a.weights:
        _print_weights(prog.manifest)


def _batch_arg(text):
    """--batch HI or LO:HI -> None, hi or (lo, hi)."""
    if not text:
        return None
    lo, _, hi = text.partition(":")
    try:
        return (int(lo), int(hi)) if hi else int(lo)
    except ValueError:
        sys.exit(f"chroma compile: --batch {text!r}: give HI or LO:HI (integers)")


def cmd_serve(a):
    """Serves an artifact on a Ray Serve instance (chroma/serve.py): a local one unless
    --address names a cluster's head; blocks until interrupted."""
    import ray
    from ray import serve

    from .serve import deployment

    if not os.path.isfile(os.path.join(a.dir, "manifest.json")):
        sys.exit(f"chroma serve: {a.dir}: not an artifact directory (no manifest.json)")
    ray.init(address=a.address, include_dashboard=False)
    serve.start(http_options={"host": a.host, "port": a.port})
    app = deployment(a.dir, num_replicas=a.replicas, threads=a.threads, max_batch_size=a.max_batch_size,
                     batch_wait_timeout_s=a.batch_wait_ms / 1000.0).bind()
    serve.run(app, name="chroma", route_prefix="/", blocking=False)
    print(f"serving {a.dir} on http://{a.host}:{a.port}/ with {a.replicas} replica(s) of {a.threads} thread(s); "
          "POST / (JSON or application/x-safetensors), GET /health, /metadata; Ctrl-C stops", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()


_COMPILER_PHASES = ("import", "optimize", "lower", "weights", "codegen", "write", "build", "manifest")


def _print_timings(prog):
    """Where a compile's time went: Python's phases, the C++ compiler's, each g++ process."""
    t = dict(prog.timings)
    verdict = t.pop("model_cache", "not recorded")
    print(f"model cache: {verdict}")
    phases = {k[9:]: t.pop(k) for k in list(t) if k.startswith("compiler.")}
    for k, v in t.items():
        print(f"  {k:<22} {v:8.3f} s")
        if k == "compiler":
            for name in sorted(phases, key=lambda n: _COMPILER_PHASES.index(n) if n in _COMPILER_PHASES else 99):
                print(f"    {name:<20} {phases[name]:8.3f} s")
    steps = prog.manifest.get("build", {}).get("steps", [])
    if verdict == "hit":
        return  # the manifest's steps are those of the compile that stored the artifact
    if steps:
        print("  compiler processes (wall seconds, in the order they finished):")
        for s in steps:
            print(f"    {s['name']:<24} {s['seconds']:8.3f} s")
    else:
        print("  the library came from the build cache (no compiler process ran)")


def cmd_run(a):
    prog = _open(a.dir)
    arrays = [np.load(p) for p in a.inputs] if a.inputs else _random_inputs(prog)
    out = prog(*arrays)
    outs = out if isinstance(out, tuple) else (out,)
    for i, o in enumerate(outs):
        print(f"output {i}: {o.dtype}{list(o.shape)}")
        print(np.array2string(o, threshold=20, edgeitems=3))
    if a.save:
        np.savez(a.save, *outs)


def _print_info():
    from .cpuinfo import info

    i = info()
    b, d = i["blas"], i["onednn"]
    print(f"this machine: {i['cpu']}, {i['cores']} cores; features {' '.join(i['features'])}")
    print(f"  BLAS: {b.get('library')} core {b.get('core')} ({b.get('config', b.get('error', ''))}); "
          f"OPENBLAS_CORETYPE={b.get('OPENBLAS_CORETYPE')}")
    print(f"  oneDNN: {d.get('version', d.get('error', ''))} ISA {d.get('isa')}")
    print(f"  float32 products and convolutions: {'oneDNN' if d.get('library') else 'OpenBLAS and Chroma kernels'}; "
          "float64 and linear algebra: OpenBLAS")


def cmd_info(a):
    _print_info()


def _inspect_package(path):
    """A GPU package (WebGPU, CUDA or Metal): its manifest, requirements, kernels and schedule."""
    from .runtime.package import read_package

    pkg = read_package(path)
    m = pkg.manifest
    print(f"package {path}: format {m['format']} v{m['version']}, compiler {m['compiler_version']}, "
          f"sha256 {m['content_hash']}")
    for kind in ("inputs", "outputs"):
        for t in m[kind]:
            print(f"  {kind[:-1]} {t['name']}: {t['dtype']}{t['shape']} (stored {t['storage']}, arena offset {t['offset']})")
    req = m["requirements"]
    print(f"requires: features {req['features'] or 'none'}; limits " +
          ", ".join(f"{k}={v}" for k, v in sorted(req["limits"].items())))
    print("stats: " + ", ".join(f"{k}={v}" for k, v in sorted(m["stats"].items())))
    print(f"buffers: arena {m['arena']['bytes']} B, state {m['state']['bytes']} B, params {m['params']['bytes']} B, "
          f"weights {len(m['weights']['shards'])} shard(s) of " +
          ", ".join(str(s['bytes']) for s in m["weights"]["shards"]) + " B")
    g = m.get("golden")
    if g:
        print(f"golden data: {len(g['inputs'])} inputs, {len(g['outputs'])} outputs, tolerance {g['tolerance']}")
    print(f"kernels ({len(m['kernels'])} modules):")
    for i, k in enumerate(m["kernels"]):
        uses = sum(1 for d in m["dispatches"] if d["kernel"] == i)
        print(f"  {k['name']}: workgroup {k['workgroup_size'][0]}, {len(k['bindings'])} bindings, "
              f"{len(k['code'].splitlines())} lines of {pkg.dialect.upper()}, {uses} dispatch(es)")
    print(f"schedule ({len(m['dispatches'])} dispatches):")
    for i, d in enumerate(m["dispatches"]):
        src = f"   ({d['source']})" if d["source"] else ""
        print(f"  {i}: {m['kernels'][d['kernel']]['name']} grid {d['grid']}: {d['label']}{src}")


def cmd_inspect(a):
    if os.path.isfile(a.dir):
        return _inspect_package(a.dir)
    with open(os.path.join(a.dir, "manifest.json")) as f:
        m = json.load(f)
    if m.get("format") == "chroma.variants":
        print(f"artifact {a.dir}: {len(m['variants'])} weight variants (chroma.load(dir, weights='auto') picks the most "
              f"accurate that fits; a margin of {m['margin_bytes'] / 1e6:.1f} MB is added to each need)")
        for v in m["variants"]:
            n = v["need"]
            print(f"  {v['name']}: weights {v['weights']}, needs {n['total'] / 1e6:.1f} MB (weights {n['weights'] / 1e6:.1f} MB, "
                  f"library {n['library'] / 1e6:.1f} MB, arena {n['arena'] / 1e6:.2f} MB, state {n['state'] / 1e6:.2f} MB), "
                  f"relative L2 {v['rel_l2']:.3e}; chroma inspect {os.path.join(a.dir, v['directory'])}")
        return None
    if TARGETS.get(m.get("target", "cpu"), TARGETS["cpu"]).gpu:
        print(f"artifact {a.dir}: target {m['target']}, package {m['package']['file']}")
        for line in describe(m):
            print(line)
        return _inspect_package(os.path.normpath(os.path.join(a.dir, m["package"]["file"])))
    print(f"artifact {a.dir}: format {m['format']} v{m['version']}, compiler {m['compiler_version']}, target {m['target']}")
    for kind in ("inputs", "outputs"):
        for s in m[kind]:
            print(f"  {kind[:-1]} {s['name']}: {s['dtype']}{s['shape']}")
    opts = m.get("options", {})
    sgemm = {"onednn": "oneDNN sgemm (threads: the program's pool)", "openblas": "OpenBLAS",
             "chroma": "Chroma's portable kernels"}.get(opts.get("sgemm"), "not recorded")
    print(f"built with: blas={opts.get('blas')} dnnl={opts.get('dnnl')}; float32 products: {sgemm}; "
          f"{m.get('build', {}).get('command', '')}")
    _print_info()
    _print_weights(m)
    st = m["stats"]
    print("stats: " + ", ".join(f"{k}={v}" for k, v in sorted(st.items())))
    print(f"kernels ({len(m['kernels'])}):")
    for k in m["kernels"]:
        src = f"   ({k['source']})" if k["source"] else ""
        print(f"  k{k['index']}: {k['label']}{src}")
    ar = m["arena"]
    print(f"memory plan: arena {ar['bytes']} B for {ar['temporaries_bytes']} B of temporaries "
          f"(lower bound {ar['lower_bound']} B)")
    for b in ar["buffers"]:
        print(f"  buf{b['id']} {b['dtype']}{b['shape']} offset {b['offset']} size {b['bytes']} "
              f"kernels [{b['first']}, {b['last']}] {b['name']}")
    print(ar.get("plan", ""))


def cmd_bench(a):
    prog = _open(a.dir)
    arrays = _random_inputs(prog)
    for _ in range(a.warmup):
        prog(*arrays)
    times = []
    for _ in range(a.iters):
        t0 = time.perf_counter()
        prog(*arrays)
        times.append(time.perf_counter() - t0)
    times.sort()
    print(f"{a.dir}: median {times[len(times) // 2] * 1e3:.3f} ms over {a.iters} calls "
          f"(min {times[0] * 1e3:.3f} ms)")


def cmd_opt(a):
    from . import _compiler

    with open(a.file) as f:
        print(_compiler.run_ir(f.read(), a.passes), end="")


def main(argv=None):
    p = argparse.ArgumentParser(prog="chroma", description="Chroma: compile PyTorch models to native programs")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="compile a model into an artifact directory")
    c.add_argument("model")
    c.add_argument("-o", "--out", required=True)
    c.add_argument("--no-blas", action="store_true", help="use Chroma's portable matrix kernels")
    c.add_argument("--target", default="cpu", choices=tuple(TARGETS),
                   help="cpu (default); webgpu: writes OUT.chroma-web (docs/webgpu_package.md); cuda: "
                   "OUT.chroma-cuda, OUT/kernels.cu and the CPU SIMT emulator's library; metal: the same in MSL")
    c.add_argument("--timings", action="store_true", help="print where the compile's time went")
    c.add_argument("--weights", help="weight format: fp32 (default), bf16, q8, q6, q4, or rules "
                   "key=format,... (default=q4,unembedding=q8,*.gate.weight=fp32,activations=fp32); several formats "
                   "(q8,q4) build one artifact with a variant each")
    c.add_argument("--batch", help="a batch range, HI or LO:HI: any number of rows from one artifact "
                   "(dimension 0 of every input; docs/artifact_format.md, \"Batch ranges\")")
    c.set_defaults(fn=cmd_compile)
    r = sub.add_parser("run", help="run an artifact (a directory, or a .chroma-web package)")
    r.add_argument("dir")
    r.add_argument("inputs", nargs="*", help=".npy files, one per input")
    r.add_argument("--save", help="write the outputs to this .npz file")
    r.set_defaults(fn=cmd_run)
    sub.add_parser("info", help="CPU features and the kernels in use (BLAS core, oneDNN ISA)").set_defaults(fn=cmd_info)
    i = sub.add_parser("inspect", help="print the manifest, kernels and memory plan (or a .chroma-web package's)")
    i.add_argument("dir")
    i.set_defaults(fn=cmd_inspect)
    b = sub.add_parser("bench", help="time an artifact")
    b.add_argument("dir")
    b.add_argument("--iters", type=int, default=100)
    b.add_argument("--warmup", type=int, default=10)
    b.set_defaults(fn=cmd_bench)
    o = sub.add_parser("opt", help="run compiler passes on IR text (tests/golden/*.ir)")
    o.add_argument("file")
    o.add_argument("passes", nargs="*")
    o.set_defaults(fn=cmd_opt)
    sv = sub.add_parser("serve", help="serve an artifact over HTTP on Ray Serve (docs/serving.md)")
    sv.add_argument("dir")
    sv.add_argument("--replicas", type=int, default=1, help="replicas (processes), each loading the artifact once")
    sv.add_argument("--threads", type=int, default=1, help="CPU threads per replica (and CPUs Ray reserves for it)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    sv.add_argument("--address", default=None, help="a Ray cluster to join (HEAD:6379; default: start a local one)")
    sv.add_argument("--max-batch-size", type=int, default=32, help="rows merged into one call at most")
    sv.add_argument("--batch-wait-ms", type=float, default=5.0, help="how long a call waits for more requests")
    sv.set_defaults(fn=cmd_serve)
    from .pipelines.cli import add_parser as add_text_to_image

    add_text_to_image(sub)
    a = p.parse_args(argv)
    try:
        a.fn(a)
    except Exception as e:  # a clear one-line error for the shell
        if os.environ.get("CHROMA_TRACEBACK"):
            raise
        sys.exit(f"chroma {a.cmd}: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
