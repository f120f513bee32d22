"""What the CPU can do and which kernels Chroma's libraries run on it.

OpenBLAS picks its kernels when the library loads, from the CPU it recognizes. Debian 12's
OpenBLAS 0.3.21 does not recognize CPUs newer than it (Sapphire Rapids among them) and falls
back to its generic Prescott (SSE3) kernels, much slower (bench/results/README.md), without a
word. Its AVX-512 and AVX2 kernels (the "SkylakeX" and "Haswell" cores; newer cores reuse them
for float32) run on any CPU with those instruction sets, so before OpenBLAS can load,
`configure_blas()` sets OPENBLAS_CORETYPE from the CPU's features, unless the user set it.
`info()` reports what is in use: CPU features, the BLAS and its core, oneDNN's ISA.

`configure_blas()` also sets OMP_WAIT_POLICY=PASSIVE unless it is set: oneDNN's OpenMP workers
otherwise spin after every convolution and take a core from Chroma's own pool, which runs the
next kernel (with the default policy mobilenet_v2 ran slower at 2 threads than at 1; figures in
bench/results/README.md). It applies to OpenMP runtimes that start after `import chroma` (a
torch imported earlier keeps its own setting).
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Any, Dict, List, Optional

__all__ = ["cpu_features", "blas_core_for", "configure_blas", "info"]

_AVX512 = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd")
_AVX2 = ("avx2", "fma")
_REPORTED = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd",
             "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "sha_ni")


def cpu_features() -> List[str]:
    """The CPU's feature flags as the kernel reports them (/proc/cpuinfo), sorted."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return sorted(set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return []


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def blas_core_for(features: List[str]) -> Optional[str]:
    """The OpenBLAS core whose kernels suit these features (None: let OpenBLAS decide)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    have = set(features)
    if all(f in have for f in _AVX512):
        return "SkylakeX"
    if all(f in have for f in _AVX2):
        return "Haswell"
    return None


def configure_blas() -> Optional[str]:
    """Sets OPENBLAS_CORETYPE for this process (and its children) unless it is set already;
    returns the value in effect. Must run before OpenBLAS loads: `import chroma` does it."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if os.environ.get("OPENBLAS_CORETYPE"):
        return os.environ["OPENBLAS_CORETYPE"]
    core = blas_core_for(cpu_features())
    if core:
        os.environ["OPENBLAS_CORETYPE"] = core
    return core


def _openblas() -> Dict[str, Any]:
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
    except OSError as e:
        return {"library": None, "error": str(e)}
    lib.openblas_get_corename.restype = ctypes.c_char_p
    lib.openblas_get_config.restype = ctypes.c_char_p
    return {"library": "OpenBLAS", "core": lib.openblas_get_corename().decode(),
            "config": lib.openblas_get_config().decode().strip(),
            "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")}


_DNNL_ISA = {0x0: "default", 0x1: "sse41", 0x3: "avx", 0x7: "avx2", 0xf: "avx2_vnni", 0x1f: "avx2_vnni_2",
             0x27: "avx512_core", 0x67: "avx512_core_vnni", 0xe7: "avx512_core_bf16", 0x1ef: "avx512_core_fp16",
             0xfef: "avx512_core_amx", 0x1fef: "avx512_core_amx_fp16", 0xffffffff: "all"}  # oneDNN 3's dnnl_cpu_isa_t


class _DnnlVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint), ("gpu_runtime", ctypes.c_uint)]


def _onednn() -> Dict[str, Any]:
    from chroma import _compiler  # the library artifacts link (CMakeLists.txt)
    path = _compiler.dnnl_library()
    if not path:
        return {"library": None, "error": "Chroma was built without oneDNN 3 (requirements.txt: onednn-cpu-gomp)"}
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        return {"library": None, "path": path, "error": str(e)}
    lib.dnnl_version.restype = ctypes.POINTER(_DnnlVersion)
    v = lib.dnnl_version().contents
    isa = lib.dnnl_get_effective_cpu_isa()
    return {"library": "oneDNN", "version": f"{v.major}.{v.minor}.{v.patch}", "isa": _DNNL_ISA.get(isa, hex(isa)),
            "path": path}


def info() -> Dict[str, Any]:
    """CPU, features, and the kernels Chroma's libraries use on it."""
    feats = cpu_features()
    return {"cpu": _cpu_model(), "machine": platform.machine(), "cores": os.cpu_count(),
            "features": [f for f in _REPORTED if f in feats], "blas": _openblas(), "onednn": _onednn(),
            "blas_core_recommended": blas_core_for(feats)}
