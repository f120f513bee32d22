"""The model cache: finished artifacts kept under a fingerprint of everything a compile
depends on (cache/fingerprint.py), so that compiling an unchanged model again copies the
artifact instead of exporting and building it. Cache layer: imports the runtime (to load a
restored artifact) and the base modules, never the API."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, Optional

from ..paths import default_cache_dir
from ..runtime.registry import load
from . import fingerprint

__all__ = ["through_model_cache"]

# The model cache: <cache_dir>/models/<key>/ holds a finished artifact (manifest, weights,
# library, sources) under a key over everything the compile depends on (fingerprint.py).
# A hit copies it into `out` (hard links where the file system allows) and loads it: no
# export, no front end, no build. Entries are published with an atomic rename and evicted,
# least recently used first, above $CHROMA_MODEL_CACHE_BYTES (default 4 GiB).

_MODEL_CACHE_BYTES = 4 << 30


def _model_cache_root(cache_dir: Optional[str]) -> Optional[str]:
    root = default_cache_dir() if cache_dir is None else cache_dir
    if not root or os.environ.get("CHROMA_MODEL_CACHE", "1") == "0":
        return None
    return os.path.join(root, "models")


def _link_or_copy(src: str, dst: str) -> None:
    tmp = f"{dst}.tmp{os.getpid()}-{time.monotonic_ns()}"
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)  # a new inode at dst: a process that has the old file mapped keeps it


def _artifact_files(manifest: dict) -> list:
    return ["weights.bin", manifest["library"]["file"], *manifest["source"]["files"]]


def _restore(entry: str, out: str) -> None:
    with open(os.path.join(entry, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    os.makedirs(os.path.join(out, "src"), exist_ok=True)
    for rel in _artifact_files(manifest):
        _link_or_copy(os.path.join(entry, rel), os.path.join(out, rel))
    keep = {os.path.basename(r) for r in manifest["source"]["files"]}
    for n in os.listdir(os.path.join(out, "src")):
        if n not in keep:
            os.remove(os.path.join(out, "src", n))
    for n in os.listdir(out):  # libraries of earlier compiles into `out`
        if n.startswith("model") and n.endswith(".so") and n != manifest["library"]["file"]:
            os.remove(os.path.join(out, n))
    manifest["build"]["cached"] = True
    manifest["build"]["model_cache"] = "hit"
    tmp = os.path.join(out, f"manifest.json.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
    os.replace(tmp, os.path.join(out, "manifest.json"))
    os.utime(entry)  # recently used


def _store(out: str, root: str, entry: str) -> None:
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    limit = int(os.environ.get("CHROMA_MODEL_CACHE_BYTES", _MODEL_CACHE_BYTES))
    files = ["manifest.json", *_artifact_files(manifest)]
    size = sum(os.path.getsize(os.path.join(out, r)) for r in files)
    if size > limit // 2:
        return
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".store-", dir=root)
    try:
        os.makedirs(os.path.join(tmp, "src"))
        for rel in files:
            _link_or_copy(os.path.join(out, rel), os.path.join(tmp, rel))
        try:
            os.rename(tmp, entry)
        except OSError:
            return  # another process stored the same entry first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # Sizing the whole cache costs a walk over it: done for one store in 16, or for a large one.
    if size > limit // 16 or int.from_bytes(os.urandom(1), "little") < 16:
        _evict(root, limit)


def _evict(root: str, limit: int) -> None:
    entries = []
    for n in os.listdir(root):
        d = os.path.join(root, n)
        if n.startswith(".") or not os.path.isdir(d):
            continue
        size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(d) for f in fs)
        entries.append((os.path.getmtime(d), size, d))
    total = sum(e[1] for e in entries)
    for _, size, d in sorted(entries):
        if total <= limit:
            break
        shutil.rmtree(d, ignore_errors=True)
        total -= size


def through_model_cache(models: list, options: Dict[str, Any], out: str, cache_dir: Optional[str],
                         threads: Optional[int], build: Callable[[Dict[str, Any]], Any]) -> Any:
    """Loads the artifact for `models` from the model cache, or builds (and stores) it."""
    timings: Dict[str, Any] = {}
    root = _model_cache_root(cache_dir)
    key = None
    if root is None:
        timings["model_cache"] = "off"
    else:
        t0 = time.perf_counter()
        try:
            key = fingerprint.compile_key(models, options)
        except fingerprint.Uncacheable as e:
            timings["model_cache"] = f"not used: {e}"
        timings["fingerprint"] = time.perf_counter() - t0
    if key is not None:
        entry = os.path.join(root, key[:40])
        if os.path.isfile(os.path.join(entry, "manifest.json")):
            t0 = time.perf_counter()
            try:
                _restore(entry, out)
                prog = load(out, threads=threads)
            except (OSError, ValueError, KeyError) as e:  # a damaged entry: drop it, compile afresh
                shutil.rmtree(entry, ignore_errors=True)
                timings["model_cache"] = f"damaged entry removed ({e})"
            else:
                timings["model_cache"] = "hit"
                timings["restore_and_load"] = time.perf_counter() - t0
                prog.timings = timings
                return prog
        timings.setdefault("model_cache", "miss")
    prog = build(timings)
    if key is not None:
        t0 = time.perf_counter()
        try:
            _store(out, root, entry)
        except OSError as e:
            timings["model_cache"] += f", not stored ({e})"
        timings["store"] = time.perf_counter() - t0
    prog.timings = timings
    return prog
