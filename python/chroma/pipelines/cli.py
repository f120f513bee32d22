"""`chroma text-to-image`: the pipeline from the shell (registered by chroma/cli.py).

    chroma text-to-image --model Chroma1-HD --prompt "a red fox in snow" --seed 1
    chroma text-to-image --model Chroma1-HD --prompt "a red fox in snow" --dry-run
"""

from __future__ import annotations

import argparse
import os
import random
import time

from ..runtime.registry import TARGETS
from .memory import TRANSFORMER_VARIANTS, T5_VARIANTS
from .sampling import SCHEDULES

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("text-to-image", help="generate an image with Chroma1-HD's pipeline (docs/text_to_image.md)",
                       description="Text to image with Chroma1-HD's architecture: T5-XXL, the MMDiT transformer and "
                       "the FLUX VAE, each compiled by Chroma on first use and cached.")
    p.add_argument("--model", required=True, metavar="DIR",
                   help="a diffusers-format directory (model_index.json, text_encoder/, tokenizer/, transformer/, "
                   "vae/, scheduler/)")
    p.add_argument("--prompt", help="the prompt (required unless --text-embeds gives it)")
    p.add_argument("--negative", default=None,
                   help='the negative prompt (default: the official one; "" is an empty prompt, still encoded)')
    p.add_argument("--width", type=int, default=1024, help="a multiple of 16 (default 1024)")
    p.add_argument("--height", type=int, default=1024, help="a multiple of 16 (default 1024)")
    p.add_argument("--steps", type=int, default=26, help="denoising steps (default 26)")
    p.add_argument("--cfg", type=float, default=3.8, help="guidance scale (default 3.8; <= 1 skips the negative pass)")
    p.add_argument("--schedule", choices=SCHEDULES, default="beta",
                   help="beta: the official ComfyUI workflow (flux sampling shift 1, alpha = beta = 0.45); diffusers: "
                   "FlowMatchEulerDiscreteScheduler with the directory's settings, bit-exact (default beta)")
    p.add_argument("--seed", type=int, default=None, help="the noise seed (default: random, printed)")
    p.add_argument("--out", default=None, help="the PNG to write (default outputs/<stamp>_<seed>.png)")
    p.add_argument("--transformer", choices=("auto",) + TRANSFORMER_VARIANTS, default="auto",
                   help="transformer weights: auto (q6 if the memory available covers q6's run plus 1 GiB, else q4), "
                   "q4, q6, q8, bf16 or fp32 (default auto)")
    p.add_argument("--text-encoder", choices=T5_VARIANTS, default="bf16",
                   help="T5 weights: bf16 (default), q8 (q, k, v, o, wi_0, wi_1 in q8; wo and the embedding bf16) "
                   "or fp32")
    p.add_argument("--cfg-mode", choices=("separate", "batched"), default="separate",
                   help="separate: two batch-1 transformer calls a step; batched: one batch-2 call (default separate)")
    p.add_argument("--vae-dtype", choices=("float32",), default="float32", help="the VAE's precision (float32)")
    p.add_argument("--text-embeds", metavar="NPZ", help="load the text embeddings from this file (skips T5)")
    p.add_argument("--save-text-embeds", metavar="NPZ", help="write the text embeddings to this .npz file")
    p.add_argument("--save-latents", metavar="NPY", help="write the final packed latents (float32) to this .npy file")
    p.add_argument("--torch-noise", action="store_true",
                   help="diffusers' torch CPU-generator noise (the only option that imports torch at run time)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--target", choices=tuple(TARGETS), default="cpu", help="the compile target (default cpu)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads the compiled programs run on (default: one a core)")
    p.add_argument("--cache-dir", default=None,
                   help="where compiled components are kept (default $CHROMA_CACHE_DIR/text_to_image, else "
                   "~/.cache/chroma/text_to_image)")
    p.add_argument("--dry-run", action="store_true",
                   help="compile nothing, read no weights: print the bytes of each component and variant (from the "
                   "safetensors headers), the arenas known, the peak a run needs and what auto would pick")
    p.add_argument("--plan", action="store_true",
                   help="with --dry-run: first plan the arenas not known yet (each component at one block of each "
                   "kind with random weights, exported and lowered, no code generated: needs torch, seconds each; kept "
                   "in the cache for later dry runs)")
    p.set_defaults(fn=run)


def run(a: argparse.Namespace) -> None:
    from .text_to_image import TextToImage

    pipe = TextToImage(a.model, target=a.target, threads=a.threads, transformer=a.transformer,
                       text_encoder=a.text_encoder, cache_dir=a.cache_dir, quiet=a.quiet)
    if a.plan and not a.dry_run:
        raise ValueError("--plan plans the arenas for --dry-run; give both")
    if a.dry_run:
        for line in pipe.dry_run(a.prompt, a.negative, width=a.width, height=a.height, cfg=a.cfg, cfg_mode=a.cfg_mode,
                                 plan_arenas=a.plan):
            print(line)
        return
    if not a.prompt and not a.text_embeds:
        raise ValueError("--prompt is required (or --text-embeds with saved embeddings)")
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2 ** 32)
    if a.seed is None:
        print(f"seed {seed}")
    res = pipe.run(a.prompt or "", negative=a.negative, seed=seed, width=a.width, height=a.height, steps=a.steps,
                   cfg=a.cfg, schedule=a.schedule, cfg_mode=a.cfg_mode, torch_noise=a.torch_noise,
                   text_embeds=a.text_embeds, save_text_embeds_to=a.save_text_embeds, save_latents=a.save_latents,
                   vae_dtype=a.vae_dtype)
    if a.transformer == "auto" and a.quiet:
        print(pipe.transformer_choice)
    out = a.out or os.path.join("outputs", f"{time.strftime('%Y%m%d-%H%M%S')}_{seed}.png")
    from .png import save_png

    save_png(res.image, out, res.metadata)
    t = res.timings
    print(f"wrote {out} ({a.width}x{a.height}, seed {seed}, transformer {res.metadata['transformer']}): "
          f"total {t.get('total', 0):.1f} s, {t.get('step_mean', 0):.3f} s a step, peak memory "
          f"{max(res.peak_memory.values()) / 2 ** 30:.2f} GiB")
