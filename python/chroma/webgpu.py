"""The Python runtime of WebGPU packages (`.chroma-web`, docs/webgpu_package.md), on wgpu-py.

    prog = chroma.webgpu.WebGPUProgram("build/m.chroma-web")
    y = prog(x)                      # NumPy in, NumPy out
    prog.self_check()                # {'ok': True, 'max_error': ..., 'tolerance': {...}, ...}

`read_package` needs only NumPy; `WebGPUProgram` imports `wgpu` when one is created.

Choosing the adapter: wgpu-native runs on Vulkan here, and the Vulkan loader takes its driver
(ICD) from the environment variable VK_ICD_FILENAMES, read when wgpu creates its instance (at
the process's first adapter request), so set it before that:
    Mesa's lavapipe  VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json  (has shader-f16)
    SwiftShader      VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json    (Chromium's)
or pass an adapter of your own: ``WebGPUProgram(path, adapter=wgpu.gpu.enumerate_adapters_sync()[i])``.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
from typing import Any, Dict, List, Optional, Tuple, Union

import ml_dtypes
import numpy as np

from .golden import golden_uniform
from .program import ArtifactError

__all__ = ["Package", "PackageError", "RunError", "Tensor", "WebGPUProgram", "read_package", "FORMAT_VERSION"]

MAGIC = b"CHROMAWB"
FORMAT_VERSION = 2
HEADER_SIZE = 96
ALIGN = 256          # payload sections, arena tensors and uniform offsets
STATUS_BYTES = 256   # the status block at arena.status_offset
_HEADER = struct.Struct("<8sIIQQQQ32s16s")

_DTYPES = {"float32": np.float32, "int32": np.int32, "int64": np.int64, "int16": np.int16, "int8": np.int8,
           "bool": np.bool_, "uint8": np.uint8, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# How the device stores each dtype (docs/webgpu_package.md "Storage"): int64 narrowed to 32
# bits, 8- and 16-bit types packed; every tensor padded to whole 32-bit words.
_STORAGE = {"float32": "f32", "int32": "i32", "int64": "i32", "int16": "i16", "int8": "i8", "bool": "u8", "uint8": "u8",
            "float16": "f16", "bfloat16": "bf16"}
_WORD = {"f32": np.dtype("<f4"), "i32": np.dtype("<i4"), "i16": np.dtype("<i2"), "i8": np.dtype("i1"),
         "u8": np.dtype("u1"), "f16": np.dtype("<f2"), "bf16": np.dtype(ml_dtypes.bfloat16)}
_BINDING_TYPES = ("uniform", "storage", "read-only-storage")
_I32 = np.iinfo(np.int32)
_CLOSED = "the program was closed"


class PackageError(ArtifactError):
    """A corrupt, truncated, malformed or mismatched `.chroma-web` package."""


class RunError(RuntimeError):
    """The GPU cannot run the package (a missing feature or limit), or a call failed (a bad
    index a kernel reported, a lost device)."""


def _load_triton_first() -> None:
    """Loads Triton's native library before a Vulkan driver, when Triton is installed (torch
    brings it): loaded after lavapipe or SwiftShader, it crashes the process (a segmentation
    fault in its module initialisation, seen with torch 2.14's Triton), and torch.export
    imports it, so a process that compiles another model after running a package would die."""
    import importlib.util

    if importlib.util.find_spec("triton") is not None:
        try:
            import triton._C.libtriton  # noqa: F401
        except ImportError:
            pass


class IndexOutOfRange(RunError, IndexError):
    """A gather or index write met an index outside its dimension (the status block)."""


def _uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _int(d: Any, key: str, where: str, default: Any = None) -> int:
    v = d.get(key, default) if isinstance(d, dict) else None
    if not _uint(v):
        raise PackageError(f"{where}: field '{key}' is {v!r}, expected a non-negative integer")
    return v


def _list(d: Any, key: str, where: str) -> list:
    v = d.get(key, []) if isinstance(d, dict) else None
    if not isinstance(v, list):
        raise PackageError(f"{where}: field '{key}' is {v!r}, expected a list")
    return v


class Tensor:
    """A tensor the manifest describes: what it is and where it lies (`offset`, `nbytes`).
    Arena, state and weight tensors are in the device's storage (`storage`: int64 as 32 bits,
    8- and 16-bit types packed, padded to whole words); golden tensors are in their own dtype
    (int64 as 8 bytes, bool as 1)."""

    def __init__(self, d: Any, where: str, words: bool, golden: str = ""):
        if not isinstance(d, dict):
            raise PackageError(f"{where} is {d!r}, expected an object")
        self.generate: Optional[Dict[str, Any]] = None  # golden inputs: generated from a seed
        self.stride = 1                                  # golden outputs: every stride-th element
        self.name = str(d.get("name", ""))
        dt = d.get("dtype")
        if dt not in _DTYPES:
            raise PackageError(f"{where}: dtype {dt!r} is not supported by format version {FORMAT_VERSION}")
        self.dtype = np.dtype(_DTYPES[dt])
        shape = d.get("shape")
        if not isinstance(shape, list) or not all(_uint(s) for s in shape):
            raise PackageError(f"{where}: field 'shape' is {shape!r}, expected a list of non-negative integers")
        self.shape = tuple(shape)
        self.size = int(np.prod(shape, dtype=np.int64))
        if golden == "inputs" and "generate" in d:
            g = d["generate"]
            if dt != "float32":
                raise PackageError(f"{where}: only a float32 input is generated (this one is {dt})")
            if (not isinstance(g, dict) or g.get("kind") != "uniform" or not _uint(g.get("seed")) or g["seed"] > 0xFFFFFFFF
                    or not all(isinstance(g.get(k), (int, float)) and np.isfinite(g[k]) for k in ("low", "high"))):
                raise PackageError(f"{where}: field 'generate' is {g!r}, expected "
                                   "{'kind': 'uniform', 'seed': a 32-bit unsigned integer, 'low': x, 'high': y}")
            self.generate, self.offset, self.nbytes, self.storage = dict(g), 0, 0, None
            return
        if golden == "outputs" and "stride" in d:
            self.stride = d["stride"]
            if not _uint(self.stride) or self.stride < 1:
                raise PackageError(f"{where}: field 'stride' is {self.stride!r}, expected a positive integer")
        self.offset, self.nbytes = _int(d, "offset", where), _int(d, "bytes", where)
        self.storage = _STORAGE[dt] if words else None
        if words and d.get("storage", self.storage) != self.storage:
            raise PackageError(f"{where}: storage {d.get('storage')!r} for dtype {dt}, expected {self.storage!r}")
        n = -(-self.size // self.stride)
        want = -(-n * _WORD[self.storage].itemsize // 4) * 4 if words else n * self.dtype.itemsize
        if self.nbytes != want:
            raise PackageError(f"{where} ('{self.name}'): {self.nbytes} bytes, but {dt}{list(self.shape)} needs {want}")

    def decode(self, buf) -> np.ndarray:
        """This tensor as a new NumPy array, from its bytes `buf` (words widened to its dtype);
        a generated golden input from its seed; a sampled golden output flat."""
        if self.generate is not None:
            g = self.generate
            return golden_uniform(self.size, g["seed"], g["low"], g["high"]).reshape(self.shape)
        word = _WORD[self.storage] if self.storage else self.dtype.newbyteorder("<")
        if self.stride > 1:
            return np.frombuffer(buf, word, -(-self.size // self.stride)).astype(self.dtype)
        return np.frombuffer(buf, word, self.size).astype(self.dtype).reshape(self.shape)

    def encode(self, a: np.ndarray) -> bytes:
        """`a` (this tensor's dtype and shape) as the device stores it: its `nbytes` bytes."""
        b = np.ascontiguousarray(a, _WORD[self.storage]).tobytes()
        return b + bytes(self.nbytes - len(b))

    def __repr__(self):
        return f"{self.name}: {self.dtype}{list(self.shape)}"


class PackageEntry:
    """One entry point of a package: `name`, `inputs`/`outputs` (Tensor), `output_structure`
    and its checked schedule (`dispatches`)."""

    def __init__(self, name: str, inputs: List[Tensor], outputs: List[Tensor], output_structure: Any,
                 dispatches: List[dict]):
        self.name, self.inputs, self.outputs, self.dispatches = name, inputs, outputs, dispatches
        self.single = output_structure == "single" and len(outputs) == 1

    def __repr__(self):
        return f"PackageEntry({self.name!r}, inputs={self.inputs}, outputs={self.outputs})"


class Package:
    """A package, read and checked (checks 1-3 of docs/webgpu_package.md): `manifest` (the
    parsed JSON), `payload` (a memoryview of the binary sections), `digest` (the header's
    SHA-256, hex), `inputs`/`outputs` (Tensor), and the checked schedule."""

    def __init__(self, data: memoryview, where: str = "<bytes>"):
        self.where = where
        n = len(data)
        if bytes(data[:8]) != MAGIC[:min(n, 8)]:
            raise PackageError(f"{where}: not a Chroma WebGPU package (magic {bytes(data[:8])!r}, expected {MAGIC!r})")
        if n < HEADER_SIZE:
            raise PackageError(f"{where}: truncated: the file has {n} bytes, less than the {HEADER_SIZE}-byte header")
        _, version, hsize, mo, ms, po, ps, digest, zero = _HEADER.unpack_from(data, 0)
        if version != FORMAT_VERSION:
            raise PackageError(f"{where}: format version {version} is not supported "
                               f"(this runtime reads version {FORMAT_VERSION})")
        if hsize != HEADER_SIZE or any(zero):
            raise PackageError(f"{where}: header size is {hsize} (expected {HEADER_SIZE}), bytes 80..95 must be zero")
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
        try:
            m = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PackageError(f"{where}: the manifest is not UTF-8 JSON ({e})") from None
        fmt = m.get("format") if isinstance(m, dict) else None
        if fmt != "chroma.webgpu":
            raise PackageError(f"{where}: manifest field 'format' is {fmt!r}, expected 'chroma.webgpu'")
        if m.get("version") != FORMAT_VERSION:
            raise PackageError(f"{where}: manifest field 'version' is {m.get('version')!r}, this runtime reads "
                               f"version {FORMAT_VERSION}")
        if m.get("content_hash") != self.digest:
            raise PackageError(f"{where}: manifest field 'content_hash' is {m.get('content_hash')!r}, not the header's "
                               f"digest {self.digest}")
        # Which kernel language the package's code is in: WGSL for WebGPU, CUDA C++ for the CUDA
        # target (the same layout and schedule; chroma.simt runs it on the CPU emulator).
        self.dialect = m.get("dialect", "wgsl")
        if self.dialect not in ("wgsl", "cuda", "metal"):
            raise PackageError(f"{where}: manifest field 'dialect' is {self.dialect!r}, expected 'wgsl', 'cuda' or "
                               f"'metal'")
        self.manifest, self.payload = m, data[po:po + ps]
        try:
            self._check_manifest(m, f"{where}: manifest field")
        except (AttributeError, TypeError, ValueError) as e:
            if isinstance(e, PackageError):
                raise
            raise PackageError(f"{where}: malformed manifest ({type(e).__name__}: {e})") from None

    def _section(self, off: int, nbytes: int, what: str) -> None:
        if off % ALIGN or off + nbytes > len(self.payload):
            raise PackageError(f"{what}: offset {off} + {nbytes} bytes must be a multiple of {ALIGN} inside the "
                               f"payload ({len(self.payload)} bytes)")

    def _check_manifest(self, m: dict, w: str) -> None:
        req = m.get("requirements", {})
        self.features = [str(f) for f in _list(req, "features", f"{w} 'requirements'")]
        self.limits = req.get("limits", {})
        if not isinstance(self.limits, dict) or not all(_uint(v) for v in self.limits.values()):
            raise PackageError(f"{w} 'requirements.limits' must map limit names to non-negative integers")
        arena = m.get("arena")
        self.arena_bytes = _int(arena, "bytes", f"{w} 'arena'")
        self.status_offset = so = _int(arena, "status_offset", f"{w} 'arena'", 0)
        if self.arena_bytes % 4 or so % ALIGN or so + STATUS_BYTES > self.arena_bytes:
            raise PackageError(f"{w} 'arena': {self.arena_bytes} bytes (a multiple of 4) must hold the {STATUS_BYTES}"
                               f"-byte status block at status_offset {so} (a multiple of {ALIGN})")
        self.inputs, self.outputs = self._io(m, w)
        params = m.get("params", {"offset": 0, "bytes": 0})
        self.params_offset = _int(params, "offset", f"{w} 'params'")
        self.params_bytes = _int(params, "bytes", f"{w} 'params'")
        self._section(self.params_offset, self.params_bytes, f"{w} 'params'")
        if self.params_bytes % 4:
            raise PackageError(f"{w} 'params': {self.params_bytes} bytes is not a multiple of 4")
        weights, self.shards, self.weights = m.get("weights", {}), [], {}
        for i, s in enumerate(_list(weights, "shards", f"{w} 'weights'")):
            where = f"{w} 'weights.shards[{i}]'"
            off, nb = _int(s, "offset", where), _int(s, "bytes", where)
            self._section(off, nb, where)
            if nb == 0 or nb % 4:
                raise PackageError(f"{where}: {nb} bytes, expected a positive multiple of 4")
            self.shards.append((off, nb))
        # The weight table only describes the shards (kernels bind whole shards): its dtypes are
        # checked when weight() decodes a tensor, so a later format's weight types load here.
        for i, d in enumerate(_list(weights, "tensors", f"{w} 'weights'")):
            where = f"{w} 'weights.tensors[{i}]'"
            shard, off, nb = _int(d, "shard", where), _int(d, "offset", where), _int(d, "bytes", where)
            if shard >= len(self.shards) or off + nb > self.shards[shard][1]:
                raise PackageError(f"{where}: shard {shard}, offset {off} + {nb} bytes is not inside one of the "
                                   f"{len(self.shards)} shards")
            self.weights[str(d.get("name", ""))] = (d, where)
        state = m.get("state", {"bytes": 0})
        self.state_bytes, self.state = _int(state, "bytes", f"{w} 'state'"), []
        for i, d in enumerate(_list(state, "tensors", f"{w} 'state'")):
            where = f"{w} 'state.tensors[{i}]'"
            off, nb, init = _int(d, "offset", where), _int(d, "bytes", where), _int(d, "init", where)
            if off % 4 or nb % 4 or off + nb > self.state_bytes:
                raise PackageError(f"{where}: offset {off} + {nb} bytes must be word-aligned in the state "
                                   f"({self.state_bytes} bytes)")
            self._section(init, nb, where)
            self.state.append((str(d.get("name", "")), off, nb, init))
        self.golden = None
        if "golden" in m:
            g, gold = m["golden"], {}
            for kind, ts in (("inputs", self.inputs), ("outputs", self.outputs)):
                gs = gold[kind] = [Tensor(d, f"{w} 'golden.{kind}[{i}]'", False, kind)
                                   for i, d in enumerate(_list(g, kind, f"{w} 'golden'"))]
                if [(t.dtype, t.shape) for t in gs] != [(t.dtype, t.shape) for t in ts]:
                    raise PackageError(f"{w} 'golden.{kind}' is {gs}, but the package's {kind} are {ts}")
                for i, t in enumerate(gs):
                    self._section(t.offset, t.nbytes, f"{w} 'golden.{kind}[{i}]'")
            tol = g.get("tolerance")
            if not isinstance(tol, dict) or not all(isinstance(tol.get(k), (int, float)) and tol[k] >= 0
                                                    for k in ("atol", "rtol")):
                raise PackageError(f"{w} 'golden.tolerance' is {tol!r}, expected {{'atol': x, 'rtol': y}}")
            self.golden = (gold["inputs"], gold["outputs"], {"atol": float(tol["atol"]), "rtol": float(tol["rtol"])})
        self.kernels = [self._check_kernel(d, f"{w} 'kernels[{k}]'") for k, d in enumerate(_list(m, "kernels", w))]
        self.dispatches = [self._check_dispatch(d, f"{w} 'dispatches[{i}]'")
                           for i, d in enumerate(_list(m, "dispatches", w))]
        # Entry points (a decoder's prefill and step): each its own inputs, outputs and schedule
        # over the shared buffers and kernels; the top-level fields are the first entry's. A
        # package without 'entries' has one, named "main".
        self.entries: List[PackageEntry] = []
        for k, e in enumerate(m.get("entries") or []):
            at = f"{w} 'entries[{k}]'"
            if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not e["name"]:
                raise PackageError(f"{at}: expected an object with a non-empty 'name'")
            if e["name"] in [x.name for x in self.entries]:
                raise PackageError(f"{at}: entry name {e['name']!r} given twice")
            ins, outs = self._io(e, at)
            ds = [self._check_dispatch(d, f"{at}.dispatches[{i}]") for i, d in enumerate(_list(e, "dispatches", at))]
            self.entries.append(PackageEntry(e["name"], ins, outs, e.get("output_structure", "single"), ds))
        if not self.entries:
            self.entries.append(PackageEntry("main", self.inputs, self.outputs, m.get("output_structure", "single"),
                                             self.dispatches))

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
        if not isinstance(d, dict) or not isinstance(d.get("code"), str) or not isinstance(d.get("entry", "main"), str):
            raise PackageError(f"{where}: expected an object with the WGSL 'code' and its 'entry' point")
        kinds: Dict[int, Tuple[str, int]] = {}  # binding -> (type, uniform bytes)
        for j, b in enumerate(_list(d, "bindings", where)):
            n = _int(b, "binding", f"{where}.bindings[{j}]")
            if b.get("type") not in _BINDING_TYPES or n in kinds:
                raise PackageError(f"{where}.bindings[{j}]: binding {n} of type {b.get('type')!r} (expected one of "
                                   f"{_BINDING_TYPES}, each binding once)")
            kinds[n] = (b["type"], _int(b, "bytes", f"{where}.bindings[{j}]") if b["type"] == "uniform" else 0)
        if [t for t, _ in kinds.values()].count("uniform") > 1:
            raise PackageError(f"{where}: more than one uniform binding")
        missing = [f for f in _list(d, "features", where) if f not in self.features]
        if missing:
            raise PackageError(f"{where}: features {missing} are not in 'requirements.features'")
        return {"name": str(d.get("name", "")), "code": d["code"], "entry": d.get("entry", "main"), "bindings": kinds}

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
            raise PackageError(f"{at}: buffer {buf!r}, expected 'arena', 'weights' or 'state' (with a non-zero state.bytes)")
        return buf, self.arena_bytes if buf == "arena" else self.state_bytes

    def _check_library(self, d: dict, where: str) -> dict:
        """A library dispatch: a float32 (batched) product for the platform's BLAS (cuBLAS),
        bindings 1, 2, 3 the buffers of A, B and C; every element it addresses must lie in its
        buffer (checked here, before any runtime hands the addresses to a BLAS)."""
        lib = d["library"]
        if self.dialect != "cuda" or not isinstance(lib, dict) or lib.get("op") != "sgemm":
            raise PackageError(f"{where}: field 'library' is {lib!r}: a CUDA package's library dispatch is "
                               f"{{'op': 'sgemm', ...}}")
        dims = {k: _int(lib, k, f"{where}.library") for k in ("batch", "m", "n", "k")}
        if min(dims.values()) < 1:
            raise PackageError(f"{where}.library: batch, m, n and k must be positive ({dims})")
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
            raise PackageError(f"{where}: field 'grid' is {grid!r}, expected 3 non-negative integers")
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
        return t.decode(self.section(self.shards[d["shard"]][0] + t.offset, t.nbytes))

    def golden_inputs(self) -> List[np.ndarray]:
        return [t.decode(self.section(t.offset, t.nbytes)) for t in (self.golden[0] if self.golden else [])]

    def golden_outputs(self) -> List[np.ndarray]:
        return [t.decode(self.section(t.offset, t.nbytes)) for t in (self.golden[1] if self.golden else [])]

    def __repr__(self):
        return f"Package({self.where!r}, inputs={self.inputs}, outputs={self.outputs})"


def read_package(source: Union[str, os.PathLike, bytes, bytearray, memoryview]) -> Package:
    """Reads and checks a `.chroma-web` package (a path, or its bytes). Raises PackageError
    naming the field that breaks the format."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return Package(memoryview(bytes(source) if not isinstance(source, bytes) else source), "<bytes>")
    path = os.fspath(source)
    with open(path, "rb") as f:
        return Package(memoryview(f.read()), path)


def _limit_key(name: str, adapter_limits) -> Optional[str]:
    """wgpu-py's key for the WebGPU limit `name` ('maxStorageBufferBindingSize' ->
    'max-storage-buffer-binding-size', 'maxTextureDimension1D' -> 'max-texture-dimension-1d')."""
    flat = name.replace("-", "").lower()
    return next((k for k in adapter_limits if k.replace("-", "").lower() == flat), None)


class GpuEntry:
    """One entry point of a loaded GPU program (``prog.entry("step")``): called like the
    program, with its own inputs and outputs; ``out=`` (one output) receives the result."""

    def __init__(self, prog: Any, index: int, e: PackageEntry):
        self._prog, self._index, self.name, self.inputs, self.outputs = prog, index, e.name, e.inputs, e.outputs

    def __call__(self, *arrays: Any, out: Optional[np.ndarray] = None, **named: Any):
        res = self._prog._call_entry(self._index, arrays, named)
        if out is not None:
            if isinstance(res, tuple):
                raise TypeError(f"entry '{self.name}': out= takes one output, this entry returns {len(res)}")
            np.copyto(out, res)
            return out
        return res

    def __repr__(self):
        return f"GpuEntry({self.name!r}, inputs={self.inputs}, outputs={self.outputs})"


class WebGPUProgram:
    """A package loaded on a WebGPU device. Call it with NumPy arrays (positionally, or by
    input name); it returns one array, or a tuple when the model returns several.

    Loading checks the package, then the adapter's features and limits before the device is
    created (with exactly the package's), creates every buffer, uploads the weights, uniform
    values and initial state once, and creates every pipeline and bind group. Pipelines are
    created one by one with create_compute_pipeline: wgpu-py 0.32's wgpu-native backend
    implements create_compute_pipeline_async by calling it, so there is no parallelism to gain.
    Calls are serialized. A GPU error during a call (a lost device, a failed submission) makes
    that call and every later one raise RunError with its reason.
    """

    def __init__(self, package: Union[Package, str, os.PathLike, bytes], adapter: Any = None):
        import wgpu  # only here: read_package and `import chroma` work without it

        _load_triton_first()

        t0 = time.perf_counter()
        self._wgpu = wgpu
        self.package = p = package if isinstance(package, Package) else read_package(package)
        if p.dialect != "wgsl":
            raise PackageError(f"{p.where}: a {p.dialect} package, not WebGPU's (WGSL); "
                               f"chroma.load(directory, emulate=True) runs a CUDA or Metal artifact on the CPU emulator")
        if len(p.entries) > 1:
            raise PackageError(f"{p.where}: a package with entries {[e.name for e in p.entries]}: this runtime runs "
                               f"single-entry packages")
        self.inputs, self.outputs = p.inputs, p.outputs
        self._lock = threading.Lock()
        self._lost: Optional[str] = None
        self._calls = 0
        if adapter is None:
            why = "none offered"
            try:
                adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
            except RuntimeError as e:
                why = str(e)
            if adapter is None:
                raise RunError(f"no WebGPU adapter ({why}); choose a Vulkan driver with VK_ICD_FILENAMES "
                               f"(see chroma.webgpu's docstring)")
        self.adapter = adapter
        info = dict(adapter.info)
        name = f"{info.get('device') or info.get('description')} ({info.get('backend_type')} " \
               f"{info.get('adapter_type')})"
        for f in p.features:
            if f not in adapter.features:
                raise RunError(f"{p.where}: the adapter {name} lacks the feature '{f}' the package requires")
        limits = {}
        for lim, want in p.limits.items():
            key = _limit_key(lim, adapter.limits)
            if key is None:
                raise RunError(f"{p.where}: requirements.limits names '{lim}', a limit the adapter {name} does not "
                               f"report")
            have = adapter.limits[key]
            if (have > want) if lim.startswith("min") else (have < want):  # min* limits: smaller is better
                raise RunError(f"{p.where}: the package requires the limit {lim} = {want}, but the adapter {name} "
                               f"offers {have}")
            limits[key] = want
        try:
            self.device = dev = adapter.request_device_sync(required_features=list(p.features), required_limits=limits)
        except Exception as e:  # noqa: BLE001 - wgpu raises RuntimeError or a GPUError
            raise RunError(f"{p.where}: the adapter {name} refused the device: {e}") from None
        try:
            dev.lost_async.then(lambda i: setattr(self, "_lost", f"the device was lost ({i.reason}): {i.message}"))
        except Exception:  # noqa: BLE001 - wgpu-py 0.32 does not implement `lost` on wgpu-native
            pass
        try:
            at, pipeline_seconds = self._create(wgpu, p, dev, name)
        except BaseException as e:
            dev.destroy()  # a package the device rejects leaves nothing behind
            if isinstance(e, wgpu.GPUError):
                raise RunError(f"{p.where}: the device ({name}) rejected the package: {e}") from None
            raise
        self._single = p.manifest.get("output_structure", "single") == "single" and len(p.outputs) == 1
        sizes = {"arena": p.arena_bytes, "state": p.state_bytes, "weights": sum(nb for _, nb in p.shards),
                 "params": p.params_bytes, "staging": at}
        self._info = {"adapter": info, "adapter_name": name, "kernels": len(p.kernels),
                      "dispatches": len(p.dispatches), "pipelines": len(self._pipelines), "pipeline_creation": "sync",
                      "limits": limits, "buffer_bytes": dict(sizes, total=sum(sizes.values())),
                      "load_seconds": time.perf_counter() - t0, "pipeline_seconds": pipeline_seconds}

    def _create(self, wgpu: Any, p: Package, dev: Any, name: str) -> Tuple[int, float]:
        """Buffers (filled), pipelines and bind groups; returns the staging size and the seconds
        the pipelines took."""
        maxgrid = dev.limits["max-compute-workgroups-per-dimension"]
        for i, d in enumerate(p.dispatches):
            if max(d["grid"]) > maxgrid:
                raise RunError(f"{p.where}: dispatch {i} ('{d['label']}') has grid {list(d['grid'])}, more than the "
                               f"device's maxComputeWorkgroupsPerDimension {maxgrid}")

        # Buffers the package does not raise the limits for must fit the defaults.
        for what, nbytes, storage in [("arena.bytes", p.arena_bytes, True), ("state.bytes", p.state_bytes, True),
                                      ("params.bytes", p.params_bytes, False)] + \
                [(f"weights.shards[{i}].bytes", nb, True) for i, (_, nb) in enumerate(p.shards)]:
            for lim in ("maxBufferSize", "maxStorageBufferBindingSize")[:1 + storage]:
                most = dev.limits[_limit_key(lim, dev.limits)]
                if nbytes > most:
                    raise PackageError(f"{p.where}: manifest field '{what}' is {nbytes}, more than the device's {lim} "
                                       f"{most} (requirements.limits does not ask for more)")

        U, q = wgpu.BufferUsage, dev.queue
        self._arena = dev.create_buffer(label="arena", size=p.arena_bytes, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
        self._state = None
        if p.state_bytes:
            self._state = dev.create_buffer(label="state", size=p.state_bytes,
                                            usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
            self._write_state()
        self._shards = []
        for i, (off, nb) in enumerate(p.shards):
            self._shards.append(dev.create_buffer(label=f"weights{i}", size=nb, usage=U.STORAGE | U.COPY_DST))
            q.write_buffer(self._shards[-1], 0, p.section(off, nb))
        self._params = None
        if p.params_bytes:
            self._params = dev.create_buffer(label="params", size=p.params_bytes, usage=U.UNIFORM | U.COPY_DST)
            q.write_buffer(self._params, 0, p.section(p.params_offset, p.params_bytes))
        # One staging buffer: the status block at 0, then each output at a multiple of 8.
        self._out_at, at = [], STATUS_BYTES
        for t in p.outputs:
            self._out_at.append(at)
            at += (t.nbytes + 7) // 8 * 8
        self._staging = dev.create_buffer(label="staging", size=at, usage=U.MAP_READ | U.COPY_DST)

        t1 = time.perf_counter()
        self._pipelines = []
        for k, kernel in enumerate(p.kernels):
            entries = [{"binding": n, "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": kind, "min_binding_size": nbytes}}
                       for n, (kind, nbytes) in sorted(kernel["bindings"].items())]
            try:
                layout = dev.create_bind_group_layout(label=kernel["name"], entries=entries)
                module = dev.create_shader_module(label=kernel["name"], code=kernel["code"])
                pipe = dev.create_compute_pipeline(
                    label=kernel["name"], layout=dev.create_pipeline_layout(bind_group_layouts=[layout]),
                    compute={"module": module, "entry_point": kernel["entry"]})
            except wgpu.GPUError as e:
                raise PackageError(f"{p.where}: kernel {k} ('{kernel['name']}') does not compile on {name}: "
                                   f"{e}") from None
            self._pipelines.append((layout, pipe))
        pipeline_seconds = time.perf_counter() - t1

        self._schedule = []
        for i, d in enumerate(p.dispatches):
            layout, pipe = self._pipelines[d["kernel"]]
            entries = []
            if d["params"]:
                n, off, nbytes = d["params"]
                entries.append({"binding": n, "resource": {"buffer": self._params, "offset": off, "size": nbytes}})
            for n, buf in d["bindings"].items():
                gpu = self._shards[buf[1]] if isinstance(buf, tuple) else self._arena if buf == "arena" else self._state
                entries.append({"binding": n, "resource": {"buffer": gpu, "offset": 0, "size": gpu.size}})
            try:
                group = dev.create_bind_group(label=d["label"], layout=layout, entries=entries)
            except wgpu.GPUError as e:
                raise PackageError(f"{p.where}: dispatch {i} ('{d['label']}'): bind group rejected: {e}") from None
            self._schedule.append((pipe, group, d["grid"]))
        return at, pipeline_seconds

    @property
    def stats(self) -> Dict[str, Any]:
        """The compiler's statistics from the manifest (kernels, dispatches, arena bytes...)."""
        return dict(self.package.manifest.get("stats", {}))

    @property
    def info(self) -> Dict[str, Any]:
        """What this runtime did: the adapter, seconds to load (all of it) and to create the
        pipelines, kernel, dispatch and pipeline counts, bytes of each GPU buffer, calls made."""
        return dict(self._info, calls=self._calls)

    def __repr__(self):
        return f"WebGPUProgram({self.package.where!r}, inputs={self.inputs}, outputs={self.outputs})"

    def _write_state(self) -> None:
        for _, off, nb, init in self.package.state:
            self.device.queue.write_buffer(self._state, off, self.package.section(init, nb))

    def reset_state(self) -> None:
        """Restores every state tensor (KV caches) to its initial value."""
        with self._lock:
            if self._state is not None and self._lost is None:
                self._write_state()

    entries: List[GpuEntry] = []  # the runtimes that run several entry points fill this

    def entry(self, name: str) -> GpuEntry:
        """The entry point `name` (a decoder's "prefill" or "step")."""
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(f"{self.package.where}: no entry '{name}' (entries: {', '.join(e.name for e in self.entries)})")

    def _words(self, args: Tuple[Any, ...], named: Dict[str, Any], inputs: Optional[List[Tensor]] = None) -> List[np.ndarray]:
        """The inputs (of `inputs`, default the first entry's), checked against the manifest, as
        the arena stores them."""
        inputs = self.inputs if inputs is None else inputs
        names = [t.name for t in inputs]
        if len(args) > len(names):
            raise TypeError(f"expected {len(names)} inputs ({', '.join(names)}), got {len(args)}")
        given = dict(zip(names, args))
        for k, v in named.items():
            if k not in names:
                raise TypeError(f"unknown input '{k}' (the inputs are: {', '.join(names)})")
            if k in given:
                raise TypeError(f"input '{k}' given twice")
            given[k] = v
        missing = [n for n in names if n not in given]
        if missing:
            raise TypeError(f"missing inputs {missing} (expected {len(names)}: {', '.join(names)})")
        words = []
        for i, t in enumerate(inputs):
            a = np.asarray(given[t.name])
            if a.dtype != t.dtype or a.shape != t.shape:
                raise ValueError(f"input {i} ('{t.name}'): expected {t.dtype}{list(t.shape)}, "
                                 f"got {a.dtype}{list(a.shape)}")
            if t.dtype == np.int64 and a.size and (a.min() < _I32.min or a.max() > _I32.max):
                j = np.unravel_index(np.argmax((a < _I32.min) | (a > _I32.max)), a.shape)
                raise ValueError(f"input {i} ('{t.name}'): int64 value {a[j]} at {tuple(int(x) for x in j)} does not "
                                 f"fit in int32, which the WebGPU package stores int64 tensors as")
            words.append(t.encode(a))
        return words

    def __call__(self, *arrays: Any, **named: Any):
        words = self._words(arrays, named)
        wgpu, p = self._wgpu, self.package
        with self._lock:
            if self._lost:
                raise RunError(f"{p.where}: {self._lost}")
            try:
                q = self.device.queue
                for t, w in zip(self.inputs, words):
                    if t.nbytes:
                        q.write_buffer(self._arena, t.offset, w)
                enc = self.device.create_command_encoder()
                enc.clear_buffer(self._arena, p.status_offset, STATUS_BYTES)  # word 0 = 0: no bad index yet
                cp = enc.begin_compute_pass()
                last = None
                for pipe, group, grid in self._schedule:
                    if pipe is not last:
                        cp.set_pipeline(pipe)
                        last = pipe
                    cp.set_bind_group(0, group)
                    cp.dispatch_workgroups(*grid)
                cp.end()
                enc.copy_buffer_to_buffer(self._arena, p.status_offset, self._staging, 0, STATUS_BYTES)
                for t, at in zip(self.outputs, self._out_at):
                    if t.nbytes:
                        enc.copy_buffer_to_buffer(self._arena, t.offset, self._staging, at, t.nbytes)
                q.submit([enc.finish()])
                self._staging.map_sync(wgpu.MapMode.READ)
                try:
                    data = self._staging.read_mapped(copy=True)
                finally:
                    self._staging.unmap()
            except (wgpu.GPUError, RuntimeError) as e:
                # The arena and state are in an unknown state now: every later call fails too.
                self._lost = self._lost or f"a call failed on the GPU: {e}"
                raise RunError(f"{p.where}: {self._lost}") from None
            self._calls += 1
        status = np.frombuffer(data, "<u4", 5)
        if status[0]:
            raise IndexOutOfRange(self._bad_index(int(status[1]) - 1, int(status[2].view(np.int32)), int(status[3]),
                                                  int(status[4])))
        outs = [t.decode(data[at:at + t.nbytes]) for t, at in zip(self.outputs, self._out_at)]
        return outs[0] if self._single else tuple(outs)

    def profile(self, *arrays: Any, iters: int = 5, **named: Any) -> List[Dict[str, Any]]:
        """Each dispatch's time: the call's inputs are uploaded once, then every dispatch is
        submitted alone and waited for, `iters` times (the median is kept). Includes each
        submit's overhead, so the sum exceeds a call's time; it ranks kernels, slowest first:
        [{'dispatch', 'kernel', 'label', 'node', 'source', 'ms'}]."""
        import time

        words = self._words(arrays, named)
        q, p = self.device.queue, self.package
        with self._lock:
            for t, w in zip(self.inputs, words):
                if t.nbytes:
                    q.write_buffer(self._arena, t.offset, w)
            samples = [[] for _ in self._schedule]
            for _ in range(iters):
                for i, (pipe, group, grid) in enumerate(self._schedule):
                    enc = self.device.create_command_encoder()
                    cp = enc.begin_compute_pass()
                    cp.set_pipeline(pipe)
                    cp.set_bind_group(0, group)
                    cp.dispatch_workgroups(*grid)
                    cp.end()
                    enc.copy_buffer_to_buffer(self._arena, p.status_offset, self._staging, 0, 4)
                    t0 = time.perf_counter()
                    q.submit([enc.finish()])
                    self._staging.map_sync(self._wgpu.MapMode.READ)  # waits for the dispatch
                    self._staging.unmap()
                    samples[i].append((time.perf_counter() - t0) * 1e3)
        rows = []
        for i, ms in enumerate(samples):
            d = p.dispatches[i]
            rows.append({"dispatch": i, "kernel": p.manifest["kernels"][d["kernel"]]["name"], "label": d["label"],
                         "node": d["node"], "source": d["source"], "ms": float(np.median(ms))})
        return sorted(rows, key=lambda r: -r["ms"])

    def _bad_index(self, i: int, index: int, size: int, axis: int, dispatches: Optional[List[dict]] = None) -> str:
        what = f"index {index} is out of range for dimension {axis} of size {size}"
        dispatches = self.package.dispatches if dispatches is None else dispatches
        if not 0 <= i < len(dispatches):
            return f"{self.package.where}: a kernel reported that {what} (unknown dispatch {i})"
        d = dispatches[i]
        return f"{self.package.where}: dispatch {i} ({d['label']}, node {d['node'] or '?'}, at {d['source'] or '?'}): {what}"

    def self_check(self) -> Dict[str, Any]:
        """Runs the package on its golden inputs and compares with the golden outputs PyTorch
        computed: floats within |y - golden| <= atol + rtol * |golden| (NaN matches NaN,
        infinities match by sign), integers and bools equal. Restores the initial state before
        the run and after it. Returns {'ok', 'max_error', 'tolerance', 'outputs': [{'name',
        'ok', 'max_error', 'mismatches'} per output]}; a mismatched NaN or infinity counts as
        an infinite error."""
        if self.package.golden is None:
            raise RunError(f"{self.package.where}: the package has no golden data")
        tol = self.package.golden[2]
        self.reset_state()
        try:
            got = self(*self.package.golden_inputs())
        finally:
            self.reset_state()
        rows = []
        for t, gt, y, g in zip(self.outputs, self.package.golden[1], [got] if self._single else got,
                               self.package.golden_outputs()):
            y, g = y.reshape(-1)[::gt.stride].astype(np.float64), g.reshape(-1).astype(np.float64)
            if t.dtype.kind == "f" or t.dtype == ml_dtypes.bfloat16:  # (bfloat16 is kind "V")
                finite = np.isfinite(y) & np.isfinite(g)
                special = (np.isnan(y) & np.isnan(g)) | (np.isinf(g) & (y == g))
                with np.errstate(invalid="ignore"):
                    diff = np.abs(np.where(finite, y - g, 0.0))
                err = np.where(finite, diff, np.where(special, 0.0, np.inf))
                bad = ~special & ~(finite & (diff <= tol["atol"] + tol["rtol"] * np.abs(np.where(finite, g, 0.0))))
            else:
                err = np.abs(y - g)
                bad = err != 0
            rows.append({"name": t.name, "ok": not bad.any(), "max_error": float(err.max()) if err.size else 0.0,
                         "mismatches": int(bad.sum())})
        return {"ok": all(r["ok"] for r in rows), "max_error": max((r["max_error"] for r in rows), default=0.0),
                "tolerance": dict(tol), "outputs": rows}

    def close(self) -> None:
        """Releases the GPU buffers and the device; later calls raise RunError."""
        with self._lock:
            if self._lost == _CLOSED:
                return
            self._lost = _CLOSED
            for b in [self._arena, self._state, self._params, self._staging, *self._shards]:
                if b is not None:
                    b.destroy()
            self.device.destroy()
            self._schedule, self._pipelines = [], []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
