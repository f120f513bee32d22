"""Quantized weights (docs/quantization.md).

The quantizer is checked value for value against an independent NumPy implementation of
MLX's affine_quantize (written here from its definition: groups of 64 along K, the zero-exact
edge rule, half-to-even rounding, float16 scales and biases with q rounded again against the
stored values). Products are checked against NumPy products with the reference's dequantized
weights: with float32 activations ("activations": "fp32") to float32 rounding, with bfloat16
activations ("bf16") to the error bfloat16 rounding of the activations allows (each rounded with
relative error at most 2^-9: relative L2 error of the product under 4e-3; from 32 rows the
blocked kernels round the dequantized weights to bfloat16 too, within the same bound), with the default
("auto": int8 activations for q4 and q6 where the CPU has AVX512-VNNI or AVX2, bfloat16 or float32
otherwise) to
the error int8 rounding allows (per group of 64, |x - x'| <= max|x| / 254: under 1.5e-2 for
Gaussian rows), and the int8 kernels value for value against a NumPy model of the activations'
quantization.
"""

import json
import os

import ml_dtypes
import numpy as np
import pytest
import torch

import chroma
from chroma.quantization import quant

GROUP = 64
FMTS = ["bf16", "q8", "q6", "q4"]
BITS = {"q8": 8, "q6": 6, "q4": 4}
# Relative L2 error of a product allowed by each activations setting (module docstring).
ACT_BOUND = {"bf16": 4e-3, "auto": 1.5e-2}


def _cpu_flags() -> set:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def int8_activations(t: np.ndarray) -> np.ndarray:
    """What the int8 kernels multiply: per row and group of 64 along K, scale = max|x| / 127
    (float32) and x' = scale * rint(x / scale), half to even; a group whose largest magnitude
    is below 127 times the smallest normal float counts as zeros."""
    t = np.asarray(t, np.float32)
    out = np.zeros_like(t)
    for r in range(t.shape[0]):
        for g in range(0, t.shape[1], GROUP):
            x = t[r, g:g + GROUP]
            mx = np.abs(x).max()
            if mx >= np.float32(127) * np.finfo(np.float32).tiny:
                s = np.float32(mx / np.float32(127))
                out[r, g:g + GROUP] = s * np.rint(x / s)
    return out


def mlx_reference(w: np.ndarray, bits: int):
    """MLX's affine_quantize in NumPy float32, with float16 scales and biases (q rounded
    again with the float16 values)."""
    w = np.asarray(w, np.float32)
    rows, k = w.shape
    groups = (k + GROUP - 1) // GROUP
    n_bins = np.float32(2 ** bits - 1)
    eps = np.float32(1e-7)
    q = np.zeros((rows, k), np.uint8)
    scales = np.zeros((rows, groups), np.float16)
    biases = np.zeros((rows, groups), np.float16)
    for r in range(rows):
        for g in range(groups):
            x = w[r, g * GROUP:(g + 1) * GROUP]
            lo, hi = x.min(), x.max()
            neg = abs(lo) > abs(hi)
            scale = np.maximum((hi - lo) / n_bins, eps)
            scale = scale if neg else -scale
            edge = lo if neg else hi
            q0 = np.rint(edge / scale)
            bias = np.float32(0)
            if q0 != 0:
                scale = edge / q0
                bias = edge
            s16, b16 = np.float16(scale), np.float16(bias)
            qq = np.rint((x - np.float32(b16)) / np.float32(s16))
            q[r, g * GROUP:g * GROUP + x.size] = np.clip(qq, 0, n_bins).astype(np.uint8)
            scales[r, g], biases[r, g] = s16, b16
    return q, scales, biases


def reference_weights(w: np.ndarray, fmt: str) -> np.ndarray:
    """What a [rows, K] weight stands for in `fmt`, from the NumPy reference."""
    if fmt == "bf16":
        return w.astype(ml_dtypes.bfloat16).astype(np.float32)
    q, s, b = mlx_reference(w, BITS[fmt])
    k = w.shape[1]
    rep = lambda a: np.repeat(a.astype(np.float32), GROUP, axis=1)[:, :k]  # noqa: E731
    return rep(s) * q.astype(np.float32) + rep(b)


