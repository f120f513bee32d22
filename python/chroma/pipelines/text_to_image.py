"""TextToImage: Chroma1-HD's text-to-image pipeline on compiled components.

    pipe = TextToImage("Chroma1-HD")                  # a diffusers-format directory
    image = pipe.generate("a red fox in snow", seed=1)  # PIL image, settings in image.info
    res = pipe.run("a red fox in snow", seed=1, width=768, height=1024)

Stages, one compiled component in memory at a time (docs/text_to_image.md): T5 encodes the
prompt and the negative prompt (each at its exact length: the artifact of the length bucket
with the padding masked), the transformer denoises (one artifact per image size and text
bucket; the text beyond a prompt's tokens masked out of every attention), the VAE decodes.
Components are compiled on first use and cached (artifacts.py); later runs load them
without torch.
"""

from __future__ import annotations

import dataclasses
import gc
import random
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from ..runtime.registry import TARGETS
from ..version import __version__
from . import plan
from .artifacts import ArtifactStore
from .components_np import KEY_MASKED
from .memory import TRANSFORMER_VARIANTS, T5_VARIANTS, peak_memory, t5_rules, transformer_rules
from .model_dir import ModelDir
from .sampling import SCHEDULES, cfg_combine, euler_step, latent_shape, noise, schedule, unpack
from .text import BUCKETS, MAX_TOKENS, TextEmbedding, Tokenizer, bucket_for, load_text_embeds, save_text_embeds

__all__ = ["TextToImage", "Result", "OFFICIAL_NEGATIVE", "CFG_MODES"]

OFFICIAL_NEGATIVE = ("low quality, ugly, unfinished, out of focus, deformed, disfigure, blurry, smudged, "
                     "restricted palette, flat colors")
CFG_MODES = ("separate", "batched")
DEFAULTS = {"width": 1024, "height": 1024, "steps": 26, "cfg": 3.8, "schedule": "beta", "cfg_mode": "separate"}


@dataclasses.dataclass
class Result:
    image: Any                 # PIL.Image, metadata in image.info
    latents: np.ndarray        # final packed latents [1, N, 64] float32
    seed: int
    metadata: Dict[str, str]
    timings: Dict[str, float]
    peak_memory: Dict[str, int]
    text: Dict[str, Optional[TextEmbedding]]
    sigmas: np.ndarray
    image_stats: Dict[str, Any]


