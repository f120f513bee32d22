"""Non-core ATen ops that torch.export keeps (src/import/aten_extra.cpp): index_reduce,
segment_reduce, grid_sampler_3d, as_strided_scatter, unfold and the *_copy forms of views;
also antialiased resizing, put, histogram with tensor edges, gather of 0-d tensors, and the
replacement decompositions of python/chroma/frontend/decompositions.py (CPU flash attention,
chunked linear cross-entropy).

Every test checks that the op really is in the exported graph, compiles with Chroma and
compares with eager PyTorch at rtol=atol=1e-5 (integer outputs exactly) unless it says why
not.

Run: CHROMA_CACHE_DIR=build/cache .venv/bin/python -m pytest tests/python/test_extra_ops.py -q -p no:logging
"""

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import compare, randint, randn

import chroma
from chroma.frontend import graph_file
from chroma.compiler import compile_graph

A = torch.ops.aten

warnings.filterwarnings("ignore", message="index_reduce\\(\\) is in beta")


@pytest.fixture
def kept(check):
    """kept(fn, *inputs, targets=[...], **tol): asserts every target is in the exported
    graph, then check(fn, *inputs)."""

    def _kept(fn, *inputs, targets, **kw):
        nodes = [n["target"] for n in chroma.export(fn, inputs).json["nodes"]]
        for t in targets:
            assert t in nodes, (t, nodes)
        return check(fn, *inputs, **kw)

    return _kept


# ---------------------------------------------------------------------------- index_reduce

@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce(kept, reduce):
    x, x3 = randn(5, 4, seed=1), randn(2, 6, 3, seed=2)
    idx = torch.tensor([0, 2, 2, 4, 0, 2])   # repeated slots; 1 and 3 are never hit
    idx3 = torch.tensor([5, 1, 5, 5])

    def fn(x, x3, s0, s1, s3):
        return (x.index_reduce(0, idx, s0, reduce), x.index_reduce(0, idx, s0, reduce, include_self=False),
                x.index_reduce(1, idx[:3] % 4, s1, reduce), x.index_reduce(-1, idx[:3] % 4, s1, reduce, include_self=False),
                x3.index_reduce(1, idx3, s3, reduce, include_self=False), x3.index_reduce(1, idx3, s3, reduce))

    kept(fn, x, x3, randn(6, 4, seed=3), randn(5, 3, seed=4), randn(2, 4, 3, seed=5),
         targets=["aten.index_reduce.default"])


def test_index_reduce_integers_and_int32_index(kept):
    # integer mean divides with floor (negative sums included)
    x = randint(-20, 20, 4, 5, seed=1)
    s = randint(-20, 20, 4, 6, seed=2)
    idx = torch.tensor([1, 1, 3, 0, 1, 4], dtype=torch.int32)
    kept(lambda x, s: tuple(x.index_reduce(1, idx, s, r, include_self=inc)
                            for r in ("prod", "mean", "amax", "amin") for inc in (True, False)),
         x, s, targets=["aten.index_reduce.default"])


# ---------------------------------------------------------------------------- segment_reduce

REDUCTIONS = ["sum", "mean", "max", "min", "prod"]


@pytest.mark.parametrize("initial", [None, 2.5])
def test_segment_reduce_lengths_read_at_run_time(kept, initial):
    data = randn(9, 3, seed=1)
    lengths = torch.tensor([2, 0, 4, 1, 2])   # an empty segment

    def fn(d, L):
        return tuple(A.segment_reduce(d, r, lengths=L, initial=initial) for r in REDUCTIONS)

    prog = kept(fn, data, lengths, targets=["aten.segment_reduce.default"])
    # other lengths, same program: the segmentation is computed at run time
    for other in ([0, 0, 9, 0, 0], [1, 1, 1, 1, 5], [3, 3, 3, 0, 0]):
        L = torch.tensor(other)
        compare(prog(data.numpy(), L.numpy()), fn(data, L))


