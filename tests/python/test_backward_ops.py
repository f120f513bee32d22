"""The backward ops of the core ATen opset (src/import/aten_backward.cpp): col2im,
convolution_backward, embedding_dense_backward, native_layer_norm_backward and
native_group_norm_backward.

torch.export's default decompositions rewrite these ops before Chroma sees them, so each
test exports with those five left out of the table (the `kept` fixture), checks that the
op really is in the graph, compiles it and compares with the op called in eager PyTorch.

Tolerances: float32 outputs that are sums over many products (weight and bias gradients,
normalization gradients) at rtol=atol=1e-4 (summation order differs from PyTorch's
kernels); scatters of a few terms (col2im, embedding) at 1e-5; float64 at 1e-10.

Run: CHROMA_CACHE_DIR=build/cache .venv/bin/python -m pytest tests/python/test_backward_ops.py -q -p no:logging
"""

import itertools

import pytest
import torch

from conftest import compare, randint, randn, to_numpy

import chroma
from chroma.frontend import graph_file
from chroma.compiler import compile_graph

A = torch.ops.aten
KEPT = [A.col2im.default, A.convolution_backward.default, A.embedding_dense_backward.default,
        A.native_layer_norm_backward.default, A.native_group_norm_backward.default]

_n = itertools.count()


@pytest.fixture
def kept(monkeypatch, tmp_path):
    """kept(fn, *inputs, target=..., rtol, atol): exports fn with the backward ops kept,
    asserts `target` is in the graph, compiles, compares with eager; returns the Program."""
    orig = torch.export.ExportedProgram.run_decompositions

    def run_decompositions(self, decomp_table=None, *args, **kwargs):
        table = dict(torch.export.default_decompositions() if decomp_table is None else decomp_table)
        for op in KEPT:
            table.pop(op, None)
        return orig(self, table, *args, **kwargs)

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", run_decompositions)

    def _kept(fn, *inputs, target, rtol=1e-5, atol=1e-5):
        i = next(_n)
        path = str(tmp_path / f"g{i}.cgraph")
        g = chroma.export(fn, inputs, path)
        targets = [n["target"] for n in g.json["nodes"]]
        assert f"aten.{target}.default" in targets, targets
        prog = compile_graph(path, str(tmp_path / f"out{i}"))
        want = fn(*inputs)
        compare(prog(*[to_numpy(x) for x in inputs]), want, rtol=rtol, atol=atol)
        return prog

    return _kept


def _present(rs):
    return tuple(r for r in rs if r is not None)


def _masked(rs, mask):
    return tuple(r for r, m in zip(rs, mask) if m)


# ---------------------------------------------------------------------------- col2im

# (C, output_size, kernel_size, dilation, padding, stride)
COL2IM = [
    (3, [5, 6], [2, 2], [1, 1], [0, 0], [1, 1]),
    (2, [7, 8], [3, 2], [1, 2], [1, 0], [2, 1]),
    (1, [9, 9], [3, 3], [2, 2], [2, 1], [3, 2]),
    (4, [4, 5], [1, 1], [1, 1], [0, 0], [1, 1]),
    (2, [6, 7], [4, 3], [1, 1], [2, 3], [2, 3]),  # overlapping blocks and padding wider than the stride
]


