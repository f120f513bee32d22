"""What a run needs in memory, stage by stage, without compiling or reading a weight: the
dry run and the `auto` transformer choice.

A stage holds one compiled component: its weights (memory.component_bytes, from the
safetensors headers and the variant's rules), its arena (the compiled plan's temporaries,
read from the cached artifact's manifest; unknown until the artifact is compiled, and then
said so) and its library. The run needs the largest stage (the components are loaded one at
a time) plus the inputs and outputs the pipeline keeps in NumPy (latents, text embeddings).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from .memory import (MARGIN_BYTES, TRANSFORMER_VARIANTS, T5_VARIANTS, choose_transformer, component_bytes, fmt_bytes,
                     t5_rules, text_encoder_constants, transformer_constants, transformer_rules)
from .sampling import latent_shape

__all__ = ["Stage", "stage", "run_needs", "auto_choice", "dry_run_lines", "plan_arenas", "plan_arenas_for"]


class Stage(dict):
    """{"component", "variant", "weights", "arena" (None: not compiled yet), "library", "total",
    "detail"}."""


def _shapes(comp: str, width: int, height: int, length: int, batch: int) -> Dict[str, Any]:
    h, w = latent_shape(height, width)
    if comp == "text_encoder":
        return {"length": length}
    if comp == "transformer":
        return {"batch": batch, "h2": h // 2, "w2": w // 2, "length": length}
    return {"h": h, "w": w}


def _rules(comp: str, variant: str):
    if comp == "transformer":
        return transformer_rules(variant)
    if comp == "text_encoder":
        return t5_rules(variant)
    return None


VARIANTS = {"text_encoder": T5_VARIANTS, "transformer": TRANSFORMER_VARIANTS, "vae": ("fp32",)}


def _arena(m: Dict[str, Any]) -> int:
    return max([int(e.get("arena", {}).get("bytes", 0)) for e in m.get("entries", [])] +
               [int(m.get("arena", {}).get("bytes", 0))])


def stage(pipe: Any, comp: str, variant: str, width: int, height: int, length: int, batch: int = 1) -> Stage:
    model, store = pipe.model, pipe.store
    shapes = _shapes(comp, width, height, length, batch)
    rules = _rules(comp, variant)
    prefix = {"text_encoder": "t5.", "transformer": "transformer.", "vae": "vae."}[comp]
    extra = 0
    if comp == "transformer":
        extra = transformer_constants(model.config(comp), shapes["length"] + shapes["h2"] * shapes["w2"])
    elif comp == "text_encoder":
        extra = text_encoder_constants(model.config(comp), shapes["length"])
    tensors = model.tensors(comp)
    if comp == "vae":  # the decoder only
        tensors = {k: v for k, v in tensors.items() if not k.startswith(("encoder.", "quant_conv."))}
    weights = component_bytes(tensors, prefix, rules, extra)["total"]
    m = store.manifest(comp, rules, shapes)
    arena = library = None
    arena_txt = "arena unknown (not compiled yet: not counted)"
    if m is not None:
        weights = int(m["weights"]["bytes"])
        arena = _arena(m)
        arena_txt = f"arena {fmt_bytes(arena)}"
        lib = os.path.join(store.directory(comp, rules, shapes), m["library"]["file"])
        library = os.path.getsize(lib) if os.path.isfile(lib) else 0
    elif (rec := store.planned(comp, rules, shapes)) is not None:  # planned without compiling (ArtifactStore.plan)
        arena = int(rec["arena"])
        arena_txt = f"arena {fmt_bytes(arena)} (planned)"
    else:  # another variant's plan at this size: the same temporaries, give or take the products' kinds
        for other in VARIANTS[comp]:
            om = store.manifest(comp, _rules(comp, other), shapes)
            rec = None if om is not None else store.planned(comp, _rules(comp, other), shapes)
            if om is not None or rec is not None:
                arena = _arena(om) if om is not None else int(rec["arena"])
                arena_txt = f"arena {fmt_bytes(arena)} (the {other} plan's at this size)"
                break
    total = weights + (arena or 0) + (library or 0)
    src = "compiled plan" if m is not None else "estimated from the safetensors headers"
    detail = f"{comp} {variant}: weights {fmt_bytes(weights)} ({src}) + {arena_txt}"
    if library:
        detail += f" + library {fmt_bytes(library)}"
    return Stage(component=comp, variant=variant, weights=weights, arena=arena, library=library, total=total,
                 detail=detail, shapes=shapes)


def io_bytes(width: int, height: int, length: int, batch: int, dim: int) -> int:
    """The NumPy arrays a denoising step keeps: latents, velocities, noise, text and bias."""
    h, w = latent_shape(height, width)
    n = (h // 2) * (w // 2) * 64
    return 4 * (n * (4 + 2 * batch) + 2 * length * (dim + 1))


def run_needs(pipe: Any, variant: str, width: int, height: int, length: int, batch: int) -> Dict[str, Any]:
    """{"total", "detail", "stages"}: the run's peak with transformer `variant`."""
    stages = [stage(pipe, "text_encoder", pipe.text_encoder_variant, width, height, length),
              stage(pipe, "transformer", variant, width, height, length, batch),
              stage(pipe, "vae", "fp32", width, height, length)]
    dim = int(pipe.model.config("transformer").get("joint_attention_dim", 4096))
    extra = io_bytes(width, height, length, batch, dim)
    peak = max(stages, key=lambda s: s["total"])
    total = peak["total"] + extra
    detail = (f"{peak['detail']} + {fmt_bytes(extra)} of latents and text; stages "
              + ", ".join(f"{s['component']} {fmt_bytes(s['total'])}" for s in stages))
    return {"total": total, "detail": detail, "stages": stages}