def test_segment_reduce_offsets_axis_and_unsafe(kept):
    d2 = randn(2, 7, 2, seed=3)
    # one segmentation per row (axis 1); not axis=-2: PyTorch's meta function sizes that
    # output by lengths.shape[-2] (eager gives [2, 3, 2], export records [2, 2, 2])
    L2 = torch.tensor([[3, 0, 4], [1, 5, 1]], dtype=torch.int32)
    d1 = randn(8, seed=4)
    off = torch.tensor([1, 3, 3, 6])     # elements 0, 6, 7 belong to no segment
    short = torch.tensor([2, 3])         # unsafe: the lengths cover 5 of 8 elements

    def fn(d2, L2, d1, off, short):
        out = ()
        for r in REDUCTIONS:
            out += (A.segment_reduce(d2, r, lengths=L2, axis=1), A.segment_reduce(d2, r, lengths=L2, axis=1, initial=-1.0),
                    A.segment_reduce(d1, r, offsets=off), A.segment_reduce(d1, r, offsets=off, initial=0.5),
                    A.segment_reduce(d1, r, lengths=short, unsafe=True))
        return out

    kept(fn, d2, L2, d1, off, short, targets=["aten.segment_reduce.default"])


def test_segment_reduce_nan_propagates_through_max_and_min(kept):
    d = torch.tensor([1.0, float("nan"), 3.0, -2.0, float("nan"), 0.5])
    kept(lambda d, L: (A.segment_reduce(d, "max", lengths=L), A.segment_reduce(d, "min", lengths=L),
                       A.segment_reduce(d, "sum", lengths=L)), d, torch.tensor([2, 2, 2]),
         targets=["aten.segment_reduce.default"])


# ---------------------------------------------------------------------------- grid_sampler_3d

@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sampler_3d(kept, mode):
    x = randn(2, 3, 4, 5, 6, seed=1)
    g = randn(2, 3, 4, 2, 3, seed=2) * 0.9   # some samples fall outside [-1, 1]
    g[0, 0, 0, 0] = torch.tensor([1.0, -1.0, 1.0])
    g[1, 2, 3, 1] = torch.tensor([2.7, -3.1, 4.4])   # far outside: reflection folds more than once
    kept(lambda x, g: tuple(F.grid_sample(x, g, mode=mode, padding_mode=p, align_corners=a)
                            for p in ("zeros", "border", "reflection") for a in (False, True)),
         x, g, targets=["aten.grid_sampler_3d.default"])


def test_grid_sampler_3d_size_one_axes(kept):
    x = randn(1, 2, 1, 3, 1, seed=3)
    g = randn(1, 2, 2, 2, 3, seed=4)
    kept(lambda x, g: tuple(F.grid_sample(x, g, mode=m, padding_mode=p, align_corners=a)
                            for m in ("bilinear", "nearest") for p in ("zeros", "border", "reflection")
                            for a in (False, True)),
         x, g, targets=["aten.grid_sampler_3d.default"])


# ---------------------------------------------------------------------------- strided copies, unfold

def test_as_strided_copy_and_scatter(kept):
    x = randn(4, 6, seed=1)
    kept(lambda x, s, s2, s0: (A.as_strided_copy(x, [3, 2], [5, 2], 1), A.as_strided_copy(x, [2, 3, 2], [6, 1, 3]),
                               A.as_strided_scatter(x, s, [3, 2], [5, 2], 1),
                               A.as_strided_scatter(x, s2, [2, 2, 3], [12, 1, 4], 0),
                               A.as_strided_scatter(x, s0, [], [], 23)),
         x, randn(3, 2, seed=2), randn(2, 2, 3, seed=3), randn(seed=4),
         targets=["aten.as_strided_copy.default", "aten.as_strided_scatter.default"])


def test_view_copies(kept):
    x = randn(3, 4, 5, seed=1)
    kept(lambda x: (A.view_copy(x, [5, 12]), A.view_copy(x, [-1, 10]), A.permute_copy(x, [2, 0, 1]),
                    *A.unbind_copy(x, 1), *A.unbind_copy(x, -1),
                    A.narrow_copy(x, 1, 1, 2), A.narrow_copy(x, -1, -3, 3), A.narrow_copy(x, 0, 3, 0)),
         x, targets=["aten.view_copy.default", "aten.permute_copy.default", "aten.unbind_copy.int",
                     "aten.narrow_copy.default"])


def test_unfold(kept):
    x, i = randn(4, 7, 3, seed=1), randint(-5, 5, 9, seed=2)
    kept(lambda x, i, s: (x.unfold(1, 3, 2), x.unfold(0, 4, 1), x.unfold(-1, 1, 5), x.unfold(1, 7, 3), i.unfold(0, 2, 3),
                          A.unfold_copy(x, 2, 2, 1), s.unfold(0, 1, 1), x.unfold(1, 0, 2)),
         x, i, randn(seed=3), targets=["aten.unfold.default"])


