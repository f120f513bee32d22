"""Writes the fuzzers' seed corpora from the test models (scripts/fuzz.sh runs this).

    python tests/fuzz/make_corpus.py OUT_DIR

OUT_DIR/graph/: .cgraph files of small models covering the main op families (linear layers,
convolutions and batch norm, attention, indexing, reductions, integer arithmetic, state);
OUT_DIR/manifest/: the manifest.json of an artifact compiled from some of them.
"""

import os
import shutil
import sys
import tempfile

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

import chroma  # noqa: E402
from chroma.frontend.exporter import export  # noqa: E402


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x):
        self.count += x
        return self.count * 2


def models():
    torch.manual_seed(0)
    yield "mlp", nn.Sequential(nn.Linear(7, 16), nn.ReLU(), nn.Linear(16, 3)).eval(), (torch.randn(4, 7),)
    yield "conv", nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                nn.MaxPool2d(2)).eval(), (torch.randn(1, 3, 8, 8),)
    yield "attn", nn.MultiheadAttention(8, 2, batch_first=True).eval(), (torch.randn(1, 5, 8),) * 3
    yield "norm", nn.Sequential(nn.LayerNorm(6), nn.GELU(), nn.Softmax(-1)).eval(), (torch.randn(2, 6),)
    yield "index", lambda x, i: (x[i].sum(0), torch.gather(x, 1, i[:, None].expand(-1, 3)), *x.topk(2, -1)), \
        (torch.randn(4, 3), torch.tensor([0, 2, 1, 3]))
    yield "intdiv", lambda a, b: (a // b, a % b, torch.fmod(a, b), (a << 2) ^ b), \
        (torch.tensor([7, -7, 9]), torch.tensor([2, -3, 4]))
    yield "reduce", lambda x: (x.cumsum(1), x.amax(0), x.argmax(1), x.mean((0, 1), keepdim=True)), (torch.randn(3, 5),)
    yield "state", Counter(), (torch.ones(3),)


def main(out):
    os.makedirs(os.path.join(out, "graph"), exist_ok=True)
    os.makedirs(os.path.join(out, "manifest"), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn, inputs in models():
            export(fn, inputs).write(os.path.join(out, "graph", name + ".cgraph"))
            if name in ("mlp", "state", "index"):
                art = os.path.join(tmp, name)
                chroma.compile(fn, inputs, out=art)
                shutil.copy(os.path.join(art, "manifest.json"), os.path.join(out, "manifest", name + ".json"))
    print(f"corpus: {len(os.listdir(os.path.join(out, 'graph')))} graphs, "
          f"{len(os.listdir(os.path.join(out, 'manifest')))} manifests in {out}")


if __name__ == "__main__":
    main(sys.argv[1])
