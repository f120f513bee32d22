"""Vision-layer ops compiled with Chroma against torch eager: pooling (max with indices,
average, adaptive), padding modes, upsampling, pixel shuffle and normalization layers
(src/import/aten_pool.cpp).

Shapes are odd and non-square; batch and channels are > 1. To keep compile time down,
several configurations of one op are compiled into one function (a tuple of outputs).

Tolerances: rtol=atol=1e-5 (conftest.compare); integer outputs (max-pool indices) must
match exactly.

Run: cd /work/main && .venv/bin/python -m pytest tests/python/test_vision_ops.py -q
"""

import re

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import randint, randn

import chroma

A = torch.ops.aten


def many(*fns):
    """One function of all the inputs applying each of `fns` to them: a tuple of all outputs."""
    def f(*xs):
        out = []
        for fn in fns:
            r = fn(*xs)
            out.extend(r if isinstance(r, tuple) else (r,))
        return tuple(out)
    return f


# ---------------------------------------------------------------------------- max pooling

# (kernel, stride, padding, dilation, ceil_mode)
MAX2D = [
    (3, None, 0, 1, False),
    (3, 2, 1, 1, True),  # ceil_mode: the last window hangs over the edge
    ((2, 3), (1, 2), (1, 0), 1, True),
    ((3, 2), (2, 3), (1, 1), (2, 1), True),  # dilation
    (4, 3, 2, 1, True),  # a ceil window starting in the right padding is dropped; 16-element
                         # windows are gathered and reduced instead of a tree
]


def _ties():
    # ties: the first window element wins; a NaN wins over everything (the last NaN when there
    # are several); windows of -inf next to padding must point into the input, not the padding.
    nan, inf = float("nan"), float("inf")
    return torch.tensor([[[[1., 1., 2., 2., 0.],
                           [1., nan, 2., nan, 0.],
                           [-inf, -inf, 3., 3., 3.],
                           [-inf, -inf, 5., -1., -1.]]]]).repeat(2, 2, 1, 1)


def test_max_pool(check):
    # inputs: x [2, 3, 11, 9], v [2, 3, 5, 6, 7], t (ties/NaN/inf) [2, 2, 4, 5]
    fns = [lambda x, v, t, c=c: F.max_pool2d(x, c[0], c[1], c[2], c[3], c[4], return_indices=True) for c in MAX2D]
    fns += [
        lambda x, v, t: F.max_pool2d(x[0], 3, 2, 1, return_indices=True),  # unbatched
        lambda x, v, t: F.max_pool1d(x[:, :, 1], 2, 3, 1, dilation=2, ceil_mode=True, return_indices=True),
        lambda x, v, t: F.max_pool3d(v, 2, 2, 1, dilation=(1, 2, 1), return_indices=True),
        lambda x, v, t: F.max_pool3d(v, (3, 2, 3), (2, 1, 2), (1, 0, 1), ceil_mode=True, return_indices=True),
        lambda x, v, t: F.max_pool2d(t, 2, 1, 1, return_indices=True),
        lambda x, v, t: F.max_pool2d(t, 3, 2, 1, ceil_mode=True, return_indices=True),
    ]
    check(many(*fns), randn(2, 3, 11, 9), randn(2, 3, 5, 6, 7, seed=3), _ties())


# ---------------------------------------------------------------------------- average pooling

# (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
AVG2D = [
    (3, None, 0, False, True, None),
    (3, 2, 1, False, True, None),
    (3, 2, 1, False, False, None),
    (3, 2, 1, True, True, None),
    (3, 2, 1, True, False, None),
    ((2, 3), (3, 2), (1, 1), True, True, None),
    (4, 3, 2, True, True, None),
    (3, 2, 1, True, True, 5),
    (2, 2, 0, True, False, None),
    (5, 2, 2, True, False, None),  # 25-element windows: gathered and reduced instead of a tree
]


