"""Attention in one kernel (passes/fuse_attention, chroma/cpu/attention.h).

Every form the importer sees: torch's scaled_dot_product_attention (no mask, float and boolean
masks, causal, a given scale, grouped heads) and attention written out by hand (T5's product
plus position bias, a division by sqrt(d), casts to float32 around the softmax), against torch
eager. On the CPU target each must become one Attention kernel, and the arena must not hold the
scores: it grows with the sequence, not with its square. Blocks of 64 query rows and 256 keys,
so the shapes below cover partial blocks, several blocks and a single row.

Tolerances: the kernel adds the softmax's sum and the second product in another order than
eager (blocks of keys, an online maximum): a few float32 ulp of the output's scale.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import CPU

RTOL, ATOL = 2e-5, 2e-5


class Sdpa(torch.nn.Module):
    def __init__(self, causal=False, scale=None, gqa=False):
        super().__init__()
        self.causal, self.scale, self.gqa = causal, scale, gqa

    def forward(self, q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal, scale=self.scale,
                                              enable_gqa=self.gqa)


def _qkv(b, h, L, S, d, e=None, hk=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    e = d if e is None else e
    hk = h if hk is None else hk
    return (torch.randn(b, h, L, d, generator=g), torch.randn(b, hk, S, d, generator=g),
            torch.randn(b, hk, S, e, generator=g))


@pytest.mark.parametrize("b,h,L,S,d,e", [
    (1, 2, 8, 6, 4, 4),          # one partial block
    (2, 3, 130, 300, 16, 24),    # several query blocks and key blocks, partial ones, D != E
    (1, 1, 1, 517, 8, 8),        # a single query row over three key blocks
])
def test_sdpa_without_mask(check, b, h, L, S, d, e):
    q, k, v = _qkv(b, h, L, S, d, e)
    check(Sdpa(), q, k, v, rtol=RTOL, atol=ATOL)


def test_sdpa_float_mask_and_scale(check):
    q, k, v = _qkv(2, 2, 70, 270, 8)
    mask = torch.randn(2, 1, 70, 270)
    check(Sdpa(scale=0.3), q, k, v, mask, rtol=RTOL, atol=ATOL)


def test_sdpa_boolean_key_mask_with_fully_masked_rows(check):
    # A key mask [B, 1, L, S] whose first rows mask every key: eager's CPU kernel gives zeros
    # there, and the rest attend to a subset of keys (hard masking of padded text tokens).
    q, k, v = _qkv(2, 2, 20, 300, 8)
    mask = torch.rand(2, 1, 20, 300) > 0.4
    mask[:, :, :3] = False
    check(Sdpa(), q, k, v, mask, rtol=RTOL, atol=ATOL)


def test_sdpa_causal(check):
    q, k, v = _qkv(1, 2, 150, 150, 16)
    check(Sdpa(causal=True), q, k, v, rtol=RTOL, atol=ATOL)


def test_sdpa_grouped_query_heads(check):
    q, k, v = _qkv(1, 4, 33, 40, 8, hk=2)
    check(Sdpa(gqa=True), q, k, v, rtol=RTOL, atol=ATOL)


class T5Attention(torch.nn.Module):
    """T5's form: no scaling, a position bias added, the softmax in float32 and cast back."""

    def forward(self, q, k, v, bias):
        scores = torch.matmul(q, k.transpose(3, 2)) + bias
        weights = F.softmax(scores.float(), dim=-1).type_as(scores)
        return torch.matmul(weights, v)


class Divided(torch.nn.Module):
    """Attention written out with a division by sqrt(d) and heads split from [B, L, H*D]."""

    def __init__(self, heads):
        super().__init__()
        self.heads = heads

    def forward(self, x, y):
        b, L, hd = x.shape
        d = hd // self.heads
        q = x.view(b, L, self.heads, d).transpose(1, 2)
        k = y.view(b, y.shape[1], self.heads, d).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        out = scores.softmax(-1) @ k
        return out.transpose(1, 2).reshape(b, L, hd)


def test_t5_position_bias(check):
    q, k, v = _qkv(1, 3, 65, 65, 8)
    bias = torch.randn(1, 3, 65, 65)
    check(T5Attention(), q, k, v, bias, rtol=RTOL, atol=ATOL)


def test_divided_scores_and_head_views(check):
    g = torch.Generator().manual_seed(1)
    check(Divided(4), torch.randn(2, 40, 32, generator=g), torch.randn(2, 300, 32, generator=g), rtol=RTOL, atol=ATOL)


@pytest.mark.skipif(not CPU, reason="asserts the CPU lowering (one Attention kernel); the op tests run on every target")
@pytest.mark.parametrize("model,args", [
    (Sdpa(), lambda: _qkv(1, 2, 96, 96, 8)),
    (Sdpa(causal=True), lambda: _qkv(1, 2, 96, 96, 8)),
    (T5Attention(), lambda: _qkv(1, 2, 96, 96, 8) + (torch.randn(1, 2, 96, 96),)),
])
def test_one_kernel_and_no_scores_in_the_arena(compile_to, model, args):
    inputs = args()
    prog = compile_to(model, *inputs)
    np.testing.assert_allclose(prog(*[x.numpy() for x in inputs]), model(*inputs).numpy(), rtol=RTOL, atol=ATOL)
    # No temporary holds the scores or the weights ([1, 2, 96, 96] float32: 73,728 bytes):
    # the attention kernel, and at most a copy of its output into the caller's layout.
    assert prog.stats["temporaries_bytes"] < 2 * 96 * 96 * 4, prog.stats
    assert prog.stats["kernels"] <= 2, prog.stats


@pytest.mark.skipif(not CPU, reason="compares CPU arenas (the GPU targets do not fuse attention yet)")
def test_arena_grows_linearly_with_the_sequence(compile_to):
    arenas = []
    for n in (256, 1024):
        q, k, v = _qkv(1, 2, n, n, 16)
        prog = compile_to(Sdpa(), q, k, v, name=f"att{n}")
        arenas.append(prog.stats["arena_bytes"])
        got = prog(q.numpy(), k.numpy(), v.numpy())
        np.testing.assert_allclose(got, Sdpa()(q, k, v).numpy(), rtol=RTOL, atol=ATOL)
    # Four times the sequence: at most four times the arena (the scores would be sixteen).
    assert arenas[1] <= 4 * max(arenas[0], 1), arenas


@pytest.mark.skipif(not CPU, reason="the CPU target's portable kernels (blas=False)")
def test_portable_kernels_and_two_threads(tmp_path):
    import chroma

    q, k, v = _qkv(2, 2, 70, 300, 8)
    mask = torch.rand(2, 1, 70, 300) > 0.3
    want = Sdpa()(q, k, v, mask).numpy()
    for blas, threads in ((False, 1), (True, 2)):
        prog = chroma.compile(Sdpa(), (q, k, v, mask), out=str(tmp_path / f"a{blas}{threads}"), blas=blas, threads=threads)
        np.testing.assert_allclose(prog(q.numpy(), k.numpy(), v.numpy(), mask.numpy()), want, rtol=RTOL, atol=ATOL)
