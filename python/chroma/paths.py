"""Where Chroma's files are: the runtime headers generated code includes, and the build cache
(base layer: imports nothing from Chroma)."""

from __future__ import annotations

import os

__all__ = ["include_dir", "default_cache_dir"]


def include_dir() -> str:
    """The header-only runtime library the generated code includes."""
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "include"), os.path.join(here, "..", "..", "include")):
        if os.path.isfile(os.path.join(cand, "chroma", "cpu", "et.h")):
            return os.path.abspath(cand)
    raise RuntimeError("chroma's runtime headers are missing from the installation (chroma/include)")


def default_cache_dir() -> str:
    """The build cache: $CHROMA_CACHE_DIR, else ~/.cache/chroma."""
    return os.environ.get("CHROMA_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "chroma")
