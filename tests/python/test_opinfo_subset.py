"""A fast subset of the OpInfo conformance run (tools/opinfo_conformance.py; its cases in
tools/opinfo_cases.py): one or two OpInfo entries per op family, their first float32 samples
compiled together into one program per entry and compared with eager PyTorch at
torch.testing.assert_close's default tolerances. The full run (every entry, every sample)
regenerates docs/ops.md.

Run: cd /work/main && .venv/bin/python -m pytest tests/python/test_opinfo_subset.py -q
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))

from opinfo_cases import Case, run_cases, tolerances  # noqa: E402

# Full tier: PyTorch's OpInfo samples over the supported ops and dtypes, a conformance sweep
# (8 minutes of the CPU suite on two cores) beside the op suite, which the guarding tier runs.
pytestmark = pytest.mark.full

# family -> OpInfo names (name or name.variant)
FAMILIES = {
    "unary elementwise": ["sin", "nn.functional.gelu"],
    "binary elementwise": ["add", "where"],
    "comparison / logical": ["lt", "logical_and"],
    "reduction": ["sum", "amax"],
    "normalizing reduction": ["softmax", "var"],
    "matrix product": ["matmul", "addmm"],
    "convolution": ["nn.functional.conv2d", "nn.functional.conv_transpose1d"],
    "pooling": ["nn.functional.max_pool2d", "nn.functional.adaptive_avg_pool2d"],
    "normalization": ["nn.functional.batch_norm", "nn.functional.group_norm"],
    "upsampling / padding": ["nn.functional.interpolate.bilinear", "_upsample_bilinear2d_aa", "nn.functional.pad.reflect"],
    "shape": ["cat", "permute", "flip"],
    "indexing": ["index_select", "gather"],
    "scatter": ["scatter_add", "index_put", "put"],
    "sort / top-k": ["sort", "topk"],
    "scan": ["cumsum"],
    "special function": ["special.bessel_j0", "lgamma", "special.chebyshev_polynomial_t"],
    "linear algebra (LAPACK)": ["linalg.cholesky", "linalg.solve", "linalg.svd", "linalg.det"],
    "searching / counting": ["searchsorted", "histc", "histogram", "nanmedian"],
    "attention / fused losses": ["torch.ops.aten._scaled_dot_product_flash_attention_for_cpu",
                                 "nn.functional.linear_cross_entropy.chunked"],
    "index reduce / segment": ["index_reduce.amax", "unfold"],
}

MAX_SAMPLES = 3


def _ops():
    from torch.testing._internal.common_methods_invocations import op_db

    by_name = {}
    for op in op_db:
        by_name[op.name + ("." + op.variant_test_name if op.variant_test_name else "")] = op
    return by_name


_BY_NAME = None


def _op(name):
    global _BY_NAME
    if _BY_NAME is None:
        _BY_NAME = _ops()
    if name not in _BY_NAME:
        pytest.fail(f"OpInfo '{name}' is not in this torch's op_db")
    return _BY_NAME[name]


PARAMS = [(fam, name) for fam, names in FAMILIES.items() for name in names]


@pytest.mark.parametrize("family,name", PARAMS, ids=[f"{f.split()[0]}-{n}" for f, n in PARAMS])
def test_opinfo_samples(family, name, tmp_path):
    op = _op(name)
    samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:MAX_SAMPLES]
    assert samples, f"{name} has no float32 samples"
    cases = [Case(op, s, tolerances(op, torch.float32)) for s in samples]
    results = run_cases(cases, str(tmp_path), str(tmp_path / "cache"))
    bad = [(c.text, s, r) for c, (s, r) in zip(cases, results) if s not in ("pass", "skip")]
    assert not bad, f"{family} / {name}: " + "; ".join(f"{s}: {r} [{t}]" for t, s, r in bad)
    assert any(s == "pass" for s, _ in results), f"{name}: no sample ran"


# float16 and bfloat16 (computed as PyTorch's CPU does: each ATen operation in float32, rounded
# to the type): one entry per family that has half samples on the CPU, at OpInfo's tolerances
# for the dtype. (topk and sort: with 8 or 11 significant bits OpInfo's samples have ties, and
# PyTorch orders equal values' indices otherwise than in float32; test_half.py checks them
# tie-aware.)
HALF_FAMILIES = ["sin", "nn.functional.gelu", "where", "lt", "sum", "softmax", "var", "matmul",
                 "nn.functional.conv2d", "nn.functional.max_pool2d", "nn.functional.group_norm",
                 "nn.functional.interpolate.bilinear", "cat", "index_select", "scatter_add", "cumsum"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", HALF_FAMILIES)
def test_opinfo_half_samples(name, dtype, tmp_path):
    op = _op(name)
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:MAX_SAMPLES]
    assert samples, f"{name} has no {dtype} samples"
    cases = [Case(op, s, tolerances(op, dtype)) for s in samples]
    results = run_cases(cases, str(tmp_path), str(tmp_path / "cache"))
    bad = [(c.text, s, r) for c, (s, r) in zip(cases, results) if s not in ("pass", "skip")]
    assert not bad, f"{name} ({dtype}): " + "; ".join(f"{s}: {r} [{t}]" for t, s, r in bad)
