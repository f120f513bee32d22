"""The CUDA and Metal targets end to end (docs/gpu_generator.md;
docs/cuda.md, "The emulator" and "Tests"): the GPU generator's kernels in its CUDA and MSL
dialects, one translation unit per model (kernels.cu, kernels.metal), run here on the CPU SIMT
emulator (include/chroma/simt; chroma.load(..., emulate=True)) against PyTorch, in both
invocation orders (the reverse order exposes a missing barrier); the CUDA text also compiled by
nvcc for every listed architecture with spill warnings as errors. Metal's text has no compiler
on Linux: it runs on the emulator only (docs/cuda.md).

The op families themselves run on these targets through the shared suite
(CHROMA_TEST_TARGET=cuda or metal, conftest.py; a case the target refuses is skipped with the
target's reason). Tolerances: the emulator computes in float32 with the host's libm, in the
kernels' own summation order.
"""

import ctypes
import json
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
from chroma.runtime import emulator as simt  # noqa: E402

def _compile(model, inputs, tmp_path, name="m", target="cuda"):
    with torch.no_grad():
        return chroma.compile(model, inputs, target=target, out=str(tmp_path / name))


def _compiled_text(directory, target):
    """The target's own check of its translation unit: for CUDA, the fatbin nvcc built at
    compile time for every listed architecture, spill-free, embedded in the host library;
    nothing runs Metal's compiler here (no Linux build; test_msl_check.py type-checks it)."""
    if target == "cuda":
        _fatbin(directory)
    else:
        text = open(os.path.join(directory, "kernels.metal")).read()
        assert "#include <metal_stdlib>" in text and "kernel void chroma_main(" in text
        assert "#define chroma_main chroma_k0_main" in text  # unique kernel names


def _nvcc():
    return shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def _fatbin(directory):
    """kernels.cu -> kernels.fatbin (sm_80, sm_90 cubins, compute_90 PTX) with no ptxas spill
    warnings, and the host library holding exactly those bytes."""
    if _nvcc() is None:
        pytest.skip("nvcc is not installed (CUDA toolkit): the generated CUDA is only compiled where it is")
    m = json.load(open(os.path.join(directory, "manifest.json")))["cuda"]
    fb = m["fatbin"]
    assert fb is not None, m
    for arch in ("code=sm_80", "code=sm_90", "code=compute_90"):
        assert any(arch in a for a in fb["architectures"]), fb
    assert fb["ptxas_spills"] == "", fb["ptxas_spills"]
    data = open(os.path.join(directory, fb["file"]), "rb").read()
    assert len(data) == fb["bytes"] > 0
    lib = ctypes.CDLL(os.path.join(directory, m["host"]["library"]))
    lib.chroma_cuda_fatbin_bytes.restype = ctypes.c_uint64
    assert lib.chroma_cuda_fatbin_bytes() == len(data)
    text = open(os.path.join(directory, "kernels.cu")).read()
    for i in range(m["modules"]):  # the names the host runtime looks up
        assert f"#define chroma_main chroma_k{i}_main" in text
    return m


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


# Full tier: a whole network on the emulator (the sampled op suite runs its kernels in the guarding tier).
@pytest.mark.full
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


# Full tier: the reference model on the emulator, 25 s per target (its kernels run in the sampled op suite).
@pytest.mark.full
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


def test_loading_without_a_gpu_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("CHROMA_METAL_CPP", raising=False)  # no Metal host library: the emulator only
    _compile(torch.nn.Linear(4, 3).eval(), (randn(2, 4),), tmp_path, "lin")
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has an NVIDIA GPU: the no-GPU error cannot happen here")
    with pytest.raises(simt.RunError, match=r"no NVIDIA GPU.*emulate=True"):
        chroma.load(str(tmp_path / "lin"))
    _compile(torch.nn.Linear(4, 3).eval(), (randn(2, 4),), tmp_path, "linm", "metal")
    with pytest.raises(simt.RunError, match=r"Metal artifact was compiled without its host library \(CHROMA_METAL_CPP is "
                                            r"not set.*emulate=True"):
        chroma.load(str(tmp_path / "linm"))


def test_unsupported_ops_are_all_listed_with_source_lines(tmp_path):
    def f(i, m):
        return i + 2**40, torch.linalg.det(m)  # an int64 literal beyond 32 bits; a factorization

    with pytest.raises(chroma.UnsupportedError) as e:  # a CompileError: the target lacks what they need
        chroma.compile(f, (torch.arange(4), randn(3, 3)), target="cuda", out=str(tmp_path / "u"))
    msg = str(e.value)
    assert "2 part(s) of the program cannot be compiled for it" in msg, msg
    assert len(e.value.refusals) == 2 and all(r[1] and r[3] for r in e.value.refusals), e.value.refusals
    assert "1099511627776 does not fit in 32 bits" in msg and "test_cuda.py" in msg, msg
    assert "Linalg.lu" in msg and "not available on GPU targets" in msg, msg


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
    with pytest.raises(chroma.ArtifactError, match="emulator.s library.*missing"):
        chroma.load(str(tmp_path / "lin"), emulate=True)