@pytest.mark.parametrize("bits", [8, 6, 4])
@pytest.mark.parametrize("k", [64, 200, 37])
def test_quantizer_matches_mlx_reference(bits, k):
    rng = np.random.default_rng(bits * 100 + k)
    w = rng.standard_normal((24, k)).astype(np.float32) * 0.05
    # Groups that test the edge rule: all positive, all negative, constant, all zero, a zero
    # in the middle, a single large outlier.
    w[0] = np.abs(w[0])
    w[1] = -np.abs(w[1])
    w[2] = 0.25
    w[3] = 0.0
    w[4, :] = rng.standard_normal(k) * 3
    w[4, k // 2] = 0.0
    w[5, 0] = 40.0
    q, s, b = quant.quantize(w, bits)
    rq, rs, rb = mlx_reference(w, bits)
    np.testing.assert_array_equal(s.view(np.uint16), rs.view(np.uint16))
    np.testing.assert_array_equal(b.view(np.uint16), rb.view(np.uint16))
    np.testing.assert_array_equal(q, rq)
    assert q.max() <= 2 ** bits - 1
    # The dequantized weights are close: within half a step inside the grid; the end opposite
    # the exact edge may lie up to half a step beyond it (the grid moved so that zero is on
    # it) and is clipped: at most one step there.
    deq = quant.dequantize(q, s, b)
    step = np.repeat(np.abs(s.astype(np.float32)), GROUP, axis=1)[:, :k]
    inner = (q > 0) & (q < 2 ** bits - 1)
    err = np.abs(deq - w)
    assert np.all(err[inner] <= 0.5 * step[inner] * 1.01 + 1e-3 * np.abs(w[inner]) + 1e-6)
    assert np.all(err <= step * 1.01 + 1e-3 * np.abs(w) + 1e-6)
    # A constant group is exact, and so is an all-zero one.
    np.testing.assert_array_equal(deq[3], 0.0)
    np.testing.assert_allclose(deq[2], 0.25, rtol=1e-3)


def test_quantizer_refuses_groups_beyond_float16():
    w = np.zeros((1, 64), np.float32)
    w[0, 0] = 1e6  # the bias would be 1e6: not a float16
    with pytest.raises(RuntimeError, match="float16"):
        quant.quantize(w, 4)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("k,n", [(200, 77), (64, 16), (130, 33)])
def test_packed_layout_stands_for_the_reference_weights(fmt, k, n):
    from chroma import _compiler

    rng = np.random.default_rng(k + n)
    b = rng.standard_normal((k, n)).astype(np.float32)  # the product's operand [K, N]
    packed, deq = _compiler.pack_weights(b.tobytes(), k, n, fmt)
    deq = np.frombuffer(deq, np.float32).reshape(k, n)
    # Groups run along K: the reference quantizes B^T's rows.
    ref = reference_weights(b.T.copy(), fmt).T
    np.testing.assert_allclose(deq, ref, rtol=1e-6, atol=1e-7)
    bpw = len(packed) * 8 / (k * ((n + 15) // 16 * 16))
    assert bpw <= {"bf16": 16.5, "q8": 8 + 32 / 64 + 1, "q6": 6 + 32 / 64 + 1, "q4": 4 + 32 / 64 + 1}[fmt]


class Linear2(torch.nn.Module):
    """A linear layer, a router-like gate and a norm: what the keep-list is about."""

    def __init__(self, k=200, n=77):
        super().__init__()
        self.fc = torch.nn.Linear(k, n)
        self.gate = torch.nn.Linear(k, 8)
        self.norm = torch.nn.LayerNorm(k)

    def forward(self, x):
        return self.fc(self.norm(x)), self.gate(x)


def _product_reference(m, x, fmt):
    t = m.norm(x).detach().numpy()
    w = reference_weights(m.fc.weight.detach().numpy(), fmt)
    return t @ w.T + m.fc.bias.detach().numpy()


# The guarding tier takes one row count per kernel path (one row: the vector path; 5: a partial
# block; 24: whole blocks; 40: AMX's blocked kernel, a whole and a partial tile of rows); the
# full tier all of them (each is a compile per format).
_FULL_ONLY = pytest.mark.full
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("rows", [1, pytest.param(2, marks=_FULL_ONLY), 5, pytest.param(8, marks=_FULL_ONLY),
                                  pytest.param(13, marks=_FULL_ONLY), 24, 40, pytest.param(96, marks=_FULL_ONLY)])
def test_quantized_products_match_reference(tmp_path, fmt, rows):
    torch.manual_seed(rows)
    m = Linear2().eval()
    x = torch.randn(rows, 200)
    ref = _product_reference(m, x, fmt)
    for act in ("fp32", "bf16", "auto"):
        prog = chroma.compile(m, (x,), out=str(tmp_path / f"{fmt}{act}"), weights={"default": fmt, "activations": act})
        y, gate = prog(x.numpy())
        if act == "fp32":
            np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())
        else:
            assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < ACT_BOUND[act]
        # The gate stays float32 (kept), exactly as eager computes it.
        np.testing.assert_allclose(gate, m.gate(x).detach().numpy(), rtol=1e-5, atol=1e-5)
        names = {d["name"]: d for d in prog.manifest["options"]["weights"]["decisions"]}
        assert names["fc.weight"]["format"] == fmt and names["fc.weight"]["reason"] == "default"
        assert names["gate.weight"]["format"] == "fp32" and names["gate.weight"]["reason"] == "kept: router/gate"
        assert any(k["label"].startswith(f"MatMul.{fmt}") for k in prog.manifest["kernels"])


class _Strided(torch.nn.Module):
    """A product whose activations are read transposed (a column of x per row of the product)."""

    def __init__(self, k=200, n=77):
        super().__init__()
        self.fc = torch.nn.Linear(k, n)

    def forward(self, x):
        return self.fc(x.t())


@pytest.mark.parametrize("fmt", ["q4", "q6"])
@pytest.mark.parametrize("rows", [1, 3, 8, 19, 40])
def test_int8_activations_value_for_value(tmp_path, fmt, rows):
    """The default for q4 and q6: the products multiply the activations quantized to int8 per
    group of 64 (vpdpbusd where the CPU has AVX512-VNNI, vpmaddubsw with AVX2 only). Checked against the NumPy model of that
    quantization times the reference weights, to float32 rounding: K = 200 (a short last group),
    a group of zeros, one of values near 1e-37, a large outlier in one group, and activations
    read with a stride. A
    non-finite activation makes its row's results non-finite, as float32 arithmetic would."""
    flags = _cpu_flags()
    torch.manual_seed(10 + rows)
    for name, m, x in (("rows", torch.nn.Linear(200, 77), torch.randn(rows, 200)),
                       ("strided", _Strided(), torch.randn(200, rows))):
        m = m.eval()
        t = x.numpy() if name == "rows" else x.numpy().T.copy()
        t[0, 64:128] = 0.0
        t[-1, 5] = 40.0
        t[-1, 128:192] *= np.float32(1e-37)  # too small for a normal scale: counts as zeros
        x = torch.from_numpy(t.copy() if name == "rows" else t.T.copy())
        w = reference_weights(m.fc.weight.detach().numpy() if name == "strided" else m.weight.detach().numpy(), fmt)
        bias = (m.fc.bias if name == "strided" else m.bias).detach().numpy()
        prog = chroma.compile(m, (x,), out=str(tmp_path / name), weights=fmt)
        assert prog.manifest["options"]["weights"]["activations"] == "auto"
        y = prog(x.numpy())
        exact = t.astype(np.float64) @ w.T + bias
        ref = int8_activations(t).astype(np.float64) @ w.T + bias
        int8_match = np.allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
        bf16_close = np.linalg.norm(y - exact) / np.linalg.norm(exact) < ACT_BOUND["bf16"]
        if "avx512_vnni" in flags and not (rows >= 2 and "amx_bf16" in flags):
            # (bfloat16 or float32 activations miss this by far more: about 2e-3 to 2e-2 here)
            np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
        elif "avx512_vnni" in flags:
            # AMX takes products of 2 rows or more with bfloat16 where the kernel grants its
            # tile data to the process (asked at run time), else the int8 kernel runs.
            assert int8_match or bf16_close
        elif "avx2" in flags and "f16c" in flags and "fma" in flags:
            # AVX2 without VNNI: the same int8 activations, multiplied with vpmaddubsw.
            np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
        else:  # float32 activations (the portable code)
            assert bf16_close
        bad = x.numpy().copy()
        if name == "rows":
            bad[rows - 1, 150] = np.inf
        else:
            bad[150, rows - 1] = np.nan
        yb = prog(bad)
        assert not np.isfinite(yb[rows - 1]).any()
        assert np.isfinite(yb[:rows - 1]).all()


def test_rules_roles_and_report(tmp_path):
    torch.manual_seed(0)

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(128, 256)
            self.down = torch.nn.Linear(256, 128)
            self.head = torch.nn.Linear(128, 500, bias=False)

        def forward(self, x):
            return self.head(x + self.down(torch.relu(self.up(x))))

    m = LM().eval()
    x = torch.randn(4, 128)
    prog = chroma.compile(m, (x,), out=str(tmp_path / "a"), weights={"default": "q4", "unembedding": "q8", "down.*": "fp32"})
    d = {e["name"]: e for e in prog.manifest["options"]["weights"]["decisions"]}
    assert d["head.weight"]["format"] == "q8" and d["head.weight"]["role"] == "unembedding"
    assert d["down.weight"]["format"] == "fp32" and d["down.weight"]["reason"] == "rule down.*"
    assert d["up.weight"]["format"] == "q4"
    w = prog.manifest["options"]["weights"]
    assert w["product_weights_bytes"] < w["product_weights_bytes_fp32"]
    # The accuracy report: computed at compile time against float32 PyTorch.
    acc = prog.accuracy
    assert acc["reference"].startswith("PyTorch")
    out = acc["outputs"][0]
    for key in ("rel_l2", "max_abs", "cosine", "top1_agreement", "kl_divergence"):
        assert key in out
    y = prog(x.numpy())
    ref = m(x).detach().numpy()
    assert abs(out["rel_l2"] - np.linalg.norm(y - ref) / np.linalg.norm(ref)) < 1e-6
    assert 0 < out["rel_l2"] < 0.2 and out["cosine"] > 0.98
    # More bits, less error.
    p8 = chroma.compile(m, (x,), out=str(tmp_path / "b"), weights="q8")
    assert p8.accuracy["outputs"][0]["rel_l2"] < out["rel_l2"]
    # fp32 is the default and leaves no report.
    p32 = chroma.compile(m, (x,), out=str(tmp_path / "c"))
    assert p32.accuracy is None
    with open(os.path.join(str(tmp_path / "a"), "manifest.json")) as f:
        assert json.load(f)["accuracy"] == acc


def test_gathered_experts_quantized(tmp_path):
    """The reference style of a mixture of experts, W[idx] then a product: the expert matrices
    are quantized in place, read through the index."""
    torch.manual_seed(1)

    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(6, 96, 128) * 0.1)

        def forward(self, x, idx):
            return torch.einsum("tnk,tk->tn", self.w[idx], x)

    m = Experts().eval()
    x = torch.randn(5, 128)
    idx = torch.tensor([0, 3, 5, 3, 1])
    for act in ("fp32", "bf16", "auto"):
        prog = chroma.compile(m, (x, idx), out=str(tmp_path / act), weights={"default": "q4", "activations": act})
        dec = prog.manifest["options"]["weights"]["decisions"]
        assert [(d["name"], d["matrices"], d["format"]) for d in dec] == [("w", 6, "q4")]
        wq = np.stack([reference_weights(m.w[e].detach().numpy(), "q4") for e in range(6)])
        ref = np.einsum("tnk,tk->tn", wq[idx.numpy()], x.numpy())
        y = prog(x.numpy(), idx.numpy())
        if act == "fp32":
            np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())
        else:
            assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < ACT_BOUND[act]
        with pytest.raises(Exception, match="index"):
            prog(x.numpy(), np.array([0, 1, 6, 2, 1]))


