"""Channels-last activations in convolutional networks (src/lower/channels_last.cpp, conv_dnnl.h).

With oneDNN, Chroma keeps the activations between float32 convolutions channels-last and
splits a large convolution over threads by images or by output rows, each slice with the
padding it really has. These cases mix everything that reads or writes such a buffer:
elementwise epilogues, max pooling (a tree of maximums over strided views), channel concat,
channel slices, a channel shuffle (a reshape the layout cannot express as a view), a mean
over the spatial dims, flatten into a linear layer, a convolution that is a graph output,
and 1-d and 3-d convolutions, at 1 and 2 threads, with shapes large enough to be split.

Tolerance: rtol = atol = 1e-4 against eager (float32 sums of up to 1152 products in another
order than eager's oneDNN; N(0, 1) inputs, weights scaled by 1/sqrt(fan-in)).

Run: cd /work/main && .venv/bin/python -m pytest tests/python/test_channels_last.py -q
"""

import json
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import CPU, randn

TOL = dict(rtol=1e-4, atol=1e-4)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.stem = nn.Conv2d(3, 32, 3, stride=2, padding=1)
        self.a = nn.Conv2d(32, 32, 3, padding=1)
        self.b = nn.Conv2d(32, 32, 1)
        self.dw = nn.Conv2d(64, 64, 3, stride=2, padding=1, groups=64)
        self.c = nn.Conv2d(32, 64, 1)
        self.d = nn.Conv2d(64, 64, 5, padding=2, dilation=1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        s = F.relu(self.stem(x))
        s = F.max_pool2d(s, 3, stride=2, padding=1, ceil_mode=True)
        y = torch.cat([F.relu6(self.a(s)), self.b(s)], dim=1)  # 64 channels
        y = self.dw(y)
        n, c, h, w = y.shape
        y = y.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)  # channel shuffle
        left, right = y.chunk(2, dim=1)
        z = self.c(F.silu(left) + right)
        z = F.relu(self.d(z) + z)
        feat = z.mean(dim=(2, 3))
        return self.fc(feat), y


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 3])
def test_network(check, threads, batch):
    check(Net().eval(), randn(batch, 3, 96, 80, seed=batch), threads=threads, **TOL)


@pytest.mark.parametrize("threads", [1, 2])
def test_conv1d_and_conv3d(check, threads):
    torch.manual_seed(4)
    c1 = nn.Conv1d(16, 32, 5, padding=2, stride=2)
    c1b = nn.Conv1d(32, 32, 3, padding=1)
    c3 = nn.Conv3d(4, 16, 3, padding=1)
    c3b = nn.Conv3d(16, 16, 3, padding=(0, 1, 1), stride=(1, 2, 2))

    def f(a, b):
        return c1b(F.gelu(c1(a))), c3b(F.relu(c3(b)))

    with torch.no_grad():
        check(f, randn(2, 16, 4000, seed=1), randn(1, 4, 12, 40, 40, seed=2), threads=threads, **TOL)


def test_padding_only_rows_are_split_correctly(check):
    # Large padding and stride: a slice of output rows starting or ending in the padding.
    torch.manual_seed(5)
    conv = nn.Conv2d(8, 64, 7, stride=3, padding=5)
    conv2 = nn.Conv2d(64, 64, 3, padding=4, dilation=4)
    f = nn.Sequential(conv, nn.Tanh(), conv2).eval()
    check(f, randn(1, 8, 120, 101, seed=6), threads=2, **TOL)


def test_activations_stay_channels_last(tmp_path, compile_to):
    # A conv -> relu -> conv -> add -> conv chain: one relayout (the graph input) and no copy
    # back to row-major until the graph output.
    torch.manual_seed(6)
    a, b, c = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(16, 8, 1)

    def f(x):
        y = F.relu(a(x))
        return c(F.relu(b(y) + y))

    x = randn(1, 3, 32, 32)
    prog = compile_to(f, x, name="chain")
    with open(os.path.join(prog.directory, "manifest.json")) as fh:
        labels = [k["label"] for k in json.load(fh)["entries"][0]["kernels"]]
    relayouts = [lab for lab in labels if lab.startswith("Relayout")]
    assert relayouts == ["Relayout.channels_last <- Input"], labels
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(prog(x.numpy())), f(x), **TOL)


