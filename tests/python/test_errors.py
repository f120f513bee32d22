"""Expected-error tests: unsupported ops at compile time, bad inputs and out-of-range
indices at run time, corrupt artifacts at load time, and out= buffers.

Every test asserts the exception type and the concrete content of its message.

Run: cd /work/main && .venv/bin/python -m pytest tests/python/test_errors.py -q -n 2
"""

import inspect
import json
import os
import re
import shutil

import numpy as np
import pytest
import torch
import torch.nn as nn

from conftest import compare, randint, randn

import chroma
from chroma.errors import ArtifactError

# ---------------------------------------------------------------------------- compile time


def _two_unsupported(x):
    # (ops without a handler yet: fake quantization, the backward of pdist)
    a = torch.fake_quantize_per_tensor_affine(x, 0.1, 0, 0, 255)  # LINE_A
    b = torch.ops.aten._pdist_backward(x[0], x, 2.0, torch.pdist(x))  # LINE_B
    return a.sum() + b.sum()


def _line_of(marker):
    src, start = inspect.getsourcelines(_two_unsupported)
    for i, line in enumerate(src):
        if marker in line:
            return start + i
    raise AssertionError(marker)


def test_unsupported_ops_are_all_listed_with_source_lines(tmp_path):
    import chroma._compiler as c

    supported = set(c.supported_aten_targets())
    fq, pb = "aten.fake_quantize_per_tensor_affine_cachemask", "aten._pdist_backward"
    assert fq + ".default" not in supported and pb + ".default" not in supported
    with pytest.raises(chroma.CompileError) as ei:
        chroma.compile(_two_unsupported, (randn(3, 5),), out=str(tmp_path / "bad"))
    assert issubclass(chroma.CompileError, RuntimeError)
    msg = str(ei.value)
    assert re.search(r"\b2 unsupported ops\b", msg), msg
    assert f"test_errors.py:{_line_of('LINE_A')}" in msg, msg
    assert f"test_errors.py:{_line_of('LINE_B')}" in msg, msg
    # each op is reported on its own line together with its own source location
    lines = msg.splitlines()
    a = [ln for ln in lines if fq in ln]
    b = [ln for ln in lines if pb in ln]
    assert len(a) == 1 and f":{_line_of('LINE_A')}" in a[0], msg
    assert len(b) == 1 and f":{_line_of('LINE_B')}" in b[0], msg


def test_bool_mask_indexing_is_rejected(tmp_path):
    # data-dependent output shape: torch.export itself or Chroma must refuse, naming the problem
    with pytest.raises(Exception) as ei:
        chroma.compile(lambda x: x[x > 0], (randn(3, 5),), out=str(tmp_path / "mask"))
    assert not isinstance(ei.value, AssertionError)
    assert re.search(r"data.dependent|unbacked|nonzero|mask|guard", str(ei.value), re.I), str(ei.value)


# ---------------------------------------------------------------------------- call time