def test_bad_weight_options(tmp_path):
    m = Linear2().eval()
    x = torch.randn(2, 200)
    with pytest.raises(ValueError, match="q3"):
        chroma.compile(m, (x,), out=str(tmp_path / "a"), weights="q3")
    with pytest.raises(ValueError, match="activations"):
        chroma.compile(m, (x,), out=str(tmp_path / "b"), weights={"default": "q4", "activations": "fp16"})
    with pytest.raises(TypeError):
        chroma.compile(m, (x,), out=str(tmp_path / "c"), weights=4)
    from chroma import _compiler

    with pytest.raises(chroma.CompileError, match="unknown format 'q5'"):
        _compiler.compile_graph("/nonexistent.cgraph", str(tmp_path / "e"), include_dir="", weights="default=q5")


def test_quant_report_dry_run():
    torch.manual_seed(2)
    m = Linear2(k=256, n=192).eval()
    x = torch.randn(3, 256)
    rep = chroma.quant_report(m, (x,), weights="q4")
    layers = {r["name"]: r for r in rep["layers"]}
    assert layers["fc.weight"]["format"] == "q4"
    assert layers["gate.weight"]["format"] == "fp32" and layers["gate.weight"]["reason"].startswith("kept")
    # q4 with float16 scales and biases: 4.5 bits per weight (192 columns: whole panels).
    assert layers["fc.weight"]["bytes"] == 256 * 192 * 4.5 / 8
    assert rep["bytes"] < rep["bytes_fp32"]
    sens = rep["sensitivity"]
    assert [s["name"] for s in sens] == ["fc.weight"] and sens[0]["rel_l2"] > 0
    text = quant.format_report(rep)
    assert "fc.weight" in text and "sensitivity" in text


