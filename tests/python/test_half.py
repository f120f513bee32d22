"""float16 and bfloat16 tensors on the CPU target (chroma/half.h, passes/widen_half.cpp):
stored in 16 bits, computed as PyTorch's CPU computes them (each ATen operation in float32,
its result rounded to the tensor's type), NumPy arrays in and out (np.float16,
ml_dtypes.bfloat16)."""

import ml_dtypes
import numpy as np
import pytest
import torch

import chroma
from chroma.arrays import to_numpy
from conftest import randn
from test_webgpu import Block  # a pre-norm transformer block

HALVES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _np(t):
    return to_numpy(t)


def _run(model, args, tmp_path):
    with torch.no_grad():
        want = model(*args)
        prog = chroma.compile(model, args, out=str(tmp_path / "m"))
    got = prog(*[_np(a) for a in args])
    return got, want


def _check(got, want, ulps=0):
    """got (NumPy) against want (torch): same dtype and shape; values within `ulps` units in the
    last place of the half type (0: bit for bit)."""
    assert str(got.dtype) == str(want.dtype).replace("torch.", ""), (got.dtype, want.dtype)
    assert got.shape == tuple(want.shape)
    w = want.float().numpy()
    g = got.astype(np.float32)
    eps = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}[want.dtype]
    tol = ulps * eps * np.maximum(np.abs(w), 2.0 ** -14)
    bad = ~((np.abs(g - w) <= tol) | (np.isnan(g) & np.isnan(w)) | (g == w))
    assert not bad.any(), f"{bad.sum()} of {bad.size} differ; first at {np.argwhere(bad)[0]}: {g[bad][0]} vs {w[bad][0]}"


@pytest.mark.parametrize("dt", sorted(HALVES))
def test_mlp_matches_pytorch_bit_for_bit(dt, tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                            torch.nn.Linear(32, 8)).to(HALVES[dt]).eval()
    got, want = _run(m, (randn(4, 16).to(HALVES[dt]),), tmp_path)
    _check(got, want)


@pytest.mark.parametrize("dt", sorted(HALVES))
def test_transformer_block(dt, tmp_path):
    torch.manual_seed(0)
    m = Block().to(HALVES[dt]).eval()
    got, want = _run(m, (randn(2, 8, 32).to(HALVES[dt]),), tmp_path)
    _check(got, want, ulps=2)  # products: BLAS and PyTorch's kernels sum in different orders


@pytest.mark.parametrize("dt", sorted(HALVES))
def test_convolution_network(dt, tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                            torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten()).to(HALVES[dt]).eval()
    got, want = _run(m, (randn(2, 3, 12, 12).to(HALVES[dt]),), tmp_path)
    _check(got, want, ulps=2)


def test_a_decomposed_operation_is_rounded_once(tmp_path):
    """mean is a sum and a division inside one ATen operation: PyTorch keeps the float32 sum,
    so a mean of values whose sum overflows float16 (65504) is still finite."""
    x = torch.full((4, 4096), 100.0, dtype=torch.float16) + randn(4, 4096).half()
    got, want = _run(lambda a: (a.mean(-1), a.var(-1), torch.nn.functional.layer_norm(a, (4096,))), (x,), tmp_path)
    assert torch.isfinite(want[0]).all()
    _check(got[0], want[0], ulps=1)
    _check(got[1], want[1], ulps=1)
    # x - mean cancels about 100 of the input's magnitude: summation order shows at the ~1e-5 level
    np.testing.assert_allclose(got[2].astype(np.float32), want[2].float().numpy(), rtol=0, atol=1e-3)


