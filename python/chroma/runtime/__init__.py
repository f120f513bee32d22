"""Chroma's runtime layer: what loads and runs a compiled artifact, with NumPy only (never
torch). Below it only the base modules (errors, golden, paths, cpuinfo); above it the
quantization, cache, frontend and API layers.

    registry   chroma.load: the manifest's target -> the runtime that loads it
    cpu        CPU artifacts (Program, Entry)
    package    the GPU package validator every GPU runtime reads packages with
    artifact   what a GPU artifact directory names outside its package (files, libraries)
    gpu        the GPU runtimes' common part (GpuProgram: inputs, status block, self-check)
    webgpu     WebGPUProgram (wgpu)
    native     CudaProgram, MetalProgram (the artifact's host library)
    emulator   EmulatedProgram (the CPU SIMT emulator)
    variants   artifacts with several weight variants, chosen by the memory available

The GPU runtime classes are importable from here; each module is imported when first used
(WebGPU's loads Triton's native library first where torch installed it, see webgpu.py)."""

from __future__ import annotations

from typing import Any

from ..errors import ArtifactError, IndexOutOfRange, PackageError, RunError
from .package import Package, read_package

__all__ = ["ArtifactError", "IndexOutOfRange", "PackageError", "RunError", "Package", "read_package", "WebGPUProgram",
           "EmulatedProgram", "CudaProgram", "MetalProgram", "DeviceArray"]

_LAZY = {"WebGPUProgram": "webgpu", "EmulatedProgram": "emulator", "CudaProgram": "native", "MetalProgram": "native",
         "DeviceArray": "native"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(name)
