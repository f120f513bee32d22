"""chroma.jit and the torch.compile backend.

`chroma.jit(fn_or_module)` returns a callable that compiles on first call and keeps one
program per input shapes and dtypes: in memory, and on disk under the cache directory
(keyed by the exported graph's digest, so a new process reuses the artifact without a
rebuild). Torch tensors in give torch tensors out; NumPy arrays in give NumPy arrays out.

`torch.compile(model, backend="chroma")` works through the `torch_dynamo_backends` entry
point (pyproject.toml), or after `chroma.jitting.register_backend()`.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from typing import Any, Callable, Dict, Optional, Tuple

from .compiler import compile_graph, default_cache_dir
from .program import Program, load

__all__ = ["jit", "JitFunction", "chroma_backend", "register_backend"]


class JitFunction:
    def __init__(self, fn: Any, cache_dir: Optional[str] = None, **options: Any):
        self.fn = fn
        self.cache_dir = default_cache_dir() if cache_dir is None else cache_dir
        self.options = options
        self.programs: Dict[Tuple, Program] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(args: Tuple) -> Tuple:
        return tuple((tuple(a.shape), str(a.dtype)) for a in args)

    def program_for(self, args: Tuple) -> Program:
        import torch

        from .exporter import export

        key = self._key(args)
        with self._lock:
            prog = self.programs.get(key)
            if prog is not None:
                return prog
            targs = tuple(torch.as_tensor(a) for a in args)
            graph = export(self.fn, targs)
            # Key on what determines the program: the graph and weights, not source lines.
            doc = dict(graph.json)
            doc["nodes"] = [{k: v for k, v in n.items() if k != "source"} for n in doc["nodes"]]
            doc.pop("producer", None)
            h = hashlib.sha256(json.dumps(doc, sort_keys=True).encode())
            h.update(graph.blob)
            digest = h.hexdigest()
            opts = sorted(self.options.items())
            digest = hashlib.sha256((digest + repr(opts)).encode()).hexdigest()[:32]
            out = os.path.join(self.cache_dir, "jit", digest)
            try:
                prog = load(out)
            except Exception:  # missing or stale: compile afresh
                os.makedirs(out, exist_ok=True)
                gpath = os.path.join(out, "graph.cgraph")
                graph.write(gpath)
                prog = compile_graph(gpath, out, cache_dir=self.cache_dir, **self.options)
            self.programs[key] = prog
            return prog

    def __call__(self, *args: Any):
        import numpy as np

        torch_in = any(type(a).__module__.startswith("torch") for a in args)
        prog = self.program_for(args)
        arrays = [a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a) for a in args]
        result = prog(*arrays)
        if not torch_in:
            return result
        import torch

        if isinstance(result, tuple):
            return tuple(torch.from_numpy(r) for r in result)
        return torch.from_numpy(result)


def jit(fn_or_module: Any = None, **options: Any):
    """Decorator or wrapper: `chroma.jit(model)` or `@chroma.jit`."""
    if fn_or_module is None:
        return lambda f: JitFunction(f, **options)
    return JitFunction(fn_or_module, **options)


def chroma_backend(gm: Any, example_inputs: Any, **options: Any) -> Callable:
    """A torch.compile backend: compiles the captured FX graph with Chroma."""

    jf = JitFunction(gm, **options)

    def compiled(*args):
        out = jf(*args)
        # Dynamo's graphs return a tuple or list of tensors; Chroma keeps that structure.
        return out if isinstance(out, tuple) else (out,)

    return compiled


def register_backend() -> None:
    """Registers "chroma" with torch.compile (the entry point does this automatically)."""
    from torch._dynamo import list_backends, register_backend as reg

    if "chroma" not in list_backends(exclude_tags=()):
        reg(name="chroma")(chroma_backend)
