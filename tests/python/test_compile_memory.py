"""Compile memory: a graph file's weights are mapped, not copied (src/import/importer.cpp,
src/ir/blob.h), and the CPU artifact's weights.bin is written tensor by tensor, never held
whole (src/artifact/common.cpp); the export streams the weights from the model's tensors.

The compile runs in a child process that samples its own anonymous resident memory
(RssAnon: what the kernel cannot drop; a mapped file's pages are RssFile, page cache) while
the compiler runs; the bound is a fraction of the weight bytes, far below the copies the
compiler used to make (the file read whole, then each weight copied: twice the weights).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import CPU

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")

CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[4])
from memwatch import AnonPeak
from chroma.compiler import build_graph
with AnonPeak() as m:
    build_graph(sys.argv[1], sys.argv[2], weights=sys.argv[3] or None)
print(json.dumps({"base": m.base, "peak": m.peak}))
"""


class Stack(torch.nn.Module):
    def __init__(self, layers, width):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(layers)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def _compile(graph, out, weights, **env_extra):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), **env_extra)
    r = subprocess.run([sys.executable, "-c", CHILD, graph, out, weights, os.path.dirname(__file__)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not CPU, reason="measures the CPU target's compile")
def test_large_graph_compiles_without_copying_its_weights(tmp_path):
    import chroma
    from chroma.frontend.exporter import export

    torch.manual_seed(0)
    model = Stack(20, 1024).eval()  # 80 MiB of float32 weights: above the mapping threshold (1 MiB)
    x = torch.randn(3, 1024)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    graph = str(tmp_path / "g.cgraph")
    export(model, (x,), graph)
    assert os.path.getsize(graph) > weight_bytes
    # float32: the mapped weights give the same results as eager.
    _compile(graph, str(tmp_path / "fp32"), "")
    want = model(x).detach().numpy()
    np.testing.assert_allclose(chroma.load(str(tmp_path / "fp32"))(x.numpy()), want, rtol=1e-4, atol=1e-5)
    # q4: the stored weights are about an eighth of the float32 ones; the compiler quantizes
    # one weight at a time from the mapped file. Before, the file read whole and the copy of
    # each weight took twice the weight bytes.
    mem = _compile(graph, str(tmp_path / "q4"), "q4")
    assert mem["peak"] - mem["base"] < 0.35 * weight_bytes, (mem, weight_bytes)
    got = chroma.load(str(tmp_path / "q4"))(x.numpy())
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.25


@pytest.mark.skipif(not CPU, reason="measures the CPU target's compile")
def test_constants_the_compile_makes_are_spilled_to_a_scratch_file(tmp_path):
    """The weights the lowering makes (here float32 products of 3 rows, packed in panels: a
    second copy of every weight) go to a scratch file and are mapped from it (ir/spill.h) once
    CHROMA_SPILL_AFTER bytes were kept in memory: the anonymous peak stays far below the
    weights (kept, it held all the packed copies: about the weight bytes), the artifact is
    the same file, and the scratch file is gone."""
    import chroma
    from chroma.frontend.exporter import export

    torch.manual_seed(1)
    model = Stack(20, 1024).eval()
    x = torch.randn(3, 1024)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    graph = str(tmp_path / "g.cgraph")
    export(model, (x,), graph)
    kept = _compile(graph, str(tmp_path / "kept"), "", CHROMA_SPILL_AFTER=str(1 << 40))
    spilled = _compile(graph, str(tmp_path / "spilled"), "", CHROMA_SPILL_AFTER="0")
    assert kept["peak"] - kept["base"] > 0.9 * weight_bytes, kept  # what the spill removes is there
    assert spilled["peak"] - spilled["base"] < 0.35 * weight_bytes, (spilled, weight_bytes)
    manifests = [json.load(open(tmp_path / d / "manifest.json")) for d in ("kept", "spilled")]
    assert manifests[0]["weights"]["digest"] == manifests[1]["weights"]["digest"]
    assert not [n for n in os.listdir(tmp_path / "spilled") if n.startswith(".chroma-spill")]
    want = model(x).detach().numpy()
    np.testing.assert_allclose(chroma.load(str(tmp_path / "spilled"))(x.numpy()), want, rtol=1e-4, atol=1e-5)