def test_avg_pool_and_integer_pooling(check):
    # inputs: x [2, 3, 11, 9], v [2, 3, 5, 6, 7], int64 n [2, 3, 7, 6], uint8 u [2, 3, 5, 6]
    fns = [lambda x, v, n, u, c=c: F.avg_pool2d(x, c[0], c[1], c[2], c[3], c[4], c[5]) for c in AVG2D]
    fns += [
        lambda x, v, n, u: F.avg_pool1d(x[:, :, 0], 3, 2, 1, ceil_mode=True),
        lambda x, v, n, u: F.avg_pool1d(x[:, :, 1], 2, 3, 1, count_include_pad=False),
        lambda x, v, n, u: F.avg_pool3d(v, 2),
        lambda x, v, n, u: F.avg_pool3d(v, 3, 2, 1, ceil_mode=True),
        lambda x, v, n, u: F.avg_pool3d(v, (3, 2, 3), (2, 2, 1), (1, 1, 0), ceil_mode=True, count_include_pad=False),
        lambda x, v, n, u: F.avg_pool3d(v, 2, 1, 1, divisor_override=3),
        lambda x, v, n, u: F.local_response_norm(x, 3),  # exports as constant_pad_nd + avg_pool3d
        # integers: max pooling; average pooling (PyTorch sums in the input type and divides
        # with truncation); nearest upsampling of uint8
        lambda x, v, n, u: F.max_pool2d(n, 3, 2, 1, return_indices=True),
        lambda x, v, n, u: F.max_pool2d(n, 2, ceil_mode=True, return_indices=True),
        lambda x, v, n, u: F.avg_pool2d(n, 3, 2, 1, ceil_mode=True),
        lambda x, v, n, u: F.avg_pool2d(n, 2, count_include_pad=False),
        lambda x, v, n, u: F.interpolate(u, size=(7, 4)),
    ]
    check(many(*fns), randn(2, 3, 11, 9, seed=4), randn(2, 3, 5, 6, 7, seed=5), randint(-20, 20, 2, 3, 7, 6),
          randint(0, 200, 2, 3, 5, 6).to(torch.uint8))


# ---------------------------------------------------------------------------- adaptive pooling

def test_adaptive_pool(check):
    # inputs: x [2, 3, 11, 9] (with a NaN and ties), v [2, 3, 5, 6, 7]
    x = randn(2, 3, 11, 9, seed=7)
    x[0, 1, 3, 4] = float("nan")
    x[1, 2, :3, :3] = 7.0
    check(many(lambda x, v: F.adaptive_avg_pool2d(x, (4, 3)),   # one axis divisible, one not
               lambda x, v: F.adaptive_avg_pool2d(x, (5, 7)),
               lambda x, v: F.adaptive_avg_pool2d(x, (13, 4)),  # output larger than input
               lambda x, v: F.adaptive_avg_pool2d(x, 1),
               lambda x, v: F.adaptive_avg_pool1d(x[:, :, 0], 4),
               lambda x, v: F.adaptive_avg_pool1d(x[:, :, 1], 9),
               lambda x, v: F.interpolate(x, size=(4, 5), mode="area"),
               lambda x, v: F.adaptive_avg_pool3d(v, (2, 4, 3)),
               lambda x, v: F.adaptive_avg_pool3d(v, (5, 3, 7)),
               lambda x, v: F.adaptive_max_pool2d(x, (4, 3), return_indices=True),
               lambda x, v: F.adaptive_max_pool2d(x, (5, 7), return_indices=True),
               lambda x, v: F.adaptive_max_pool2d(x, 1, return_indices=True),
               lambda x, v: F.adaptive_max_pool1d(x[:, :, 0], 4, return_indices=True),
               lambda x, v: F.adaptive_max_pool3d(v, (2, 4, 3), return_indices=True)),
          x, randn(2, 3, 5, 6, 7, seed=8))


# ---------------------------------------------------------------------------- upsampling

