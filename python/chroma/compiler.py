"""chroma.compile: export with torch, then compile with the C++ compiler and load."""

from __future__ import annotations

import contextlib
import json
import os
import sysconfig
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .arrays import from_numpy, to_numpy  # noqa: F401  (chroma.compiler.to_numpy: kept where users found it)
from .cache.model_cache import through_model_cache
from .paths import default_cache_dir, include_dir
from .quantization.quant import record_accuracy, weights_spec
from .runtime.cpu import Program
from .runtime.registry import TARGETS as _RUNTIME_TARGETS
from .runtime.registry import load, load_compiled
from .runtime.variants import MARGIN_BYTES, VARIANTS_FORMAT, VARIANTS_VERSION, variant_error, variant_name, variant_need

__all__ = ["compile", "compile_artifact", "plan", "compile_entries", "include_dir", "default_cache_dir"]


# The targets chroma.compile builds and chroma.load runs: the compiler's registered targets
# (src/targets/registry.cpp) that have a runtime (runtime/registry.py); the `null` target
# writes no artifact (it checks GPU planning: _compiler.compile_graph(..., target="null")).
TARGETS = tuple(_RUNTIME_TARGETS)


def build_graph(graph_path: str, out: str, *, target: str = "cpu", blas: bool = True, jobs: int = 0,
                cache_dir: Optional[str] = None, max_depth: int = 32, golden: str = "", weights: Any = None) -> None:
    """Compiles a .cgraph file (from chroma.export) into the artifact directory `out`
    (target "webgpu": also the package `<out>.chroma-web`, with the golden data `golden`
    describes, see _write_golden)."""
    from . import _compiler

    os.makedirs(out, exist_ok=True)
    _compiler.compile_graph(
        graph_path, out, target=target, blas=blas, include_dir=include_dir(),
        python_include=sysconfig.get_paths()["include"],
        cache_dir=default_cache_dir() if cache_dir is None else cache_dir, jobs=jobs, max_depth=max_depth,
        golden=golden, weights=weights_spec(weights))


# Tolerance stored with a package's golden outputs: |y - golden| <= atol + rtol |golden|, with
# atol relative to the output's largest magnitude (a GPU's exp, log and sums differ from the
# CPU's in the last bits, and deep models carry that forward).
GOLDEN_RTOL = 1e-3
GOLDEN_ATOL = 1e-4


# With reduced weights (weights= other than fp32) the golden outputs are still float32
# PyTorch's, and the check allows this fraction of the outputs' scale for the coarsest format
# the policy names: the format's error as a model propagates it, far below what a broken
# kernel gives (the manifest's accuracy report measures the error itself).
GOLDEN_WEIGHT_ERROR = {"bf16": 2.0 ** -4, "q8": 2.0 ** -4, "q6": 2.0 ** -3, "q4": 2.0 ** -2}


def _golden_weight_error(spec: str) -> float:
    """The golden tolerance for a weights policy string (weights_spec's form: key=fmt;...)."""
    formats = {item.split("=", 1)[1] for item in spec.split(";") if "=" in item and not item.startswith("activations=")}
    return max([GOLDEN_WEIGHT_ERROR.get(f, 0.0) for f in formats] + [0.0])

# Golden data is kept small beside the weights (docs/webgpu_package.md, "Golden data"): at
# most this many bytes, or this fraction of the weights if that is more. Beyond it, float32
# inputs are generated at load from a seed (golden_uniform) and large outputs are sampled.
GOLDEN_BUDGET_BYTES = 64 << 10
GOLDEN_BUDGET_FRACTION = 0.01