def _blocks(out, k, dil, pad, st):
    return [(o + 2 * p - d * (kk - 1) - 1) // s + 1 for o, kk, d, p, s in zip(out, k, dil, pad, st)]


@pytest.mark.parametrize("batched", [True, False])
def test_col2im(kept, batched):
    inputs, fns = [], []
    for j, (ch, out, k, dil, pad, st) in enumerate(COL2IM):
        bl = _blocks(out, k, dil, pad, st)
        shape = (ch * k[0] * k[1], bl[0] * bl[1])
        inputs.append(randn(*(((2,) if batched else ()) + shape), seed=j))
        fns.append((out, k, dil, pad, st))

    def fn(*xs):
        return tuple(A.col2im.default(x * 1.5, o, k, d, p, s) for x, (o, k, d, p, s) in zip(xs, fns))

    kept(fn, *inputs, target="col2im")


def test_col2im_is_the_inverse_layout_of_unfold(kept):
    # fold(unfold(x)) multiplies each pixel by the number of blocks covering it
    x = randn(2, 3, 8, 7, seed=5)
    kept(lambda x: A.col2im.default(torch.nn.functional.unfold(x, (3, 2), 2, 1, 2), [8, 7], [3, 2], [2, 2], [1, 1],
                                    [2, 2]), x, target="col2im")


# ---------------------------------------------------------------------------- convolution_backward

# (d, N, Cin, Cout, spatial, kernel, stride, padding, dilation, groups, transposed, output_padding)
CONV = [
    (1, 2, 3, 4, [9], [3], [1], [0], [1], 1, False, [0]),
    (1, 2, 4, 6, [11], [3], [2], [1], [2], 2, False, [0]),
    (2, 2, 3, 4, [7, 6], [3, 3], [1, 1], [1, 1], [1, 1], 1, False, [0, 0]),
    (2, 1, 4, 8, [9, 10], [3, 2], [2, 3], [1, 0], [1, 2], 2, False, [0, 0]),  # stride skips trailing rows
    (2, 2, 6, 6, [8, 8], [3, 3], [2, 2], [1, 1], [1, 1], 6, False, [0, 0]),   # depthwise
    (2, 2, 3, 5, [6, 5], [1, 1], [1, 1], [0, 0], [1, 1], 1, False, [0, 0]),   # pointwise
    (2, 1, 2, 3, [5, 5], [3, 3], [1, 1], [4, 3], [1, 1], 1, False, [0, 0]),   # padding wider than the kernel
    (3, 1, 2, 4, [5, 6, 4], [2, 3, 2], [1, 2, 1], [1, 1, 0], [2, 1, 1], 2, False, [0, 0, 0]),
    (1, 2, 4, 3, [6], [3], [2], [1], [1], 1, True, [1]),
    (2, 2, 4, 6, [4, 5], [3, 2], [2, 1], [1, 0], [1, 2], 2, True, [1, 1]),    # output_padding < dilation
    (2, 1, 3, 2, [5, 4], [2, 3], [3, 2], [0, 2], [1, 1], 1, True, [2, 0]),
    (3, 1, 4, 4, [3, 4, 3], [2, 2, 3], [2, 1, 2], [0, 1, 1], [1, 2, 1], 4, True, [1, 0, 1]),
]


def _conv_case(case, dtype=torch.float32, seed=0):
    d, n, cin, cout, sp, k, st, pad, dil, groups, tr, op = case
    x = randn(n, cin, *sp, seed=seed).to(dtype)
    if tr:
        w = randn(cin, cout // groups, *k, seed=seed + 1).to(dtype)
        y = torch.ops.aten.convolution(x, w, None, st, pad, dil, True, op, groups)
    else:
        w = randn(cout, cin // groups, *k, seed=seed + 1).to(dtype)
        y = torch.ops.aten.convolution(x, w, None, st, pad, dil, False, op, groups)
    gy = randn(*y.shape, seed=seed + 2).to(dtype)
    return gy, x, w, (st, pad, dil, tr, op, groups)


@pytest.mark.parametrize("j", range(len(CONV)))
def test_convolution_backward(kept, j):
    gy, x, w, (st, pad, dil, tr, op, groups) = _conv_case(CONV[j], seed=3 * j)

    def fn(gy, x, w):
        return A.convolution_backward.default(gy, x, w, [w.shape[1 if tr else 0] * (groups if tr else 1)], st, pad,
                                              dil, tr, op, groups, [True, True, True])

    kept(fn, gy, x, w, target="convolution_backward", rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mask", [[True, False, False], [False, True, False], [False, False, True], [False, True, True]])
def test_convolution_backward_output_mask(kept, mask):
    gy, x, w, (st, pad, dil, tr, op, groups) = _conv_case(CONV[3], seed=7)
    gy2, x2, w2, a2 = _conv_case(CONV[9], seed=8)

    def fn(gy, x, w, gy2, x2, w2):
        # (eager's oneDNN path may compute grad_weight although the mask leaves it out)
        return (_masked(A.convolution_backward.default(gy, x, w, [w.shape[0]], st, pad, dil, tr, op, groups, mask), mask)
                + _masked(A.convolution_backward.default(gy2, x2, w2, [w2.shape[1] * a2[-1]], *a2, mask), mask))

    kept(fn, gy, x, w, gy2, x2, w2, target="convolution_backward", rtol=1e-4, atol=1e-4)


def test_convolution_backward_float64(kept):
    cases = [_conv_case(CONV[j], torch.float64, seed=j) for j in (1, 3, 7, 10)]

    def fn(*ts):
        out = ()
        for (_, _, _, a), i in zip(cases, range(0, len(ts), 3)):
            cout = ts[i].shape[1]
            out += A.convolution_backward.default(ts[i], ts[i + 1], ts[i + 2], [cout], *a, [True, True, True])
        return out

    kept(fn, *[t for c in cases for t in c[:3]], target="convolution_backward", rtol=1e-10, atol=1e-10)


def test_convolution_backward_matches_autograd(kept):
    # the same numbers as a real backward pass of conv2d
    gy, x, w, (st, pad, dil, tr, op, groups) = _conv_case(CONV[3], seed=11)
    b = randn(w.shape[0], seed=12)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    torch.nn.functional.conv2d(xg, wg, bg, st, pad, dil, groups).backward(gy)
    prog = kept(lambda gy, x, w: A.convolution_backward.default(gy, x, w, [w.shape[0]], st, pad, dil, False, op, groups,
                                                                [True, True, True]), gy, x, w,
                target="convolution_backward", rtol=1e-4, atol=1e-4)
    compare(prog(gy.numpy(), x.numpy(), w.numpy()), (xg.grad, wg.grad, bg.grad), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------- embedding_dense_backward

def test_embedding_dense_backward(kept):
    g = randn(3, 5, 4, seed=1)
    idx = torch.tensor([[1, 2, 1, 0, 6], [0, 5, 1, 1, 2], [6, 6, 3, 1, 0]])
    kept(lambda g, i: (A.embedding_dense_backward.default(g, i, 7, -1, False),
                       A.embedding_dense_backward.default(g, i, 7, 1, False),
                       A.embedding_dense_backward.default(g, i, 9, 6, True),
                       A.embedding_dense_backward.default(g, i, 7, -1, True),
                       A.embedding_dense_backward.default(g[0], i[0], 8, 0, True),
                       A.embedding_dense_backward.default(g, i.to(torch.int32), 7, 2, False)),
         g, idx, target="embedding_dense_backward")


def test_embedding_dense_backward_matches_autograd(kept):
    g, idx = randn(6, 3, seed=2), randint(0, 5, 6, seed=3)
    w = randn(5, 3, seed=4).requires_grad_()
    torch.nn.functional.embedding(idx, w, padding_idx=2, scale_grad_by_freq=True).backward(g)
    prog = kept(lambda g, i: A.embedding_dense_backward.default(g, i, 5, 2, True), g, idx,
                target="embedding_dense_backward")
    compare(prog(g.numpy(), idx.numpy()), w.grad, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------- layer norm

@pytest.mark.parametrize("shape,ns", [((4, 7), [7]), ((2, 3, 5, 6), [5, 6]), ((3, 9), [3, 9]), ((2, 4, 33), [33])])
def test_native_layer_norm_backward(kept, shape, ns):
    x = randn(*shape, seed=1) * 2 + 0.5
    gy = randn(*shape, seed=2)
    w, bias = randn(*ns, seed=3), randn(*ns, seed=4)

    def fn(gy, x, w, bias):
        _, mean, rstd = A.native_layer_norm.default(x, ns, w, bias, 1e-5)
        _, mean0, rstd0 = A.native_layer_norm.default(x, ns, None, None, 1e-3)
        return (A.native_layer_norm_backward.default(gy, x, ns, mean, rstd, w, bias, [True, True, True])
                + _present(A.native_layer_norm_backward.default(gy, x, ns, mean, rstd, w, bias, [False, True, False]))
                + _present(A.native_layer_norm_backward.default(gy, x, ns, mean0, rstd0, None, None,
                                                                [True, False, False])))

    kept(fn, gy, x, w, bias, target="native_layer_norm_backward", rtol=1e-4, atol=1e-4)


def test_native_layer_norm_backward_float64_matches_autograd(kept):
    x, gy = randn(3, 4, 6, seed=5).double(), randn(3, 4, 6, seed=6).double()
    w, bias = randn(6, seed=7).double(), randn(6, seed=8).double()
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, bias))
    torch.nn.functional.layer_norm(xg, [6], wg, bg, 1e-5).backward(gy)

    def fn(gy, x, w, bias):
        _, mean, rstd = A.native_layer_norm.default(x, [6], w, bias, 1e-5)
        return A.native_layer_norm_backward.default(gy, x, [6], mean, rstd, w, bias, [True, True, True])

    prog = kept(fn, gy, x, w, bias, target="native_layer_norm_backward", rtol=1e-10, atol=1e-10)
    compare(prog(gy.numpy(), x.numpy(), w.numpy(), bias.numpy()), (xg.grad, wg.grad, bg.grad), rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------- group norm

@pytest.mark.parametrize("shape,groups", [((2, 6, 5), 3), ((2, 4, 3, 5), 2), ((3, 6), 6), ((1, 8, 2, 3, 4), 1),
                                          ((2, 6, 4, 4), 6)])
def test_native_group_norm_backward(kept, shape, groups):
    x = randn(*shape, seed=1) * 3 - 1
    gy = randn(*shape, seed=2)
    n, c = shape[0], shape[1]
    hw = x.numel() // (n * c)
    w, bias = randn(c, seed=3), randn(c, seed=4)

    def fn(gy, x, w, bias):
        _, mean, rstd = A.native_group_norm.default(x, w, bias, n, c, hw, groups, 1e-5)
        _, mean0, rstd0 = A.native_group_norm.default(x, None, None, n, c, hw, groups, 1e-2)
        return (A.native_group_norm_backward.default(gy, x, mean, rstd, w, n, c, hw, groups, [True, True, True])
                + A.native_group_norm_backward.default(gy, x, mean0, rstd0, None, n, c, hw, groups, [True, True, True])
                + _present(A.native_group_norm_backward.default(gy, x, mean, rstd, w, n, c, hw, groups,
                                                                [False, False, True])))

    kept(fn, gy, x, w, bias, target="native_group_norm_backward", rtol=1e-4, atol=1e-4)


def test_native_group_norm_backward_matches_autograd(kept):
    x, gy = randn(2, 6, 3, 4, seed=5), randn(2, 6, 3, 4, seed=6)
    w, bias = randn(6, seed=7), randn(6, seed=8)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, bias))
    torch.nn.functional.group_norm(xg, 3, wg, bg, 1e-5).backward(gy)

    def fn(gy, x, w, bias):
        _, mean, rstd = A.native_group_norm.default(x, w, bias, 2, 6, 12, 3, 1e-5)
        return A.native_group_norm_backward.default(gy, x, mean, rstd, w, 2, 6, 12, 3, [True, True, True])

    prog = kept(fn, gy, x, w, bias, target="native_group_norm_backward", rtol=1e-4, atol=1e-4)
    compare(prog(gy.numpy(), x.numpy(), w.numpy(), bias.numpy()), (xg.grad, wg.grad, bg.grad), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------- refusals

def _rewritten(tmp_path, fn, inputs, target, edit):
    """Exports fn, edits the args of its one `target` node, compiles: for argument
    combinations eager PyTorch (and so export) would not produce."""
    path = str(tmp_path / "bad.cgraph")
    chroma.export(fn, inputs, path)
    meta, blob = graph_file.read(path)
    nodes = [n for n in meta["nodes"] if n["target"] == target]
    assert len(nodes) == 1, [n["target"] for n in meta["nodes"]]
    edit(nodes[0]["args"])
    graph_file.write(path, meta, bytes(blob))
    return compile_graph(path, str(tmp_path / "bad"))


def test_refusals_name_the_op_and_the_problem(kept, tmp_path):
    x = randn(2, 12, 20)

    def col(a):
        a[1] = [6, 6]

    with pytest.raises(chroma.CompileError, match=r"col2im: output_size \[6, 6\].*give 5 x 5 blocks.*has 20"):
        _rewritten(tmp_path, lambda x: A.col2im.default(x, [5, 6], [2, 2], [1, 1], [0, 0], [1, 1]), (x,),
                   "aten.col2im.default", col)

    gy, xx, w = randn(3, 4), randn(3, 4, seed=1), randn(4, seed=2)

    def ln(a):
        a[5] = None
        a[7] = [True, True, False]

    def ln_fn(gy, x, w):
        _, m, r = A.native_layer_norm.default(x, [4], w, None, 1e-5)
        return A.native_layer_norm_backward.default(gy, x, [4], m, r, w, None, [True, False, False])[0]

    with pytest.raises(chroma.CompileError, match="native_layer_norm_backward: output_mask asks for grad_weight but there is no weight"):
        _rewritten(tmp_path, ln_fn, (gy, xx, w), "aten.native_layer_norm_backward.default", ln)

    gyc, xc, wc, _ = _conv_case(CONV[2])

    def cv(a):
        a[4] = [2, 2]  # grad_output no longer has the forward output's shape

    with pytest.raises(chroma.CompileError, match=r"convolution_backward: grad_output is .*forward convolution's output"):
        _rewritten(tmp_path, lambda gy, x, w: A.convolution_backward.default(
            gy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, False, False])[0], (gyc, xc, wc),
            "aten.convolution_backward.default", cv)
