"""Gathered expert products (MatMul.gathered, src/lower/cpu_products.cpp::gathered_matmul): mixtures
of experts written with gathered expert weights, compared with eager PyTorch."""

import numpy as np
import pytest
import torch
import torch.nn as nn

from conftest import CPU, randn


class GatheredExperts(nn.Module):
    """Mixtures of experts written with gathered expert weights, as OpenAI's gpt-oss reference
    (`W[expert_indices]`, then einsum) and transformers' batched_mm (`W[ids]`, then bmm) do."""

    def __init__(self, form, experts=6, dim=20, hidden=37, k=2):
        super().__init__()
        self.form, self.k = form, k
        self.gate = nn.Linear(dim, experts)
        self.w1 = nn.Parameter(torch.randn(experts, hidden, dim) * 0.3)  # [E, out, in]
        self.w2 = nn.Parameter(torch.randn(experts, hidden, dim) * 0.3)  # [E, in, out] for the second product
        self.b1 = nn.Parameter(torch.randn(experts, hidden))

    def forward(self, x):
        top = torch.topk(self.gate(x), self.k, dim=-1)
        idx, wts = top.indices, torch.softmax(top.values, dim=-1)
        if self.form == "einsum":  # A gathered: [T, k, out, in] times the token
            h = torch.einsum("beck,bk->bec", self.w1[idx], x) + self.b1[idx]
            h = torch.relu(h)
            y = torch.einsum("beck,bec->bek", self.w2[idx], h)  # w2[e] read transposed
            return torch.einsum("bek,be->bk", y, wts)
        # bmm: one row per (token, expert), B gathered [S, in, out]
        ids = idx.reshape(-1)
        rows = x.repeat_interleave(self.k, dim=0)
        h = torch.relu(torch.bmm(rows.unsqueeze(1), self.w1[ids].transpose(1, 2)).squeeze(1) + self.b1[ids])
        y = torch.bmm(h.unsqueeze(1), self.w2[ids]).squeeze(1)
        return (y.reshape(-1, self.k, y.shape[-1]) * wts.unsqueeze(-1)).sum(1)


@pytest.mark.parametrize("form", ["einsum", "bmm"])
@pytest.mark.parametrize("tokens", [1, 3, 8])
def test_gathered_expert_products_read_the_weights_in_place(check, form, tokens):
    # The gathered expert matrices are never written out: each product reads the packed
    # panels of the expert its index selects (kernel kind matmul_gathered), on both operands.
    torch.manual_seed(tokens)
    prog = check(GatheredExperts(form).eval(), randn(tokens, 20, seed=tokens), rtol=1e-4, atol=1e-5)
    if not CPU:
        return  # a GPU target has no gathered-product kernel yet: it gathers, then multiplies
    kinds = [k["kind"] for k in prog.manifest["kernels"]]
    assert kinds.count("matmul_gathered") == 2, kinds  # both products; only the bias is gathered
    assert kinds.count("gather") == 1, kinds


def test_gathered_weights_read_by_other_ops_are_still_gathered(check):
    # A gathered expert stack with a reader that is not a product is written out as before.
    w = torch.randn(5, 7, 4)
    check(lambda x, i: (torch.bmm(x, w[i]), w[i].sum()), randn(3, 2, 7), torch.tensor([4, 0, 2]))


def test_gathered_product_index_out_of_range_raises(compile_to):
    w = torch.randn(5, 7, 4)
    prog = compile_to(lambda x, i: torch.bmm(x, w[i]), randn(3, 2, 7), torch.tensor([1, 0, 2]))
    assert "matmul_gathered" in [k["kind"] for k in prog.manifest["kernels"]]
    with pytest.raises(IndexError, match=r"index 9 is out of range for dimension 0 of size 5"):
        prog(np.zeros((3, 2, 7), np.float32), np.array([1, 9, 0]))
