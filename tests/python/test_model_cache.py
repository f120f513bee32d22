"""The model cache (python/chroma/cache/: fingerprint.py, model_cache.py): a second compile
of an unchanged model reuses the artifact without exporting; any change the compile depends
on (a weight, an attribute, a global the code reads, the source, the input shape, an option)
misses and compiles afresh. Each test compares with eager PyTorch (rtol/atol 1e-5)."""

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch

import chroma
from chroma.cache import fingerprint

TOL = dict(rtol=1e-5, atol=1e-5)


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(6, 5)
        self.scale = 2.0

    def forward(self, x):
        return torch.tanh(self.lin(x)) * self.scale


def compile_and_check(model, x, out, cache):
    prog = chroma.compile(model, (x,), out=str(out), cache_dir=str(cache))
    with torch.no_grad():
        np.testing.assert_allclose(prog(x.numpy()), model(x).numpy(), **TOL)
    return prog


def test_second_compile_is_a_hit_and_changes_miss(tmp_path):
    cache = tmp_path / "cache"
    m = Scaled().eval()
    x = torch.randn(3, 6)
    p1 = compile_and_check(m, x, tmp_path / "a", cache)
    assert p1.timings["model_cache"] == "miss" and "export" in p1.timings
    p2 = compile_and_check(m, torch.randn(3, 6), tmp_path / "b", cache)  # other values, same shapes
    assert p2.timings["model_cache"] == "hit" and "export" not in p2.timings
    assert p2.manifest["build"]["cached"] is True
    assert p2.manifest["source"]["digest"] == p1.manifest["source"]["digest"]
    # Each of these changes what the program computes: never a hit.
    with torch.no_grad():
        m.lin.weight[0, 0] += 1.0
    assert compile_and_check(m, x, tmp_path / "c", cache).timings["model_cache"] == "miss"
    m.scale = 3.0
    assert compile_and_check(m, x, tmp_path / "d", cache).timings["model_cache"] == "miss"
    assert compile_and_check(m, torch.randn(4, 6), tmp_path / "e", cache).timings["model_cache"] == "miss"
    m.lin.register_forward_hook(lambda mod, inp, out: out + 1)
    assert compile_and_check(m, x, tmp_path / "f", cache).timings["model_cache"] == "miss"
    p = chroma.compile(m, (x,), out=str(tmp_path / "g"), cache_dir=str(cache), blas=False)
    assert p.timings["model_cache"] == "miss"
    # And the earlier forms are still served, with their own results.
    m2 = Scaled().eval()
    p3 = compile_and_check(m2, x, tmp_path / "h", cache)
    assert p3.timings["model_cache"] == "hit"


SCALE = torch.tensor([1.0, 2.0, 3.0])


def uses_global(x):
    return x * SCALE + 1


def test_functions_key_on_closures_and_globals(tmp_path):
    global SCALE
    cache = tmp_path / "cache"
    x = torch.randn(2, 3)
    p1 = chroma.compile(uses_global, (x,), out=str(tmp_path / "a"), cache_dir=str(cache))
    np.testing.assert_allclose(p1(x.numpy()), uses_global(x).numpy(), **TOL)
    old = SCALE
    try:
        SCALE = torch.tensor([5.0, 6.0, 7.0])
        p2 = chroma.compile(uses_global, (x,), out=str(tmp_path / "b"), cache_dir=str(cache))
        assert p2.timings["model_cache"] == "miss"
        np.testing.assert_allclose(p2(x.numpy()), uses_global(x).numpy(), **TOL)
    finally:
        SCALE = old

    def make(c):
        return lambda t: t * c

    pa = chroma.compile(make(2.0), (x,), out=str(tmp_path / "c"), cache_dir=str(cache))
    pb = chroma.compile(make(3.0), (x,), out=str(tmp_path / "d"), cache_dir=str(cache))
    assert pb.timings["model_cache"] == "miss"
    np.testing.assert_allclose(pa(x.numpy()), (x * 2).numpy(), **TOL)
    np.testing.assert_allclose(pb(x.numpy()), (x * 3).numpy(), **TOL)


class WithLock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()  # a C object the fingerprint cannot describe

    def forward(self, x):
        return x.exp()


def test_uncacheable_models_compile_the_long_way(tmp_path):
    x = torch.randn(4)
    p = chroma.compile(WithLock(), (x,), out=str(tmp_path / "a"), cache_dir=str(tmp_path / "cache"))
    assert p.timings["model_cache"].startswith("not used: cannot describe an object of type _thread.lock")
    assert "lock" in p.timings["model_cache"]
    np.testing.assert_allclose(p(x.numpy()), x.exp().numpy(), **TOL)
    with pytest.raises(fingerprint.Uncacheable, match="tensor subclass"):
        class Sub(torch.Tensor):
            pass
        fingerprint.compile_key([("forward", lambda t: t, (torch.zeros(1).as_subclass(Sub),))], {})


def test_cache_off_damaged_entry_and_eviction(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    x = torch.randn(3, 6)
    m = Scaled().eval()
    assert chroma.compile(m, (x,), out=str(tmp_path / "o"), cache_dir="").timings["model_cache"] == "off"
    monkeypatch.setenv("CHROMA_MODEL_CACHE", "0")
    assert chroma.compile(m, (x,), out=str(tmp_path / "o"), cache_dir=str(cache)).timings["model_cache"] == "off"
    monkeypatch.delenv("CHROMA_MODEL_CACHE")
    compile_and_check(m, x, tmp_path / "a", cache)
    (entry,) = [e for e in (cache / "models").iterdir() if not e.name.startswith(".")]
    # Damage the stored weights (a new file: the artifact in "a" keeps its own).
    w = entry / "weights.bin"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0xFF
    os.remove(w)
    w.write_bytes(bytes(data))
    p = compile_and_check(m, x, tmp_path / "b", cache)
    assert p.timings["model_cache"].startswith("damaged entry removed")
    assert compile_and_check(m, x, tmp_path / "c", cache).timings["model_cache"] == "hit"
    # Over the size limit, the least recently used entries go.
    size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
    monkeypatch.setenv("CHROMA_MODEL_CACHE_BYTES", str(int(size * 2.5)))
    for rows in (2, 4, 5):
        compile_and_check(m, torch.randn(rows, 6), tmp_path / f"r{rows}", cache)
    left = [e for e in (cache / "models").iterdir() if not e.name.startswith(".")]
    assert len(left) == 2 and entry not in left


def test_new_process_sees_source_edits(tmp_path):
    """Two processes, one model file: unchanged -> hit; edited -> miss and the new result."""
    src = tmp_path / "usermodel.py"
    script = textwrap.dedent("""
        import sys, numpy as np, torch, chroma
        sys.path.insert(0, sys.argv[1])
        import usermodel
        x = torch.linspace(-1, 1, 12).reshape(3, 4)
        p = chroma.compile(usermodel.M(), (x,), out=sys.argv[2], cache_dir=sys.argv[3])
        np.testing.assert_allclose(p(x.numpy()), usermodel.M()(x).numpy(), rtol=1e-5, atol=1e-5)
        print(p.timings["model_cache"])
    """)
    body = "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x.{} * 2\n"

    def run(out):
        r = subprocess.run([sys.executable, "-c", script, str(tmp_path), str(tmp_path / out), str(tmp_path / "cache")],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().splitlines()[-1]

    src.write_text(body.format("exp()"))
    assert run("a") == "miss"
    assert run("b") == "hit"
    src.write_text(body.format("sin()"))
    assert run("c") == "miss"