@pytest.mark.parametrize("dt", sorted(HALVES))
def test_casts_and_mixed_types(dt, tmp_path):
    """Conversions are exact one way and round to nearest even the other (overflow to inf, NaN
    kept); a half op with a float32 tensor computes in float32; scalars are not rounded first."""
    h = HALVES[dt]
    x = torch.tensor([0.1, 1 / 3, 65519.0, 65520.0, 1e6, -1e-8, 6e-8, float("nan"), float("-inf"), 2.5])
    i = torch.tensor([1, 2049, 4097, -7, 65535, 300000, 0, 3, 5, 9])

    def f(x, i, y):
        return x.to(h), i.to(h), (x.to(h) * 0.1), y + x, (y * 3).to(torch.int32), y.to(torch.float32), y > 0.5

    got, want = _run(f, (x, i, x.to(h)), tmp_path)
    for g, w in zip(got, want):
        if w.dtype in (torch.float16, torch.bfloat16):
            _check(g, w)
        else:
            np.testing.assert_array_equal(g, w.numpy())


def test_conversions_match_numpy_for_every_float16():
    """Every float16 bit pattern through float32 and back (through a program): the identity."""
    bits = np.arange(65536, dtype=np.uint16)
    h = bits.view(np.float16)
    m = lambda a: a.float()  # noqa: E731
    prog = chroma.compile(m, (torch.from_numpy(h.copy()),))
    f = prog(h)
    np.testing.assert_array_equal(f, h.astype(np.float32))
    back = chroma.compile(lambda a: a.half(), (torch.from_numpy(f.copy()),))(f)
    same = (back.view(np.uint16) == bits) | np.isnan(h)
    assert same.all()


def test_bfloat16_numpy_interop(tmp_path):
    x = randn(3, 5).to(torch.bfloat16)
    prog = chroma.compile(lambda a: (a * 2 + 1, a.sum(-1)), (x,), out=str(tmp_path / "m"))
    y, s = prog(_np(x))
    assert y.dtype == ml_dtypes.bfloat16 and s.dtype == ml_dtypes.bfloat16
    with torch.no_grad():
        _check(y, x * 2 + 1)
        _check(s, x.sum(-1))
    with pytest.raises(Exception, match="bfloat16"):
        prog(x.float().numpy())  # float32 where bfloat16 is expected: named


@pytest.mark.parametrize("dt", sorted(HALVES))
def test_webgpu_stores_halves_in_16_bits(dt, tmp_path):
    """On WebGPU a half tensor is two to a word (storage "f16"/"bf16"), computed in f32 and
    rounded where the CPU rounds: the same values, in Python (lavapipe) and in Node (Dawn)."""
    from test_webgpu import _node_check
    from chroma.runtime import webgpu

    torch.manual_seed(0)
    m = Block().to(HALVES[dt]).eval()
    x = randn(2, 8, 32).to(HALVES[dt])
    with torch.no_grad():
        want = m(x)
        prog = chroma.compile(m, (x,), target="webgpu", out=str(tmp_path / "m"))
    _check(prog(_np(x)), want, ulps=2)
    man = webgpu.read_package(str(tmp_path / "m.chroma-web")).manifest
    assert man["inputs"][0]["storage"] == {"float16": "f16", "bfloat16": "bf16"}[dt]
    assert man["inputs"][0]["bytes"] == 2 * 8 * 32 * 2
    weights = {t["dtype"] for t in man["weights"]["tensors"]}
    assert dt in weights and "float32" not in weights, weights  # kept in 16 bits, converted by the kernels
    assert prog.self_check()["ok"]
    _node_check(str(tmp_path / "m.chroma-web"))


def test_jit_takes_and_returns_bfloat16_tensors():
    f = chroma.jit(lambda a: torch.nn.functional.silu(a) * 2)
    x = randn(4, 6).to(torch.bfloat16)
    y = f(x)
    assert y.dtype == torch.bfloat16
    with torch.no_grad():
        _check(y.view(torch.int16).numpy().view(ml_dtypes.bfloat16), torch.nn.functional.silu(x) * 2)