def test_decoder_with_quantized_weights(tmp_path):
    """compile_decoder(weights=...): prefill and cached steps on q8 weights stay close to the
    float32 decoder (both entries share the one quantized copy of each weight)."""
    from chroma.models import gpt_oss as g

    m = g.build(vocab_size=300, hidden_size=64, num_layers=2, num_experts=4, experts_per_token=2, intermediate_size=64,
                num_attention_heads=4, num_key_value_heads=1, head_dim=16, seed=3)
    toks = g.sample_tokens(m.cfg, 9, seed=5).numpy()
    d32 = chroma.compile_decoder(m, prompt_len=5, cache_size=8, out=str(tmp_path / "f32"))
    d8 = chroma.compile_decoder(m, prompt_len=5, cache_size=8, out=str(tmp_path / "q8"), weights="q8")
    dec = d8.program.manifest["options"]["weights"]["decisions"]
    assert {d["entry"] for d in dec} == {"prefill", "step"}
    assert all(d["format"] == "q8" for d in dec if d["name"] == "unembedding.weight")
    assert d8.program.manifest["weights"]["bytes"] < d32.program.manifest["weights"]["bytes"]
    a, b = d32.prefill(toks[:5]), d8.prefill(toks[:5])
    assert np.linalg.norm(a - b) / np.linalg.norm(a) < 0.05
    for t in toks[5:]:
        a, b = d32.step(int(t)), d8.step(int(t))
        assert np.linalg.norm(a - b) / np.linalg.norm(a) < 0.05


