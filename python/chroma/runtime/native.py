"""CUDA and Metal artifacts on their GPU: ``chroma.load(directory)`` for an artifact compiled
with ``target="cuda"`` or ``target="metal"`` (docs/cuda.md, "The native runtime", "Metal").

The artifact's host library (include/chroma/cuda/host.h, built when the artifact was compiled,
with the fatbin nvcc made from ``kernels.cu`` embedded in it) talks to the NVIDIA driver through
the CUDA driver API. This module reads the GPU package (the same schedule the WebGPU runtime
and the emulator replay), creates the device buffers once (the arena with its status block,
the state, the weights shards), uploads the weights and the initial state, looks every kernel
up once, and hands the library each dispatch (kernel, grid, buffers in its storage slots,
parameter words). A call copies the inputs in, launches the whole schedule on one non-blocking
stream (or as one CUDA graph, ``graph=True``), and copies the status block and the outputs back.

Inputs may be NumPy arrays or device arrays (objects with ``__cuda_array_interface__``: CuPy,
PyTorch CUDA tensors, Numba), whose bytes are copied device to device; ``device_outputs=True``
returns `DeviceArray` objects that stay in GPU memory (``__cuda_array_interface__``, ``numpy()``).

Metal artifacts (``target="metal"``, compiled with CHROMA_METAL_CPP) go the same way through
their own host library (include/chroma/metal/host.h, on metal-cpp), whose C ABI is this one's
for what both do: `HostProgram` is that common part, `CudaProgram` and `MetalProgram` its two
siblings (CUDA adds library products through cuBLAS, device arrays and CUDA graphs).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Any, Dict, List, Tuple, Union

import numpy as np

from ..errors import ArtifactError, PackageError, RunError
from .artifact import package_file, read_artifact_package, verified_library
from .gpu import GpuProgram
from .package import STATUS_BYTES, Package
from .package import WORD as _WORD

__all__ = ["HostProgram", "CudaProgram", "DeviceArray", "MetalProgram", "load_artifact", "describe_artifact"]

_ERR = 1024
_U64P = ctypes.POINTER(ctypes.c_uint64)


# Each host-library entry point's (result, arguments), by name after its "chroma_<api>_" prefix.
# The Metal library (include/chroma/metal/host.h) has the CUDA library's signatures for what
# both do, and no products, device memory or fatbin.
_SIGNATURES = {
    "open": (ctypes.c_void_p, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]),
    "info": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
    "buffer": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int),
                              ctypes.c_char_p, ctypes.c_size_t]),
    "upload": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p,
                              ctypes.c_size_t]),
    "entry": (ctypes.c_int, [ctypes.c_void_p]),
    "gemm": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                            ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
                            ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p, ctypes.c_size_t]),
    "kernel": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_char_p, ctypes.c_size_t]),
    "dispatch": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_int,
                                ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.POINTER(ctypes.c_uint), ctypes.c_char_p,
                                ctypes.c_size_t]),
    "run": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),  # a _Call
    "call_layout": (ctypes.c_int, [_U64P, ctypes.c_int]),
    "alloc": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64, _U64P, ctypes.c_char_p, ctypes.c_size_t]),
    "free": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64]),
    "download": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p,
                                ctypes.c_size_t]),
    "close": (None, [ctypes.c_void_p]),
    "fatbin_bytes": (ctypes.c_uint64, []),
}
_CUDA_ONLY = ("gemm", "alloc", "free", "download", "fatbin_bytes")


class _Call(ctypes.Structure):
    """One call of an entry point: ChromaGpuCall (include/chroma/gpu/host_abi.h), field for field."""

    _I32P = ctypes.POINTER(ctypes.c_int32)
    _fields_ = [("entry", ctypes.c_int32), ("n_in", ctypes.c_int32), ("in_offset", _U64P), ("in_src", _U64P),
                ("in_bytes", _U64P), ("in_device", _I32P), ("n_out", ctypes.c_int32), ("graph", ctypes.c_int32),
                ("out_offset", _U64P), ("out_dst", _U64P), ("out_bytes", _U64P), ("out_device", _I32P),
                ("status_offset", ctypes.c_uint64), ("status", ctypes.c_void_p), ("status_bytes", ctypes.c_uint64)]


def _check_layout(host: "_Host", library: str) -> None:
    """The library's ChromaGpuCall is this module's _Call: the same size and field offsets."""
    want = [ctypes.sizeof(_Call)] + [getattr(_Call, name).offset for name, _ in _Call._fields_]
    got = (ctypes.c_uint64 * 32)()
    n = host.call_layout(got, 32)
    if list(got[:n]) != want:
        raise ArtifactError(f"{library}: its ChromaGpuCall layout {list(got[:n])} is not this runtime's {want} "
                            f"(a host library from another Chroma)")


class _Host:
    """An artifact's host library with its entry points bound: ``chroma_<api>_<name>`` as
    ``.<name>`` (api "cuda" or "metal")."""

    def __init__(self, lib: ctypes.CDLL, api: str):
        for name, (res, args) in _SIGNATURES.items():
            if api != "cuda" and name in _CUDA_ONLY:
                continue
            f = getattr(lib, f"chroma_{api}_{name}")
            f.restype, f.argtypes = res, args
            setattr(self, name, f)
        self.lib = lib


def _u64(values) -> ctypes.Array:
    return (ctypes.c_uint64 * max(1, len(values)))(*values)


def _int(values) -> ctypes.Array:
    return (ctypes.c_int * max(1, len(values)))(*values)


def _i32(values) -> ctypes.Array:
    return (ctypes.c_int32 * max(1, len(values)))(*values)


class DeviceArray:
    """An output kept in GPU memory (``prog(x, device_outputs=True)``): its own allocation,
    freed when the object goes. ``__cuda_array_interface__`` (version 3) hands it to CuPy,
    PyTorch or Numba without a copy; ``numpy()`` copies it to the host. Its dtype is the
    device's storage type (int64 outputs are stored as int32 on the GPU)."""

    def __init__(self, prog: "CudaProgram", ptr: int, dtype: np.dtype, shape: Tuple[int, ...], nbytes: int):
        self._prog, self.ptr, self.dtype, self.shape, self.nbytes = prog, ptr, np.dtype(dtype), tuple(shape), nbytes

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": None}

    def numpy(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        self._prog._download(self.ptr, out)
        return out

    def __del__(self):
        prog, self._prog = getattr(self, "_prog", None), None
        if prog is not None:
            prog._free(self.ptr)

    def __repr__(self):
        return f"DeviceArray({self.dtype}{list(self.shape)} at 0x{self.ptr:x})"


class HostProgram(GpuProgram):
    """A CUDA or Metal package on its GPU through the artifact's host library: the replay both
    host libraries implement (device buffers, kernels, each entry's schedule, a call, the state).
    Called like every GPU program (NumPy arrays in, positionally or by name; one array or a
    tuple out). Subclasses say which API (`_api`: the host library's symbol prefix) and add what
    only their platform has."""

    _api = ""
    _gpu = "GPU"
    _profiler = ""

    def __init__(self, package: Union[Package, str, os.PathLike, bytes], library: str, *, device: int = 0):
        t0 = time.perf_counter()
        p = self._open(package)
        self._h = None
        self.graph = getattr(self, "graph", False)
        try:
            self._lib = lib = _Host(ctypes.CDLL(os.path.abspath(library)), self._api)
        except (OSError, AttributeError) as e:
            raise ArtifactError(f"{library}: the {self._kind} host library does not load ({e})") from None
        _check_layout(lib, library)
        err = ctypes.create_string_buffer(_ERR)
        self._before_open(p)
        h = lib.open(int(device), err, _ERR)
        if not h:
            raise RunError(f"{p.where}: no {self._gpu} can run it here: {err.value.decode(errors='replace')}")
        self._h = h
        try:
            self._setup(p, err)
        except BaseException:
            self.close()
            raise
        info = ctypes.create_string_buffer(512)
        lib.info(h, info, 512)
        self._info = {**self._device_info(info.value.decode(errors="replace")),
                      "kernels": len(p.kernels), "dispatches": len(p.dispatches), "graph": self.graph,
                      "load_seconds": time.perf_counter() - t0,
                      "buffer_bytes": {"arena": p.arena_bytes, "state": p.state_bytes,
                                       "weights": sum(nb for _, nb in p.shards)}}

    def _before_open(self, p: Package) -> None:
        """What the platform needs before the host library opens the device (CUDA: cuBLAS)."""

    def _device_info(self, text: str) -> Dict[str, Any]:
        raise NotImplementedError

    def _check(self, rc: int, err) -> None:
        if rc:
            raise RunError(f"{self.package.where}: {err.value.decode(errors='replace')}")

    def _setup(self, p: Package, err) -> None:
        lib, h = self._lib, self._h
        bid = ctypes.c_int()
        self._check(lib.buffer(h, p.arena_bytes, None, 0, ctypes.byref(bid), err, _ERR), err)  # buffer 0
        state = np.zeros(p.state_bytes, np.uint8)
        for _, off, nb, init in p.state:
            state[off:off + nb] = np.frombuffer(p.section(init, nb), np.uint8)
        self._state_init = state
        self._check(lib.buffer(h, p.state_bytes, state.ctypes.data, state.nbytes, ctypes.byref(bid), err, _ERR),
                    err)  # buffer 1
        for off, nb in p.shards:  # buffers 2...
            data = np.frombuffer(p.section(off, nb), np.uint8)
            self._check(lib.buffer(h, nb, data.ctypes.data, nb, ctypes.byref(bid), err, _ERR), err)
        for i, kernel in enumerate(p.kernels):
            wg = kernel["invocations"]  # the validator bounds it by maxComputeInvocationsPerWorkgroup
            if not 1 <= wg <= 1024:
                raise PackageError(f"{p.where}: manifest field kernels[{i}].workgroup_size has {wg} invocations, "
                                   f"expected 1..1024 threads (the {self._kind} block limit)")
            self._check(lib.kernel(h, i, wg, err, _ERR), err)
        params = np.frombuffer(bytes(p.section(p.params_offset, p.params_bytes)) + bytes(4), np.uint32)
        for ei, e in enumerate(p.entries):
            if lib.entry(h) != ei:
                raise RunError(f"{p.where}: the host library numbered entry '{e.name}' out of order")
            self._plan(ei, e.dispatches, params, err)

    @staticmethod
    def _buffer_id(buf: Any) -> int:
        return 2 + buf[1] if isinstance(buf, tuple) else 0 if buf == "arena" else 1

    def _library_dispatch(self, entry: int, i: int, d: dict, err) -> None:
        raise PackageError(f"{self.package.where}: dispatch {i} is a library product; the {self._kind} target "
                           f"generates every kernel, so a {self._kind} package has none")

    def _plan(self, entry: int, dispatches: List[dict], params: np.ndarray, err) -> None:
        p, lib, h = self.package, self._lib, self._h
        for i, d in enumerate(dispatches):
            if d["kernel"] < 0:  # a library product (bounds checked when the package was read)
                self._library_dispatch(entry, i, d, err)
                continue
            slots = [self._buffer_id(d["bindings"][n]) for n in sorted(d["bindings"])]  # slot s: binding s + 1
            words = params[d["params"][1] // 4:(d["params"][1] + d["params"][2]) // 4] if d["params"] else params[:0]
            gx, gy, gz = d["grid"]
            if gz != 1:
                raise PackageError(f"{p.where}: dispatch {i} grid {list(d['grid'])}: the {self._kind} runtime "
                                   f"launches 2-D grids")
            w = np.ascontiguousarray(words, np.uint32)
            self._check(lib.dispatch(h, entry, d["kernel"], gx, gy, len(slots), _int(slots), len(w),
                                     w.ctypes.data_as(ctypes.POINTER(ctypes.c_uint)), err, _ERR), err)

    def _write_state(self) -> None:
        err = ctypes.create_string_buffer(_ERR)
        s = self._state_init
        self._check(self._lib.upload(self._h, 1, 0, s.ctypes.data, s.nbytes, err, _ERR), err)

    def reset_state(self) -> None:
        """Restores every state tensor (KV caches) to its initial value."""
        with self._lock:
            if self._h is not None and self._lost is None:
                self._write_state()

    def _device_input(self, i: int, t: Any, a: Any) -> Tuple[int, int]:
        raise ValueError(f"input {i} ('{t.name}'): a CUDA device array; the {self._kind} runtime takes host arrays (NumPy)")

    def _inputs(self, arrays, named, inputs) -> Tuple[List[int], List[int], List[int], List[Any]]:
        """(addresses, byte counts, is-device flags, objects to keep alive) for each input, in
        order; a device array (``__cuda_array_interface__``) where the platform takes one."""
        names = [t.name for t in inputs]
        dev = {}
        args = list(arrays)
        for i, a in enumerate(args):
            if hasattr(a, "__cuda_array_interface__") and i < len(names):
                dev[names[i]] = a
                args[i] = np.zeros(inputs[i].shape, inputs[i].dtype)  # placeholder for the checks
        named = dict(named)
        for k, a in named.items():
            if hasattr(a, "__cuda_array_interface__") and k in names:
                dev[k] = a
                t = inputs[names.index(k)]
                named[k] = np.zeros(t.shape, t.dtype)
        words = self._words(tuple(args), named, inputs)
        ptrs, sizes, flags, keep = [], [], [], []
        for i, (t, w) in enumerate(zip(inputs, words)):
            if t.name in dev:
                ptr, nbytes = self._device_input(i, t, dev[t.name])
                ptrs.append(ptr)
                sizes.append(nbytes)
                flags.append(1)
                keep.append(dev[t.name])
            else:
                b = np.frombuffer(w, np.uint8)
                ptrs.append(b.ctypes.data if b.size else 0)
                sizes.append(t.nbytes)
                flags.append(0)
                keep.append(b)
        return ptrs, sizes, flags, keep

    def _device_outputs(self, outputs: List[Any], err) -> List[Any]:
        raise ValueError(f"device_outputs=True: the {self._kind} runtime returns host arrays (NumPy)")

    def _call_entry(self, index: int, arrays: tuple, named: dict, device_outputs: bool = False):
        e = self.package.entries[index]
        ptrs, sizes, flags, keep = self._inputs(arrays, named, e.inputs)
        p = self.package
        err = ctypes.create_string_buffer(_ERR)
        status = np.zeros(STATUS_BYTES // 4, np.uint32)
        with self._lock:
            if self._lost:
                raise RunError(f"{p.where}: {self._lost}")
            if device_outputs:
                outs: List[Any] = self._device_outputs(e.outputs, err)
                dst = [o.ptr for o in outs]
            else:
                host = [np.empty(t.nbytes, np.uint8) for t in e.outputs]
                dst = [b.ctypes.data if b.size else 0 for b in host]
            arrays_kept = (_u64([t.offset for t in e.inputs]), _u64(ptrs), _u64(sizes), _i32(flags),
                           _u64([t.offset for t in e.outputs]), _u64(dst), _u64([t.nbytes for t in e.outputs]),
                           _i32([int(device_outputs)] * len(e.outputs)))
            call = _Call(index, len(e.inputs), *arrays_kept[:4], len(e.outputs), int(self.graph), *arrays_kept[4:],
                         p.status_offset, status.ctypes.data, STATUS_BYTES)
            rc = self._lib.run(self._h, ctypes.byref(call), err, _ERR)
            del keep
            if rc:
                # The arena and state are in an unknown state now: every later call fails too.
                self._lost = f"a call failed on the GPU: {err.value.decode(errors='replace')}"
                raise RunError(f"{p.where}: {self._lost}")
            self._calls += 1
        self._status(status, e.dispatches)
        if not device_outputs:
            outs = [t.decode(b.tobytes()) for t, b in zip(e.outputs, host)]
        return outs[0] if e.single else tuple(outs)

    def profile(self, *arrays: Any, iters: int = 5, **named: Any) -> List[Dict[str, Any]]:
        raise RunError(f"{type(self).__name__}.profile is not implemented: use {self._profiler} on the calling "
                       f"process; every kernel is named chroma_k<i>_main after the package's kernel index")

    def close(self) -> None:
        """Releases the device buffers, the queue and the kernels; later calls raise RunError."""
        with self._lock:
            if self._h is not None:
                self._lib.close(self._h)
                self._h = None
            self._lost = "the program was closed"


class CudaProgram(HostProgram):
    """A CUDA package on an NVIDIA GPU. ``graph=True`` replays each call's kernels as one CUDA
    graph (captured on the second call; the first launches directly): one launch instead of one
    per dispatch. Inputs may be device arrays (``__cuda_array_interface__``), and
    ``prog(x, device_outputs=True)`` returns `DeviceArray` outputs that stay on the GPU."""

    _dialects, _kind, _api, _gpu = ("cuda",), "CUDA", "cuda", "NVIDIA GPU"
    _profiler = "Nsight Systems (nsys profile)"

    def __init__(self, package: Union[Package, str, os.PathLike, bytes], library: str, *, device: int = 0,
                 graph: bool = False):
        self.graph = bool(graph)
        super().__init__(package, library, device=device)

    def __call__(self, *arrays: Any, device_outputs: bool = False, **named: Any):
        return self._call_entry(0, arrays, named, device_outputs)

    def _before_open(self, p: Package) -> None:
        if any(d["kernel"] < 0 for e in p.entries for d in e.dispatches):
            self._preload_cublas()

    def _device_info(self, text: str) -> Dict[str, Any]:
        name, major, minor, total, driver = text.rsplit("|", 4)
        return {"device": name, "compute_capability": f"{major}.{minor}", "device_memory": int(total),
                "driver_version": int(driver), "fatbin_bytes": int(self._lib.fatbin_bytes())}

    @staticmethod
    def _preload_cublas() -> None:
        """Makes cuBLAS findable by the host library's dlopen("libcublas.so.13"/".12"): the file
        $CHROMA_CUBLAS names, else the nvidia-cublas Python package's (PyTorch's dependency),
        loaded globally; without either the system's library path decides."""
        import glob

        cands = [os.environ["CHROMA_CUBLAS"]] if os.environ.get("CHROMA_CUBLAS") else []
        try:
            import nvidia.cublas  # type: ignore[import-not-found]

            for d in list(nvidia.cublas.__path__):
                cands += sorted(glob.glob(os.path.join(d, "lib", "libcublas.so*")), reverse=True)
        except ImportError:
            pass
        for c in cands:
            try:
                ctypes.CDLL(c, mode=ctypes.RTLD_GLOBAL)
                return
            except OSError:
                continue

    def _library_dispatch(self, entry: int, i: int, d: dict, err) -> None:
        gemm = d["library"]
        ops = [gemm[x] for x in ("a", "b", "c")]
        i64 = lambda key: (ctypes.c_int64 * 3)(*[o[key] for o in ops])  # noqa: E731
        rc = self._lib.gemm(self._h, entry, gemm["batch"], gemm["m"], gemm["n"], gemm["k"],
                            _int([self._buffer_id(d["bindings"][n]) for n in (1, 2, 3)]), i64("word"),
                            i64("batch_stride"), i64("row_stride"), i64("col_stride"), err, _ERR)
        self._check(rc, err)

    def _device_input(self, i: int, t: Any, a: Any) -> Tuple[int, int]:
        """A device array's address and bytes: contiguous, in the device's storage type (int64
        inputs: int32)."""
        ai = a.__cuda_array_interface__
        want = np.dtype(_WORD[t.storage])
        c_strides = tuple(int(np.prod(t.shape[d + 1:], dtype=np.int64)) * want.itemsize for d in range(len(t.shape)))
        contiguous = ai.get("strides") is None or tuple(ai["strides"]) == c_strides
        if tuple(ai["shape"]) != t.shape or np.dtype(ai["typestr"]) != want or not contiguous:
            raise ValueError(f"input {i} ('{t.name}'): a device array must be contiguous {want}{list(t.shape)} "
                             f"(got {np.dtype(ai['typestr'])}{list(ai['shape'])}, strides {ai.get('strides')})")
        return int(ai["data"][0]), t.size * want.itemsize

    def _device_outputs(self, outputs: List[Any], err) -> List[Any]:
        outs = []
        for t in outputs:
            ptr = ctypes.c_uint64()
            self._check(self._lib.alloc(self._h, t.nbytes, ctypes.byref(ptr), err, _ERR), err)
            outs.append(DeviceArray(self, ptr.value, _WORD[t.storage], t.shape, t.nbytes))
        return outs

    def _download(self, ptr: int, out: np.ndarray) -> None:
        err = ctypes.create_string_buffer(_ERR)
        with self._lock:
            if self._h is None:
                raise RunError(f"{self.package.where}: the program was closed")
            self._check(self._lib.download(self._h, ptr, out.ctypes.data, out.nbytes, err, _ERR), err)

    def _free(self, ptr: int) -> None:
        with self._lock:
            if self._h is not None:
                self._lib.free(self._h, ptr)


class MetalProgram(HostProgram):
    """A Metal package on an Apple GPU, through the artifact's host library
    (include/chroma/metal/host.h, on Apple's metal-cpp): the same schedule, buffers and calls as
    CudaProgram, each call one command buffer; buffers in shared storage (Apple silicon's unified
    memory). NumPy arrays in and out (docs/cuda.md, "Metal")."""

    _dialects, _kind, _api, _gpu = ("metal",), "Metal", "metal", "Metal GPU"
    _profiler = "Xcode's Metal System Trace (Instruments)"

    def _device_info(self, text: str) -> Dict[str, Any]:
        name, unified, max_buffer, working_set = text.rsplit("|", 3)
        return {"device": name, "unified_memory": unified == "1", "max_buffer_bytes": int(max_buffer),
                "recommended_working_set_bytes": int(working_set)}


_RUNTIMES = {"cuda": CudaProgram, "metal": MetalProgram}


def load_artifact(directory: str, manifest: dict, mpath: str, options: Any) -> HostProgram:
    """A CUDA or Metal artifact directory on its GPU (the registry's loader), through the host
    library the manifest names, checked against its digest before it is loaded."""
    target = manifest.get("target")
    kind = _RUNTIMES[target]._kind
    if target == "metal" and options.cuda_graph:
        raise ValueError("graph=True is CUDA's (a Metal call is one command buffer already)")
    package_file(directory, manifest, mpath)  # named right and present, before anything else
    host = (manifest.get(target) or {}).get("host")
    if not isinstance(host, dict):
        why = (manifest.get(target) or {}).get("why", "no host library")
        if target == "metal":
            raise RunError(f"{directory}: this Metal artifact was compiled without its host library ({why}); compile it "
                           f"on macOS with CHROMA_METAL_CPP naming Apple's metal-cpp headers (docs/cuda.md, \"Metal\"), or "
                           f"chroma.load(directory, emulate=True) runs its kernels on the CPU SIMT emulator")
        raise RunError(f"{directory}: this CUDA artifact was compiled without nvcc ({why}), so it holds no GPU code; "
                       f"compile it where nvcc is installed, or chroma.load(directory, emulate=True) runs its kernels on "
                       f"the CPU SIMT emulator")
    if target == "cuda" and not (os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")):
        raise RunError(f"{directory}: a CUDA artifact, and this machine has no NVIDIA GPU (no /dev/nvidia0); "
                       f"chroma.load(directory, emulate=True) runs its kernels on the CPU SIMT emulator")
    package = read_artifact_package(directory, manifest, mpath)
    path = verified_library(directory, host, f"{target}.host", mpath, f"{kind} host library")
    try:
        if target == "metal":
            prog: HostProgram = MetalProgram(package, path, device=options.device)
        else:
            prog = CudaProgram(package, path, device=options.device, graph=options.cuda_graph)
    except RunError as e:
        if "emulate=True" in str(e):
            raise
        raise RunError(f"{e}; chroma.load(directory, emulate=True) runs its kernels on the CPU SIMT emulator") from None
    prog.manifest, prog.directory = manifest, directory
    return prog


def device_present(target: str) -> bool:
    """Whether this machine has the GPU a `target` artifact runs on natively (else its kernels
    run on the CPU SIMT emulator, chroma.load(..., emulate=True))."""
    if target == "cuda":
        return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")
    return target == "metal" and sys.platform == "darwin"


def describe_artifact(m: dict) -> List[str]:
    """What a CUDA or Metal artifact holds beside its package: the fatbin and host library, or
    why it runs on the emulator only (`chroma inspect`)."""
    target = m.get("target")
    part = m.get(target) or {}
    if target == "cuda":
        fb = part.get("fatbin")
        if fb:
            spills = "none" if not fb.get("ptxas_spills") else fb["ptxas_spills"].strip()
            return [f"fatbin {fb.get('file')}: {fb.get('bytes')} B, {fb.get('command')}; ptxas spills: {spills}; "
                    f"host library {(part.get('host') or {}).get('library')} (native: chroma.load(dir))"]
        return [f"fatbin: none ({part.get('why', 'not recorded')}): runs on the emulator only "
                f"(chroma.load(dir, emulate=True))"]
    if part.get("host"):
        return [f"Metal host library {part['host'].get('library')} (metal-cpp {part['host'].get('metal_cpp')}; "
                f"native: chroma.load(dir) on a Mac's GPU)"]
    return [f"Metal host library: none ({part.get('why', 'not recorded')}): runs on the emulator only "
            f"(chroma.load(dir, emulate=True))"]