@pytest.mark.parametrize("dt", sorted(HALVES))
def test_topk_and_sort_with_ties(dt, tmp_path):
    """Half values tie often: the values equal PyTorch's, and every returned index points at
    the value returned beside it (PyTorch's order among equal values is not specified)."""
    x = (randn(3, 40) * 3).round().to(HALVES[dt])  # many ties
    f = lambda a: (torch.topk(a, 7, dim=1), torch.sort(a, dim=1, descending=True), torch.topk(a, 2, dim=0, largest=False))  # noqa: E731
    got, want = _run(lambda a: tuple(t for pair in f(a) for t in pair), (x,), tmp_path)
    for k, dim in ((0, 1), (2, 1), (4, 0)):
        _check(got[k], want[k])
        idx = torch.from_numpy(got[k + 1])
        assert torch.equal(torch.take_along_dim(x, idx, dim), want[k])


@pytest.mark.parametrize("dt", sorted(HALVES))
def test_kernels_that_round_each_step(dt, tmp_path):
    """Ops whose CPU kernels compute in the half type one step at a time (or in double from ends
    rounded to it) give eager's values bit for bit: linspace and logspace (number ends and a
    tensor end), addr with alpha and beta, linalg.cross, histc's bin edges, ldexp."""
    t = HALVES[dt]
    m, v1, v2 = randn(5, 6).to(t), randn(5).to(t), randn(6).to(t)
    a, b = randn(4, 3).to(t), randn(4, 3).to(t)
    h = (randn(200) * 2).to(t)
    e = torch.tensor(2.7)

    def f(m, v1, v2, a, b, h, e):
        return (torch.linspace(-3.3, 7.1, 23, dtype=t), torch.linspace(e, 9.0, 11, dtype=t),
                torch.logspace(-1.7, 2.3, 9, base=2.0, dtype=t), torch.logspace(e, -3, 5, dtype=t),
                torch.addr(m, v1, v2, beta=0.7, alpha=1.3), torch.linalg.cross(a, b),
                torch.histc(h, bins=13, min=-3.1, max=2.9), torch.ldexp(h, torch.tensor(3)))

    got, want = _run(f, (m, v1, v2, a, b, h, e), tmp_path)
    for g, w in zip(got, want):
        _check(g, w)


@pytest.mark.parametrize("dt", sorted(HALVES))
def test_sign_bit_of_signed_zeros_and_nans(dt, tmp_path):
    """signbit reads the sign bit: -0.0 and a negative NaN count as negative. (bfloat16 once
    stopped GCC 12 with an internal compiler error on AVX-512 Zen 4, through std::signbit.)"""
    x = torch.tensor([1.0, -1.0, 0.0, -0.0, float("nan"), -float("nan"), float("inf"), -float("inf"), 3e-5, -3e-5] * 4)
    got, want = _run(lambda a: torch.signbit(a), (x.to(HALVES[dt]),), tmp_path)
    assert got.dtype == np.bool_ and np.array_equal(got, want.numpy())


@pytest.mark.parametrize("dt", sorted(HALVES))
def test_rounding_points_of_cpu_kernels(dt, tmp_path):
    """Bit for bit with eager where its CPU kernels round inside one operation: log_softmax
    over the last dimension keeps the row's sum and its log in the half type (over another
    dimension, float32); logit computes each step in the type (eps rounded); index_put with
    accumulate and index_reduce add one element at a time in the type, where index_add adds
    in float32; renorm's decomposition converts with prims.convert_element_type."""
    t = HALVES[dt]
    x = (randn(6, 33) * 3).to(t)
    p = torch.rand(200).to(t) * 1.2 - 0.1
    base = (randn(5, 7) * 4).to(t)
    idx = torch.randint(0, 5, (40,), generator=torch.Generator().manual_seed(3))
    vals = (randn(40, 7) * 4).to(t)

    def f(x, p, base, idx, vals):
        return (torch.log_softmax(x, 1), torch.log_softmax(x, 0), torch.logit(p), torch.logit(p, 0.2),
                base.index_put((idx,), vals, accumulate=True), base.index_add(0, idx, vals),
                base.index_reduce(0, idx, vals, "mean", include_self=False), torch.renorm(x, 2, 0, 1.5))

    got, want = _run(f, (x, p, base, idx, vals), tmp_path)
    for g, w in zip(got, want):
        _check(g, w)


