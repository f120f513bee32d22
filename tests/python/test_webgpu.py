"""The WebGPU target end to end: models against PyTorch in Python (wgpu on lavapipe) and in
Node (Dawn on SwiftShader, which also validates every module with Tint), the package's
self-check, expected errors (unsupported ops listed at once with source lines, corrupt
packages), golden WGSL, and the CUDA dialect of the same generator through nvcc.

The op families themselves run on this target through the shared suite
(CHROMA_TEST_TARGET=webgpu, conftest.py). Tolerances are stated per test: float32 on a
software GPU, whose exp/log/tanh differ from the CPU's libm by a few ulp and whose sums run
in a different order.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from conftest import compare, randint, randn  # noqa: E402

import chroma  # noqa: E402
from chroma.runtime import webgpu  # noqa: E402

os.environ.setdefault("VK_ICD_FILENAMES", "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NODE_CLI = os.path.join(ROOT, "web", "bin", "chroma-web.mjs")
GOLDEN = os.path.join(ROOT, "tests", "golden", "wgsl")


def _compile(model, inputs, tmp_path, name="m"):
    with torch.no_grad():
        return chroma.compile(model, inputs, target="webgpu", out=str(tmp_path / name))


def _node_check(package, *flags):
    """Loads the package in Node on Dawn (Tint compiles every module) and runs its self-check."""
    if shutil.which("node") is None or not os.path.isdir(os.path.join(ROOT, "web", "dist")):
        pytest.skip("the JS runtime is not built (cd web && npm ci && npm run build)")
    env = dict(os.environ, VK_ICD_FILENAMES="/usr/lib/chromium/vk_swiftshader_icd.json")  # Dawn rejects lavapipe
    r = subprocess.run(["node", NODE_CLI, "check", *flags, package], capture_output=True, text=True, timeout=600, env=env)
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and report["ok"], report
    return report


class Block(torch.nn.Module):
    """A pre-norm transformer block: layer norm, causal attention, GELU MLP, residuals."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.h = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / (d // self.h) ** 0.5
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


def test_transformer_block_python_and_node(tmp_path):
    torch.manual_seed(0)
    m, x = Block().eval(), randn(2, 16, 32)
    prog = _compile(m, (x,), tmp_path)
    compare(prog(x.numpy()), m(x), rtol=1e-4, atol=1e-5)
    assert prog.self_check()["ok"]
    st = prog.stats
    assert st["dispatches"] <= st["cpu_kernels"] + 2, st  # fused as on the CPU (index_put may take two)
    report = _node_check(str(tmp_path / "m.chroma-web"))
    assert report["maxError"] <= 1e-4


# Full tier: whole torchvision networks on lavapipe, 15 s each (their kernels run in the sampled op suite).
@pytest.mark.full
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small"])
def test_vision_models(tmp_path, name):
    import torchvision

    torch.manual_seed(0)
    m = getattr(torchvision.models, name)(num_classes=10).eval()
    x = randn(1, 3, 64, 64)
    prog = _compile(m, (x,), tmp_path, name)
    with torch.no_grad():
        want = m(x)
    # deep float32 networks: errors relative to the output's scale
    compare(prog(x.numpy()), want, rtol=1e-3, atol=1e-4 * float(want.abs().max()))
    _node_check(str(tmp_path / f"{name}.chroma-web"))


# (function, inputs, dispatches): what a product's epilogue may and may not take.
EPILOGUE_CASES = {
    # the root is a graph output that is also read later: written once, in place
    "output_read_again": (lambda a, b: (lambda y: (y, y * 2))(torch.relu(a @ b + 1)), ((20, 16), (16, 24)), 2),
    # two products into one add: the second takes the first's result as an operand
    "two_products": (lambda a, b, c, d: torch.tanh(a @ b + c @ d), ((20, 16), (16, 24), (20, 12), (12, 24)), 2),
    # an operand computed after the product in program order is not taken (the add runs alone)
    "later_operand": (lambda a, b, x: (lambda y: y + torch.sin(x).cumsum(-1))(a @ b), ((20, 16), (16, 24), (20, 24)), 3),
    # a batched product with a broadcast bias and a softmax after (the softmax is its own kernel)
    "batched_bias": (lambda a, b, c: torch.softmax(a @ b * 0.5 + c, -1), ((3, 20, 16), (3, 16, 24), (24,)), 2),
    # the product's result read twice by the epilogue (x * sigmoid(x)), then a residual
    "silu_residual": (lambda a, b, r: torch.nn.functional.silu(a @ b) + r, ((20, 16), (16, 24), (20, 24)), 1),
}


