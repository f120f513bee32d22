"""Matrix products against torch eager: mm, addmm, bmm and baddbmm, matmul's broadcasting
forms, transposed and sliced operands (BLAS and the generated loops), integer products, and
operands whose rows lie a multiple of 4 KiB apart (et::sgemm's re-pitched copy).

Run: cd /work/main && .venv/bin/python -m pytest tests/python/test_matmul.py -q
"""

import pytest
import torch

from conftest import randint, randn


@pytest.mark.parametrize("beta,alpha", [(1.0, 1.0), (0.5, 2.0), (0.0, 1.0)])
def test_addmm(check, beta, alpha):
    check(lambda b, x, w: torch.addmm(b, x, w, beta=beta, alpha=alpha), randn(11, seed=1), randn(5, 7, seed=2),
          randn(7, 11, seed=3))


MM_CASES = {
    "plain": (lambda a, b: a @ b, (5, 7), (7, 3)),
    "lhs_t": (lambda a, b: a.t() @ b, (7, 5), (7, 3)),
    "rhs_t": (lambda a, b: torch.mm(a, b.t()), (5, 7), (3, 7)),
    "both_t": (lambda a, b: torch.mm(a.t(), b.t()), (7, 5), (3, 7)),
    "sliced": (lambda a, b: a[:, ::2] @ b[1:5], (5, 7), (6, 3)),
    "bmm": (torch.bmm, (3, 5, 7), (3, 7, 2)),
    "bmm_t": (lambda a, b: torch.bmm(a, b.transpose(1, 2)), (3, 5, 7), (3, 2, 7)),
    "vec_mat": (torch.matmul, (7,), (7, 3)),
    "mat_vec": (torch.matmul, (5, 7), (7,)),
    "dot": (torch.matmul, (7,), (7,)),
    "vec_batched": (torch.matmul, (7,), (3, 7, 2)),
    "batched_vec": (torch.matmul, (3, 5, 7), (7,)),
    "3d_2d": (torch.matmul, (3, 5, 7), (7, 4)),
    "2d_3d": (torch.matmul, (5, 7), (3, 7, 4)),
    "bcast": (torch.matmul, (2, 1, 5, 7), (3, 7, 4)),
    "bcast_t": (lambda a, b: a @ b.transpose(-1, -2), (2, 1, 5, 7), (3, 4, 7)),
    "expand": (lambda a, b: a.expand(3, 5, 7) @ b, (1, 5, 7), (3, 7, 2)),
}


@pytest.mark.parametrize("blas", [True, False])
@pytest.mark.parametrize("case", list(MM_CASES))
def test_matmul(check, case, blas):
    fn, sa, sb = MM_CASES[case]
    check(fn, randn(*sa, seed=1), randn(*sb, seed=2), blas=blas)


@pytest.mark.parametrize("threads", [1, 2])
def test_matmul_rows_4k_apart(check, threads):
    # B read as it lies with rows a multiple of 1024 elements apart (GPT-2's Conv1D weights
    # [K, N], x @ W, activations [K, 2048]): et::sgemm copies such a B to another pitch
    # first (oneDNN 2.6 ran it at a third of its speed). Constant and computed B, whole and
    # sliced (the column blocks of a wide product and of each thread read a part of it).
    torch.manual_seed(21)
    w = torch.randn(96, 1024) / 10

    def f(x, y):
        return torch.addmm(torch.ones(1024), x, w), x @ y, (x @ y[:, 5:3000]) * 2.0

    with torch.no_grad():
        check(f, randn(40, 96, seed=22), randn(96, 3072, seed=23), threads=threads, rtol=1e-4, atol=1e-4)


def test_baddbmm(check):
    check(lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0), randn(3, 5, 2, seed=0), randn(3, 5, 7, seed=1),
          randn(3, 7, 2, seed=2))


def test_matmul_int64(check):
    check(lambda a, b: a @ b, randint(-5, 5, 3, 4, seed=1), randint(-5, 5, 4, 2, seed=2))


def test_integer_add_matrix_products(check):
    # integer tensors: alpha and beta convert to the integer type (0.6 -> 0, 2.6 -> 2), as in eager
    s, m, v = randint(-9, 9, 5, seed=1), randint(-5, 5, 5, 4, seed=2), randint(-5, 5, 4, seed=3)
    x, b1, b2 = randint(-9, 9, 5, 3, seed=4), randint(-5, 5, 2, 5, 4, seed=5), randint(-5, 5, 2, 4, 3, seed=6)
    check(lambda s, m, v, x, b1, b2: (torch.addmv(s, m, v, beta=0.2, alpha=0.6), torch.addmv(s, m, v, beta=1.7, alpha=2.6),
                                      torch.addmm(x, m, b2[0], beta=3, alpha=2), torch.addbmm(x, b1, b2, alpha=2),
                                      torch.baddbmm(x, b1, b2, beta=0)),
          s, m, v, x, b1, b2)
