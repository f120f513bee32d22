"""The GPU runtimes' common part: what every runtime of a GPU package does the same way,
whatever runs the kernels (WebGPU on wgpu, CUDA or Metal through an artifact's host library,
or the CPU SIMT emulator). Each is a sibling subclass of GpuProgram: it loads the package's
buffers, kernels and schedule its own way and implements `_call_entry` (replay one entry
point's schedule: inputs in, the status block cleared, every dispatch, the status block and the
outputs out), `reset_state` and `close`; the base checks the inputs against the package
(`_words`), names a bad index from the status block (`_bad_index`), runs the self-check on the
golden data, and gives entries, `stats` and `info`.

Runtime layer: imports the package validator and the errors."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple, Union

import ml_dtypes
import numpy as np

from ..errors import IndexOutOfRange, PackageError, RunError, UnsupportedInput
from .package import Package, PackageEntry, Tensor, read_package

__all__ = ["GpuProgram", "GpuEntry"]

_I32 = np.iinfo(np.int32)


class GpuEntry:
    """One entry point of a loaded GPU program (``prog.entry("step")``): called like the
    program, with its own inputs and outputs; ``out=`` (one output) receives the result."""

    def __init__(self, prog: Any, index: int, e: PackageEntry):
        self._prog, self._index, self.name, self.inputs, self.outputs = prog, index, e.name, e.inputs, e.outputs

    def __call__(self, *arrays: Any, out: Optional[np.ndarray] = None, **named: Any):
        res = self._prog._call_entry(self._index, arrays, named)
        if out is not None:
            if isinstance(res, tuple):
                raise TypeError(f"entry '{self.name}': out= takes one output, this entry returns {len(res)}")
            np.copyto(out, res)
            return out
        return res

    def __repr__(self):
        return f"GpuEntry({self.name!r}, inputs={self.inputs}, outputs={self.outputs})"


class GpuProgram:
    """A GPU package, loaded. Call it with NumPy arrays (positionally, or by input name); it
    returns one array, or a tuple when the model returns several. ``prog.entry(name)`` gives
    the other entry points of a package that has several. Calls are serialized.

    Subclasses set `_dialects` (the package dialects they run) and `_kind` (their name in
    messages), call `_open(package)` first in their constructor, then load."""

    _dialects: Tuple[str, ...] = ()
    _kind = "GPU"

    def _open(self, package: Union[Package, str, bytes, Any]) -> Package:
        """Reads and checks the package (unless given a checked one) and sets the common state."""
        self.package = p = package if isinstance(package, Package) else read_package(package)
        if p.dialect not in self._dialects:
            raise PackageError(f"{p.where}: a {p.dialect} package; the {self._kind} runtime runs "
                               f"{' and '.join(self._dialects)} packages")
        self.inputs, self.outputs = p.inputs, p.outputs
        self._lock = threading.Lock()
        self._lost: Optional[str] = None
        self._calls = 0
        self._single = p.entries[0].single
        self.entries = [GpuEntry(self, i, e) for i, e in enumerate(p.entries)]
        return p

    def __repr__(self):
        return f"{type(self).__name__}({self.package.where!r}, inputs={self.inputs}, outputs={self.outputs})"

    @property
    def stats(self) -> Dict[str, Any]:
        """The compiler's statistics from the manifest (kernels, dispatches, arena bytes...)."""
        return dict(self.package.manifest.get("stats", {}))

    @property
    def info(self) -> Dict[str, Any]:
        """What this runtime did: the adapter, seconds to load (all of it) and to create the
        pipelines, kernel, dispatch and pipeline counts, bytes of each GPU buffer, calls made."""
        return dict(self._info, calls=self._calls)

    def entry(self, name: str) -> GpuEntry:
        """The entry point `name` (a decoder's "prefill" or "step")."""
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(f"{self.package.where}: no entry '{name}' (entries: {', '.join(e.name for e in self.entries)})")

    def _words(self, args: Tuple[Any, ...], named: Dict[str, Any], inputs: Optional[List[Tensor]] = None) -> List[np.ndarray]:
        """The inputs (of `inputs`, default the first entry's), checked against the manifest, as
        the arena stores them."""
        inputs = self.inputs if inputs is None else inputs
        names = [t.name for t in inputs]
        if len(args) > len(names):
            raise TypeError(f"expected {len(names)} inputs ({', '.join(names)}), got {len(args)}")
        given = dict(zip(names, args))
        for k, v in named.items():
            if k not in names:
                raise TypeError(f"unknown input '{k}' (the inputs are: {', '.join(names)})")
            if k in given:
                raise TypeError(f"input '{k}' given twice")
            given[k] = v
        missing = [n for n in names if n not in given]
        if missing:
            raise TypeError(f"missing inputs {missing} (expected {len(names)}: {', '.join(names)})")
        words = []
        for i, t in enumerate(inputs):
            a = np.asarray(given[t.name])
            if a.dtype != t.dtype or a.shape != t.shape:
                raise ValueError(f"input {i} ('{t.name}'): expected {t.dtype}{list(t.shape)}, "
                                 f"got {a.dtype}{list(a.shape)}")
            if t.dtype == np.int64 and a.size and (a.min() < _I32.min or a.max() > _I32.max):
                j = np.unravel_index(np.argmax((a < _I32.min) | (a > _I32.max)), a.shape)
                raise UnsupportedInput(f"input {i} ('{t.name}'): int64 value {a[j]} at {tuple(int(x) for x in j)} does not "
                                 f"fit in int32, which GPU packages store int64 tensors as")
            words.append(t.encode(a))
        return words

    def __call__(self, *arrays: Any, **named: Any):
        return self._call_entry(0, arrays, named)

    def _call_entry(self, index: int, arrays: tuple, named: dict):
        raise NotImplementedError

    def reset_state(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _status(self, status: np.ndarray, dispatches: List[dict]) -> None:
        """Raises IndexOutOfRange when the status block (its first five words) reports one."""
        if status[0]:
            raise IndexOutOfRange(self._bad_index(int(status[1]) - 1, int(status[2].view(np.int32)), int(status[3]),
                                                  int(status[4]), dispatches))

    def _bad_index(self, i: int, index: int, size: int, axis: int, dispatches: Optional[List[dict]] = None) -> str:
        what = f"index {index} is out of range for dimension {axis} of size {size}"
        dispatches = self.package.dispatches if dispatches is None else dispatches
        if not 0 <= i < len(dispatches):
            return f"{self.package.where}: a kernel reported that {what} (unknown dispatch {i})"
        d = dispatches[i]
        return f"{self.package.where}: dispatch {i} ({d['label']}, node {d['node'] or '?'}, at {d['source'] or '?'}): {what}"

    def self_check(self) -> Dict[str, Any]:
        """Runs the package on its golden inputs and compares with the golden outputs PyTorch
        computed: floats within |y - golden| <= atol + rtol * |golden| (NaN matches NaN,
        infinities match by sign), integers and bools equal. Restores the initial state before
        the run and after it. Returns {'ok', 'max_error', 'tolerance', 'outputs': [{'name',
        'ok', 'max_error', 'mismatches'} per output]}; a mismatched NaN or infinity counts as
        an infinite error."""
        if self.package.golden is None:
            raise RunError(f"{self.package.where}: the package has no golden data")
        tol = self.package.golden[2]
        self.reset_state()
        try:
            got = self(*self.package.golden_inputs())
        finally:
            self.reset_state()
        rows = []
        for t, gt, y, g in zip(self.outputs, self.package.golden[1], [got] if self._single else got,
                               self.package.golden_outputs()):
            y, g = y.reshape(-1)[::gt.stride].astype(np.float64), g.reshape(-1).astype(np.float64)
            if t.dtype.kind == "f" or t.dtype == ml_dtypes.bfloat16:  # (bfloat16 is kind "V")
                finite = np.isfinite(y) & np.isfinite(g)
                special = (np.isnan(y) & np.isnan(g)) | (np.isinf(g) & (y == g))
                with np.errstate(invalid="ignore"):
                    diff = np.abs(np.where(finite, y - g, 0.0))
                err = np.where(finite, diff, np.where(special, 0.0, np.inf))
                bad = ~special & ~(finite & (diff <= tol["atol"] + tol["rtol"] * np.abs(np.where(finite, g, 0.0))))
            else:
                err = np.abs(y - g)
                bad = err != 0
            rows.append({"name": t.name, "ok": not bad.any(), "max_error": float(err.max()) if err.size else 0.0,
                         "mismatches": int(bad.sum())})
        return {"ok": all(r["ok"] for r in rows), "max_error": max((r["max_error"] for r in rows), default=0.0),
                "tolerance": dict(tol), "outputs": rows}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