# ------------------------------------------------------- antialiased resize, put, histogram

@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_antialiased_resize(kept, mode):
    # downscale (wide windows), upscale (the plain filter), one axis unchanged, align_corners,
    # scale factors, float64; eager's float32 weights are reproduced, sums differ by rounding
    x, x64 = randn(2, 3, 17, 12, seed=1), randn(1, 2, 9, 30, seed=2).double()

    def fn(x, x64):
        return (F.interpolate(x, size=(5, 4), mode=mode, antialias=True),
                F.interpolate(x, size=(30, 12), mode=mode, antialias=True),
                F.interpolate(x, size=(3, 25), mode=mode, antialias=True, align_corners=True),
                F.interpolate(x, scale_factor=0.37, mode=mode, antialias=True),
                F.interpolate(x, size=(1, 1), mode=mode, antialias=True),
                F.interpolate(x64, size=(4, 7), mode=mode, antialias=True))

    kept(fn, x, x64, targets=[f"aten._upsample_{mode}2d_aa.default"], rtol=1e-5, atol=1e-5)


def test_antialiased_resize_keeps_infinities_out_of_other_windows(check):
    x = randn(1, 1, 4, 40, seed=3)
    x[..., 0] = float("inf")  # only the first output column's window reads it
    check(lambda x: F.interpolate(x, size=(4, 5), mode="bilinear", antialias=True), x)


def test_put(kept):
    x, i = randn(3, 4, seed=1), randint(-5, 5, 2, 3, seed=2)

    def fn(x, i, s, t):
        idx = torch.tensor([0, -1, 5, 7])
        return (torch.put(x, idx, s), torch.put(x, torch.tensor([1, 1, -12, 3]), s, accumulate=True),
                torch.put(i, torch.tensor([[4], [0]]), t), torch.put(i, torch.tensor([2, 2, 2]), t.flatten().repeat(2)[:3], True),
                torch.put(x[0, 0], torch.tensor([0]), s[0, :1]))

    kept(fn, x, i, randn(2, 2, seed=3), randint(-9, 9, 2, 1, seed=4), targets=["aten.put.default"])


def test_histogram_with_tensor_edges(kept):
    x = randn(200, seed=1) * 2
    x[3], x[7] = float("nan"), 2.0  # NaN counts nowhere; the last edge is in the last bin
    e = torch.tensor([-1.0, -0.5, 0.0, 0.3, 2.0])
    w = torch.rand(200, generator=torch.Generator().manual_seed(5))

    def fn(x, e, w):
        return (*torch.histogram(x, e), *torch.histogram(x, e, weight=w, density=True), *torch.histogram(x[:0], e))

    kept(fn, x, e, w, targets=["aten.histogram.bins_tensor"])


def test_histogram_bin_count_edge_cases(check):
    # no data: PyTorch's default range [0, 1]; one value: the range widens by 0.5 each side
    check(lambda x, y: (*torch.histogram(x, 3), *torch.histogram(y, 4, density=True), *torch.histogram(x[:0], 2)),
          randn(5, 0, 5), torch.full((6,), 2.5))


def test_gather_of_0d_and_empty_index(check):
    check(lambda s, v: (torch.gather(s, 0, torch.tensor([0, 0])), torch.gather(s, 0, torch.tensor(0)),
                        torch.gather(v, 0, torch.zeros(2, 0, dtype=torch.long)), torch.gather(v, -1, torch.tensor(3))),
          randn(seed=1), randn(5, seed=2))


def test_index_read_at_run_time(check):
    # x[i.item()] and take of a 0-d tensor: a Gather whose index comes from the input; the
    # bounds torch.export asserts are checked by the Gather itself
    x, i, s = randn(4, 3, seed=1), torch.tensor(2), randn(seed=2)
    prog = check(lambda x, i, s, j: (x[i.item()], x[:, (i - 2).item()], torch.take(s, j)), x, i, s, torch.tensor(-1))
    got = prog(x.numpy(), np.array(-1), s.numpy(), np.array(0))
    np.testing.assert_array_equal(got[0], x[-1].numpy())
    np.testing.assert_array_equal(got[1], x[:, -3].numpy())
    with pytest.raises(IndexError, match="index 7 is out of range for dimension 0 of size 4"):
        prog(x.numpy(), np.array(7), s.numpy(), np.array(0))


