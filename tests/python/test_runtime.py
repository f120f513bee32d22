"""Runtime tests: loading without torch, the C ABI from C++, jit, torch.compile, the CLI."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import chroma  # noqa: E402
import chroma.jitting as cjit  # noqa: E402


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(7, 16)
        self.b = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.fixture(scope="module")
def mlp_artifact(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("mlp"))
    x = torch.randn(5, 7)
    m = MLP().eval()
    chroma.compile(m, (x,), out=out)
    with torch.no_grad():
        ref = m(x).numpy()
    return out, x.numpy(), ref


def test_load_and_run_where_torch_cannot_be_imported(mlp_artifact, tmp_path):
    out, x, ref = mlp_artifact
    np.save(tmp_path / "x.npy", x)
    script = textwrap.dedent(f"""
        import sys, builtins
        real_import = builtins.__import__
        def guarded(name, *a, **k):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is not allowed in this process")
            return real_import(name, *a, **k)
        builtins.__import__ = guarded
        sys.path.insert(0, {os.path.join(ROOT, 'python')!r})
        import numpy as np, chroma
        prog = chroma.load({out!r})
        y = prog(np.load({str(tmp_path / 'x.npy')!r}))
        np.save({str(tmp_path / 'y.npy')!r}, y)
        assert "torch" not in sys.modules
        try:
            import torch
        except ImportError:
            print("torch blocked")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "torch blocked" in r.stdout
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), ref, rtol=1e-5, atol=1e-5)


def test_cpp_host_runs_artifact_without_python(mlp_artifact, tmp_path):
    out, x, ref = mlp_artifact
    exe = str(tmp_path / "chroma_run")
    subprocess.run(["c++", "-std=c++20", "-O1", "-I", os.path.join(ROOT, "include"),
                    os.path.join(ROOT, "tools", "chroma_run.cpp"), "-o", exe, "-ldl", "-lcrypto"], check=True)
    x.tofile(tmp_path / "x.bin")
    env = dict(os.environ, CHROMA_RUN_SAVE=str(tmp_path / "y"))
    r = subprocess.run([exe, out, str(tmp_path / "x.bin")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "output 0: float32[5,3]" in r.stdout
    y = np.fromfile(tmp_path / "y.0.bin", dtype=np.float32).reshape(5, 3)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    # A corrupted weights file is refused by the C ABI too.
    bad = tmp_path / "bad"
    subprocess.run(["cp", "-r", out, str(bad)], check=True)
    with open(bad / "weights.bin", "r+b") as f:
        f.seek(3)
        b = f.read(1)
        f.seek(3)
        f.write(bytes([b[0] ^ 0xFF]))
    r = subprocess.run([exe, str(bad)], capture_output=True, text=True)
    assert r.returncode == 1 and "corrupt or from another build: digest" in r.stderr, r.stderr


def test_stats_and_manifest(mlp_artifact):
    out, _, _ = mlp_artifact
    prog = chroma.load(out)
    s = prog.stats
    assert s["kernels"] >= 3 and s["weight_bytes"] >= (7 * 16 + 16 + 16 * 3 + 3) * 4
    assert s["output_bytes"] == 5 * 3 * 4 and s["input_bytes"] == 5 * 7 * 4
    assert s["arena_bytes"] <= s["temporaries_bytes"]
    assert prog.manifest["inputs"][0]["name"] == "x"


def test_jit_caches_per_shape_in_memory_and_on_disk(tmp_path, monkeypatch):
    calls = []
    real = cjit.build_graph

    def counting(*a, **k):
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr(cjit, "build_graph", counting)
    f = chroma.jit(lambda x: torch.tanh(x) * 2, cache_dir=str(tmp_path))
    x1, x2 = torch.randn(3, 4), torch.randn(2, 5)
    torch.testing.assert_close(f(x1), torch.tanh(x1) * 2)
    torch.testing.assert_close(f(x1 + 1), torch.tanh(x1 + 1) * 2)
    assert len(calls) == 1
    torch.testing.assert_close(f(x2), torch.tanh(x2) * 2)
    assert len(calls) == 2 and len(f.programs) == 2
    y = f(x1.numpy())
    assert isinstance(y, np.ndarray)
    # A new wrapper (as in a new process) finds the artifacts on disk.
    g = chroma.jit(lambda x: torch.tanh(x) * 2, cache_dir=str(tmp_path))
    torch.testing.assert_close(g(x1), torch.tanh(x1) * 2)
    assert len(calls) == 2


def test_torch_compile_backend(tmp_path, monkeypatch):
    monkeypatch.setenv("CHROMA_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    m = MLP().eval()
    x = torch.randn(5, 7)
    cm = torch.compile(m, backend="chroma")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


def test_cli_compile_inspect_run(tmp_path):
    g = str(tmp_path / "m.cgraph")
    chroma.export(lambda x: torch.softmax(x * 3, -1), (torch.randn(2, 6),), g)
    out = str(tmp_path / "art")
    cli = [sys.executable, "-m", "chroma"]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run(cli + ["compile", g, "-o", out], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "kernels" in r.stdout
    r = subprocess.run(cli + ["inspect", out], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "memory plan: arena" in r.stdout and "k0:" in r.stdout
    x = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run(cli + ["run", out, str(tmp_path / "x.npy"), "--save", str(tmp_path / "y.npz")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    y = np.load(tmp_path / "y.npz")["arr_0"]
    np.testing.assert_allclose(y, torch.softmax(torch.from_numpy(x) * 3, -1).numpy(), rtol=1e-5, atol=1e-6)
    r = subprocess.run(cli + ["run", str(tmp_path / "nothing")], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "ArtifactError" in r.stderr


def test_numpy_example_inputs_are_accepted(tmp_path):
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    prog = chroma.compile(lambda x: torch.tanh(x) + 1, (x,), out=str(tmp_path / "np"))
    np.testing.assert_allclose(prog(x), np.tanh(x) + 1, rtol=1e-6, atol=1e-6)


def test_results_are_never_overwritten_but_dropped_ones_are_reused(tmp_path):
    # Without out=, each call's outputs come from arrays nothing else refers to: the
    # previous call's when the caller dropped them (no page faults for a fresh array on
    # every call), new ones when the caller still holds them or a view of them.
    class Two(torch.nn.Module):
        def forward(self, x):
            return x * 2, x + 1

    x = torch.randn(64, 1024)
    prog = chroma.compile(Two(), (x,), out=str(tmp_path / "two"))

    def addr(a):
        return a.__array_interface__["data"][0]

    xs = [np.full((64, 1024), float(i), np.float32) for i in range(4)]
    a, b = prog(xs[0])
    held = (addr(a), addr(b))
    c, d = prog(xs[1])  # a and b still held: new arrays
    assert addr(c) not in held and addr(d) not in held
    np.testing.assert_array_equal(a, xs[0] * 2)
    np.testing.assert_array_equal(b, xs[0] + 1)
    np.testing.assert_array_equal(c, xs[1] * 2)
    reused = (addr(c), addr(d))
    view = d[3:5]
    del a, b, c, d
    e, f = prog(xs[2])  # d lives on through its view: new arrays again
    assert addr(f) != reused[1] and addr(e) != reused[0]
    np.testing.assert_array_equal(view, xs[1][3:5] + 1)
    last = (addr(e), addr(f))
    del e, f, view
    g, h = prog(xs[3])  # nothing refers to the last call's arrays: they are used again
    assert (addr(g), addr(h)) == last
    np.testing.assert_array_equal(g, xs[3] * 2)
    np.testing.assert_array_equal(h, xs[3] + 1)