def test_upsample(check):
    # inputs: x [2, 3, 11, 9], v [2, 3, 4, 5, 6]. The aten overloads called directly are the
    # ones that survive export; F.interpolate's 1-d/3-d nearest, nearest-exact, linear,
    # trilinear and bicubic export as index ops (several index tensors: aten_index.cpp).
    check(many(lambda x, v: F.interpolate(x, size=(5, 7), mode="nearest"),
               lambda x, v: F.interpolate(x, size=(17, 20), mode="nearest"),
               lambda x, v: F.interpolate(x, scale_factor=2, mode="nearest"),
               lambda x, v: F.interpolate(x, scale_factor=(1.7, 0.6), mode="nearest"),
               lambda x, v: F.interpolate(x, scale_factor=1.05, mode="nearest"),  # 2-d kernel: scale 1 copies
               lambda x, v: F.interpolate(x, scale_factor=(2.5, 1.3), mode="nearest", recompute_scale_factor=True),
               lambda x, v: A.upsample_nearest1d.default(v[:, :, 0, 0], [11]),
               lambda x, v: A.upsample_nearest1d.default(v[:, :, 0, 1], [6], 1.05),  # 1-d: no copy shortcut
               lambda x, v: A.upsample_nearest2d.default(v[:, :, 0], [9, 3]),
               lambda x, v: A.upsample_nearest3d.default(v, [7, 9, 4]),
               lambda x, v: A._upsample_nearest_exact2d.default(v[:, :, 1], [11, 13]),
               lambda x, v: A._upsample_nearest_exact2d.default(v[:, :, 2], [2, 11], 0.5, 1.9),
               lambda x, v: A._upsample_nearest_exact1d.default(v[:, :, 0, 2], [13]),
               lambda x, v: A._upsample_nearest_exact3d.default(v, [3, 9, 8]),
               lambda x, v: F.interpolate(x, size=(5, 7), mode="bilinear"),
               lambda x, v: F.interpolate(x, size=(17, 20), mode="bilinear"),
               lambda x, v: F.interpolate(x, size=(17, 20), mode="bilinear", align_corners=True),
               lambda x, v: F.interpolate(x, size=(1, 4), mode="bilinear", align_corners=True),
               lambda x, v: F.interpolate(x, scale_factor=1.5, mode="bilinear"),
               lambda x, v: F.interpolate(x, scale_factor=(1.7, 0.6), mode="bilinear"),
               lambda x, v: F.interpolate(x, scale_factor=(2.5, 1.3), mode="bilinear", align_corners=True),
               lambda x, v: F.interpolate(x, scale_factor=2, mode="bilinear", recompute_scale_factor=True),
               lambda x, v: F.interpolate(x, size=(11, 4), mode="bilinear"),
               lambda x, v: F.interpolate(v[:, :, 0, 0], size=9, mode="linear"),
               lambda x, v: F.interpolate(v[:, :, 0, 1], scale_factor=1.7, mode="linear", align_corners=True),
               lambda x, v: F.interpolate(v, scale_factor=2, mode="nearest"),
               lambda x, v: F.interpolate(x, size=(5, 13), mode="nearest-exact"),
               lambda x, v: F.interpolate(v, size=(3, 7, 8), mode="trilinear", align_corners=True),
               lambda x, v: F.interpolate(x, scale_factor=1.5, mode="bicubic")),
          randn(2, 3, 11, 9, seed=13), randn(2, 3, 4, 5, 6, seed=14))


def test_multi_index_tensor(check, compile_to):
    # adjacent index tensors keep their place, separated ones go first; negative indices wrap
    x = randn(3, 4, 5, 6, seed=25)
    i, j, k = torch.tensor([[0, 2], [1, -1]]), torch.tensor([1, -3]), torch.tensor([0, 3, 4])
    f = lambda x, i, j, k: (x[i, :, j], x[:, i, j], x[:, :, k[:, None], k[None, :2]], x[..., i, j], x[i, j, :, k[:1]])
    prog = check(f, x, i, j, k)
    # an index out of its dimension's range still raises (the merged linear index is out of range)
    with pytest.raises(IndexError, match="out of range"):
        prog(x.numpy(), i.numpy(), np.array([1, 6]), k.numpy())