def _has_gpu():
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


def _native(out, target="cuda"):
    """[the CUDA artifact in `out` loaded on the GPU] where this machine has one (the device
    check, scripts/gpu_check.sh, runs these tests there), else []."""
    return [chroma.load(str(out))] if target == "cuda" and _has_gpu() else []


def test_native_runtime_on_a_gpu_or_a_clear_error(tmp_path):
    """The native CUDA runtime (chroma.runtime.native): on a machine with an NVIDIA GPU, the transformer
    block against PyTorch with per-dispatch launches and as one CUDA graph, device outputs and
    device inputs (via torch.cuda when present); anywhere else the host library's own error
    (the driver or the GPU missing), which names emulate=True."""
    torch.manual_seed(0)
    m, x = Block().eval(), randn(2, 16, 32)
    _compile(m, (x,), tmp_path, "blk")
    man = _fatbin(str(tmp_path / "blk"))
    with torch.no_grad():
        want = m(x)
    from chroma.runtime import native as cuda
    from chroma.runtime.webgpu import read_package

    lib = str(tmp_path / "blk" / man["host"]["library"])
    pkg = read_package(str(tmp_path / "blk.chroma-cuda"))
    if not _has_gpu():
        with pytest.raises(simt.RunError, match=r"no NVIDIA GPU can run it here: .*(libcuda|driver|device)"):
            cuda.CudaProgram(pkg, lib)
        return
    for graph in (False, True):
        prog = chroma.load(str(tmp_path / "blk"), cuda_graph=graph)
        assert isinstance(prog, cuda.CudaProgram), prog
        for _ in range(3):  # graph mode: direct launches, then capture, then replay
            compare(prog(x.numpy()), want, rtol=1e-4, atol=1e-5)
        d = prog(x.numpy(), device_outputs=True)
        compare(d.numpy(), want, rtol=1e-4, atol=1e-5)
        if torch.cuda.is_available():
            xd = x.cuda()
            compare(prog(xd), want, rtol=1e-4, atol=1e-5)
            compare(torch.as_tensor(d, device="cuda").cpu().numpy(), want, rtol=1e-4, atol=1e-5)
        print(prog.info)
        prog.close()
        with pytest.raises(simt.RunError, match="closed"):
            prog(x.numpy())