class Epilogues(nn.Module):
    """Convolutions followed by the elementwise chains oneDNN applies as bias and post-ops,
    and by chains it does not (which stay Chroma's kernels)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.c = nn.ModuleList([nn.Conv2d(16, 16, 3, padding=1) for _ in range(7)])
        self.bn = nn.BatchNorm2d(16)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        c = self.c
        y = self.bn(F.relu(c[0](x)))                # bias, relu, then an unfolded batch norm
        y = F.hardtanh(c[1](y), -0.25, 0.75)        # clamp to odd bounds
        y = (c[2](y) - 0.5) * 2.0                   # literal affine
        y = 1.0 - torch.clamp(c[3](y), min=0.1)     # maximum with a literal, then c - y
        y = torch.minimum(c[4](y), torch.tensor(0.3))
        y = F.silu(c[5](y)) + y                     # not a post-op chain: two readers
        return c[6](y) * self.bn.weight.view(1, -1, 1, 1)


@pytest.mark.parametrize("threads", [1, 2])
def test_post_op_chains(check, compile_to, threads):
    m = Epilogues().eval()
    x = randn(1, 16, 40, 36, seed=8)
    prog = check(m, x, threads=threads, **TOL)
    if not CPU:
        return  # the chains below are oneDNN post-ops, a CPU lowering choice; the result is checked
    with open(os.path.join(prog.directory, "manifest.json")) as fh:
        labels = [k["label"] for k in json.load(fh)["entries"][0]["kernels"]]
    convs = [lab for lab in labels if lab.startswith("Conv")]
    assert convs[0] == "Conv <- add relu mul add", labels
    assert all("<-" in lab for lab in convs), labels


def test_nan_propagates_through_fused_clamps(check):
    # relu, relu6 and clamp after a convolution keep a NaN as eager does (oneDNN's own relu and
    # clip post-ops would turn it into 0 or the lower bound).
    torch.manual_seed(9)
    a1, a2, a3 = (nn.Conv2d(4, 8, 3, padding=1) for _ in range(3))
    b = nn.Conv2d(8, 8, 1)

    def f(x):  # three convolutions, each read by one chain only (so each chain is fused)
        return b(F.relu6(a1(x))), b(F.relu(a2(x) * 2.0)), b(torch.clamp(a3(x), -0.1, 0.1))

    x = randn(1, 4, 16, 16)
    x[0, 1, 5, 7] = float("nan")
    with torch.no_grad():
        outs = f(x)
    assert all(torch.isnan(o).any() for o in outs)
    check(f, x, **TOL)


class EpilogueRegions(nn.Module):
    """Elementwise regions after a convolution that its epilogue computes (GELU, hardswish,
    a residual add and relu, SiLU read by a later residual), and ones it must leave alone (an
    intermediate that is also a graph output, a result read by two convolutions)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.c = nn.ModuleList([nn.Conv2d(16, 16, 3, padding=1) for _ in range(8)])

    def forward(self, x):
        c = self.c
        a = F.gelu(c[0](x))
        b = F.hardswish(c[1](a))
        r = F.relu(c[2](b) + a)               # residual add, then relu
        s = F.silu(c[3](r))
        t = c[4](s)
        sig = torch.sigmoid(t)                # also a graph output: not absorbed
        u = t * sig
        v = c[5](u)                           # read by two convolutions: no epilogue
        return c[6](v) + c[7](v), sig


@pytest.mark.parametrize("threads", [1, 2])
def test_epilogue_regions(check, threads):
    m = EpilogueRegions().eval()
    prog = check(m, randn(1, 16, 48, 40, seed=12), threads=threads, **TOL)
    if not CPU:
        return  # the regions below are oneDNN epilogues, a CPU lowering choice; the result is checked
    with open(os.path.join(prog.directory, "manifest.json")) as fh:
        labels = [k["label"] for k in json.load(fh)["entries"][0]["kernels"]]
    convs = [lab for lab in labels if lab.startswith("Conv")]
    assert len(convs) == 8, labels
    assert "erf" in convs[0] and "add relu" in convs[2] and "sigmoid" in convs[3], convs
    assert "sigmoid" not in convs[4], convs  # sigmoid(t) is a graph output
    assert convs[5] == "Conv <- add", convs  # v has two readers