@pytest.mark.parametrize("case", sorted(EPILOGUE_CASES))
def test_product_epilogues(tmp_path, case):
    torch.manual_seed(0)
    f, shapes, dispatches = EPILOGUE_CASES[case]
    inputs = tuple(randn(*s) for s in shapes)
    prog = _compile(f, inputs, tmp_path)
    got = prog(*(x.numpy() for x in inputs))
    compare(got, f(*inputs), rtol=1e-4, atol=1e-5)
    assert prog.stats["dispatches"] == dispatches, prog.stats


def test_golden_data_within_budget(tmp_path):
    """Golden data stays small beside the weights: a large float32 input is generated from a
    seed (the same float32 bits in Python and in JS), a large output is stored sampled; both
    runtimes' self-checks pass on it."""
    from chroma.golden import golden_uniform
    from chroma.runtime.webgpu import read_package

    bits = golden_uniform(5, 7, -1.5, 2.25).view(np.uint32)  # the same literals as web/test/parse.test.mjs
    assert [int(b) for b in bits] == [0x3F2D0B9C, 0xBF108FBF, 0xBEDF6C6C, 0xBFA2F033, 0x3F48EF00]
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 256).eval()  # 257 KB of weights: a 64 KiB budget
    x, idx = randn(200, 256) * 3, torch.randint(0, 200, (4,))
    f = lambda x, i: (torch.tanh(lin(x)), x[i].sum())  # noqa: E731
    prog = _compile(f, (x, idx), tmp_path)
    g = read_package(str(tmp_path / "m.chroma-web")).manifest["golden"]
    gx, gi = g["inputs"]
    assert gx["generate"]["kind"] == "uniform" and "offset" not in gx
    assert abs(gx["generate"]["low"] - float(x.min())) < 1e-6 and abs(gx["generate"]["high"] - float(x.max())) < 1e-6
    assert "generate" not in gi and gi["bytes"] == 4 * 8  # integer inputs are stored
    assert g["outputs"][0]["stride"] > 1 and "stride" not in g["outputs"][1]
    assert sum(t.get("bytes", 0) for t in g["inputs"] + g["outputs"]) <= 64 << 10
    assert prog.self_check()["ok"]
    _node_check(str(tmp_path / "m.chroma-web"))


def test_reductions_have_subgroup_variants(tmp_path):
    """Workgroup reductions and softmax also come with subgroup operations (a kernel variant
    needing the "subgroups" feature): Dawn's SwiftShader offers them (subgroups of 4), so the
    package runs both ways in Node; Python (wgpu) runs the portable code."""
    torch.manual_seed(0)
    f = lambda x, n: (x.softmax(-1), x.log_softmax(0), x.sum(-1), x.prod(0) * 0 + x.mean(), n.sum(-1), n.amax(0))  # noqa: E731
    x, n = randn(6, 300), torch.randint(-50, 50, (70, 260), dtype=torch.int32)
    prog = _compile(f, (x, n), tmp_path)
    compare(prog(x.numpy(), n.numpy()), f(x, n), rtol=1e-4, atol=1e-5)
    from chroma.runtime.webgpu import read_package

    kernels = read_package(str(tmp_path / "m.chroma-web")).manifest["kernels"]
    with_variants = [k for k in kernels if k.get("variants")]
    assert {k["name"].split("_", 1)[1] for k in with_variants} == {"softmax", "reduce"}, [k["name"] for k in kernels]
    for k in with_variants:
        (v,) = k["variants"]
        assert v["features"] == ["subgroups"] and v["code"].startswith("// ") and "enable subgroups;" in v["code"]
        assert "subgroup" not in k["code"]
    with_sg = _node_check(str(tmp_path / "m.chroma-web"))
    without = _node_check(str(tmp_path / "m.chroma-web"), "--no-variants")
    assert "subgroups" not in without["features"]
    if "SwiftShader" in with_sg["adapter"]:
        assert "subgroups" in with_sg["features"]


