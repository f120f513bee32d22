"""Attention in one kernel (passes/fuse_attention; chroma/cpu/attention.h on the CPU,
src/codegen/gpu/attention.cpp on the GPU targets).

Every form the importer sees: torch's scaled_dot_product_attention (no mask, float and boolean
masks, causal, a given scale, grouped heads) and attention written out by hand (T5's product
plus position bias, a division by sqrt(d), casts to float32 around the softmax), against torch
eager. On every target each must become one Attention kernel, and the arena must not hold the
scores: it grows with the sequence, not with its square (the GPU targets: CHROMA_TEST_TARGET=webgpu,
cuda, metal, and in the CPU pass through the null target's plan and each GPU target's kernel
texts). The CPU's blocks are 128 query rows and 512 keys; the GPU kernel's are 32 or 64 rows
(one per invocation) and 64 keys when D + E <= 64 (16384 bytes of workgroup memory), fewer for
wider heads (16 at D = E = 128); so the shapes below cover partial blocks, several blocks and
a single row. Heads wider than 256 are not fused on the GPU targets (products and a softmax).

Tolerances: the kernel adds the softmax's sum and the second product in another order than
eager (blocks of keys, an online maximum): a few float32 ulp of the output's scale (on the GPU
targets conftest widens them to GPU_RTOL / GPU_ATOL, 1e-4 / 1e-5: their exp differs from libm's
in the last bits).
"""

import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import CPU, TARGET

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
    (2, 3, 130, 600, 16, 24),    # several query blocks and key blocks, partial ones, D != E
    (1, 1, 1, 517, 8, 8),        # a single query row over three key blocks
    (1, 2, 40, 70, 128, 128),    # wide heads: the GPU kernel's key blocks of 16
    (1, 1, 40, 1100, 64, 64),    # a long sequence: lavapipe ends loops past 65535 iterations per invocation
    (1, 1, 5, 20, 288, 8),       # wider than the GPU kernel takes: unfused there, fused on the CPU
])
def test_sdpa_without_mask(check, b, h, L, S, d, e):
    q, k, v = _qkv(b, h, L, S, d, e)
    check(Sdpa(), q, k, v, rtol=RTOL, atol=ATOL)


def test_sdpa_float_mask_and_scale(check):
    q, k, v = _qkv(2, 2, 70, 270, 8)
    mask = torch.randn(2, 1, 70, 270)
    check(Sdpa(scale=0.3), q, k, v, mask, rtol=RTOL, atol=ATOL)


def test_sdpa_mask_with_narrower_values_is_one_kernel(check):
    # Eager takes its math backend here (a mask, value heads narrower than the keys'), which
    # scales q and k each and selects zeros for masked rows through the scores: the export
    # still gives the one fused form.
    q, k, v = _qkv(1, 2, 70, 270, 16, 8)
    mask = torch.randn(1, 1, 70, 270)
    prog = check(Sdpa(), q, k, v, mask, rtol=RTOL, atol=ATOL)
    assert prog.stats["temporaries_bytes"] < 2 * 70 * 270 * 4, prog.stats


