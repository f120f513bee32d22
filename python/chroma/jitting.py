"""chroma.jit and the torch.compile backend.

`chroma.jit(fn_or_module)` returns a callable that compiles on first call and keeps one
program per input shapes and dtypes: in memory, and on disk under the cache directory
(keyed by the exported graph's digest, so a new process reuses the artifact without a
rebuild). Torch tensors in give torch tensors out; NumPy arrays in give NumPy arrays out.

The weights are part of the key: a parameter or buffer changed in place through a PyTorch
op (``p.add_()``, ``p.copy_()``, ``load_state_dict``) bumps its version counter, and a
tensor assigned anew has another address; either makes the next call export and compile (or
reuse from disk) the program for the new values. Writes through ``.data`` bypass the version
counter: they are seen by a content hash for modules with at most 1 MiB of weights, and
otherwise only after ``invalidate()``.

Several processes may jit into one cache directory: each builds into a private directory
and publishes it with an atomic rename; the loser of a race loads the winner's artifact.

`torch.compile(model, backend="chroma")` works through the `torch_dynamo_backends` entry
point (pyproject.toml), or after `chroma.jitting.register_backend()`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from typing import Any, Callable, Dict, Optional, Tuple

from .arrays import from_numpy, to_numpy
from .compiler import build_graph
from .paths import default_cache_dir
from .runtime.cpu import Program
from .runtime.registry import load

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

    _CONTENT_HASH_BYTES = 1 << 20

    def _weights_key(self) -> Tuple:
        """Identifies the current values of the module's parameters and buffers."""
        import torch

        tensors = []
        if hasattr(self.fn, "named_parameters") and hasattr(self.fn, "named_buffers"):
            tensors = list(self.fn.named_parameters()) + list(self.fn.named_buffers())
        key = tuple((n, t.data_ptr(), t._version, tuple(t.shape), str(t.dtype)) for n, t in tensors)
        total = sum(t.numel() * t.element_size() for _, t in tensors)
        if tensors and total <= self._CONTENT_HASH_BYTES:
            h = hashlib.sha256()
            for _, t in tensors:
                h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            key += (h.hexdigest(),)
        return key

    def invalidate(self) -> None:
        """Forgets the programs compiled so far (the disk cache still serves unchanged graphs)."""
        with self._lock:
            self.programs.clear()

    def program_for(self, args: Tuple) -> Program:
        import torch

        from .frontend.exporter import export

        key = (self._key(args), self._weights_key())
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
            for piece in graph.iter_blob():
                h.update(piece)
            digest = h.hexdigest()
            opts = sorted(self.options.items())
            digest = hashlib.sha256((digest + repr(opts)).encode()).hexdigest()[:32]
            out = os.path.join(self.cache_dir, "jit", digest)
            try:
                prog = load(out)
            except Exception:  # missing or stale: compile afresh
                prog = self._build(graph, out)
            # Programs for older weights of the same shapes are dropped.
            for k in [k for k in self.programs if k[0] == key[0]]:
                del self.programs[k]
            self.programs[key] = prog
            return prog

    def _build(self, graph: Any, out: str) -> Program:
        """Builds into a private directory beside `out`, then publishes it atomically."""
        parent = os.path.dirname(out)
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=os.path.basename(out) + ".build-", dir=parent)
        try:
            gpath = os.path.join(tmp, "graph.cgraph")
            graph.write(gpath)
            build_graph(gpath, tmp, cache_dir=self.cache_dir, **{k: v for k, v in self.options.items() if k != "threads"})
            os.remove(gpath)
            if os.path.isdir(out):  # a stale artifact (failed to load above): replace it
                stale = tempfile.mkdtemp(prefix=os.path.basename(out) + ".stale-", dir=parent)
                try:
                    os.rename(out, os.path.join(stale, "a"))
                except OSError:
                    pass  # another process moved it first
                shutil.rmtree(stale, ignore_errors=True)
            try:
                os.rename(tmp, out)
            except OSError:
                pass  # another process published the same program first: use theirs
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return load(out, threads=self.options.get("threads"))

    def __call__(self, *args: Any):
        import numpy as np

        torch_in = any(type(a).__module__.startswith("torch") for a in args)
        prog = self.program_for(args)
        arrays = [to_numpy(a.cpu()) if hasattr(a, "detach") else np.asarray(a) for a in args]
        result = prog(*arrays)
        if not torch_in:
            return result
        import torch

        if isinstance(result, tuple):
            return tuple(from_numpy(r) for r in result)
        return from_numpy(result)


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
