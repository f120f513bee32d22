"""BatchedProgram: a CPU artifact compiled for a batch range (chroma.compile(batch=...),
chroma/batching.py), as chroma.load returns it. NumPy only.

The artifact holds one entry point per batch size of a ladder (`ladder`: lo, the powers of two
between, hi), sharing one weights file. A call with b rows runs a plan (`plan`): the
smallest compiled size that holds b when at most PAD_WASTE of its rows would be padding
(copies of the last real row, whose results are dropped), else the largest compiled size
that fits, then the same for what is left. `batching.json` (docs/artifact_format.md) says
which entry serves which size.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

BATCHING_FILE = "batching.json"
FORMAT = "chroma.batching"
VERSION = 1
# A batch is padded up to a compiled size when at most this fraction of that size's rows
# would be padding; otherwise it is split.
PAD_WASTE = 0.125


def ladder(lo: int, hi: int) -> List[int]:
    """The batch sizes compiled for [lo, hi]: lo, every power of two between, hi."""
    sizes = {lo, hi}
    p = 1
    while p < hi:
        if p > lo:
            sizes.add(p)
        p *= 2
    return sorted(sizes)


def plan(b: int, sizes: Sequence[int]) -> List[Tuple[int, int]]:
    """How b rows run: [(compiled size, rows of the batch it takes)], in row order."""
    if b < 1:
        raise ValueError(f"a batch of {b} rows")
    sizes = sorted(sizes)
    out: List[Tuple[int, int]] = []
    rem = b
    while rem > 0:
        up = next((s for s in sizes if s >= rem), None)
        if up is not None and (up - rem) <= PAD_WASTE * up:
            out.append((up, rem))
            break
        down = max((s for s in sizes if s <= rem), default=None)
        if down is None:  # fewer rows than the smallest size: padded
            out.append((sizes[0], rem))
            break
        out.append((down, down))
        rem -= down
    return out


def entry_name(size: int) -> str:
    return f"batch_{size}"


def write_info(directory: str, lo: int, hi: int, sizes: Sequence[int]) -> Dict[str, Any]:
    info = {"format": FORMAT, "version": VERSION, "dim": 0, "range": [lo, hi],
            "entries": [{"batch": s, "entry": entry_name(s)} for s in sizes]}
    with open(os.path.join(directory, BATCHING_FILE), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    return info


def read_info(directory: str) -> Dict[str, Any]:
    """batching.json, checked field by field (ValueError naming the field)."""
    path = os.path.join(directory, BATCHING_FILE)
    with open(path, encoding="utf-8") as f:
        info = json.load(f)
    where = f"{path}"
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise ValueError(f"{where}: field 'format' is not {FORMAT!r}")
    if info.get("version") != VERSION:
        raise ValueError(f"{where}: field 'version' is {info.get('version')!r}, this Chroma reads {VERSION}")
    if info.get("dim") != 0:
        raise ValueError(f"{where}: field 'dim' must be 0")
    r = info.get("range")
    if not (isinstance(r, list) and len(r) == 2 and all(isinstance(v, int) for v in r) and 1 <= r[0] <= r[1]):
        raise ValueError(f"{where}: field 'range' must be [lo, hi] with 1 <= lo <= hi")
    es = info.get("entries")
    if not isinstance(es, list) or not es:
        raise ValueError(f"{where}: field 'entries' must be a non-empty list")
    for i, e in enumerate(es):
        if not (isinstance(e, dict) and isinstance(e.get("batch"), int) and e["batch"] >= 1
                and isinstance(e.get("entry"), str)):
            raise ValueError(f"{where}: entries[{i}] must be {{batch: int >= 1, entry: str}}")
    return info


class BatchedProgram:
    """A program compiled for a batch range: call it with arrays whose dimension 0 is the
    batch (the same number of rows in every input), any number of rows; returns what the
    model returns for the whole batch. Thread-safe (the entries' program serializes calls)."""

    def __init__(self, program: Any, info: Dict[str, Any]):
        self.program = program
        self.directory = program.directory
        self.range = tuple(info["range"])
        self._by_size = {}
        for e in info["entries"]:
            self._by_size[e["batch"]] = program.entry(e["entry"])
        self.sizes = sorted(self._by_size)
        largest = self._by_size[self.sizes[-1]]
        self.inputs = largest.inputs
        self.outputs = largest.outputs
        self.timings = getattr(program, "timings", {})

    @property
    def manifest(self) -> Dict[str, Any]:
        return self.program.manifest

    @property
    def stats(self) -> Dict[str, Any]:
        """The largest size's entry's stats (kernels, arena, weight bytes: shared)."""
        return self.program.stats

    @property
    def threads(self) -> int:
        return self.program.threads

    def __repr__(self) -> str:
        return f"BatchedProgram({self.directory!r}, batch={self.range}, sizes={self.sizes})"

    def plan(self, b: int) -> List[Tuple[int, int]]:
        """[(compiled size, rows)] for a batch of b rows."""
        return plan(b, self.sizes)

    def __call__(self, *arrays: Any) -> Any:
        arrays = [np.asarray(a) for a in arrays]
        if len(arrays) != len(self.inputs):
            raise ValueError(f"expected {len(self.inputs)} inputs, got {len(arrays)}")
        for i, (a, spec) in enumerate(zip(arrays, self.inputs)):
            if a.ndim != len(spec.shape) or a.ndim == 0:
                raise ValueError(f"input {i} ('{spec.name}'): {a.ndim} dimensions, expected {len(spec.shape)} "
                                 f"(batch first, then {list(spec.shape[1:])})")
            if a.shape[0] != arrays[0].shape[0]:
                raise ValueError(f"input {i} ('{spec.name}') has {a.shape[0]} rows, input 0 has {arrays[0].shape[0]}: "
                                 "every input's dimension 0 is the batch")
        b = arrays[0].shape[0]
        if b == 0:
            raise ValueError("a batch of 0 rows")
        results: List[List[np.ndarray]] = []
        single = None
        r0 = 0
        for size, rows in self.plan(b):
            chunk = [a[r0:r0 + rows] for a in arrays]
            if rows < size:  # pad with copies of the last row (results dropped)
                chunk = [np.concatenate([c, np.repeat(c[-1:], size - rows, axis=0)]) for c in chunk]
            out = self._by_size[size](*chunk)
            single = not isinstance(out, tuple)
            outs = [out] if single else list(out)
            results.append([o[:rows] for o in outs])
            r0 += rows
        merged = [r[0] if len(results) == 1 else np.concatenate(r) for r in zip(*results)]
        merged = [m if m.flags.owndata else m.copy() for m in merged]
        return merged[0] if single else tuple(merged)