def _close(got, want):
    """A product of K = 1024 against PyTorch's: float32 sums in another order, then one rounding
    to the half type: within 2 units in its last place, or a small fraction of the sum's scale
    where the sum cancels."""
    assert str(got.dtype) == str(want.dtype).replace("torch.", "") and got.shape == tuple(want.shape)
    w = want.float().numpy()
    eps = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}[want.dtype]
    np.testing.assert_allclose(got.astype(np.float32), w, rtol=2 * eps, atol=1e-3 * float(np.abs(w).max()))


@pytest.mark.parametrize("n", [96, 4608])  # 4608: its float32 copy (18.9 MB) is over the folding limit
def test_bfloat16_product_weights_are_read_in_16_bits(n, tmp_path):
    """A bfloat16 model's linear weights go to the bf16 product kernels as they are (half the
    bytes of a float32 copy; the activations are bfloat16 values, so rounding them changes
    nothing), however large: a float32 copy over the folding limit used to be converted at every
    call. The result is PyTorch's bfloat16 linear (_close)."""
    torch.manual_seed(0)
    m = torch.nn.Linear(1024, n).to(torch.bfloat16).eval()
    x = randn(5, 1024).to(torch.bfloat16)
    with torch.no_grad():
        want = m(x)
        prog = chroma.compile(m, (x,), out=str(tmp_path / "m"))
    _close(prog(_np(x)), want)
    labels = [k["label"] for k in prog.manifest["kernels"]]
    assert "MatMul.bf16" in labels, labels
    assert prog.manifest["stats"]["weight_bytes"] < 2.1 * 1024 * n, prog.manifest["stats"]
    assert prog.manifest["stats"]["arena_bytes"] < 1 << 20, prog.manifest["stats"]  # no float32 copy at run time
    (d,) = [d for d in prog.manifest["options"]["weights"]["decisions"] if d["format"] == "bf16"]
    assert "the model's bfloat16 weight" in d["reason"] and d["reason"].endswith("activations bf16"), d


def test_concatenated_bfloat16_activations_stay_bfloat16(tmp_path):
    """A product of a concatenation of bfloat16 activations (a FLUX single block's projection
    of its attention and MLP outputs) reads bfloat16 values: the bfloat16 kernels, as for any
    bfloat16 activation (the exact float32 kernels ran, 3.7x slower at 1088 rows of 15360)."""
    torch.manual_seed(0)

    class Cat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.out = torch.nn.Linear(64, 48), torch.nn.Linear(64, 80), torch.nn.Linear(128, 32)

        def forward(self, x):
            return self.out(torch.cat([self.a(x), torch.nn.functional.gelu(self.b(x))], dim=-1))

    m, x = Cat().to(torch.bfloat16).eval(), randn(2, 40, 64).to(torch.bfloat16)
    with torch.no_grad():
        want = m(x)
        prog = chroma.compile(m, (x,), out=str(tmp_path / "m"))
    _close(prog(_np(x)), want)
    decisions = [d for d in prog.manifest["options"]["weights"]["decisions"] if d["format"] == "bf16"]
    assert len(decisions) == 3 and all(d["reason"].endswith("activations bf16") for d in decisions), decisions


def test_float32_activations_with_bfloat16_weights_stay_exact(tmp_path):
    """A product of float32 activations with a bfloat16 weight widened in the model: the weight
    is stored in 16 bits, and the product runs the exact float32 kernels (rounding the
    activations to bfloat16 would cost about 1e-3)."""
    torch.manual_seed(0)

    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(300, 256).to(torch.bfloat16))

        def forward(self, x):
            return x @ self.w.float().t()

    m, x = Mixed().eval(), randn(6, 256)
    with torch.no_grad():
        prog = chroma.compile(m, (x,), out=str(tmp_path / "m"))
    want = x.double() @ m.w.detach().double().t()
    np.testing.assert_allclose(prog(x.numpy()), want.numpy(), rtol=1e-5, atol=1e-5)
    (d,) = [d for d in prog.manifest["options"]["weights"]["decisions"] if d["format"] == "bf16"]
    assert d["reason"].endswith("activations fp32"), d


