"""Loading and running compiled artifacts. Needs only NumPy (never imports torch)."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["Program", "load", "ArtifactError", "ARTIFACT_VERSION", "ABI_VERSION"]

ARTIFACT_VERSION = 1
ABI_VERSION = 1

_DTYPES = {
    "float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32,
    "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_,
}


class ArtifactError(ValueError):
    """A corrupt, truncated, incomplete or mismatched artifact."""


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _field(m: dict, path: str, where: str):
    cur: Any = m
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise ArtifactError(f"{where}: missing field '{path}'")
        cur = cur[part]
    return cur


class _Spec:
    def __init__(self, d: dict, where: str):
        self.name = str(d.get("name", ""))
        dt = d.get("dtype")
        if dt not in _DTYPES:
            raise ArtifactError(f"{where}: unknown dtype {dt!r}")
        self.dtype = np.dtype(_DTYPES[dt])
        self.shape = tuple(int(s) for s in d.get("shape", []))

    def __repr__(self):
        return f"{self.name}: {self.dtype}{list(self.shape)}"


class Program:
    """A compiled model, loaded. Call it with NumPy arrays (or anything np.asarray takes)."""

    def __init__(self, directory: str, manifest: dict, module: Any, threads: Optional[int] = None):
        self.directory = directory
        self.manifest = manifest
        self._module = module
        self.inputs = [_Spec(d, f"manifest input {i}") for i, d in enumerate(manifest["inputs"])]
        self.outputs = [_Spec(d, f"manifest output {i}") for i, d in enumerate(manifest["outputs"])]
        self._structure = manifest.get("output_structure", "single")
        self._lock = threading.Lock()
        try:
            self._handle = module.open(directory, int(threads or 0))
        except ValueError as e:
            raise ArtifactError(f"{directory}: {e}") from None

    @property
    def threads(self) -> int:
        """Threads this program runs on (the calling thread included)."""
        return self._module.num_threads(self._handle)

    @property
    def stats(self) -> Dict[str, Any]:
        """Kernels, fused expressions, folded constants, arena / weight / output bytes."""
        return dict(self.manifest["stats"])

    def __repr__(self):
        return f"Program({self.directory!r}, inputs={self.inputs}, outputs={self.outputs})"

    def _check_input(self, i: int, a: Any) -> np.ndarray:
        spec = self.inputs[i]
        arr = np.asarray(a)
        if arr.dtype != spec.dtype or arr.shape != spec.shape:
            raise ValueError(
                f"input {i} ('{spec.name}'): expected {spec.dtype}{list(spec.shape)}, "
                f"got {arr.dtype}{list(arr.shape)}")
        return np.ascontiguousarray(arr)

    def _check_out(self, out: Any) -> List[np.ndarray]:
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        if len(outs) != len(self.outputs):
            raise ValueError(f"out=: expected {len(self.outputs)} arrays, got {len(outs)}")
        for i, (o, spec) in enumerate(zip(outs, self.outputs)):
            if not isinstance(o, np.ndarray):
                raise TypeError(f"out[{i}]: expected a numpy.ndarray, got {type(o).__name__}")
            if o.dtype != spec.dtype or o.shape != spec.shape:
                raise ValueError(f"out[{i}]: expected {spec.dtype}{list(spec.shape)}, got {o.dtype}{list(o.shape)}")
            if not (o.flags.c_contiguous and o.flags.writeable):
                raise ValueError(f"out[{i}]: must be C-contiguous and writeable")
        return outs

    def __call__(self, *arrays: Any, out: Any = None):
        if len(arrays) != len(self.inputs):
            names = ", ".join(s.name for s in self.inputs)
            raise TypeError(f"expected {len(self.inputs)} inputs ({names}), got {len(arrays)}")
        ins = [self._check_input(i, a) for i, a in enumerate(arrays)]
        if out is not None:
            outs = self._check_out(out)
            # Kernels write outputs while reading inputs: an input that overlaps an out=
            # buffer is copied first so the result is what it would be without aliasing.
            ins = [a.copy() if any(np.may_share_memory(a, o) for o in outs) else a for a in ins]
        else:
            outs = [np.empty(s.shape, s.dtype) for s in self.outputs]
        with self._lock:
            self._module.run(self._handle, ins, outs)
        if self._structure == "single" and len(outs) == 1:
            return outs[0]
        return tuple(outs)


def _load_module(path: str):
    loader = importlib.machinery.ExtensionFileLoader("chroma_model", path)
    spec = importlib.util.spec_from_file_location("chroma_model", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load(directory: Union[str, os.PathLike], *, verify: bool = True, threads: Optional[int] = None) -> Program:
    """Loads an artifact directory written by chroma.compile.

    ``threads``: how many threads the program runs on, the caller's included (default:
    $CHROMA_NUM_THREADS if set, else one per core). Large memory-bound matrix products are
    split between them; OpenBLAS (a process-wide setting) is given the same count.

    Checks the manifest's format and version, the ABI version, the library's and the
    weights' SHA-256 digests and the generated source's digest; raises ArtifactError
    naming the file and field that do not match.
    """
    directory = os.fspath(directory)
    mpath = os.path.join(directory, "manifest.json")
    if not os.path.isfile(mpath):
        raise ArtifactError(f"{directory}: not a Chroma artifact (no manifest.json)")
    try:
        with open(mpath, "r", encoding="utf-8") as f:
            manifest = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{mpath}: corrupt JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != "chroma.artifact":
        raise ArtifactError(f"{mpath}: field 'format' is {manifest.get('format') if isinstance(manifest, dict) else None!r}, expected 'chroma.artifact'")
    version = manifest.get("version")
    if version != ARTIFACT_VERSION:
        raise ArtifactError(f"{mpath}: artifact format version {version} is not supported (this runtime reads version {ARTIFACT_VERSION})")
    abi = _field(manifest, "abi_version", mpath)
    if abi != ABI_VERSION:
        raise ArtifactError(f"{mpath}: ABI version {abi} does not match this runtime's {ABI_VERSION}")
    for key in ("inputs", "outputs", "stats", "library.file", "library.sha256", "weights.file", "weights.sha256",
                "source.digest"):
        _field(manifest, key, mpath)
    lib = os.path.join(directory, manifest["library"]["file"])
    if not os.path.isfile(lib):
        raise ArtifactError(f"{directory}: library {manifest['library']['file']} is missing")
    if verify:
        digest = _sha256(lib)
        if digest != manifest["library"]["sha256"]:
            raise ArtifactError(f"{lib}: SHA-256 {digest} does not match manifest field library.sha256 "
                                f"({manifest['library']['sha256']}): corrupt or from another build")
        wpath = os.path.join(directory, manifest["weights"]["file"])
        if manifest["weights"].get("bytes", 0) and not os.path.isfile(wpath):
            raise ArtifactError(f"{directory}: weights file {manifest['weights']['file']} is missing")
    try:
        module = _load_module(lib)
    except ImportError as e:
        raise ArtifactError(f"{lib}: cannot load the library ({e})") from None
    if module.abi_version() != ABI_VERSION:
        raise ArtifactError(f"{lib}: library ABI {module.abi_version()} does not match the runtime's {ABI_VERSION}")
    if module.source_digest() != manifest["source"]["digest"]:
        raise ArtifactError(f"{lib}: built from source {module.source_digest()}, but manifest field source.digest "
                            f"says {manifest['source']['digest']}")
    if module.weights_digest() != manifest["weights"]["sha256"]:
        raise ArtifactError(f"{mpath}: field weights.sha256 ({manifest['weights']['sha256']}) does not match the "
                            f"weights {lib} was built for ({module.weights_digest()})")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise ValueError(f"threads={threads!r}: expected a positive integer or None")
    return Program(directory, manifest, module, threads)
