"""Golden IR tests: a function, the pipeline stage to print, and CHECK lines.

Each case exports a small function, prints the IR after `import`, after the optimizing
passes (`optimized`: constant folding, DCE, CSE), or the `lowered` kernels and memory plan,
and matches CHECK lines in order (CHECK-NOT: must not appear anywhere), as in LLVM's
FileCheck.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

import chroma  # noqa: E402
from chroma import _compiler  # noqa: E402


def ir(fn, inputs, stage, tmp_path):
    path = str(tmp_path / "g.cgraph")
    chroma.export(fn, inputs, path)
    return _compiler.dump_graph(path, stage)


def filecheck(text, checks):
    pos = 0
    for c in checks:
        kind, _, pattern = c.partition(":")
        pattern = pattern.strip()
        if kind == "CHECK":
            at = text.find(pattern, pos)
            assert at >= 0, f"CHECK: {pattern!r} not found after offset {pos} in:\n{text}"
            pos = at + len(pattern)
        elif kind == "CHECK-NOT":
            assert pattern not in text, f"CHECK-NOT: {pattern!r} found in:\n{text}"
        else:
            raise ValueError(c)


class ConstMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 3))
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x):
        # (w * scale) is constant work: folded at compile time.
        return x @ (self.w * self.scale)


CASES = [
    # Import makes broadcasts and casts explicit.
    ("broadcast", lambda x, y: x + y, (torch.randn(3, 1), torch.randn(4)), "import",
     ["CHECK: Expand(%0) : f32[3,4]", "CHECK: Reshape(%1) : f32[1,4]", "CHECK: Expand(%3) : f32[3,4]",
      "CHECK: Map.add(%2, %4) : f32[3,4]", "CHECK: return %5"]),
    ("promote", lambda x, i: x * i, (torch.randn(3), torch.arange(3)), "import",
     ["CHECK: Cast(%1) {dtype=float32} : f32[3]", "CHECK: Map.mul"]),
    # Softmax is one primitive: its kernel makes three passes over each row while it is in cache.
    ("softmax", lambda x: torch.softmax(x, -1), (torch.randn(2, 5),), "import",
     ["CHECK: %1 = Softmax(%0) {axis=1} : f32[2,5]", "CHECK-NOT: Reduce"]),
    ("log_softmax_fused_input", lambda x: torch.log_softmax(x * 2 - 1, 0), (torch.randn(2, 5),), "lowered",
     ["CHECK: kernels: 1", "CHECK: k0: Softmax <- mul sub"]),
    # Variance: mean, centered square, mean (Bessel's correction in the divisor).
    ("var", lambda x: x.var(-1), (torch.randn(2, 5),), "import",
     ["CHECK: Reduce.sum", "CHECK: Map.div", "CHECK: Map.sub", "CHECK: Map.mul", "CHECK: Reduce.sum",
      "CHECK: Full() {value=4.0}", "CHECK: Map.div"]),
    # Constant folding runs the reference kernels on weights.
    ("fold", ConstMLP(), (torch.randn(2, 4),), "optimized",
     ["CHECK: Constant() {slot=", "CHECK: MatMul", "CHECK-NOT: Map.mul"]),
    # CSE merges the duplicated exp.
    ("cse", lambda x: x.exp() + x.exp(), (torch.randn(3),), "optimized",
     ["CHECK: Map.exp", "CHECK: Map.add(%1, %1)"]),
    # DCE drops unused work.
    ("dce", lambda x: (x.sin(), x.cos())[0], (torch.randn(3),), "optimized",
     ["CHECK: Map.sin", "CHECK-NOT: Map.cos"]),
    # Fusion: one reduction kernel consumes the whole elementwise chain.
    ("fusion", lambda x: (x + 1).sin().sum(-1), (torch.randn(4, 7),), "lowered",
     ["CHECK: kernels: 1", "CHECK: k0: Reduce.sum <- add sin", "CHECK: arena 0 B"]),
    # A value read twice is materialized once.
    ("shared", lambda x: (x.exp() * 2).sum(-1) + (x.exp() * 2).amax(-1), (torch.randn(4, 7),), "lowered",
     ["CHECK: kernels: 4", "CHECK: k0: Map.mul <- exp", "CHECK: Reduce.sum", "CHECK: Reduce.max"]),
    # Views are layouts: a transpose feeding a matmul costs no copy.
    ("view", lambda a, b: a.t() @ b, (torch.randn(5, 3), torch.randn(5, 4)), "lowered",
     ["CHECK: kernels: 1", "CHECK: k0: MatMul"]),
]


@pytest.mark.parametrize("name,fn,inputs,stage,checks", CASES, ids=[c[0] for c in CASES])
def test_golden(name, fn, inputs, stage, checks, tmp_path):
    filecheck(ir(fn, inputs, stage, tmp_path), checks)


def test_filecheck_can_fail():
    with pytest.raises(AssertionError):
        filecheck("a\nb\n", ["CHECK: b", "CHECK: a"])
    with pytest.raises(AssertionError):
        filecheck("a\nb\n", ["CHECK-NOT: b"])