def test_a_cuda_artifact_without_nvcc_runs_emulated_and_says_why_not_natively(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CHROMA_NVCC", "off")
    prog = _compile(torch.nn.Linear(4, 3).eval(), (randn(2, 4),), tmp_path, "lin")
    assert prog.manifest["cuda"]["fatbin"] is None and prog.manifest["cuda"]["why"] == "CHROMA_NVCC=off"
    assert not (tmp_path / "lin" / "kernels.fatbin").exists()
    from chroma.runtime import native as cuda
    from chroma.runtime.registry import LoadOptions

    with pytest.raises(simt.RunError, match=r"compiled without nvcc \(CHROMA_NVCC=off\).*emulate=True"):
        cuda.load_artifact(str(tmp_path / "lin"), prog.manifest, "manifest.json", LoadOptions())
    from chroma import cli

    cli.main(["inspect", str(tmp_path / "lin")])
    assert "fatbin: none (CHROMA_NVCC=off): runs on the emulator only" in capsys.readouterr().out


def test_fp32_products_are_not_tf32(tmp_path):
    """The TF32 check: a K = 4096 product of random numbers against float64. FP32 accumulation
    lands near 1e-6 relative error, TF32's 10-bit mantissa near 3e-4; the bound 2e-5 tells them
    apart. On the emulator here, and natively where there is a GPU."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 4096, generator=g), torch.randn(4096, 16, generator=g)
    prog = _compile(lambda x, w: x @ w, (a, b), tmp_path, "mm")
    assert prog.stats["library_calls"] == 1  # cuBLAS on a GPU, NumPy's sgemm on the emulator
    want = a.double() @ b.double()
    progs = [prog] + ([chroma.load(str(tmp_path / "mm"))] if _has_gpu() else [])
    for p in progs:
        got = torch.from_numpy(p(a.numpy(), b.numpy())).double()
        rel = float((got - want).norm() / want.norm())
        print(type(p).__name__, f"relative error {rel:.2e}")
        assert rel < 2e-5, rel


# Full tier: the decoder on the emulator, 24 s per target (the Metal host runtime test runs one in the guarding tier).
@pytest.mark.full
@pytest.mark.parametrize("target", TARGETS)
def test_kv_cache_decoder_cached_equals_uncached_before_and_after_the_wrap(tmp_path, target):
    """compile_decoder on the GPU targets: one package with two entry points (prefill, step)
    over one copy of the weights and the KV cache as device state. On the emulator (and on a
    GPU natively for CUDA when there is one): every cached step's logits equal the uncached
    model's over the same window, across three wraps of the 8-row cache."""
    from chroma.models import gpt_oss as g
    from test_gpt_oss import VARIANT, assert_logits_close

    m = g.build(**VARIANT)
    dec = chroma.compile_decoder(m, prompt_len=5, cache_size=8, out=str(tmp_path / "dec"), target=target)
    assert [e.name for e in dec.program.entries] == ["prefill", "step"]
    decs = [dec]
    if target == "cuda" and _has_gpu():
        decs.append(chroma.Decoder(chroma.load(str(tmp_path / "dec"))))
    toks = g.sample_tokens(m.cfg, 21, seed=3)
    for d in decs:
        with torch.no_grad():
            assert_logits_close(d.prefill(toks[:5].numpy()), m(toks[:5]))
            for p in range(5, 21):  # the cache wraps at positions 8, 16
                assert_logits_close(d.step(int(toks[p])), m(toks[: p + 1], max_window=8)[-1:])
    pkg = dec.program.package
    weights = sum(nb for _, nb in pkg.shards)  # one copy for both entries
    print(f"weights {weights} B for {sum(w.numel() * 4 for w in m.parameters())} B of parameters")
    assert weights < 1.25 * sum(w.numel() * 4 for w in m.parameters())


def test_a_webgpu_package_with_several_entries_is_refused_at_compile_time(tmp_path):
    from chroma.models import gpt_oss as g
    from test_gpt_oss import VARIANT

    with pytest.raises(chroma.CompileError, match="WebGPU package holds one entry point"):
        chroma.compile_decoder(g.build(**VARIANT), prompt_len=5, cache_size=8, out=str(tmp_path / "d"), target="webgpu")


@pytest.mark.parametrize("case", ["linear_gelu", "batched_bt", "broadcast_b", "transposed_a"])
def test_float32_products_through_the_library_gemm(tmp_path, monkeypatch, case):
    """Products with at least 64^3 multiply-adds over strided operands are library dispatches
    (cuBLAS on a GPU; NumPy's float32 matmul, the CPU BLAS, on the emulator), the fused
    epilogue a kernel after them; row- and column-major operands, batches, broadcast ones."""
    if not _has_gpu():  # the emulator alone: nvcc's fatbin would not run here
        monkeypatch.setenv("CHROMA_NVCC", "off")
    torch.manual_seed(0)
    if case == "linear_gelu":
        lin = torch.nn.Linear(128, 96)
        f, args = (lambda x: torch.nn.functional.gelu(lin(x))), (randn(4, 32, 128),)
    elif case == "batched_bt":
        f, args = (lambda a, b: (a @ b.transpose(1, 2)) * 0.5), (randn(3, 64, 80), randn(3, 72, 80, seed=1))
    elif case == "broadcast_b":
        f, args = (lambda a, b: a @ b), (randn(3, 64, 80), randn(80, 72, seed=1))
    else:
        f, args = (lambda a, b: a.transpose(1, 2) @ b), (randn(3, 80, 64), randn(3, 80, 72, seed=1))
    with torch.no_grad():
        prog = chroma.compile(f, args, target="cuda", out=str(tmp_path / "p"))
        want = f(*args)
    assert prog.stats["library_calls"] >= 1, prog.package.manifest["dispatches"]
    for p in [prog] + _native(tmp_path / "p"):  # cuBLAS on the GPU
        compare(p(*[a.numpy() for a in args]), want, rtol=1e-4, atol=1e-4)


class _RecordingHostLibrary:
    """Stands in for the artifact's CUDA host library (which needs a GPU; its entry points as chroma.runtime.native._Host
    binds them, chroma_cuda_<name> as .<name>): records each call's
    name and the arguments that name kernels and buffers, and succeeds."""

    def __init__(self):
        self.calls, self._entries = [], 0

    def entry(self, h):
        self._entries += 1
        return self._entries - 1

    def gemm(self, h, entry, batch, m, n, k, buffers, *rest):
        self.calls.append(("gemm", entry, (batch, m, n, k), list(buffers)))
        return 0

    def dispatch(self, h, entry, kernel, gx, gy, nslots, slots, nwords, words, *rest):
        self.calls.append(("kernel", entry, kernel, (gx, gy), list(slots)[:nslots], nwords))
        return 0

    def __getattr__(self, name):  # buffers and kernel loading: nothing to record
        return lambda *args: 0


def test_the_native_runtime_plans_every_dispatch_of_the_package_in_order(tmp_path, monkeypatch):
    """CudaProgram's setup turns the package's dispatches into host-library calls: each cuBLAS
    product (chroma_cuda_gemm) and each kernel after it (chroma_cuda_dispatch), in the
    manifest's order, with their buffers (0 the arena, 1 the state, 2+ the weight shards).
    Checked against a recording stand-in for the library, which needs a GPU; the first device
    run found a product's dispatch hiding the library from every kernel after it."""
    import types

    from chroma.runtime import native as cuda

    monkeypatch.setenv("CHROMA_NVCC", "off")
    lin = torch.nn.Linear(128, 96)
    with torch.no_grad():
        prog = chroma.compile(lambda x: torch.nn.functional.gelu(lin(x)) * 2, (randn(4, 32, 128),), target="cuda",
                              out=str(tmp_path / "p"))
    pkg = prog.package
    rec = _RecordingHostLibrary()
    fake = types.SimpleNamespace(package=pkg, _lib=rec, _h=None)
    fake._check = lambda rc, err: cuda.CudaProgram._check(fake, rc, err)
    fake._plan = lambda *a: cuda.CudaProgram._plan(fake, *a)
    fake._library_dispatch = lambda *a: cuda.CudaProgram._library_dispatch(fake, *a)
    fake._buffer_id = cuda.CudaProgram._buffer_id
    cuda.CudaProgram._setup(fake, pkg, ctypes.create_string_buffer(1024))
    want = []
    for d in pkg.entries[0].dispatches:
        ids = {n: 2 + b[1] if isinstance(b, tuple) else 0 if b == "arena" else 1 for n, b in d["bindings"].items()}
        if d["kernel"] < 0:
            g = d["library"]
            want.append(("gemm", 0, (g["batch"], g["m"], g["n"], g["k"]), [ids[n] for n in (1, 2, 3)]))
        else:
            want.append(("kernel", 0, d["kernel"], tuple(d["grid"][:2]), [ids[n] for n in sorted(ids)],
                         d["params"][2] // 4 if d["params"] else 0))
    kinds = [c[0] for c in rec.calls]
    assert kinds[0] == "gemm" and kinds.count("kernel") == len(kinds) - 1 >= 1, rec.calls  # the product, then the rest
    assert rec.calls == want


def test_a_library_dispatch_outside_its_buffer_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("CHROMA_NVCC", "off")
    prog = _compile(lambda a, b: a @ b, (randn(64, 80), randn(80, 72)), tmp_path, "mm")
    pkg = prog.package
    d = next(x for x in pkg.manifest["dispatches"] if "library" in x)
    pkg._check_dispatch(d, "ok")  # as written
    bad = json.loads(json.dumps(d))
    bad["library"]["c"]["word"] = pkg.arena_bytes // 4
    with pytest.raises(simt.PackageError, match=r"library.c: addresses word .* beyond its buffer"):
        pkg._check_dispatch(bad, "dispatch")
    bad = json.loads(json.dumps(d))
    bad["library"]["a"]["row_stride"] = 3
    with pytest.raises(simt.PackageError, match="row- or column-major"):
        pkg._check_dispatch(bad, "dispatch")
    bad = json.loads(json.dumps(d))
    bad["bindings"][2]["buffer"], bad["bindings"][2]["shard"] = "weights", 0
    with pytest.raises(simt.PackageError, match="bound read-write"):
        pkg._check_dispatch(bad, "dispatch")


def test_chroma_cuda_archs_selects_the_fatbin_architectures(tmp_path, monkeypatch):
    if _nvcc() is None:
        pytest.skip("nvcc is not installed (CUDA toolkit): the generated CUDA is only compiled where it is")
    monkeypatch.setenv("CHROMA_CUDA_ARCHS", "90")
    prog = _compile(torch.nn.Linear(4, 3).eval(), (randn(2, 4),), tmp_path, "lin")
    fb = prog.manifest["cuda"]["fatbin"]
    assert fb["architectures"] == ["-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_90,code=compute_90"]
    monkeypatch.setenv("CHROMA_CUDA_ARCHS", "sm_90")
    with pytest.raises(chroma.CompileError, match="CHROMA_CUDA_ARCHS='sm_90': expected compute capabilities"):
        _compile(torch.nn.Linear(4, 3).eval(), (randn(2, 4),), tmp_path, "lin2")


class _HalfWeights(torch.nn.Module):
    """An embedding, a product with many rows (the tiled kernel), one with a single row (the
    memory-bound kernel), stacked expert matrices read through a batched product, a router."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(100, 64)
        self.l1 = torch.nn.Linear(64, 96)
        self.l2 = torch.nn.Linear(64, 80)
        self.experts = torch.nn.Parameter(torch.randn(3, 96, 32) / 10)
        self.gate = torch.nn.Linear(96, 4)
        self.out = torch.nn.Linear(96, 100, bias=False)

    def forward(self, t, v):
        h = torch.relu(self.l1(self.emb(t)))
        e = torch.matmul(h, self.experts)  # [3, T, 32]: one matrix per expert, h broadcast
        return self.out(h), self.gate(h), self.l2(v), e


@pytest.mark.parametrize("target", ["webgpu", *TARGETS])
def test_bfloat16_weights_on_gpu_targets(tmp_path, target):
    """weights="bf16" on a GPU target: every product and embedding weight stored in bfloat16
    (half the bytes), widened inside the kernels that read it, so the result equals float32
    PyTorch run with the same rounded weights up to summation order; the router stays float32
    (keep-list), every decision is in the manifest, and the grouped integer formats are
    refused naming the weight."""
    import copy

    torch.manual_seed(0)
    m = _HalfWeights().eval()
    t, v = torch.tensor([3, 7, 1, 99, 0, 42, 5, 8, 9, 11, 12, 13]), torch.randn(1, 64)
    rounded = copy.deepcopy(m)
    with torch.no_grad():
        for n, p in rounded.named_parameters():
            if p.ndim >= 2 and "gate" not in n:
                p.copy_(p.bfloat16().float())
        ref = [r.numpy() for r in rounded(t, v)]
        exact = [r.numpy() for r in m(t, v)]
    out = str(tmp_path / "m")
    prog = chroma.compile(m, (t, v), target=target, out=out, weights="bf16")
    for p in [prog] + _native(out, target):
        for g, r, x in zip(p(t.numpy(), v.numpy()), ref, exact):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5 * np.abs(r).max())
            assert np.abs(g - x).max() > 1e-5 * np.abs(x).max()  # the rounding is really there
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    w = manifest["options"]["weights"]
    formats = {d["name"]: (d["format"], d["bytes"], d["bytes_fp32"]) for d in w["decisions"]}
    assert formats["gate.weight"][0] == "fp32"
    for name in ("emb.weight", "l1.weight", "l2.weight", "experts", "out.weight"):
        fmt, stored, f32 = formats[name]
        assert fmt == "bf16" and 2 * stored == f32, (name, formats[name])
    assert w["activations"] == "fp32"
    assert manifest["accuracy"]["outputs"][0]["rel_l2"] < 5e-3  # against float32 PyTorch
    if target == "webgpu":
        _node_check_package(out)


class _GroupedWeights(torch.nn.Module):
    """Products whose K is a multiple of 64 (q formats) and one whose K is not (bf16)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(100, 64)
        self.l1 = torch.nn.Linear(64, 128)
        self.experts = torch.nn.Parameter(torch.randn(3, 128, 32) / 10)
        self.out = torch.nn.Linear(128, 100, bias=False)
        self.l2 = torch.nn.Linear(64, 80)
        self.l3 = torch.nn.Linear(80, 72)

    def forward(self, t, v):
        h = torch.relu(self.l1(self.emb(t)))
        return self.out(h), torch.matmul(h, self.experts), self.l3(self.l2(v))


@pytest.mark.parametrize("target", ["webgpu", *TARGETS])
def test_grouped_weights_on_gpu_targets(tmp_path, target):
    """q8, q6 and q4 (MLX groups of 64 along K, quant::pack_rows rows) on a GPU target: the
    kernels dequantize inside their loads, so the result equals float32 PyTorch run with the
    weights each format stands for (chroma.quantization.quant.simulate, checked against MLX's formula in
    test_quant.py) up to summation order, in the tiled kernel (12 rows), the memory-bound one
    (1 row), a batched product and the embedding gather; a product whose K is not a multiple
    of 64 takes bf16 and the manifest says why."""
    from chroma.quantization.quant import simulate

    torch.manual_seed(0)
    m = _GroupedWeights().eval()
    t, v = torch.tensor([3, 7, 1, 99, 0, 42, 5, 8, 9, 11, 12, 13]), torch.randn(1, 64)
    policy = {"default": "q4", "l1.weight": "q8", "out.weight": "q6", "emb.weight": "q8"}
    expected = {"emb.weight": "q8", "l1.weight": "q8", "experts": "q4", "out.weight": "q6", "l2.weight": "q4",
                "l3.weight": "bf16"}
    ref_model = _GroupedWeights().eval()
    ref_model.load_state_dict(m.state_dict())
    with torch.no_grad():
        for name, p in ref_model.named_parameters():
            fmt = expected.get(name)
            if fmt is None:
                continue
            w = p.detach().numpy()
            if name == "experts":  # [E, K, N]: rows of K are its columns
                q = simulate(w.transpose(0, 2, 1).reshape(-1, w.shape[1]), fmt).reshape(3, 32, 128).transpose(0, 2, 1)
            else:
                q = simulate(w, fmt)
            p.copy_(torch.from_numpy(np.ascontiguousarray(q)))
        ref = [r.numpy() for r in ref_model(t, v)]
    out = str(tmp_path / "m")
    _compile_and_compare(m, (t, v), ref, target, out, policy)
    w = json.load(open(os.path.join(out, "manifest.json")))["options"]["weights"]
    dec = {d["name"]: d for d in w["decisions"]}
    assert {n: d["format"] for n, d in dec.items() if n in expected} == expected
    assert "not a multiple of 64" in dec["l3.weight"]["reason"]
    assert dec["l1.weight"]["bytes"] == 128 * (64 + 4)  # 128 rows, one group of 64 bytes + header
    if target == "webgpu":
        _node_check_package(out)
    else:
        _compiled_text(out, target)  # nvcc for every listed architecture, spill-free


def _compile_and_compare(m, inputs, ref, target, out, weights):
    """Compiles `m` with a weights policy and compares each output with `ref` (float32 PyTorch
    with the weights the formats stand for) up to summation order."""
    prog = chroma.compile(m, inputs, target=target, out=out, weights=weights)
    for p in [prog] + _native(out, target):
        for g, r in zip(p(*[i.numpy() for i in inputs]), ref):
            np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-5 * np.abs(r).max())
    return prog


def _node_check_package(out):
    """Dawn (Tint) validates every module of the package and runs its self-check."""
    from test_webgpu import _node_check

    pkg = os.path.join(os.path.dirname(out), os.path.basename(out) + ".chroma-web")
    _node_check(pkg)


def _rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _softmax_by_hand(x, w):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True) * w


def _centered_scaled(x, w):  # two reductions of the same rows, the second reads the first
    c = x - x.mean(-1, keepdim=True)
    return c / (c.abs().amax(-1, keepdim=True) + 1) + w


def _transposed_read(x, w):  # the reduction's result read at another row: not one dispatch
    s = x.sum(-1, keepdim=True)
    return x * s.transpose(0, 1) + w


def _bf16_rms_norm(x, w):  # a half-type reduction result, rounded as stored
    h = x.bfloat16()
    return (h * torch.rsqrt(h.pow(2).sum(-1, keepdim=True) + 1)).float() * w


# (function, shape of x, dispatches): a reduction and the kernels that finish its rows run as
# one dispatch (reductions.cpp row_group); the last case must not be grouped.
ROW_GROUP_CASES = {
    "rms_norm": (_rms_norm, (6, 700), 1),
    "functional_rms_norm": (lambda x, w: torch.nn.functional.rms_norm(x, (200,), w, 1e-5), (2, 3, 200), 1),
    "layer_norm": (lambda x, w: torch.nn.functional.layer_norm(x, (200,), w, w * 0.5), (5, 200), 1),
    "softmax_by_hand": (_softmax_by_hand, (4, 700), 1),
    "centered_scaled": (_centered_scaled, (3, 200), 1),
    "bf16_rms_norm": (_bf16_rms_norm, (4, 200), 1),
    "transposed_read": (_transposed_read, (200, 200), 2),
}


@pytest.mark.parametrize("target", ["webgpu", *TARGETS])
@pytest.mark.parametrize("case", sorted(ROW_GROUP_CASES))
def test_normalizations_run_as_one_dispatch(tmp_path, case, target):
    """RMSNorm, LayerNorm and the like: the row's reductions and the elementwise work that reads
    their results run in one dispatch, one workgroup per row, against PyTorch (on the emulator
    in both invocation orders too: a missing barrier between the phases shows there)."""
    torch.manual_seed(0)
    f, shape, dispatches = ROW_GROUP_CASES[case]
    x, w = randn(*shape), randn(shape[-1])
    prog = _compile(f, (x, w), tmp_path, target=target)
    with torch.no_grad():
        want = f(x, w)
    tol = dict(rtol=2e-2, atol=2e-2) if "bf16" in case else dict(rtol=1e-4, atol=1e-5)
    for p in [prog] + _native(tmp_path / "m", target):
        compare(p(x.numpy(), w.numpy()), want, **tol)
    if target != "webgpu":
        rev = chroma.load(str(tmp_path / "m"), emulate=True, reverse=True)
        compare(rev(x.numpy(), w.numpy()), want, **tol)
    elif "bf16" not in case:
        # Dawn: Tint validates both texts of each module, the self-check compares the golden
        # outputs at float32 tolerance (which one bfloat16 ulp, 0.4%, exceeds: the bf16 case
        # is compared above at its own tolerance)
        _node_check_package(str(tmp_path / "m"))
    st = prog.stats
    if dispatches is not None:
        assert st["dispatches"] == dispatches, (st, case)
    assert st["dispatches"] <= st["cpu_kernels"], st


class _FewRows(torch.nn.Module):
    """Memory-bound products (at most 8 rows) of grouped weights: 4 columns per invocation
    (4,100 of them) over 3 groups, 1 column per invocation with a bias, a batch of experts."""

    def __init__(self):
        super().__init__()
        self.wide = torch.nn.Linear(192, 4100, bias=False)
        self.narrow = torch.nn.Linear(128, 70)
        self.experts = torch.nn.Parameter(torch.randn(3, 40, 128) / 10)  # [E, N, K], as gpt-oss's mlp1

    def forward(self, x, y):
        return self.wide(x), self.narrow(y), torch.einsum("th,efh->tef", y, self.experts)


@pytest.mark.parametrize("target", ["webgpu", *TARGETS])
@pytest.mark.parametrize("fmt", ["q8", "q6", "q4"])
def test_grouped_weights_in_few_row_products_a_group_at_a_time(tmp_path, target, fmt):
    """The memory-bound product reads a grouped weight a group at a time (products.cpp
    grouped_rows: the header once per 64 weights, each word of values once, q6's values
    straddling words): the result equals float32 PyTorch with the weights the format stands
    for (chroma.quantization.quant.simulate), as the per-weight path computes it."""
    from chroma.quantization.quant import simulate

    torch.manual_seed(0)
    m = _FewRows().eval()
    x, y = randn(2, 192), randn(3, 128)
    ref_model = _FewRows().eval()
    ref_model.load_state_dict(m.state_dict())
    with torch.no_grad():
        for name, p in ref_model.named_parameters():
            if p.ndim < 2:
                continue
            w = p.detach().numpy()
            p.copy_(torch.from_numpy(simulate(w.reshape(-1, w.shape[-1]), fmt).reshape(w.shape)))
        ref = [r.numpy() for r in ref_model(x, y)]
    out = str(tmp_path / "m")
    prog = _compile_and_compare(m, (x, y), ref, target, out, fmt)
    if target == "webgpu":
        codes = [k["code"] for k in prog.package.manifest["kernels"]]
        assert sum("let qw" in c for c in codes) >= 2, "no product read its weight a group at a time"
        _node_check_package(out)


class _SplitK(torch.nn.Module):
    """Products whose columns alone launch few invocations (a decoder's projections at a few
    tokens), so products.cpp splits K over the workgroup: 160 columns over K = 128 (8 slices
    of 16), 12 columns over K = 90 (4 slices: 23, 23, 23, 21), 3 columns of 40 rows over
    K = 256 (the few-columns side), and 3 experts of 40 columns (one product of 120 columns)."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(128, 160)
        self.gate = torch.nn.Linear(90, 12)
        self.tall = torch.nn.Parameter(torch.randn(256, 3) / 16)
        self.experts = torch.nn.Parameter(torch.randn(3, 40, 128) / 10)

    def forward(self, x, y, z):
        return self.qkv(x), self.gate(y), z @ self.tall, torch.einsum("th,efh->tef", x, self.experts)


# (workgroup size, grid) of each product's dispatch: Wc columns x S slices, ceil(L / Wc) x batch
_SPLIT_K_DISPATCHES = [(256, 5), (64, 1), (256, 2), (256, 4)]


@pytest.mark.parametrize("target", ["webgpu", *TARGETS])
def test_few_row_products_split_k_over_the_workgroup(tmp_path, target):
    """The memory-bound product splits K over its workgroup when the columns alone would launch
    few invocations; every slice's partial sums meet in workgroup memory (after the staged
    operand's last read) and each row's are added by one slice. Against float64 PyTorch, on the emulator in both orders
    (a missing barrier shows in the reverse one), each product's dispatch in the split shape."""
    torch.manual_seed(0)
    m = _SplitK().eval()
    x, y, z = randn(8, 128), randn(3, 90), randn(40, 256)
    with torch.no_grad():
        want = m.double()(x.double(), y.double(), z.double())
        m.float()
    prog = _compile(m, (x, y, z), tmp_path, target=target)
    runs = [prog] + _native(tmp_path / "m", target)
    if target != "webgpu":
        runs.append(chroma.load(str(tmp_path / "m"), emulate=True, reverse=True))
    for p in runs:
        for g, w in zip(p(x.numpy(), y.numpy(), z.numpy()), want):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5 * w.abs().max().item())
    pkg = prog.package
    got = [(pkg.manifest["kernels"][d["kernel"]]["workgroup_size"][0], d["grid"][0])
           for d in pkg.entries[0].dispatches if d["label"].startswith("MatMul")]
    assert got == _SPLIT_K_DISPATCHES, [(d["label"], d["grid"]) for d in pkg.entries[0].dispatches]
    if target == "webgpu":
        _node_check_package(str(tmp_path / "m"))



