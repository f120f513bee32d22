"""The CPU runtime: a CPU artifact's library (the generated kernels and the runtime, a Python
extension module) loaded and called with NumPy arrays. Needs only NumPy (never imports torch).
Runtime layer: `chroma.runtime.registry` calls `load_artifact` for a manifest whose target is
"cpu"."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import itertools
import os
import sys
import threading
from typing import Any, Dict, List, Optional

import ml_dtypes
import numpy as np

from ..errors import ArtifactError
from .package import sha256_file as _sha256

__all__ = ["Program", "Entry", "load_artifact", "ArtifactError", "ARTIFACT_VERSION", "ABI_VERSION"]

ARTIFACT_VERSION = 3
ABI_VERSION = 3

_DTYPES = {
    "float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32,
    "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_,
    "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,  # NumPy has no bfloat16: ml_dtypes' (PyPI)
}


_TREE_CHUNK = 16 << 20


def _tree_digest(path: str) -> str:
    """The weights file's digest, sha256-tree-16MiB (docs/artifact_format.md): SHA-256 over
    a 16-byte header, the length (u64 little-endian) and the SHA-256 of each 16 MiB chunk."""
    size = os.path.getsize(path)
    h = hashlib.sha256(b"chroma-tree-v1\0\0" + size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_TREE_CHUNK), b""):
            h.update(hashlib.sha256(chunk).digest())
    return h.hexdigest()


def _field(m: dict, path: str, where: str):
    cur: Any = m
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise ArtifactError(f"{where}: missing field '{path}'")
        cur = cur[part]
    return cur


def _refcounts(arrays: List[np.ndarray]) -> List[int]:
    """Each array's reference count as seen from here (the list's slot and the argument)."""
    return [sys.getrefcount(arrays[i]) for i in range(len(arrays))]


# What _refcounts gives for an array only its list refers to, measured the same way rather
# than assumed: interpreters differ in how they count the argument's reference.
_UNSHARED = _refcounts([np.empty(1)])[0]


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


class Entry:
    """One entry point of a loaded artifact (``forward``; or ``prefill`` and ``step``).

    Call it with NumPy arrays. Entries of one Program share its weights, its persistent
    state (KV caches) and its threads; calls are serialized.
    """

    def __init__(self, program: "Program", index: int, desc: dict):
        self.program = program
        self.index = index
        self.name = str(desc.get("name", "forward"))
        where = f"manifest entry '{self.name}'"
        self.inputs = [_Spec(d, f"{where} input {i}") for i, d in enumerate(desc["inputs"])]
        self.outputs = [_Spec(d, f"{where} output {i}") for i, d in enumerate(desc["outputs"])]
        self._structure = desc.get("output_structure", "single")
        self.manifest = desc
        self._spare: Optional[List[np.ndarray]] = None  # see _outputs

    def __repr__(self):
        return f"Entry({self.name!r}, inputs={self.inputs}, outputs={self.outputs})"

    @property
    def stats(self) -> Dict[str, Any]:
        """Kernels, fused expressions, folded constants, arena / weight / output bytes."""
        return dict(self.manifest["stats"])

    def _check_input(self, i: int, a: Any) -> np.ndarray:
        spec = self.inputs[i]
        arr = np.asarray(a)
        if arr.dtype != spec.dtype or arr.shape != spec.shape:
            raise ValueError(
                f"{self._what()}input {i} ('{spec.name}'): expected {spec.dtype}{list(spec.shape)}, "
                f"got {arr.dtype}{list(arr.shape)}")
        return np.ascontiguousarray(arr)

    def _what(self) -> str:
        return "" if len(self.program.entries) == 1 else f"entry '{self.name}': "

    def _check_out(self, out: Any) -> List[np.ndarray]:
        """Checks out= arrays: the right dtypes and shapes, writeable, and no two overlapping
        (each kernel writes its output in place: one would clobber the other)."""
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        if len(outs) != len(self.outputs):
            raise ValueError(f"{self._what()}out=: expected {len(self.outputs)} arrays, got {len(outs)}")
        for i, (o, spec) in enumerate(zip(outs, self.outputs)):
            if not isinstance(o, np.ndarray):
                raise TypeError(f"out[{i}]: expected a numpy.ndarray, got {type(o).__name__}")
            if o.dtype != spec.dtype or o.shape != spec.shape:
                raise ValueError(f"out[{i}]: expected {spec.dtype}{list(spec.shape)}, got {o.dtype}{list(o.shape)}")
            if not (o.flags.c_contiguous and o.flags.writeable):
                raise ValueError(f"out[{i}]: must be C-contiguous and writeable")
        for i in range(len(outs)):
            for j in range(i):
                if np.may_share_memory(outs[i], outs[j]):
                    raise ValueError(f"out[{j}] and out[{i}] overlap: each output needs its own memory")
        return outs

    def _prepare(self, arrays, out):
        if len(arrays) != len(self.inputs):
            names = ", ".join(s.name for s in self.inputs)
            raise TypeError(f"{self._what()}expected {len(self.inputs)} inputs ({names}), got {len(arrays)}")
        ins = [self._check_input(i, a) for i, a in enumerate(arrays)]
        if out is not None:
            outs = self._check_out(out)
            # Kernels write outputs while reading inputs: an input that overlaps an out=
            # buffer is copied first so the result is what it would be without aliasing.
            ins = [a.copy() if any(np.may_share_memory(a, o) for o in outs) else a for a in ins]
        else:
            outs = None  # chosen under the program's lock: _outputs
        return ins, outs

    def _outputs(self) -> List[np.ndarray]:
        """Arrays for a call's outputs when the caller gave no out=. Called under the lock.

        The previous call's arrays are used again when nothing outside this entry refers to
        them any more (no name, no container, no view: a view holds its base): a large output
        allocated afresh on every call costs a page fault per 4 KiB written, for a decoder's
        logits more time than the kernels that fill them. An array the caller still holds is
        never written to.
        """
        spare, self._spare = self._spare, None
        if spare is not None and all(c == _UNSHARED for c in _refcounts(spare)):
            outs = spare
        else:
            outs = [np.empty(s.shape, s.dtype) for s in self.outputs]
        self._spare = outs
        return outs

    def __call__(self, *arrays: Any, out: Any = None):
        ins, outs = self._prepare(arrays, out)
        p = self.program
        with p._lock:
            if outs is None:
                outs = self._outputs()
            p._module.run(p._handle, self.index, ins, outs)
        if self._structure == "single" and len(outs) == 1:
            return outs[0]
        return tuple(outs)

    def profile(self, *arrays: Any, iters: int = 10) -> List[Dict[str, Any]]:
        """Runs `iters` times; returns each kernel's mean seconds with its label, slowest first.

        Note: the calls update the program's state, as ordinary calls do.
        """
        ins, outs = self._prepare(arrays, None)
        p = self.program
        with p._lock:
            outs = self._outputs()
            secs = p._module.run(p._handle, self.index, ins, outs, int(iters))
        kernels = self.manifest.get("kernels", [])
        rows = [{"index": i, "seconds": t, "label": kernels[i]["label"] if i < len(kernels) else "",
                 "kind": kernels[i]["kind"] if i < len(kernels) else "",
                 "source": kernels[i].get("source", "") if i < len(kernels) else ""} for i, t in enumerate(secs)]
        return sorted(rows, key=lambda r: -r["seconds"])


class Program:
    """A compiled model, loaded. Call it with NumPy arrays (or anything np.asarray takes).

    Calling the Program runs its first entry point; ``prog.entry("step")`` gives the others.
    """

    def __init__(self, directory: str, manifest: dict, module: Any, threads: Optional[int] = None):
        self.directory = directory
        self.manifest = manifest
        self._module = module
        self.entries = [Entry(self, i, d) for i, d in enumerate(manifest["entries"])]
        self._main = self.entries[0]
        self.inputs = self._main.inputs
        self.outputs = self._main.outputs
        self.state = [_Spec(d, f"manifest state {i}") for i, d in enumerate(manifest.get("state", []))]
        self._lock = threading.Lock()
        # Seconds per compile phase and the model cache's verdict, set by chroma.compile
        # (`chroma compile --timings` prints them); empty for a program chroma.load opened.
        self.timings: Dict[str, Any] = {}
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

    @property
    def accuracy(self) -> Optional[Dict[str, Any]]:
        """With quantized weights: the outputs on the example inputs against float32 PyTorch
        (per output relative L2, max abs, cosine; top-1 agreement and KL divergence over the
        last axis), as computed at compile time; None otherwise."""
        return self.manifest.get("accuracy")

    def entry(self, name: str) -> Entry:
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(f"{self.directory}: no entry point '{name}' (have: {', '.join(e.name for e in self.entries)})")

    def reset_state(self) -> None:
        """Restores every state tensor (KV caches) to its initial value."""
        with self._lock:
            self._module.reset_state(self._handle)

    def read_state(self, name: str) -> np.ndarray:
        """A copy of the state tensor `name`."""
        for i, s in enumerate(self.state):
            if s.name == name:
                a = np.empty(s.shape, s.dtype)
                with self._lock:
                    self._module.read_state(self._handle, i, a)
                return a
        raise KeyError(f"no state tensor '{name}' (have: {', '.join(s.name for s in self.state)})")

    def __repr__(self):
        if len(self.entries) > 1:
            return f"Program({self.directory!r}, entries={[e.name for e in self.entries]})"
        return f"Program({self.directory!r}, inputs={self.inputs}, outputs={self.outputs})"

    def __call__(self, *arrays: Any, out: Any = None):
        return self._main(*arrays, out=out)

    def profile(self, *arrays: Any, iters: int = 10) -> List[Dict[str, Any]]:
        """Per-kernel mean seconds of the first entry point (see Entry.profile)."""
        return self._main.profile(*arrays, iters=iters)


def _signature(manifest: dict, where: str) -> str:
    """The manifest's entries and state in the form the library's signature() reports."""
    def spec(d: Any, what: str) -> str:
        if not isinstance(d, dict) or not isinstance(d.get("shape"), list):
            raise ArtifactError(f"{where}: {what} is malformed")
        return f"{d.get('name', '')}:{d.get('dtype')}[{','.join(str(x) for x in d['shape'])}]"

    lines = []
    for i, e in enumerate(manifest["entries"]):
        if not isinstance(e, dict) or not isinstance(e.get("inputs"), list) or not isinstance(e.get("outputs"), list):
            raise ArtifactError(f"{where}: entries[{i}] is malformed")
        ins = ",".join(spec(d, f"entries[{i}].inputs") for d in e["inputs"])
        outs = ",".join(spec(d, f"entries[{i}].outputs") for d in e["outputs"])
        lines.append(f"entry {e.get('name', 'forward')}({ins})->({outs})\n")
    for s in manifest.get("state", []) or []:
        if not isinstance(s, dict):
            raise ArtifactError(f"{where}: field 'state' is malformed")
        lines.append(f"state {s.get('name', '')}:{s.get('bytes', '')}\n")
    return "".join(lines)


def _load_module(path: str):
    loader = importlib.machinery.ExtensionFileLoader("chroma_model", path)
    spec = importlib.util.spec_from_file_location("chroma_model", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load_artifact(directory: str, manifest: dict, mpath: str, options: Any) -> Program:
    """A CPU artifact directory (the registry's loader): checks the ABI version, the
    library's and the weights' SHA-256 digests (with ``options.verify``) and the generated
    source's digest, then loads the library; raises ArtifactError naming the file and field
    that do not match."""
    verify, threads = options.verify, options.threads
    abi = _field(manifest, "abi_version", mpath)
    if abi != ABI_VERSION:
        raise ArtifactError(f"{mpath}: ABI version {abi} does not match this runtime's {ABI_VERSION}")
    for key in ("entries", "inputs", "outputs", "stats", "library.file", "library.sha256", "weights.file", "weights.digest",
                "source.digest"):
        _field(manifest, key, mpath)
    for key in ("library", "weights"):
        name = manifest[key]["file"]
        # A bare file name inside the artifact directory: never a path that leads elsewhere.
        if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
                or "\0" in name or os.path.basename(name) != name):
            raise ArtifactError(f"{mpath}: field '{key}.file' ({name!r}) must name a file in the artifact directory")
    if not isinstance(manifest["entries"], list) or not manifest["entries"]:
        raise ArtifactError(f"{mpath}: field 'entries' must be a non-empty list")
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
    if module.weights_digest() != manifest["weights"]["digest"]:
        raise ArtifactError(f"{mpath}: field weights.digest ({manifest['weights']['digest']}) does not match the "
                            f"weights {lib} was built for ({module.weights_digest()})")
    want = _signature(manifest, mpath)
    have = module.signature()
    if want != have:
        diff = next(f"manifest says {a!r}, library has {b!r}" for a, b in
                    itertools.zip_longest(want.splitlines(), have.splitlines(), fillvalue="") if a != b)
        raise ArtifactError(f"{mpath}: the entry points and state the manifest describes do not match the ones "
                            f"compiled into {lib}: {diff}")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise ValueError(f"threads={threads!r}: expected a positive integer or None")
    try:
        return Program(directory, manifest, module, threads)
    except (KeyError, TypeError, AttributeError) as e:
        raise ArtifactError(f"{mpath}: malformed entry or state description ({type(e).__name__}: {e})") from None
