"""Artifacts with several weight variants, and the memory-aware choice between them
(docs/quantization.md, "Several variants": the memory-aware choice a text-to-image user makes
with `--transformer auto`).

    prog = chroma.compile(model, (x,), weights=["fp32", "q8", "q4"], out="build/mv")
    prog = chroma.load("build/mv", weights="auto")   # the most accurate variant that fits now
    prog = chroma.load("build/mv", weights="q4")     # this one

The directory holds one complete artifact per variant under `variants/<name>/` and a
manifest (`format: chroma.variants`) listing them with what each needs in memory and its
accuracy report. "auto" needs, per variant, its weights file, its library, the largest arena
of its entry points and its persistent state, plus a margin of MARGIN_BYTES; it compares that
with the memory available now: /proc/meminfo's MemAvailable and, when the process runs under
a cgroup memory limit (v2 memory.max, or v1 memory.limit_in_bytes), what is left of it. It
picks the most accurate variant that fits (smallest relative L2 error of the outputs against
float32 PyTorch; float32 weights count as exact) and prints the decision and its numbers on
one line; when none fits it picks the smallest and says so.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Dict, Optional, Tuple

from ..errors import ArtifactError

VARIANTS_FORMAT = "chroma.variants"
VARIANTS_VERSION = 1
MARGIN_BYTES = 64 << 20  # headroom for the interpreter, NumPy arrays, allocator slack

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

__all__ = ["load_variant", "available_memory", "proc_kib_field", "variant_name", "variant_need", "variant_error",
           "VARIANTS_FORMAT", "VARIANTS_VERSION", "MARGIN_BYTES"]


def variant_name(weights: Any, index: int) -> str:
    """A variant's directory name: its format ("q4"), or v<i> for a dict of rules."""
    if weights is None:
        return "fp32"
    if isinstance(weights, str) and "=" not in weights:
        return weights
    return f"v{index}"


def variant_need(manifest: Dict[str, Any], directory: str) -> Dict[str, int]:
    arena = max((e.get("arena", {}).get("bytes", 0) for e in manifest.get("entries", [])), default=0)
    state = sum(int(s.get("bytes", 0)) for s in manifest.get("state", []) or [])
    lib = os.path.join(directory, manifest["library"]["file"])
    d = {"weights": int(manifest["weights"]["bytes"]), "library": os.path.getsize(lib) if os.path.isfile(lib) else 0,
         "arena": int(arena), "state": int(state), "margin": MARGIN_BYTES}
    d["total"] = sum(d.values())
    return d


def variant_error(manifest: Dict[str, Any]) -> float:
    acc = manifest.get("accuracy")
    if not acc:
        return 0.0  # float32 weights
    return max((o.get("rel_l2", 0.0) for o in acc.get("outputs", [])), default=0.0)


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit():
        return None
    return int(text)


