"""The `chroma` command line: compile, run, inspect, bench.

  chroma compile MODEL -o DIR     MODEL: a .cgraph file, or module:factory where factory()
                                  returns (model_or_function, example_inputs)
  chroma run DIR [x.npy ...]      runs with the given inputs (random ones when omitted)
  chroma inspect DIR              manifest summary, kernels and the memory plan
  chroma info                     CPU features and the kernels in use (BLAS core, oneDNN ISA)
  chroma bench DIR                median call time over repeated runs
  chroma opt FILE.ir PASS...      runs passes (fold_constants, dce, cse, optimize, lower) on IR text
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

import numpy as np

from .program import load


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


def cmd_compile(a):
    from .compiler import compile as compile_model, compile_graph

    if a.model.endswith(".cgraph"):
        prog = compile_graph(a.model, a.out, blas=not a.no_blas)
    else:
        mod_name, _, attr = a.model.partition(":")
        if not attr:
            sys.exit("chroma compile: MODEL must be a .cgraph file or module:factory")
        sys.path.insert(0, os.getcwd())
        model, inputs = getattr(importlib.import_module(mod_name), attr)()
        prog = compile_model(model, inputs, out=a.out, blas=not a.no_blas)
    s = prog.stats
    if a.timings:
        _print_timings(prog)
    print(f"compiled {a.model} -> {a.out}: {s['kernels']} kernels, arena {s['arena_bytes']} B "
          f"(temporaries {s['temporaries_bytes']} B), weights {s['weight_bytes']} B, "
          f"build {'cached' if prog.manifest['build']['cached'] else 'fresh'}")


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
    prog = load(a.dir)
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


def cmd_inspect(a):
    with open(os.path.join(a.dir, "manifest.json")) as f:
        m = json.load(f)
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
    prog = load(a.dir)
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
    c.add_argument("--timings", action="store_true", help="print where the compile's time went")
    c.set_defaults(fn=cmd_compile)
    r = sub.add_parser("run", help="run an artifact")
    r.add_argument("dir")
    r.add_argument("inputs", nargs="*", help=".npy files, one per input")
    r.add_argument("--save", help="write the outputs to this .npz file")
    r.set_defaults(fn=cmd_run)
    sub.add_parser("info", help="CPU features and the kernels in use (BLAS core, oneDNN ISA)").set_defaults(fn=cmd_info)
    i = sub.add_parser("inspect", help="print the manifest, kernels and memory plan")
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
    a = p.parse_args(argv)
    try:
        a.fn(a)
    except Exception as e:  # a clear one-line error for the shell
        if os.environ.get("CHROMA_TRACEBACK"):
            raise
        sys.exit(f"chroma {a.cmd}: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
