"""Weights read from safetensors files without loading them: each tensor a view of the file's
memory mapping (copy-on-write, so nothing can change the file), for ``export(...,
weight_data=...)`` of a model built with ``structure_only()``. A model larger than memory
exports and compiles this way: its weights go from the file's pages to the graph file and on
to the compiler, never all resident (docs/architecture.md, "Compile memory").

The safetensors format: an 8-byte little-endian header length N, N bytes of JSON
({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}), then the
data, offsets relative to its start. Every field is checked against the file before a
tensor is made; errors name the file and the tensor.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

__all__ = ["SafetensorsError", "safetensors_weights", "safetensors_header", "tied_aliases"]

# Bytes per element of each dtype the format names (torch is imported only to make tensors:
# reading a header needs NumPy alone).
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def _torch_dtype(name: str):
    import torch

    return {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
            "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
            "BOOL": torch.bool}[name]


class SafetensorsError(ValueError):
    """A safetensors file that does not follow the format (the message names file and field)."""


def safetensors_header(path: str) -> Tuple[Dict[str, dict], int]:
    """The tensors' descriptions of one file and where its data starts, checked."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorsError(f"{path}: shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, 100 << 20):
            raise SafetensorsError(f"{path}: header length {n} does not fit the file ({size} bytes)")
        try:
            meta = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{path}: the header is not JSON: {e}") from None
    if not isinstance(meta, dict):
        raise SafetensorsError(f"{path}: the header is not a JSON object")
    start = 8 + n
    tensors = {}
    for name, d in meta.items():
        if name == "__metadata__":
            continue
        if not isinstance(d, dict) or d.get("dtype") not in ITEMSIZE or not isinstance(d.get("shape"), list) or \
                not isinstance(d.get("data_offsets"), list) or len(d["data_offsets"]) != 2:
            raise SafetensorsError(f"{path}: tensor {name!r}: needs a known dtype, a shape and two data_offsets")
        begin, end = d["data_offsets"]
        shape = d["shape"]
        if not all(isinstance(v, int) and v >= 0 for v in shape + [begin, end]) or end < begin:
            raise SafetensorsError(f"{path}: tensor {name!r}: bad shape or offsets {shape} {d['data_offsets']}")
        if int(np.prod(shape, dtype=np.int64)) * ITEMSIZE[d["dtype"]] != end - begin:
            raise SafetensorsError(f"{path}: tensor {name!r}: {end - begin} bytes for shape {shape} of {d['dtype']}")
        if start + end > size:
            raise SafetensorsError(f"{path}: tensor {name!r}: its bytes end at {start + end}, past the file's {size}")
        tensors[name] = {"dtype": d["dtype"], "shape": shape, "begin": begin, "end": end}
    return tensors, start


def tied_aliases(module: Any, prefix: str = "") -> Dict[str, List[str]]:
    """{name: every name of the same parameter} for the parameters a module holds under more
    than one name (tied weights), names without `prefix`."""
    names: Dict[int, List[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name[len(prefix):] if name.startswith(prefix) else name)
    return {n: group for group in names.values() if len(group) > 1 for n in group}


def safetensors_weights(paths: Iterable[str], prefix: str = "",
                        aliases: Optional[Dict[str, List[str]]] = None) -> Callable[[str], Any]:
    """weight_data for export(): the tensor called `name` minus `prefix` in any of the files
    (a view of its mapping, in the file's dtype), or under another name of the same parameter
    (`aliases`, from tied_aliases), or None for a name no file holds."""
    where: Dict[str, Tuple[str, dict, int]] = {}
    for path in paths:
        tensors, start = safetensors_header(path)
        for name, d in tensors.items():
            if name in where:
                raise SafetensorsError(f"tensor {name!r} is in both {where[name][0]} and {path}")
            where[name] = (path, d, start)
    maps: Dict[str, np.memmap] = {}

    def get(name: str):
        import torch

        if prefix:
            if not name.startswith(prefix):
                return None
            name = name[len(prefix):]
        if name not in where:
            name = next((a for a in (aliases or {}).get(name, []) if a in where), "")
            if not name:
                return None
        path, d, start = where[name]
        if path not in maps:
            maps[path] = np.memmap(path, dtype=np.uint8, mode="c")
        raw = maps[path][start + d["begin"]:start + d["end"]]
        t = torch.from_numpy(raw) if raw.size else torch.empty(0, dtype=torch.uint8)
        return t.view(_torch_dtype(d["dtype"])).reshape(d["shape"])

    get.names = frozenset(where)  # type: ignore[attr-defined]
    return get
