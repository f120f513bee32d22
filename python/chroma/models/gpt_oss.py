"""gpt-oss at a small size: Chroma's reference model (docs/models.md, "gpt-oss at small size").

The architecture follows the published gpt-oss reference implementation:

- block: ``x += attn(rmsnorm(x)); x += moe(rmsnorm(x))``; final RMSNorm; untied unembedding
  without bias. RMSNorm is ``x * rsqrt(mean(x^2) + eps) * scale`` in float32.
- attention: one fused qkv linear with bias; NeoX (half-split) RoPE on q and k, optionally
  YaRN (NTK-by-parts, concentration ``0.1 ln(s) + 1`` folded into cos/sin); grouped-query
  attention; causal mask plus a sliding window on even layers when ``sliding_window > 0``
  (query i sees keys j with ``i - W < j <= i``); one learned sink logit per head, appended
  as an extra softmax column and dropped; out linear with bias.
- MoE: gate linear with bias; top-k first, then softmax over the k selected logits; expert
  mlp1 ``[E, 2I, H]`` + bias with interleaved halves (``t[..., ::2]`` gate,
  ``t[..., 1::2]`` linear), gate clamped above at ``limit``, linear clamped to
  ``[-limit, limit]``, ``gate * sigmoid(1.702 gate) * (lin + 1)``; mlp2 ``[E, H, I]`` + bias;
  outputs combined with the softmax weights.

The experts are evaluated densely (every expert on every token, then weighted by a routing
matrix that is zero outside the top-k), as Hugging Face's inference path does. The result is
the same function as the reference's gather formulation (non-selected experts get weight
exactly 0; their outputs are finite because of the clamps), and it reads each expert's
weights once per call however many tokens pick it. ``GptOss.forward_reference`` keeps the
gather form for tests.

``GptOssDecoder`` wraps a model with a rolling KV cache (registered buffers, updated in
place) and exposes ``prefill`` and ``step`` modules for export: see ``chroma.Decoder``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GptOssConfig", "GptOss", "GptOssDecoder", "BENCHMARK_CONFIG", "build", "count_parameters"]


@dataclass(frozen=True)
class GptOssConfig:
    vocab_size: int = 201088
    hidden_size: int = 128
    num_layers: int = 12
    num_experts: int = 12
    experts_per_token: int = 4
    intermediate_size: int = 128
    num_attention_heads: int = 8
    num_key_value_heads: int = 1
    head_dim: int = 16
    rope_theta: float = 150000.0
    swiglu_limit: float = 7.0
    rms_norm_eps: float = 1e-5
    sliding_window: int = 0          # > 0: window on even layers
    rope_scaling_factor: float = 1.0  # > 1: YaRN
    rope_ntk_alpha: float = 1.0
    rope_ntk_beta: float = 32.0
    initial_context_length: int = 4096

    def as_dict(self):
        return asdict(self)


BENCHMARK_CONFIG = GptOssConfig()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        t = x.float()
        t = t * torch.rsqrt(torch.mean(t * t, dim=-1, keepdim=True) + self.eps)
        return (t * self.scale).to(x.dtype)


def rope_tables(cfg: GptOssConfig):
    """(concentration, inv_freq [head_dim/2]) for plain RoPE or YaRN (NTK-by-parts)."""
    d = cfg.head_dim
    freq = cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    if cfg.rope_scaling_factor > 1.0:
        s = cfg.rope_scaling_factor
        concentration = 0.1 * math.log(s) + 1.0
        d_half = d / 2
        low = d_half * math.log(cfg.initial_context_length / (cfg.rope_ntk_beta * 2 * math.pi)) / math.log(cfg.rope_theta)
        high = d_half * math.log(cfg.initial_context_length / (cfg.rope_ntk_alpha * 2 * math.pi)) / math.log(cfg.rope_theta)
        interpolation = 1.0 / (s * freq)
        extrapolation = 1.0 / freq
        ramp = (torch.arange(d_half, dtype=torch.float32) - low) / (high - low)
        mask = 1 - ramp.clamp(0, 1)
        inv_freq = interpolation * (1 - mask) + extrapolation * mask
    else:
        concentration = 1.0
        inv_freq = 1.0 / freq
    return concentration, inv_freq


def apply_rope(x, cos, sin):
    """x [T, ..., D]; cos/sin [T, D/2] broadcast over the middle dims (half-split, NeoX)."""
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[1],)
    cos = cos.reshape(shape)
    sin = sin.reshape(shape)
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: GptOssConfig, layer: int):
        super().__init__()
        self.cfg = cfg
        self.window = cfg.sliding_window if layer % 2 == 0 else 0
        hd, nq, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.qkv = nn.Linear(cfg.hidden_size, hd * (nq + 2 * nkv))
        self.out = nn.Linear(hd * nq, cfg.hidden_size)
        self.sinks = nn.Parameter(torch.zeros(nq))
        self.sm_scale = 1.0 / math.sqrt(hd)

    def project(self, x, cos, sin):
        """q [T, KV, G, D] and k, v [T, KV, D], RoPE applied."""
        cfg = self.cfg
        hd, nq, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        t = self.norm(x)
        qkv = self.qkv(t)
        n = x.shape[0]
        q = qkv[:, : nq * hd].reshape(n, nkv, nq // nkv, hd)
        k = qkv[:, nq * hd: (nq + nkv) * hd].reshape(n, nkv, hd)
        v = qkv[:, (nq + nkv) * hd:].reshape(n, nkv, hd)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q, k, v, mask):
        """q [T, KV, G, D]; k, v [S, KV, D]; mask [T, S] additive (0 or -inf) -> [T, nq*D]."""
        cfg = self.cfg
        n, nkv, g, hd = q.shape
        s = k.shape[0]
        qk = torch.einsum("qhmd,khd->hmqk", q, k) * self.sm_scale
        qk = qk + mask
        sinks = self.sinks.reshape(nkv, g, 1, 1).expand(nkv, g, n, 1)
        w = torch.softmax(torch.cat([qk, sinks], dim=-1), dim=-1)[..., :s]
        attn = torch.einsum("hmqk,khd->qhmd", w, v)
        return self.out(attn.reshape(n, cfg.num_attention_heads * hd))

    def forward(self, x, cos, sin, positions, max_window: int = 0):
        q, k, v = self.project(x, cos, sin)
        i = positions[:, None]
        j = positions[None, :]
        visible = j <= i
        windows = [w for w in (self.window, max_window) if w > 0]
        if windows:
            visible = visible & (j > i - min(windows))
        mask = torch.zeros(visible.shape, dtype=x.dtype, device=x.device).masked_fill(~visible, float("-inf"))
        return x + self.attend(q, k, v, mask)


def swiglu(x, alpha: float = 1.702, limit: float = 7.0):
    x_glu, x_lin = x[..., ::2], x[..., 1::2]
    x_glu = x_glu.clamp(max=limit)
    x_lin = x_lin.clamp(min=-limit, max=limit)
    return x_glu * torch.sigmoid(alpha * x_glu) * (x_lin + 1)


class MoE(nn.Module):
    def __init__(self, cfg: GptOssConfig):
        super().__init__()
        self.cfg = cfg
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.gate = nn.Linear(h, e)
        self.mlp1_weight = nn.Parameter(torch.empty(e, 2 * i, h))
        self.mlp1_bias = nn.Parameter(torch.empty(e, 2 * i))
        self.mlp2_weight = nn.Parameter(torch.empty(e, h, i))
        self.mlp2_bias = nn.Parameter(torch.empty(e, h))

    def route(self, t):
        top = torch.topk(self.gate(t), k=self.cfg.experts_per_token, dim=-1, sorted=True)
        return F.softmax(top.values, dim=-1), top.indices

    def forward(self, x):
        cfg = self.cfg
        t = self.norm(x)
        weights, indices = self.route(t)
        # Routing matrix [T, E]: the softmax weight of each selected expert, 0 elsewhere.
        experts = torch.arange(cfg.num_experts, dtype=indices.dtype, device=indices.device)
        routing = ((indices[:, :, None] == experts).to(t.dtype) * weights[:, :, None]).sum(1)
        h1 = torch.einsum("th,efh->tef", t, self.mlp1_weight) + self.mlp1_bias
        h1 = swiglu(h1, limit=cfg.swiglu_limit)
        h2 = torch.einsum("tei,ehi->teh", h1, self.mlp2_weight) + self.mlp2_bias
        return x + torch.einsum("teh,te->th", h2, routing)

    def forward_reference(self, x):
        """The reference implementation's gather form (for tests)."""
        cfg = self.cfg
        t = self.norm(x)
        weights, indices = self.route(t)
        w1 = self.mlp1_weight[indices]
        h = torch.einsum("beck,bk->bec", w1, t) + self.mlp1_bias[indices]
        h = swiglu(h, limit=cfg.swiglu_limit)
        h = torch.einsum("beck,bek->bec", self.mlp2_weight[indices], h) + self.mlp2_bias[indices]
        return x + torch.einsum("bec,be->bc", h, weights)


