"""Decompositions Chroma uses in place of (or in addition to) torch.export's default table.

``export`` runs ``ep.run_decompositions(table())``: torch's default table (the core ATen
opset) with these changes:

- ``aten._scaled_dot_product_flash_attention_for_cpu``: torch's own decomposition goes
  through the math attention (query and key each scaled by sqrt(scale)) and returns the
  attention weights [N, H, L, S] as its second output, where the op returns the logsumexp
  [N, H, L]. This one follows the CPU flash kernel eager runs: scores = (q @ k^T) * scale
  (+ mask), a softmax whose fully masked rows give zeros, and logsumexp = max + log(sum)
  (0 for fully masked rows, as the kernel gives).
- ``aten.linspace``: with number ends it is kept (the importer computes the values as the
  CPU kernel does, fused multiply-adds included); with tensor ends and an integer dtype, the
  float64 linspace between the truncated ends, truncated (the reference decomposition
  computes in float32 and is off by one for some values; eager's FMA rounding can still
  differ in the last place before truncation).
- ``torch_nn::_linear_cross_entropy_batch_chunked`` and ``..._no_reduction`` (the chunked
  path of ``F.linear_cross_entropy``, custom ops since torch 2.14): their loss by its
  definition, ``F.cross_entropy(F.linear(input, W, b), target, ...)``. Only the inference
  form is decomposed (no precomputed gradients); asking for gradients is an export error.
- ``transformers::grouped_mm_fallback`` (the experts of Hugging Face mixture-of-experts
  models in transformers 5 on the CPU, an opaque custom op): its definition, rows of
  ``input`` sorted by expert with ``offs`` the cumulative row counts, as a gathered product:
  each row's expert by ``searchsorted``, its weight matrix gathered, one batched product;
  rows past ``offs[-1]`` stay zero, as in the op.
"""

from __future__ import annotations

import math

import torch

__all__ = ["table"]

aten = torch.ops.aten


def _flash_attention_for_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                             scale=None):
    if dropout_p != 0.0:
        raise RuntimeError(f"_scaled_dot_product_flash_attention_for_cpu: dropout_p must be 0 for "
                           f"inference, got {dropout_p} (dropout draws random numbers)")
    s = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    scores = torch.matmul(query, key.transpose(-2, -1)) * s
    L, S = scores.shape[-2], scores.shape[-1]
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    m = scores.amax(dim=-1, keepdim=True)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    p = torch.exp(scores - m)
    total = p.sum(dim=-1, keepdim=True)
    out = torch.matmul(p, value) / total
    out = torch.where(total == 0, torch.zeros_like(out), out)
    lse = torch.where(total == 0, torch.zeros_like(total), m + torch.log(total)).squeeze(-1)
    return out, lse


def _no_grads(op, compute):
    if any(compute):
        raise RuntimeError(f"{op}: the chunked linear cross-entropy with precomputed gradients "
                           f"(compute_*_grad) is a training op; Chroma compiles its loss only")


def _lce_chunked(input, linear_weight, target, linear_bias, weight, reduction, ignore_index,
                 label_smoothing, batch_chunk_size, acc_policy, acc_dtype, allow_retain_graph,
                 compute_input_grad, compute_linear_weight_grad, compute_linear_bias_grad):
    _no_grads("torch_nn._linear_cross_entropy_batch_chunked",
              (compute_input_grad, compute_linear_weight_grad, compute_linear_bias_grad))
    logits = torch.nn.functional.linear(input, linear_weight, linear_bias)
    loss = torch.nn.functional.cross_entropy(logits, target, weight=weight, ignore_index=ignore_index,
                                             reduction=reduction, label_smoothing=label_smoothing)
    empty = input.new_zeros((0, 0))
    return loss.to(input.dtype), empty, empty.to(linear_weight.device), input.new_zeros((0,))


def _lce_chunked_none(input, linear_weight, target, linear_bias, weight, ignore_index, batch_chunk_size,
                      acc_policy, acc_dtype):
    logits = torch.nn.functional.linear(input, linear_weight, linear_bias)
    loss = torch.nn.functional.cross_entropy(logits, target, weight=weight, ignore_index=ignore_index,
                                             reduction="none")
    return loss.to(input.dtype)


def grouped_mm_fallback(input, weight, offs):
    """out[s] = input[s] @ weight[e] for the expert e whose rows [offs[e-1], offs[e]) hold s."""
    rows = torch.arange(input.shape[0], dtype=offs.dtype, device=input.device)
    expert = torch.searchsorted(offs, rows, right=True)
    valid = expert < weight.shape[0]
    expert = torch.clamp(expert, max=weight.shape[0] - 1)
    out = torch.bmm(input.unsqueeze(1), weight[expert]).squeeze(1)
    return torch.where(valid.unsqueeze(1), out, torch.zeros((), dtype=out.dtype, device=out.device))


def _integral_linspace(default):
    """linspace for integer dtypes as eager computes it: start and end converted to the integer
    type, the float64 linspace between them, truncated (torch's reference decomposition computes
    in float32 and is off by one for some values). Other dtypes: `default`."""

    def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
        dt = dtype if dtype is not None else torch.get_default_dtype()
        if dt.is_floating_point or dt.is_complex or dt == torch.bool:
            return default(start, end, steps, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)

        def to_int(v):
            return v.to(dt).to(torch.float64) if isinstance(v, torch.Tensor) else float(math.trunc(v))

        return default(to_int(start), to_int(end), steps, dtype=torch.float64, layout=layout, device=device,
                       pin_memory=pin_memory).to(dt)

    return linspace


def table():
    """torch.export's default decomposition table with Chroma's replacements."""
    t = torch.export.default_decompositions()
    # linspace with number ends stays one op: the importer computes its values exactly as the
    # CPU kernel does (src/import/aten_extra.cpp). With tensor ends (known at run time only):
    for ov in ("Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor"):
        op = getattr(aten.linspace, ov, None)
        if op is not None and op in t:
            t[op] = _integral_linspace(t[op])
    if aten.linspace.default in t:
        del t[aten.linspace.default]
    flash = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if flash is not None:
        t[flash.default] = _flash_attention_for_cpu
    ns = getattr(torch.ops, "torch_nn", None)
    for name, fn in (("_linear_cross_entropy_batch_chunked", _lce_chunked),
                     ("_linear_cross_entropy_batch_chunked_no_reduction", _lce_chunked_none)):
        op = getattr(ns, name, None) if ns is not None else None
        if op is not None:
            t[op.default] = fn
    hf = getattr(torch.ops, "transformers", None)
    op = getattr(hf, "grouped_mm_fallback", None) if hf is not None else None
    if op is not None:
        t[op.default] = grouped_mm_fallback
    return t