# q4 in the guarding tier (int8 activations, the most paths); q6 and q8 in the full tier.
@pytest.mark.parametrize("fmt", ["q4", pytest.param("q6", marks=pytest.mark.full), pytest.param("q8", marks=pytest.mark.full)])
def test_quantized_products_on_two_threads(tmp_path, fmt):
    """Large enough to split between the pool's threads: every path (bfloat16 activations:
    vdpbf16ps in blocks of 8 rows, or AMX from two rows where present; q4's and q6's default:
    int8 activations with vpdpbusd where the CPU has AVX512-VNNI, vpmaddubsw with AVX2, q6's
    panels decoded once per thread from 9 rows on; float32 activations: the exact path) on
    both threads, 1, 8 and 24 rows (three blocks), and 70 (AMX's blocked kernel, from 32 rows:
    chunks of panels decoded once per call, split between the threads). The same artifact on one thread gives the
    same values: there the weights (1.1 MB and more) are streamed with non-temporal
    prefetches where one block of rows reads them (gemm_packed.h, kStreamBytes)."""
    torch.manual_seed(5)
    lin = torch.nn.Linear(256, 8192).eval()
    w = reference_weights(lin.weight.detach().numpy(), fmt)
    for rows in (1, 8, 24, 70):
        x = torch.randn(rows, 256)
        ref = x.numpy() @ w.T + lin.bias.detach().numpy()
        for act in ("fp32", "bf16", "auto"):
            prog = chroma.compile(lin, (x,), out=str(tmp_path / f"{rows}{act}"), threads=2,
                                  weights={"default": fmt, "activations": act})
            assert prog.threads == 2
            y = prog(x.numpy())
            np.testing.assert_array_equal(chroma.load(prog.directory, threads=1)(x.numpy()), y)
            if act == "fp32":
                np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())
            else:
                assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < ACT_BOUND[act]


