"""PNG text chunks: every setting of a run, stored as tEXt/iTXt chunks (PIL's PngInfo) and
read back. Values are strings; dicts and lists are stored as JSON."""

from __future__ import annotations

import json
from typing import Any, Dict

__all__ = ["png_info", "save_png", "read_png_metadata", "text_value"]


def text_value(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, sort_keys=True)
    return str(v)


def png_info(metadata: Dict[str, Any]):
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    for k, v in metadata.items():
        # iTXt (UTF-8) for text outside Latin-1 (a prompt may hold any character).
        s = text_value(v)
        try:
            s.encode("latin-1")
            info.add_text(k, s)
        except UnicodeEncodeError:
            info.add_itxt(k, s)
    return info


def save_png(image: Any, path: str, metadata: Dict[str, Any]) -> str:
    import os

    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    image.save(path, format="PNG", pnginfo=png_info(metadata))
    return path


def read_png_metadata(path: str) -> Dict[str, str]:
    """The text chunks of a PNG file as written by save_png."""
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        return {k: v for k, v in im.info.items() if isinstance(v, str)}