# ----------------------------------------------------------- replacement decompositions

def test_cpu_flash_attention_outputs_and_logsumexp(check):
    # the op's second output is the logsumexp [N, H, L] (torch's own decomposition returns the
    # attention weights); causal and additive masks, and a fully masked row (zeros, -inf)
    q, k, v = randn(2, 3, 5, 8, seed=1), randn(2, 3, 6, 8, seed=2), randn(2, 3, 6, 8, seed=3)
    add = randn(5, 6, seed=5)
    gone = add.clone()
    gone[2] = float("-inf")
    flash = A._scaled_dot_product_flash_attention_for_cpu

    def fn(q, k, v, add, gone):
        return (*flash(q, k, v), flash(q, k, v, is_causal=True)[0], *flash(q, k, v, attn_mask=add, scale=0.3),
                *flash(q, k, v, attn_mask=gone), F.scaled_dot_product_attention(q, k, v, is_causal=True))

    check(fn, q, k, v, add, gone)


def test_chunked_linear_cross_entropy(check):
    x, w, b = randn(6, 5, seed=1), randn(7, 5, seed=2), randn(7, seed=3)
    t = torch.tensor([0, 3, 6, 2, 5, 1])
    opts = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=2)

    def fn(x, w, b):
        return (F.linear_cross_entropy(x, w, t, linear_bias=b, reduction="mean", options=opts),
                F.linear_cross_entropy(x, w, t, reduction="sum", ignore_index=3, options=opts),
                F.linear_cross_entropy(x, w, t, linear_bias=b, reduction="none", options=opts))

    nodes = [n["target"] for n in chroma.export(fn, (x, w, b)).json["nodes"]]
    assert not any("linear_cross_entropy" in n for n in nodes), nodes  # decomposed, not kept
    check(fn, x, w, b)


def test_integer_linspace_matches_the_cpu_kernel(check):
    # start/end truncated to the integer type, steps in double, each half counted from its end
    def fn(s, e):
        return (torch.linspace(-3, 7, 7, dtype=torch.int64), torch.linspace(1.5, 10.7, 5, dtype=torch.int64),
                torch.linspace(0, 255, 11, dtype=torch.uint8), torch.linspace(5, -20, 9, dtype=torch.int32),
                torch.linspace(s, e, 13, dtype=torch.int64), torch.linspace(-2, 1, 1, dtype=torch.int16))

    check(fn, torch.tensor(-2.5), torch.tensor(17.0))


# ---------------------------------------------------------------------------- refusals

def _rewritten(tmp_path, fn, inputs, target, edit):
    path = str(tmp_path / "bad.cgraph")
    chroma.export(fn, inputs, path)
    meta, blob = graph_file.read(path)
    nodes = [n for n in meta["nodes"] if n["target"] == target]
    assert len(nodes) == 1, [n["target"] for n in meta["nodes"]]
    edit(nodes[0])
    graph_file.write(path, meta, bytes(blob))
    return compile_graph(path, str(tmp_path / "bad"))


def test_refusals_name_the_op_and_the_problem(tmp_path):
    x, g = randn(1, 2, 3, 4, 5), randn(1, 2, 2, 2, 3, seed=1)

    def bicubic(n):
        n["args"][2] = 2

    with pytest.raises(chroma.CompileError, match="grid_sampler_3d: bicubic interpolation is only defined for 4-d"):
        _rewritten(tmp_path, lambda x, g: F.grid_sample(x, g, align_corners=False), (x, g),
                   "aten.grid_sampler_3d.default", bicubic)

    def bad_reduce(n):
        n["args"][4] = {"str": "median"}

    with pytest.raises(chroma.CompileError, match="index_reduce: reduce = 'median' is not one of prod, mean, amax, amin"):
        _rewritten(tmp_path, lambda x, s: x.index_reduce(0, torch.tensor([0, 2]), s, "amax"),
                   (randn(3, 2), randn(2, 2, seed=1)), "aten.index_reduce.default", bad_reduce)

    def indices_form(n):
        n["kwargs"]["indices"] = n["kwargs"].pop("lengths")

    with pytest.raises(chroma.CompileError, match="segment_reduce: the indices form is not supported"):
        _rewritten(tmp_path, lambda d, L: A.segment_reduce(d, "sum", lengths=L), (randn(4), torch.tensor([1, 3])),
                   "aten.segment_reduce.default", indices_form)
