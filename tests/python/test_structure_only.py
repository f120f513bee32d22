"""Models built without their weights (chroma.frontend.exporter.structure_only) compiled with
their weights read from safetensors files (chroma.frontend.weights.safetensors_weights): the
same program as the model with its weights loaded; bfloat16 files for a float32 model widen
exactly in the graph; errors name the weight and the file. The memory such a compile takes is
bounded in a child process (RssAnon, as tests/python/test_compile_memory.py measures it)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import chroma
from chroma.frontend.exporter import ExportError, structure_only
from chroma.frontend.weights import SafetensorsError, safetensors_weights
from conftest import CPU

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


class Net(torch.nn.Module):
    def __init__(self, width=32, layers=3):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(layers)])
        self.register_buffer("offset", torch.linspace(-1, 1, width), persistent=False)

    def forward(self, x):
        x = self.norm(x) + self.offset
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return x


def _save(model, path, dtype=None):
    sd = {k: (v.to(dtype) if dtype is not None else v).contiguous() for k, v in model.state_dict().items()}
    save_file(sd, path)


@pytest.mark.skipif(not CPU, reason="compiles for the CPU target (the GPU targets' packages need golden data from an eager run)")
@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_compiles_from_files_like_the_loaded_model(tmp_path, stored):
    torch.manual_seed(0)
    real = Net().eval()
    path = str(tmp_path / "w.safetensors")
    _save(real, path, stored)
    with structure_only():
        bare = Net().eval()
    # Parameters without data; the buffer __init__ computes (no file holds it) is real.
    assert all(type(p).__name__ == "FakeTensor" for p in bare.parameters())
    assert type(bare.offset) is torch.Tensor
    x = torch.randn(4, 32)
    prog = chroma.compile(bare, (x,), out=str(tmp_path / "art"), weight_data=safetensors_weights([path]))
    if stored != torch.float32:
        real.load_state_dict({k: v.to(stored).float() for k, v in real.state_dict().items()})
    np.testing.assert_allclose(prog(x.numpy()), real(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_errors_name_the_weight_and_the_file(tmp_path):
    torch.manual_seed(0)
    real = Net().eval()
    path = str(tmp_path / "w.safetensors")
    sd = {k: v for k, v in real.state_dict().items() if k != "layers.1.weight"}
    sd["layers.2.bias"] = torch.zeros(5)
    save_file(sd, path)
    with structure_only():
        bare = Net().eval()
    from chroma.frontend.exporter import export

    with pytest.raises(ExportError, match=r"'layers.1.weight' has no data"):
        export(bare, (torch.randn(2, 32),), weight_data=safetensors_weights([path]))
    sd["layers.1.weight"] = torch.zeros(32, 32, dtype=torch.float64)
    del sd["layers.2.bias"]
    save_file(sd, path)
    with pytest.raises(ExportError, match=r"'layers.1.weight' is stored as torch.float64"):
        export(bare, (torch.randn(2, 32),), weight_data=safetensors_weights([path]))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((20).to_bytes(8, "little") + b'{"a": {"dtype": "F32"')
    with pytest.raises(SafetensorsError, match="bad.safetensors.*not JSON"):
        safetensors_weights([str(bad)])
    header = b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}'
    bad.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(SafetensorsError, match=f"'a': its bytes end at {8 + len(header) + 16}"):
        safetensors_weights([str(bad)])


CHILD = r"""
import json, sys
import torch
sys.path.insert(0, sys.argv[3])
from memwatch import AnonPeak
from test_structure_only import Net
from chroma.compiler import build_graph
from chroma.frontend.exporter import export, structure_only
from chroma.frontend.weights import safetensors_weights
with structure_only():
    bare = Net(1024, 20).eval()
x = torch.randn(3, 1024)
# torch.export's own tracing first (its memory is the exporter's, not the weights'); then the
# weights' part, measured: the digests and the graph file's writing, the compile.
g = export(bare, (x,), weight_data=safetensors_weights([sys.argv[1]]))
with AnonPeak() as m:
    g.write(sys.argv[2] + ".cgraph")
    build_graph(sys.argv[2] + ".cgraph", sys.argv[2], weights="q4")
print(json.dumps({"base": m.base, "peak": m.peak}))
"""


@pytest.mark.skipif(not CPU, reason="measures the CPU target's compile")
def test_export_and_compile_never_hold_the_weights(tmp_path):
    torch.manual_seed(0)
    path = str(tmp_path / "big.safetensors")
    _save(Net(1024, 20), path, torch.bfloat16)  # 40 MiB of bfloat16 weights
    weight_bytes = os.path.getsize(path)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, "-c", CHILD, path, str(tmp_path / "art"), os.path.dirname(__file__)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    mem = json.loads(r.stdout.strip().splitlines()[-1])
    # Writing the graph file and compiling it: the q4 panels (about a quarter of the bfloat16
    # bytes) and one weight widened at a time; the weights themselves stay file pages.
    assert mem["peak"] - mem["base"] < 0.6 * weight_bytes, (mem, weight_bytes)