def test_split_k_can_be_turned_off_for_the_device_benchmarks_a_b(tmp_path, monkeypatch):
    """CHROMA_GPU_SPLIT_K=off (bench/cuda_gpu.py's "fp32-nosplit" variant) compiles the few-rows
    product without the split: one column per invocation over all of K, the same results."""
    torch.manual_seed(0)
    m = _SplitK().eval()
    x, y, z = randn(8, 128), randn(3, 90), randn(40, 256)
    monkeypatch.setenv("CHROMA_GPU_SPLIT_K", "off")
    monkeypatch.setenv("CHROMA_NVCC", "off")
    prog = _compile(m, (x, y, z), tmp_path)
    with torch.no_grad():
        want = m(x, y, z)
    for g, w in zip(prog(x.numpy(), y.numpy(), z.numpy()), want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5 * w.abs().max().item())
    pkg = prog.package
    got = [(pkg.manifest["kernels"][d["kernel"]]["workgroup_size"][0], d["grid"][0])
           for d in pkg.entries[0].dispatches if d["label"].startswith("MatMul")]
    assert got == [(256, 1), (64, 1), (64, 1), (128, 1)], got

def _scans(x, xi, y):
    """Scans of long rows (reductions.cpp t_scan: one workgroup per row from 64 elements) and
    short ones, along the last axis and another."""
    return (torch.cumsum(x, -1), torch.cumprod(1 + x / 64, -1), torch.cummax(x, -1)[0], torch.cummin(x.t(), 0)[0],
            torch.logcumsumexp(y, -1), torch.cumsum(xi, -1), torch.logcumsumexp(y[:, :40], -1),
            torch.cumsum(x[:, :64], -1))


