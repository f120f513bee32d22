"""Convolution against torch eager: 1/2/3-d, stride, padding (incl. 'same'), dilation, groups,
depthwise with channel multipliers, transposed (stride, output_padding, groups, dilation),
unbatched inputs, bias or not, and the inference batch norm folded into a convolution.

Tolerance: rtol = atol = 1e-4. A convolution sums Cin * prod(kernel) products (up to 288
here) in a different order than oneDNN does (im2col + BLAS, or a balanced tree for the
depthwise form), so float32 rounding differences grow with that count; inputs and weights
are N(0, 1), so outputs reach about 20 and 1e-4 is a few ulp of them.

Run: cd /work/main && .venv/bin/python -m pytest tests/python/test_conv.py -q
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import randn

import chroma

TOL = dict(rtol=1e-4, atol=1e-4)


class Conv(nn.Module):
    """fn(x, weight, bias) with the weight and bias as parameters (constants once compiled)."""

    def __init__(self, fn, wshape, bias_len, seed=1):
        super().__init__()
        self.fn = fn
        self.weight = nn.Parameter(randn(*wshape, seed=seed))
        self.bias = nn.Parameter(randn(bias_len, seed=seed + 1)) if bias_len else None

    def forward(self, x):
        return self.fn(x, self.weight, self.bias)


# name -> (fn, input shape, weight shape, bias length or 0)
CASES = {
    "2d": (lambda x, w, b: F.conv2d(x, w, b), (2, 3, 9, 11), (5, 3, 3, 3), 5),
    "2d_stride_pad_dilation": (lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(2, 1)),
                               (2, 4, 13, 10), (6, 4, 3, 2), 6),
    "2d_stride3_nobias": (lambda x, w, b: F.conv2d(x, w, b, stride=3, padding=1), (1, 3, 11, 8), (4, 3, 4, 4), 0),
    "2d_groups": (lambda x, w, b: F.conv2d(x, w, b, groups=2, padding=1), (3, 4, 7, 7), (6, 2, 3, 3), 6),
    "2d_depthwise_stride2": (lambda x, w, b: F.conv2d(x, w, b, groups=4, padding=1, stride=2), (2, 4, 9, 8), (4, 1, 3, 3), 4),
    "2d_depthwise_multiplier": (lambda x, w, b: F.conv2d(x, w, b, groups=3, padding=2), (1, 3, 8, 8), (6, 1, 5, 5), 0),
    "2d_depthwise_dilated": (lambda x, w, b: F.conv2d(x, w, b, groups=5, padding=2, dilation=2), (2, 5, 7, 9), (5, 1, 3, 3), 5),
    "2d_1x1": (lambda x, w, b: F.conv2d(x, w, b), (1, 8, 5, 5), (4, 8, 1, 1), 4),
    "2d_1x1_stride2_batch": (lambda x, w, b: F.conv2d(x, w, b, stride=2), (3, 8, 5, 5), (4, 8, 1, 1), 4),
    "2d_same_even_kernel": (lambda x, w, b: F.conv2d(x, w, b, padding="same"), (1, 3, 6, 7), (2, 3, 4, 3), 2),
    "2d_unbatched": (lambda x, w, b: F.conv2d(x, w, b, padding=1), (3, 6, 6), (2, 3, 3, 3), 2),
    "2d_kernel_equals_input": (lambda x, w, b: F.conv2d(x, w, b), (2, 3, 4, 5), (7, 3, 4, 5), 7),
    "1d": (lambda x, w, b: F.conv1d(x, w, b, padding=2, dilation=2), (2, 3, 17), (4, 3, 3), 4),
    "1d_depthwise": (lambda x, w, b: F.conv1d(x, w, b, groups=6, stride=2, padding=1), (2, 6, 15), (6, 1, 4), 6),
    "3d": (lambda x, w, b: F.conv3d(x, w, b, padding=1, stride=(1, 2, 2)), (1, 2, 5, 6, 7), (3, 2, 3, 3, 3), 3),
    "3d_groups_batch": (lambda x, w, b: F.conv3d(x, w, b, groups=2, dilation=(1, 2, 1)), (2, 4, 4, 6, 5), (4, 2, 2, 2, 2), 0),
    "transposed_2d": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
                      (2, 4, 5, 6), (4, 3, 3, 3), 3),
    "transposed_2d_groups_dilation": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=(2, 3), padding=(0, 2), groups=2,
                                                                         dilation=2), (1, 4, 5, 4), (4, 3, 3, 2), 6),
    "transposed_2d_large_padding": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=3), (1, 2, 6, 6),
                                    (2, 2, 3, 3), 0),
    "transposed_1d": (lambda x, w, b: F.conv_transpose1d(x, w, b, stride=3, padding=4), (2, 3, 7), (3, 2, 5), 0),
    "transposed_3d": (lambda x, w, b: F.conv_transpose3d(x, w, b, stride=2), (1, 2, 3, 4, 3), (2, 3, 2, 2, 2), 3),
    "transposed_unbatched": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2), (2, 3, 4), (2, 3, 2, 2), 3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_convolution(name, check):
    fn, xshape, wshape, nb = CASES[name]
    check(Conv(fn, wshape, nb).eval(), randn(*xshape), **TOL)


def test_weight_as_input(check):
    """Weights that are inputs, not constants: the same decomposition, evaluated per call."""
    check(lambda x, w: F.conv2d(x, w, padding=1, groups=2), randn(2, 4, 6, 5), randn(6, 2, 3, 3, seed=3), **TOL)
    check(lambda x, w: F.conv_transpose2d(x, w, stride=2), randn(1, 4, 3, 5), randn(4, 2, 3, 3, seed=3), **TOL)


def test_float64(check):
    check(lambda x, w: F.conv2d(x, w, padding=1), randn(1, 3, 5, 5).double(), randn(4, 3, 3, 3, seed=2).double(),
          rtol=1e-10, atol=1e-10)


def _bn(c, seed):
    bn = nn.BatchNorm2d(c)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(c, generator=g))
        bn.running_var.copy_(torch.rand(c, generator=g) + 0.5)
        bn.weight.copy_(torch.randn(c, generator=g))
        bn.bias.copy_(torch.randn(c, generator=g))
    return bn


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), _bn(8, 1)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), _bn(8, 2)
        self.c3, self.b3 = nn.Conv2d(8, 4, 1), _bn(4, 3)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)))
        z = self.c3(y)
        return self.b3(z), z  # z has a second reader: this batch norm cannot be folded


def test_batch_norm_folded_into_convolution(check):
    m = ConvBN().eval()
    prog = check(m, randn(2, 3, 10, 9), **TOL)
    # b1 and b2 are their convolution's only reader: folded into the weights, they leave no
    # kernel of their own. b3's input is also a model output, so it stays a normalization.
    bn_nodes = {k["node"] for k in prog.manifest["kernels"] if k["node"].startswith("_native_batch_norm")}
    assert bn_nodes == {"_native_batch_norm_legit_no_training_2"}, prog.manifest["kernels"]


def test_batch_norm_folded_into_a_large_convolution(check):
    # A weight over the folder's 16 MB limit (1024 x 1024 x 3 x 3, 37.7 MB) times its batch
    # norm's scale: the result is no larger than the weight it replaces, so it is folded too
    # (it was computed, and reordered by oneDNN, at every call).
    torch.manual_seed(24)
    m = nn.Sequential(nn.Conv2d(1024, 1024, 3, padding=1, bias=False), nn.BatchNorm2d(1024)).eval()
    with torch.no_grad():
        m[1].running_var.uniform_(0.5, 2)
    prog = check(m, randn(1, 1024, 5, 4, seed=25), rtol=1e-4, atol=1e-4)
    maps = [k for k in prog.manifest["kernels"] if k["label"].startswith("Map")]
    assert not maps, prog.manifest["kernels"]


def test_unsupported_dtype_is_named():
    x, w = torch.randint(0, 5, (1, 3, 5, 5)), torch.randint(0, 5, (2, 3, 3, 3))
    with pytest.raises(Exception, match=r"convolution of i64\[1,3,5,5\] is not supported"):
        chroma.compile(lambda x, w: F.conv2d(x, w), (x, w))


class ConstantInput(nn.Module):
    """A convolution of constants only: evaluated at compile time by the interpreter."""

    def __init__(self):
        super().__init__()
        self.register_buffer("image", randn(2, 4, 6, 7, seed=5))
        self.weight = nn.Parameter(randn(6, 2, 3, 2, seed=6))

    def forward(self, x):
        return x + F.conv2d(self.image, self.weight, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)


def test_constant_convolution_is_folded(check):
    prog = check(ConstantInput().eval(), randn(2, 6, 3, 5), **TOL)
    assert not any(k["kind"] == "conv" for k in prog.manifest["kernels"]), prog.manifest["kernels"]
