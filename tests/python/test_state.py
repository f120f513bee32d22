"""Persistent state: buffers a model updates in place, and multi-entry artifacts."""

import numpy as np
import pytest
import torch
from torch import nn

import chroma


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(3))
        self.register_buffer("history", torch.zeros(4, 3))

    def forward(self, x):
        self.count.add_(x)
        self.history.copy_(torch.cat([self.history[1:], self.count[None]]))
        return self.count * 2


def test_buffer_updates_persist_between_calls(tmp_path):
    m = Counter()
    x = torch.tensor([1.0, 2.0, 3.0])
    prog = chroma.compile(m, (x,), out=str(tmp_path / "c"))
    m2 = Counter()  # eager reference starting from the same state
    for _ in range(5):
        got = prog(x.numpy())
        with torch.no_grad():
            want = m2(x)
        np.testing.assert_allclose(got, want.numpy())
    np.testing.assert_allclose(prog.read_state("count"), m2.count.numpy())
    np.testing.assert_allclose(prog.read_state("history"), m2.history.numpy())
    prog.reset_state()
    np.testing.assert_allclose(prog(x.numpy()), 2 * x.numpy())


class Store(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mem", torch.zeros(4, 2))

    def write(self, i, v):
        self.mem.index_copy_(0, i, v)
        return self.mem.sum(0)

    def read(self, i):
        return self.mem[i] + 1


class _Call(nn.Module):
    def __init__(self, store, method):
        super().__init__()
        self.store = store
        self.method = method

    def forward(self, *a):
        return getattr(self.store, self.method)(*a)


def test_entries_share_state(tmp_path):
    s = Store()
    i1 = torch.tensor([1])
    prog = chroma.compile_entries({"write": (_Call(s, "write"), (i1, torch.ones(1, 2))),
                                   "read": (_Call(s, "read"), (torch.tensor([0, 1, 2]),))},
                                  out=str(tmp_path / "s"))
    assert [e.name for e in prog.entries] == ["write", "read"]
    write, read = prog.entry("write"), prog.entry("read")
    np.testing.assert_allclose(write(np.array([2]), np.array([[3.0, 4.0]], np.float32)), [3.0, 4.0])
    np.testing.assert_allclose(write(np.array([0]), np.array([[1.0, 1.0]], np.float32)), [4.0, 5.0])
    np.testing.assert_allclose(read(np.array([0, 1, 2])), [[2, 2], [1, 1], [4, 5]])
    # The read entry only reads `mem`: it is state there too, not a frozen constant.
    assert [st["name"] for st in read.manifest["state"]] == ["store.mem"]
    with pytest.raises(KeyError, match="no entry point 'nope'"):
        prog.entry("nope")
    with pytest.raises(IndexError):
        write(np.array([7]), np.zeros((1, 2), np.float32))
    # The failed call wrote nothing.
    np.testing.assert_allclose(read(np.array([0, 1, 2])), [[2, 2], [1, 1], [4, 5]])
