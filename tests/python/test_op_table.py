"""The importer's ATen table against PyTorch's op registry and the core ATen opset.

tests/data/core_aten_ops.tsv is a copy of the core ATen opset list (191 functional ops).
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

from chroma import _compiler  # noqa: E402

CORE = os.path.join(os.path.dirname(__file__), "..", "data", "core_aten_ops.tsv")


def core_ops():
    with open(CORE) as f:
        return [line.split("\t")[0] for line in f if line.startswith("aten.")]


def resolve(target):
    _, name, overload = target.split(".", 2)
    packet = getattr(torch.ops.aten, name)
    return getattr(packet, overload)


@pytest.mark.parametrize("target", _compiler.supported_aten_targets())
def test_handler_names_a_real_aten_overload(target):
    assert isinstance(resolve(target), torch._ops.OpOverload)


def test_core_opset_coverage_for_mlps_and_transformers():
    handled = set(_compiler.supported_aten_targets())
    core = core_ops()
    assert len(core) == 191
    covered = [op for op in core if op in handled]
    print(f"core ATen ops handled: {len(covered)} / {len(core)}")
    # What MLPs and transformer blocks export to (torch 2.13, run_decompositions()).
    needed = """addmm mm bmm add.Tensor sub.Tensor mul.Tensor div.Tensor exp log sin cos tanh sigmoid erf
        pow.Tensor_Scalar rsqrt gelu relu eq.Scalar lt.Tensor where.self sum.dim_IntList mean.dim amax
        var.correction _softmax _log_softmax native_layer_norm embedding index.Tensor gather topk cat
        split_with_sizes slice.Tensor select.int permute expand view arange.start_step full triu""".split()
    missing = []
    for n in needed:
        name = n if "." in n else n + ".default"
        if "aten." + name not in handled:
            missing.append(name)
    assert not missing, f"not handled: {missing}"


def test_unsupported_target_is_reported_not_crashed(tmp_path):
    import chroma

    # (fake quantization has no handler yet)
    with pytest.raises(chroma.CompileError, match=r"aten\.fake_quantize_per_tensor_affine_cachemask\.default"):
        chroma.compile(lambda x: torch.fake_quantize_per_tensor_affine(x, 0.1, 0, 0, 255),
                       (torch.randn(1, 2, 6, 6),), out=str(tmp_path / "a"))
