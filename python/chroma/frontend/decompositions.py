"""Decompositions Chroma uses in place of (or in addition to) torch.export's default table.

``export`` runs ``ep.run_decompositions(table())``: torch's default table (the core ATen
opset) with these changes:

- ``aten._scaled_dot_product_flash_attention_for_cpu``: torch's own decomposition goes
  through the math attention (query and key each scaled by sqrt(scale)) and returns the
  attention weights [N, H, L, S] as its second output, where the op returns the logsumexp
  [N, H, L]. This one follows the CPU flash kernel eager runs: scores = (q @ k^T) * scale
  + bias (the causal and boolean masks as 0 / -inf), softmax(scores) @ v, the form the
  compiler fuses into one kernel (passes/fuse_attention), rows the bias masks entirely giving
  zeros, and logsumexp (0 for those rows, as the kernel gives). Half inputs are computed in
  float32 and the output rounded once, the logsumexp left float32, as the kernel does.
- ``aten.scaled_dot_product_attention``: the same decomposition, whichever backend eager
  would pick (its math backend, taken for instance with a mask and value heads narrower than
  the keys', scales q and k by sqrt(scale) each and selects zeros for rows the mask covers
  through the scores, a form that is not one kernel; it too computes half inputs in float32).
- ``aten.linspace``: with number ends it is kept (the importer computes the values as the
  CPU kernel does, fused multiply-adds included); with tensor ends and a half dtype, the
  kernel's formula one operation at a time in that type; with tensor ends and an integer dtype, the
  float64 linspace between the truncated ends, truncated (the reference decomposition
  computes in float32 and is off by one for some values; eager's FMA rounding can still
  differ in the last place before truncation).
- ``aten.logspace`` with number ends: kept, computed by the importer as the CPU kernel does
  (the exponents in double from the ends converted to the result type); with tensor ends and
  a half dtype, the same formula in float64 tensor operations (eager reads the tensors with
  ``.item()`` and runs the number kernel).
- ``torch_nn::_linear_cross_entropy_batch_chunked`` and ``..._no_reduction`` (the chunked
  path of ``F.linear_cross_entropy``, custom ops since torch 2.14): their loss by its
  definition, ``F.cross_entropy(F.linear(input, W, b), target, ...)``, computed in the op's
  accumulation type (float32 for half inputs) and rounded once, as the op does. Only the inference
  form is decomposed (no precomputed gradients); asking for gradients is an export error.
- ``transformers::grouped_mm_fallback`` (the experts of Hugging Face mixture-of-experts
  models in transformers 5 on the CPU, an opaque custom op): its definition, rows of
  ``input`` sorted by expert with ``offs`` the cumulative row counts, as a gathered product:
  each row's expert by ``searchsorted``, its weight matrix gathered, one batched product;
  rows past ``offs[-1]`` stay zero, as in the op.
- ``aten.addr`` and ``aten.linalg_cross`` on bfloat16/float16: the CPU kernels compute in the
  tensors' type one operation at a time (``beta*self + (alpha*vec1)*vec2`` with alpha and beta
  rounded to the type; ``a1*b2 - a2*b1`` with each product rounded), where torch's references
  compute in float32 and round once; these follow the kernels, each step its own ATen
  operation, so that Chroma rounds where eager does. Other types: torch's decomposition.
- ``aten.index_add`` on bfloat16/float16: in float32, rounded once, as its CPU kernel (the
  reference decomposition's ``index_put`` with accumulate rounds after each addition in
  Chroma, as eager's ``index_put`` kernel does).
- ``aten.logit`` on bfloat16/float16: likewise, the kernel's steps in the tensor's type
  (``eps`` and ``1 - eps`` rounded to it, the clamp, ``1 - x``, the quotient, its log), where
  torch's decomposition computes in float32 and rounds once.
"""

from __future__ import annotations

import math

import torch

__all__ = ["table"]

aten = torch.ops.aten
_HALF = (torch.bfloat16, torch.float16)


