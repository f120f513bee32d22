"""Tests for chroma.export and chroma.frontend.graph_file (the .cgraph format).

Run: cd /work/main && PYTHONPATH=python .venv/bin/python -m pytest tests/python/test_export.py -q
"""

import json
import os
import struct
import sys
import warnings

import pytest
import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

from chroma.frontend import graph_file  # noqa: E402
from chroma.frontend.exporter import ExportError, check_torch_version, export  # noqa: E402
from chroma.frontend.graph_file import GraphFileError  # noqa: E402


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(7, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(h)


def _raw(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _nodes_by_target(g, target):
    return [n for n in g["nodes"] if n["target"] == target]


def _all_refs(obj):
    """Yield every REF dict nested anywhere in obj."""
    if isinstance(obj, dict):
        if "ref" in obj:
            yield obj
        for v in obj.values():
            yield from _all_refs(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _all_refs(v)


def test_mlp_round_trip(tmp_path):
    torch.manual_seed(0)
    model = MLP().eval()
    path = str(tmp_path / "mlp.cgraph")
    g = export(model, (torch.randn(5, 7),), path)
    j, blob = graph_file.read(path, verify_hashes=True)
    assert j == g.json
    assert bytes(blob) == g.blob
    assert j["format"] == "chroma.graph" and j["version"] == 1
    assert j["producer"]["torch"] == torch.__version__
    assert j["inputs"] == [{"name": "x", "dtype": "float32", "shape": [5, 7]}]
    assert j["output_structure"] == "single"
    sd = model.state_dict()
    assert sorted(w["source"] for w in j["weights"]) == sorted(sd)
    for w in j["weights"]:
        assert w["kind"] == "parameter"
        assert w["offset"] % 64 == 0
        assert w["shape"] == list(sd[w["source"]].shape)
        assert bytes(blob[w["offset"]:w["offset"] + w["nbytes"]]) == _raw(sd[w["source"]])
    addmm = _nodes_by_target(j, "aten.addmm.default")
    assert len(addmm) == 2
    assert addmm[-1]["outputs"] == [{"dtype": "float32", "shape": [5, 3]}]
    assert j["outputs"] == [{"ref": addmm[-1]["name"]}]
    # every ref names an input, a weight or an earlier node
    known = {i["name"] for i in j["inputs"]} | {w["name"] for w in j["weights"]}
    for n in j["nodes"]:
        for r in _all_refs(n["args"]):
            assert r["ref"] in known
        known.add(n["name"])
    # header layout
    raw = open(path, "rb").read()
    magic, ver, hsize, joff, jlen, doff, dlen = struct.unpack_from("<8sIIQQQQ", raw)
    assert (magic, ver, hsize, joff) == (b"CHRGRAPH", 1, 64, 64)
    assert doff % 64 == 0 and doff >= joff + jlen and doff + dlen == len(raw)
    assert raw[48:64] == bytes(16)


def test_dedup_equal_buffers_and_tied_tensor():
    class Dup(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("a", torch.arange(5, dtype=torch.float32))
            self.register_buffer("b", torch.arange(5, dtype=torch.float32))
            self.register_buffer("z32", torch.zeros(5, dtype=torch.int32))
            self.register_buffer("zf", torch.zeros(5, dtype=torch.float32))
            self.w = nn.Parameter(torch.randn(5))
            self.w2 = self.w  # the same tensor held twice

        def forward(self, x):
            return x * self.a + self.b + self.z32 + self.zf + self.w + self.w2

    g = export(Dup(), (torch.randn(5),))
    ws = {w["source"]: w for w in g.json["weights"]}
    assert ws["a"]["offset"] == ws["b"]["offset"]
    assert ws["a"]["sha256"] == ws["b"]["sha256"]
    # same bytes but different dtype: stored separately
    assert ws["z32"]["offset"] != ws["zf"]["offset"]
    offsets = {w["offset"] for w in g.json["weights"]}
    # unique 20-byte payloads: arange, zeros(int32), zeros(float32), w; each
    # starts on a 64-byte boundary, no padding after the last one
    assert sorted(offsets) == [0, 64, 128, 192]
    assert len(g.blob) == 3 * 64 + 20
    sources = {w["source"] for w in g.json["weights"]}
    assert {"a", "b", "z32", "zf", "w", "w2"} == sources
    assert ws["w"]["offset"] == ws["w2"]["offset"]  # tied tensor: stored once


def test_multi_output_ops_use_index_refs():
    class M(nn.Module):
        def forward(self, x):
            v, i = torch.topk(x, 3)
            a, b = torch.split(x, [2, 6], dim=1)
            return v, i, b * 2, a

    g = export(M(), (torch.randn(4, 8),)).json
    assert all(n["target"] != "getitem" and "getitem" not in n["name"] for n in g["nodes"])
    (topk,) = _nodes_by_target(g, "aten.topk.default")
    assert topk["outputs"] == [{"dtype": "float32", "shape": [4, 3]},
                               {"dtype": "int64", "shape": [4, 3]}]
    (split,) = _nodes_by_target(g, "aten.split_with_sizes.default")
    assert [o["shape"] for o in split["outputs"]] == [[4, 2], [4, 6]]
    assert g["output_structure"] == "tuple"
    assert g["outputs"][0] == {"ref": topk["name"], "index": 0}
    assert g["outputs"][1] == {"ref": topk["name"], "index": 1}
    assert g["outputs"][3] == {"ref": split["name"], "index": 0}
    (mul,) = _nodes_by_target(g, "aten.mul.Tensor")
    assert mul["args"][0] == {"ref": split["name"], "index": 1}


def test_list_output_structure():
    g = export(lambda x: [x + 1, x - 1], (torch.randn(3),)).json
    assert g["output_structure"] == "list" and len(g["outputs"]) == 2


def test_floats_wrapped_ints_not(tmp_path):
    class M(nn.Module):
        def forward(self, x):
            y = x * 2.0 + 1
            return y.masked_fill(x > 0.5, float("-inf"))

    path = str(tmp_path / "f.cgraph")
    export(M(), (torch.randn(4),), path)
    g, _ = graph_file.read(path)
    (mul,) = _nodes_by_target(g, "aten.mul.Tensor")
    assert mul["args"][1] == {"float": 2.0}
    (add,) = _nodes_by_target(g, "aten.add.Tensor")
    assert add["args"][1] == 1 and isinstance(add["args"][1], int)
    (gt,) = _nodes_by_target(g, "aten.gt.Scalar")
    assert gt["args"][1] == {"float": 0.5}
    text = json.dumps(g)
    assert '{"float": "-inf"}' in text
    assert "Infinity" not in text and "NaN" not in text


def test_source_points_at_this_file():
    class M(nn.Module):
        def forward(self, x):
            return torch.tanh(x) + 3  # marker-line

    g = export(M(), (torch.randn(2),)).json
    (tanh,) = _nodes_by_target(g, "aten.tanh.default")
    assert tanh["source"].startswith("test_export.py:")
    assert "in forward: return torch.tanh(x) + 3  # marker-line" in tanh["source"]
    # Linear's ops are attributed to the user's call site, not torch/nn/functional.py
    g = export(MLP(), (torch.randn(1, 7),)).json
    for n in _nodes_by_target(g, "aten.addmm.default"):
        assert n["source"].startswith("test_export.py:"), n["source"]


def test_plain_function_export():
    def f(a, b):
        return torch.relu(a) @ b

    g = export(f, (torch.randn(3, 4), torch.randn(4, 5))).json
    assert [i["name"] for i in g["inputs"]] == ["a", "b"]
    assert g["weights"] == []
    (relu,) = _nodes_by_target(g, "aten.relu.default")
    assert relu["source"].startswith("test_export.py:"), relu["source"]
    assert relu["source"].endswith("in f: return torch.relu(a) @ b")
    assert _nodes_by_target(g, "aten.mm.default")[0]["outputs"][0]["shape"] == [3, 5]


def test_dtype_device_kwargs_encoded():
    g = export(lambda x: x.to(torch.float16) * 3, (torch.randn(3),)).json
    (cp,) = _nodes_by_target(g, "aten._to_copy.default")
    assert cp["kwargs"]["dtype"] == {"dtype": "float16"}
    assert cp["outputs"] == [{"dtype": "float16", "shape": [3]}]


def test_dict_output_rejected():
    with pytest.raises(ExportError, match="dict"):
        export(lambda x: {"y": x + 1}, (torch.randn(2),))


def test_none_output_rejected():
    with pytest.raises(ExportError, match="output 1"):
        export(lambda x: (x + 1, None), (torch.randn(2),))


def test_non_tensor_input_rejected():
    with pytest.raises(ExportError, match="input 1 is a int"):
        export(lambda x, n: x * n, (torch.randn(2), 3))


def test_unsupported_input_dtype_rejected():
    with pytest.raises(ExportError, match="input 0 .*complex64"):
        export(lambda x: x * 2, (torch.randn(2, dtype=torch.complex64),))


def test_unsupported_weight_dtype_rejected():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c", torch.ones(2, dtype=torch.complex64))

        def forward(self, x):
            return x + self.c.real

    with pytest.raises(ExportError, match="weight 'c' .*complex64"):
        export(M(), (torch.randn(2),))


def test_torch_export_failure_wrapped():
    def f(x):
        if x.sum() > 0:  # data-dependent control flow
            return x + 1
        return x - 1

    with pytest.raises(ExportError, match="torch.export failed") as ei:
        export(f, (torch.randn(3),))
    assert isinstance(ei.value, RuntimeError) and ei.value.__cause__ is not None


def test_non_aten_ops_all_listed():
    @torch.library.custom_op("chroma_test::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    def f(x):
        a = twice(x)  # first-custom
        return twice(a + 1)  # second-custom

    with pytest.raises(ExportError) as ei:
        export(f, (torch.randn(3),))
    msg = str(ei.value)
    assert msg.count("chroma_test.twice") == 2, msg
    assert "first-custom" in msg and "second-custom" in msg


def test_torch_version_policy():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_torch_version("2.14.1+cu130")
    with pytest.warns(UserWarning, match="2.12"):
        check_torch_version("2.12.1")
    with pytest.raises(ExportError, match="2.1"):
        check_torch_version("2.0.1")


@pytest.fixture
def mlp_bytes():
    return export(MLP(), (torch.randn(2, 7),)).to_bytes()


def test_read_truncated(tmp_path, mlp_bytes):
    for cut in (10, 64 + 5, len(mlp_bytes) - 1):
        p = tmp_path / "t.cgraph"
        p.write_bytes(mlp_bytes[:cut])
        with pytest.raises(GraphFileError, match="truncated"):
            graph_file.read(str(p))


def test_read_bad_magic(tmp_path, mlp_bytes):
    p = tmp_path / "m.cgraph"
    p.write_bytes(b"NOTGRAPH" + mlp_bytes[8:])
    with pytest.raises(GraphFileError, match="bad magic"):
        graph_file.read(str(p))


def test_read_wrong_version(tmp_path, mlp_bytes):
    p = tmp_path / "v.cgraph"
    p.write_bytes(mlp_bytes[:8] + struct.pack("<I", 2) + mlp_bytes[12:])
    with pytest.raises(GraphFileError, match="version 2.*version 1"):
        graph_file.read(str(p))


def test_read_weight_out_of_range(mlp_bytes):
    j, blob = graph_file.unpack(mlp_bytes)
    j["weights"][0]["offset"] = len(blob) // 64 * 64 + 64
    with pytest.raises(GraphFileError, match="out of range"):
        graph_file.unpack(graph_file.pack(j, blob))


def test_read_hash_mismatch(mlp_bytes):
    corrupted = bytearray(mlp_bytes)
    corrupted[-1] ^= 0xFF
    graph_file.unpack(bytes(corrupted))  # structure still valid
    with pytest.raises(GraphFileError, match="sha256"):
        graph_file.unpack(bytes(corrupted), verify_hashes=True)


def _grouped_mm_op():
    """transformers 5's `transformers::grouped_mm_fallback` (its MoE experts on the CPU): the
    op transformers registers when it is imported; registered here with the same schema and
    meaning when transformers is not installed (it is a benchmark requirement only)."""
    ns = getattr(torch.ops, "transformers", None)
    op = getattr(ns, "grouped_mm_fallback", None) if ns is not None else None
    if op is not None:
        return op

    @torch.library.custom_op("transformers::grouped_mm_fallback", mutates_args=())
    def grouped_mm_fallback(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(input.size(0), weight.size(2), dtype=input.dtype)
        start = 0
        for e, end in enumerate(offs.tolist()):
            if end > start:
                out[start:end] = input[start:end] @ weight[e]
            start = end
        return out

    @grouped_mm_fallback.register_fake
    def _(input, weight, offs):
        return input.new_empty(input.size(0), weight.size(2))

    return torch.ops.transformers.grouped_mm_fallback


class GroupedExperts(nn.Module):
    """Top-2 routing as transformers 5 writes it: rows sorted by expert, counts by histc,
    cumulative offsets, one grouped product."""

    def __init__(self, op, experts=5, dim=12, out=7):
        super().__init__()
        self.op = op
        self.gate = nn.Linear(dim, experts)
        self.w = nn.Parameter(torch.randn(experts, dim, out))

    def forward(self, x):
        top = torch.topk(self.gate(x), 2, dim=-1).indices.reshape(-1)
        ids, perm = torch.sort(top)
        rows = x[perm // 2]
        counts = torch.histc(ids.float(), bins=self.w.shape[0], min=0, max=self.w.shape[0] - 1)
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        return self.op(rows, self.w, offs)


def test_transformers_grouped_mm_is_decomposed(check):
    # The decomposition (a gathered product) matches the op, and the model compiles and
    # matches eager: Hugging Face MoE models export instead of naming an opaque custom op.
    from chroma.frontend.decompositions import grouped_mm_fallback

    op = _grouped_mm_op()
    torch.manual_seed(0)
    x, w = torch.randn(9, 4), torch.randn(3, 4, 5)
    offs = torch.tensor([2, 2, 7], dtype=torch.int32)  # an empty expert, rows 7..8 past the end
    torch.testing.assert_close(grouped_mm_fallback(x, w, offs), op(x, w, offs), rtol=1e-6, atol=1e-6)
    assert torch.equal(grouped_mm_fallback(x, w, offs)[7:], torch.zeros(2, 5))
    check(GroupedExperts(op).eval(), torch.randn(6, 12), rtol=1e-5, atol=1e-5)
