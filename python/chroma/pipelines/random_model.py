"""A diffusers-format directory of Chroma1-HD's architecture with random weights, at any size:
the tests' tiny models and the benchmark's medium one (no hub access needed).

    write_random_model("tiny-chroma", seed=0)            # TINY: seconds to compile
    write_random_model("medium", config=MEDIUM)

Every component is built from diffusers' and transformers' own classes and written with
`save_pretrained` (model_index.json, scheduler/, text_encoder/, tokenizer/, transformer/,
vae/; safetensors), exactly as ChromaPipeline.save_pretrained writes Chroma1-HD. The
tokenizer is a T5 Unigram tokenizer over a small vocabulary built offline (the letters,
a few words, T5's special tokens); the scheduler's settings are Chroma1-HD's.
"""

from __future__ import annotations

import string
from typing import Any, Dict, Optional

__all__ = ["write_random_model", "write_shapes_only_model", "fill_bf16_weights", "TINY", "MEDIUM", "WIDE", "CHROMA1_HD",
           "CHROMA1_HD_SCHEDULER"]

# Chroma1-HD's scheduler/scheduler_config.json (the settings diffusers' ChromaPipeline runs with).
CHROMA1_HD_SCHEDULER = {"base_image_seq_len": 256, "base_shift": 0.5, "invert_sigmas": False,
                        "max_image_seq_len": 4096, "max_shift": 1.15, "num_train_timesteps": 1000, "shift": 3.0,
                        "shift_terminal": None, "use_beta_sigmas": False, "use_dynamic_shifting": True,
                        "use_exponential_sigmas": False, "use_karras_sigmas": False}

# Sizes: t5 (d_model, d_kv, d_ff, layers, heads), transformer (double and single blocks, heads,
# head dim, approximator hidden size and layers), vae (channels per block, layers per block,
# norm groups). Chroma1-HD: t5 4096/64/10240/24/64, transformer 19/38/24/128/5120/5,
# vae (128, 256, 512, 512)/2/32.
TINY: Dict[str, Any] = {
    "t5": {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4},
    "transformer": {"num_layers": 1, "num_single_layers": 2, "num_attention_heads": 2, "attention_head_dim": 16,
                    "axes_dims_rope": (4, 6, 6), "approximator_hidden_dim": 32, "approximator_layers": 2},
    "vae": {"block_out_channels": (16, 16, 32, 32), "layers_per_block": 1, "norm_num_groups": 8},
}
# Chroma1-HD's widths (T5-XXL's d_model 4096 and d_ff 10240, the transformer's 24 heads of 128,
# its approximator, the FLUX VAE) at a few blocks: what the benchmark runs against diffusers
# in float32 on a 24 GiB machine (the full depth in float32 does not fit).
WIDE: Dict[str, Any] = {
    "t5": {"d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_layers": 2, "num_heads": 64},
    "transformer": {"num_layers": 2, "num_single_layers": 4, "num_attention_heads": 24, "attention_head_dim": 128,
                    "axes_dims_rope": (16, 56, 56), "approximator_hidden_dim": 5120, "approximator_layers": 5},
    "vae": {"block_out_channels": (128, 256, 512, 512), "layers_per_block": 2, "norm_num_groups": 32},
}
MEDIUM: Dict[str, Any] = {
    "t5": {"d_model": 512, "d_kv": 64, "d_ff": 1024, "num_layers": 4, "num_heads": 8},
    "transformer": {"num_layers": 2, "num_single_layers": 4, "num_attention_heads": 8, "attention_head_dim": 64,
                    "axes_dims_rope": (8, 28, 28), "approximator_hidden_dim": 512, "approximator_layers": 5},
    "vae": {"block_out_channels": (32, 64, 128, 128), "layers_per_block": 1, "norm_num_groups": 32},
}