def _write_golden(fn: Any, example_inputs: tuple, input_names: list, directory: str, weight_error: float = 0.0) -> str:
    """Runs `fn` eagerly and writes the inputs and outputs of a GPU package's self-check:
    returns the path of the JSON description ("" when the model updates state in place, whose
    eager run would change the model). Within the budget the example inputs are stored as they
    are; beyond it every float32 input is generated from a seed over the example's range (the
    outputs computed from those), and an output beyond it is stored every `stride`-th element."""
    import numpy as np
    import torch
    from torch.utils._pytree import tree_flatten

    from .golden import golden_uniform

    weights = 0
    if isinstance(fn, torch.nn.Module):
        weights = sum(t.numel() * t.element_size() for t in fn.state_dict().values())
    budget = max(GOLDEN_BUDGET_BYTES, int(GOLDEN_BUDGET_FRACTION * weights))
    inputs = list(example_inputs)
    generated: Dict[int, Dict[str, Any]] = {}
    if sum(t.numel() * t.element_size() for t in inputs) > budget:
        for i, t in enumerate(inputs):
            if t.dtype != torch.float32 or t.numel() == 0:
                continue
            a = t.detach().numpy()
            finite = a[np.isfinite(a)]
            low, high = (float(finite.min()), float(finite.max())) if finite.size else (-1.0, 1.0)
            spec = {"kind": "uniform", "seed": 0x5EED0000 + i, "low": float(np.float32(low)), "high": float(np.float32(high))}
            generated[i] = spec
            inputs[i] = torch.from_numpy(golden_uniform(t.numel(), spec["seed"], spec["low"], spec["high"]).reshape(t.shape))
    with torch.no_grad():
        outputs = tree_flatten(fn(*inputs))[0]
    scale = max([float(np.max(np.abs(o.detach().float().numpy()))) for o in outputs
                 if o.is_floating_point() and o.numel() and bool(torch.isfinite(o).all())] + [1.0])
    # A half output may differ from the CPU's by one unit in its last place (sums in another
    # order, rounded to 11 or 8 bits): the tolerance covers two.
    ulp = max([{torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}.get(o.dtype, 0.0) for o in outputs] + [0.0])
    # Weights stored in fewer bits (weight_error > 0) move the outputs away from float32
    # PyTorch's by more than rounding: the check then covers that error as a fraction of the
    # outputs' scale (the manifest's accuracy report measures it exactly).
    tol = max(2 * ulp, weight_error)
    desc: Dict[str, Any] = {"inputs": [], "outputs": [],
                            "tolerance": {"atol": max(GOLDEN_ATOL, tol) * scale, "rtol": max(GOLDEN_RTOL, tol)}}
    per_output = max(budget // max(len(outputs), 1), 4096)
    for kind, tensors in (("inputs", inputs), ("outputs", outputs)):
        for i, t in enumerate(tensors):
            a = to_numpy(t)
            name = input_names[i] if kind == "inputs" else f"output{i}"
            entry: Dict[str, Any] = {"name": name, "dtype": str(a.dtype) if a.dtype != np.bool_ else "bool",
                                     "shape": list(a.shape)}
            if kind == "inputs" and i in generated:
                entry["generate"] = generated[i]
            else:
                if kind == "outputs" and a.nbytes > per_output:
                    entry["stride"] = stride = -(-a.nbytes // per_output)
                    a = a.reshape(-1)[::stride]
                path = os.path.join(directory, f"golden_{kind}_{i}.bin")
                np.ascontiguousarray(a).tofile(path)
                entry["file"] = path
            desc[kind].append(entry)
    path = os.path.join(directory, "golden.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(desc, f)
    return path


def compile_graph(graph_path: str, out: str, *, target: str = "cpu", blas: bool = True, jobs: int = 0,
                  cache_dir: Optional[str] = None, max_depth: int = 32, threads: Optional[int] = None,
                  weights: Any = None) -> Program:
    """Compiles a .cgraph file (from chroma.export) into `out` and loads it."""
    timings: Dict[str, Any] = {"model_cache": "off (a graph file)"}
    _timed(timings, "compiler", build_graph, graph_path, out, target=target, blas=blas, jobs=jobs, cache_dir=cache_dir,
           max_depth=max_depth, weights=weights)
    prog = _timed_load(out, threads, timings)
    prog.timings = timings
    return prog


def _build_graphs(entries: Dict[str, str], out: str, *, target: str = "cpu", blas: bool = True, jobs: int = 0,
                  cache_dir: Optional[str] = None, max_depth: int = 32, weights: Any = None) -> None:
    from . import _compiler

    os.makedirs(out, exist_ok=True)
    _compiler.compile_graphs(
        list(entries.keys()), list(entries.values()), out, target=target, blas=blas, include_dir=include_dir(),
        python_include=sysconfig.get_paths()["include"],
        cache_dir=default_cache_dir() if cache_dir is None else cache_dir, jobs=jobs, max_depth=max_depth,
        weights=weights_spec(weights))


def compile_graphs(entries: Dict[str, str], out: str, *, target: str = "cpu", blas: bool = True, jobs: int = 0,
                   cache_dir: Optional[str] = None, max_depth: int = 32, threads: Optional[int] = None,
                   weights: Any = None) -> Program:
    """Compiles .cgraph files into one artifact, one entry point per graph; loads it."""
    _build_graphs(entries, out, target=target, blas=blas, jobs=jobs, cache_dir=cache_dir, max_depth=max_depth,
                  weights=weights)
    return load(out, threads=threads)


def _example_inputs(example_inputs: Any) -> tuple:
    import numpy as np
    import torch

    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    # NumPy example inputs are accepted too.
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
                 for a in example_inputs)


def _timed(timings: Dict[str, Any], key: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    timings[key] = time.perf_counter() - t0
    return result


def _timed_load(out: str, threads: Optional[int], timings: Dict[str, Any]) -> Any:
    t0 = time.perf_counter()
    # CUDA and Metal: the program returned runs the generated kernels on the CPU SIMT emulator,
    # which works on every machine; chroma.load(out) runs the artifact natively on its GPU.
    prog = load_compiled(out, threads)
    timings["load"] = time.perf_counter() - t0
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        timings.update({f"compiler.{k}": v for k, v in json.load(f)["build"].get("phases", {}).items()})
    return prog


def _graph_dir(out: str, keep_graph: bool):
    """Where the exported graphs go: the artifact directory when kept, else a temporary one."""
    if keep_graph:
        return contextlib.nullcontext(out)
    return tempfile.TemporaryDirectory(prefix="chroma-graph-")


def compile_entries(entries: Dict[str, Tuple[Any, Any]], *, out: Optional[str] = None, target: str = "cpu",
                    blas: bool = True, jobs: int = 0, cache_dir: Optional[str] = None, max_depth: int = 32,
                    threads: Optional[int] = None, keep_graph: bool = False, weights: Any = None) -> Program:
    """Compiles several functions into one artifact with one entry point each.

    entries: {name: (module_or_function, example_inputs)}, in order; the first is the
    Program's default entry. Parameters with identical contents are stored once. Buffers
    that any entry updates in place (``self.cache.index_copy_(...)``) become persistent
    state shared by all entries, matched by their fully qualified names: a KV cache that
    ``prefill`` fills and ``step`` extends. Other options as for compile().
    """
    from .frontend.exporter import export

    if not entries:
        raise ValueError("compile_entries: no entries")
    if out is None:
        out = tempfile.mkdtemp(prefix="chroma-")
    os.makedirs(out, exist_ok=True)
    for name in entries:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"entry name {name!r} must be an identifier")
    examples = {name: _example_inputs(ex) for name, (fn, ex) in entries.items()}
    spec = weights_spec(weights)

    def build(timings: Dict[str, Any]) -> Program:
        graphs = _timed(timings, "export", lambda: {name: export(fn, examples[name]) for name, (fn, _) in entries.items()})
        # A buffer one entry updates is state in every entry that reads it.
        state = set()
        for g in graphs.values():
            state |= {w["source"] for w in g.json["weights"] if w["kind"] == "state"}
        with _graph_dir(out, keep_graph) as gdir:
            paths = {name: os.path.join(gdir, f"{name}.cgraph") for name in graphs}

            def write():
                for name, g in graphs.items():
                    for w in g.json["weights"]:
                        if w["kind"] == "buffer" and w["source"] in state:
                            w["kind"] = "state"
                    g.write(paths[name])

            _timed(timings, "graph_write", write)
            _timed(timings, "compiler", _build_graphs, paths, out, target=target, blas=blas, jobs=jobs,
                   cache_dir=cache_dir, max_depth=max_depth, weights=spec)
            return _timed_load(out, threads, timings)

    if keep_graph:
        return build({"model_cache": "off (keep_graph)"})
    if _RUNTIME_TARGETS[target].gpu:  # the finished-artifact cache keeps CPU artifacts (their files) only
        return build({"model_cache": f"off (target {target})"})
    models = [(name, fn, examples[name]) for name, (fn, _) in entries.items()]
    options = dict(entries=list(entries), target=target, blas=blas, max_depth=max_depth)
    if spec:
        options["weights"] = spec
    return through_model_cache(models, options, out, cache_dir, threads, build)


def compile(model_or_function: Any, example_inputs: Any, *, out: Optional[str] = None, target: str = "cpu",
            blas: bool = True, jobs: int = 0, cache_dir: Optional[str] = None, max_depth: int = 32,
            threads: Optional[int] = None, keep_graph: bool = False, weights: Any = None,
            weight_data: Any = None, batch: Any = None) -> Program:  # noqa: A001
    """Compiles a torch.nn.Module or a plain function of tensors for fixed example inputs.

    out:       artifact directory (a new temporary directory when None)
    target:    "cpu", or "webgpu": writes the package `<out>.chroma-web` (docs/webgpu_package.md)
               with golden inputs and outputs from an eager run, and returns a
               chroma.runtime.WebGPUProgram that runs it through the `wgpu` package; or
               "cuda": the same package with CUDA kernels (`<out>.chroma-cuda`), `<out>/kernels.cu`
               and the CPU SIMT emulator's library (with nvcc: also the fatbin and the host
               library, chroma.load(out) on a GPU); returns a chroma.runtime.EmulatedProgram; "metal": the same with MSL
               kernels (`<out>.chroma-metal`, `<out>/kernels.metal`), emulated
    blas:      the CPU performance libraries (CPU target): float32 matrix products on
               oneDNN's sgemm and float32 convolutions on oneDNN when Chroma was built with
               oneDNN's headers (otherwise products on OpenBLAS's cblas_sgemm and convolutions
               on Chroma's own kernels; CHROMA_SGEMM=openblas also keeps the products on
               OpenBLAS), float64 products on OpenBLAS, linear-algebra factorizations on
               LAPACK. False: Chroma's portable kernels, and factorizations are refused
    jobs:      parallel compiler processes (0: one per core)
    cache_dir: build cache ($CHROMA_CACHE_DIR or ~/.cache/chroma; "" disables it). Besides
               compiled objects it keeps finished artifacts under a fingerprint of the model
               (cache/fingerprint.py): compiling an unchanged model again, in any process, copies
               the artifact instead of exporting and building (CHROMA_MODEL_CACHE=0: off)
    max_depth: deepest fused expression before it is written to a buffer
    threads:   threads the loaded program runs on (see chroma.load)
    keep_graph: also keep the exported graph in the artifact as graph.cgraph (for debugging;
               it holds a second copy of the weights; the artifact does not need it)
    weights:   the format of the matrix products' weights and of the tables a Gather reads
               (embeddings) (docs/quantization.md): "fp32" (the
               default), "bf16", "q8", "q6", "q4" (MLX's affine groups of 64), or a dict of
               rules {"default": "q4", "unembedding": "q8", "*.gate.weight": "fp32",
               "activations": "fp32"} (name patterns as fnmatch; routers, norms, biases, sinks
               and small matrices stay exact unless a rule names them; "activations": "auto",
               the default, multiplies int8 activations with q4/q6 weights where the CPU has
               AVX512-VNNI and bfloat16 otherwise, "bf16" always bfloat16, "fp32" exact;
               "attention": "bf16" multiplies attention's two products in bfloat16 where the CPU
               has AMX, "fp32" the default). CPU target. The
               manifest lists every decision; prog.accuracy compares the outputs on the example
               inputs with float32 PyTorch. A list (["q8", "q4"]) builds one artifact with a
               variant each (chroma.load(out, weights="auto") chooses by the memory available).
    weight_data: where the weights' bytes come from (chroma.frontend.exporter.export's
               weight_data): a model built without its weights (structure_only()) compiles
               with them read from files, e.g. safetensors_weights(paths); nothing runs the
               model eagerly then (no golden data for GPU packages, no accuracy report, and
               the finished-artifact cache is off: it fingerprints the weights)
    batch:     a batch range, (lo, hi) or hi for (1, hi): dimension 0 of every input is the
               batch, and the program answers any number of rows (chroma.batching: one
               entry point per size of a ladder, weights stored once; a batch between the
               compiled sizes is padded or split). The model must treat rows independently:
               checked first (chroma.frontend.batch_rows), refused with the node otherwise.
               Returns a chroma.batching.BatchedProgram. CPU, CUDA and Metal targets (a
               WebGPU package holds one entry point); one weights format
    """
    _check_target(target)
    if batch is not None:
        return _compile_batch_range(model_or_function, example_inputs, batch, out=out, target=target, blas=blas,
                                    jobs=jobs, cache_dir=cache_dir, max_depth=max_depth, threads=threads,
                                    keep_graph=keep_graph, weights=weights, weight_data=weight_data)
    if isinstance(weights, (list, tuple)):

        if _RUNTIME_TARGETS[target].gpu:
            raise ValueError("weights=[...]: several weight variants are for the cpu target")
        return compile_variants(compile, model_or_function, example_inputs, list(weights),
                                out or tempfile.mkdtemp(prefix="chroma-"), blas=blas, jobs=jobs, cache_dir=cache_dir,
                                max_depth=max_depth, threads=threads)
    example_inputs = _example_inputs(example_inputs)
    spec = weights_spec(weights)
    if out is None:
        out = tempfile.mkdtemp(prefix="chroma-")
    os.makedirs(out, exist_ok=True)

    eager = weight_data is None and not _without_weights(model_or_function)

    def build(timings: Dict[str, Any]) -> Program:
        _build_artifact(model_or_function, example_inputs, out, timings, target=target, blas=blas, jobs=jobs,
                        cache_dir=cache_dir, max_depth=max_depth, keep_graph=keep_graph, spec=spec,
                        weight_data=weight_data, eager=eager)
        return _timed_load(out, threads, timings)

    if keep_graph:
        return build({"model_cache": "off (keep_graph)"})
    if not eager:
        return build({"model_cache": "off (weights from weight_data)"})
    if _RUNTIME_TARGETS[target].gpu:  # the package lies beside the directory the model cache stores
        return build({"model_cache": f"off (target {target})"})
    options = dict(target=target, blas=blas, max_depth=max_depth)
    if spec:
        options["weights"] = spec
    return through_model_cache([("forward", model_or_function, tuple(example_inputs))], options, out, cache_dir,
                                threads, build)


def _compile_batch_range(model: Any, example_inputs: Any, batch: Any, *, out: Optional[str], target: str,
                         weights: Any, weight_data: Any, **options: Any) -> Any:
    from .batching import compile_batch_range

    if not _RUNTIME_TARGETS[target].several_entries:
        raise ValueError(f"batch={batch!r}: a {target} package holds one entry point (its runtimes run one schedule), "
                         "and a batch range is one entry per batch size: compile one package per size")
    if isinstance(weights, (list, tuple)):
        raise ValueError(f"batch={batch!r}: one weights format (not a list of variants)")
    if weight_data is not None or _without_weights(model):
        raise ValueError(f"batch={batch!r}: the row check runs the model: give it its weights (not weight_data)")
    return compile_batch_range(compile_entries, model, _example_inputs(example_inputs), batch,
                               out=out or tempfile.mkdtemp(prefix="chroma-"), target=target, weights=weights,
                               **options)


def _check_target(target: str) -> None:
    if target not in TARGETS:
        raise ValueError(f"target {target!r} is not supported (available: {', '.join(TARGETS)})")


def _build_artifact(model_or_function: Any, example_inputs: tuple, out: str, timings: Dict[str, Any], *, target: str,
                    blas: bool, jobs: int, cache_dir: Optional[str], max_depth: int, keep_graph: bool, spec: Any,
                    weight_data: Any, eager: bool) -> None:
    """compile()'s work up to a finished artifact in `out`: export, graph file, golden data,
    the native compiler, the accuracy report; nothing loaded."""
    from .frontend.exporter import export

    graph = _timed(timings, "export", export, model_or_function, tuple(example_inputs), weight_data=weight_data)
    with _graph_dir(out, keep_graph) as gdir:
        gpath = os.path.join(gdir, "graph.cgraph")
        _timed(timings, "graph_write", graph.write, gpath)
        golden = ""
        if eager and _RUNTIME_TARGETS[target].gpu and not graph.json.get("state_updates"):
            golden = _timed(timings, "golden", _write_golden, model_or_function, tuple(example_inputs),
                            [i["name"] for i in graph.json["inputs"]], gdir, _golden_weight_error(spec))
        _timed(timings, "compiler", build_graph, gpath, out, target=target, blas=blas, jobs=jobs,
               cache_dir=cache_dir, max_depth=max_depth, golden=golden, weights=spec)
        if spec and eager:
            _timed(timings, "accuracy", record_accuracy, out, model_or_function, tuple(example_inputs))


def plan(model_or_function: Any, example_inputs: Any, *, target: str = "cpu", blas: bool = True, max_depth: int = 32,
         weights: Any = None, weight_data: Any = None) -> Dict[str, Any]:
    """What compiling would plan, without generating code or writing an artifact: the entry's
    arena {"bytes", "lower_bound", "temporaries_bytes"}, its kernel count and the bytes of the
    constants its kernels read. Exports the model (with weight_data, as compile() does) and
    lowers it. The arena depends on the weights' shapes, not their values, except where
    equal constants are stored once (give distinct values, e.g. random, not zeros)."""
    from . import _compiler
    from .frontend.exporter import export

    _check_target(target)
    graph = export(model_or_function, _example_inputs(example_inputs), weight_data=weight_data)
    with tempfile.TemporaryDirectory(prefix="chroma-plan-") as tmp:
        gpath = os.path.join(tmp, "graph.cgraph")
        graph.write(gpath)
        del graph
        text = _compiler.plan_graph(gpath, tmp, target=target, blas=blas, include_dir=include_dir(),
                                    max_depth=max_depth, weights=weights_spec(weights))
    return json.loads(text)[0]


def compile_artifact(model_or_function: Any, example_inputs: Any, out: str, *, target: str = "cpu",
                     blas: bool = True, jobs: int = 0, cache_dir: Optional[str] = None, max_depth: int = 32,
                     weights: Any = None, weight_data: Any = None) -> Dict[str, Any]:
    """compile() without loading the result: writes the artifact to `out` and returns the
    seconds of each phase. For a caller that loads it later, or in another process (the
    text-to-image pipeline: a loaded CPU program holds its weights in memory, which a compile
    of a large model need not add to its own peak). One weights format (no list); no model
    cache."""
    _check_target(target)
    if isinstance(weights, (list, tuple)):
        raise ValueError("compile_artifact: one weights format (chroma.compile builds several variants)")
    os.makedirs(out, exist_ok=True)
    timings: Dict[str, Any] = {}
    eager = weight_data is None and not _without_weights(model_or_function)
    _build_artifact(model_or_function, _example_inputs(example_inputs), out, timings, target=target, blas=blas,
                    jobs=jobs, cache_dir=cache_dir, max_depth=max_depth, keep_graph=False,
                    spec=weights_spec(weights), weight_data=weight_data, eager=eager)
    return timings


def _without_weights(model: Any) -> bool:
    """Whether a module was built without its weights (structure_only(): FakeTensors)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return False
    from .frontend.exporter import _is_fake

    return any(_is_fake(p) for p in model.parameters())


def compile_variants(compile_fn, model: Any, example_inputs: Any, weights: List[Any], out: str, **options: Any):
    """Compiles one artifact per entry of `weights` under out/variants/ and writes the
    variants manifest; returns the variant load_variant("auto") picks."""
    if not weights:
        raise ValueError("weights: an empty list of variants")
    os.makedirs(out, exist_ok=True)
    names, entries = set(), []
    for i, w in enumerate(weights):
        name = variant_name(w, i)
        if name in names:
            raise ValueError(f"weights: variant {name!r} is given twice")
        names.add(name)
        sub = os.path.join(out, "variants", name)
        compile_fn(model, example_inputs, out=sub, weights=w, **options)
        with open(os.path.join(sub, "manifest.json"), encoding="utf-8") as f:
            m = json.load(f)
        spec = m.get("options", {}).get("weights", {}).get("spec", "fp32")
        entries.append({"name": name, "directory": f"variants/{name}", "weights": spec, "need": variant_need(m, sub),
                        "rel_l2": variant_error(m), "accuracy": m.get("accuracy")})
    manifest = {"format": VARIANTS_FORMAT, "version": VARIANTS_VERSION, "margin_bytes": MARGIN_BYTES,
                "variants": entries}
    with open(os.path.join(out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
    return load(out, weights="auto", threads=options.get("threads"))
