"""Searching and counting ops (src/import/aten_search.cpp, nanmedian in aten_misc.cpp):
searchsorted, bucketize, histc, histogram, nonzero_static, dist, nanmedian.

Integer results (indices, counts of integer-valued bins) must match eager exactly; float
results at rtol=atol=1e-5 unless a test says otherwise.

Run: CHROMA_CACHE_DIR=build/cache .venv/bin/python -m pytest tests/python/test_search_ops.py -q -p no:logging
"""

import pytest
import torch

from conftest import randint, randn

import chroma


def _sorted(*shape, seed=0):
    return torch.sort(randn(*shape, seed=seed), dim=-1)[0]


def test_searchsorted_batched_left_right_side_int32_with_ties_and_nan(check):
    seq = _sorted(4, 9)
    seq[1, 3] = seq[1, 4]  # a tie: left and right bounds differ
    x = randn(4, 6, seed=1)
    x[0, 0] = float("nan")  # PyTorch's search sends NaN past the end
    x[1, 1] = seq[1, 3]
    x[2, 2] = seq[2, 0]
    x[3, 3] = seq[3, 8]
    check(lambda s, x: (torch.searchsorted(s, x), torch.searchsorted(s, x, right=True),
                        torch.searchsorted(s, x, side="right", out_int32=True)), seq, x)


def test_searchsorted_1d_sequence_any_shape_sorter_and_scalar(check):
    raw = randn(11, seed=2)
    order = torch.argsort(raw)
    x = randn(3, 4, 5, seed=3)
    check(lambda s, x, raw, order: (torch.searchsorted(s, x), torch.searchsorted(raw, x, sorter=order),
                                    torch.searchsorted(s, 0.25), torch.searchsorted(s, x[0, 0, 0])),
          torch.sort(raw)[0], x, raw, order)


@pytest.mark.parametrize("n", [1, 2, 7, 8, 16, 33])
def test_searchsorted_every_position_of_integer_sequences(check, n):
    # every possible answer 0..n occurs, for lengths around powers of two (the step count)
    seq = torch.arange(n, dtype=torch.int64) * 2
    x = torch.arange(-1, 2 * n + 1, dtype=torch.int64)
    check(lambda s, x: (torch.searchsorted(s, x), torch.searchsorted(s, x, right=True)), seq, x)


def test_bucketize(check):
    bounds = torch.tensor([-1.0, 0.0, 0.0, 0.5, 2.0])
    x = torch.tensor([[-3.0, -1.0, 0.0, 0.25], [0.5, 1.0, 2.0, 5.0]])
    check(lambda x, b: (torch.bucketize(x, b), torch.bucketize(x, b, right=True),
                        torch.bucketize(x, b, out_int32=True)), x, bounds)


def test_histc_given_and_data_range(check):
    x = randn(200, seed=4)
    x[:3] = torch.tensor([-1.0, 1.0, 0.0])  # on the range's edges and a bin boundary
    check(lambda x: (torch.histc(x, bins=7), torch.histc(x, bins=4, min=-1, max=1), torch.histc(x * 0 + 3, bins=3)),
          x, rtol=0, atol=0)


def test_histogram_edges_weights_and_density(check):
    x = randn(60, seed=5)
    w = torch.rand(60, generator=torch.Generator().manual_seed(6))
    check(lambda x, w: (*torch.histogram(x, bins=6), *torch.histogram(x, bins=4, range=(-1.0, 1.0), weight=w),
                        *torch.histogram(x, bins=5, density=True)), x, w)


def test_nonzero_static_pads_and_truncates(check):
    x = (randn(3, 4, seed=7) > 0.3).float()
    check(lambda x, i: (torch.nonzero_static(x, size=2), torch.nonzero_static(x, size=20, fill_value=-7),
                        torch.nonzero_static(i, size=6)), x, randint(0, 2, 2, 3, 2, seed=8))


def test_dist_norms(check):
    a, b = randn(3, 4, seed=9), randn(3, 4, seed=10)
    check(lambda a, b: (torch.dist(a, b), torch.dist(a, b, 3), torch.dist(a, b, 1), torch.dist(a, b, float("inf")),
                        torch.dist(a, b, float("-inf")), torch.dist(a, b, 0)), a, b)


def test_nanmedian_dims_nans_and_integers(check):
    y = randn(4, 6, seed=11)
    y[0, 1] = float("nan")
    y[2, 2:5] = float("nan")
    check(lambda y, i: (*torch.nanmedian(y, 1), torch.nanmedian(y), *torch.nanmedian(y, 0, keepdim=True),
                        *torch.nanmedian(i, 1)), y, randint(0, 5, 3, 7, seed=12))


def test_nanmedian_all_nan_row_is_nan(check):
    # The index PyTorch reports for an all-NaN slice comes from its partial sort's internal
    # order (not a documented position); Chroma gives 0. Only the value is compared.
    y = randn(3, 5, seed=17)
    y[1, :] = float("nan")
    check(lambda y: torch.nanmedian(y, 1)[0], y)


def test_bilinear_trilinear(check):
    import torch.nn.functional as F

    x, y, w, bias = randn(3, 5, seed=13), randn(3, 4, seed=14), randn(6, 5, 4, seed=15), randn(6, seed=16)
    check(lambda x, y, w, bias: (F.bilinear(x, y, w), F.bilinear(x, y, w, bias), F.bilinear(x[0], y[0], w)),
          x, y, w, bias)


def test_topk_of_a_0d_tensor(check):
    check(lambda x: torch.topk(x, 1), randn())


def test_mode_ties_pick_the_smallest_value_and_its_last_index(check):
    x = torch.tensor([[1.0, 2, 2, 1, 3], [3, 3, 1, 1, 2], [5, 4, 4, 5, 5], [0, -1, 7, 8, 9]])
    check(lambda x, i: (*torch.mode(x, 1), *torch.mode(x, 0), *torch.mode(x, 1, keepdim=True), *torch.mode(i, -1)),
          x, randint(0, 4, 3, 2, 9, seed=18))


def test_batch_norm_with_update_functional(check):
    x, w, b = randn(4, 3, 5, seed=19), randn(3, seed=20), randn(3, seed=21)
    rm, rv = randn(3, seed=22), randn(3, seed=23).abs() + 0.5
    check(lambda x, w, b, rm, rv: torch.ops.aten._batch_norm_with_update_functional(x, w, b, rm, rv, 0.1, 1e-5),
          x, w, b, rm, rv)


@pytest.mark.parametrize("largest", [True, False])
def test_topk_and_sort_of_wide_rows_with_ties_nan_and_signed_zeros(check, largest):
    # Rows of 64 and more take the workgroup-per-row top-k on the GPU targets: every pass two
    # workgroup reductions (best key, then the lowest index holding it). Top-k on distinct
    # values (PyTorch's order among tied values is unspecified) with a NaN (the largest, as in
    # PyTorch); a stable sort with many ties and both zeros (ties keep their order).
    x = randn(3, 1000, seed=31)
    x[0, 17] = float("nan")
    i = torch.randperm(300, generator=torch.Generator().manual_seed(32)).reshape(1, 300).repeat(2, 1) - 150
    t = torch.round(randn(3, 130, seed=33) * 4) / 4
    t[1, 5], t[1, 6], t[1, 7] = -0.0, 0.0, -0.0
    check(lambda x, i, t: (*torch.topk(x, 7, dim=1, largest=largest), *torch.topk(i, 5, largest=largest),
                           *torch.sort(t, dim=1, descending=largest, stable=True)), x, i, t)