_WORDS = ["a", "the", "red", "fox", "in", "snow", "cat", "dog", "on", "of", "low", "quality", "ugly", "blurry",
          "photo", "painting", "flat", "colors", "out", "focus", "deformed", "palette", "restricted", "smudged",
          "unfinished", "disfigure", "and", "with", "blue", "green", "sky", "tree", "house", "night", "day"]


def _tokenizer(extra_ids: int = 0):
    from transformers import T5Tokenizer

    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [(c, -6.0) for c in string.ascii_lowercase + string.digits + string.punctuation]
    vocab += [("\u2581" + c, -5.0) for c in string.ascii_lowercase]
    vocab += [("\u2581" + w, -3.0 - 0.01 * i) for i, w in enumerate(_WORDS)]
    return T5Tokenizer(vocab=vocab, extra_ids=extra_ids)


def write_random_model(path: str, config: Optional[Dict[str, Any]] = None, seed: int = 0,
                       scheduler: Optional[Dict[str, Any]] = None) -> str:
    """Writes the directory (created if needed) and returns its path."""
    import torch
    from diffusers import AutoencoderKL, ChromaPipeline, ChromaTransformer2DModel, FlowMatchEulerDiscreteScheduler
    from transformers import T5Config, T5EncoderModel

    cfg = TINY if config is None else config
    torch.manual_seed(seed)
    tok = _tokenizer()
    t5 = cfg["t5"]
    te = T5EncoderModel(T5Config(vocab_size=len(tok), d_model=t5["d_model"], d_kv=t5["d_kv"], d_ff=t5["d_ff"],
                                 num_layers=t5["num_layers"], num_heads=t5["num_heads"],
                                 feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
                                 relative_attention_max_distance=128, dropout_rate=0.0)).eval()
    tr = cfg["transformer"]
    transformer = ChromaTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=tr["num_layers"], num_single_layers=tr["num_single_layers"],
        attention_head_dim=tr["attention_head_dim"], num_attention_heads=tr["num_attention_heads"],
        joint_attention_dim=t5["d_model"], axes_dims_rope=tuple(tr["axes_dims_rope"]),
        approximator_num_channels=64, approximator_hidden_dim=tr["approximator_hidden_dim"],
        approximator_layers=tr["approximator_layers"]).eval()
    # The modulation and output layers start at zero in diffusers' initialisation: random values
    # make every block's output depend on its input (a test that would pass on zeros does not).
    with torch.no_grad():
        for p in transformer.parameters():
            if p.abs().max() == 0:
                p.normal_(0.0, 0.05)
    v = cfg["vae"]
    n = len(v["block_out_channels"])
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * n,
                        up_block_types=("UpDecoderBlock2D",) * n, block_out_channels=tuple(v["block_out_channels"]),
                        layers_per_block=v["layers_per_block"], latent_channels=16,
                        norm_num_groups=v["norm_num_groups"], sample_size=1024, scaling_factor=0.3611,
                        shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False).eval()
    sched = FlowMatchEulerDiscreteScheduler(**(CHROMA1_HD_SCHEDULER if scheduler is None else scheduler))
    pipe = ChromaPipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=transformer)
    pipe.save_pretrained(path, safe_serialization=True)
    return path


# Chroma1-HD's own sizes (its config.json files): for write_shapes_only_model.
CHROMA1_HD: Dict[str, Any] = {
    "t5": {"d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_layers": 24, "num_heads": 64, "vocab_size": 32128},
    "transformer": {"num_layers": 19, "num_single_layers": 38, "num_attention_heads": 24, "attention_head_dim": 128,
                    "axes_dims_rope": (16, 56, 56), "approximator_hidden_dim": 5120, "approximator_layers": 5},
    "vae": {"block_out_channels": (128, 256, 512, 512), "layers_per_block": 2, "norm_num_groups": 32},
}


def _write_header_only(path: str, state: Dict[str, Any], dtype: str = "BF16") -> None:
    """A .safetensors file with the tensors' header and a sparse, zero body of the right size."""
    import json
    import math
    import struct

    header, offset = {}, 0
    for name, shape in state.items():
        n = math.prod(shape) * 2
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


