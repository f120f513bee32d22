"""Reader/writer for Chroma's ``.cgraph`` graph file format (version 1).

Pure Python (no torch import). The format is specified in
``docs/graph_format.md``; in short::

    offset 0   64-byte header (little-endian)
                 magic        8 bytes  b"CHRGRAPH"
                 version      u32      1
                 header_size  u32      64
                 json_offset  u64      64
                 json_length  u64
                 data_offset  u64      multiple of 64, >= json_offset + json_length
                 data_length  u64
                 reserved     16 zero bytes
    json_offset  UTF-8 JSON object (the graph description)
    ...          zero padding up to data_offset
    data_offset  weight data blob (data_length bytes); file ends here

Public API:
    pack(graph_json, blob) -> bytes
    write(path, graph_json, blob) -> None
    write_pieces(path, graph_json, pieces, data_length) -> None   (the blob never in memory)
    unpack(data) -> (graph_json, memoryview blob)
    read(path) -> (graph_json, memoryview blob)
    GraphFileError (ValueError subclass) for every malformed-file problem.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, Tuple, Union

MAGIC = b"CHRGRAPH"
FORMAT_VERSION = 1
HEADER_SIZE = 64
ALIGNMENT = 64
FORMAT_NAME = "chroma.graph"

# magic, version, header_size, json_offset, json_length, data_offset,
# data_length, reserved
_HEADER = struct.Struct("<8sIIQQQQ16s")
assert _HEADER.size == HEADER_SIZE

__all__ = [
    "MAGIC", "FORMAT_VERSION", "HEADER_SIZE", "ALIGNMENT", "GraphFileError",
    "align", "pack", "write", "unpack", "read",
]


class GraphFileError(ValueError):
    """A ``.cgraph`` file is malformed, truncated or of an unsupported version."""


def align(n: int, alignment: int = ALIGNMENT) -> int:
    """Round ``n`` up to the next multiple of ``alignment``."""
    return (n + alignment - 1) // alignment * alignment


def pack(graph_json: dict, blob: Union[bytes, bytearray, memoryview]) -> bytes:
    """Serialize a graph description and its data blob into ``.cgraph`` bytes.

    ``graph_json`` is encoded as compact UTF-8 JSON (``allow_nan=False``: the
    graph JSON never contains bare NaN/Infinity, floats are wrapped).
    """
    text = json.dumps(graph_json, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode("utf-8")
    blob = bytes(blob)
    json_offset = HEADER_SIZE
    data_offset = align(json_offset + len(text))
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, HEADER_SIZE, json_offset,
                          len(text), data_offset, len(blob), bytes(16))
    padding = bytes(data_offset - json_offset - len(text))
    return header + text + padding + blob


def write(path: str, graph_json: dict, blob: Union[bytes, bytearray, memoryview]) -> None:
    """Write a ``.cgraph`` file to ``path`` (see :func:`pack`)."""
    data = pack(graph_json, blob)
    with open(path, "wb") as f:
        f.write(data)


def write_pieces(path: str, graph_json: dict, pieces, data_length: int) -> None:
    """Write a ``.cgraph`` file whose data blob is ``pieces``, (offset, bytes-like) pairs in
    increasing offset order (gaps are zeros), ``data_length`` bytes in all: each piece goes
    to the file as it is, so the blob is never built in memory (a model's weights are
    written from the tensors themselves)."""
    text = json.dumps(graph_json, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode("utf-8")
    data_offset = align(HEADER_SIZE + len(text))
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, HEADER_SIZE, HEADER_SIZE,
                          len(text), data_offset, data_length, bytes(16))
    with open(path, "wb") as f:
        f.write(header + text + bytes(data_offset - HEADER_SIZE - len(text)))
        at = 0
        for offset, piece in pieces:
            if offset < at:
                raise ValueError(f"graph_file.write_pieces: piece at {offset} overlaps the previous one (ends at {at})")
            f.write(bytes(offset - at))
            f.write(piece)
            at = offset + memoryview(piece).nbytes
        if at > data_length:
            raise ValueError(f"graph_file.write_pieces: pieces end at {at}, past data_length {data_length}")
        f.write(bytes(data_length - at))


def unpack(data: Union[bytes, bytearray, memoryview], *, verify_hashes: bool = False
           ) -> Tuple[dict, memoryview]:
    """Parse and validate ``.cgraph`` bytes.

    Returns ``(graph_json, blob)`` where ``blob`` is a memoryview of the data
    section (weight ``offset`` values are relative to its start). Raises
    :class:`GraphFileError` on bad magic, unsupported version, inconsistent or
    truncated sections, malformed JSON, or weights outside the data blob. With
    ``verify_hashes=True`` each weight's sha256 is also checked.
    """
    mv = memoryview(data).cast("B")
    size = len(mv)
    if size < HEADER_SIZE:
        if bytes(mv[:min(size, 8)]) != MAGIC[:min(size, 8)]:
            raise GraphFileError("bad magic: not a Chroma graph file")
        raise GraphFileError(
            f"truncated file: {size} bytes, the header alone needs {HEADER_SIZE}")
    (magic, version, header_size, json_offset, json_length, data_offset,
     data_length, reserved) = _HEADER.unpack_from(mv, 0)
    if magic != MAGIC:
        raise GraphFileError(
            f"bad magic {magic!r}: not a Chroma graph file (expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise GraphFileError(
            f"unsupported format version {version}: this reader supports "
            f"version {FORMAT_VERSION} only")
    if header_size != HEADER_SIZE:
        raise GraphFileError(f"bad header_size {header_size} (expected {HEADER_SIZE})")
    if any(reserved):
        raise GraphFileError("reserved header bytes are not zero")
    if json_offset < HEADER_SIZE:
        raise GraphFileError(f"json_offset {json_offset} overlaps the header")
    json_end = json_offset + json_length
    if json_end > size:
        raise GraphFileError(
            f"truncated file: JSON section ends at byte {json_end} but the file "
            f"has {size} bytes")
    if data_offset % ALIGNMENT:
        raise GraphFileError(f"data_offset {data_offset} is not a multiple of {ALIGNMENT}")
    if data_offset < json_end:
        raise GraphFileError(
            f"data_offset {data_offset} overlaps the JSON section (ends at {json_end})")
    data_end = data_offset + data_length
    if data_end > size:
        raise GraphFileError(
            f"truncated file: data section ends at byte {data_end} but the file "
            f"has {size} bytes")
    if data_end < size:
        raise GraphFileError(
            f"{size - data_end} unexpected trailing bytes after the data section")

    try:
        graph_json = json.loads(bytes(mv[json_offset:json_end]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise GraphFileError(f"malformed JSON section: {e}") from None
    if not isinstance(graph_json, dict):
        raise GraphFileError("JSON section is not an object")
    if graph_json.get("format") != FORMAT_NAME:
        raise GraphFileError(
            f"JSON 'format' is {graph_json.get('format')!r}, expected {FORMAT_NAME!r}")
    if graph_json.get("version") != FORMAT_VERSION:
        raise GraphFileError(
            f"unsupported JSON version {graph_json.get('version')!r}: this reader "
            f"supports version {FORMAT_VERSION} only")

    blob = mv[data_offset:data_end]
    _check_weights(graph_json.get("weights", []), blob, verify_hashes)
    return graph_json, blob


def _check_weights(weights: Any, blob: memoryview, verify_hashes: bool) -> None:
    """Validate each weight's offset/nbytes (and optionally sha256) against the blob."""
    if not isinstance(weights, list):
        raise GraphFileError("JSON 'weights' is not a list")
    for i, w in enumerate(weights):
        name = w.get("name", f"#{i}") if isinstance(w, dict) else f"#{i}"
        try:
            offset, nbytes = w["offset"], w["nbytes"]
        except (KeyError, TypeError):
            raise GraphFileError(f"weight {name!r} lacks 'offset'/'nbytes'") from None
        if not (isinstance(offset, int) and isinstance(nbytes, int)) \
                or offset < 0 or nbytes < 0:
            raise GraphFileError(f"weight {name!r} has an invalid offset/nbytes")
        if offset % ALIGNMENT:
            raise GraphFileError(
                f"weight {name!r} offset {offset} is not a multiple of {ALIGNMENT}")
        if offset + nbytes > len(blob):
            raise GraphFileError(
                f"weight {name!r} offset out of range: bytes [{offset}, "
                f"{offset + nbytes}) exceed the {len(blob)}-byte data section")
        if verify_hashes and "sha256" in w:
            digest = hashlib.sha256(blob[offset:offset + nbytes]).hexdigest()
            if digest != w["sha256"]:
                raise GraphFileError(f"weight {name!r} sha256 mismatch")


def read(path: str, *, verify_hashes: bool = False) -> Tuple[dict, memoryview]:
    """Read and validate a ``.cgraph`` file; returns ``(graph_json, blob)``.

    See :func:`unpack` for the checks performed.
    """
    with open(path, "rb") as f:
        data = f.read()
    return unpack(data, verify_hashes=verify_hashes)
