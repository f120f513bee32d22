"""Reading and checking a diffusers-format model directory (ChromaPipeline.save_pretrained's
layout) without loading a weight: model_index.json, each component's config, the
safetensors files' headers (names, dtypes, shapes), and a fingerprint per component that the
artifact cache keys on.

    d = ModelDir("Chroma1-HD")
    d.config("transformer")["num_layers"]          # 19
    d.tensors("transformer")["x_embedder.weight"]  # ("BF16", [3072, 64])

Every problem is a ModelDirError naming the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, List, Tuple

from ..frontend.weights import SafetensorsError, safetensors_header

__all__ = ["ModelDir", "ModelDirError", "COMPONENTS", "DTYPE_BYTES"]


class ModelDirError(ValueError):
    """The model directory is missing a file or a field, or holds something unexpected."""


# component: (the class model_index.json names, its weights' file stem)
COMPONENTS = {
    "text_encoder": ("T5EncoderModel", "model"),
    "transformer": ("ChromaTransformer2DModel", "diffusion_pytorch_model"),
    "vae": ("AutoencoderKL", "diffusion_pytorch_model"),
}
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "F8_E4M3": 1, "F8_E5M2": 1}


def _read_json(path: str, what: str) -> Dict[str, Any]:
    if not os.path.isfile(path):
        raise ModelDirError(f"{path}: missing ({what})")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ModelDirError(f"{path}: not readable JSON ({e})") from e
    if not isinstance(data, dict):
        raise ModelDirError(f"{path}: expected a JSON object")
    return data


def read_safetensors_header(path: str) -> Dict[str, Tuple[str, List[int]]]:
    """{name: (dtype, shape)} from a .safetensors file's header (checked as the compile reads
    it: chroma.frontend.weights.safetensors_header)."""
    try:
        tensors, _ = safetensors_header(path)
    except OSError as e:
        raise ModelDirError(f"{path}: {e}") from e
    except SafetensorsError as e:
        raise ModelDirError(str(e)) from None
    return {name: (d["dtype"], list(d["shape"])) for name, d in tensors.items()}


class ModelDir:
    """A diffusers-format directory holding Chroma1-HD's components (checked on construction:
    model_index.json and every component's config and weights files exist)."""

    def __init__(self, path: str):
        if not path or not os.path.isdir(path):
            raise ModelDirError(f"{path!r}: not a directory (expected a diffusers-format model directory with "
                                "model_index.json)")
        self.path = os.path.abspath(path)
        self.index = _read_json(os.path.join(self.path, "model_index.json"), "the pipeline's index: model_index.json")
        for comp, (cls, _) in COMPONENTS.items():
            entry = self.index.get(comp)
            if not isinstance(entry, list) or len(entry) != 2:
                raise ModelDirError(f"{self._p('model_index.json')}: field {comp!r} missing or not [library, class]")
            if entry[1] != cls:
                raise ModelDirError(f"{self._p('model_index.json')}: {comp} is {entry[1]!r}, expected {cls!r}")
        for comp in ("tokenizer", "scheduler"):
            if comp not in self.index:
                raise ModelDirError(f"{self._p('model_index.json')}: field {comp!r} missing")
        self._configs: Dict[str, Dict[str, Any]] = {}
        self._tensors: Dict[str, Dict[str, Tuple[str, List[int]]]] = {}
        self._fingerprints: Dict[str, str] = {}
        for comp in COMPONENTS:
            self.config(comp)
            self.weight_files(comp)
        self.scheduler_config()
        self.tokenizer_dir()

    def _p(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)

    def config(self, comp: str) -> Dict[str, Any]:
        if comp not in self._configs:
            self._configs[comp] = _read_json(self._p(comp, "config.json"), f"the {comp}'s configuration")
        return self._configs[comp]

    def scheduler_config(self) -> Dict[str, Any]:
        return _read_json(self._p("scheduler", "scheduler_config.json"), "the scheduler's configuration")

    def tokenizer_dir(self) -> str:
        d = self._p("tokenizer")
        names = ("tokenizer.json", "spiece.model")
        if not any(os.path.isfile(os.path.join(d, n)) for n in names):
            raise ModelDirError(f"{d}: missing the T5 tokenizer (tokenizer.json or spiece.model)")
        return d

    def weight_files(self, comp: str) -> List[str]:
        """The component's .safetensors files (one, or the shards its index lists)."""
        stem = COMPONENTS[comp][1]
        single = self._p(comp, f"{stem}.safetensors")
        index = self._p(comp, f"{stem}.safetensors.index.json")
        if os.path.isfile(single):
            return [single]
        if os.path.isfile(index):
            wm = _read_json(index, "the shard index").get("weight_map")
            if not isinstance(wm, dict) or not wm:
                raise ModelDirError(f"{index}: field 'weight_map' missing or empty")
            files = [self._p(comp, f) for f in sorted(set(wm.values()))]
            for f in files:
                if not os.path.isfile(f):
                    raise ModelDirError(f"{f}: missing (a shard {index} lists)")
            return files
        raise ModelDirError(f"{single}: missing (the {comp}'s weights; no shard index "
                            f"{os.path.basename(index)} either)")

    def tensors(self, comp: str) -> Dict[str, Tuple[str, List[int]]]:
        if comp not in self._tensors:
            out: Dict[str, Tuple[str, List[int]]] = {}
            for f in self.weight_files(comp):
                out.update(read_safetensors_header(f))
            self._tensors[comp] = out
        return self._tensors[comp]

    def file_bytes(self, comp: str) -> int:
        return sum(os.path.getsize(f) for f in self.weight_files(comp))

    def fingerprint(self, comp: str) -> str:
        """A digest of the component's config, its weights files' headers, sizes and modification
        times: what the artifact cache keys on (a changed file changes its time). Computed once
        per ModelDir."""
        if comp in self._fingerprints:
            return self._fingerprints[comp]
        h = hashlib.sha256()
        h.update(json.dumps(self.config(comp), sort_keys=True).encode())
        for f in self.weight_files(comp):
            st = os.stat(f)
            h.update(f"{os.path.basename(f)}:{st.st_size}:{st.st_mtime_ns}".encode())
            h.update(json.dumps(read_safetensors_header(f), sort_keys=True).encode())
        self._fingerprints[comp] = h.hexdigest()[:20]
        return self._fingerprints[comp]
