"""The GPU package validator: reads a `.chroma-web`, `.chroma-cuda` or `.chroma-metal` file
(docs/webgpu_package.md) and checks every field against the format's rules and the package's
limits before any runtime allocates or dispatches anything. Every GPU runtime (WebGPU, CUDA,
Metal, the SIMT emulator) takes its `Package` from here; the JS runtime (web/src/parse.ts)
applies the same rules, and both are tested on the same corrupt files.

A package is untrusted input (docs/threat_model.md, "GPU packages"): every integer is bounded
(a non-negative integer below 2^53, as JSON numbers in JavaScript), sizes are computed in
Python integers before NumPy sees them, the manifest's JSON may not nest deeper than
`MAX_JSON_DEPTH` or hold NaN or Infinity, and a dispatch may not ask for more invocations
than `work_limit()` allows. Every broken rule raises PackageError naming the field.

Needs only NumPy and ml_dtypes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any, Dict, List, Optional, Tuple, Union

import ml_dtypes
import numpy as np

from ..errors import PackageError
from ..golden import golden_uniform
from .package_format import (ALIGNMENT, DEFAULT_LIMITS, FORMAT_VERSION, HEADER_SIZE, MAGIC, MAX_JSON_DEPTH, STATUS_BYTES,
                             WORK_FLOOR, WORK_PER_WORD)

__all__ = ["Package", "PackageEntry", "Tensor", "read_package", "MAGIC", "FORMAT_VERSION", "HEADER_SIZE", "ALIGN",
           "STATUS_BYTES", "DEFAULT_LIMITS", "DIALECTS", "MAX_SAFE", "MAX_JSON_DEPTH", "work_limit", "WORD",
           "sha256_file"]

ALIGN = ALIGNMENT    # payload sections, arena tensors and uniform offsets
MAX_SAFE = (1 << 53) - 1   # the largest integer a manifest may hold (JavaScript's Number.MAX_SAFE_INTEGER)
DIALECTS = ("wgsl", "cuda", "metal")

_HEADER_FIELDS = ((16, "manifest offset"), (24, "manifest size"), (32, "payload offset"), (40, "payload size"))
_DTYPES = {"float32": np.float32, "int32": np.int32, "int64": np.int64, "int16": np.int16, "int8": np.int8,
           "bool": np.bool_, "uint8": np.uint8, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# How the device stores each dtype (docs/webgpu_package.md "Storage"): int64 narrowed to 32
# bits, 8- and 16-bit types packed; every tensor padded to whole 32-bit words.
_STORAGE = {"float32": "f32", "int32": "i32", "int64": "i32", "int16": "i16", "int8": "i8", "bool": "u8", "uint8": "u8",
            "float16": "f16", "bfloat16": "bf16"}
WORD = {"f32": np.dtype("<f4"), "i32": np.dtype("<i4"), "i16": np.dtype("<i2"), "i8": np.dtype("i1"),
        "u8": np.dtype("u1"), "f16": np.dtype("<f2"), "bf16": np.dtype(ml_dtypes.bfloat16)}
_BINDING_TYPES = ("uniform", "storage", "read-only-storage")
_I32 = np.iinfo(np.int32)


def sha256_file(path: str) -> str:
    """The SHA-256 of a file's bytes, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def work_limit(arena_bytes: int, state_bytes: int) -> int:
    """The most invocations one dispatch of a package with these buffers may launch."""
    return max(WORK_FLOOR, WORK_PER_WORD * ((arena_bytes + state_bytes) // 4))


def _uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SAFE


def _show(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


def _int(d: Any, key: str, where: str, default: Any = None) -> int:
    v = d.get(key, default) if isinstance(d, dict) else None
    if not _uint(v):
        raise PackageError(f"{where}: field '{key}' is {_show(v)}, expected a non-negative integer below 2^53")
    return v


def _list(d: Any, key: str, where: str, default: Any = ()) -> list:
    v = d.get(key, list(default)) if isinstance(d, dict) else None
    if not isinstance(v, list):
        raise PackageError(f"{where}: field '{key}' is {_show(v)}, expected a list")
    return v


def _obj(d: Any, key: str, where: str, default: Any = None) -> dict:
    v = d.get(key, default) if isinstance(d, dict) else None
    if not isinstance(v, dict):
        raise PackageError(f"{where}: field '{key}' is {_show(v)}, expected an object")
    return v


def _str(d: Any, key: str, where: str, default: Any = None) -> str:
    v = d.get(key, default) if isinstance(d, dict) else None
    if not isinstance(v, str):
        raise PackageError(f"{where}: field '{key}' is {_show(v)}, expected a string")
    return v


def _depth(text: bytes) -> int:
    """How deep the JSON text's objects and arrays nest (brackets inside strings skipped)."""
    depth = most = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in (0x5B, 0x7B):
            depth += 1
            most = max(most, depth)
        elif c in (0x5D, 0x7D):
            depth -= 1
    return most


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (NaN and Infinity are not numbers a manifest may hold)")


class Tensor:
    """A tensor the manifest describes: what it is and where it lies (`offset`, `nbytes`).
    Arena, state and weight tensors are in the device's storage (`storage`: int64 as 32 bits,
    8- and 16-bit types packed, padded to whole words); golden tensors are in their own dtype
    (int64 as 8 bytes, bool as 1)."""

    def __init__(self, d: Any, where: str, words: bool, golden: str = ""):
        if not isinstance(d, dict):
            raise PackageError(f"{where} is {_show(d)}, expected an object")
        self.generate: Optional[Dict[str, Any]] = None  # golden inputs: generated from a seed
        self.stride = 1                                  # golden outputs: every stride-th element
        self.name = d.get("name", "")
        if not isinstance(self.name, str):
            raise PackageError(f"{where}: field 'name' is {_show(self.name)}, expected a string")
        dt = d.get("dtype")
        if not isinstance(dt, str) or dt not in _DTYPES:
            raise PackageError(f"{where}: dtype {_show(dt)} is not supported by format version {FORMAT_VERSION}")
        self.dtype = np.dtype(_DTYPES[dt])
        shape = d.get("shape")
        if not isinstance(shape, list) or len(shape) > 64 or not all(_uint(s) for s in shape):
            raise PackageError(f"{where}: field 'shape' is {_show(shape)}, expected at most 64 non-negative integers")
        self.shape = tuple(shape)
        size = math.prod(shape)  # Python integers: no overflow
        if size > MAX_SAFE // 8:
            raise PackageError(f"{where}: shape {list(shape)} has {size} elements, more than any package holds")
        self.size = size
        if golden == "inputs" and "generate" in d:
            g = d["generate"]
            if dt != "float32":
                raise PackageError(f"{where}: only a float32 input is generated (this one is {dt})")
            if (not isinstance(g, dict) or g.get("kind") != "uniform" or not _uint(g.get("seed")) or g["seed"] > 0xFFFFFFFF
                    or not all(isinstance(g.get(k), (int, float)) and not isinstance(g.get(k), bool)
                               and abs(g[k]) <= 3.4e38 for k in ("low", "high"))):
                raise PackageError(f"{where}: field 'generate' is {_show(g)}, expected "
                                   "{'kind': 'uniform', 'seed': a 32-bit unsigned integer, 'low': x, 'high': y}")
            self.generate, self.offset, self.nbytes, self.storage = dict(g), 0, 0, None
            return
        if golden == "outputs" and "stride" in d:
            self.stride = d["stride"]
            if not _uint(self.stride) or self.stride < 1:
                raise PackageError(f"{where}: field 'stride' is {_show(self.stride)}, expected a positive integer")
        self.offset, self.nbytes = _int(d, "offset", where), _int(d, "bytes", where)
        self.storage = _STORAGE[dt] if words else None
        if words and d.get("storage", self.storage) != self.storage:
            raise PackageError(f"{where}: storage {_show(d.get('storage'))} for dtype {dt}, expected {self.storage!r}")
        n = -(-self.size // self.stride)
        want = -(-n * WORD[self.storage].itemsize // 4) * 4 if words else n * self.dtype.itemsize
        if self.nbytes != want:
            raise PackageError(f"{where} ('{self.name}'): {self.nbytes} bytes, but {dt}{list(self.shape)} needs {want}")

    def key(self) -> tuple:
        return (self.name, self.dtype, self.shape, self.offset, self.nbytes, self.stride)

    def decode(self, buf) -> np.ndarray:
        """This tensor as a new NumPy array, from its bytes `buf` (words widened to its dtype);
        a generated golden input from its seed; a sampled golden output flat."""
        if self.generate is not None:
            g = self.generate
            return golden_uniform(self.size, g["seed"], g["low"], g["high"]).reshape(self.shape)
        word = WORD[self.storage] if self.storage else self.dtype.newbyteorder("<")
        if self.stride > 1:
            return np.frombuffer(buf, word, -(-self.size // self.stride)).astype(self.dtype)
        return np.frombuffer(buf, word, self.size).astype(self.dtype).reshape(self.shape)

    def encode(self, a: np.ndarray) -> bytes:
        """`a` (this tensor's dtype and shape) as the device stores it: its `nbytes` bytes."""
        b = np.ascontiguousarray(a, WORD[self.storage]).tobytes()
        return b + bytes(self.nbytes - len(b))

    def __repr__(self):
        return f"{self.name}: {self.dtype}{list(self.shape)}"


class PackageEntry:
    """One entry point of a package: `name`, `inputs`/`outputs` (Tensor), `output_structure`
    and its checked schedule (`dispatches`)."""

    def __init__(self, name: str, inputs: List[Tensor], outputs: List[Tensor], output_structure: Any,
                 dispatches: List[dict]):
        self.name, self.inputs, self.outputs, self.dispatches = name, inputs, outputs, dispatches
        self.output_structure = output_structure
        self.single = output_structure == "single" and len(outputs) == 1

    def __repr__(self):
        return f"PackageEntry({self.name!r}, inputs={self.inputs}, outputs={self.outputs})"


class Package:
    """A package, read and checked (checks 1-3 of docs/webgpu_package.md): `manifest` (the
    parsed JSON), `payload` (a memoryview of the binary sections), `digest` (the header's
    SHA-256, hex), `dialect` ('wgsl', 'cuda' or 'metal'), `limits` (the effective limits:
    WebGPU's defaults raised by `requirements.limits`), `inputs`/`outputs` (Tensor), and the
    checked schedule of each entry."""

    def __init__(self, data: memoryview, where: str = "<bytes>"):
        self.where = where
        m = self._read(data, where)
        self.manifest = m
        try:
            self._check_manifest(m, f"{where}: manifest field")
        except (AttributeError, TypeError, ValueError, OverflowError, KeyError, IndexError) as e:
            if isinstance(e, PackageError):
                raise
            raise PackageError(f"{where}: malformed manifest ({type(e).__name__}: {e})") from None

    def _read(self, data: memoryview, where: str) -> dict:
        """Checks 1 and 2 (the header and the digest); returns the parsed manifest."""
        n = len(data)
        if bytes(data[:8]) != MAGIC[:min(n, 8)]:
            raise PackageError(f"{where}: not a Chroma WebGPU, CUDA or Metal package (magic {bytes(data[:8])!r}, expected {MAGIC!r})")
        if n < HEADER_SIZE:
            raise PackageError(f"{where}: truncated: the file has {n} bytes, less than the {HEADER_SIZE}-byte header")
        version = int.from_bytes(data[8:12], "little")
        hsize = int.from_bytes(data[12:16], "little")
        if version != FORMAT_VERSION:
            raise PackageError(f"{where}: format version {version} is not supported "
                               f"(this runtime reads version {FORMAT_VERSION})")
        if hsize != HEADER_SIZE or any(data[80:96]):
            raise PackageError(f"{where}: header size is {hsize} (expected {HEADER_SIZE}), bytes 80..95 must be zero")
        mo, ms, po, ps = (int.from_bytes(data[at:at + 8], "little") for at, _ in _HEADER_FIELDS)
        for (at, field), v in zip(_HEADER_FIELDS, (mo, ms, po, ps)):
            if v > MAX_SAFE:
                raise PackageError(f"{where}: header field {field} is {v}, larger than any file this runtime reads")
        digest = bytes(data[48:80])
        if mo != HEADER_SIZE or ms == 0 or mo + ms > po:
            raise PackageError(f"{where}: the manifest (offset {mo}, {ms} bytes) must start right after the "
                               f"{HEADER_SIZE}-byte header and end before the payload offset {po}")
        if po % ALIGN:
            raise PackageError(f"{where}: payload offset {po} is not a multiple of {ALIGN}")
        if n < po + ps:
            raise PackageError(f"{where}: truncated: the file has {n} bytes, the header says {po + ps} "
                               f"(payload offset {po} + payload size {ps})")
        if n > po + ps:
            raise PackageError(f"{where}: the file has {n} bytes, {n - po - ps} more than the {po + ps} its header "
                               f"says")
        # The digest covers the manifest and the payload with the manifest's content_hash value
        # (the digest itself, 64 hex digits) replaced by 64 ASCII '0': a digest cannot cover itself.
        self.digest = digest.hex()
        text = bytes(data[mo:mo + ms])
        at = text.find(b'"%s"' % self.digest.encode())
        if at < 0:
            raise PackageError(f"{where}: corrupt: the manifest's content_hash is not the header's digest "
                               f"{self.digest}")
        h = hashlib.sha256(data[mo:mo + at + 1])
        h.update(b"0" * 64)
        h.update(data[mo + at + 65:])
        if h.digest() != digest:
            raise PackageError(f"{where}: corrupt: the SHA-256 of its content is {h.hexdigest()}, "
                               f"the header says {self.digest}")
        if any(data[mo + ms:po]):
            raise PackageError(f"{where}: the bytes between the manifest and the payload must be zero")
        depth = _depth(text)
        if depth > MAX_JSON_DEPTH:
            raise PackageError(f"{where}: the manifest nests objects and arrays {depth} deep, more than the "
                               f"{MAX_JSON_DEPTH} a package may")
        try:
            m = json.loads(text.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
            raise PackageError(f"{where}: the manifest is not UTF-8 JSON ({_show(str(e))})") from None
        if not isinstance(m, dict) or m.get("format") != "chroma.webgpu":
            fmt = m.get("format") if isinstance(m, dict) else m
            raise PackageError(f"{where}: manifest field 'format' is {_show(fmt)}, expected 'chroma.webgpu'")
        if m.get("version") != FORMAT_VERSION:
            raise PackageError(f"{where}: manifest field 'version' is {_show(m.get('version'))}, this runtime reads "
                               f"version {FORMAT_VERSION}")
        if m.get("content_hash") != self.digest:
            raise PackageError(f"{where}: manifest field 'content_hash' is {_show(m.get('content_hash'))}, not the "
                               f"header's digest {self.digest}")
        # Which kernel language the package's code is in: WGSL for WebGPU, CUDA C++ for the CUDA
        # target, MSL for Metal (the same layout and schedule).
        self.dialect = m.get("dialect", "wgsl")
        if self.dialect not in DIALECTS:
            raise PackageError(f"{where}: manifest field 'dialect' is {_show(self.dialect)}, expected one of "
                               f"{', '.join(DIALECTS)}")
        self.payload = data[po:po + ps]
        return m

    def _section(self, off: int, nbytes: int, what: str) -> None:
        if off % ALIGN or off + nbytes > len(self.payload):
            raise PackageError(f"{what}: offset {off} + {nbytes} bytes must be a multiple of {ALIGN} inside the "
                               f"payload ({len(self.payload)} bytes)")

    def _limit(self, name: str, value: int, what: str) -> None:
        most = self.limits[name]
        if value > most:
            raise PackageError(f"{what} is {value}, more than {name} {most} (the package's requirements.limits do not "
                               f"raise it)")

    def _bindable(self, nbytes: int, what: str) -> None:
        self._limit("maxStorageBufferBindingSize", nbytes, what)
        self._limit("maxBufferSize", nbytes, what)

    def _check_manifest(self, m: dict, w: str) -> None:
        req = _obj(m, "requirements", w, {})
        self.features = []
        for i, f in enumerate(_list(req, "features", f"{w} 'requirements'")):
            if not isinstance(f, str):
                raise PackageError(f"{w} 'requirements.features[{i}]' is {_show(f)}, expected a string")
            self.features.append(f)
        self.requested_limits = _obj(req, "limits", f"{w} 'requirements'", {})
        for k, v in self.requested_limits.items():
            if not _uint(v):
                raise PackageError(f"{w} 'requirements.limits.{k}' is {_show(v)}, expected a non-negative integer "
                                   f"below 2^53")
        self.limits = dict(DEFAULT_LIMITS, **self.requested_limits)
        arena = _obj(m, "arena", w)
        self.arena_bytes = _int(arena, "bytes", f"{w} 'arena'")
        self.status_offset = so = _int(arena, "status_offset", f"{w} 'arena'", 0)
        if self.arena_bytes % 4 or so % ALIGN or so + STATUS_BYTES > self.arena_bytes:
            raise PackageError(f"{w} 'arena': {self.arena_bytes} bytes (a multiple of 4) must hold the {STATUS_BYTES}"
                               f"-byte status block at status_offset {so} (a multiple of {ALIGN})")
        self._bindable(self.arena_bytes, f"{w} 'arena.bytes'")
        self.inputs, self.outputs = self._io(m, w)
        params = _obj(m, "params", w, {"offset": 0, "bytes": 0})
        self.params_offset = _int(params, "offset", f"{w} 'params'")
        self.params_bytes = _int(params, "bytes", f"{w} 'params'")
        self._section(self.params_offset, self.params_bytes, f"{w} 'params'")
        if self.params_bytes % 4:
            raise PackageError(f"{w} 'params': {self.params_bytes} bytes is not a multiple of 4")
        self._limit("maxBufferSize", self.params_bytes, f"{w} 'params.bytes'")
        weights, self.shards, self.weights = _obj(m, "weights", w, {}), [], {}
        for i, s in enumerate(_list(weights, "shards", f"{w} 'weights'")):
            where = f"{w} 'weights.shards[{i}]'"
            off, nb = _int(s, "offset", where), _int(s, "bytes", where)
            self._section(off, nb, where)
            if nb == 0 or nb % 4:
                raise PackageError(f"{where}: {nb} bytes, expected a positive multiple of 4")
            self._bindable(nb, f"{where}.bytes")
            self.shards.append((off, nb))
        # The weight table only describes the shards (kernels bind whole shards): its dtypes are
        # checked when weight() decodes a tensor, so a later format's weight types load here.
        for i, d in enumerate(_list(weights, "tensors", f"{w} 'weights'")):
            where = f"{w} 'weights.tensors[{i}]'"
            shard, off, nb = _int(d, "shard", where), _int(d, "offset", where), _int(d, "bytes", where)
            if shard >= len(self.shards) or off + nb > self.shards[shard][1]:
                raise PackageError(f"{where}: shard {shard}, offset {off} + {nb} bytes is not inside one of the "
                                   f"{len(self.shards)} shards")
            self.weights[_str(d, "name", where, "")] = (d, where)
        state = _obj(m, "state", w, {"bytes": 0})
        self.state_bytes, self.state = _int(state, "bytes", f"{w} 'state'"), []
        if self.state_bytes % 4:
            raise PackageError(f"{w} 'state.bytes' is {self.state_bytes}, not a multiple of 4")
        if self.state_bytes:
            self._bindable(self.state_bytes, f"{w} 'state.bytes'")
        for i, d in enumerate(_list(state, "tensors", f"{w} 'state'")):
            where = f"{w} 'state.tensors[{i}]'"
            off, nb, init = _int(d, "offset", where), _int(d, "bytes", where), _int(d, "init", where)
            if off % 4 or nb % 4 or off + nb > self.state_bytes:
                raise PackageError(f"{where}: offset {off} + {nb} bytes must be word-aligned in the state "
                                   f"({self.state_bytes} bytes)")
            self._section(init, nb, where)
            self.state.append((_str(d, "name", where, ""), off, nb, init))
        self.work_limit = work_limit(self.arena_bytes, self.state_bytes)
        self.golden = None
        if "golden" in m:
            self.golden = self._check_golden(_obj(m, "golden", w), w)
        self.kernels = [self._check_kernel(d, f"{w} 'kernels[{k}]'") for k, d in enumerate(_list(m, "kernels", w))]
        self.dispatches = [self._check_dispatch(d, f"{w} 'dispatches[{i}]'")
                           for i, d in enumerate(_list(m, "dispatches", w))]
        self.output_structure = m.get("output_structure", "single")
        self.entries = self._check_entries(m, w)

    def _check_golden(self, g: dict, w: str):
        gold = {}
        for kind, ts in (("inputs", self.inputs), ("outputs", self.outputs)):
            gs = gold[kind] = [Tensor(d, f"{w} 'golden.{kind}[{i}]'", False, kind)
                               for i, d in enumerate(_list(g, kind, f"{w} 'golden'"))]
            if [(t.dtype, t.shape) for t in gs] != [(t.dtype, t.shape) for t in ts]:
                raise PackageError(f"{w} 'golden.{kind}' is {gs}, but the package's {kind} are {ts}")
            for i, t in enumerate(gs):
                if t.generate is None:
                    self._section(t.offset, t.nbytes, f"{w} 'golden.{kind}[{i}]'")
        # Golden int64 inputs go to the device as int32 (the storage): a value beyond it is a
        # package no device can run as stored.
        for i, t in enumerate(gold["inputs"]):
            if t.dtype == np.int64 and t.generate is None and t.size:
                a = t.decode(self.section(t.offset, t.nbytes))
                if a.min() < _I32.min or a.max() > _I32.max:
                    raise PackageError(f"{w} 'golden.inputs[{i}]' ('{t.name}'): int64 value "
                                       f"{a.max() if a.max() > _I32.max else a.min()} does not fit in int32, which the "
                                       f"package stores int64 tensors as")
        tol = g.get("tolerance")
        if not isinstance(tol, dict) or not all(isinstance(tol.get(k), (int, float)) and not isinstance(tol.get(k), bool)
                                                and 0 <= tol[k] <= 3.4e38 for k in ("atol", "rtol")):
            raise PackageError(f"{w} 'golden.tolerance' is {_show(tol)}, expected {{'atol': x, 'rtol': y}} (finite, "
                               f"non-negative)")
        return gold["inputs"], gold["outputs"], {"atol": float(tol["atol"]), "rtol": float(tol["rtol"])}

    def _check_entries(self, m: dict, w: str) -> List[PackageEntry]:
        """Entry points (a decoder's prefill and step): each its own inputs, outputs and schedule
        over the shared buffers and kernels; the top-level fields are the first entry's, and must
        say the same. A package without 'entries' has one, named "main"."""
        entries: List[PackageEntry] = []
        listed = _list(m, "entries", w) if m.get("entries") is not None else []
        for k, e in enumerate(listed):
            at = f"{w} 'entries[{k}]'"
            if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not e["name"]:
                raise PackageError(f"{at}: expected an object with a non-empty 'name'")
            if e["name"] in [x.name for x in entries]:
                raise PackageError(f"{at}: entry name {e['name']!r} given twice")
            ins, outs = self._io(e, at)
            ds = [self._check_dispatch(d, f"{at}.dispatches[{i}]") for i, d in enumerate(_list(e, "dispatches", at))]
            entries.append(PackageEntry(e["name"], ins, outs, e.get("output_structure", "single"), ds))
        if self.dialect == "wgsl" and len(entries) > 1:
            raise PackageError(f"{w} 'entries' lists {len(entries)} entry points ({', '.join(e.name for e in entries)}); a "
                               f"WebGPU package has one")
        if entries:
            first = entries[0]
            same = ([t.key() for t in first.inputs] == [t.key() for t in self.inputs]
                    and [t.key() for t in first.outputs] == [t.key() for t in self.outputs]
                    and first.output_structure == self.output_structure and first.dispatches == self.dispatches)
            if not same:
                raise PackageError(f"{w} 'entries[0]' ('{first.name}') differs from the top-level inputs, outputs, "
                                   f"output_structure and dispatches, which must be the first entry's")
        else:
            entries.append(PackageEntry("main", self.inputs, self.outputs, self.output_structure, self.dispatches))
        return entries

    def _io(self, m: dict, w: str) -> Tuple[List[Tensor], List[Tensor]]:
        """An entry's inputs and outputs: uniquely named, in the arena, off the status block."""
        so = self.status_offset
        inputs = [Tensor(d, f"{w} 'inputs[{i}]'", True) for i, d in enumerate(_list(m, "inputs", w))]
        outputs = [Tensor(d, f"{w} 'outputs[{i}]'", True) for i, d in enumerate(_list(m, "outputs", w))]
        for kind, ts in (("inputs", inputs), ("outputs", outputs)):
            for i, t in enumerate(ts):
                if not t.name or [u.name for u in ts].count(t.name) > 1:
                    raise PackageError(f"{w} '{kind}[{i}]': name {t.name!r}, expected a unique non-empty name")
                end = t.offset + t.nbytes
                on_status = t.nbytes and t.offset < so + STATUS_BYTES and so < end
                if t.offset % ALIGN or end > self.arena_bytes or on_status:
                    raise PackageError(f"{w} '{kind}[{i}]' ('{t.name}'): offset {t.offset} + {t.nbytes} bytes must be "
                                       f"a multiple of {ALIGN} in the arena ({self.arena_bytes} bytes), off the status "
                                       f"block")
        return inputs, outputs

    def _check_kernel(self, d: Any, where: str) -> dict:
        if not isinstance(d, dict):
            raise PackageError(f"{where}: expected an object with the kernel's 'code' and its 'entry' point")
        code, entry, name = _str(d, "code", where), _str(d, "entry", where, "main"), _str(d, "name", where, "")
        wg = _list(d, "workgroup_size", where, [1, 1, 1])
        if len(wg) != 3 or not all(_uint(x) and x > 0 for x in wg):
            raise PackageError(f"{where}: field 'workgroup_size' is {_show(wg)}, expected three positive integers")
        invocations = wg[0] * wg[1] * wg[2]
        self._limit("maxComputeInvocationsPerWorkgroup", invocations, f"{where}: the workgroup's invocations")
        kinds: Dict[int, Tuple[str, int]] = {}  # binding -> (type, uniform bytes)
        for j, b in enumerate(_list(d, "bindings", where)):
            at = f"{where}.bindings[{j}]"
            n = _int(b, "binding", at)
            if b.get("type") not in _BINDING_TYPES or n in kinds:
                raise PackageError(f"{at}: binding {n} of type {_show(b.get('type'))} (expected one of "
                                   f"{_BINDING_TYPES}, each binding once)")
            self._limit("maxBindingsPerBindGroup", n + 1, f"{at}.binding + 1")
            nbytes = 0
            if b["type"] == "uniform":
                nbytes = _int(b, "bytes", at)
                if nbytes == 0 or nbytes % 4:
                    raise PackageError(f"{at}: a uniform binding of {nbytes} bytes, expected a positive multiple of 4")
                self._limit("maxUniformBufferBindingSize", nbytes, f"{at}.bytes")
            kinds[n] = (b["type"], nbytes)
        types = [t for t, _ in kinds.values()]
        if types.count("uniform") > 1:
            raise PackageError(f"{where}: more than one uniform binding")
        self._limit("maxStorageBuffersPerShaderStage", len(types) - types.count("uniform"),
                    f"{where}: the number of storage bindings")
        features = _list(d, "features", where)
        missing = [f for f in features if f not in self.features]
        if missing:
            raise PackageError(f"{where}: features {_show(missing)} are not in 'requirements.features'")
        variants = []
        for j, v in enumerate(_list(d, "variants", where)):
            at = f"{where}.variants[{j}]"
            vf = _list(v, "features", at) if isinstance(v, dict) else None
            if not vf or not all(isinstance(f, str) and f for f in vf):
                raise PackageError(f"{at}: expected {{'features': [one or more feature names], 'code': text}} (a variant "
                                   f"is chosen by the features it needs)")
            variants.append({"features": list(vf), "code": _str(v, "code", at)})
        return {"name": name, "code": code, "entry": entry, "bindings": kinds, "workgroup_size": tuple(wg),
                "invocations": invocations, "variants": variants}

    def _buffer_of(self, b: Any, at: str, writable: bool) -> Tuple[Any, int]:
        """A binding's buffer ('arena', 'state' or ('weights', shard)) and its bytes."""
        buf = b.get("buffer") if isinstance(b, dict) else None
        if buf == "weights":
            shard = _int(b, "shard", at)
            if shard >= len(self.shards):
                raise PackageError(f"{at}: shard index {shard} is out of range (the package has {len(self.shards)} weight "
                                   f"shards)")
            if writable:
                raise PackageError(f"{at}: weights shard {shard} bound read-write")
            return ("weights", shard), self.shards[shard][1]
        if buf not in ("arena", "state") or (buf == "state" and not self.state_bytes):
            raise PackageError(f"{at}: buffer {_show(buf)}, expected 'arena', 'weights' or 'state' (with a non-zero "
                               f"state.bytes)")
        return buf, self.arena_bytes if buf == "arena" else self.state_bytes

    def _check_library(self, d: dict, where: str) -> dict:
        """A library dispatch: a float32 (batched) product for the platform's BLAS (cuBLAS),
        bindings 1, 2, 3 the buffers of A, B and C; every element it addresses must lie in its
        buffer (checked here, before any runtime hands the addresses to a BLAS)."""
        lib = d["library"]
        if self.dialect != "cuda" or not isinstance(lib, dict) or lib.get("op") != "sgemm":
            raise PackageError(f"{where}: field 'library' is {_show(lib)}: a CUDA package's library dispatch is "
                               f"{{'op': 'sgemm', ...}}")
        dims = {k: _int(lib, k, f"{where}.library") for k in ("batch", "m", "n", "k")}
        if min(dims.values()) < 1:
            raise PackageError(f"{where}.library: batch, m, n and k must be positive ({dims})")
        work = dims["batch"] * dims["m"] * dims["n"]
        if work > self.work_limit:
            raise PackageError(f"{where}.library: a product of {work} outputs, more than the {self.work_limit} a "
                               f"dispatch of this package may compute")
        bnd = {}
        for j, b in enumerate(_list(d, "bindings", where)):
            n = _int(b, "binding", f"{where}.bindings[{j}]")
            if n not in (1, 2, 3) or n in bnd:
                raise PackageError(f"{where}.bindings[{j}]: binding {n}: a library dispatch binds 1 (A), 2 (B) and 3 (C) once "
                                   f"each")
            bnd[n] = self._buffer_of(b, f"{where}.bindings[{j}]", n == 3)
        if sorted(bnd) != [1, 2, 3]:
            raise PackageError(f"{where}: a library dispatch binds 1 (A), 2 (B) and 3 (C); it binds {sorted(bnd)}")
        ops = {}
        for name, n, (rows, cols) in (("a", 1, ("m", "k")), ("b", 2, ("k", "n")), ("c", 3, ("m", "n"))):
            o = lib.get(name)
            at = f"{where}.library.{name}"
            v = {k: _int(o, k, at) for k in ("word", "batch_stride", "row_stride", "col_stride")}
            r, c = dims[rows], dims[cols]
            if not ((v["col_stride"] == 1 and v["row_stride"] >= c) or (v["row_stride"] == 1 and v["col_stride"] >= r)) \
                    or (name == "c" and v["col_stride"] != 1):
                raise PackageError(f"{at}: strides {v} do not make a row- or column-major {r} x {c} matrix"
                                   + (" (C must be row-major)" if name == "c" else ""))
            last = v["word"] + (dims["batch"] - 1) * v["batch_stride"] + (r - 1) * v["row_stride"] + (c - 1) * v["col_stride"]
            if 4 * (last + 1) > bnd[n][1]:
                raise PackageError(f"{at}: addresses word {last}, beyond its buffer ({bnd[n][1]} bytes)")
            ops[name] = v
        c = ops["c"]
        if dims["batch"] > 1 and c["batch_stride"] < dims["m"] * c["row_stride"]:
            raise PackageError(f"{where}.library.c: batch stride {c['batch_stride']} overlaps the batches")
        return {"kernel": -1, "library": dict(dims, **ops), "grid": (0, 0, 0), "params": None,
                "bindings": {n: b for n, (b, _) in bnd.items()}, "label": str(d.get("label", "")),
                "node": str(d.get("node", "")), "source": str(d.get("source", ""))}

    def _check_dispatch(self, d: Any, where: str) -> dict:
        if isinstance(d, dict) and "library" in d:
            return self._check_library(d, where)
        k = _int(d, "kernel", where)
        if k >= len(self.kernels):
            raise PackageError(f"{where}: kernel index {k} is out of range (the package has {len(self.kernels)} "
                               f"kernels)")
        kernel = self.kernels[k]
        grid = d.get("grid")
        if not isinstance(grid, list) or len(grid) != 3 or not all(_uint(g) for g in grid):
            raise PackageError(f"{where}: field 'grid' is {_show(grid)}, expected 3 non-negative integers")
        for g in grid:
            self._limit("maxComputeWorkgroupsPerDimension", g, f"{where}: grid dimension")
        work = grid[0] * grid[1] * grid[2] * kernel["invocations"]
        if work > self.work_limit:
            raise PackageError(f"{where}: grid {grid} launches {work} invocations, more than the {self.work_limit} a "
                               f"dispatch of this package may (the work bound: max({WORK_FLOOR}, {WORK_PER_WORD} per word "
                               f"of the arena and state))")
        out = {"kernel": k, "grid": tuple(grid), "params": None, "bindings": {},
               "label": str(d.get("label", "")), "node": str(d.get("node", "")), "source": str(d.get("source", ""))}
        for n, (kind, nbytes) in kernel["bindings"].items():
            if kind == "uniform":
                off = _int(d, "params", where)
                if off % ALIGN or off + nbytes > self.params_bytes:
                    raise PackageError(f"{where}: params offset {off} + {nbytes} bytes must be a multiple of {ALIGN} "
                                       f"inside the params section ({self.params_bytes} bytes)")
                out["params"] = (n, off, nbytes)
        for j, b in enumerate(_list(d, "bindings", where)):
            n, at = _int(b, "binding", f"{where}.bindings[{j}]"), f"{where}.bindings[{j}]"
            kind = kernel["bindings"].get(n, ("",))[0]
            if kind not in ("storage", "read-only-storage") or n in out["bindings"]:
                raise PackageError(f"{at}: binding {n} is not a storage binding kernel {k} ('{kernel['name']}') "
                                   f"declares, or is bound twice")
            out["bindings"][n] = self._buffer_of(b, at, kind != "read-only-storage")[0]
        unbound = [n for n, (kind, _) in kernel["bindings"].items() if kind != "uniform" and n not in out["bindings"]]
        if unbound:
            raise PackageError(f"{where}: kernel {k} ('{kernel['name']}') bindings {unbound} are not bound")
        return out

    def section(self, offset: int, nbytes: int) -> memoryview:
        """`nbytes` of the payload at `offset`."""
        return self.payload[offset:offset + nbytes]

    def weight(self, name: str) -> np.ndarray:
        """The weight tensor `name` as the kernels see it (int64 narrowed to int32 values)."""
        if name not in self.weights:
            raise KeyError(f"{self.where}: no weight tensor '{name}' (have: {', '.join(self.weights)})")
        d, where = self.weights[name]
        t = Tensor(d, where, True)
        if t.offset + t.nbytes > self.shards[d["shard"]][1]:
            raise PackageError(f"{where}: offset {t.offset} + {t.nbytes} bytes lies outside shard {d['shard']}")
        return t.decode(self.section(self.shards[d["shard"]][0] + t.offset, t.nbytes))

    def golden_inputs(self) -> List[np.ndarray]:
        return [t.decode(self.section(t.offset, t.nbytes)) for t in (self.golden[0] if self.golden else [])]

    def golden_outputs(self) -> List[np.ndarray]:
        return [t.decode(self.section(t.offset, t.nbytes)) for t in (self.golden[1] if self.golden else [])]

    def __repr__(self):
        return f"Package({self.where!r}, dialect={self.dialect!r}, inputs={self.inputs}, outputs={self.outputs})"


def read_package(source: Union[str, os.PathLike, bytes, bytearray, memoryview]) -> Package:
    """Reads and checks a GPU package (a path, or its bytes). Raises PackageError naming the
    field that breaks the format."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return Package(memoryview(bytes(source) if not isinstance(source, bytes) else source), "<bytes>")
    path = os.fspath(source)
    with open(path, "rb") as f:
        return Package(memoryview(f.read()), path)
