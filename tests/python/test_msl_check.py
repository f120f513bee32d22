"""The Metal target's MSL type-checks with Metal's address spaces (docs/cuda.md, "Type-checking
the MSL"). No Metal compiler runs on Linux: clang compiles kernels.metal as C++ with
-fsyntax-only against include/chroma/msl_check/metal_stdlib, a declarations-only shim in which
`device`, `constant` and `threadgroup` are distinct clang address spaces and only Metal's
builtins exist. Three small models are checked, then the checker itself: a kernels.metal
corrupted with an address-space violation (or a store through `constant`) must be rejected.

Like test_cuda.py, these tests take no `check` fixture, so conftest.py deselects them when the
shared suite runs for another target (CHROMA_TEST_TARGET=webgpu, cuda or metal): they run once.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from conftest import randint, randn  # noqa: E402

import chroma  # noqa: E402

SHIM = os.path.join(os.path.dirname(__file__), "..", "..", "include", "chroma", "msl_check")


def _clang():
    clang = shutil.which("clang++-14") or shutil.which("clang++")
    if clang is None:
        pytest.skip("clang is not installed (scripts/setup.sh installs clang-14)")
    return clang


def msl_check(path):
    """clang++ -fsyntax-only on a kernels.metal (CHROMA_SIMT undefined: its <metal_stdlib> branch)."""
    cmd = [_clang(), "-fsyntax-only", "-x", "c++", "-std=c++17", "-Wno-unknown-attributes", "-I", SHIM, str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


class _Ops(torch.nn.Module):
    """Rows long enough for the SIMD-group reductions (simd_sum/max/product), a bool reduction
    (bit-field stores through device atomics), math (exp, fmod, erf, tanh) and index ops."""

    def forward(self, a, i):
        return (a.softmax(-1), i.prod(-1), i.amax(-1), (a > 0).any(-1), torch.fmod(a, 0.7), torch.erf(a), a.tanh(),
                a.argmax(-1), a.topk(3, -1).values, a.cumsum(-1), a[:, [5, 1]], torch.nn.functional.layer_norm(a, (300,)))


def _models():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 5))
    return {
        "mlp": (mlp, (randn(2, 8),)),
        "convnet": (conv, (randn(1, 3, 8, 8),)),
        "ops": (_Ops(), (randn(4, 300), randint(-3, 4, 4, 300))),
    }


@pytest.fixture(scope="module")
def metal_dirs(tmp_path_factory):
    _clang()  # skip before compiling anything
    root = tmp_path_factory.mktemp("msl")
    dirs = {}
    for name, (model, inputs) in _models().items():
        with torch.no_grad():
            chroma.compile(model.eval(), inputs, target="metal", out=str(root / name))
        dirs[name] = root / name
    return dirs


@pytest.mark.parametrize("name", ["mlp", "convnet", "ops"])
def test_generated_msl_type_checks(metal_dirs, name):
    path = metal_dirs[name] / "kernels.metal"
    r = msl_check(path)
    print(r.stderr)
    assert r.returncode == 0, f"{path}:\n{r.stderr}"
    assert r.stderr == "", r.stderr  # not even a warning
    if name == "ops":  # the constructs the shim exists for are there
        text = path.read_text()
        for construct in ("threadgroup float", "simd_sum(", "simd_product(", "atomic_fetch_or_explicit(", "fmod("):
            assert construct in text, construct


# Each corruption goes right after the first threadgroup array's declaration (the MLP's matmul
# stages its rows in `threadgroup float sm[...]`), with the diagnostic's address space.
CORRUPTIONS = {
    "threadgroup array as a device pointer": ("device float* chroma_bad = {array};", "address_space(3)"),
    "device pointer as a thread pointer": ("uint* chroma_bad = s0;", "address_space(1)"),
    "store through a constant reference": ("prm.p0 = 0u;", "address_space(2)"),
}


@pytest.mark.parametrize("what", list(CORRUPTIONS))
def test_address_space_violations_are_rejected(metal_dirs, tmp_path, what):
    text = (metal_dirs["mlp"] / "kernels.metal").read_text()
    m = re.search(r"^ *threadgroup float (\w+)\[\d+\];\n", text, re.M)
    assert m, "the MLP's kernels.metal has no threadgroup array to corrupt next to"
    line, diagnostic = CORRUPTIONS[what]
    bad = tmp_path / "kernels.metal"
    bad.write_text(text[: m.end()] + "  " + line.format(array=m.group(1)) + "\n" + text[m.end():])
    r = msl_check(bad)
    assert r.returncode != 0, f"clang accepted: {line}"
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and diagnostic in errors[0], r.stderr
