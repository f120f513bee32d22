"""The CUDA and Metal targets end to end (DESIGN.md "The GPU generator", "Testing without a
GPU"): the GPU generator's kernels in its CUDA and MSL dialects, one translation unit per model
(kernels.cu, kernels.metal), run here on the CPU SIMT emulator (include/chroma/simt;
chroma.load(..., emulate=True)) against PyTorch, in both invocation orders (the reverse order
exposes a missing barrier); the CUDA text also compiled by nvcc for every listed architecture
with spill warnings as errors. Metal's text has no compiler on Linux: it runs on the emulator
only (docs/cuda.md).

The op families themselves run on these targets through the shared suite
(CHROMA_TEST_TARGET=cuda or metal, conftest.py; skips with reasons in cuda_skips.py and
metal_skips.py). Tolerances: the emulator computes in float32 with the host's libm, in the
kernels' own summation order.
"""

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from conftest import compare, randn  # noqa: E402
from test_webgpu import Block  # noqa: E402

import chroma  # noqa: E402
from chroma import simt  # noqa: E402

# sm_80 (A100), sm_90 (H100/H200) cubins and compute_90 PTX for newer GPUs to JIT.
ARCHS = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
         "-gencode", "arch=compute_90,code=compute_90"]


def _compile(model, inputs, tmp_path, name="m", target="cuda"):
    with torch.no_grad():
        return chroma.compile(model, inputs, target=target, out=str(tmp_path / name))


def _compiled_text(directory, target):
    """The target's own check of its translation unit: nvcc for CUDA; nothing runs Metal's
    compiler here (no Linux build), the emulator having compiled the same text as C++."""
    if target == "cuda":
        _nvcc_fatbin(directory)
    else:
        text = open(os.path.join(directory, "kernels.metal")).read()
        assert "#include <metal_stdlib>" in text and "kernel void chroma_main(" in text


def _nvcc():
    return shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def _nvcc_fatbin(directory):
    """kernels.cu -> a fatbin for every listed architecture; ptxas spill warnings fail."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not installed (CUDA toolkit): the generated CUDA is only compiled where it is")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # without scripts/sanitize.sh's sanitizers
    cu = os.path.join(directory, "kernels.cu")
    r = subprocess.run([nvcc, "-fatbin", *ARCHS, "-Xptxas", "-warn-spills", "-o", os.path.join(directory, "k.fatbin"), cu],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "spill" not in r.stderr.lower(), r.stderr
    return r


TARGETS = ["cuda", "metal"]


@pytest.mark.parametrize("target", TARGETS)
def test_transformer_block_on_the_emulator_in_both_orders(tmp_path, target):
    torch.manual_seed(0)
    m, x = Block().eval(), randn(2, 16, 32)
    prog = _compile(m, (x,), tmp_path, target=target)
    assert isinstance(prog, simt.EmulatedProgram)
    with torch.no_grad():
        want = m(x)
    compare(prog(x.numpy()), want, rtol=1e-4, atol=1e-5)
    rev = chroma.load(str(tmp_path / "m"), emulate=True, reverse=True)
    compare(rev(x.numpy()), want, rtol=1e-4, atol=1e-5)
    st = prog.stats
    assert st["dispatches"] <= st["cpu_kernels"] + 2, st
    assert prog.manifest[target]["modules"] == st["pipelines"]
    _compiled_text(str(tmp_path / "m"), target)


@pytest.mark.parametrize("target", TARGETS)
def test_resnet18_on_the_emulator(tmp_path, target):
    import torchvision

    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10).eval()
    x = randn(1, 3, 32, 32)
    prog = _compile(m, (x,), tmp_path, "r18", target)
    with torch.no_grad():
        want = m(x)
    compare(prog(x.numpy()), want, rtol=1e-3, atol=1e-4 * float(want.abs().max()))
    _compiled_text(str(tmp_path / "r18"), target)


@pytest.mark.parametrize("target", TARGETS)
def test_reference_model_on_the_emulator(tmp_path, target):
    """gpt-oss's architecture at the benchmark size (59M parameters): an 8-token call."""
    from chroma.models import gpt_oss

    m = gpt_oss.build().eval()
    tokens = gpt_oss.sample_tokens(m.cfg, 8)
    prog = _compile(m, (tokens,), tmp_path, "gpt", target)
    with torch.no_grad():
        want = m(tokens).numpy()
    t0 = time.perf_counter()
    got = prog(tokens.numpy())
    print(f"emulated call: {time.perf_counter() - t0:.1f} s, {prog.stats['dispatches']} dispatches")
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * scale)
    assert (got.argmax(-1) == want.argmax(-1)).all()
    _compiled_text(str(tmp_path / "gpt"), target)


def test_loading_without_a_gpu_says_so(tmp_path):
    _compile(torch.nn.Linear(4, 3).eval(), (randn(2, 4),), tmp_path, "lin")
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has an NVIDIA GPU: the no-GPU error cannot happen here")
    with pytest.raises(simt.RunError, match=r"no NVIDIA GPU.*emulate=True"):
        chroma.load(str(tmp_path / "lin"))
    _compile(torch.nn.Linear(4, 3).eval(), (randn(2, 4),), tmp_path, "linm", "metal")
    with pytest.raises(simt.RunError, match=r"no Metal host runtime.*emulate=True"):
        chroma.load(str(tmp_path / "linm"))


def test_unsupported_ops_are_all_listed_with_source_lines(tmp_path):
    def f(x):
        return torch.lgamma(x) + torch.special.zeta(x, 2.0)

    with pytest.raises(chroma.CompileError) as e:
        chroma.compile(f, (randn(4).abs() + 1,), target="cuda", out=str(tmp_path / "u"))
    msg = str(e.value)
    assert "lgamma" in msg and "zeta" in msg and "test_cuda.py" in msg, msg


def test_a_corrupt_package_or_library_is_rejected(tmp_path):
    _compile(torch.nn.Linear(4, 3).eval(), (randn(2, 4),), tmp_path, "lin")
    pkg = tmp_path / "lin.chroma-cuda"
    data = bytearray(pkg.read_bytes())
    data[-1] ^= 1
    pkg.write_bytes(bytes(data))
    with pytest.raises(chroma.ArtifactError, match="corrupt"):
        chroma.load(str(tmp_path / "lin"), emulate=True)
    data[-1] ^= 1
    pkg.write_bytes(bytes(data))
    lib = tmp_path / "lin" / chroma.load(str(tmp_path / "lin"), emulate=True).manifest["emulator"]["library"]
    lib.unlink()
    with pytest.raises(chroma.ArtifactError, match="emulator library.*missing"):
        chroma.load(str(tmp_path / "lin"), emulate=True)