# (conv, input shape): each GPU convolution path. Tiled (im2col through the tiled product):
# 16+ output channels per group and 64+ products per output; direct with blocks of output
# channels (8, 4, 3 per invocation), depthwise. Strides, padding, dilation, groups, 1-3 spatial dims.
CONV_CASES = {
    "tiled_2d": (torch.nn.Conv2d(16, 40, 3, stride=2, padding=1), (2, 16, 13, 11)),
    "tiled_groups_dilation": (torch.nn.Conv2d(32, 64, 3, padding=2, dilation=2, groups=2), (1, 32, 9, 10)),
    "tiled_1d": (torch.nn.Conv1d(24, 32, 5, padding=2), (3, 24, 37)),
    "tiled_3d": (torch.nn.Conv3d(8, 16, 3, padding=1), (1, 8, 5, 6, 7)),
    "direct_blocked_8": (torch.nn.Conv2d(3, 16, 3, padding=1), (1, 3, 17, 19)),
    "direct_blocked_4": (torch.nn.Conv2d(6, 12, 3, stride=2, padding=(0, 1), bias=False), (2, 6, 10, 9)),
    "direct_3_channels": (torch.nn.Conv2d(16, 3, 3, padding=1), (1, 16, 12, 12)),
    "depthwise": (torch.nn.Conv2d(12, 12, 5, stride=2, padding=2, groups=12), (1, 12, 15, 15)),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_convolution_paths_with_epilogues(tmp_path, case):
    """Every GPU convolution path against PyTorch, with an epilogue (bias, GELU, residual-style
    add of another input, ReLU) applied as the result is stored: one dispatch."""
    torch.manual_seed(0)
    conv, shape = CONV_CASES[case]
    conv = conv.eval()
    x = randn(*shape)
    with torch.no_grad():
        z = randn(*conv(x).shape)
    f = lambda x, z: torch.relu(torch.nn.functional.gelu(conv(x)) + z)  # noqa: E731
    prog = _compile(f, (x, z), tmp_path)
    with torch.no_grad():
        compare(prog(x.numpy(), z.numpy()), f(x, z), rtol=1e-4, atol=1e-5)
    assert prog.stats["dispatches"] == 1, prog.stats


# Full tier: the reference model on lavapipe, 14 s (its kernels run in the sampled op suite).
@pytest.mark.full
def test_reference_model_logits(tmp_path):
    """gpt-oss's architecture at the benchmark size (59M parameters, 201,088-token vocabulary):
    an 8-token call's logits against eager PyTorch."""
    from chroma.models import gpt_oss

    m = gpt_oss.build().eval()
    tokens = gpt_oss.sample_tokens(m.cfg if hasattr(m, "cfg") else gpt_oss.BENCHMARK_CONFIG, 8)
    prog = _compile(m, (tokens,), tmp_path, "gpt")
    with torch.no_grad():
        want = m(tokens).numpy()
    got = prog(tokens.numpy())
    # twelve layers of float32 on a software GPU: errors relative to the logits' scale
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * scale)
    assert (got.argmax(-1) == want.argmax(-1)).all()
    st = prog.stats
    assert st["dispatches"] < 2 * st["cpu_kernels"], st


def test_unsupported_ops_are_all_listed_with_source_lines(tmp_path):
    def f(i, m):
        a = i + 2**40  # an int64 literal beyond the GPU's 32-bit integers
        b = torch.linalg.det(m)  # a factorization (LAPACK): none on GPU targets
        return a, b

    with pytest.raises(chroma.UnsupportedError) as e:  # a CompileError: the target lacks what they need
        chroma.compile(f, (torch.arange(4), randn(3, 3)), target="webgpu", out=str(tmp_path / "u"))
    msg = str(e.value)
    assert "2 part(s) of the program cannot be compiled for it" in msg, msg
    assert len(e.value.refusals) == 2 and all(r[1] and r[3] for r in e.value.refusals), e.value.refusals
    assert "1099511627776 does not fit in 32 bits" in msg and "test_webgpu.py" in msg, msg
    assert "Linalg.lu" in msg and "not available on GPU targets" in msg, msg


def test_linalg_is_refused_on_gpu(tmp_path):
    a = randn(4, 4) + 4 * torch.eye(4)
    with pytest.raises(chroma.CompileError, match="linear-algebra.*GPU"):
        chroma.compile(lambda a: torch.linalg.inv(a), (a,), target="webgpu", out=str(tmp_path / "l"))