def test_padding_pixel_shuffle_and_pooling_backward(check):
    # reflect/replicate padding export as index ops, circular as empty + slice_scatter copies;
    # the backward ops of the pooling layers (called directly: export keeps them) as plain
    # functions of their inputs. inputs: x [2, 3, 11, 9], v [2, 3, 5, 6, 7], p [2, 12, 5, 7], w [2, 3, 4, 5, 6]
    def avg_bwd(x, k, s, p, ceil, inc, div):
        y = F.avg_pool2d(x, k, s, p, ceil, inc, div)
        return A.avg_pool2d_backward.default(y * 1.5 + 0.25, x, list(k), list(s), list(p), ceil, inc, div)

    def max_bwd(x, k, s, p, dil, ceil):
        y, i = F.max_pool2d(x, k, s, p, dil, ceil, return_indices=True)
        return A.max_pool2d_with_indices_backward.default(y.sin(), x, [k, k], [s, s], [p, p], [dil, dil], ceil, i)

    check(many(lambda x, v, p, w: F.pad(x, (2, 3, 1, 2), mode="circular"),
               lambda x, v, p, w: F.pad(v, (1, 2, 2, 1, 0, 1), mode="circular"),
               lambda x, v, p, w: F.pad(p, (2, 3, 1, 2), mode="reflect"),
               lambda x, v, p, w: F.pad(p, (2, 3, 1, 2), mode="replicate"),
               lambda x, v, p, w: F.pad(p[:, :, 0], (3, 1), mode="reflect"),
               lambda x, v, p, w: F.pad(p[:, :, 0], (3, 1), mode="replicate"),
               lambda x, v, p, w: F.pad(w, (1, 2, 2, 1, 1, 1), mode="reflect"),
               lambda x, v, p, w: F.pad(w, (1, 2, 2, 1, 1, 1), mode="replicate"),
               lambda x, v, p, w: F.pixel_shuffle(p, 2),
               lambda x, v, p, w: F.pixel_unshuffle(F.pixel_shuffle(p, 2), 2),
               lambda x, v, p, w: F.pixel_unshuffle(p[:, :, :4, :6], 2),
               lambda x, v, p, w: avg_bwd(x, (3, 3), (2, 2), (1, 1), True, False, None),
               lambda x, v, p, w: avg_bwd(x, (2, 3), (3, 1), (1, 0), False, True, None),
               lambda x, v, p, w: avg_bwd(x, (2, 2), (2, 2), (0, 0), True, True, 3),
               lambda x, v, p, w: A.avg_pool3d_backward.default(F.avg_pool3d(v, 3, 2, 1, True).cos(), v, [3, 3, 3],
                                                                [2, 2, 2], [1, 1, 1], True, True, None),
               lambda x, v, p, w: max_bwd(x, 3, 2, 1, 1, True),
               lambda x, v, p, w: max_bwd(x, 3, 1, 1, 2, False),
               lambda x, v, p, w: A._adaptive_avg_pool2d_backward.default(F.adaptive_avg_pool2d(x, (5, 7)).exp(), x),
               lambda x, v, p, w: A._adaptive_avg_pool2d_backward.default(F.adaptive_avg_pool2d(x, (13, 3)).exp(), x),
               # the norm backward ops are decomposed by export; they must still compile
               lambda x, v, p, w: A.native_group_norm_backward.default(
                   x.cos(), x, *A.native_group_norm.default(x, None, None, 2, 3, 99, 3, 1e-5)[1:], None,
                   2, 3, 99, 3, [True, False, False])[0],
               lambda x, v, p, w: A.native_layer_norm_backward.default(
                   x.cos(), x, [11, 9], *A.native_layer_norm.default(x, [11, 9], None, None, 1e-5)[1:], None, None,
                   [True, False, False])[0]),
          randn(2, 3, 11, 9, seed=26), randn(2, 3, 5, 6, 7, seed=27), randn(2, 12, 5, 7, seed=11),
          randn(2, 3, 4, 5, 6, seed=12))


# ---------------------------------------------------------------------------- normalization

def _bn(num, cls=nn.BatchNorm2d, seed=0, **kw):
    torch.manual_seed(seed)
    m = cls(num, **kw)
    if getattr(m, "running_mean", None) is not None:
        m.running_mean.uniform_(-1, 1)
        m.running_var.uniform_(0.5, 2)
    if m.weight is not None:
        m.weight.data.uniform_(0.5, 1.5)
        m.bias.data.uniform_(-1, 1)
    return m


class Norms(nn.Module):
    """Every normalization layer on one [2, 6, 5, 3] input (and a [3, 6, 4, 5] one)."""

    def __init__(self):
        super().__init__()
        self.bn_eval = _bn(6, seed=1).eval()
        self.bn_noaffine = _bn(6, seed=2, affine=False).eval()
        self.bn_nostats = _bn(6, seed=3, track_running_stats=False)
        # train mode: _native_batch_norm_legit_functional (the exporter drops the running-stat
        # updates; the output is normalized with the batch statistics)
        self.bn_train = _bn(6, seed=19).train()
        self.bn1d = _bn(6, nn.BatchNorm1d, seed=4).eval()
        self.bn3d = _bn(6, nn.BatchNorm3d, seed=5, eps=1e-3).eval()
        self.gn = nn.GroupNorm(3, 6)
        self.gn1 = nn.GroupNorm(1, 6, affine=False)
        self.gn6 = nn.GroupNorm(6, 6, eps=1e-3)
        self.inorm = nn.InstanceNorm2d(6)
        self.inorm_affine = _bn(6, nn.InstanceNorm2d, seed=7, affine=True, track_running_stats=True).eval()
        self.inorm_affine_train = nn.InstanceNorm2d(6, affine=True)
        self.ln = nn.LayerNorm([5, 3])
        with torch.no_grad():
            for m in (self.gn, self.gn6, self.inorm_affine_train, self.ln):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-1, 1)
        self.register_buffer("w", randn(6, seed=20))
        self.register_buffer("b", randn(6, seed=21))

    def forward(self, x, y):
        w, b = self.w, self.b
        return many(lambda x, y: (  # flattened: the native ops return tuplesself.bn_eval(x), self.bn_noaffine(x), self.bn_nostats(x), self.bn_train(y), self.bn1d(x[:, :, :, 0]),
                self.bn1d(x[:, :, 0, 0]), self.bn3d(x.unsqueeze(2)), self.gn(x), self.gn1(x), self.gn6(x),
                self.gn(x[:, :, 0]), self.inorm(x), self.inorm_affine(x), self.inorm_affine_train(x), self.ln(x),
                F.batch_norm(x, None, None, training=True, eps=1e-3),
                # the mean / rstd outputs of the native ops
                *A.native_group_norm.default(x, w, b, 2, 6, 15, 3, 1e-5),
                *A._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5),
                A._native_batch_norm_legit_no_training.default(x, w, b, b * 0.1, w.abs() + 0.5, 0.1, 1e-5)[0],
                *A.native_layer_norm.default(x, [5, 3], None, None, 1e-5)))(x, y)


