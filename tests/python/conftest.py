"""Shared helpers for the Chroma Python tests.

`check(fn, *inputs, rtol=1e-5, atol=1e-5, ...)` compiles `fn` for the example inputs
(torch tensors) into a fresh directory under pytest's tmp_path, runs the compiled
program on the inputs converted to NumPy, compares every output with torch eager
(dtype and shape exactly, values with np.testing.assert_allclose; integer and bool
outputs must match exactly) and returns the Program.

Every op on every backend (ggml's test-backend-ops idea): with CHROMA_TEST_TARGET=webgpu,
the tests that compile through `check` compile for that target instead and run on a software
WebGPU adapter (Mesa's lavapipe through the `wgpu` package); with CHROMA_TEST_TARGET=cuda, for
the CUDA target, run on the CPU SIMT emulator (chroma.runtime.emulator). The other tests, which test the
CPU target itself, are deselected. A case the target cannot compile is skipped with the
target's own reason: its compile raised chroma.UnsupportedError (Target::supports, one refusal per
part of the program: float64 storage, LAPACK on a GPU, ...), or its run refused an input value the
target cannot hold (chroma.errors.UnsupportedInput: int64 beyond int32). There are no skip lists:
what a target refuses is recorded per test by the full tier (gpu_coverage.json, "refused:" items),
and a case the record ran that is now refused fails the guarding tier's check. Tests that also
assert a CPU lowering choice (oneDNN post-ops, pre-packed panels) assert it where CPU is true and
check the result on every target. Float tolerances are widened to at least GPU_RTOL / GPU_ATOL there: WGSL's
exp, log, sin, ... may differ from the CPU's libm in the last bits (the WGSL spec allows
several ulp), and reductions add in a tree rather than in order.
"""

import itertools
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

import chroma  # noqa: E402
from chroma.errors import UnsupportedInput  # noqa: E402  (run time: an input value the target cannot hold)

TARGET = os.environ.get("CHROMA_TEST_TARGET", "cpu")
CPU = TARGET == "cpu"
# CHROMA_TEST_TARGET=cuda-native (scripts/gpu_check.sh, on a machine with an NVIDIA GPU): the
# op suite compiled for CUDA with nvcc and run natively (chroma.runtime.native).
NATIVE = TARGET == "cuda-native"
if NATIVE:
    TARGET = "cuda"
elif TARGET == "cuda":
    # The op suite runs the CUDA kernels on the emulator; nvcc's fatbin (seconds per model) is
    # built and checked for every architecture by test_cuda.py in the CPU pass.
    os.environ.setdefault("CHROMA_NVCC", "off")
GPU_RTOL, GPU_ATOL = 1e-4, 1e-5
if TARGET == "webgpu":
    os.environ.setdefault("VK_ICD_FILENAMES", "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")


def pytest_configure(config):
    config.addinivalue_line("markers", "full: runs in the full tier only (./scripts/test.sh --full; the reason is "
                                       "given where the mark is set)")


# The guarding tier runs a sample of each GPU target's op suite (CHROMA_TEST_SAMPLE=N: every
# test whose id hashes to 0 mod N, plus what covers every kernel kind and dtype the full
# suite's programs hold; gpu_coverage.py). CHROMA_COVERAGE_DIR: where each process writes what
# its tests' programs held.
SAMPLE = int(os.environ.get("CHROMA_TEST_SAMPLE", "0") or 0)
COVERAGE_DIR = os.environ.get("CHROMA_COVERAGE_DIR")
_COVERAGE = {}


def pytest_sessionfinish(session, exitstatus):
    if COVERAGE_DIR and _COVERAGE:
        import json

        os.makedirs(COVERAGE_DIR, exist_ok=True)
        with open(os.path.join(COVERAGE_DIR, f"{os.getpid()}.json"), "w", encoding="utf-8") as f:
            json.dump({k: sorted(v) for k, v in _COVERAGE.items()}, f)