@pytest.mark.parametrize("target", ["webgpu", *TARGETS])
def test_scans_of_long_rows_run_a_workgroup_per_row(tmp_path, target):
    """cumsum, cumprod, cummax, cummin (along axis 0) and logcumsumexp over rows of 1,000 (250
    chunks of 4 for 256 invocations, the last 6 empty) and of 64: one workgroup per row,
    against PyTorch in float64 (sums and products in another order than PyTorch's sequential
    one: within 1e-5 of the prefix), integers exactly. logcumsumexp with equal neighbours
    (log 2 apart) and infinities, in the long and the short form."""
    torch.manual_seed(0)
    x = randn(3, 1000)
    xi = torch.randint(-1000, 1000, (3, 1000), dtype=torch.int32)
    y = torch.randn(2, 1000)
    y[:, 10:20] = 0.5  # equal neighbours: log(2 e^0.5), ...
    y[0, 30], y[1, 500], y[1, 501] = float("-inf"), float("inf"), float("inf")
    y[:, 0] = float("-inf")  # a row that starts at -inf
    prog = _compile(_scans, (x, xi, y), tmp_path, target=target)
    want = _scans(x.double(), xi, y.double())
    runs = [prog] + _native(tmp_path / "m", target)
    if target != "webgpu":
        runs.append(chroma.load(str(tmp_path / "m"), emulate=True, reverse=True))
    for p in runs:
        got = p(x.numpy(), xi.numpy(), y.numpy())
        for i, (g, w) in enumerate(zip(got, want)):
            w = w.numpy()
            if w.dtype == np.int32:
                np.testing.assert_array_equal(g, w)
                continue
            scale = np.maximum.accumulate(np.abs(np.nan_to_num(w, posinf=0, neginf=0)), axis=-1 if i != 3 else 0)
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * scale.max(), err_msg=f"output {i}")
    pkg = prog.package
    scans = [(pkg.manifest["kernels"][d["kernel"]]["workgroup_size"][0], d["grid"][0])
             for d in pkg.entries[0].dispatches if d["label"].startswith("Scan")]
    # a workgroup per row: 5 scans of 3 rows of 1,000, 2 of 1,000, 3 of 64; the short rows
    # (40): an invocation per row, both in one workgroup
    want_dispatches = [(256, 3)] * 5 + [(256, 2), (64, 3), (256, 1)]
    assert sorted(scans) == sorted(want_dispatches), [(d["label"], d["grid"]) for d in pkg.entries[0].dispatches]


