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

from ..paths import default_cache_dir, toolchain_digest
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
               "shapes": shapes, "target": self.target, "chroma": __version__, "toolchain": toolchain_digest(),
               "layout": 1}
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
        from ..compiler import compile_artifact

        os.makedirs(self.root, exist_ok=True)
        name = os.path.basename(out)
        # Compiled under the final name in a private directory, then moved: a GPU target's
        # package lies beside the artifact (<name>.chroma-web, ...), named in its manifest
        # relative to it, and moves along.
        work = tempfile.mkdtemp(prefix=f".{name}-", dir=self.root)
        try:
            module, examples, weight_data = BUILDERS[comp](self.model, shapes)
            # Not loaded here (a loaded CPU program holds its weights in memory): get() loads it.
            compile_artifact(module, examples, os.path.join(work, name), target=self.target, weights=rules,
                             weight_data=weight_data)
            del module, examples
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

    def plan_path(self, comp: str, rules: Optional[Dict[str, str]], shapes: Dict[str, Any]) -> str:
        d = self.directory(comp, rules, shapes)
        return os.path.join(os.path.dirname(d), "plans", os.path.basename(d) + ".json")

    def planned(self, comp: str, rules: Optional[Dict[str, str]], shapes: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """The plan record plan() made for these settings, or None."""
        path = self.plan_path(comp, rules, shapes)
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    def plan(self, comp: str, rules: Optional[Dict[str, str]], shapes: Dict[str, Any]) -> Dict[str, Any]:
        """The arena a compile of this component would plan ({"arena": bytes, ...}), without
        compiling it or reading its weights: the component is built at one block of each kind
        (T5: two layers, the first computing the position bias every later one reads; the VAE
        whole) with random weights, exported and lowered (chroma.compiler.plan). The blocks of
        each kind are identical and run one after another, each leaving only the residual
        stream (and T5's position bias) behind, so one of each plans the same temporaries as
        the whole stack; the transformer keeps its full modulation table (one row per block of
        the whole model), the one temporary whose size depends on the depth.
        Kept beside the artifacts (plans/), so a later dry run needs no torch."""
        rec = self.planned(comp, rules, shapes)
        if rec is not None:
            return rec
        from ..compiler import plan

        t0 = time.perf_counter()
        module, examples, weight_data = BUILDERS[comp](self.model, shapes, plan_only=True)
        p = plan(module, examples, target=self.target, weights=rules, weight_data=weight_data)
        rec = {"arena": int(p["arena"]["bytes"]), "arena_lower_bound": int(p["arena"]["lower_bound"]),
               "kernels": int(p["kernels"]), "planned_at": "one block of each kind, random weights",
               "seconds": round(time.perf_counter() - t0, 2)}
        path = self.plan_path(comp, rules, shapes)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(rec, f)
        os.replace(tmp, path)
        return rec


# ---- building the modules (torch from here on) -----------------------------------------------

def _weights(model: ModelDir, comp: str, module: Any, prefix: str):
    """weight_data for a component built without its weights: its safetensors files, each
    parameter found under any of the names it has in the module (tied weights: T5's shared
    embedding is also the encoder's embed_tokens)."""
    from ..frontend.weights import safetensors_weights, tied_aliases

    return safetensors_weights(model.weight_files(comp), prefix=prefix, aliases=tied_aliases(module, prefix))


def _plan_weights(model: ModelDir, comp: str, module: Any, prefix: str):
    """weight_data for a plan: random values of each parameter's shape (seeded by its name), in
    the checkpoint's dtype where the checkpoint has it (the graph then holds the casts the real
    one does). Not zeros: the compiler stores and folds identical constants once, so zero
    weights of one shape would plan a different graph."""
    import zlib

    import torch

    dtypes = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    tensors = model.tensors(comp)
    params = dict(module.named_parameters(remove_duplicate=False))

    def data(name: str):
        p = params.get(name)
        if p is None:
            return None
        stored = tensors.get(name[len(prefix):] if name.startswith(prefix) else name)
        g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        w = torch.randn(tuple(p.shape), generator=g).mul_(0.02)
        return w.to(dtypes.get(stored[0], p.dtype) if stored else p.dtype)

    return data


def _text_encoder(model: ModelDir, shapes: Dict[str, Any], plan_only: bool = False):
    import torch
    from transformers import T5Config, T5EncoderModel

    from ..frontend.exporter import structure_only
    from .components import TextEncoder

    config = T5Config.from_pretrained(os.path.join(model.path, "text_encoder"))
    if plan_only:  # layer 0 computes the position bias every later layer reads: it and one more
        config.num_layers = min(config.num_layers, 2)
    with structure_only():
        t5 = T5EncoderModel(config).eval()
    n = shapes["length"]
    ids = torch.zeros(1, n, dtype=torch.int64)
    ids[0, : max(1, n // 2)] = torch.arange(3, 3 + max(1, n // 2)) % t5.config.vocab_size
    mask = torch.zeros(1, n, dtype=torch.int64)
    mask[0, : max(1, n // 2)] = 1
    module = TextEncoder(t5).eval()
    weights = _plan_weights if plan_only else _weights
    return module, (ids, mask), weights(model, "text_encoder", module, "t5.")


def _transformer(model: ModelDir, shapes: Dict[str, Any], plan_only: bool = False):
    import torch
    from diffusers import ChromaTransformer2DModel

    from .components import KEY_MASKED, Denoiser

    from ..frontend.exporter import structure_only

    config = dict(ChromaTransformer2DModel.load_config(os.path.join(model.path, "transformer")))
    full_rows = None
    if plan_only:  # one block of each kind, the whole model's modulation table (a row per block)
        full_rows = 3 * int(config.get("num_single_layers", 38)) + 12 * int(config.get("num_layers", 19)) + 2
        config = dict(config, num_layers=1, num_single_layers=1)
    with structure_only():
        tr = ChromaTransformer2DModel.from_config(config).eval()
    if full_rows is not None:
        from diffusers.models.transformers.transformer_chroma import ChromaCombinedTimestepTextProjEmbeddings

        tr.time_text_embed = ChromaCombinedTimestepTextProjEmbeddings(
            num_channels=tr.config.approximator_num_channels // 4, out_dim=full_rows)
    b, h2, w2, n = shapes["batch"], shapes["h2"], shapes["w2"], shapes["length"]
    g = torch.Generator().manual_seed(0)
    lat = torch.randn(b, h2 * w2, tr.config.in_channels, generator=g)
    t = torch.full((b,), 0.5)
    text = 0.1 * torch.randn(b, n, tr.config.joint_attention_dim, generator=g)
    bias = torch.zeros(b, n)
    bias[:, max(1, n // 2):] = KEY_MASKED
    module = Denoiser(tr, h2, w2, n).eval()
    weights = _plan_weights if plan_only else _weights
    return module, (lat, t, text, bias), weights(model, "transformer", module, "transformer.")


def _vae(model: ModelDir, shapes: Dict[str, Any], plan_only: bool = False):
    import torch
    from diffusers import AutoencoderKL

    from .components import VaeDecoder

    from ..frontend.exporter import structure_only

    config = AutoencoderKL.load_config(os.path.join(model.path, "vae"))
    with structure_only():
        vae = AutoencoderKL.from_config(config).eval()
    z = torch.randn(1, vae.config.latent_channels, shapes["h"], shapes["w"], generator=torch.Generator().manual_seed(0))
    module = VaeDecoder(vae).eval()
    weights = _plan_weights if plan_only else _weights
    return module, (z,), weights(model, "vae", module, "vae.")


BUILDERS: Dict[str, Callable] = {"text_encoder": _text_encoder, "transformer": _transformer, "vae": _vae}