def auto_choice(pipe: Any, width: int, height: int, length: int, batch: int):
    from ..runtime.variants import available_memory

    needs = {v: run_needs(pipe, v, width, height, length, batch) for v in ("q6", "q4")}
    avail, info = available_memory()
    return choose_transformer(needs, avail, info, f"{width}x{height}", MARGIN_BYTES)


def plan_arenas(pipe: Any, width: int, height: int, length: int, batch: int,
                which: Optional[List[Tuple[str, str]]] = None) -> List[str]:
    """Plans the arena of every (component, variant) in `which` (default: all of them) at this
    size that has neither an artifact nor a plan yet (ArtifactStore.plan: one block of each
    kind, random weights; needs torch). Returns a line per plan made."""
    out = []
    for comp, v in which if which is not None else [(c, v) for c, vs in VARIANTS.items() for v in vs]:
        shapes, rules = _shapes(comp, width, height, length, batch), _rules(comp, v)
        if pipe.store.manifest(comp, rules, shapes) is None and pipe.store.planned(comp, rules, shapes) is None:
            rec = pipe.store.plan(comp, rules, shapes)
            out.append(f"planned {comp} {v}: arena {fmt_bytes(rec['arena'])} in {rec['seconds']:.1f} s")
    return out


def plan_arenas_for(pipe: Any, variant: str, width: int, height: int, length: int, batch: int) -> List[str]:
    """plan_arenas for the stages of one run: the pipe's T5, transformer `variant`, the VAE."""
    return plan_arenas(pipe, width, height, length, batch,
                       [("text_encoder", pipe.text_encoder_variant), ("transformer", variant), ("vae", "fp32")])


def dry_run_lines(pipe: Any, width: int, height: int, length: int, batch: int, requested: str,
                  plan: bool = False) -> List[str]:
    """The dry run's report: bytes per component and variant, the arenas known, the peak of a
    run with each transformer variant, and what `auto` picks and why. `plan`: first plan the
    arenas not known yet (plan_arenas)."""
    planned = plan_arenas(pipe, width, height, length, batch) if plan else []
    what = "arenas planned without weights" if plan else "no weights read"
    lines = [f"model {pipe.model.path}: {width}x{height}, text length bucket {length}, transformer batch {batch}, "
             f"target {pipe.store.target}; nothing compiled, {what}"] + planned
    for comp, variants in VARIANTS.items():
        lines.append(f"{comp} (checkpoint files {fmt_bytes(pipe.model.file_bytes(comp))}):")
        for v in variants:
            s = stage(pipe, comp, v, width, height, length, batch)
            lines.append(f"  {v:5} {s['detail'].split(': ', 1)[1]}")
    for v in TRANSFORMER_VARIANTS:
        r = run_needs(pipe, v, width, height, length, batch)
        lines.append(f"run with transformer {v}: peak ~{fmt_bytes(r['total'])} ({r['detail']})")
    variant, line = auto_choice(pipe, width, height, length, batch)
    lines.append(line)
    if requested != "auto":
        lines.append(f"requested transformer {requested} (auto would pick {variant})")
    return lines