def fill_bf16_weights(path: str, seed: int = 0, std: float = 0.02, chunk: int = 1 << 24) -> int:
    """Fills every tensor of a bfloat16 .safetensors file (write_shapes_only_model's sparse
    zeros) with normal values of standard deviation `std`, in place, in chunks: at the full
    model's size (17.8 GB for Chroma1-HD's transformer) a run's real weights work, each tensor
    different from every other (a compile stores identical tensors once, so zeros would not
    be). The values repeat one block of `chunk` random numbers, each tensor starting elsewhere
    in it: cheap to write, not statistically independent. Returns the bytes written."""
    import json
    import struct

    import numpy as np

    rng = np.random.default_rng(seed)
    block = (rng.standard_normal(chunk, dtype=np.float32) * std).view(np.uint32)
    block = ((block + 0x7FFF + ((block >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    twice = np.concatenate([block, block])
    with open(path, "r+b") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
        base, written = 8 + hlen, 0
        for i, (name, t) in enumerate(sorted((k, v) for k, v in header.items() if k != "__metadata__")):
            if t["dtype"] != "BF16":
                raise ValueError(f"{path}: tensor {name!r} is {t['dtype']}, not BF16")
            start, end = t["data_offsets"]
            n, at, shift = (end - start) // 2, base + start, (i * 7919) % chunk
            f.seek(at)
            while n > 0:
                m = min(n, chunk)
                f.write(twice[shift:shift + m].tobytes())
                n -= m
                shift = (shift + m) % chunk
            written += end - start
    return written


def write_shapes_only_model(path: str, config: Optional[Dict[str, Any]] = None) -> str:
    """A model directory with the configs and safetensors headers of `config` (default:
    Chroma1-HD's sizes) and no weights (sparse files of zeros): what --dry-run reads, at the
    real model's scale, in a few seconds and no disk space. Not for running."""
    import json
    import os

    import torch
    from diffusers import AutoencoderKL, ChromaTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    cfg = CHROMA1_HD if config is None else config
    write_random_model(path, config=TINY, seed=0)  # index, tokenizer, scheduler, and configs to replace
    t5c, tr, v = cfg["t5"], cfg["transformer"], cfg["vae"]
    n = len(v["block_out_channels"])
    with torch.device("meta"):
        t5 = T5EncoderModel(T5Config(vocab_size=t5c.get("vocab_size", 32128), d_model=t5c["d_model"], d_kv=t5c["d_kv"],
                                     d_ff=t5c["d_ff"], num_layers=t5c["num_layers"], num_heads=t5c["num_heads"],
                                     feed_forward_proj="gated-gelu"))
        transformer = ChromaTransformer2DModel(
            num_layers=tr["num_layers"], num_single_layers=tr["num_single_layers"],
            attention_head_dim=tr["attention_head_dim"], num_attention_heads=tr["num_attention_heads"],
            joint_attention_dim=t5c["d_model"], axes_dims_rope=tuple(tr["axes_dims_rope"]),
            approximator_hidden_dim=tr["approximator_hidden_dim"], approximator_layers=tr["approximator_layers"])
        vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * n, up_block_types=("UpDecoderBlock2D",) * n,
                            block_out_channels=tuple(v["block_out_channels"]), layers_per_block=v["layers_per_block"],
                            latent_channels=16, norm_num_groups=v["norm_num_groups"], scaling_factor=0.3611,
                            shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False)
    for comp, model, stem in (("text_encoder", t5, "model"), ("transformer", transformer, "diffusion_pytorch_model"),
                              ("vae", vae, "diffusion_pytorch_model")):
        state = {k: tuple(t.shape) for k, t in model.state_dict().items() if k != "encoder.embed_tokens.weight"}
        _write_header_only(os.path.join(path, comp, f"{stem}.safetensors"), state)
        with open(os.path.join(path, comp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(model.config.to_dict() if comp == "text_encoder" else dict(model.config), f)
    return path
