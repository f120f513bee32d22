"""CUDA and Metal artifacts on the CPU SIMT emulator: ``chroma.load(directory, emulate=True)``.

A CUDA artifact (``chroma.compile(..., target="cuda", out=dir)``) is the GPU generator's
package (docs/webgpu_package.md, with ``"dialect": "cuda"``: the kernels are CUDA C++) beside
the artifact directory, which holds ``kernels.cu`` (every kernel in one translation unit, what
nvcc compiles) and the emulator's library: the same text compiled as C++ against
``include/chroma/simt`` when the artifact was compiled (the loader compiles nothing). Each
workgroup's invocations run as fibers, with barriers and 32-lane subgroup operations as
rendezvous points (docs/cuda.md, "The emulator").

This runtime replays the package's schedule as a GPU runtime would: device buffers are NumPy
word arrays (the arena with its status block, the state, the weights shards, the parameter
words), each dispatch one call into the library with its grid, storage slots and parameters.
It is slow (a fiber switch per invocation per barrier) and exists for testing: every kernel
the CUDA target generates runs, and is checked against PyTorch, on machines without a GPU.
``reverse=True`` runs each workgroup's invocations last to first, exposing missing barriers.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any, Dict, List, Optional, Union

import numpy as np

from ..errors import ArtifactError, PackageError, RunError
from .artifact import read_artifact_package, verified_library
from .gpu import GpuProgram
from .package import STATUS_BYTES, Package

__all__ = ["EmulatedProgram", "load_artifact"]


class EmulatedProgram(GpuProgram):
    """A CUDA or Metal package run by the CPU SIMT emulator, with the library the artifact's
    compile built from its kernels. Called like every GPU program (NumPy arrays in,
    positionally or by name; one array or a tuple out)."""

    _dialects, _kind = ("cuda", "metal"), "emulator"

    def __init__(self, package: Union[Package, str, os.PathLike, bytes], library: str, *, reverse: bool = False):
        t0 = time.perf_counter()
        p = self._open(package)
        self.reverse = bool(reverse)
        try:
            self._lib = ctypes.CDLL(os.path.abspath(library))
        except OSError as e:
            raise ArtifactError(f"{library}: the emulator's library does not load ({e})") from None
        launch = self._lib.chroma_simt_launch
        launch.restype = ctypes.c_int
        launch.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p),
                           ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_void_p, ctypes.c_int]
        self._launch = launch
        fault = self._lib.chroma_simt_fault
        fault.restype = ctypes.c_int
        fault.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_longlong), ctypes.POINTER(ctypes.c_ulonglong)]
        self._fault = fault
        modules = self._lib.chroma_simt_modules()
        if modules != len(p.kernels):
            raise ArtifactError(f"{library}: holds {modules} kernels, the package {p.where} {len(p.kernels)}")
        # Device memory: word arrays (one spare word so that an empty buffer has an address).
        try:
            self._arena = np.zeros(p.arena_bytes // 4 + 1, np.uint32)
            self._state = np.zeros(p.state_bytes // 4 + 1, np.uint32)
        except MemoryError:
            raise RunError(f"{p.where}: the emulator cannot allocate the package's arena ({p.arena_bytes} bytes) and "
                           f"state ({p.state_bytes} bytes)") from None
        self._write_state()
        self._shards = [np.frombuffer(p.section(off, nb), np.uint8).copy().view(np.uint32) if nb % 4 == 0 else
                        np.frombuffer(bytes(p.section(off, nb)) + bytes(-nb % 4), np.uint32).copy()
                        for off, nb in p.shards]
        self._params = np.frombuffer(bytes(p.section(p.params_offset, p.params_bytes)) + bytes(4), np.uint32).copy()
        self._schedules = [self._plan(e.dispatches) for e in p.entries]
        self._schedule = self._schedules[0]
        self._info = {"emulator": os.path.basename(library), "kernels": len(p.kernels), "dispatches": len(p.dispatches),
                      "entries": [e.name for e in p.entries], "reverse": self.reverse,
                      "load_seconds": time.perf_counter() - t0,
                      "buffer_bytes": {"arena": p.arena_bytes, "state": p.state_bytes,
                                       "weights": sum(nb for _, nb in p.shards), "params": p.params_bytes}}

    def _plan(self, dispatches: List[dict]) -> list:
        """One entry's schedule: (kernel, grid x, grid y, slot addresses, parameter address)."""
        p = self.package
        schedule = []
        for d in dispatches:
            if d["kernel"] < 0:  # a library gemm: "cuBLAS" through NumPy's matmul (the CPU BLAS)
                mats = []
                for n, name, (r, c) in ((1, "a", ("m", "k")), (2, "b", ("k", "n")), (3, "c", ("m", "n"))):
                    buf = d["bindings"][n]
                    arr = self._shards[buf[1]] if isinstance(buf, tuple) else self._arena if buf == "arena" else self._state
                    o, lib = d["library"][name], d["library"]
                    mats.append(np.lib.stride_tricks.as_strided(
                        arr.view(np.float32)[o["word"]:], (lib["batch"], lib[r], lib[c]),
                        (4 * o["batch_stride"], 4 * o["row_stride"], 4 * o["col_stride"])))
                schedule.append((-1, 0, 0, mats, None))
                continue
            slots, words = [], []
            for n in sorted(d["bindings"]):  # slot s is binding s + 1 (binding 0: the parameters)
                buf = d["bindings"][n]
                arr = self._shards[buf[1]] if isinstance(buf, tuple) else self._arena if buf == "arena" else self._state
                slots.append(arr.ctypes.data)
                # The buffer's own words (the arena and state carry a spare one): kernels index
                # no further (the emulator checks every access; a GPU's memory protection would).
                nbytes = p.shards[buf[1]][1] if isinstance(buf, tuple) else \
                    p.arena_bytes if buf == "arena" else p.state_bytes
                words.append(nbytes // 4)
            params = self._params.ctypes.data + (d["params"][1] if d["params"] else 0)
            gx, gy, gz = d["grid"]
            if gz != 1:
                raise PackageError(f"{p.where}: dispatch grid {list(d['grid'])}: the emulator runs 2-D grids")
            schedule.append((d["kernel"], gx, gy, ((ctypes.c_void_p * max(1, len(slots)))(*slots),
                                                   (ctypes.c_ulonglong * max(1, len(words)))(*words)), params))
        return schedule

    def _write_state(self) -> None:
        raw = self._state.view(np.uint8)
        for _, off, nb, init in self.package.state:
            raw[off:off + nb] = np.frombuffer(self.package.section(init, nb), np.uint8)

    def reset_state(self) -> None:
        """Restores every state tensor (KV caches) to its initial value."""
        with self._lock:
            self._write_state()

    def _dispatch(self, i: int, schedule: Optional[list] = None) -> None:
        k, gx, gy, slots, params = (self._schedule if schedule is None else schedule)[i]
        if k < 0:
            a, b, c = slots
            c[...] = np.matmul(a, b)  # float32 in, float32 accumulation (OpenBLAS sgemm)
            return
        if not (gx and gy):
            return
        rc = self._launch(k, gx, gy, slots[0], slots[1], params, int(self.reverse))
        if rc == -1:
            raise RunError(f"{self.package.where}: dispatch {i}: the emulator has no kernel {k}")
        if rc != 0:
            slot, index, words = ctypes.c_int(), ctypes.c_longlong(), ctypes.c_ulonglong()
            self._fault(ctypes.byref(slot), ctypes.byref(index), ctypes.byref(words))
            raise RunError(f"{self.package.where}: dispatch {i} (kernel {k}) indexed word {index.value} of its storage "
                           f"slot {slot.value}, outside the buffer's {words.value} words (the package's parameters "
                           f"point past its buffers; the access was not made)")

    def _call_entry(self, index: int, arrays: tuple, named: dict):
        e = self.package.entries[index]
        words = self._words(arrays, named, e.inputs)
        p = self.package
        schedule = self._schedules[index]
        with self._lock:
            if self._lost:
                raise RunError(f"{p.where}: {self._lost}")
            raw = self._arena.view(np.uint8)
            for t, w in zip(e.inputs, words):
                if t.nbytes:
                    raw[t.offset:t.offset + t.nbytes] = np.frombuffer(w, np.uint8)
            raw[p.status_offset:p.status_offset + STATUS_BYTES] = 0
            for i in range(len(schedule)):
                self._dispatch(i, schedule)
            status = raw[p.status_offset:p.status_offset + 20].view("<u4").copy()
            outs = [t.decode(raw[t.offset:t.offset + t.nbytes].tobytes()) for t in e.outputs]
            self._calls += 1
        self._status(status, e.dispatches)
        return outs[0] if e.single else tuple(outs)

    def profile(self, *arrays: Any, iters: int = 1, **named: Any) -> List[Dict[str, Any]]:
        """Each dispatch's emulated time (the median of `iters` calls), slowest first. These are
        CPU-emulation seconds, useful only to find which kernel the emulator spends its time in."""
        words = self._words(arrays, named)
        p = self.package
        times = [[] for _ in self._schedule]
        with self._lock:
            raw = self._arena.view(np.uint8)
            for _ in range(max(1, iters)):
                for t, w in zip(self.inputs, words):
                    if t.nbytes:
                        raw[t.offset:t.offset + t.nbytes] = np.frombuffer(w, np.uint8)
                for i in range(len(self._schedule)):
                    t0 = time.perf_counter()
                    self._dispatch(i)
                    times[i].append(time.perf_counter() - t0)
        rows = [{"dispatch": i, "kernel": d["kernel"], "label": d["label"], "node": d["node"], "source": d["source"],
                 "ms": float(np.median(times[i])) * 1e3} for i, d in enumerate(p.dispatches)]
        return sorted(rows, key=lambda r: -r["ms"])

    def close(self) -> None:
        """Releases the buffers; later calls raise RunError."""
        with self._lock:
            self._lost = "the program was closed"
            self._schedule = []


def load_artifact(directory: str, manifest: dict, mpath: str, options: Any) -> EmulatedProgram:
    """A CUDA or Metal artifact directory on the emulator (the registry's loader for
    ``emulate=True``): the package beside the directory, the library in it, both checked
    against the manifest's digests before anything is loaded."""
    package = read_artifact_package(directory, manifest, mpath)
    lib = verified_library(directory, manifest.get("emulator"), "emulator", mpath, "emulator's library")
    prog = EmulatedProgram(package, lib, reverse=options.reverse)
    prog.manifest, prog.directory = manifest, directory
    return prog
