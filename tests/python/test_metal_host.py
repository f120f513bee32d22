"""The Metal target's host runtime (include/chroma/metal/host.h, python/chroma/runtime/native.py's
MetalProgram) on machines without Metal (docs/cuda.md, "Metal").

The runtime is written against Apple's metal-cpp and builds into a Metal artifact's host library
when CHROMA_METAL_CPP names metal-cpp's headers. No Metal exists on Linux, so here
CHROMA_METAL_CPP names tests/metal_fake: headers with metal-cpp's classes and signatures for
what the runtime calls, whose "GPU" runs the artifact's own kernels on the CPU SIMT emulator
(CHROMA_METAL_FAKE_KERNELS names the emulator's library) and which refuses what a Metal device
would (fast math on, an unbound slot, setBytes over 4 KB, more threads than the pipeline allows,
commit before endEncoding) and counts objects left alive or autoreleased with no pool. What
this checks: the runtime's buffers, uploads, schedule, bindings, parameters, status block,
state across calls and entries, errors and object lifetimes, end to end against PyTorch. What
it cannot check: Apple's compiler on the MSL (test_msl_check.py type-checks it) and a real
device's behaviour.

Like test_cuda.py, these tests take no `check` fixture: they run once, not per target.
"""

import ctypes
import json
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from conftest import compare, randn  # noqa: E402
from test_webgpu import Block  # noqa: E402

import chroma  # noqa: E402
from chroma.runtime import native as cuda, emulator as simt  # noqa: E402

FAKE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "metal_fake"))


@pytest.fixture
def fake_metal(monkeypatch):
    """Compiles with the fake metal-cpp; loads with the fake device running the artifact's
    emulator library."""
    monkeypatch.setenv("CHROMA_METAL_CPP", FAKE)
    for v in ("CHROMA_METAL_FAKE_SIMD_WIDTH", "CHROMA_METAL_FAKE_MAX_THREADS", "CHROMA_METAL_FAKE_NO_DEVICE",
              "CHROMA_METAL_FAKE_MAX_BUFFER"):
        monkeypatch.delenv(v, raising=False)

    def compile_and_point(model, inputs, out):
        with torch.no_grad():
            emulated = chroma.compile(model, inputs, target="metal", out=str(out))
        m = emulated.manifest
        assert m["metal"]["host"]["metal_cpp"] == FAKE, m["metal"]
        monkeypatch.setenv("CHROMA_METAL_FAKE_KERNELS", os.path.join(str(out), m["emulator"]["library"]))
        return emulated

    return compile_and_point


def _counts(directory):
    """The fake's (objects alive, objects autoreleased with no pool) in the host library."""
    with open(os.path.join(str(directory), "manifest.json")) as f:
        m = json.load(f)
    lib = ctypes.CDLL(os.path.join(str(directory), m["metal"]["host"]["library"]))
    alive, orphans = ctypes.c_long(), ctypes.c_long()
    lib.chroma_metal_fake_counts(ctypes.byref(alive), ctypes.byref(orphans))
    return alive.value, orphans.value