def proc_kib_field(path: str, field: str) -> Optional[int]:
    """The bytes of a "Field:   N kB" line of a /proc file (meminfo, a process's status), or None."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_memory() -> Tuple[Optional[int], Dict[str, Any]]:
    """Bytes of memory available to this process now, and where the figure comes from."""
    info: Dict[str, Any] = {}
    avail = proc_kib_field("/proc/meminfo", "MemAvailable")
    if avail is not None:
        info["MemAvailable"] = avail
    # The cgroup this process is in (v2: one line "0::/path"; v1: the memory controller's).
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            lines = [ln.strip().split(":", 2) for ln in f if ln.strip()]
    except OSError:
        lines = []
    for hid, ctrls, path in (ln for ln in lines if len(ln) == 3):
        if hid == "0" and ctrls == "":
            base = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
            limit, used = _read_int(os.path.join(base, "memory.max")), _read_int(os.path.join(base, "memory.current"))
            if limit is not None and used is not None:
                info["cgroup"] = {"version": 2, "limit": limit, "used": used, "left": max(0, limit - used)}
        elif "memory" in ctrls.split(","):
            base = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
            limit = _read_int(os.path.join(base, "memory.limit_in_bytes"))
            used = _read_int(os.path.join(base, "memory.usage_in_bytes"))
            if limit is not None and used is not None and limit < (1 << 60):
                info["cgroup"] = {"version": 1, "limit": limit, "used": used, "left": max(0, limit - used)}
    figures = [v for v in (info.get("MemAvailable"), info.get("cgroup", {}).get("left")) if v is not None]
    return (min(figures) if figures else None), info


def _mb(b: int) -> str:
    return f"{b / 1e6:.1f} MB"


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < (1 << 62)


def _check_variant(v: Any, where: str) -> None:
    """One entry of a variants manifest: its name and directory, what it needs in memory (each
    part a non-negative byte count, the total their sum) and its error (finite, non-negative)."""
    if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not _NAME.match(v["name"]) \
            or v.get("directory") != f"variants/{v['name']}":
        raise ArtifactError(f"{where} is malformed: expected fields name (letters, digits, _ . -) and directory "
                            f"'variants/<name>'")
    need = v.get("need")
    parts = ("weights", "library", "arena", "state", "margin")
    if not isinstance(need, dict) or not all(_count(need.get(k)) for k in parts + ("total",)):
        raise ArtifactError(f"{where} ('{v['name']}'): field 'need' is {need!r}, expected non-negative byte counts "
                            f"{', '.join(parts)} and total")
    if need["total"] != sum(need[k] for k in parts):
        raise ArtifactError(f"{where} ('{v['name']}'): field 'need.total' is {need['total']}, not the sum of its parts "
                            f"({sum(need[k] for k in parts)})")
    e = v.get("rel_l2")
    if not isinstance(e, (int, float)) or isinstance(e, bool) or not (0 <= e < float("inf")):
        raise ArtifactError(f"{where} ('{v['name']}'): field 'rel_l2' is {e!r}, expected a finite non-negative number")


def load_variant(directory: str, manifest: Dict[str, Any], weights: Optional[str], memory_limit: Optional[int],
                 loader, **kwargs):
    """Picks and loads one variant of a variants artifact (see the module's docstring)."""
    mpath = os.path.join(directory, "manifest.json")
    if manifest.get("version") != VARIANTS_VERSION:
        raise ArtifactError(f"{mpath}: variants format version {manifest.get('version')} is not supported "
                            f"(this runtime reads version {VARIANTS_VERSION})")
    variants = manifest.get("variants")
    if not isinstance(variants, list) or not variants:
        raise ArtifactError(f"{mpath}: field 'variants' must be a non-empty list")
    for i, v in enumerate(variants):
        _check_variant(v, f"{mpath}: variant {i}")
    names = [v["name"] for v in variants]
    if len(set(names)) != len(names):
        raise ArtifactError(f"{mpath}: field 'variants' names a variant twice ({', '.join(names)})")
    if memory_limit is not None:
        if not isinstance(memory_limit, (int, float)) or isinstance(memory_limit, bool) or not 0 <= memory_limit < 2**63:
            raise TypeError(f"memory_limit={memory_limit!r}: expected a number of bytes (a non-negative number) or None")
        memory_limit = int(memory_limit)
    if weights not in (None, "auto"):
        if weights not in names:
            raise ValueError(f"weights={weights!r}: this artifact has the variants {', '.join(names)}")
        chosen = next(v for v in variants if v["name"] == weights)
        line = f"chroma.load: weights={weights} (forced): needs {_mb(chosen['need']['total'])}"
    else:
        avail, info = available_memory()
        if memory_limit is not None:
            avail = memory_limit if avail is None else min(avail, memory_limit)
            info["memory_limit"] = memory_limit
        order = sorted(variants, key=lambda v: (v["rel_l2"], -v["need"]["weights"]))
        fits = [v for v in order if avail is None or v["need"]["total"] <= avail]
        where = ", ".join(
            [f"MemAvailable {_mb(info['MemAvailable'])}"] if "MemAvailable" in info else []) or "MemAvailable unknown"
        if "cgroup" in info:
            c = info["cgroup"]
            where += f", cgroup v{c['version']} limit {_mb(c['limit'])} with {_mb(c['left'])} left"
        if "memory_limit" in info:
            where += f", memory_limit {_mb(info['memory_limit'])}"
        if fits:
            chosen = fits[0]
            skipped = [v for v in order if v is not chosen and v["rel_l2"] < chosen["rel_l2"]]
            why = (f"the most accurate that fits (relative L2 {chosen['rel_l2']:.2e})" if skipped or len(order) == 1
                   else f"the most accurate (relative L2 {chosen['rel_l2']:.2e})")
            more = "; ".join(f"{v['name']} needs {_mb(v['need']['total'])}" for v in skipped)
            line = (f"chroma.load: weights=auto chose {chosen['name']}, {why}: needs {_mb(chosen['need']['total'])} "
                    f"(weights {_mb(chosen['need']['weights'])} + arena, state, library and a "
                    f"{_mb(chosen['need']['margin'])} margin) of {_mb(avail) if avail is not None else 'unknown'} "
                    f"available ({where})" + (f"; more accurate but too large: {more}" if more else ""))
        else:
            chosen = min(variants, key=lambda v: v["need"]["total"])
            line = (f"chroma.load: weights=auto: no variant fits in {_mb(avail)} available ({where}); loading the "
                    f"smallest, {chosen['name']}, which needs {_mb(chosen['need']['total'])}")
    print(line, file=sys.stderr)
    prog = loader(os.path.join(directory, chosen["directory"]), **kwargs)
    prog.variant = {"name": chosen["name"], "decision": line, "variants": names}
    return prog
