"""The errors every layer of Chroma raises: the bottom of the package's import graph (it
imports nothing from Chroma)."""

from __future__ import annotations

__all__ = ["ArtifactError", "PackageError", "RunError", "IndexOutOfRange", "UnsupportedInput"]


class ArtifactError(ValueError):
    """A corrupt, truncated, incomplete or mismatched artifact."""


class PackageError(ArtifactError):
    """A corrupt, truncated, malformed, hostile or mismatched GPU package (`.chroma-web`,
    `.chroma-cuda`, `.chroma-metal`): the message names the field that breaks the format."""


class RunError(RuntimeError):
    """The GPU cannot run the package (a missing feature or limit, too little memory), or a call
    failed (a bad index a kernel reported, a lost device)."""


class IndexOutOfRange(RunError, IndexError):
    """A gather or index write met an index outside its dimension (the status block)."""


class UnsupportedInput(ValueError):
    """An input value the program's target cannot represent (an int64 beyond int32 on a GPU
    target, which stores int64 tensors in 32-bit words): the same call runs on a target that can.
    The run-time counterpart of `chroma.UnsupportedError`."""
