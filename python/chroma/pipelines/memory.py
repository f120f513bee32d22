"""What each component needs in memory, per weight variant, from the safetensors headers
alone; the `auto` choice between q6 and q4; the process's peak memory.

Weights bytes follow the compiler's policy (docs/quantization.md) exactly: a matrix product's
weight [K, N] (a Linear's [N, K]) takes the format of the first rule naming it (else float32
when it has fewer than 4096 weights or a name component with norm/router/sink/bias, else the
variant's default), stored in panels of 16 columns and groups of 64 rows of K (rows padded to
a multiple of 4): bf16 2 bytes a weight, q8/q6/q4 8/6/4 bits a weight plus a 64-byte header
(16 float16 scales and biases) per panel and group. A table read by a Gather (an embedding)
takes the row layout (per row and group of 64: a float16 scale and bias, then the packed
values). Everything else (biases, norms, convolutions) is float32, as are the constants the
compiled transformer adds (the rotary tables of its token positions, the modulation table).
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any, Dict, List, Optional, Tuple

from ..runtime.variants import proc_kib_field

__all__ = ["TRANSFORMER_VARIANTS", "T5_VARIANTS", "transformer_rules", "t5_rules", "component_bytes", "GiB",
           "text_encoder_constants", "peak_memory", "choose_transformer", "MARGIN_BYTES", "fmt_bytes"]

GiB = float(1 << 30)
MARGIN_BYTES = 1 << 30  # the margin `auto` adds to q6's need: the interpreter, NumPy arrays, allocator slack
TRANSFORMER_VARIANTS = ("fp32", "bf16", "q8", "q6", "q4")
T5_VARIANTS = ("fp32", "bf16", "q8")
# Kept bfloat16 in every reduced variant: the input and text embedders, the approximator
# (distilled_guidance_layer, which produces every block's modulation) and the output layer.
TRANSFORMER_KEEP_BF16 = ("transformer.x_embedder.*", "transformer.context_embedder.*",
                         "transformer.distilled_guidance_layer.*", "transformer.proj_out.*")
T5_Q8 = ("q", "k", "v", "o", "wi_0", "wi_1")
_BITS = {"q8": 8, "q6": 6, "q4": 4}
_GROUP, _PANEL, _SMALL = 64, 16, 4096


def transformer_rules(variant: str) -> Optional[Dict[str, str]]:
    """chroma.compile's weights= for a transformer variant (None: float32)."""
    if variant not in TRANSFORMER_VARIANTS:
        raise ValueError(f"unknown transformer variant {variant!r} (expected auto or one of "
                         f"{', '.join(TRANSFORMER_VARIANTS)})")
    if variant == "fp32":
        return None
    rules = {p: "bf16" for p in TRANSFORMER_KEEP_BF16}
    rules["default"] = variant
    # Attention's products in bfloat16 too (where the CPU has AMX), as the products of the
    # weights round their activations: the seed's port runs the whole transformer in bfloat16.
    rules["attention"] = "bf16"
    return rules


def t5_rules(variant: str) -> Optional[Dict[str, str]]:
    """weights= for the text encoder: q8 quantizes the attention's q, k, v, o and the gated
    feed-forward's wi_0, wi_1; wo (the feed-forward's output, the most sensitive) and the
    embedding stay bfloat16."""
    if variant not in T5_VARIANTS:
        raise ValueError(f"unknown text encoder variant {variant!r} (expected one of {', '.join(T5_VARIANTS)})")
    if variant == "fp32":
        return None
    if variant == "bf16":
        return {"embedding": "bf16", "default": "bf16"}
    rules = {f"t5.*.{n}.weight": "q8" for n in T5_Q8}
    rules.update({"t5.*.wo.weight": "bf16", "embedding": "bf16"})
    return rules