def test_normalization_layers(check):
    check(Norms(), randn(2, 6, 5, 3, seed=18) * 2 + 0.5, randn(3, 6, 4, 5, seed=19))


# ---------------------------------------------------------------------------- errors

def _compile_error(tmp_path, fn, x):
    with pytest.raises(chroma.CompileError) as ei:
        chroma.compile(fn, (x,), out=str(tmp_path / "bad"))
    return str(ei.value)


def test_error_max_pool_bool(tmp_path):
    msg = _compile_error(tmp_path, lambda x: F.max_pool2d(x, 2), randn(2, 3, 5, 5) > 0)
    assert "aten.max_pool2d_with_indices.default" in msg and "does not support bool input" in msg, msg


def test_error_adaptive_avg_pool_int(tmp_path):
    msg = _compile_error(tmp_path, lambda x: F.adaptive_avg_pool2d(x, 3), randint(0, 9, 2, 3, 5, 5))
    assert "aten._adaptive_avg_pool2d.default" in msg, msg
    assert re.search(r"adaptive_avg_pool2d needs floating-point input, got i64\[2,3,5,5\]", msg), msg


def test_error_bilinear_int(tmp_path):
    msg = _compile_error(tmp_path, lambda x: A.upsample_bilinear2d.vec(x, [7, 7], False, None), randint(0, 9, 2, 3, 5, 5))
    assert "aten.upsample_bilinear2d.vec" in msg and "needs floating-point input" in msg, msg


# ---- core ATen padding / pooling ops that torch.export decomposes before they reach a graph
# file: a graph written by another producer may still carry them. The test exports a
# stand-in op, rewrites the node to the core op and compiles the graph file directly.

def _compile_rewritten(tmp_path, fn, x, target, args_of):
    import chroma
    from chroma.frontend import graph_file
    from chroma.compiler import compile_graph

    path = str(tmp_path / "g.cgraph")
    chroma.export(fn, (x,), path)
    meta, blob = graph_file.read(path)
    nodes = [n for n in meta["nodes"] if n["target"] == "aten.constant_pad_nd.default"]
    assert len(nodes) == 1, [n["target"] for n in meta["nodes"]]
    nodes[0]["target"] = target
    nodes[0]["args"] = args_of(nodes[0]["args"][0])
    nodes[0]["kwargs"] = {}
    graph_file.write(path, meta, bytes(blob))
    return compile_graph(path, str(tmp_path / "out"))


@pytest.mark.parametrize("mode,pad,shape", [
    ("reflection", [2, 1], (2, 3, 6)),
    ("replication", [0, 3], (2, 3, 6)),
    ("reflection", [1, 2, 2, 0], (1, 2, 4, 5)),
    ("replication", [2, 1, 0, 3], (1, 2, 4, 5)),
    ("reflection", [1, 1, 2, 0, 1, 2], (1, 1, 3, 4, 5)),
    ("replication", [1, 0, 0, 2, 2, 1], (1, 1, 3, 4, 5)),
])
def test_core_mode_padding_ops(tmp_path, mode, pad, shape):
    d = len(pad) // 2
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    target = f"aten.{mode}_pad{d}d.default"
    prog = _compile_rewritten(tmp_path, lambda t: F.pad(t, pad), x, target, lambda ref: [ref, pad])
    want = F.pad(x, pad, mode="reflect" if mode == "reflection" else "replicate")
    np.testing.assert_array_equal(prog(x.numpy()), want.numpy())


def test_core_adaptive_avg_pool1d(tmp_path):
    x = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(4))
    # F.pad(x, [-3, 0]) records the output type [2, 3, 4]: the pool's, with output_size 4.
    prog = _compile_rewritten(tmp_path, lambda t: F.pad(t, [-3, 0]), x, "aten.adaptive_avg_pool1d.default",
                              lambda ref: [ref, [4]])
    np.testing.assert_allclose(prog(x.numpy()), F.adaptive_avg_pool1d(x, 4).numpy(), rtol=1e-5, atol=1e-6)