class Affine(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(7, 5)

    def forward(self, tokens, scale):
        return self.fc(tokens) * scale


@pytest.fixture(scope="module")
def affine(tmp_path_factory):
    model = Affine().eval()
    x, s = randn(3, 7), randn(3, 1, seed=1)
    prog = chroma.compile(model, (x, s), out=str(tmp_path_factory.mktemp("affine") / "art"))
    return prog, model, x, s


def test_wrong_input_count(affine):
    prog, _, x, s = affine
    with pytest.raises(TypeError, match=r"expected 2 inputs \(tokens, scale\), got 1"):
        prog(x.numpy())
    with pytest.raises(TypeError, match=r"expected 2 inputs .*got 3"):
        prog(x.numpy(), s.numpy(), s.numpy())
    with pytest.raises(TypeError, match=r"got 0"):
        prog()


def test_wrong_shape_names_input_and_both_shapes(affine):
    prog, _, x, s = affine
    with pytest.raises(ValueError) as ei:
        prog(x.numpy(), np.zeros((3, 2), np.float32))
    msg = str(ei.value)
    assert "scale" in msg and "input 1" in msg, msg
    assert "[3, 1]" in msg and "[3, 2]" in msg, msg
    with pytest.raises(ValueError) as ei:
        prog(np.zeros((7, 3), np.float32), s.numpy())
    msg = str(ei.value)
    assert "tokens" in msg and "[3, 7]" in msg and "[7, 3]" in msg, msg
    # same element count is still a shape error (no silent reshape)
    with pytest.raises(ValueError, match=r"tokens"):
        prog(np.zeros(21, np.float32), s.numpy())


def test_wrong_dtype_names_both_dtypes(affine):
    prog, _, x, s = affine
    with pytest.raises(ValueError) as ei:
        prog(x.numpy().astype(np.float64), s.numpy())
    msg = str(ei.value)
    assert "tokens" in msg and "float32" in msg and "float64" in msg, msg
    with pytest.raises(ValueError) as ei:
        prog(x.numpy(), s.numpy().astype(np.int64))
    msg = str(ei.value)
    assert "scale" in msg and "float32" in msg and "int64" in msg, msg


def test_valid_call_after_errors_and_noncontiguous_input(affine):
    prog, model, x, s = affine
    with pytest.raises(ValueError):
        prog(x.numpy()[:, :6], s.numpy())
    # a non-contiguous (but correctly shaped) NumPy array is accepted and read correctly
    xt = np.ascontiguousarray(x.numpy().T).T
    assert not xt.flags.c_contiguous
    with torch.no_grad():
        compare(prog(xt, s.numpy()), model(x, s))


class Emb(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(11, 4)

    def forward(self, ids):
        return self.emb(ids) * 2


@pytest.fixture(scope="module")
def emb(tmp_path_factory):
    model = Emb().eval()
    ids = randint(0, 11, 2, 3)
    prog = chroma.compile(model, (ids,), out=str(tmp_path_factory.mktemp("emb") / "art"))
    return prog, model


@pytest.mark.parametrize("bad", [11, 1000, -1, -12])
def test_embedding_out_of_range_raises_index_error(emb, bad):
    prog, model = emb
    ids = np.array([[0, 1, 2], [3, bad, 4]], np.int64)
    with pytest.raises(IndexError) as ei:
        prog(ids)
    assert str(bad) in str(ei.value), str(ei.value)
    # torch agrees that this is an error
    with pytest.raises(IndexError):
        model(torch.from_numpy(ids))
    # the program still works afterwards
    good = np.array([[0, 10, 2], [3, 5, 4]], np.int64)
    with torch.no_grad():
        compare(prog(good), model(torch.from_numpy(good)))


def test_index_tensor_negative_wraps_and_out_of_range_raises(tmp_path):
    x = randn(5, 3)
    fn = lambda x, i: x[i] + 1  # noqa: E731
    prog = chroma.compile(fn, (x, torch.tensor([0, 1], dtype=torch.int64)), out=str(tmp_path / "idx"))
    for idx in ([-1, -5], [4, -2], [0, 0]):
        i = torch.tensor(idx, dtype=torch.int64)
        compare(prog(x.numpy(), i.numpy()), fn(x, i))
    for bad in ([5, 0], [0, -6]):
        with pytest.raises(IndexError):
            prog(x.numpy(), np.array(bad, np.int64))
        with pytest.raises(IndexError):
            fn(x, torch.tensor(bad))
    i = torch.tensor([-3, 2])
    compare(prog(x.numpy(), i.numpy()), fn(x, i))


def test_gather_out_of_range_raises(tmp_path):
    x = randn(3, 4)
    prog = chroma.compile(lambda x, i: torch.gather(x, 1, i), (x, randint(0, 4, 3, 2)), out=str(tmp_path / "g"))
    with pytest.raises(IndexError):
        prog(x.numpy(), np.array([[0, 1], [2, 4], [3, 3]], np.int64))
    i = np.array([[0, 1], [2, 3], [3, 3]], np.int64)
    np.testing.assert_array_equal(prog(x.numpy(), i), torch.gather(x, 1, torch.from_numpy(i)).numpy())


# ---------------------------------------------------------------------------- artifacts

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(7, 9)
        self.fc2 = nn.Linear(9, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    d = tmp_path_factory.mktemp("artifact") / "mlp"
    model = MLP().eval()
    x = randn(4, 7)
    chroma.compile(model, (x,), out=str(d))
    with torch.no_grad():
        want = model(x).numpy()
    return str(d), x.numpy(), want


@pytest.fixture
def copy(artifact, tmp_path):
    src, _, _ = artifact

    def _copy(name="copy"):
        dst = str(tmp_path / name)
        shutil.copytree(src, dst)
        return dst
    return _copy


def _edit_manifest(d, fn):
    p = os.path.join(d, "manifest.json")
    with open(p) as f:
        m = json.load(f)
    fn(m)
    with open(p, "w") as f:
        json.dump(m, f)


def _lib(d):
    """The artifact's library (named by content: model-<key>.so)."""
    with open(os.path.join(d, "manifest.json")) as f:
        return os.path.join(d, json.load(f)["library"]["file"])


def _flip_byte(path, offset):
    with open(path, "rb") as f:
        b = bytearray(f.read())
    b[offset] ^= 0x5A
    with open(path, "wb") as f:
        f.write(bytes(b))


def test_pristine_copy_loads_and_runs(artifact, copy):
    _, x, want = artifact
    d = copy()
    np.testing.assert_allclose(chroma.load(d)(x), want, rtol=1e-5, atol=1e-5)


def test_truncated_weights(copy):
    d = copy()
    w = os.path.join(d, "weights.bin")
    size = os.path.getsize(w)
    with open(w, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(ArtifactError, match=r"weights\.bin") as ei:
        chroma.load(d)
    assert re.search(r"truncated|bytes|SHA-256", str(ei.value)), str(ei.value)


def test_flipped_byte_in_weights(copy):
    d = copy()
    _flip_byte(os.path.join(d, "weights.bin"), 8)
    with pytest.raises(ArtifactError, match=r"weights\.bin") as ei:
        chroma.load(d)
    assert re.search(r"corrupt|SHA-256", str(ei.value)), str(ei.value)


def test_missing_weights(copy):
    d = copy()
    os.remove(os.path.join(d, "weights.bin"))
    with pytest.raises(ArtifactError, match=r"weights\.bin.*missing"):
        chroma.load(d)


def test_manifest_version_changed(copy):
    d = copy()
    _edit_manifest(d, lambda m: m.__setitem__("version", 4))
    with pytest.raises(ArtifactError, match=r"manifest\.json.*version 4") as ei:
        chroma.load(d)
    assert "version 3" in str(ei.value)


def test_manifest_abi_version_changed(copy):
    d = copy()
    _edit_manifest(d, lambda m: m.__setitem__("abi_version", 99))
    with pytest.raises(ArtifactError, match=r"ABI version 99"):
        chroma.load(d)


def test_manifest_wrong_format(copy):
    d = copy()
    _edit_manifest(d, lambda m: m.__setitem__("format", "something.else"))
    with pytest.raises(ArtifactError, match=r"'format'"):
        chroma.load(d)


def test_manifest_missing(copy):
    d = copy()
    os.remove(os.path.join(d, "manifest.json"))
    with pytest.raises(ArtifactError, match=r"no manifest\.json"):
        chroma.load(d)


def test_manifest_not_json(copy):
    d = copy()
    with open(os.path.join(d, "manifest.json"), "w") as f:
        f.write('{"format": "chroma.artifact", ')
    with pytest.raises(ArtifactError, match=r"manifest\.json.*JSON"):
        chroma.load(d)


@pytest.mark.parametrize("field", ["library", "weights", "source", "inputs"])
def test_manifest_missing_field(copy, field):
    d = copy()
    _edit_manifest(d, lambda m: m.pop(field))
    with pytest.raises(ArtifactError, match=rf"missing field '{field}"):
        chroma.load(d)


def test_library_flipped_byte(copy):
    d = copy()
    lib = _lib(d)
    _flip_byte(lib, os.path.getsize(lib) // 2)
    with pytest.raises(ArtifactError, match=r"model-[0-9a-f]{16}\.so.*library\.sha256"):
        chroma.load(d)


def test_library_replaced_by_another_model(copy, tmp_path):
    other = chroma.compile(lambda x: x * 2 + 1, (randn(4, 7),), out=str(tmp_path / "other"))
    d = copy()
    shutil.copy(_lib(other.directory), _lib(d))
    with pytest.raises(ArtifactError, match=r"model-[0-9a-f]{16}\.so.*library\.sha256"):
        chroma.load(d)
    # also patching the library digest into the manifest is caught by the source digest
    _edit_manifest(d, lambda m: m["library"].__setitem__("sha256", other.manifest["library"]["sha256"]))
    with pytest.raises(ArtifactError, match=r"model-[0-9a-f]{16}\.so.*source\.digest"):
        chroma.load(d)


def test_library_missing(copy):
    d = copy()
    os.remove(_lib(d))
    with pytest.raises(ArtifactError, match=r"model-[0-9a-f]{16}\.so is missing"):
        chroma.load(d)


def test_manifest_source_digest_edited(copy):
    d = copy()
    _edit_manifest(d, lambda m: m["source"].__setitem__("digest", "0" * 64))
    with pytest.raises(ArtifactError, match=r"source\.digest") as ei:
        chroma.load(d)
    assert "0" * 64 in str(ei.value)


def test_manifest_weights_digest_edited(copy):
    d = copy()
    _edit_manifest(d, lambda m: m["weights"].__setitem__("digest", "f" * 64))
    with pytest.raises(ArtifactError, match=r"weights\.digest"):
        chroma.load(d)


def test_load_not_a_directory(tmp_path):
    with pytest.raises(ArtifactError, match=r"not a Chroma artifact"):
        chroma.load(str(tmp_path / "does-not-exist"))


# ---------------------------------------------------------------------------- out= buffers

def test_out_buffer_single(artifact):
    d, x, want = artifact
    prog = chroma.load(d)
    out = np.full(want.shape, np.nan, np.float32)
    res = prog(x, out=out)
    assert res is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    # reused buffer is overwritten by the next call
    x2 = x * -0.5
    res2 = prog(x2, out=out)
    assert res2 is out
    np.testing.assert_allclose(out, prog(x2), rtol=0, atol=0)


def test_out_buffer_tuple(tmp_path):
    x = randn(3, 5)
    fn = lambda x: (x.sum(0), torch.exp(x))  # noqa: E731
    prog = chroma.compile(fn, (x,), out=str(tmp_path / "t"))
    outs = (np.zeros(5, np.float32), np.zeros((3, 5), np.float32))
    res = prog(x.numpy(), out=outs)
    assert isinstance(res, tuple) and res[0] is outs[0] and res[1] is outs[1]
    compare(res, fn(x))
    with pytest.raises(ValueError, match=r"expected 2 arrays, got 1"):
        prog(x.numpy(), out=(outs[0],))


def test_out_buffer_wrong_shape_dtype_layout(artifact):
    d, x, want = artifact
    prog = chroma.load(d)
    with pytest.raises(ValueError) as ei:
        prog(x, out=np.zeros((4, 4), np.float32))
    assert "out[0]" in str(ei.value) and "[4, 3]" in str(ei.value) and "[4, 4]" in str(ei.value)
    with pytest.raises(ValueError, match=r"out\[0\].*float32.*float64"):
        prog(x, out=np.zeros((4, 3), np.float64))
    with pytest.raises(ValueError, match=r"C-contiguous"):
        prog(x, out=np.zeros((3, 4), np.float32).T)
    ro = np.zeros((4, 3), np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match=r"writeable"):
        prog(x, out=ro)
    with pytest.raises(TypeError, match=r"numpy\.ndarray"):
        prog(x, out=([[0.0] * 3] * 4,))
    # none of that broke the program
    np.testing.assert_allclose(prog(x), want, rtol=1e-5, atol=1e-5)


def test_integer_division_by_zero_raises(tmp_path):
    a = torch.tensor([7, -7, 3], dtype=torch.int64)
    b = torch.tensor([2, 3, 1], dtype=torch.int64)
    prog = chroma.compile(lambda a, b: (a // b, a % b), (a, b), out=str(tmp_path / "div"))
    q, r = prog(a.numpy(), b.numpy())
    np.testing.assert_array_equal(q, (a // b).numpy())
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.remainder(a, torch.tensor([1, 0, 1]))  # what PyTorch does
    with pytest.raises(ZeroDivisionError, match="integer division by zero"):
        prog(a.numpy(), np.array([1, 0, 1], dtype=np.int64))
    # The program stays usable.
    q, r = prog(a.numpy(), b.numpy())
    np.testing.assert_array_equal(r, (a % b).numpy())


def test_out_buffer_aliasing_an_input_gives_the_unaliased_result(tmp_path):
    x = torch.randn(6, 6)
    prog = chroma.compile(lambda x: x.t() @ x + x, (x,), out=str(tmp_path / "alias"))
    a = x.numpy().copy()
    expected = prog(a)
    prog(a, out=a)  # input and output are the same array
    np.testing.assert_allclose(a, expected, rtol=1e-6, atol=1e-6)


def test_large_weights_copied_to_huge_pages_are_checked_too(tmp_path, monkeypatch):
    # Weights of 16 MiB or more are copied into huge-page memory at load (program_main.h);
    # the digest is checked on that copy, and CHROMA_WEIGHTS_MMAP=1 keeps the file mapping.
    torch.manual_seed(0)
    m = torch.nn.Linear(2048, 2304).eval()  # 18.9 MB of weights
    x = torch.randn(3, 2048)
    d = str(tmp_path / "big")
    prog = chroma.compile(m, (x,), out=d)
    with torch.no_grad():
        want = m(x).numpy()
    np.testing.assert_allclose(prog(x.numpy()), want, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("CHROMA_WEIGHTS_MMAP", "1")
    np.testing.assert_allclose(chroma.load(d)(x.numpy()), want, rtol=1e-5, atol=1e-5)
    monkeypatch.delenv("CHROMA_WEIGHTS_MMAP")
    _flip_byte(os.path.join(d, "weights.bin"), 12_000_000)
    with pytest.raises(ArtifactError, match=r"weights\.bin.*(corrupt|SHA-256)"):
        chroma.load(d)
