"""Kernels split over the program's pool: the same program loaded with 1 and 2 threads.

Every kernel kind that splits (products on oneDNN's sgemm: column and row blocks, products
side by side, wide products in column blocks; oneDNN convolutions: slices of output channels
or of groups; row kernels: elementwise, softmax, last-axis reductions) is made large enough
here to split at 2 threads (chroma/cpu/sgemm.h, conv_dnnl.h, et.h over_rows). Results are
compared with eager PyTorch (rtol 1e-4: float32 products of length up to 256) and between the
thread counts: row kernels compute every row the same way on any thread, so they must agree
exactly; products agree to rounding (1e-4: sums of up to 300 terms of magnitude 20).
"""

import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import chroma
from conftest import compare, randn, to_numpy


class Products(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.w = torch.nn.Parameter(torch.randn(64, 256, generator=g) / 16)     # linear: W^T
        self.wide = torch.nn.Parameter(torch.randn(256, 1200, generator=g) / 16)  # n > 1024

    def forward(self, x, z, q, k, big):
        return (
            x @ self.wide,             # 300 x 1200 x 256: column blocks, split by columns
            F.linear(x, self.w),       # 300 x 64 x 256, B transposed: split by rows
            x.t() @ z,                 # A transposed: 256 x 128 x 300
            q @ k.transpose(-1, -2),   # 16 products of 49 x 49 x 32: side by side
            big @ self.wide[:, :512],  # 2 products of 300 x 512 x 256: one after another, each split
        )


class Convs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.c1 = torch.nn.Conv2d(24, 40, 3, padding=1, bias=False)       # 40 channels: slices of 24 and 16
        self.grouped = torch.nn.Conv2d(40, 64, 3, padding=1, groups=4)    # slices of 2 groups
        self.dw = torch.nn.Conv2d(64, 64, 3, padding=1, groups=64)        # depthwise, slices of 32 groups
        self.c3d = torch.nn.Conv3d(8, 32, 3, padding=1)

    def forward(self, x, w, v):
        y = self.dw(self.grouped(self.c1(x)))
        return y, F.conv2d(x, w, padding=1), self.c3d(v)  # w: weights given at run time


def rows(x, y):
    return (
        torch.softmax(x, -1),
        torch.log_softmax(x, -1),
        F.layer_norm(x, (x.shape[-1],)),
        F.gelu(y),
        torch.tanh(y) * y,
        y.sum(-1),
        y.amax(0),      # reduces the outer dimension: runs on one thread
        torch.softmax(x, 0),
    )


CASES = {
    "products": (Products, lambda: (randn(300, 256, seed=3), randn(300, 128, seed=4), randn(16, 49, 32, seed=5),
                                    randn(16, 49, 32, seed=6), randn(2, 300, 256, seed=7))),
    "convs": (Convs, lambda: (randn(2, 24, 40, 40, seed=8), randn(16, 24, 3, 3, seed=9) / 8,
                              randn(1, 8, 12, 12, 12, seed=10))),
    "rows": (lambda: rows, lambda: (randn(64, 1000, seed=11) * 4, randn(256, 512, seed=12) * 3)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_threads_match_one_and_eager(case, tmp_path):
    make, inputs = CASES[case]
    model, args = make(), inputs()
    if isinstance(model, torch.nn.Module):
        model.eval()
    prog = chroma.compile(model, args, out=str(tmp_path / case), threads=1)
    two = chroma.load(prog.directory, threads=2)
    assert two.threads == 2
    with torch.no_grad():
        want = model(*args)
    np_args = [to_numpy(a) for a in args]
    one_out, two_out = prog(*np_args), two(*np_args)
    compare(two_out, want, rtol=1e-4, atol=1e-4)
    for i, (a, b) in enumerate(zip(one_out, two_out)):
        if case == "rows":
            np.testing.assert_array_equal(a, b, err_msg=f"output {i}: 1 and 2 threads differ")
        else:
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=f"output {i}: 1 and 2 threads")
    if case != "rows":
        # the products and convolutions really ran on oneDNN (the kernels under test)
        opts = json.load(open(os.path.join(prog.directory, "manifest.json")))["options"]
        assert opts["dnnl"] and opts["sgemm"] == "onednn", opts


def test_sgemm_openblas_is_kept_on_request(tmp_path, monkeypatch):
    """CHROMA_SGEMM=openblas (the diagnostic bench/gemm.cpp's comparison uses) compiles the
    products to OpenBLAS calls; the results agree with the oneDNN build's."""
    model, args = Products().eval(), CASES["products"][1]()
    np_args = [to_numpy(a) for a in args]
    monkeypatch.setenv("CHROMA_SGEMM", "openblas")
    ob = chroma.compile(model, args, out=str(tmp_path / "openblas"), threads=2)
    monkeypatch.delenv("CHROMA_SGEMM")
    dn = chroma.compile(model, args, out=str(tmp_path / "onednn"), threads=2)
    assert json.load(open(os.path.join(ob.directory, "manifest.json")))["options"]["sgemm"] == "openblas"
    assert json.load(open(os.path.join(dn.directory, "manifest.json")))["options"]["sgemm"] == "onednn"
    src = "".join(open(os.path.join(ob.directory, "src", f)).read() for f in os.listdir(os.path.join(ob.directory, "src")))
    assert "cblas_sgemm" in src and "et::sgemm" not in src
    for i, (a, b) in enumerate(zip(ob(*np_args), dn(*np_args))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=f"output {i}")
