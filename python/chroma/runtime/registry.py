"""chroma.load: an artifact directory's manifest names its target; the target's runtime loads
it. One table (`TARGETS`) says which runtime module loads which target (and which runs it
emulated); a runtime module has `load_artifact(directory, manifest, mpath, options)`. Runtime
modules are imported when an artifact of theirs is loaded, never before (WebGPU's imports
wgpu, the native one a GPU driver's libraries).

Runtime layer: imports the runtime modules and the errors; nothing imports it but the layers
above (the API, the cache, quantization)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from typing import Any, Dict, Optional, Union

from ..errors import ArtifactError
from .cpu import ARTIFACT_VERSION

__all__ = ["load", "load_compiled", "describe", "LoadOptions", "TARGETS", "TargetRuntime", "target", "runtime_module"]

@dataclasses.dataclass(frozen=True)
class TargetRuntime:
    """What the runtime knows of a target: the module that loads its artifacts, the one that
    runs them on the emulator (None: no emulator), and the suffix of the GPU package written
    beside the artifact directory ("" for a CPU artifact, whose files are all in it)."""

    module: str
    emulator: Optional[str] = None
    package_suffix: str = ""
    # Whether one artifact may hold several entry points (a decoder's prefill and step, a
    # batch range's sizes): a WebGPU package runs one schedule.
    several_entries: bool = True
    # Whether a served replica of it needs one of Ray's GPUs (chroma.serve).
    ray_gpu: bool = False

    @property
    def gpu(self) -> bool:
        """A GPU target: a package with golden data beside the directory."""
        return bool(self.package_suffix)


# The targets chroma.compile builds and chroma.load runs (the compiler's registry,
# src/targets/registry.cpp, also has `null`, which writes nothing to load).
TARGETS: Dict[str, TargetRuntime] = {
    "cpu": TargetRuntime("chroma.runtime.cpu"),
    "webgpu": TargetRuntime("chroma.runtime.webgpu", package_suffix=".chroma-web", several_entries=False),
    "cuda": TargetRuntime("chroma.runtime.native", "chroma.runtime.emulator", ".chroma-cuda", ray_gpu=True),
    "metal": TargetRuntime("chroma.runtime.native", "chroma.runtime.emulator", ".chroma-metal"),
}


def target(name: str, where: str = "target") -> TargetRuntime:
    """The runtime's record of the target `name`; ArtifactError naming the known ones otherwise."""
    if name not in TARGETS:
        raise ArtifactError(f"{where}: target {name!r} is not one this runtime loads ({', '.join(TARGETS)})")
    return TARGETS[name]


@dataclasses.dataclass(frozen=True)
class LoadOptions:
    """What chroma.load was asked for; each runtime reads the options that concern it."""

    verify: bool = True
    threads: Optional[int] = None
    emulate: bool = False
    reverse: bool = False
    device: int = 0
    cuda_graph: bool = False


def runtime_module(name: str, emulate: bool, where: str) -> Any:
    """The runtime module for the target `name` (its emulator's when `emulate` and it has one)."""
    t = target(name, f"{where}: field 'target'")
    return importlib.import_module(t.emulator if emulate and t.emulator else t.module)


def emulated_here(name: str) -> bool:
    """Whether an artifact of target `name` runs on the CPU SIMT emulator on this machine: its
    target has an emulator and this machine lacks the GPU it runs on natively."""
    t = target(name)
    return bool(t.emulator) and not importlib.import_module(t.module).device_present(name)


def load_compiled(directory: str, threads: Optional[int] = None) -> Any:
    """An artifact chroma.compile just wrote, as compile returns it: on the emulator when its
    target has one (the CUDA and Metal targets: it runs on every machine), else as
    chroma.load(directory) would."""
    with open(os.path.join(directory, "manifest.json"), encoding="utf-8") as f:
        name = json.load(f).get("target", "cpu")
    if target(name, directory).emulator:
        return load(directory, emulate=True)
    return load(directory, threads=threads)