def test_float16_product_weights_are_converted_once(tmp_path):
    """A float16 model's large linear weight is converted to float32 at compile time (the
    products' float32 panels), never at every call."""
    torch.manual_seed(0)
    m = torch.nn.Linear(1024, 4608, bias=False).to(torch.float16).eval()
    x = randn(3, 1024).to(torch.float16)
    with torch.no_grad():
        want = m(x)
        prog = chroma.compile(m, (x,), out=str(tmp_path / "m"))
    _close(prog(_np(x)), want)
    assert prog.manifest["stats"]["arena_bytes"] < 1 << 20, prog.manifest["stats"]
    assert "MatMul.packed" in [k["label"] for k in prog.manifest["kernels"]]


class _PickedExperts(torch.nn.Module):
    """Experts picked from stacked weights by a router and multiplied as gathered (OpenAI's
    reference MoE: W = weights[expert_indices], then a batched product)."""

    def __init__(self, experts=4, hidden=128, inner=256, k=2):
        super().__init__()
        self.k = k
        self.gate = torch.nn.Linear(hidden, experts)
        self.w1 = torch.nn.Parameter(torch.randn(experts, inner, hidden) * 0.05)
        self.w2 = torch.nn.Parameter(torch.randn(experts, hidden, inner) * 0.05)

    def forward(self, x):
        top = torch.topk(self.gate(x), self.k, dim=-1)
        h = torch.nn.functional.silu(torch.einsum("tkfh,th->tkf", self.w1[top.indices], x))
        o = torch.einsum("tkhf,tkf->tkh", self.w2[top.indices], h)
        return (o * torch.softmax(top.values, -1)[..., None]).sum(1)


def test_bfloat16_experts_are_read_in_place_in_16_bits(tmp_path):
    """The experts a router picks from a bfloat16 stack: the products read the picked matrices
    in place in 16 bits (no gathered copy, no float32 copy of the stack: the gather moves values
    without rounding them, so the weight is still the model's bfloat16 weight)."""
    torch.manual_seed(0)
    m = _PickedExperts().to(torch.bfloat16).eval()
    x = randn(5, 128).to(torch.bfloat16)
    with torch.no_grad():
        want = m(x)
        prog = chroma.compile(m, (x,), out=str(tmp_path / "m"))
    _close(prog(_np(x)), want)
    labels = [k["label"] for k in prog.manifest["kernels"]]
    assert labels.count("MatMul.gathered.bf16") == 2, labels
    stacks = 2 * 4 * 256 * 128
    assert prog.manifest["stats"]["weight_bytes"] < 2 * stacks + 4 * 129 * 4 + 4096, prog.manifest["stats"]


def test_a_bfloat16_weight_read_by_several_products_is_not_copied(tmp_path):
    """One bfloat16 weight read by several products (a layer applied twice; copies of one layer
    with the same values are one constant too): each product reads its 16 bits, none a float32
    copy written at run time."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(512, 512).to(torch.bfloat16).eval()
    m = torch.nn.Sequential(lin, torch.nn.ReLU(), lin, torch.nn.ReLU(), lin)
    x = randn(4, 512).to(torch.bfloat16)
    with torch.no_grad():
        want = m(x)
        prog = chroma.compile(m, (x,), out=str(tmp_path / "m"))
    _close(prog(_np(x)), want)
    labels = [k["label"] for k in prog.manifest["kernels"]]
    assert labels.count("MatMul.bf16") == 3, labels
    assert prog.manifest["stats"]["arena_bytes"] < 512 * 512 * 4, prog.manifest["stats"]


class _ConvBlocks(torch.nn.Module):
    """Convolutions as a bfloat16 CNN has them: a stem with bias, batch norms with trained
    statistics, a residual add, a depthwise convolution and a pointwise one."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(8, 32, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(32)
        self.conv = torch.nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(32)
        self.dw = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False)
        self.pw = torch.nn.Conv2d(32, 16, 1)
        for bn in (self.bn1, self.bn2):
            with torch.no_grad():
                bn.running_mean.uniform_(-1, 1)
                bn.running_var.uniform_(0.5, 2)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        y = torch.relu(self.bn1(self.stem(x)))
        y = torch.relu(y + self.bn2(self.conv(y)))
        return self.pw(torch.nn.functional.hardswish(self.dw(y)))