def check_size(width: Any, height: Any) -> None:
    for name, v in (("width", width), ("height", height)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive integer (got {v!r})")
        if v % 16:
            raise ValueError(f"{name} {v} is not a multiple of 16 (the VAE's 8x and the 2x2 packing)")


class TextToImage:
    """The pipeline over one model directory. transformer: "auto" (q6 or q4 by the memory a run
    needs), or one of fp32, bf16, q8, q6, q4; text_encoder: fp32, bf16 (default) or q8."""

    def __init__(self, model: str, *, target: str = "cpu", threads: Optional[int] = None, transformer: str = "auto",
                 text_encoder: str = "bf16", cache_dir: Optional[str] = None, buckets: Sequence[int] = BUCKETS,
                 quiet: bool = True, log: Optional[Callable[[str], None]] = None):
        if target not in TARGETS:
            raise ValueError(f"target {target!r} is not supported (available: {', '.join(TARGETS)})")
        if transformer != "auto" and transformer not in TRANSFORMER_VARIANTS:
            raise ValueError(f"unknown transformer variant {transformer!r} (expected auto, "
                             f"{', '.join(TRANSFORMER_VARIANTS)})")
        if text_encoder not in T5_VARIANTS:
            raise ValueError(f"unknown text encoder variant {text_encoder!r} (expected {', '.join(T5_VARIANTS)})")
        self.buckets = tuple(sorted(int(b) for b in buckets))
        if not self.buckets or self.buckets[-1] < MAX_TOKENS:
            raise ValueError(f"buckets {self.buckets}: the largest must be at least {MAX_TOKENS}")
        self.model = ModelDir(model)
        self.store = ArtifactStore(self.model, cache_dir, target, threads)
        self.transformer_variant = transformer
        self.text_encoder_variant = text_encoder
        self.quiet = quiet
        self._log = log or (lambda s: print(s, file=sys.stderr, flush=True))
        self._tokenizer: Optional[Tokenizer] = None
        self._negative: Optional[TextEmbedding] = None
        self._loaded: Dict[str, Any] = {}  # kind -> (key, program)
        self.timings: Dict[str, float] = {}
        self.transformer_choice = ""
        self.last_variant = ""
        self.last_sigmas: Optional[np.ndarray] = None
        self.dim = int(self.model.config("transformer").get("joint_attention_dim", 4096))

    # ---- loading: one compiled component at a time -------------------------------------------

    def log(self, text: str) -> None:
        if not self.quiet:
            self._log(text)

    def _time(self, key: str, seconds: float) -> None:
        self.timings[key] = self.timings.get(key, 0.0) + seconds

    def _program(self, kind: str, rules: Optional[Dict[str, str]], shapes: Dict[str, Any]) -> Any:
        key = (repr(rules), tuple(sorted(shapes.items())))
        cur = self._loaded.get(kind)
        if cur is not None and cur[0] == key:
            return cur[1]
        self.release()
        if not self.store.manifest(kind, rules, shapes):
            self.log(f"compiling the {kind} for {shapes} (once; cached in {self.store.root})")
        prog, times = self.store.get(kind, rules, shapes)
        for k, v in times.items():
            self._time(f"{kind}.{k}", v)
        self._loaded[kind] = (key, prog)
        return prog

    def release(self, kind: Optional[str] = None) -> None:
        """Drops the loaded component (`kind`, or every one) and its memory."""
        for k in [kind] if kind else list(self._loaded):
            self._loaded.pop(k, None)
        gc.collect()

    def release_transformer(self) -> None:
        self.release("transformer")

    # ---- text --------------------------------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = Tokenizer(self.model.tokenizer_dir())
        return self._tokenizer

    def encode_many(self, prompts: Sequence[str]) -> List[TextEmbedding]:
        """Text embeddings of each prompt (T5 loaded once per length bucket used, then released)."""
        t0 = time.perf_counter()
        ids = []
        for p in prompts:
            ids.append(self.tokenizer(p))
            if self.tokenizer.dropped:
                self._log(f"warning: the prompt {p[:40]!r}... has {MAX_TOKENS - 1 + self.tokenizer.dropped} tokens "
                          f"before EOS; T5 takes {MAX_TOKENS} with EOS: the last {self.tokenizer.dropped} are dropped")
        self._time("tokenize", time.perf_counter() - t0)
        out: List[Optional[TextEmbedding]] = [None] * len(prompts)
        rules = t5_rules(self.text_encoder_variant)
        order = sorted(range(len(prompts)), key=lambda i: len(ids[i]))
        for i in order:
            length = bucket_for(min(len(ids[i]) + 1, MAX_TOKENS), self.buckets)
            prog = self._program("text_encoder", rules, {"length": length})
            x, m, keep = self.tokenizer.encoder_input(ids[i], length)
            t0 = time.perf_counter()
            h = np.asarray(prog(x, m))
            self._time("text_encoder.encode", time.perf_counter() - t0)
            out[i] = TextEmbedding(prompts[i], np.array(h[0, :keep], dtype=np.float32), len(ids[i]))
        self.release("text_encoder")
        return out  # type: ignore[return-value]

    def encode(self, prompt: str) -> TextEmbedding:
        return self.encode_many([prompt])[0]

    def official_negative(self) -> TextEmbedding:
        """The official negative prompt's embeddings (encoded on first use, then kept)."""
        if self._negative is None:
            self._negative = self.encode(OFFICIAL_NEGATIVE)
        return self._negative

    # ---- denoising ---------------------------------------------------------------------------

    def choose_variant(self, width: int, height: int, length: int, batch: int) -> str:
        if self.transformer_variant != "auto":
            self.transformer_choice = f"transformer {self.transformer_variant} (requested)"
            return self.transformer_variant
        variant, line = plan.auto_choice(self, width, height, length, batch)
        self.transformer_choice = line
        self.log(line)
        return variant

    def denoise(self, text: TextEmbedding, negative: Optional[TextEmbedding] = None, *, seed: int,
                width: int = DEFAULTS["width"], height: int = DEFAULTS["height"], steps: int = DEFAULTS["steps"],
                cfg: float = DEFAULTS["cfg"], schedule_name: str = DEFAULTS["schedule"],
                cfg_mode: str = DEFAULTS["cfg_mode"], torch_noise: bool = False,
                latents: Optional[np.ndarray] = None) -> np.ndarray:
        """The final packed latents [1, N, 64]. The transformer stays loaded for the next call
        (release_transformer() frees it). cfg <= 1 skips the negative pass; without `negative`
        the official negative prompt is used (encoded once and kept)."""
        check_size(width, height)
        if cfg_mode not in CFG_MODES:
            raise ValueError(f"unknown cfg_mode {cfg_mode!r} (expected {', '.join(CFG_MODES)})")
        guided = cfg > 1.0
        if guided and negative is None:
            negative = self.official_negative()
        for e in [text] + ([negative] if guided else []):
            if e.embeds.ndim != 2 or e.embeds.shape[1] != self.dim:
                raise ValueError(f"text embeddings of shape {list(e.embeds.shape)}: this transformer takes [tokens, "
                                 f"{self.dim}]")
        h, w = latent_shape(height, width)
        n_img = (h // 2) * (w // 2)
        sigmas, tmodel = schedule(schedule_name, steps, n_img, self.model.scheduler_config())
        self.last_sigmas = sigmas
        x = noise(seed, height, width, torch_noise) if latents is None else np.array(latents, dtype=np.float32)
        if x.shape != (1, n_img, 64):
            raise ValueError(f"latents of shape {list(x.shape)}: a {width}x{height} image needs [1, {n_img}, 64]")
        texts = [text, negative] if guided else [text]
        length = bucket_for(max(len(t) for t in texts), self.buckets)
        batch = 2 if guided and cfg_mode == "batched" else 1
        variant = self.choose_variant(width, height, length, batch)
        self.last_variant = variant
        prog = self._program("transformer", transformer_rules(variant), {"batch": batch, "h2": h // 2, "w2": w // 2,
                                                                         "length": length})
        ctx = np.zeros((len(texts), length, self.dim), np.float32)
        bias = np.full((len(texts), length), KEY_MASKED, np.float32)
        for i, t in enumerate(texts):
            ctx[i, : len(t)] = t.embeds
            bias[i, : len(t)] = 0.0
        t_start = time.perf_counter()
        for i in range(len(tmodel)):
            t0 = time.perf_counter()
            ts = np.full((batch,), tmodel[i], np.float32)
            if batch == 2:
                v2 = np.asarray(prog(np.concatenate([x, x]), ts, ctx, bias))
                v = cfg_combine(v2[0:1], v2[1:2], cfg)
            else:
                v = np.asarray(prog(x, ts, ctx[0:1], bias[0:1]))
                if guided:
                    v = cfg_combine(v, np.asarray(prog(x, ts, ctx[1:2], bias[1:2])), cfg)
            x = euler_step(x, v, sigmas[i], sigmas[i + 1])
            self.log(f"step {i + 1}/{len(tmodel)}: sigma {float(sigmas[i]):.4f} -> {float(sigmas[i + 1]):.4f}, "
                     f"{time.perf_counter() - t0:.2f} s")
        self._time("denoise", time.perf_counter() - t_start)
        self.timings["steps"] = len(tmodel)
        return x

    # ---- decoding ----------------------------------------------------------------------------

    def decode(self, latents: np.ndarray, height: int, width: int) -> Any:
        """The image (PIL, RGB) of final packed latents; the VAE stays loaded for the next call."""
        from PIL import Image

        check_size(width, height)
        z = unpack(np.asarray(latents, dtype=np.float32), height, width)
        prog = self._program("vae", None, {"h": z.shape[2], "w": z.shape[3]})
        t0 = time.perf_counter()
        img = np.asarray(prog(z))
        self._time("vae.decode", time.perf_counter() - t0)
        # diffusers' VaeImageProcessor.postprocess: (x / 2 + 0.5) clamped to [0, 1], * 255 rounded.
        arr = np.clip(img[0] / 2 + 0.5, 0.0, 1.0).transpose(1, 2, 0)
        return Image.fromarray((arr * 255).round().astype(np.uint8))

    # ---- a whole run -------------------------------------------------------------------------

    def text_pair(self, prompt: str, negative: Optional[str], cfg: float, text_embeds: Optional[str]):
        """(prompt, negative) embeddings: from a file (no T5), or encoded in one T5 session."""
        if text_embeds:
            pos, neg, _ = load_text_embeds(text_embeds, self.dim)
            if cfg > 1.0 and neg is None:
                raise ValueError(f"{text_embeds}: no negative embeddings, and cfg {cfg} > 1 needs them")
            return pos, neg
        if cfg > 1.0:
            pos, neg = self.encode_many([prompt, OFFICIAL_NEGATIVE if negative is None else negative])
            return pos, neg
        return self.encode(prompt), None

    def run(self, prompt: str = "", *, negative: Optional[str] = None, seed: Optional[int] = None,
            width: int = DEFAULTS["width"], height: int = DEFAULTS["height"], steps: int = DEFAULTS["steps"],
            cfg: float = DEFAULTS["cfg"], schedule: str = DEFAULTS["schedule"], cfg_mode: str = DEFAULTS["cfg_mode"],
            torch_noise: bool = False, text_embeds: Optional[str] = None, save_text_embeds_to: Optional[str] = None,
            save_latents: Optional[str] = None, vae_dtype: str = "float32") -> Result:
        """Encode, denoise, decode (each component released after its stage)."""
        check_size(width, height)
        if vae_dtype != "float32":
            raise ValueError(f"vae_dtype {vae_dtype!r}: the VAE runs in float32 only")
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r} (expected {', '.join(SCHEDULES)})")
        if seed is None:
            seed = random.SystemRandom().randrange(2 ** 32)
        self.timings = {}
        t_run = time.perf_counter()
        pos, neg = self.text_pair(prompt, negative, cfg, text_embeds)
        if save_text_embeds_to:
            save_text_embeds(save_text_embeds_to, pos, neg, {"model": self.model.path, "text_encoder":
                                                             self.text_encoder_variant})
        lat = self.denoise(pos, neg, seed=seed, width=width, height=height, steps=steps, cfg=cfg,
                           schedule_name=schedule, cfg_mode=cfg_mode, torch_noise=torch_noise)
        self.release_transformer()
        if save_latents:
            np.save(save_latents, lat)
        image = self.decode(lat, height, width)
        self.release()
        self.timings["total"] = time.perf_counter() - t_run
        if self.timings.get("steps"):
            self.timings["step_mean"] = self.timings["denoise"] / self.timings["steps"]
        peak = peak_memory()
        meta = self.metadata(pos, neg, seed=seed, width=width, height=height, steps=steps, cfg=cfg, schedule=schedule,
                             cfg_mode=cfg_mode, torch_noise=torch_noise, text_embeds=text_embeds, peak=peak)
        image.info.update(meta)
        a = np.asarray(image, dtype=np.float64)
        stats = {"mean": a.mean(axis=(0, 1)).round(3).tolist(), "std": a.std(axis=(0, 1)).round(3).tolist(),
                 "min": int(a.min()), "max": int(a.max())}
        return Result(image, lat, seed, meta, dict(self.timings), peak, {"prompt": pos, "negative": neg},
                      self.last_sigmas, stats)

    def metadata(self, pos: TextEmbedding, neg: Optional[TextEmbedding], *, seed: int, peak: Dict[str, int],
                 **settings: Any) -> Dict[str, str]:
        from .png import text_value

        meta = {"prompt": pos.prompt, "negative": neg.prompt if neg is not None else "", "seed": seed,
                "prompt_tokens": pos.tokens, "negative_tokens": neg.tokens if neg is not None else 0,
                "transformer": self.last_variant, "transformer_requested": self.transformer_variant,
                "transformer_choice": self.transformer_choice, "text_encoder": self.text_encoder_variant,
                "vae_dtype": "float32", "target": self.store.target, "threads": self.store.threads or "default",
                "model": self.model.path, "sigmas": [float(s) for s in self.last_sigmas],
                "steps_run": len(self.last_sigmas) - 1,  # the beta schedule drops repeated timesteps
                "timings": {k: round(v, 4) for k, v in self.timings.items()}, "peak_memory": peak,
                "software": f"chroma {__version__} text-to-image"}
        meta.update(settings)
        meta["text_embeds"] = settings.get("text_embeds") or ""
        return {k: text_value(v) for k, v in meta.items()}

    def generate(self, prompt: str, **kwargs: Any) -> Any:
        """run(prompt, **kwargs).image: a PIL image with every setting in image.info."""
        return self.run(prompt, **kwargs).image

    def dry_run(self, prompt: Optional[str] = None, negative: Optional[str] = None, *, width: int = 1024,
                height: int = 1024, cfg: float = DEFAULTS["cfg"], cfg_mode: str = DEFAULTS["cfg_mode"],
                plan_arenas: bool = False) -> List[str]:
        """What a run needs, per component and variant, without compiling or reading weights.
        plan_arenas: plan the arenas not known yet (one block of each kind, random weights; needs
        torch, a few seconds a component and variant; kept for later dry runs)."""
        check_size(width, height)
        length = self.buckets[0]
        if prompt is not None:
            texts = [prompt] + ([OFFICIAL_NEGATIVE if negative is None else negative] if cfg > 1 else [])
            length = bucket_for(max(min(len(self.tokenizer(t)) + 1, MAX_TOKENS) for t in texts), self.buckets)
        batch = 2 if cfg > 1 and cfg_mode == "batched" else 1
        return plan.dry_run_lines(self, width, height, length, batch, self.transformer_variant, plan=plan_arenas)