def test_float64_is_refused_naming_the_input(tmp_path):
    with pytest.raises(chroma.UnsupportedError, match=r"input 'x' \(node mul, test_webgpu.py:\d+.*\): float64") as e:
        chroma.compile(lambda x: x * 2, (randn(3).double(),), target="webgpu", out=str(tmp_path / "d"))
    assert [r[0] for r in e.value.refusals] == ["input 'x'", "output 0"], e.value.refusals


class _ExpandedTable(torch.nn.Module):
    """A float64 table folded at compile time (cos of a float64 buffer) and read only as
    float32, through an expand whose float32 result (32 MiB) is past the folding limit, so the
    Cast stays in the graph and the float64 constant reaches the target."""

    def __init__(self):
        super().__init__()
        self.register_buffer("f", torch.linspace(0, 3, 1024, dtype=torch.float64))

    def forward(self, x):
        return x + self.f.cos().expand(8192, 1024).float()[: x.shape[0]]


def test_float64_constants_read_as_float32_are_stored_as_float32(tmp_path):
    # passes/narrow_float64: the table is stored as float32 (4 KiB, not 8) and rounded before
    # the expand instead of after it, which gives the same bits: the output matches eager
    # exactly (one float32 addition of the same operands).
    m, x = _ExpandedTable(), randn(4, 1024)
    prog = _compile(m, (x,), tmp_path, "f64")
    assert prog.stats["weight_bytes"] == 1024 * 4, prog.stats
    np.testing.assert_array_equal(prog(x.numpy()), m(x).numpy())