@pytest.mark.parametrize("kernels", ["bf16", "fp32"])  # fp32: CHROMA_DNNL_BF16=0, a CPU without bf16
@pytest.mark.parametrize("threads", [1, 2])
def test_bfloat16_convolutions_keep_their_batch_norm_and_run_in_bfloat16(threads, kernels, tmp_path, monkeypatch):
    """A bfloat16 model's convolutions: the batch norm after one is not folded into its weights
    (eager rounds the convolution's result to bfloat16 first, and the unscaled weights stay
    bfloat16 values); the convolutions whose sums have at least 32 products run on oneDNN's
    bfloat16 kernel (manifest: precision bfloat16; on a CPU without AVX512-BF16 the same
    convolution in float32), the depthwise one in float32; the roundings, the batch norm, the
    activation and the residual add run in the convolutions' epilogues. The result is eager's
    bfloat16 model within 2 units in the last place (float32 sums in another order), which a
    folded batch norm misses (its weights rounded differently)."""
    monkeypatch.setenv("CHROMA_DNNL_BF16", "1" if kernels == "bf16" else "0")  # read when the artifact loads
    torch.manual_seed(0)
    m = _ConvBlocks().to(torch.bfloat16).eval()
    x = randn(1, 8, 32, 32).to(torch.bfloat16)
    with torch.no_grad():
        want = m(x)
        prog = chroma.compile(m, (x,), out=str(tmp_path / "m"), threads=threads)
    _check(prog(_np(x)), want, ulps=2)
    convs = [k for k in prog.manifest["kernels"] if k["kind"] == "conv"]
    assert [k.get("precision", "float32") for k in convs] == ["bfloat16", "bfloat16", "float32", "bfloat16"], convs
    # Nothing but the convolutions (and the input's conversion): batch norms, roundings,
    # relu, hardswish and the residual add all run in their epilogues.
    assert len(prog.manifest["kernels"]) <= len(convs) + 2, [k["label"] for k in prog.manifest["kernels"]]
    assert "mul add" in convs[1]["label"], convs[1]


