"""Where Chroma's files are: the runtime headers generated code includes, and the build cache
(base layer: imports nothing from Chroma)."""

from __future__ import annotations

import hashlib
import os
import platform

__all__ = ["include_dir", "default_cache_dir", "toolchain_digest", "file_digest"]


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


_DIGESTS: dict = {}


def file_digest(path: str) -> str:
    """SHA-256 of a file's contents ("missing" when it cannot be read), remembered per
    (path, size, mtime)."""
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        with open(path, "rb") as f:
            _DIGESTS[key] = hashlib.sha256(f.read()).hexdigest()
    return _DIGESTS[key]


def toolchain_digest() -> str:
    """What generated code depends on besides the model and the options: the native compiler
    module (its contents), the runtime headers (each by size and modification time) and the
    CPU the code is compiled for (-march=native: its model name and flags). Caches of compiled
    artifacts key on it, so a rebuilt compiler, changed headers or another CPU compile again."""
    from . import _compiler

    h = hashlib.sha256()

    def emit(*parts) -> None:
        for p in parts:
            b = str(p).encode()
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)

    try:
        with open("/proc/cpuinfo", "rb") as f:
            text = f.read().decode(errors="replace")
        for line in text.splitlines():
            if line.startswith(("model name", "flags")):
                emit(line)
                if line.startswith("flags"):
                    break
    except OSError:
        emit("cpu", platform.processor())
    emit("_compiler", file_digest(_compiler.__file__))
    inc = include_dir()
    for root, _, files in sorted(os.walk(inc)):
        for n in sorted(files):
            st = os.stat(os.path.join(root, n))
            emit(os.path.relpath(os.path.join(root, n), inc), st.st_size, st.st_mtime_ns)
    return h.hexdigest()
