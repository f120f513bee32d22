"""The pipeline's compiled components: one artifact directory per component, weight variant
and shape, kept under a key over everything it depends on, so that a second run loads it
without torch, diffusers or transformers (and without reading the checkpoint).

Key: the component's fingerprint (ModelDir.fingerprint: its config, its weights files'
headers, sizes and modification times), the weights rules, the shapes, the target and
Chroma's version. Directory: <cache>/<component>-<key>/ (an artifact as chroma.compile
writes it; chroma.load reads it). A compile writes into a temporary directory beside it and
renames it into place, so an interrupted compile leaves no half artifact.

The modules are built from diffusers' and transformers' own classes (components.py) loaded
from the directory in float32; torch, diffusers and transformers are imported only here, in
the functions that compile.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Optional, Tuple

from ..paths import default_cache_dir
from ..quantization.quant import weights_spec
from ..runtime.registry import load
from ..version import __version__
from .model_dir import ModelDir

__all__ = ["ArtifactStore", "default_pipeline_cache"]


def default_pipeline_cache() -> str:
    return os.path.join(default_cache_dir(), "text_to_image")


class ArtifactStore:
    """Finds, compiles and loads the components' artifacts for one model directory."""

    def __init__(self, model: ModelDir, cache_dir: Optional[str] = None, target: str = "cpu",
                 threads: Optional[int] = None):
        self.model = model
        self.root = cache_dir or default_pipeline_cache()
        self.target = target
        self.threads = threads
        self.compiled: list = []  # (component, directory) of the compiles this store ran

    def directory(self, comp: str, rules: Optional[Dict[str, str]], shapes: Dict[str, Any]) -> str:
        key = {"component": comp, "fingerprint": self.model.fingerprint(comp), "weights": weights_spec(rules),
               "shapes": shapes, "target": self.target, "chroma": __version__, "layout": 1}
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        return os.path.join(self.root, f"{comp}-{digest}")

    def manifest(self, comp: str, rules: Optional[Dict[str, str]], shapes: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """The cached artifact's manifest, or None when it has not been compiled."""
        path = os.path.join(self.directory(comp, rules, shapes), "manifest.json")
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    def get(self, comp: str, rules: Optional[Dict[str, str]], shapes: Dict[str, Any]) -> Tuple[Any, Dict[str, float]]:
        """(program, {"compile": s, "load": s}): the cached artifact loaded, or compiled first."""
        out = self.directory(comp, rules, shapes)
        times: Dict[str, float] = {}
        if not os.path.isfile(os.path.join(out, "manifest.json")):
            t0 = time.perf_counter()
            self._compile(comp, rules, shapes, out)
            times["compile"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        prog = load(out, threads=self.threads, emulate=_emulate(self.target))
        times["load"] = time.perf_counter() - t0
        return prog, times

    def _compile(self, comp: str, rules: Optional[Dict[str, str]], shapes: Dict[str, Any], out: str) -> None:
        from ..compiler import compile as chroma_compile

        os.makedirs(self.root, exist_ok=True)
        name = os.path.basename(out)
        # Compiled under the final name in a private directory, then moved: a GPU target's
        # package lies beside the artifact (<name>.chroma-web, ...), named in its manifest
        # relative to it, and moves along.
        work = tempfile.mkdtemp(prefix=f".{name}-", dir=self.root)
        try:
            module, examples = BUILDERS[comp](self.model, shapes)
            prog = chroma_compile(module, examples, out=os.path.join(work, name), target=self.target,
                                  threads=self.threads, weights=rules)
            del prog, module, examples
            gc.collect()
            beside = [n for n in os.listdir(work) if n != name]
            try:
                os.replace(os.path.join(work, name), out)
            except OSError:
                if not os.path.isfile(os.path.join(out, "manifest.json")):
                    raise
                return  # another process compiled it meanwhile: keep theirs
            for n in beside:
                os.replace(os.path.join(work, n), os.path.join(self.root, n))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        self.compiled.append((comp, out))


def _emulate(target: str) -> bool:
    """CUDA and Metal artifacts run on their GPU where there is one, else on the CPU SIMT
    emulator (slow; for checking a build on a machine without the GPU)."""
    if target == "cuda":
        return not os.path.exists("/dev/nvidiactl")
    return target == "metal" and sys.platform != "darwin"


# ---- building the modules (torch from here on) -----------------------------------------------

def _text_encoder(model: ModelDir, shapes: Dict[str, Any]):
    import torch
    from transformers import T5EncoderModel

    from .components import TextEncoder

    t5 = T5EncoderModel.from_pretrained(os.path.join(model.path, "text_encoder"), dtype=torch.float32).eval()
    n = shapes["length"]
    ids = torch.zeros(1, n, dtype=torch.int64)
    ids[0, : max(1, n // 2)] = torch.arange(3, 3 + max(1, n // 2)) % t5.config.vocab_size
    mask = torch.zeros(1, n, dtype=torch.int64)
    mask[0, : max(1, n // 2)] = 1
    return TextEncoder(t5).eval(), (ids, mask)


def _transformer(model: ModelDir, shapes: Dict[str, Any]):
    import torch
    from diffusers import ChromaTransformer2DModel

    from .components import KEY_MASKED, Denoiser

    tr = ChromaTransformer2DModel.from_pretrained(os.path.join(model.path, "transformer"),
                                                  dtype=torch.float32).eval()
    b, h2, w2, n = shapes["batch"], shapes["h2"], shapes["w2"], shapes["length"]
    g = torch.Generator().manual_seed(0)
    lat = torch.randn(b, h2 * w2, tr.config.in_channels, generator=g)
    t = torch.full((b,), 0.5)
    text = 0.1 * torch.randn(b, n, tr.config.joint_attention_dim, generator=g)
    bias = torch.zeros(b, n)
    bias[:, max(1, n // 2):] = KEY_MASKED
    return Denoiser(tr, h2, w2, n).eval(), (lat, t, text, bias)


def _vae(model: ModelDir, shapes: Dict[str, Any]):
    import torch
    from diffusers import AutoencoderKL

    from .components import VaeDecoder

    vae = AutoencoderKL.from_pretrained(os.path.join(model.path, "vae"), dtype=torch.float32).eval()
    z = torch.randn(1, vae.config.latent_channels, shapes["h"], shapes["w"], generator=torch.Generator().manual_seed(0))
    return VaeDecoder(vae).eval(), (z,)


BUILDERS: Dict[str, Callable] = {"text_encoder": _text_encoder, "transformer": _transformer, "vae": _vae}