def test_flux_rope_in_float64_folds_when_the_positions_are_constants(tmp_path):
    # diffusers' FluxPosEmbed computes RoPE's angles, cos and sin in float64. Positions known at
    # compile time (a module buffer: they depend only on the image and text sizes) fold to
    # float32 tables: compiled, and equal to eager to 1e-7 (the folder's float64 libm against
    # torch's, then one rounding to float32 each).
    pytest.importorskip("diffusers")
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    ids = torch.zeros(64, 3)
    ids[:, 1], ids[:, 2] = torch.arange(64) // 8, torch.arange(64) % 8

    class Rope(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pe = FluxPosEmbed(theta=10000, axes_dim=[16, 56, 56])
            self.register_buffer("ids", ids)

        def forward(self, x):
            cos, sin = self.pe(self.ids)
            return x * cos + x.flip(-1) * sin

    m, x = Rope(), randn(64, 128)
    prog = _compile(m, (x,), tmp_path, "rope")
    np.testing.assert_allclose(prog(x.numpy()), m(x).numpy(), rtol=0, atol=1e-7)


def test_float64_computed_from_an_input_is_refused_with_its_node_and_line(tmp_path):
    # A float64 computation that reads a run-time input is no constant: the GPU targets refuse
    # it (computing it in float32 would move RoPE's angles by up to |angle| * 2^-23, silently),
    # naming every node and the user's line.
    def f(x):
        return (x.double() * torch.arange(8, dtype=torch.float64)).cos().float()

    with pytest.raises(chroma.UnsupportedError) as e:
        _compile(f, (randn(3, 8),), tmp_path, "f64in")
    assert e.value.refusals and all(r[1] and "test_webgpu.py" in r[2] and "float64" in r[3] for r in e.value.refusals), \
        e.value.refusals


def test_corrupt_truncated_and_mismatched_packages_are_rejected(tmp_path):
    prog = _compile(torch.nn.Linear(4, 3).eval(), (randn(2, 4),), tmp_path, "lin")
    path = tmp_path / "lin.chroma-web"
    data = bytearray(path.read_bytes())
    bad = bytearray(data)
    bad[len(bad) - 300] ^= 0x40
    with pytest.raises(webgpu.PackageError, match="corrupt"):
        webgpu.read_package(bytes(bad))
    with pytest.raises(webgpu.PackageError, match="truncated|bytes"):
        webgpu.read_package(bytes(data[:len(data) // 2]))
    other = bytearray(data)
    other[8] = webgpu.FORMAT_VERSION + 1
    with pytest.raises(webgpu.PackageError, match=f"version {webgpu.FORMAT_VERSION + 1} is not supported"):
        webgpu.read_package(bytes(other))
    assert prog.self_check()["ok"]


def test_index_out_of_range_names_the_node(tmp_path):
    emb = torch.nn.Embedding(10, 4).eval()
    idx = torch.tensor([1, 2, 3])
    prog = _compile(emb, (idx,), tmp_path, "emb")
    np.testing.assert_allclose(prog(idx.numpy()), emb(idx).detach().numpy(), rtol=1e-6)
    with pytest.raises(IndexError, match="index 12 is out of range for dimension 0 of size 10"):
        prog(np.array([1, 12, 3]))
    np.testing.assert_allclose(prog(idx.numpy()), emb(idx).detach().numpy(), rtol=1e-6)  # the next call is clean


class Narrow(torch.nn.Module):
    """8- and 16-bit tensors in every role: inputs, outputs, weights; elementwise, concat,
    gather, reductions and sort over them, at element counts that end mid-word."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.register_buffer("keep", torch.rand(3, 7, generator=g) > 0.3)                # bool weight
        self.register_buffer("lut", torch.randint(0, 256, (11,), dtype=torch.uint8, generator=g))  # uint8 weight

    def forward(self, x, m, q, h):
        b = x > 0.1
        u = (x * 40).to(torch.uint8)                         # wraps as PyTorch's cast does
        s = torch.where(m & self.keep, x, -x)
        qq = (q.to(torch.int32) * 3).to(torch.int8)           # wraps
        hh = (h + 7).to(torch.int16)
        c = torch.cat([b, m, self.keep], 1)                   # packed concat along the last axis
        looked = self.lut[u.long() % 11]                      # gather from a packed weight
        return (b, u, s, qq, hh, c, looked, m.any(1), q.max(0).values, torch.sort(h, 1).values,
                q.to(torch.float32).sum(), u.flip(1))


def test_packed_narrow_types(tmp_path):
    """bool, uint8, int8 and int16 are stored packed (4 or 2 to a 32-bit word) in the arena,
    the weights and the inputs and outputs. Elementwise kernels give each invocation whole
    words; other kernels store with bit-field replacements (atomic and/or), so neighbouring
    elements written by different invocations do not race."""
    torch.manual_seed(0)
    m = Narrow().eval()
    args = (randn(3, 7), torch.rand(3, 7) > 0.5, torch.randint(-128, 128, (3, 7), dtype=torch.int8),
            torch.randint(-3000, 3000, (3, 5), dtype=torch.int16))
    prog = _compile(m, args, tmp_path)
    got, want = prog(*[a.numpy() for a in args]), m(*args)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        w = w.numpy()
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, w.dtype, g.shape, w.shape)
        if w.dtype == np.float32:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"output {i}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"output {i}")
    man = webgpu.read_package(str(tmp_path / "m.chroma-web")).manifest
    io = {t["name"]: (t["storage"], t["bytes"]) for t in man["inputs"] + man["outputs"]}
    assert io["m"] == ("u8", 24) and io["q"] == ("i8", 24) and io["h"] == ("i16", 32), io  # 21 bytes -> 6 words
    assert io["output5"] == ("u8", 64) and io["output1"] == ("u8", 24), io                 # cat: 63 bools
    weights = {t["name"]: t["bytes"] for t in man["weights"]["tensors"]}
    assert sorted(weights.values()) == [12, 24], weights  # lut: 11 bytes, keep: 21, padded to words
    assert any("atomicOr" in k["code"] for k in man["kernels"])  # concat, gather, sort, ...
    owned = [k for k in man["kernels"] if "var word" in k["code"]]  # casts and comparisons
    assert len(owned) >= 3 and not any("atomic" in k["code"] for k in owned), [k["name"] for k in owned]
    assert prog.self_check()["ok"]
    _node_check(str(tmp_path / "m.chroma-web"))


def _graph(fn, inputs, tmp_path):
    g = tmp_path / "g.cgraph"
    chroma.export(fn, inputs).write(str(g))
    return str(g)


GOLDEN_CASES = {
    "elementwise": (lambda x: torch.sigmoid(x * 2 + 1), (randn(4, 8),)),
    "reduce_sum": (lambda x: x.sum(-1), (randn(4, 100),)),
    "softmax": (lambda x: x.softmax(-1), (randn(4, 64),)),
    "matmul_epilogue": (lambda a, b: torch.relu(a @ b + 1), (randn(40, 24), randn(24, 72))),
    "packed_bool": (lambda x, m: (x > 0) ^ m, (randn(5, 9), torch.rand(5, 9) > 0.5)),  # words owned
    "packed_concat": (lambda x, m: torch.cat([x > 0, m], 1), (randn(5, 9), torch.rand(5, 3) > 0.5)),  # atomic or
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_wgsl_golden(tmp_path, case):
    """The generated WGSL of a few kernels, text for text (CHROMA_UPDATE_GOLDEN=1 rewrites)."""
    from chroma import _compiler

    fn, inputs = GOLDEN_CASES[case]
    text = "\n".join(_compiler.gpu_kernel_sources(_graph(fn, inputs, tmp_path), "webgpu"))
    path = os.path.join(GOLDEN, f"{case}.wgsl")
    if os.environ.get("CHROMA_UPDATE_GOLDEN") == "1":
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    with open(path, encoding="utf-8") as f:
        assert text == f.read(), f"generated WGSL differs from {path}"


def test_cuda_dialect_compiles_with_nvcc(tmp_path):
    """The kernels the CUDA target generates (its capability record and dialect, as a CUDA
    package holds them) compile with nvcc, each alone (the whole-model kernels.cu:
    test_cuda.py)."""
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None:
        pytest.skip("nvcc is not installed (CUDA toolkit); the CUDA dialect is only compiled where it is")
    from chroma import _compiler

    m = Block().eval()
    sources = _compiler.gpu_kernel_sources(_graph(m, (randn(1, 8, 32),), tmp_path), "cuda")
    assert len(sources) >= 5
    # the tiled product and both convolution paths, with epilogues
    conv_a, conv_b = torch.nn.Conv2d(16, 32, 3, padding=1).eval(), torch.nn.Conv2d(32, 3, 3, padding=1).eval()
    f = lambda x, a, b: (conv_b(torch.relu(conv_a(x))), torch.relu(a @ b + 1))  # noqa: E731
    sub = tmp_path / "products"
    sub.mkdir()
    more = _compiler.gpu_kernel_sources(_graph(f, (randn(1, 16, 9, 9), randn(40, 24), randn(24, 72)), sub), "cuda")
    assert len(more) == 3 and sum("acc[" in s for s in more) == 3, more
    sources += more
    packed = tmp_path / "packed"  # packed bool/int8 loads and bit-field stores (atomicAnd/atomicOr)
    packed.mkdir()
    narrow = _compiler.gpu_kernel_sources(_graph(lambda x, q: (torch.cat([x > 0, q > 3], 1), q * 2),
                                                 (randn(5, 9), randint(-9, 9, 5, 9).to(torch.int8)), packed), "cuda")
    assert any("atomicOr" in s for s in narrow) and any("word" in s and "atomic" not in s for s in narrow), narrow
    sources += narrow
    # nvcc without the sanitizers scripts/sanitize.sh preloads into this process
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    for i, src in enumerate(sources):
        cu = tmp_path / f"k{i}.cu"
        cu.write_text("#include <cstring>\n#define CHROMA_SLOT(T) T* __restrict__\n" + src)
        r = subprocess.run([nvcc, "-c", "-arch=sm_80", "-o", str(tmp_path / f"k{i}.o"), str(cu)],
                           capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, f"kernel {i}:\n{src}\n{r.stderr}"


def test_cli_runs_and_inspects_a_package(tmp_path):
    prog = _compile(torch.nn.Linear(4, 3).eval(), (randn(2, 4),), tmp_path, "cli")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    run = lambda *a: subprocess.run([sys.executable, "-m", "chroma", *a], capture_output=True, text=True, env=env,
                                    timeout=300)
    r = run("run", str(tmp_path / "cli.chroma-web"))
    assert r.returncode == 0 and "output 0: float32[2, 3]" in r.stdout, r.stdout + r.stderr
    for target in (str(tmp_path / "cli.chroma-web"), str(tmp_path / "cli")):
        r = run("inspect", target)
        assert r.returncode == 0, r.stderr
        assert f"format chroma.webgpu v{webgpu.FORMAT_VERSION}" in r.stdout and "schedule (1 dispatches)" in r.stdout and "MatMul <- add" in r.stdout, r.stdout
        assert prog.package.manifest["content_hash"] in r.stdout
    bad = tmp_path / "bad.chroma-web"
    bad.write_bytes((tmp_path / "cli.chroma-web").read_bytes()[:200])
    r = run("inspect", str(bad))
    assert r.returncode != 0 and "truncated" in r.stderr, r.stderr
