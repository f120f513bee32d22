"""What a GPU artifact directory's manifest names outside itself, checked before anything is
read or loaded: the package file (beside the directory or in it, by a plain name) and the
native libraries (in the directory, loaded only when their SHA-256 matches the manifest's, as
the CPU artifact's library is: a library runs code when it is loaded)."""

from __future__ import annotations

import os
from typing import Any

from ..errors import ArtifactError
from .package import Package, read_package, sha256_file

__all__ = ["package_file", "read_artifact_package", "verified_library", "PACKAGE_SUFFIXES"]

PACKAGE_SUFFIXES = (".chroma-web", ".chroma-cuda", ".chroma-metal")


def package_file(directory: str, manifest: dict, mpath: str) -> str:
    """The path of the package the manifest's `package.file` names: a file in the artifact
    directory, or beside it (`../<name>`), with a package's suffix; nothing else."""
    pkg = manifest.get("package")
    rel = pkg.get("file") if isinstance(pkg, dict) else None
    if not isinstance(rel, str) or not rel:
        raise ArtifactError(f"{mpath}: field 'package.file' is missing")
    name = rel[3:] if rel.startswith("../") else rel
    if (os.path.basename(name) != name or name in ("", ".", "..") or "\\" in name or "\0" in name
            or not name.endswith(PACKAGE_SUFFIXES)):
        raise ArtifactError(f"{mpath}: field 'package.file' is {rel!r}: a package file in the artifact directory or "
                            f"beside it ('../<name>'), named with one of {', '.join(PACKAGE_SUFFIXES)}")
    path = os.path.join(os.path.dirname(os.path.abspath(directory)) if rel.startswith("../") else directory, name)
    if not os.path.isfile(path):
        raise ArtifactError(f"{mpath}: the package {path} it names (field package.file) is missing")
    return path


def read_artifact_package(directory: str, manifest: dict, mpath: str) -> Package:
    """The artifact's package, read and checked, and the same one the manifest describes (its
    digest is the manifest's `package.sha256`)."""
    path = package_file(directory, manifest, mpath)
    package = read_package(path)  # checks the content digest in its header
    want = manifest["package"].get("sha256")
    if package.digest != want:
        raise ArtifactError(f"{mpath}: field 'package.sha256' is {want!r}, the package {path} is {package.digest}")
    return package


def verified_library(directory: str, section: Any, field: str, mpath: str, what: str) -> str:
    """The path of the native library `section` (`{"library": name, "sha256": hex}`) names, in
    the artifact directory, after checking its SHA-256: a replaced library is refused before it
    is loaded (loading runs its constructors)."""
    lib = section.get("library") if isinstance(section, dict) else None
    if not isinstance(lib, str) or not lib:
        raise ArtifactError(f"{mpath}: field '{field}.library' is missing")
    if os.path.basename(lib) != lib or lib in (".", "..") or "\0" in lib:
        raise ArtifactError(f"{mpath}: field '{field}.library' ({lib!r}) must name a file in the artifact directory")
    path = os.path.join(directory, lib)
    if not os.path.isfile(path):
        raise ArtifactError(f"{mpath}: the {what} {path} it names is missing")
    want = section.get("sha256")
    if not isinstance(want, str) or len(want) != 64:
        raise ArtifactError(f"{mpath}: field '{field}.sha256' is {want!r}: the {what}'s digest is missing (an artifact "
                            f"from an older Chroma: compile it again)")
    got = sha256_file(path)
    if got != want:
        raise ArtifactError(f"{path}: SHA-256 {got} does not match manifest field {field}.sha256 ({want}): corrupt, "
                            f"replaced, or from another build; it was not loaded")
    return path