def _pad4(n: int) -> int:
    return -(-n // 4) * 4


def _groups(k: int) -> List[int]:
    return [min(_GROUP, k - i) for i in range(0, k, _GROUP)]


def product_bytes(k: int, n: int, fmt: str) -> int:
    """Bytes of a product weight [K, N] stored in `fmt` (the compiler's packed panels)."""
    if fmt == "fp32":
        return 4 * k * n
    panels = -(-n // _PANEL)
    if fmt == "bf16":
        return panels * sum(_pad4(g) * _PANEL * 2 for g in _groups(k))
    bits = _BITS[fmt]
    return panels * sum(64 + _pad4(g) * _PANEL * bits // 8 for g in _groups(k))


def table_bytes(rows: int, h: int, fmt: str) -> int:
    """Bytes of an embedding table [rows, H] in `fmt` (the row layout)."""
    if fmt == "fp32":
        return 4 * rows * h
    if fmt == "bf16":
        return 2 * rows * h
    return rows * sum(4 + -(-g * _BITS[fmt] // 8) for g in _groups(h))


def _kept(name: str, numel: int) -> bool:
    parts = name.split(".")
    if any(w in p for p in parts for w in ("router", "norm", "sink")) or "bias" in parts:
        return True
    last = parts[-2] if parts[-1] == "weight" and len(parts) > 1 else parts[-1]
    return last.endswith(("gate", "gating")) or numel < _SMALL


def weight_format(name: str, role: str, numel: int, rules: Optional[Dict[str, str]]) -> str:
    """The format the compiler gives a product weight or embedding table (its exported name)."""
    if not rules:
        return "fp32"
    for key, fmt in rules.items():
        if key in ("default", "activations", "attention"):
            continue
        if key == role or fnmatch.fnmatchcase(name, key):
            return fmt
    return "fp32" if _kept(name, numel) else rules.get("default", "fp32")


_TABLES = ("shared.weight", "embed_tokens.weight")


def component_bytes(tensors: Dict[str, Tuple[str, List[int]]], prefix: str, rules: Optional[Dict[str, str]],
                    extra_fp32: int = 0) -> Dict[str, int]:
    """{"products": ..., "other": ..., "total": ...} bytes of a component's compiled weights:
    "products" what the policy decides (the products' weights and the embedding table: the
    manifest's product_weights_bytes), "other" the rest in float32 (T5's relative position
    bias table too: its Gather reads constant positions, so the compiler folds it)."""
    products = other = 0
    seen_table = False
    for name, (_, shape) in sorted(tensors.items()):
        numel = math.prod(shape)
        if name.endswith(_TABLES) and len(shape) == 2:
            if seen_table:  # T5's tied embedding is stored once
                continue
            seen_table = True
            fmt = weight_format(prefix + name, "embedding", numel, rules)
            products += table_bytes(shape[0], shape[1], fmt)
        elif name.endswith("relative_attention_bias.weight"):
            other += 4 * numel
        elif name.endswith(".weight") and len(shape) == 2:
            fmt = weight_format(prefix + name, "", numel, rules)
            products += product_bytes(shape[1], shape[0], fmt)
        else:
            other += 4 * numel
    other += extra_fp32
    return {"products": products, "other": other, "total": products + other}


def transformer_constants(config: Dict[str, Any], n_tokens: int) -> int:
    """Float32 bytes of the constants the compiled transformer adds: the rotary cos and sin
    tables of its tokens and the modulation index table."""
    head = int(config.get("attention_head_dim", 128))
    mod = 3 * int(config.get("num_single_layers", 38)) + 12 * int(config.get("num_layers", 19)) + 2
    return 4 * (2 * n_tokens * head + mod * 2 * (int(config.get("approximator_num_channels", 64)) // 4))


def text_encoder_constants(config: Dict[str, Any], length: int) -> int:
    """Float32 bytes of the constant the compiled T5 adds: its relative position bias
    [heads, L, L] (computed from constant positions, folded by the compiler)."""
    return 4 * int(config.get("num_heads", 64)) * length * length


def peak_memory() -> Dict[str, int]:
    """The process's peak resident memory: getrusage's ru_maxrss and /proc's VmHWM (bytes)."""
    import resource

    out = {"ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    hwm = proc_kib_field("/proc/self/status", "VmHWM")
    if hwm is not None:
        out["VmHWM"] = hwm
    return out


def _gib(b: float) -> str:
    return f"{b / GiB:.2f} GiB"


def fmt_bytes(b: float) -> str:
    """GiB from 1 GiB up, else MiB (KiB below 1 MiB): the dry run's sizes at any model size."""
    if b >= GiB:
        return f"{b / GiB:.2f} GiB"
    if b >= 1 << 20:
        return f"{b / (1 << 20):.2f} MiB"
    return f"{b / 1024:.1f} KiB"


def choose_transformer(needs: Dict[str, Dict[str, Any]], available: Optional[int], avail_info: Dict[str, Any],
                       size: str, margin: int = MARGIN_BYTES) -> Tuple[str, str]:
    """(variant, the one-line decision): q6 when the memory available covers q6's whole-run
    need plus the margin, otherwise q4 (with a warning when even q4's need is not covered).
    needs[v]: {"total": bytes, "detail": text}."""
    q6, q4 = needs["q6"]["total"], needs["q4"]["total"]
    parts = []
    if "MemAvailable" in avail_info:
        parts.append(f"MemAvailable {_gib(avail_info['MemAvailable'])}")
    cg = avail_info.get("cgroup")
    if cg:
        parts.append(f"cgroup v{cg['version']} limit {_gib(cg['limit'])} - used {_gib(cg['used'])}")
    breakdown = f"available: {', '.join(parts) or 'unknown'}; q6: {needs['q6']['detail']}; q4: {needs['q4']['detail']}"
    tail = f"q4 needs ~{_gib(q4)}; q6 needs ~{_gib(q6)} ({breakdown})"
    if available is None:
        return "q4", f"transformer auto -> q4 at {size}: available memory unknown (no /proc/meminfo); {tail}"
    want = q6 + margin
    if available >= want:
        return "q6", (f"transformer auto -> q6 at {size}: {_gib(available)} available now >= {_gib(want)} "
                      f"(q6's ~{_gib(q6)} + {_gib(margin)} margin); {tail}")
    warn = "" if available >= q4 else f"; WARNING: even q4's ~{_gib(q4)} exceeds the {_gib(available)} available"
    return "q4", (f"transformer auto -> q4 at {size}: {_gib(available)} available now < {_gib(want)} "
                  f"(q6's ~{_gib(q6)} + {_gib(margin)} margin); {tail}{warn}")
