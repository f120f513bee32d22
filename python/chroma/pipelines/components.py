"""The three compiled components as torch modules around diffusers' and transformers' own
classes (imported here only: compiling needs torch, running a cached artifact does not).

- TextEncoder: T5EncoderModel's last hidden state for (input_ids, attention_mask), the mask
  an input so one artifact per length bucket serves every prompt up to that length.
- Denoiser: ChromaTransformer2DModel's velocity for (latents, timestep, text embeddings,
  text key bias). The key bias (0 for a text token the image sees, -1e30 for one it must not)
  is added to the attention scores of every key column of the text tokens: hard masking
  with the length a bucket's padding. diffusers' block instead multiplies a float mask into
  a square (query x key) mask that SDPA adds (a 0/1 float mask then masks nothing), or a
  boolean one that leaves fully masked query rows NaN; the key bias has neither problem.
  The rotary embedding of the fixed token positions is computed once, in float64 as
  diffusers does, and stored as float32 constants.
- VaeDecoder: AutoencoderKL.decode of the unpacked latents, after diffusers' unscaling
  `z / scaling_factor + shift_factor`.
"""

from __future__ import annotations

from typing import Any

import torch

from .components_np import KEY_MASKED

__all__ = ["TextEncoder", "Denoiser", "VaeDecoder", "KEY_MASKED", "image_ids", "text_ids"]


def image_ids(h2: int, w2: int) -> torch.Tensor:
    """diffusers' _prepare_latent_image_ids: (row, column) of each packed latent token."""
    ids = torch.zeros(h2, w2, 3)
    ids[..., 1] = ids[..., 1] + torch.arange(h2)[:, None]
    ids[..., 2] = ids[..., 2] + torch.arange(w2)[None, :]
    return ids.reshape(h2 * w2, 3)


def text_ids(n: int) -> torch.Tensor:
    return torch.zeros(n, 3)


class TextEncoder(torch.nn.Module):
    def __init__(self, t5: Any):
        super().__init__()
        self.t5 = t5

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.t5(input_ids=input_ids, attention_mask=attention_mask)[0]


def _key_bias_processor():
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

    class KeyBiasAttnProcessor(FluxAttnProcessor):
        """FluxAttnProcessor with the additive key bias [B, 1, 1, S] as its attention mask."""

        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                     image_rotary_emb=None, key_bias=None):
            return super().__call__(attn, hidden_states, encoder_hidden_states, key_bias, image_rotary_emb)

    return KeyBiasAttnProcessor()


class Denoiser(torch.nn.Module):
    """velocity = transformer(latents [B, N, 64], timestep [B] (sigma, t/1000), text [B, L, D],
    key_bias [B, L]) for an image of h2 x w2 packed tokens (N = h2 * w2) and L text tokens.

    forward() is ChromaTransformer2DModel.forward (diffusers 0.42) with the rotary tables
    precomputed and the key bias passed to every attention; its blocks and layers are
    diffusers' own. tests/python/test_text_to_image.py checks it against the model's forward."""

    def __init__(self, transformer: Any, h2: int, w2: int, text_len: int):
        super().__init__()
        self.transformer = transformer
        transformer.set_attn_processor(_key_bias_processor())
        self.n_image = h2 * w2
        with torch.no_grad():
            cos, sin = transformer.pos_embed(torch.cat([text_ids(text_len), image_ids(h2, w2)], dim=0))
        self.register_buffer("rope_cos", cos.float().contiguous(), persistent=False)
        self.register_buffer("rope_sin", sin.float().contiguous(), persistent=False)

    def forward(self, latents, timestep, text, key_bias):
        t = self.transformer
        bias = torch.cat([key_bias, torch.zeros(key_bias.shape[0], self.n_image, dtype=key_bias.dtype)], dim=1)
        bias = bias[:, None, None, :]
        x = t.x_embedder(latents)
        pooled = t.distilled_guidance_layer(t.time_text_embed(timestep * 1000))
        ctx = t.context_embedder(text)
        rope = (self.rope_cos, self.rope_sin)
        kw = {"key_bias": bias}
        n_single, n_double = len(t.single_transformer_blocks), len(t.transformer_blocks)
        for i, block in enumerate(t.transformer_blocks):
            img, txt = 3 * n_single + 6 * i, 3 * n_single + 6 * n_double + 6 * i
            temb = torch.cat((pooled[:, img:img + 6], pooled[:, txt:txt + 6]), dim=1)
            ctx, x = block(hidden_states=x, encoder_hidden_states=ctx, temb=temb, image_rotary_emb=rope,
                           joint_attention_kwargs=kw)
        h = torch.cat([ctx, x], dim=1)
        for i, block in enumerate(t.single_transformer_blocks):
            h = block(hidden_states=h, temb=pooled[:, 3 * i:3 * i + 3], image_rotary_emb=rope,
                      joint_attention_kwargs=kw)
        h = t.norm_out(h[:, ctx.shape[1]:], pooled[:, -2:])
        return t.proj_out(h)


class VaeDecoder(torch.nn.Module):
    def __init__(self, vae: Any):
        super().__init__()
        self.vae = vae
        self.scaling = float(vae.config.scaling_factor)
        self.shift = float(vae.config.shift_factor or 0.0)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latents / self.scaling + self.shift, return_dict=False)[0]
