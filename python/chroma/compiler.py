"""chroma.compile: export with torch, then compile with the C++ compiler and load."""

from __future__ import annotations

import contextlib
import os
import sysconfig
import tempfile
from typing import Any, Dict, Optional, Tuple

from .program import Program, load

__all__ = ["compile", "compile_entries", "include_dir", "default_cache_dir"]


def include_dir() -> str:
    """The header-only runtime library the generated code includes."""
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "include"), os.path.join(here, "..", "..", "include")):
        if os.path.isfile(os.path.join(cand, "chroma", "cpu", "et.h")):
            return os.path.abspath(cand)
    raise RuntimeError("chroma's runtime headers are missing from the installation (chroma/include)")


def default_cache_dir() -> str:
    return os.environ.get("CHROMA_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "chroma")


def build_graph(graph_path: str, out: str, *, target: str = "cpu", blas: bool = True, jobs: int = 0,
                cache_dir: Optional[str] = None, max_depth: int = 32) -> None:
    """Compiles a .cgraph file (from chroma.export) into the artifact directory `out`."""
    from . import _compiler

    os.makedirs(out, exist_ok=True)
    _compiler.compile_graph(
        graph_path, out, target=target, blas=blas, include_dir=include_dir(),
        python_include=sysconfig.get_paths()["include"],
        cache_dir=default_cache_dir() if cache_dir is None else cache_dir, jobs=jobs, max_depth=max_depth)


def compile_graph(graph_path: str, out: str, *, target: str = "cpu", blas: bool = True, jobs: int = 0,
                  cache_dir: Optional[str] = None, max_depth: int = 32, threads: Optional[int] = None) -> Program:
    """Compiles a .cgraph file (from chroma.export) into `out` and loads it."""
    build_graph(graph_path, out, target=target, blas=blas, jobs=jobs, cache_dir=cache_dir, max_depth=max_depth)
    return load(out, threads=threads)


def compile_graphs(entries: Dict[str, str], out: str, *, target: str = "cpu", blas: bool = True, jobs: int = 0,
                   cache_dir: Optional[str] = None, max_depth: int = 32, threads: Optional[int] = None) -> Program:
    """Compiles .cgraph files into one artifact, one entry point per graph; loads it."""
    from . import _compiler

    os.makedirs(out, exist_ok=True)
    _compiler.compile_graphs(
        list(entries.keys()), list(entries.values()), out, target=target, blas=blas, include_dir=include_dir(),
        python_include=sysconfig.get_paths()["include"],
        cache_dir=default_cache_dir() if cache_dir is None else cache_dir, jobs=jobs, max_depth=max_depth)
    return load(out, threads=threads)


def _example_inputs(example_inputs: Any) -> tuple:
    import numpy as np
    import torch

    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    # NumPy example inputs are accepted too.
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
                 for a in example_inputs)


def _graph_dir(out: str, keep_graph: bool):
    """Where the exported graphs go: the artifact directory when kept, else a temporary one."""
    if keep_graph:
        return contextlib.nullcontext(out)
    return tempfile.TemporaryDirectory(prefix="chroma-graph-")


def compile_entries(entries: Dict[str, Tuple[Any, Any]], *, out: Optional[str] = None, target: str = "cpu",
                    blas: bool = True, jobs: int = 0, cache_dir: Optional[str] = None, max_depth: int = 32,
                    threads: Optional[int] = None, keep_graph: bool = False) -> Program:
    """Compiles several functions into one artifact with one entry point each.

    entries: {name: (module_or_function, example_inputs)}, in order; the first is the
    Program's default entry. Parameters with identical contents are stored once. Buffers
    that any entry updates in place (``self.cache.index_copy_(...)``) become persistent
    state shared by all entries, matched by their fully qualified names: a KV cache that
    ``prefill`` fills and ``step`` extends. Other options as for compile().
    """
    from .exporter import export

    if not entries:
        raise ValueError("compile_entries: no entries")
    if out is None:
        out = tempfile.mkdtemp(prefix="chroma-")
    os.makedirs(out, exist_ok=True)
    graphs = {}
    for name, (fn, ex) in entries.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"entry name {name!r} must be an identifier")
        graphs[name] = export(fn, _example_inputs(ex))
    # A buffer one entry updates is state in every entry that reads it.
    state = set()
    for g in graphs.values():
        state |= {w["source"] for w in g.json["weights"] if w["kind"] == "state"}
    with _graph_dir(out, keep_graph) as gdir:
        paths = {}
        for name, g in graphs.items():
            for w in g.json["weights"]:
                if w["kind"] == "buffer" and w["source"] in state:
                    w["kind"] = "state"
            paths[name] = os.path.join(gdir, f"{name}.cgraph")
            g.write(paths[name])
        return compile_graphs(paths, out, target=target, blas=blas, jobs=jobs, cache_dir=cache_dir,
                              max_depth=max_depth, threads=threads)


def compile(model_or_function: Any, example_inputs: Any, *, out: Optional[str] = None, target: str = "cpu",
            blas: bool = True, jobs: int = 0, cache_dir: Optional[str] = None, max_depth: int = 32,
            threads: Optional[int] = None, keep_graph: bool = False) -> Program:  # noqa: A001
    """Compiles a torch.nn.Module or a plain function of tensors for fixed example inputs.

    out:       artifact directory (a new temporary directory when None)
    target:    "cpu"
    blas:      FP32 matrix products through OpenBLAS (False: Chroma's portable kernels)
    jobs:      parallel compiler processes (0: one per core)
    cache_dir: build cache ($CHROMA_CACHE_DIR or ~/.cache/chroma; "" disables it)
    max_depth: deepest fused expression before it is written to a buffer
    threads:   threads the loaded program runs on (see chroma.load)
    keep_graph: also keep the exported graph in the artifact as graph.cgraph (for debugging;
               it holds a second copy of the weights; the artifact does not need it)
    """
    from .exporter import export

    example_inputs = _example_inputs(example_inputs)
    if out is None:
        out = tempfile.mkdtemp(prefix="chroma-")
    os.makedirs(out, exist_ok=True)
    graph = export(model_or_function, tuple(example_inputs))
    with _graph_dir(out, keep_graph) as gdir:
        gpath = os.path.join(gdir, "graph.cgraph")
        graph.write(gpath)
        return compile_graph(gpath, out, target=target, blas=blas, jobs=jobs, cache_dir=cache_dir,
                             max_depth=max_depth, threads=threads)