def test_weight_variants_and_memory_aware_loading(tmp_path, capsys):
    from chroma.errors import ArtifactError

    torch.manual_seed(6)
    lin = torch.nn.Linear(512, 2048).eval()
    x = torch.randn(2, 512)
    out = str(tmp_path / "mv")
    prog = chroma.compile(lin, (x,), out=out, weights=["fp32", "q8", "q4"])
    with open(os.path.join(out, "manifest.json")) as f:
        man = json.load(f)
    assert man["format"] == "chroma.variants"
    need = {v["name"]: v["need"]["total"] for v in man["variants"]}
    err = {v["name"]: v["rel_l2"] for v in man["variants"]}
    assert need["fp32"] > need["q8"] > need["q4"] and err["fp32"] == 0 < err["q8"] < err["q4"]
    # Plenty of memory: the most accurate.
    assert prog.variant["name"] == "fp32"
    y32 = prog(x.numpy())
    # Room for q8 but not fp32: q8, and the line says why.
    capsys.readouterr()
    p8 = chroma.load(out, weights="auto", memory_limit=need["q8"] + 1)
    line = capsys.readouterr().err
    assert p8.variant["name"] == "q8" and "weights=auto chose q8" in line and "fp32 needs" in line
    assert np.linalg.norm(p8(x.numpy()) - y32) / np.linalg.norm(y32) < 0.02
    # Nothing fits: the smallest, said so.
    p4 = chroma.load(out, memory_limit=1000)
    assert p4.variant["name"] == "q4" and "no variant fits" in capsys.readouterr().err
    # Forced.
    assert chroma.load(out, weights="q4").variant["name"] == "q4"
    with pytest.raises(ValueError, match="fp32, q8, q4"):
        chroma.load(out, weights="q6")
    # A single artifact knows its own format only.
    single = chroma.compile(lin, (x,), out=str(tmp_path / "one"), weights="q4")
    assert chroma.load(single.directory, weights="q4") is not None
    with pytest.raises(ValueError, match="one weight variant, q4"):
        chroma.load(single.directory, weights="q8")
    # A variants manifest that points outside its directory is refused.
    man["variants"][0]["directory"] = "../elsewhere"
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(man, f)
    with pytest.raises(ArtifactError, match="variant 0 is malformed"):
        chroma.load(out)