def describe(manifest: dict) -> list:
    """Lines saying what a GPU artifact holds beside its package (`chroma inspect`), from its
    target's runtime module (`describe_artifact`, where it has one)."""
    module = importlib.import_module(target(manifest.get("target", "cpu")).module)
    return list(getattr(module, "describe_artifact", lambda m: [])(manifest))


def load(directory: Union[str, os.PathLike], *, verify: bool = True, threads: Optional[int] = None,
         weights: Optional[str] = None, memory_limit: Optional[int] = None, emulate: bool = False,
         reverse: bool = False, device: int = 0, cuda_graph: bool = False) -> Any:
    """Loads an artifact directory written by chroma.compile.

    ``weights``: for an artifact with several weight variants (compile(weights=[...])),
    "auto" (the default) picks the most accurate variant that fits in the memory available
    now (and in ``memory_limit`` bytes if given) and prints why; a variant's name forces it.
    For a single artifact it may name the artifact's own format (anything else is an error).

    ``threads``: how many threads the program runs on, the caller's included (default:
    $CHROMA_NUM_THREADS if set, else one per core). Large memory-bound matrix products are
    split between them; OpenBLAS (a process-wide setting) is given the same count.

    ``emulate``: a CUDA or Metal artifact runs its generated kernels on the CPU SIMT emulator
    (chroma.runtime.emulator; slow, for testing; ``reverse`` runs each workgroup's invocations
    last to first). Without it, a CUDA artifact runs on NVIDIA GPU number ``device`` through its
    host library (chroma.runtime.native; ``cuda_graph`` replays each call as one CUDA graph); on
    a machine without an NVIDIA GPU or driver that is an error that says so. A Metal artifact
    runs on the system's default Metal GPU through its host library (MetalProgram; built when it
    was compiled with CHROMA_METAL_CPP naming Apple's metal-cpp headers); without one, or
    without a Metal GPU, that is an error that says so.

    Checks the manifest's format and version, then the target's runtime checks the rest (the
    CPU: the ABI version, the library's and the weights' SHA-256 digests and the generated
    source's digest; GPU targets: the package's digest and every field of it, the native
    libraries' digests); raises ArtifactError naming the file and field that do not match.
    """
    directory = os.fspath(directory)
    mpath = os.path.join(directory, "manifest.json")
    if not os.path.isfile(mpath):
        raise ArtifactError(f"{directory}: not a Chroma artifact (no manifest.json)")
    try:
        with open(mpath, "r", encoding="utf-8") as f:
            manifest = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as e:
        raise ArtifactError(f"{mpath}: corrupt JSON ({e})") from None
    if isinstance(manifest, dict) and manifest.get("format") == "chroma.variants":
        from .variants import load_variant

        return load_variant(directory, manifest, weights, memory_limit, load, verify=verify, threads=threads)
    if weights not in (None, "auto"):
        own = (manifest.get("options", {}).get("weights", {}) or {}).get("default", "fp32") if isinstance(manifest, dict) else None
        if weights != own:
            raise ValueError(f"weights={weights!r}: {directory} has one weight variant, {own}")
    if not isinstance(manifest, dict) or manifest.get("format") != "chroma.artifact":
        raise ArtifactError(f"{mpath}: field 'format' is {manifest.get('format') if isinstance(manifest, dict) else None!r}, expected 'chroma.artifact'")
    version = manifest.get("version")
    if version != ARTIFACT_VERSION:
        raise ArtifactError(f"{mpath}: artifact format version {version} is not supported (this runtime reads version {ARTIFACT_VERSION})")
    runtime = runtime_module(manifest.get("target", "cpu"), bool(emulate), mpath)
    options = LoadOptions(verify=verify, threads=threads, emulate=emulate, reverse=reverse, device=device,
                          cuda_graph=cuda_graph)
    prog = runtime.load_artifact(directory, manifest, mpath, options)
    if os.path.isfile(os.path.join(directory, "batching.json")):  # compiled for a batch range
        from .batched import BatchedProgram, read_info

        try:
            info = read_info(directory)
        except (ValueError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ArtifactError(str(e)) from None
        try:
            return BatchedProgram(prog, info)
        except KeyError as e:
            raise ArtifactError(f"{directory}/batching.json: {e.args[0]}") from None
    return prog