def _flash_attention_for_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                             scale=None):
    if dropout_p != 0.0:
        raise RuntimeError(f"_scaled_dot_product_flash_attention_for_cpu: dropout_p must be 0 for "
                           f"inference, got {dropout_p} (dropout draws random numbers)")
    s = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    out_dtype = query.dtype
    if out_dtype in _HALF:
        # The kernel computes half inputs in float32 (scores, softmax, sums, the logsumexp it
        # returns) and rounds the output once: so does this, which keeps the form one fused
        # kernel (no rounding between the products and the softmax).
        query, key, value = query.float(), key.float(), value.float()
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            attn_mask = attn_mask.float()
    if query.dim() >= 3 and key.shape[-3] != query.shape[-3] and query.shape[-3] % key.shape[-3] == 0:
        # Grouped query heads (enable_gqa): each key/value head serves consecutive query heads.
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
        value = value.repeat_interleave(query.shape[-3] // value.shape[-3], dim=-3)
    scores = torch.matmul(query, key.transpose(-2, -1)) * s
    L, S = scores.shape[-2], scores.shape[-1]
    # The masks as one additive bias (0 or -inf where a mask is boolean), so that the
    # compiler sees softmax(q k^T * scale + bias) v, the form it runs as one kernel.
    bias = None
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()
        bias = torch.zeros(L, S, dtype=scores.dtype, device=query.device).masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            m = torch.zeros(attn_mask.shape, dtype=scores.dtype, device=query.device).masked_fill(~attn_mask, float("-inf"))
        else:
            m = attn_mask
        bias = m if bias is None else bias + m
    if bias is not None:
        scores = scores + bias
    out = torch.matmul(torch.softmax(scores, dim=-1), value)
    lse = torch.logsumexp(scores, dim=-1)
    if bias is not None:
        # Rows the bias masks entirely: zeros and a logsumexp of 0, as the kernel gives (the
        # softmax's 0 / 0), decided from the bias alone so the scores are not read again.
        empty = (bias == float("-inf")).all(dim=-1, keepdim=True)
        out = torch.where(empty, torch.zeros_like(out), out)
        lse = torch.where(empty.squeeze(-1), torch.zeros_like(lse), lse)
    return out.to(out_dtype), lse


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    # Every backend eager might pick gives the same attention (the math one scales q and k by
    # sqrt(scale) each, and computes half inputs in float32 too): one form, the fused one.
    return _flash_attention_for_cpu(query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


def _no_grads(op, compute):
    if any(compute):
        raise RuntimeError(f"{op}: the chunked linear cross-entropy with precomputed gradients "
                           f"(compute_*_grad) is a training op; Chroma compiles its loss only")


def _acc(acc_dtype, *tensors):
    """The chunked path computes the product and the loss in its accumulation type (float32
    for half inputs) and rounds the loss once: the floating tensors converted to it."""
    def up(t):
        if t is None or acc_dtype is None or not t.is_floating_point() or t.dtype == acc_dtype:
            return t
        return t.to(acc_dtype)

    return tuple(up(t) for t in tensors)


def _lce_chunked(input, linear_weight, target, linear_bias, weight, reduction, ignore_index,
                 label_smoothing, batch_chunk_size, acc_policy, acc_dtype, allow_retain_graph,
                 compute_input_grad, compute_linear_weight_grad, compute_linear_bias_grad):
    _no_grads("torch_nn._linear_cross_entropy_batch_chunked",
              (compute_input_grad, compute_linear_weight_grad, compute_linear_bias_grad))
    logits = torch.nn.functional.linear(*_acc(acc_dtype, input, linear_weight, linear_bias))
    (weight,) = _acc(acc_dtype, weight)
    loss = torch.nn.functional.cross_entropy(logits, target, weight=weight, ignore_index=ignore_index,
                                             reduction=reduction, label_smoothing=label_smoothing)
    empty = input.new_zeros((0, 0))
    return loss.to(input.dtype), empty, empty.to(linear_weight.device), input.new_zeros((0,))


def _lce_chunked_none(input, linear_weight, target, linear_bias, weight, ignore_index, batch_chunk_size,
                      acc_policy, acc_dtype):
    logits = torch.nn.functional.linear(*_acc(acc_dtype, input, linear_weight, linear_bias))
    (weight,) = _acc(acc_dtype, weight)
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


def _half_linspace(start, end, steps, dt, device):
    """linspace into a half type as the CPU kernel computes it, every operation in that type:
    step = (end - start) / (steps - 1), then start + step * i for the first half and
    end - step * (steps - 1 - i) for the second, the integers converted to the type first."""

    def as_t(v):
        return v.to(dt).reshape(()) if isinstance(v, torch.Tensor) else torch.full((), v, dtype=dt, device=device)

    lo, hi = as_t(start), as_t(end)
    step = (hi - lo) / torch.full((), steps - 1, dtype=dt, device=device)
    i = torch.arange(steps, device=device)
    up = lo + step * i.to(dt)
    down = hi - step * (steps - 1 - i).to(dt)
    return torch.where(i < steps // 2, up, down)


def _half_logspace(default):
    """logspace with a tensor end into a half type as the CPU kernel computes it (eager reads the
    tensor with .item() and runs the number kernel, see src/import/aten_extra.cpp): start and end
    rounded to the type, their difference rounded to it, the steps and pow in float64, each value
    stored through float32. Other dtypes: `default`."""

    def logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None):
        dt = dtype if dtype is not None else torch.get_default_dtype()
        if dt not in _HALF:
            return default(start, end, steps, base, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)
        f64 = torch.float64

        def as_f64(v):
            return v.reshape(()).to(f64) if isinstance(v, torch.Tensor) else torch.full((), v, dtype=f64, device=device)

        if steps == 1:
            return torch.pow(base, as_f64(start)).reshape(1).to(torch.float32).to(dt)
        lo, hi = as_f64(start).to(dt), as_f64(end).to(dt)
        span = (hi - lo).to(f64)
        lo, hi = lo.to(f64), hi.to(f64)
        step = span / (steps - 1)
        i = torch.arange(steps, device=device, dtype=f64)
        up = torch.pow(base, lo + step * i)
        down = torch.pow(base, hi - step * (steps - 1 - i))
        return torch.where(i < steps // 2, up, down).to(torch.float32).to(dt)

    return logspace


def _integral_linspace(default):
    """linspace for integer dtypes as eager computes it: start and end converted to the integer
    type, the float64 linspace between them, truncated (torch's reference decomposition computes
    in float32 and is off by one for some values). Other dtypes: `default`."""

    def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
        dt = dtype if dtype is not None else torch.get_default_dtype()
        if dt in _HALF and steps > 1:
            return _half_linspace(start, end, steps, dt, device)
        if dt.is_floating_point or dt.is_complex or dt == torch.bool:
            return default(start, end, steps, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)

        def to_int(v):
            return v.to(dt).to(torch.float64) if isinstance(v, torch.Tensor) else float(math.trunc(v))

        return default(to_int(start), to_int(end), steps, dtype=torch.float64, layout=layout, device=device,
                       pin_memory=pin_memory).to(dt)

    return linspace



def _addr(default):
    """addr as the CPU kernel computes it for half types (module docstring)."""

    def addr(self, vec1, vec2, *, beta=1, alpha=1):
        dt = torch.promote_types(torch.promote_types(self.dtype, vec1.dtype), vec2.dtype)
        if dt not in _HALF:
            return default(self, vec1, vec2, beta=beta, alpha=alpha)
        a = torch.full((), alpha, dtype=dt, device=vec1.device)  # Scalar.to<scalar_t>(): rounded
        outer = (a * vec1.to(dt)).unsqueeze(1) * vec2.to(dt).unsqueeze(0)
        if beta == 0:  # self is ignored (its NaNs too); only its shape broadcasts
            return outer.expand(torch.broadcast_shapes(self.shape, outer.shape)).clone()
        b = torch.full((), beta, dtype=dt, device=vec1.device)
        return b * self.to(dt) + outer

    return addr


def _linalg_cross(default):
    """linalg_cross as the CPU kernel computes it for half types (module docstring)."""

    def linalg_cross(self, other, *, dim=-1):
        dt = torch.promote_types(self.dtype, other.dtype)
        if dt not in _HALF:
            return default(self, other, dim=dim)
        shape = torch.broadcast_shapes(self.shape, other.shape)
        a, b = self.to(dt).expand(shape), other.to(dt).expand(shape)
        d = dim % len(shape)

        def part(t, i):
            return t.narrow(d, i % 3, 1)

        return torch.cat([part(a, i + 1) * part(b, i + 2) - part(a, i + 2) * part(b, i + 1) for i in range(3)], d)

    return linalg_cross


def _logit(default):
    """logit as the CPU kernel computes it for half types (module docstring)."""

    def logit(self, eps=None):
        dt = self.dtype
        if dt not in _HALF:
            return default(self, eps)
        x = self
        if eps is not None and eps >= 0:
            lo = torch.full((), eps, dtype=dt, device=self.device)  # Scalar.to<scalar_t>(): rounded
            hi = 1 - lo  # scalar_t(1) - eps: rounded again
            x = torch.where(x < lo, lo, torch.where(x > hi, hi, x))  # NaN passes through
        return torch.log(x / (1 - x))

    return logit


def _index_add(default):
    """index_add on bfloat16/float16: its CPU kernel adds in float32 and rounds once, where the
    reference decomposition's index_put with accumulate (whose own kernel, and so Chroma's,
    rounds after each addition) would not: the same decomposition in float32, rounded."""

    def index_add(x, dim, index, tensor, *, alpha=1):
        if x.dtype not in _HALF:
            return default(x, dim, index, tensor, alpha=alpha)
        # (alpha other than 1: eager's kernel goes slice by slice; its rounding there is not
        # followed, the sum is still computed in float32 and rounded once)
        return default(x.float(), dim, index, tensor.to(x.dtype).float(), alpha=alpha).to(x.dtype)

    return index_add


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
    if aten.logspace.default in t:  # likewise (src/import/aten_extra.cpp)
        del t[aten.logspace.default]
    for ov in ("Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor"):
        op = getattr(aten.logspace, ov, None)
        if op is not None and op in t:
            t[op] = _half_logspace(t[op])
    t[aten.addr.default] = _addr(t[aten.addr.default])
    t[aten.linalg_cross.default] = _linalg_cross(t[aten.linalg_cross.default])
    if aten.index_add.default in t:
        t[aten.index_add.default] = _index_add(t[aten.index_add.default])
    if aten.logit.default in t:
        t[aten.logit.default] = _logit(t[aten.logit.default])
    flash = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if flash is not None:
        t[flash.default] = _flash_attention_for_cpu
    t[aten.scaled_dot_product_attention.default] = _sdpa
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