@pytest.mark.parametrize("fmt", FMTS)
def test_quantized_embedding_rows(tmp_path, fmt):
    """A table read by a Gather (role "embedding") is stored in the row layout and the rows a
    call names are dequantized: exactly the reference's weights."""
    torch.manual_seed(7)

    class Emb(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(300, 100)

        def forward(self, idx):
            return self.emb(idx)

    m = Emb().eval()
    idx = torch.tensor([[3, 299, 0], [7, 7, 150]])
    prog = chroma.compile(m, (idx,), out=str(tmp_path / fmt), weights={"default": "fp32", "embedding": fmt})
    dec = prog.manifest["options"]["weights"]["decisions"]
    assert [(d["name"], d["role"], d["format"], d["shape"]) for d in dec] == [("emb.weight", "embedding", fmt, [300, 100])]
    assert any(k["label"] == f"Gather.{fmt}" for k in prog.manifest["kernels"])
    assert prog.manifest["weights"]["bytes"] < 300 * 100 * 4  # the float32 table is not stored
    table = reference_weights(m.emb.weight.detach().numpy(), fmt)
    np.testing.assert_allclose(prog(idx.numpy()), table[idx.numpy()], rtol=1e-6, atol=1e-7)
    with pytest.raises(IndexError):
        prog(np.array([[3, 300, 0], [1, 2, 3]]))


_NO_AMX_SCRIPT = """
import sys, numpy as np, torch, chroma
from chroma.quantization import quant
sys.path.insert(0, sys.argv[2])
from test_quant import reference_weights, ACT_BOUND
torch.manual_seed(3)
lin = torch.nn.Linear(200, 77).eval()
x = torch.randn(40, 200)
for fmt in ("bf16", "q8", "q4"):
    for act in ("bf16", "auto"):
        prog = chroma.compile(lin, (x,), out=f"{sys.argv[1]}/{fmt}{act}", weights={"default": fmt, "activations": act})
        y = prog(x.numpy())
        ref = x.numpy() @ reference_weights(lin.weight.detach().numpy(), fmt).T + lin.bias.detach().numpy()
        err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
        assert err < ACT_BOUND[act], (fmt, act, err)
long = torch.nn.Linear(4160, 40).eval()  # a long K
x = torch.randn(40, 4160)
prog = chroma.compile(long, (x,), out=f"{sys.argv[1]}/long", weights={"default": "q8", "activations": "bf16"})
ref = x.numpy() @ reference_weights(long.weight.detach().numpy(), "q8").T + long.bias.detach().numpy()
assert np.linalg.norm(prog(x.numpy()) - ref) / np.linalg.norm(ref) < ACT_BOUND["bf16"]
print("ok")
"""


def test_products_of_many_rows_without_amx(tmp_path):
    """CHROMA_NO_AMX=1 (read when a program first multiplies, so a fresh process) takes the
    kernels a CPU without AMX runs: from 32 rows, the blocked vdpbf16ps kernel for bf16 and q8
    weights (and q4 with bfloat16 activations; also K = 4160), the int8 kernel for q4 by
    default where the CPU has VNNI. On a CPU without AVX512-BF16 the same products take the other paths; the bounds
    hold for every one."""
    import subprocess
    import sys

    env = dict(os.environ, CHROMA_NO_AMX="1")
    p = subprocess.run([sys.executable, "-c", _NO_AMX_SCRIPT, str(tmp_path), os.path.dirname(__file__)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


@pytest.mark.parametrize("fmt", ["q4", "q8", "bf16"])
def test_products_with_long_k(tmp_path, fmt):
    """A long K through the blocked kernels (32 rows or more): K = 4160 (65 groups, each
    panel's decoded weights 133 KB: a chunk of 7 panels), 40 rows (a whole and a partial tile
    of rows), 40 columns (a partial panel), on two threads."""
    torch.manual_seed(7)
    lin = torch.nn.Linear(4160, 40).eval()
    x = torch.randn(40, 4160)
    ref = x.numpy() @ reference_weights(lin.weight.detach().numpy(), fmt).T + lin.bias.detach().numpy()
    for act in ("bf16", "auto"):
        prog = chroma.compile(lin, (x,), out=str(tmp_path / act), threads=2, weights={"default": fmt, "activations": act})
        y = prog(x.numpy())
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < ACT_BOUND[act]