def _index_adds(base, idx, src, ibase, iidx, isrc, base3, idx3, src3):
    return (torch.index_add(base, 0, idx, src), torch.index_add(ibase, 0, iidx, isrc),
            torch.index_add(base3, 1, idx3, src3, alpha=2.0), base.index_put((idx[:20],), src[:20], accumulate=True))


@pytest.mark.parametrize("target", ["webgpu", *TARGETS])
def test_accumulating_index_put_of_many_values_runs_a_workgroup_per_row(tmp_path, target):
    """index_add and index_put(accumulate=True) with many values (indexing.cpp t_index_put):
    300 values into 100 rows of 70 (W = 128: three chunks, the last of 44), int32 exactly, along
    axis 1 of a 3-d tensor (100 values into [2, 40, 33]); repeated indices folded in index
    order, as PyTorch's CPU kernel does (float32: within 1e-6 of it); 20 values take the
    compare-every-index form. An index out of range names itself and leaves the next call clean."""
    torch.manual_seed(0)
    args = (randn(100, 70), torch.randint(0, 100, (300,)), randn(300, 70),
            torch.randint(-100, 100, (50, 40), dtype=torch.int32), torch.randint(0, 50, (200,)),
            torch.randint(-100, 100, (200, 40), dtype=torch.int32),
            randn(2, 40, 33), torch.randint(0, 40, (100,)), randn(2, 100, 33))
    prog = _compile(_index_adds, args, tmp_path, target=target)
    want = _index_adds(*args)
    runs = [prog] + _native(tmp_path / "m", target)
    if target != "webgpu":
        runs.append(chroma.load(str(tmp_path / "m"), emulate=True, reverse=True))
    for p in runs:
        for g, w in zip(p(*[a.numpy() for a in args]), want):
            if w.dtype == torch.int32:
                np.testing.assert_array_equal(g, w.numpy())
            else:
                np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-6)
    pkg = prog.package
    got = sorted((pkg.manifest["kernels"][d["kernel"]]["workgroup_size"][0], d["grid"][0])
                 for d in pkg.entries[0].dispatches if d["label"].startswith("IndexPut"))
    # a workgroup per destination row: 100 rows of 70 (W 128), 50 of 40 and 2 x 40 of 33 (W 64);
    # the 20 values: an invocation per destination element (28 x 256); each result's base
    # first copied by its own dispatch (28, 8, 11 and 28 workgroups of 256)
    assert got == sorted([(128, 100), (64, 50), (64, 80), (256, 28), (256, 28), (256, 8), (256, 11), (256, 28)]), got
    bad = [a.numpy().copy() for a in args]
    bad[1][7] = 100
    with pytest.raises(IndexError, match="index 100 is out of range for dimension 0 of size 100"):
        prog(*bad)
    for g, w in zip(prog(*[a.numpy() for a in args]), want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-6)
