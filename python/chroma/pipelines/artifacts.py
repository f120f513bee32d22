"""The pipeline's compiled components: one artifact directory per component, weight variant
and shape, kept under a key over everything it depends on, so that a second run loads it
without torch, diffusers or transformers (and without reading the checkpoint).

Key: the component's fingerprint (ModelDir.fingerprint: its config, its weights files'
headers, sizes and modification times), the weights rules, the shapes, the target and
Chroma's version. Directory: <cache>/<component>-<key>/ (an artifact as chroma.compile
writes it; chroma.load reads it). A compile writes into a temporary directory beside it and
renames it into place, so an interrupted compile leaves no half artifact.

The modules are built from diffusers' and transformers' own classes (components.py), from
their configs and without their weights (chroma.frontend.exporter.structure_only): the
compile reads each weight from the component's safetensors files as it goes
(safetensors_weights), so a component larger than memory compiles, and weights stored in
bfloat16 stay so in the graph, widened exactly where the float32 model reads them. torch,
diffusers and transformers are imported only here, in the functions that compile.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, Optional, Tuple

from ..paths import default_cache_dir
from ..quantization.quant import weights_spec
from ..runtime.registry import emulated_here, load
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
        prog = load(out, threads=self.threads, emulate=emulated_here(self.target))
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
            module, examples, weight_data = BUILDERS[comp](self.model, shapes)
            prog = chroma_compile(module, examples, out=os.path.join(work, name), target=self.target,
                                  threads=self.threads, weights=rules, weight_data=weight_data)
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


# ---- building the modules (torch from here on) -----------------------------------------------

def _weights(model: ModelDir, comp: str, module: Any, prefix: str):
    """weight_data for a component built without its weights: its safetensors files, each
    parameter found under any of the names it has in the module (tied weights: T5's shared
    embedding is also the encoder's embed_tokens)."""
    from ..frontend.weights import safetensors_weights, tied_aliases

    return safetensors_weights(model.weight_files(comp), prefix=prefix, aliases=tied_aliases(module, prefix))


def _text_encoder(model: ModelDir, shapes: Dict[str, Any]):
    import torch
    from transformers import T5Config, T5EncoderModel

    from ..frontend.exporter import structure_only
    from .components import TextEncoder

    config = T5Config.from_pretrained(os.path.join(model.path, "text_encoder"))
    with structure_only():
        t5 = T5EncoderModel(config).eval()
    n = shapes["length"]
    ids = torch.zeros(1, n, dtype=torch.int64)
    ids[0, : max(1, n // 2)] = torch.arange(3, 3 + max(1, n // 2)) % t5.config.vocab_size
    mask = torch.zeros(1, n, dtype=torch.int64)
    mask[0, : max(1, n // 2)] = 1
    module = TextEncoder(t5).eval()
    return module, (ids, mask), _weights(model, "text_encoder", module, "t5.")


def _transformer(model: ModelDir, shapes: Dict[str, Any]):
    import torch
    from diffusers import ChromaTransformer2DModel

    from .components import KEY_MASKED, Denoiser

    from ..frontend.exporter import structure_only

    config = ChromaTransformer2DModel.load_config(os.path.join(model.path, "transformer"))
    with structure_only():
        tr = ChromaTransformer2DModel.from_config(config).eval()
    b, h2, w2, n = shapes["batch"], shapes["h2"], shapes["w2"], shapes["length"]
    g = torch.Generator().manual_seed(0)
    lat = torch.randn(b, h2 * w2, tr.config.in_channels, generator=g)
    t = torch.full((b,), 0.5)
    text = 0.1 * torch.randn(b, n, tr.config.joint_attention_dim, generator=g)
    bias = torch.zeros(b, n)
    bias[:, max(1, n // 2):] = KEY_MASKED
    module = Denoiser(tr, h2, w2, n).eval()
    return module, (lat, t, text, bias), _weights(model, "transformer", module, "transformer.")


def _vae(model: ModelDir, shapes: Dict[str, Any]):
    import torch
    from diffusers import AutoencoderKL

    from .components import VaeDecoder

    from ..frontend.exporter import structure_only

    config = AutoencoderKL.load_config(os.path.join(model.path, "vae"))
    with structure_only():
        vae = AutoencoderKL.from_config(config).eval()
    z = torch.randn(1, vae.config.latent_channels, shapes["h"], shapes["w"], generator=torch.Generator().manual_seed(0))
    module = VaeDecoder(vae).eval()
    return module, (z,), _weights(model, "vae", module, "vae.")


BUILDERS: Dict[str, Callable] = {"text_encoder": _text_encoder, "transformer": _transformer, "vae": _vae}