def test_a_transformer_block_through_the_metal_host_runtime(tmp_path, fake_metal):
    torch.manual_seed(0)
    m, x = Block().eval(), randn(2, 16, 32)
    emulated = fake_metal(m, (x,), tmp_path / "m")
    src = (tmp_path / "m" / "src" / "metal_host.cpp").read_text()
    assert "#define MTL_PRIVATE_IMPLEMENTATION" in src and '#include "chroma/metal/host.h"' in src
    prog = chroma.load(str(tmp_path / "m"))
    assert isinstance(prog, cuda.MetalProgram), prog
    info = prog._info
    assert info["kernels"] == emulated.stats["pipelines"] and info["dispatches"] == emulated.stats["dispatches"]
    assert info["unified_memory"] is True and "fake Metal" in info["device"]
    with torch.no_grad():
        want = m(x)
    for _ in range(2):  # the schedule replays; inputs, status block and outputs each call
        got = prog(x.numpy())
        compare(got, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(got, emulated(x.numpy()))  # the same kernels, in the same order
    alive, orphans = _counts(tmp_path / "m")
    assert alive > 0 and orphans == 0  # the device, queue, library, pipelines, buffers
    prog.close()
    assert _counts(tmp_path / "m") == (0, 0)  # every object released, nothing autoreleased outside a pool
    with pytest.raises(simt.RunError, match="closed"):
        prog(x.numpy())


def test_the_kv_cache_decoder_through_the_metal_host_runtime(tmp_path, fake_metal, monkeypatch):
    """Two entry points over one state buffer: the cache written by prefill and each step stays
    in the runtime's buffer between calls; every step equals the uncached model, across the
    cache's wrap; reset_state restores it."""
    from chroma.models import gpt_oss as g
    from test_gpt_oss import VARIANT, assert_logits_close

    m = g.build(**VARIANT)
    monkeypatch.setenv("CHROMA_METAL_CPP", FAKE)
    dec = chroma.compile_decoder(m, prompt_len=5, cache_size=8, out=str(tmp_path / "dec"), target="metal")
    monkeypatch.setenv("CHROMA_METAL_FAKE_KERNELS",
                       os.path.join(str(tmp_path / "dec"), dec.program.manifest["emulator"]["library"]))
    native = chroma.Decoder(chroma.load(str(tmp_path / "dec")))
    assert isinstance(native.program, cuda.MetalProgram)
    toks = g.sample_tokens(m.cfg, 12, seed=3)
    for _ in range(2):
        with torch.no_grad():
            assert_logits_close(native.prefill(toks[:5].numpy()), m(toks[:5]))
            for p in range(5, 12):  # the cache wraps at position 8
                assert_logits_close(native.step(int(toks[p])), m(toks[: p + 1], max_window=8)[-1:])
        native.program.reset_state()
    native.program.close()
    assert _counts(tmp_path / "dec") == (0, 0)


def test_an_index_out_of_range_is_reported_and_the_next_call_is_clean(tmp_path, fake_metal):
    emb = torch.nn.Embedding(10, 4).eval()
    idx = torch.tensor([1, 2, 3])
    fake_metal(emb, (idx,), tmp_path / "emb")
    prog = chroma.load(str(tmp_path / "emb"))
    want = emb(idx).detach().numpy()
    np.testing.assert_allclose(prog(idx.numpy()), want, rtol=1e-6)
    with pytest.raises(IndexError, match="index 12 is out of range for dimension 0 of size 10"):
        prog(np.array([1, 12, 3]))
    np.testing.assert_allclose(prog(idx.numpy()), want, rtol=1e-6)


@pytest.mark.parametrize("case, env, match", [
    ("no device", {"CHROMA_METAL_FAKE_NO_DEVICE": "1"}, r"no Metal GPU can run it here: .*no Metal GPU"),
    ("SIMD width", {"CHROMA_METAL_FAKE_SIMD_WIDTH": "64"}, r"runs SIMD groups of 64 threads; Chroma's Metal kernels assume 32"),
    ("threads", {"CHROMA_METAL_FAKE_MAX_THREADS": "32"}, r"kernel chroma_k0_main runs \d+ threads per threadgroup; .* allows 32"),
    ("buffer size", {"CHROMA_METAL_FAKE_MAX_BUFFER": "1024"}, r"a buffer of \d+ bytes is larger than .* allows in one buffer"),
    ("kernels", {"CHROMA_METAL_FAKE_KERNELS": "/nonexistent.so"}, r"newLibrary .* failed: fake Metal: CHROMA_METAL_FAKE_KERNELS"),
])
def test_what_the_device_cannot_run_is_refused_at_load(tmp_path, fake_metal, monkeypatch, case, env, match):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32), torch.nn.Softmax(-1)).eval()
    fake_metal(m, (randn(5, 64),), tmp_path / "m")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(simt.RunError, match=match):
        chroma.load(str(tmp_path / "m"))
    assert _counts(tmp_path / "m") == (0, 0)  # a failed load releases what it made


def test_cuda_only_options_and_inputs_are_refused(tmp_path, fake_metal):
    lin = torch.nn.Linear(4, 3).eval()
    x = randn(2, 4)
    fake_metal(lin, (x,), tmp_path / "lin")
    with pytest.raises(ValueError, match="graph=True is CUDA's"):
        chroma.load(str(tmp_path / "lin"), cuda_graph=True)
    prog = chroma.load(str(tmp_path / "lin"))

    class OnACudaDevice:
        __cuda_array_interface__ = {"shape": (2, 4), "typestr": "<f4", "data": (0, False), "version": 3}

    with pytest.raises(ValueError, match="a CUDA device array; the Metal runtime takes host arrays"):
        prog(OnACudaDevice())
    with pytest.raises(TypeError):
        prog(x.numpy(), device_outputs=True)
    compare(prog(x.numpy()), lin(x), rtol=1e-5, atol=1e-6)


def test_without_metal_cpp_the_artifact_says_how_to_get_a_host_library(tmp_path, monkeypatch):
    monkeypatch.delenv("CHROMA_METAL_CPP", raising=False)
    with torch.no_grad():
        prog = chroma.compile(torch.nn.Linear(4, 3).eval(), (randn(2, 4),), target="metal", out=str(tmp_path / "m"))
    assert prog.manifest["metal"]["host"] is None and "CHROMA_METAL_CPP is not set" in prog.manifest["metal"]["why"]
    monkeypatch.setenv("CHROMA_METAL_CPP", str(tmp_path))  # no metal-cpp there
    with pytest.raises(chroma.CompileError, match=r"CHROMA_METAL_CPP=.*: no Metal/Metal.hpp and Foundation/Foundation.hpp"):
        chroma.compile(torch.nn.Linear(4, 3).eval(), (randn(2, 4),), target="metal", out=str(tmp_path / "m2"))


def test_inspect_says_whether_the_artifact_has_a_metal_host_library(tmp_path, fake_metal, monkeypatch, capsys):
    from chroma import cli

    fake_metal(torch.nn.Linear(4, 3).eval(), (randn(2, 4),), tmp_path / "with")
    cli.main(["inspect", str(tmp_path / "with")])
    assert "Metal host library model-" in capsys.readouterr().out
    monkeypatch.delenv("CHROMA_METAL_CPP")
    with torch.no_grad():
        chroma.compile(torch.nn.Linear(4, 3).eval(), (randn(2, 4),), target="metal", out=str(tmp_path / "without"))
    cli.main(["inspect", str(tmp_path / "without")])
    assert "Metal host library: none (CHROMA_METAL_CPP is not set" in capsys.readouterr().out