class Block(nn.Module):
    def __init__(self, cfg: GptOssConfig, layer: int):
        super().__init__()
        self.attn = Attention(cfg, layer)
        self.mlp = MoE(cfg)


class GptOss(nn.Module):
    """tokens [T] int64 -> logits [T, vocab]. ``positions`` defaults to 0..T-1.

    ``max_window > 0`` limits every layer's attention to the last ``max_window`` positions:
    the uncached equivalent of decoding with a rolling cache of that many rows.
    """

    def __init__(self, cfg: GptOssConfig = BENCHMARK_CONFIG):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.unembedding = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        concentration, inv_freq = rope_tables(cfg)
        self.concentration = concentration
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def cos_sin(self, positions):
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        return freqs.cos() * self.concentration, freqs.sin() * self.concentration

    def forward(self, tokens, positions=None, reference_moe: bool = False, max_window: int = 0):
        if positions is None:
            positions = torch.arange(tokens.shape[0], dtype=torch.int64, device=tokens.device)
        cos, sin = self.cos_sin(positions)
        x = self.embedding(tokens)
        for blk in self.blocks:
            x = blk.attn(x, cos, sin, positions, max_window)
            x = blk.mlp.forward_reference(x) if reference_moe else blk.mlp(x)
        return self.unembedding(self.norm(x))

    def make_decoder(self, cache_size: int):
        """(prefill module, step module) over a rolling KV cache of ``cache_size`` rows."""
        return decoder_entries(GptOssDecoder(self, cache_size))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def init_weights(model: GptOss, seed: int = 0):
    """Seeded random weights with realistic scales (no checkpoint can be downloaded)."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.cfg
    for name, p in model.named_parameters():
        if name.endswith("scale"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
        elif name.endswith("sinks"):
            p.copy_(torch.randn(p.shape, generator=g))
        elif name.endswith("bias"):
            p.copy_(0.02 * torch.randn(p.shape, generator=g))
        elif name == "embedding.weight":
            p.copy_(torch.randn(p.shape, generator=g))
        else:
            fan_in = p.shape[-1]
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
    return model


def build(cfg: GptOssConfig = BENCHMARK_CONFIG, seed: int = 0, **overrides) -> GptOss:
    """A GptOss with seeded random weights, in eval mode."""
    if overrides:
        cfg = replace(cfg, **overrides)
    return init_weights(GptOss(cfg), seed).eval()


def sample_tokens(cfg: GptOssConfig, n: int, seed: int = 1):
    return torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------
# Rolling KV cache
# ----------------------------------------------------------------------------------------

class GptOssDecoder(nn.Module):
    """A GptOss with a rolling KV cache of ``cache_size`` rows per layer, held in buffers.

    Slot ``p % cache_size`` holds the keys and values (RoPE applied) of the token at position
    ``p``; ``slot_pos`` records that position (-1: empty). A step attends to every slot whose
    position lies in the layer's window, so once the cache is full the oldest row is
    overwritten while positions keep advancing. The model's parameters are shared, not copied.
    """

    def __init__(self, model: GptOss, cache_size: int):
        super().__init__()
        cfg = model.cfg
        self.model = model
        self.cache_size = cache_size
        shape = (cache_size, cfg.num_key_value_heads, cfg.head_dim)
        for i in range(cfg.num_layers):
            self.register_buffer(f"k_cache_{i}", torch.zeros(shape))
            self.register_buffer(f"v_cache_{i}", torch.zeros(shape))
        self.register_buffer("slot_pos", torch.full((cache_size,), -1, dtype=torch.int64))

    def _mask(self, attn: Attention, positions, slot_pos):
        """Additive mask [T, S] over the cache slots for queries at ``positions``."""
        i = positions[:, None]
        j = slot_pos[None, :]
        window = attn.window if attn.window > 0 else self.cache_size
        visible = (j >= 0) & (j <= i) & (j > i - window)
        return torch.zeros(visible.shape, dtype=torch.float32, device=visible.device).masked_fill(~visible, float("-inf"))

    def prefill(self, tokens):
        """Resets the cache, fills it with the prompt (positions 0..T-1), returns all logits."""
        m = self.model
        n = tokens.shape[0]
        if n > self.cache_size:
            raise ValueError(f"prompt of {n} tokens does not fit a cache of {self.cache_size}")
        positions = torch.arange(n, dtype=torch.int64, device=tokens.device)
        cos, sin = m.cos_sin(positions)
        slots = torch.arange(self.cache_size, dtype=torch.int64, device=tokens.device)
        self.slot_pos.copy_(torch.where(slots < n, slots, torch.full_like(slots, -1)))
        x = m.embedding(tokens)
        for i, blk in enumerate(m.blocks):
            q, k, v = blk.attn.project(x, cos, sin)
            getattr(self, f"k_cache_{i}")[:n].copy_(k)
            getattr(self, f"v_cache_{i}")[:n].copy_(v)
            mask = self._mask(blk.attn, positions, positions)
            x = x + blk.attn.attend(q, k, v, mask)
            x = blk.mlp(x)
        return m.unembedding(m.norm(x))

    def step(self, token, position):
        """One token [1] at ``position`` [1] (int64): writes its row, returns logits [1, V]."""
        m = self.model
        cos, sin = m.cos_sin(position)
        slot = torch.remainder(position, self.cache_size)
        self.slot_pos.index_copy_(0, slot, position)
        x = m.embedding(token)
        for i, blk in enumerate(m.blocks):
            q, k, v = blk.attn.project(x, cos, sin)
            kc = getattr(self, f"k_cache_{i}")
            vc = getattr(self, f"v_cache_{i}")
            kc.index_copy_(0, slot, k)
            vc.index_copy_(0, slot, v)
            mask = self._mask(blk.attn, position, self.slot_pos)
            x = x + blk.attn.attend(q, kc, vc, mask)
            x = blk.mlp(x)
        return m.unembedding(m.norm(x))


class _Entry(nn.Module):
    def __init__(self, decoder: GptOssDecoder, method: str):
        super().__init__()
        self.decoder = decoder
        self.method = method

    def forward(self, *args):
        return getattr(self.decoder, self.method)(*args)


def decoder_entries(decoder: GptOssDecoder):
    """(prefill module, step module) sharing the decoder's parameters and cache buffers."""
    return _Entry(decoder, "prefill"), _Entry(decoder, "step")