class RotaryHeads(torch.nn.Module):
    """q and k computed in [B, S, H, D] (a rotary embedding), split into heads by a transpose
    for the attention, as FLUX's attention processor does."""

    def forward(self, x, cos, sin):
        b, s, hd = x.shape
        q = x.view(b, s, 4, hd // 4)
        rot = torch.stack([-q[..., 1::2], q[..., 0::2]], dim=-1).flatten(3)
        q = q * cos + rot * sin
        q = q.transpose(1, 2)
        return F.scaled_dot_product_attention(q, q * 0.5, q)


def test_heads_split_after_an_expression_are_read_in_place(check):
    # The rotary expression is written once in its own order and the attention reads its
    # heads through strides: no kernel writes it in the transposed order (each of its rows
    # would read the sources a whole row of heads apart).
    g = torch.Generator().manual_seed(0)
    x, cos, sin = torch.randn(1, 200, 64, generator=g), torch.randn(200, 1, 16, generator=g), torch.randn(200, 1, 16, generator=g)
    prog = check(RotaryHeads(), x, cos, sin, rtol=RTOL, atol=ATOL)
    if CPU:
        labels = [k["label"] for k in prog.manifest["kernels"]]
        assert not any(lb.startswith("Permute") for lb in labels), labels


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


def test_rows_of_minus_inf_and_nan_give_nan(check):
    # Softmax's NaN semantics: a row whose scores are all -inf is 0 / 0, a NaN or +inf score
    # makes its row NaN; the other rows are untouched (NaN compares equal in the check).
    q, k, v = _qkv(1, 2, 70, 300, 8)
    bias = torch.randn(1, 2, 70, 300)
    bias[0, 0, 3] = -math.inf
    bias[0, 1, 60] = -math.inf
    bias[0, 1, 5, 299] = math.nan
    bias[0, 0, 64, 7] = math.inf
    want = T5Attention()(q, k, v, bias)
    assert want[0, 0, 3].isnan().all() and want[0, 1, 5].isnan().all() and not want[0, 0, 4].isnan().any()
    check(T5Attention(), q, k, v, bias, rtol=RTOL, atol=ATOL)


def test_t5_position_bias(check):
    q, k, v = _qkv(1, 3, 65, 65, 8)
    bias = torch.randn(1, 3, 65, 65)
    check(T5Attention(), q, k, v, bias, rtol=RTOL, atol=ATOL)


def test_divided_scores_and_head_views(check):
    g = torch.Generator().manual_seed(1)
    check(Divided(4), torch.randn(2, 40, 32, generator=g), torch.randn(2, 300, 32, generator=g), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("model,args", [
    (Sdpa(), lambda: _qkv(1, 2, 96, 96, 8)),
    (Sdpa(causal=True), lambda: _qkv(1, 2, 96, 96, 8)),
    (T5Attention(), lambda: _qkv(1, 2, 96, 96, 8) + (torch.randn(1, 2, 96, 96),)),
])
def test_one_kernel_and_no_scores_in_the_arena(check, model, args):
    # On every target (the GPU programs' stats come from their package manifest: the lowered
    # kernels and the planned temporaries, as the CPU's).
    inputs = args()
    prog = check(model, *inputs, rtol=RTOL, atol=ATOL)
    # No temporary holds the scores or the weights ([1, 2, 96, 96] float32: 73,728 bytes):
    # the attention kernel, and at most a copy of its output into the caller's layout.
    assert prog.stats["temporaries_bytes"] < 2 * 96 * 96 * 4, prog.stats
    assert prog.stats["kernels"] <= 2, prog.stats
    if not CPU:  # one dispatch each, the attention's workgroups never more than 64 wide
        assert prog.stats["dispatches"] == prog.stats["kernels"], prog.stats


def test_arena_grows_linearly_with_the_sequence(check):
    arenas = []
    for n in (256, 1024):
        q, k, v = _qkv(1, 2, n, n, 16)
        prog = check(Sdpa(), q, k, v, rtol=RTOL, atol=ATOL)
        arenas.append(prog.stats["arena_bytes"])
    # Four times the sequence: at most four times the arena (the scores would be sixteen).
    assert arenas[1] <= 4 * max(arenas[0], 1), arenas


@pytest.mark.skipif(not CPU, reason="compiles for the GPU targets without running them (the CPU pass)")
@pytest.mark.parametrize("target", ["webgpu", "cuda", "metal"])
def test_gpu_targets_plan_one_attention_kernel(tmp_path, target):
    # Every GPU target fuses it (GpuTarget::prepare) and prints one attention kernel; the null
    # target's plan (the same lowering and arena) holds no scores, at 256 and at 1024 tokens.
    import json

    import chroma
    from chroma import _compiler
    from chroma.paths import include_dir

    arenas = []
    for n in (256, 1024):
        path = str(tmp_path / f"att{n}.cgraph")
        chroma.export(Sdpa(), _qkv(1, 2, n, n, 16), path)
        texts = _compiler.gpu_kernel_sources(path, target)
        assert sum(t.startswith("// attention:") for t in texts) == 1, [t.splitlines()[0] for t in texts]
        stats = json.loads(_compiler.compile_graph(path, str(tmp_path / f"n{n}"), target="null",
                                                   include_dir=include_dir()))["stats"]
        assert stats["temporaries_bytes"] < n * n * 4 and stats["kernels"] <= 2, stats
        arenas.append(stats["arena_bytes"])
    assert arenas[1] <= 4 * arenas[0], arenas


@pytest.mark.skipif(not CPU, reason="the CPU target's portable kernels (blas=False)")
def test_portable_kernels_and_two_threads(tmp_path):
    import chroma

    q, k, v = _qkv(2, 2, 70, 300, 8)
    mask = torch.rand(2, 1, 70, 300) > 0.3
    want = Sdpa()(q, k, v, mask).numpy()
    for blas, threads in ((False, 1), (True, 2)):
        prog = chroma.compile(Sdpa(), (q, k, v, mask), out=str(tmp_path / f"a{blas}{threads}"), blas=blas, threads=threads)
        np.testing.assert_allclose(prog(q.numpy(), k.numpy(), v.numpy(), mask.numpy()), want, rtol=RTOL, atol=ATOL)


@pytest.mark.skipif(not CPU, reason="the CPU target's choice of product library")
def test_attention_blocks_use_the_programs_float32_gemm(tmp_path):
    """Attention's blocks are multiplied by the library the build uses for float32 products
    (oneDNN's sgemm where Chroma has it), also in a program with no other float32 product (an
    attention-only model; a transformer whose projections are quantized): OpenBLAS called from
    every pool thread at once contended for its own threads and ran 45x slower than eager."""
    import chroma

    q, k, v = _qkv(1, 2, 40, 70, 16, 16)
    lin = chroma.compile(torch.nn.Linear(16, 16).eval(), (q,), out=str(tmp_path / "lin"))
    att = chroma.compile(Sdpa().eval(), (q, k, v), out=str(tmp_path / "att"), threads=2)
    assert att.manifest["options"]["sgemm"] == lin.manifest["options"]["sgemm"]
    np.testing.assert_allclose(att(q.numpy(), k.numpy(), v.numpy()), F.scaled_dot_product_attention(q, k, v).numpy(),
                               rtol=RTOL, atol=ATOL)


def _has_amx():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return " amx_bf16" in f.read() and os.environ.get("CHROMA_NO_AMX", "0") in ("", "0")
    except OSError:
        return False


@pytest.mark.skipif(not CPU, reason="attention=bf16 is a CPU option (the GPU kernels' attention is float32)")
@pytest.mark.parametrize("mask", [False, True])
def test_attention_in_bfloat16_on_request(tmp_path, mask):
    # weights={"attention": "bf16"}: a float32 model's attention multiplies q, k, the weights
    # and v rounded to bfloat16 (float32 sums) where the CPU has AMX. Bound: each operand
    # rounded once (2^-9 relative) moves the output by a few 2^-9 of its scale; against the
    # same attention in float64.
    import chroma

    q, k, v = _qkv(1, 3, 150, 600, 40, 24)
    args = (q, k, v) + ((torch.randn(1, 1, 150, 600),) if mask else ())
    exact = Sdpa()(*[a.double() for a in args]).numpy()
    prog = chroma.compile(Sdpa(), args, out=str(tmp_path / "bf16"), weights={"attention": "bf16"}, threads=2)
    assert prog.manifest["options"]["weights"]["attention"] == "bf16"
    got = prog(*[a.numpy() for a in args])
    err = np.abs(got - exact).max() / np.abs(exact).max()
    assert err < 8 * 2.0 ** -9, err
    exact32 = chroma.compile(Sdpa(), args, out=str(tmp_path / "fp32"), threads=2)(*[a.numpy() for a in args])
    assert np.abs(exact32 - exact).max() / np.abs(exact).max() < 1e-5
    if _has_amx():  # the bfloat16 path ran: not the float32 result
        assert np.abs(got - exact32).max() / np.abs(exact).max() > 1e-5
