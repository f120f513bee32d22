"""Batch ranges: chroma.compile(model, (x,), batch=(lo, hi)) (chroma/batching.py,
chroma/frontend/batch_rows.py).

One artifact answers any number of rows: entries for a ladder of batch sizes, weights stored
once, a batch between the sizes padded or split. Checked here: results against eager PyTorch
on the whole batch for every size of a range and beyond it (tolerance: rtol 1e-5, atol 1e-6 of
the output's scale: the entries' products sum in other orders than eager's at other batch
sizes), the plan's arithmetic, that models which combine rows are refused with the node and
source line (and that one which specializes on the batch size is), the weights stored once,
batching.json validated on load, bad calls, and calls from several threads.

Run: cd /work/main && .venv/bin/python -m pytest tests/python/test_batching.py -q
"""

import json
import os
import threading

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import chroma
from chroma.runtime.batched import BatchedProgram, ladder, plan
from chroma.frontend.batch_rows import BatchRowsError


def close(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = w.detach().numpy()
        assert g.shape == w.shape, (g.shape, w.shape)
        scale = float(np.abs(w).max()) or 1.0
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * scale)


class Tagger(nn.Module):
    """A token classifier: embedding, attention over each row's own tokens, two outputs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 32)
        self.qkv = nn.Linear(32, 96)
        self.out = nn.Linear(32, 5)
        self.norm = nn.LayerNorm(32)

    def forward(self, ids, mask):
        x = self.emb(ids)
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)
        bias = (mask[:, None, None, :] - 1.0) * 1e4
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        h = self.norm(x + a.transpose(1, 2).reshape(b, s, d))
        return self.out(h).log_softmax(-1), h.mean(1)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 16, 3, stride=2)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        y = F.relu(self.bn(self.c1(x)))
        y = F.relu(self.c2(y))
        return self.fc(y.mean((2, 3)))


def test_ladder_and_plan():
    assert ladder(1, 64) == [1, 2, 4, 8, 16, 32, 64]
    assert ladder(3, 20) == [3, 4, 8, 16, 20]
    assert ladder(5, 5) == [5]
    sizes = ladder(1, 64)
    for b in range(1, 200):
        p = plan(b, sizes)
        assert sum(r for _, r in p) == b
        for size, rows in p:
            assert size in sizes and 1 <= rows <= size
            assert rows == size or size - rows <= 0.125 * size or size == sizes[0]
    assert plan(24, sizes) == [(16, 16), (8, 8)]
    assert plan(31, sizes) == [(32, 31)]
    assert plan(2, [3, 8]) == [(3, 2)]  # below the range: padded to the smallest size
    with pytest.raises(ValueError):
        plan(0, sizes)


@pytest.mark.parametrize("threads", [1, 2])
def test_tagger_every_batch_size(tmp_path, threads):
    m = Tagger().eval()
    ids = torch.randint(0, 50, (3, 12))
    mask = torch.ones(3, 12)
    p = chroma.compile(m, (ids, mask), batch=(1, 9), out=str(tmp_path / "t"), threads=threads)
    assert isinstance(p, BatchedProgram) and p.sizes == [1, 2, 4, 8, 9]
    g = torch.Generator().manual_seed(3)
    for b in list(range(1, 10)) + [17, 23]:  # the range, then beyond it (split)
        ids = torch.randint(0, 50, (b, 12), generator=g)
        mask = (torch.rand(b, 12, generator=g) > 0.3).float()
        mask[:, 0] = 1
        with torch.no_grad():
            want = m(ids, mask)
        close(p(ids.numpy(), mask.numpy()), want)


def test_cnn_range_and_reload(tmp_path):
    m = SmallCNN().eval()
    out = str(tmp_path / "c")
    p = chroma.compile(m, (torch.randn(2, 3, 16, 16),), batch=(2, 12), out=out)
    assert p.sizes == [2, 4, 8, 12]
    q = chroma.load(out)
    assert isinstance(q, BatchedProgram) and q.range == (2, 12)
    for b in (1, 2, 3, 5, 11, 12, 13):
        x = torch.randn(b, 3, 16, 16)
        with torch.no_grad():
            want = m(x)
        close(q(x.numpy()), want)


@pytest.mark.parametrize("target", ["cuda", "metal"])
def test_gpu_targets_on_the_emulator(tmp_path, target):
    """The CUDA and Metal targets take several entry points: a batch range runs on the SIMT
    emulator (chroma.compile returns the emulated program) and reloads as a BatchedProgram."""
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).eval()
    out = str(tmp_path / target)
    p = chroma.compile(m, (torch.randn(3, 16),), batch=(1, 8), out=out, target=target)
    assert isinstance(p, BatchedProgram) and p.sizes == [1, 2, 4, 8]
    for b in (1, 3, 8, 11):
        x = torch.randn(b, 16)
        with torch.no_grad():
            close(p(x.numpy()), m(x))
    assert isinstance(chroma.load(out, emulate=True), BatchedProgram)


def test_weights_stored_once(tmp_path):
    """The entries share weights.bin: the range's file holds no more than the single-size
    programs at its two ends hold together (a product's weights may be laid out one way for
    few rows and another for many), far less than one copy per entry."""
    m = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).eval()
    x = torch.randn(4, 64)
    rng = chroma.compile(m, (x,), batch=(1, 64), out=str(tmp_path / "r"))
    one = chroma.compile(m, (x[:1],), out=str(tmp_path / "one"))
    big = chroma.compile(m, (x.repeat(16, 1),), out=str(tmp_path / "big"))
    size = lambda d: os.path.getsize(os.path.join(d, "weights.bin"))  # noqa: E731
    assert len(rng.sizes) == 7
    assert size(rng.directory) <= size(one.directory) + size(big.directory)
    assert size(rng.directory) < 3 * size(big.directory)


@pytest.mark.parametrize("name,fn,what", [
    ("sum over the batch", lambda x: x - x.sum(0, keepdim=True), "aten.sum"),
    ("mean of everything", lambda x: x * x.mean(), "aten.mean"),
    ("softmax over the batch", lambda x: x.softmax(0), "softmax"),
    ("gram matrix", lambda x: x + (x.t() @ x)[:1], "aten.mm"),
    ("concatenated rows", lambda x: torch.cat([x, x.flip(0)], 0)[: x.shape[0]] + 1, ""),
    ("cumulative sum", lambda x: x.cumsum(0), "cumsum"),
])
def test_models_that_combine_rows_are_refused(tmp_path, name, fn, what):
    with pytest.raises(BatchRowsError) as e:
        chroma.compile(fn, (torch.randn(4, 6),), batch=8, out=str(tmp_path / "x"))
    msg = str(e.value)
    assert "combines rows" in msg and what in msg, msg
    assert not os.path.exists(tmp_path / "x" / "manifest.json")


def test_batch_norm_in_training_mode_is_refused(tmp_path):
    with pytest.raises(BatchRowsError, match="training mode.*node"):
        chroma.compile(SmallCNN().train(), (torch.randn(2, 3, 16, 16),), batch=4, out=str(tmp_path / "x"))


def test_a_model_that_fixes_the_batch_size_is_refused(tmp_path):
    with pytest.raises(BatchRowsError, match="cannot take a batch of any size"):
        chroma.compile(lambda x: x.reshape(4, -1) * 2, (torch.randn(4, 6),), batch=8, out=str(tmp_path / "x"))


def test_outputs_without_the_batch_first_are_refused(tmp_path):
    with pytest.raises(BatchRowsError, match="output 0"):
        chroma.compile(lambda x: x.t() * 2, (torch.randn(4, 6),), batch=8, out=str(tmp_path / "x"))


def test_bad_arguments_and_calls(tmp_path):
    m = nn.Linear(6, 3).eval()
    with pytest.raises(ValueError, match="lo <= hi"):
        chroma.compile(m, (torch.randn(2, 6),), batch=(5, 2))
    with pytest.raises(ValueError, match="webgpu package holds one entry point"):
        chroma.compile(m, (torch.randn(2, 6),), batch=4, target="webgpu")
    p = chroma.compile(lambda a, b: a * b.sum(-1, keepdim=True), (torch.randn(2, 6), torch.randn(2, 3)), batch=4,
                       out=str(tmp_path / "p"))
    with pytest.raises(ValueError, match="input 1 .* has 3 rows, input 0 has 2"):
        p(np.zeros((2, 6), np.float32), np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match="input 0 .* 1 dimensions, expected 2"):
        p(np.zeros(6, np.float32), np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="expected 2 inputs"):
        p(np.zeros((2, 6), np.float32))


def test_corrupt_batching_file_is_named(tmp_path):
    m = nn.Linear(6, 3).eval()
    out = str(tmp_path / "p")
    chroma.compile(m, (torch.randn(2, 6),), batch=4, out=out)
    path = os.path.join(out, "batching.json")
    info = json.load(open(path))
    for field, value, msg in [("range", [4, 1], "field 'range'"), ("version", 9, "field 'version'"),
                              ("entries", [{"batch": 2, "entry": "nope"}], "nope")]:
        bad = dict(info, **{field: value})
        json.dump(bad, open(path, "w"))
        with pytest.raises(chroma.ArtifactError, match=msg):
            chroma.load(out)
    json.dump(info, open(path, "w"))
    assert isinstance(chroma.load(out), BatchedProgram)


def test_calls_from_several_threads(tmp_path):
    m = SmallCNN().eval()
    p = chroma.compile(m, (torch.randn(2, 3, 16, 16),), batch=(1, 8), out=str(tmp_path / "c"), threads=1)
    g = torch.Generator().manual_seed(9)
    xs = [torch.randn(b, 3, 16, 16, generator=g) for b in (1, 3, 5, 7, 8, 2)]
    with torch.no_grad():
        wants = [m(x) for x in xs]
    errors = []

    def work(i):
        try:
            for _ in range(3):
                close(p(xs[i].numpy()), wants[i])
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