def pytest_collection_modifyitems(config, items):
    if TARGET == "cpu":
        return
    sampled = None
    if SAMPLE > 1:
        from gpu_coverage import sample

        sampled = sample([i.nodeid for i in items if "check" in getattr(i, "fixturenames", ())], TARGET, SAMPLE)

    keep, drop = [], []
    for item in items:
        if "check" not in getattr(item, "fixturenames", ()) or (sampled is not None and item.nodeid not in sampled):
            drop.append(item)
            continue
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep

_TORCH_TO_NP = {
    torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64, torch.int32: np.int32,
    torch.bool: np.bool_, torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16,
}


def to_numpy(t):
    if isinstance(t, torch.Tensor):
        return t.detach().cpu().contiguous().numpy()
    return np.asarray(t)


def _flatten(out):
    if isinstance(out, (tuple, list)):
        res = []
        for o in out:
            res.extend(_flatten(o))
        return res
    return [out]


def compare(got, want, rtol=1e-5, atol=1e-5, what="output"):
    """Compares Chroma output(s) `got` (NumPy) with torch output(s) `want`."""
    got_l = _flatten(got) if isinstance(got, (tuple, list)) else [got]
    want_l = _flatten(want)
    assert len(got_l) == len(want_l), f"{what}: {len(got_l)} outputs, torch gives {len(want_l)}"
    for i, (g, w) in enumerate(zip(got_l, want_l)):
        assert isinstance(g, np.ndarray), f"{what} {i}: expected numpy array, got {type(g).__name__}"
        if isinstance(w, torch.Tensor):
            wn = to_numpy(w)
            assert g.dtype == np.dtype(_TORCH_TO_NP[w.dtype]), f"{what} {i}: dtype {g.dtype}, torch {w.dtype}"
        else:
            wn = np.asarray(w)
        assert g.shape == wn.shape, f"{what} {i}: shape {g.shape}, torch {wn.shape}"
        if g.dtype.kind in "biu":
            np.testing.assert_array_equal(g, wn, err_msg=f"{what} {i}")
        else:
            np.testing.assert_allclose(g, wn, rtol=rtol, atol=atol, err_msg=f"{what} {i}")


_counter = itertools.count()


def _refused(request, reasons):
    """Skips the running test with the target's reasons, recording them as its coverage items."""
    reasons = sorted(set(reasons))
    if COVERAGE_DIR:
        _COVERAGE.setdefault(request.node.nodeid, set()).update(f"refused:{r}" for r in reasons)
    pytest.skip(f"{TARGET} refuses it: {'; '.join(reasons)}")


@pytest.fixture
def check(tmp_path, request):
    """check(fn, *inputs, rtol=1e-5, atol=1e-5, blas=True, **compile_options) -> Program."""

    def _check(fn, *inputs, rtol=1e-5, atol=1e-5, **options):
        out = str(tmp_path / f"prog{next(_counter)}")
        if TARGET != "cpu":
            options["target"] = TARGET
            rtol, atol = max(rtol, GPU_RTOL), max(atol, GPU_ATOL)
        try:
            prog = chroma.compile(fn, tuple(inputs), out=out, **options)
        except chroma.UnsupportedError as e:
            if CPU:
                raise
            _refused(request, [r[3] for r in e.refusals])
        if NATIVE:
            prog = chroma.load(out)  # the same artifact on the GPU
        with torch.no_grad():
            want = fn(*inputs)
        try:
            got = prog(*[to_numpy(x) for x in inputs])
        except UnsupportedInput as e:
            if CPU:
                raise
            _refused(request, [str(e)])
        compare(got, want, rtol=rtol, atol=atol)
        if COVERAGE_DIR and TARGET != "cpu":
            from gpu_coverage import items_of

            _COVERAGE.setdefault(request.node.nodeid, set()).update(items_of(prog))
        return prog

    return _check


@pytest.fixture
def compile_to(tmp_path):
    """compile_to(fn, *inputs, name=None, **options) -> Program compiled into tmp_path/name."""

    def _compile(fn, *inputs, name=None, **options):
        out = str(tmp_path / (name or f"prog{next(_counter)}"))
        return chroma.compile(fn, tuple(inputs), out=out, **options)

    return _compile


def randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tuple(shape), generator=g)


def randint(low, high, *shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=g, dtype=torch.int64)