@pytest.mark.parametrize("kernels", ["bf16", "fp32"])  # fp32: CHROMA_DNNL_BF16=0, a CPU without bf16
@pytest.mark.parametrize("threads", [1, 2])
def test_bfloat16_products_with_many_rows_run_on_onednn(threads, kernels, tmp_path, monkeypatch):
    """A bfloat16 model's products of at least 32 rows (batched, or of a transposed activation)
    run on oneDNN's bfloat16 matmul (AMX where the CPU has it; float32 sgemm on the same values
    where it has no bfloat16 instructions), reading the stored bfloat16 weight as it is; fewer
    rows keep Chroma's bf16 kernels. PyTorch's bfloat16 linear within 2 units in the last place
    (_close)."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(128, 96)
            self.b = torch.nn.Linear(96, 64, bias=False)
            self.c = torch.nn.Linear(40, 48)

        def forward(self, x, few):
            y = torch.nn.functional.gelu(self.a(x))           # [2, 40, 128] -> 80 rows
            z = self.b(y)                                     # 80 rows again
            return z, self.c(z.transpose(1, 2)), self.a(few)  # transposed activation; 8 rows

    monkeypatch.setenv("CHROMA_DNNL_BF16", "1" if kernels == "bf16" else "0")  # read when the artifact loads
    torch.manual_seed(0)
    m = M().to(torch.bfloat16).eval()
    args = (randn(2, 40, 128).to(torch.bfloat16), randn(8, 128).to(torch.bfloat16))
    with torch.no_grad():
        want = m(*args)
        prog = chroma.compile(m, args, out=str(tmp_path / "m"), threads=threads)
    got = prog(*[_np(a) for a in args])
    for g, w in zip(got, want):
        _close(g, w)
    labels = [k["label"] for k in prog.manifest["kernels"]]
    assert sum(lb.startswith("MatMul.onednn_bf16") for lb in labels) == 3, labels
    assert sum(lb.startswith("MatMul.bf16") for lb in labels) == 1, labels  # the 8-row product


class _Sdpa(torch.nn.Module):
    def __init__(self, causal=False):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v, mask=None):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)


@pytest.mark.parametrize("dt", sorted(HALVES))
@pytest.mark.parametrize("causal,masked,shape", [
    (False, False, (96, 130, 16, 16)),
    (True, False, (96, 130, 16, 16)),
    (False, True, (96, 130, 16, 16)),
    # Partial tiles of rows and keys, several key blocks, heads padded to the tiles' depth
    # (40 -> 64) and width (24 -> 32), two threads.
    (False, True, (150, 600, 40, 24)),
])
def test_attention_is_one_kernel_computed_in_float32(dt, causal, masked, shape, tmp_path):
    """A half model's scaled_dot_product_attention: eager's CPU kernel computes the scores, the
    softmax and both products in float32 and rounds the output once; so does Chroma, in one
    fused kernel that never holds the scores (a rounding between the products and the softmax
    would keep them). Eager also rounds the softmax's unnormalized weights to the type before
    the second product, so the two differ by more than the output's rounding where a row's
    weighted sum cancels: compared against the same attention in float64 of the same inputs,
    Chroma's largest error is at most eager's plus one unit in the last place of the output's
    scale, and every element is within 2 such units of eager's. Where the CPU has AMX, a
    bfloat16 model's attention multiplies on bfloat16 tiles (its operands are bfloat16 values)
    and rounds the weights before the second product as eager does; the same bounds hold."""
    g = torch.Generator().manual_seed(0)
    L, S, d, e = shape
    args = [torch.randn(1, 2, L, d, generator=g), torch.randn(1, 2, S, d, generator=g),
            torch.randn(1, 2, S, e, generator=g)]
    if masked:
        args.append(torch.randn(1, 1, L, S, generator=g))
    args = [a.to(HALVES[dt]) for a in args]
    with torch.no_grad():
        want = _Sdpa(causal)(*args)
        prog = chroma.compile(_Sdpa(causal), tuple(args), out=str(tmp_path / "m"), threads=2)
    got = prog(*[_np(a) for a in args])
    assert str(got.dtype) == str(want.dtype).replace("torch.", "") and got.shape == tuple(want.shape)
    with torch.no_grad():
        exact = _Sdpa(causal)(*[a.double() for a in args]).numpy()
    unit = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}[want.dtype] * np.abs(exact).max()
    g, w = got.astype(np.float64), want.double().numpy()
    assert np.abs(g - exact).max() <= np.abs(w - exact).max() + unit, (np.abs(g - exact).max(), np.abs(w - exact).max())
    assert np.abs(g - w).max() <= 2 * unit, np.abs(g - w).max() / unit
    # No temporary holds the scores ([1, 2, 96, 130] float32: 99,840 bytes): at most float32
    # copies of the inputs and the output (and alignment).
    copies = 4 * (sum(a.numel() for a in args) + want.numel())
    assert prog.stats["temporaries_bytes"] <= copies + 1024, (prog.stats, copies)


def test_attention_without_amx():
    """The same attention tests with CHROMA_NO_AMX=1 (read when a program first runs, so a
    fresh process): a bfloat16 model's attention then multiplies in float32 (the weights not
    rounded); where the CPU has no AMX that is the path the tests above took already."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, CHROMA_NO_AMX="1")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:logging", "-p", "no:cacheprovider", __file__,
                        "-k", "attention_is_one_kernel"], env=env, capture_output=True, text=True, timeout=900,
                       cwd=os.path.dirname(__file__))
    assert p.returncode == 0 and " passed" in p.stdout, p.stdout[-3000:] + p.stderr[-2000:]