class StridedPointwise(nn.Module):
    """1x1 convolutions with strides above 1 (ResNet's downsampling shortcuts and their
    kin): conv_dnnl gathers the pixels they read and runs oneDNN's unit-stride 1x1 kernel
    where oneDNN has no 1x1 kernel for the strided form (AVX2 CPUs); elsewhere oneDNN's own
    strided kernel runs. Odd sizes leave input rows and columns no output reads; bias,
    batch norm and a residual add exercise the post-ops and the epilogue on the gathered form."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(13)
        self.a = nn.Conv2d(64, 128, 1, stride=2)
        self.b = nn.Conv2d(64, 128, 1, stride=(3, 2), bias=False)
        self.bn = nn.BatchNorm2d(128)
        self.c = nn.Conv2d(128, 128, 3, padding=1)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        y = F.relu(self.bn(self.a(x)) + self.c(F.relu(self.a(x))))
        return y, self.b(x)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 3])
def test_strided_pointwise_convolutions(check, threads, batch):
    check(StridedPointwise().eval(), randn(batch, 64, 57, 45, seed=14), threads=threads, **TOL)


@pytest.mark.parametrize("threads", [1, 2])
def test_strided_pointwise_conv1d_and_conv3d(check, threads):
    torch.manual_seed(15)
    c1 = nn.Conv1d(32, 64, 1, stride=3)
    c3 = nn.Conv3d(16, 32, 1, stride=(1, 2, 2))

    def f(a, b):
        return F.relu(c1(a)), c3(b) * 0.5

    with torch.no_grad():
        check(f, randn(2, 32, 4001, seed=16), randn(1, 16, 6, 41, 39, seed=17), threads=threads, **TOL)


class NarrowGroups(nn.Module):
    """ResNeXt's grouped convolution (32 groups of 4 channels): oneDNN has only its im2col
    kernel for it, and conv_dnnl runs that on oneDNN's own layout (reorders in and out of
    each slice) rather than on channels-last memory; bias, relu and a residual add after it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(18)
        self.a = nn.Conv2d(128, 128, 3, padding=1, groups=32)
        self.b = nn.Conv2d(128, 128, 3, stride=2, padding=1, groups=32, bias=False)
        self.c = nn.Conv2d(128, 128, 1)

    def forward(self, x):
        y = F.relu(self.a(x)) + x
        return self.c(F.relu(self.b(y)))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 2])
def test_narrow_groups(check, threads, batch):
    check(NarrowGroups().eval(), randn(batch, 128, 44, 38, seed=19), threads=threads, **TOL)


class GroupNormAfterConv(nn.Module):
    """A VAE's resnet block in small: a channels-last convolution whose result a group norm
    reads row-major (Relayout.row_major), and a second convolution reading a row-major sum
    (Relayout.channels_last). Odd sizes: the copies' rows are taken channel-fastest
    (et::for_rows_in_order) and end mid cache line."""

    def __init__(self, c):
        super().__init__()
        torch.manual_seed(5)
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.norm = nn.GroupNorm(c // 8, c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        h = self.norm(self.conv(x))
        return self.conv2(F.silu(h) + x.permute(0, 1, 3, 2).transpose(2, 3))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(1, 40, 23, 37), (2, 24, 17, 19)])
def test_relayouts_around_a_group_norm(check, threads, shape):
    check(GroupNormAfterConv(shape[1]).eval(), randn(*shape, seed=7), threads=threads, **TOL)


@pytest.mark.parametrize("perm", [(0, 3, 1, 2), (0, 2, 3, 1), (3, 1, 2, 0), (2, 0, 3, 1)])
def test_transposing_copies(check, perm):
    """Permutations whose copy reads (or writes) 16 or more elements apart along its rows and
    one apart along another dimension: every value where eager puts it, 1 and 2 threads."""
    for threads in (1, 2):
        check(lambda x: x.permute(*perm).contiguous() * 2.0, randn(3, 21, 18, 33, seed=8), threads=threads, rtol=0, atol=0)
