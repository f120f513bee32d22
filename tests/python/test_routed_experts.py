"""Dense mixtures of experts (every expert on every token, weighted by a routing matrix that is
zero for the experts a token did not select): the CPU's pre-packed products skip, at run time,
the experts no token selected (src/passes/routed_experts.h; kernel labels end in ".routed").
CPU kernels: these tests compile for the CPU target only (deselected on the GPU targets, whose
products compute every expert)."""

import numpy as np
import pytest
import torch

from chroma.models import gpt_oss
from conftest import compare, randn

CFG = gpt_oss.GptOssConfig(vocab_size=64, hidden_size=64, num_layers=1, num_experts=6, experts_per_token=2,
                           intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8)


def dense_moe(seed=0):
    """gpt-oss's MoE block in its dense einsum form (chroma.models.gpt_oss.MoE.forward)."""
    torch.manual_seed(seed)
    moe = gpt_oss.MoE(CFG).eval()
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.1)
    return moe


def routed_labels(prog):
    return [k["label"] for k in prog.manifest["kernels"] if k["label"].endswith(".routed")]


def selected(moe, x):
    with torch.no_grad():
        return set(moe.route(moe.norm(x))[1].flatten().tolist())


@pytest.mark.parametrize("weights", [None, "q8", "q4"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_dense_experts_skip_the_unselected_ones(compile_to, tokens, weights):
    moe = dense_moe(tokens)
    x = randn(tokens, 64, seed=tokens)
    assert len(selected(moe, x)) < CFG.num_experts  # some experts are skipped
    prog = compile_to(moe, x, weights=weights)
    # Both expert products: the first (experts side by side in its columns, split into one
    # job per expert) and the second (one batch per expert).
    assert routed_labels(prog) == ["MatMul.packed.routed" if weights is None else f"MatMul.{weights}.routed"] * 2
    with torch.no_grad():
        want = moe(x)
    # float32: the same products in the same order; q8/q4: the stored weights' error
    # (bench/quant.py reports it), well under these bounds at this size.
    tol = {None: (1e-5, 1e-5), "q8": (1e-3, 2e-3), "q4": (1e-2, 3e-2)}[weights]
    compare(prog(x.numpy()), want, rtol=tol[0], atol=tol[1])


def test_every_expert_selected(compile_to):
    moe = dense_moe(5)
    with torch.no_grad():
        moe.gate.bias.zero_()
        moe.gate.weight.mul_(10.0)
    x = randn(32, 64, seed=5)
    assert len(selected(moe, x)) == CFG.num_experts
    prog = compile_to(moe, x)
    assert len(routed_labels(prog)) == 2
    with torch.no_grad():
        compare(prog(x.numpy()), moe(x), rtol=1e-5, atol=1e-5)


def test_an_unselected_expert_contributes_zero_even_if_not_finite(compile_to):
    # The stated rule (docs/cpu_kernels.md, "Routed expert products"): an expert no token
    # selected contributes exactly 0, as in the gather form; eager's dense form gives NaN there
    # (0 * inf).
    moe = dense_moe(2)
    x = randn(1, 64, seed=2)
    unused = sorted(set(range(CFG.num_experts)) - selected(moe, x))[0]
    with torch.no_grad():
        moe.mlp2_bias[unused].fill_(float("inf"))
        dense, gathered = moe(x), moe.forward_reference(x)
    assert torch.isnan(dense).all() and torch.isfinite(gathered).all()
    prog = compile_to(moe, x)
    assert len(routed_labels(prog)) == 2
    compare(prog(x.numpy()), gathered, rtol=1e-5, atol=1e-5)
    # A selected expert's inf still reaches the output, as in eager.
    used = sorted(selected(moe, x))[0]
    with torch.no_grad():
        moe.mlp2_bias[unused].zero_()
        moe.mlp2_bias[used, 0] = float("inf")
        want = moe(x)
    got = compile_to(moe, x)(x.numpy())
    assert np.isinf(got[0, 0]) and np.isinf(want[0, 0].item())
    compare(got[:, 1:], want[:, 1:], rtol=1e-5, atol=1e-5)


class ReturnsExpertValues(torch.nn.Module):
    """The dense form, also returning every expert's output: nothing may be skipped."""

    def __init__(self):
        super().__init__()
        self.moe = dense_moe(3)

    def forward(self, x):
        m = self.moe
        t = m.norm(x)
        w, i = m.route(t)
        routing = ((i[:, :, None] == torch.arange(CFG.num_experts)).to(t.dtype) * w[:, :, None]).sum(1)
        h1 = gpt_oss.swiglu(torch.einsum("th,efh->tef", t, m.mlp1_weight) + m.mlp1_bias, limit=CFG.swiglu_limit)
        h2 = torch.einsum("tei,ehi->teh", h1, m.mlp2_weight) + m.mlp2_bias
        return x + torch.einsum("teh,te->th", h2, routing), h2


def test_expert_values_read_elsewhere_are_computed_for_every_expert(compile_to):
    mod = ReturnsExpertValues().eval()
    x = randn(1, 64, seed=3)
    prog = compile_to(mod, x)
    assert routed_labels(prog) == []
    with torch.no_grad():
        want = mod(x)
    got = prog(x.numpy())
    compare(got[0], want[0], rtol=1e-5, atol=1e-5)
    compare(got[1], want[1], rtol=1e-5, atol=1e-5)


class DenseBmmExperts(torch.nn.Module):
    """Another way people write it: experts as batched products over stacked weights, the
    routing matrix made by scatter, the weighted sum as a multiply and a sum."""

    def __init__(self, experts=6, dim=32, hidden=48, k=2):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.k = k
        self.gate = torch.nn.Linear(dim, experts)
        self.w1 = torch.nn.Parameter(torch.randn(experts, dim, hidden, generator=g) * 0.2)
        self.b1 = torch.nn.Parameter(torch.randn(experts, hidden, generator=g) * 0.2)
        self.w2 = torch.nn.Parameter(torch.randn(experts, hidden, dim, generator=g) * 0.2)

    def forward(self, x):
        top = torch.topk(self.gate(x), self.k, dim=-1)
        routing = torch.zeros(x.shape[0], self.w1.shape[0], dtype=x.dtype).scatter(1, top.indices, torch.softmax(top.values, -1))
        xe = x.unsqueeze(0).expand(self.w1.shape[0], -1, -1)
        h = torch.nn.functional.gelu(torch.bmm(xe, self.w1) + self.b1[:, None, :])
        y = torch.bmm(h, self.w2)  # [E, T, dim]
        return (y * routing.t()[:, :, None]).sum(0)


@pytest.mark.parametrize("tokens", [1, 2])
def test_experts_as_batched_products_and_a_weighted_sum(compile_to, tokens):
    mod = DenseBmmExperts().eval()
    x = randn(tokens, 32, seed=11)
    prog = compile_to(mod, x)
    assert routed_labels(prog) == ["MatMul.packed.routed"] * 2
    with torch.no_grad():
        compare(prog(x.numpy()), mod(x), rtol=1e-5, atol=1e-5)


class SoftMixture(DenseBmmExperts):
    """The same experts mixed by a softmax over all of them (no selection): every weight is
    nonzero, so nothing is routed."""

    def forward(self, x):
        routing = torch.softmax(self.gate(x), dim=-1)
        xe = x.unsqueeze(0).expand(self.w1.shape[0], -1, -1)
        y = torch.bmm(torch.nn.functional.gelu(torch.bmm(xe, self.w1) + self.b1[:, None, :]), self.w2)
        return (y * routing.t()[:, :, None]).sum(0)


def test_weights_no_selection_made_are_not_routed(compile_to):
    mod = SoftMixture().eval()
    x = randn(2, 32, seed=12)
    prog = compile_to(mod, x)
    assert routed_labels(prog) == []
    assert not any(k["label"].startswith("Reduce.max <- ne") for k in prog.manifest["kernels"])  # no mask
    with torch.no_grad():
        compare(prog(x.numpy()), mod(x), rtol=1e-5, atol=1e-5)


def test_bfloat16_dense_experts(compile_to):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    mod = DenseBmmExperts().eval().to(torch.bfloat16)
    x = randn(1, 32, seed=13).to(torch.bfloat16)
    prog = compile_to(mod, x)
    assert len(routed_labels(prog)) == 2
    with torch.no_grad():
        want = mod(x).float().numpy()
    got = prog(x.float().numpy().astype(ml_dtypes.bfloat16)).astype(np.float32)
    # each op rounded to bfloat16 as eager does; the products' sums in another order
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
