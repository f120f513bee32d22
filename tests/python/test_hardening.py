"""Hardening (docs/threat_model.md): each class of defect a hostile or careless input could
trigger, with a test that fails without its fix.

1. text from the graph file reaching generated C++ (escaping);
2. the graph-file reader trusting offsets, sizes and structure (every malformed file is a
   CompileError naming the field or node);
3. integer edge cases (INT_MIN // -1 and friends) at run time and in constant folding;
4. concurrent builds (own children only, private temporary names, recompiling into one
   directory in one process);
5. silent wrong results (jit and changed weights, aliasing out= buffers, edited manifests,
   a FIFO for weights.bin, library.file outside the artifact).

Run: .venv/bin/python -m pytest tests/python/test_hardening.py -q -n 2
"""

import copy
import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch
import torch.nn as nn

from conftest import compare, randn

import chroma
import chroma._compiler as C
from chroma.frontend import graph_file
from chroma.compiler import compile_graph
from chroma.frontend.exporter import export
from chroma.errors import ArtifactError

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(7, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _doc(fn, *inputs):
    g = export(fn, inputs)
    return copy.deepcopy(g.json), bytes(g.blob)


def _write(path, doc, blob):
    graph_file.write(str(path), doc, blob)
    return str(path)


def _lowered(path):
    return C.dump_graph(str(path), "lowered")


def _compile_error(path):
    """The CompileError the importer raises for `path` (exactly that type)."""
    with pytest.raises(Exception) as ei:
        _lowered(path)
    assert type(ei.value) is C.CompileError, f"{type(ei.value).__name__}: {ei.value}"
    return str(ei.value)


# ------------------------------------------------------------ 1. text into generated code

INJECTED = 'int chroma_injected = std::system("touch {marker}");'


def test_source_lines_and_names_cannot_become_code(tmp_path):
    marker = tmp_path / "MARKER"
    model = MLP().eval()
    x = randn(4, 7)
    doc, blob = _doc(model, x)
    hostile = "m.py:1 in forward: y\n" + INJECTED.format(marker=marker) + "\n//"
    for i, n in enumerate(doc["nodes"]):
        # a newline, a carriage return, a trailing backslash (line splice), quotes, a trigraph
        n["source"] = [hostile, hostile.replace("\n", "\r"), 'y = f(x) + \\', 'say "??/" \x01 \u00e9'][i % 4]
    for w in doc["weights"]:
        w["source"] = w["source"] + '"\n' + INJECTED.format(marker=marker)
    # the input's name, everywhere it is referenced
    text = json.dumps(doc).replace('"ref": "x"', '"ref": "x\\"\\n/*"').replace('"name": "x"', '"name": "x\\"\\n/*"')
    doc = json.loads(text)
    path = _write(tmp_path / "g.cgraph", doc, blob)
    prog = compile_graph(path, str(tmp_path / "art"), cache_dir="")
    with torch.no_grad():
        compare(prog(x.numpy()), model(x))
    assert not marker.exists()
    for name in os.listdir(tmp_path / "art" / "src"):
        src = (tmp_path / "art" / "src" / name).read_text()
        assert "chroma_injected" not in "\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith("//")
                                                  and '"' not in ln), name
        assert not any(ln.rstrip().endswith("\\") for ln in src.splitlines() if ln.lstrip().startswith("//")), name
    assert prog.inputs[0].name == 'x"\n/*'
    assert any(k["source"] == hostile for k in prog.manifest["kernels"])


def test_forward_line_ending_in_a_backslash_compiles(tmp_path):
    mod = tmp_path / "contmodel.py"
    mod.write_text(textwrap.dedent('''
        import torch
        class M(torch.nn.Module):
            def forward(self, x):
                y = x * 2 + \\
                    1
                return torch.sin(y) + \\
                    x
    '''))
    spec = importlib.util.spec_from_file_location("contmodel", mod)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    x = randn(3, 5)
    prog = chroma.compile(m.M(), (x,), out=str(tmp_path / "art"), cache_dir="")
    compare(prog(x.numpy()), m.M()(x))
    assert any(k["source"].endswith("\\") for k in prog.manifest["kernels"]), prog.manifest["kernels"]


# ------------------------------------------------------------ 2. the graph-file reader

@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("g")
    doc, blob = _doc(MLP().eval(), randn(4, 7))
    path = _write(d / "mlp.cgraph", doc, blob)
    with open(path, "rb") as f:
        return doc, blob, f.read()


def _patch_header(data, offset, fmt, value):
    b = bytearray(data)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


U64 = (1 << 64) - 1

CONTAINER_CASES = {
    "header_size": (lambda d: _patch_header(d, 12, "<I", 65), r"header_size is 65, must be 64"),
    "reserved": (lambda d: _patch_header(d, 50, "<B", 1), r"reserved header byte 50 is not zero"),
    "json_offset_small": (lambda d: _patch_header(d, 16, "<Q", 8), r"json_offset is 8, must be at least 64"),
    "json_length_wraps": (lambda d: _patch_header(d, 24, "<Q", U64 - 10), r"truncated file: the JSON section"),
    "json_offset_wraps": (lambda d: _patch_header(d, 16, "<Q", U64 - 63), r"truncated file: the JSON section"),
    "data_unaligned": (lambda d: _patch_header(d, 32, "<Q", struct.unpack_from("<Q", d, 32)[0] + 8),
                       r"data_offset \d+ is not a multiple of 64"),
    "data_overlaps_json": (lambda d: _patch_header(d, 32, "<Q", 64), r"data_offset 64 overlaps the JSON section"),
    "data_length_wraps": (lambda d: _patch_header(d, 40, "<Q", U64 - 63), r"truncated file: the data section"),
    "data_offset_wraps": (lambda d: _patch_header(d, 32, "<Q", U64 - 63), r"truncated file: the data section"),
    "trailing": (lambda d: d + b"\0" * 64, r"64 trailing bytes after the data section"),
    "truncated": (lambda d: d[:-4], r"truncated file: the data section"),
    "short": (lambda d: d[:40], r"truncated header \(40 bytes"),
    "magic": (lambda d: b"NOTGRAPH" + d[8:], r"bad magic"),
    "version": (lambda d: _patch_header(d, 8, "<I", 9), r"format version 9 is not supported"),
}


@pytest.mark.parametrize("case", sorted(CONTAINER_CASES))
def test_malformed_container_is_a_compile_error(mlp_file, tmp_path, case):
    mutate, pattern = CONTAINER_CASES[case]
    p = tmp_path / "bad.cgraph"
    p.write_bytes(mutate(mlp_file[2]))
    msg = _compile_error(p)
    assert "bad.cgraph" in msg
    assert re.search(pattern, msg), msg


def _set(path, value):
    def f(doc):
        cur = doc
        for k in path[:-1]:
            cur = cur[k]
        cur[path[-1]] = value
    return f


def _node(doc, target):
    return next(n for n in doc["nodes"] if n["target"] == target)


JSON_CASES = {
    "nodes_not_list": (_set(["nodes"], 5), r"field 'nodes' is missing or not a list"),
    "inputs_missing": (lambda d: d.pop("inputs"), r"field 'inputs' is missing or not a list"),
    "input_shape_not_ints": (_set(["inputs", 0, "shape"], "abc"), r"inputs\[0\] is malformed"),
    "input_negative_dim": (_set(["inputs", 0, "shape"], [4, -7]), r"input 'x': negative dimension"),
    "input_bytes_overflow": (_set(["inputs", 0, "shape"], [1 << 40, 1 << 40]), r"input 'x': .* larger than the"),
    "weight_shape_overflow": (_set(["weights", 0, "shape"], [1 << 62, 4]), r"weight '\w+': .* larger than the"),
    "weight_offset_wraps": (lambda d: d["weights"][0].update(offset=U64 - 63, nbytes=128),
                            r"offset 18446744073709551552 and nbytes 128 lie outside"),
    "weight_nbytes_wrong": (lambda d: d["weights"][0].update(nbytes=4), r"nbytes 4 but f32\[16,7\] has 448 bytes"),
    "weight_offset_string": (lambda d: d["weights"][0].update(offset="0"), r"weights\[0\] is malformed"),
    "node_not_object": (lambda d: d["nodes"].insert(0, 7), r"nodes\[0\]: expected an object"),
    "node_target_missing": (lambda d: d["nodes"][0].pop("target"), r"nodes\[0\]: expected string fields"),
    "args_missing": (lambda d: _node(d, "aten.addmm.default").update(args=[]), r"node 'addmm.*missing tensor argument"),
    "args_wrong_type": (lambda d: _node(d, "aten.addmm.default").update(args="oops"),
                        r"node 'addmm\w*': field 'args' is missing or not a list"),
    "source_not_string": (lambda d: d["nodes"][0].update(source=5), r"field 'source' is not a string"),
    "arg_ref_unknown": (lambda d: _node(d, "aten.relu.default")["args"].__setitem__(0, {"ref": "nope"}),
                        r"refers to unknown value 'nope'"),
    "arg_ref_index_negative": (lambda d: _node(d, "aten.relu.default")["args"][0].update(index=-3),
                               r"node 'relu"),
    "output_ref_index": (lambda d: d["outputs"][0].update(index=99), r"field 'outputs'"),
    "duplicate_name": (lambda d: d["nodes"][1].update(name=d["nodes"][0]["name"]), r"defined twice"),
    "output_structure": (_set(["output_structure"], "dict"), r"output_structure' is 'dict'"),
    "recorded_output_missing": (lambda d: _node(d, "aten.relu.default").update(outputs=[]),
                                r"node 'relu\w*'.*: the graph file records 0 outputs, the op has 1"),
    "state_update_unknown": (_set(["state_updates"], [{"state": "ghost", "ref": "relu"}]), r"unknown state 'ghost'"),
}


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_malformed_document_is_a_compile_error(mlp_file, tmp_path, case):
    mutate, pattern = JSON_CASES[case]
    doc = copy.deepcopy(mlp_file[0])
    mutate(doc)
    msg = _compile_error(_write(tmp_path / "bad.cgraph", doc, mlp_file[1]))
    assert re.search(pattern, msg), msg


def _raw_json_file(tmp_path, text: bytes):
    header = struct.pack("<8sIIQQQQ16s", b"CHRGRAPH", 1, 64, 64, len(text), (64 + len(text) + 63) // 64 * 64, 0, b"")
    p = tmp_path / "raw.cgraph"
    p.write_bytes(header + text + b"\0" * ((64 + len(text) + 63) // 64 * 64 - 64 - len(text)))
    return p


@pytest.mark.parametrize("text,pattern", [
    (b'{"format": "chroma.graph", "nodes": [', r"malformed JSON"),
    (b'{"format": "chroma.graph", "x": "\xff\xfe"}', r"malformed JSON"),
    (b'[1, 2, 3]', r"the JSON section is not an object"),
    (b'{"format": "chroma.graph", "version": 2}', r"'version' is 2"),
    (b'{"format": "other"}', r"not a chroma.graph document"),
])
def test_malformed_json_is_a_compile_error(tmp_path, text, pattern):
    msg = _compile_error(_raw_json_file(tmp_path, text))
    assert re.search(pattern, msg), msg


def test_handlers_on_zero_dim_tensors_and_wrong_arguments(tmp_path):
    # Each handler's dimension lookups are checked: a graph whose recorded shapes make a
    # handler ask for a dimension that does not exist is refused, naming the node.
    doc, blob = _doc(lambda x: torch.permute(x, (1, 0)).sum(dim=1), randn(3, 4))
    doc["inputs"][0]["shape"] = []
    for n in doc["nodes"]:
        n["outputs"] = [{"dtype": "float32", "shape": []}]
    msg = _compile_error(_write(tmp_path / "a.cgraph", doc, blob))
    assert "node 'permute" in msg, msg
    doc, blob = _doc(lambda x: torch.nn.functional.conv2d(x, torch.ones(2, 1, 1, 1), groups=2), randn(1, 2, 4, 4))
    conv = _node(doc, "aten.convolution.default")
    conv["args"][8] = 0  # groups = 0 would divide by zero
    msg = _compile_error(_write(tmp_path / "b.cgraph", doc, blob))
    assert "node 'conv" in msg, msg


def test_fifo_graph_file_is_refused(tmp_path):
    p = tmp_path / "fifo.cgraph"
    os.mkfifo(p)
    msg = _compile_error(p)
    assert "is not a regular file" in msg


def test_random_mutations_never_crash(mlp_file, tmp_path):
    """A quick in-process fuzz: byte flips and JSON edits give a result or a CompileError,
    never another exception or a crash (run in a child so a crash is a failure, not a hang)."""
    script = textwrap.dedent(f"""
        import json, random, sys
        sys.path.insert(0, {os.path.join(ROOT, 'python')!r})
        import chroma._compiler as C
        from chroma.frontend import graph_file
        data = open({str(tmp_path / 'seed.cgraph')!r}, 'rb').read()
        doc, blob = graph_file.unpack(data)
        rng = random.Random(12)
        ok = errors = 0
        values = [0, -1, 1, 2**63, 2**64 - 1, -2**63, 1e300, "x", None, [], {{}}, [1, -1], {{"ref": "x"}}, True]
        def walk(o, path=()):
            yield path
            if isinstance(o, dict):
                for k, v in o.items(): yield from walk(v, path + (k,))
            elif isinstance(o, list):
                for i, v in enumerate(o): yield from walk(v, path + (i,))
        paths = [p for p in walk(doc) if p]
        for it in range(400):
            if it % 2:
                b = bytearray(data)
                for _ in range(rng.randint(1, 8)):
                    b[rng.randrange(len(b))] = rng.randrange(256)
                raw = bytes(b)
            else:
                d = json.loads(json.dumps(doc))
                for _ in range(rng.randint(1, 3)):
                    p = rng.choice(paths)
                    cur = d
                    try:
                        for k in p[:-1]: cur = cur[k]
                        cur[p[-1]] = rng.choice(values)
                    except (KeyError, IndexError, TypeError):
                        pass
                raw = graph_file.pack(d, blob)
            open({str(tmp_path / 'm.cgraph')!r}, 'wb').write(raw)
            try:
                C.dump_graph({str(tmp_path / 'm.cgraph')!r}, "lowered")
                ok += 1
            except C.CompileError:
                errors += 1
        print(ok, errors)
    """)
    (tmp_path / "seed.cgraph").write_bytes(mlp_file[2])
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ok, errors = map(int, r.stdout.split())
    assert ok + errors == 400 and errors > 100, r.stdout


# ------------------------------------------------------------ 3. integer edge cases

@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.int8])
def test_int_min_divided_by_minus_one(tmp_path, dtype):
    lo = torch.iinfo(dtype).min
    a = torch.tensor([lo, lo, 7, -7, lo + 1, 0], dtype=dtype)
    b = torch.tensor([-1, -1, 2, -1, -1, -1], dtype=dtype)

    def ops(a, b):
        return (torch.floor_divide(a, b), torch.remainder(a, b), torch.fmod(a, b),
                torch.div(a, b, rounding_mode="floor"), a // -1, a % -1, torch.fmod(a, -1))

    prog = chroma.compile(ops, (a, b), out=str(tmp_path / "run"))
    compare(prog(a.numpy(), b.numpy()), ops(a, b))

    def folded(x):  # the same on constants: folded at compile time, the same answers
        ca = torch.tensor([lo, lo, 7, -7, lo + 1, 0], dtype=dtype)
        cb = torch.tensor([-1, -1, 2, -1, -1, -1], dtype=dtype)
        return tuple(o + x for o in ops(ca, cb))

    z = torch.zeros(6, dtype=dtype)
    prog = chroma.compile(folded, (z,), out=str(tmp_path / "fold"))
    assert prog.stats["folded_constants"] > 0
    compare(prog(z.numpy()), folded(z))


def test_truncating_int_min_by_minus_one_wraps_at_run_time_and_when_folded(tmp_path):
    # PyTorch's own kernel traps (SIGFPE) here; Chroma returns INT_MIN, the two's-complement
    # wrap, the same as its floor division, at run time and in constant folding.
    lo = torch.iinfo(torch.int64).min
    a = torch.tensor([lo, 9], dtype=torch.int64)
    b = torch.tensor([-1, -2], dtype=torch.int64)
    prog = chroma.compile(lambda a, b: torch.div(a, b, rounding_mode="trunc"), (a, b), out=str(tmp_path / "t"))
    np.testing.assert_array_equal(prog(a.numpy(), b.numpy()), [lo, -4])

    def folded(x):
        return torch.div(torch.tensor([lo, 9]), torch.tensor([-1, -2]), rounding_mode="trunc") + x

    prog = chroma.compile(folded, (torch.zeros(2, dtype=torch.int64),), out=str(tmp_path / "f"))
    np.testing.assert_array_equal(prog(np.zeros(2, np.int64)), [lo, -4])


# ------------------------------------------------------------ 4. concurrent builds

def test_compiles_from_several_threads_at_once(tmp_path):
    """chroma.compile and chroma.jit called from several threads of one process, as a user's
    code calls them (no export done first): torch.export is not thread-safe (two at once failed
    with "ProxyTorchDispatchMode slot already occupied"), so Chroma serializes it inside; each
    result is its own model's."""
    results, errors = {}, []

    def work(i):
        try:
            torch.manual_seed(i)
            m = torch.nn.Sequential(torch.nn.Linear(4 + i, 6), torch.nn.Tanh()).eval()
            x = randn(3, 4 + i, seed=i)
            if i % 2:
                got = chroma.jit(m, cache_dir=str(tmp_path / f"jit{i}"))(x).detach().numpy()
            else:
                got = chroma.compile(m, (x,), out=str(tmp_path / f"m{i}"), cache_dir="")(x.numpy())
            results[i] = (got, m(x).detach().numpy())
        except Exception as e:  # noqa: BLE001
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a compile hangs"
    assert not errors, errors
    assert sorted(results) == [0, 1, 2, 3]
    for got, want in results.values():
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_users_subprocess_keeps_its_exit_status(tmp_path):
    p = subprocess.Popen(["sh", "-c", "sleep 1; exit 3"])
    x = randn(2, 3)
    chroma.compile(lambda t: t.exp(), (x,), out=str(tmp_path / "m"), cache_dir="")
    assert p.wait(timeout=60) == 3


def test_two_processes_jit_one_model_into_one_cache(tmp_path):
    script = textwrap.dedent(f"""
        import sys, numpy as np, torch
        sys.path.insert(0, {os.path.join(ROOT, 'python')!r})
        import chroma
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.GELU()).eval()
        f = chroma.jit(m, cache_dir={str(tmp_path / 'cache')!r})
        x = torch.randn(2, 5)
        with torch.no_grad():
            np.testing.assert_allclose(f(x).numpy(), m(x).numpy(), rtol=1e-5, atol=1e-6)
        print("ok")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0 and "ok" in out, err[-3000:]
    jit_dir = tmp_path / "cache" / "jit"
    assert len([d for d in os.listdir(jit_dir) if ".build-" not in d and ".stale-" not in d]) == 1, os.listdir(jit_dir)


def test_recompiling_another_model_into_the_same_directory(tmp_path):
    x = randn(3, 4)
    out = str(tmp_path / "same")
    a = chroma.compile(lambda t: t * 2, (x,), out=out)
    np.testing.assert_allclose(a(x.numpy()), x.numpy() * 2)
    b = chroma.compile(lambda t: t - 5, (x,), out=out)
    np.testing.assert_allclose(b(x.numpy()), x.numpy() - 5)
    np.testing.assert_allclose(a(x.numpy()), x.numpy() * 2)  # the first program still works
    np.testing.assert_allclose(chroma.load(out)(x.numpy()), x.numpy() - 5)
    assert [f for f in os.listdir(out) if f.endswith(".so")] == [b.manifest["library"]["file"]]


# ------------------------------------------------------------ 5. silent wrong results

@pytest.mark.parametrize("how", ["no_grad_op", "data", "load_state_dict", "new_parameter"])
def test_jit_sees_weights_changed_in_place(tmp_path, how):
    m = MLP().eval()
    f = chroma.jit(m, cache_dir=str(tmp_path / "cache"))
    x = randn(4, 7)
    with torch.no_grad():
        compare(f(x).numpy(), m(x))
        if how == "no_grad_op":
            m.fc1.weight.add_(0.5)
        elif how == "data":
            m.fc2.bias.data.fill_(3.0)
        elif how == "load_state_dict":
            sd = {k: v + 1 for k, v in m.state_dict().items()}
            m.load_state_dict(sd)
        else:
            m.fc2.weight = nn.Parameter(torch.ones_like(m.fc2.weight))
        compare(f(x).numpy(), m(x))


def test_out_buffers_that_overlap_are_refused(tmp_path):
    x = randn(4, 6)
    prog = chroma.compile(lambda t: (t + 1, t * 2), (x,), out=str(tmp_path / "m"))
    buf = np.empty((2, 4, 6), np.float32)
    with pytest.raises(ValueError, match=r"out\[0\] and out\[1\] overlap"):
        prog(x.numpy(), out=(buf[0], buf[0]))
    big = np.empty(4 * 6 + 6, np.float32)
    with pytest.raises(ValueError, match=r"out\[0\] and out\[1\] overlap"):
        prog(x.numpy(), out=(big[:24].reshape(4, 6), big[6:].reshape(4, 6)))
    prog(x.numpy(), out=(buf[0], buf[1]))
    np.testing.assert_allclose(buf[0], x.numpy() + 1)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    d = tmp_path_factory.mktemp("art") / "mlp"
    model = MLP().eval()
    x = randn(4, 7)
    chroma.compile(model, (x,), out=str(d))
    return str(d), x.numpy()


def _copy(src, dst):
    subprocess.run(["cp", "-r", src, str(dst)], check=True)
    return str(dst)


def _edit(d, fn):
    p = os.path.join(d, "manifest.json")
    m = json.load(open(p))
    fn(m)
    json.dump(m, open(p, "w"))


@pytest.mark.parametrize("edit", ["dtype", "shape", "output_shape", "name", "entries"])
def test_manifest_specs_must_match_the_library(artifact, tmp_path, edit):
    d = _copy(artifact[0], tmp_path / "a")

    def fn(m):
        for where in (m, m["entries"][0]):  # the top-level copy and the entry agree
            if edit == "dtype":
                where["inputs"][0]["dtype"] = "int32"  # same bytes, another meaning
            elif edit == "shape":
                where["inputs"][0]["shape"] = [7, 4]
            elif edit == "output_shape":
                where["outputs"][0]["shape"] = [3, 4]
            elif edit == "name":
                where["inputs"][0]["name"] = "y"
        if edit == "entries":
            m["entries"].append(copy.deepcopy(m["entries"][0]))
            m["entries"][1]["name"] = "second"
    _edit(d, fn)
    with pytest.raises(ArtifactError, match=r"do not match the ones compiled into .*model-[0-9a-f]{16}\.so"):
        chroma.load(d)


@pytest.mark.parametrize("name", ["../elsewhere.so", "/tmp/x.so", "sub/model.so", "..", ""])
def test_library_file_must_lie_in_the_artifact(artifact, tmp_path, name):
    d = _copy(artifact[0], tmp_path / "a")
    _edit(d, lambda m: m["library"].__setitem__("file", name))
    with pytest.raises(ArtifactError, match=r"field 'library.file' .* must name a file in the artifact directory"):
        chroma.load(d)


def test_weights_fifo_is_refused_not_waited_on(artifact, tmp_path):
    d = _copy(artifact[0], tmp_path / "a")
    os.remove(os.path.join(d, "weights.bin"))
    os.mkfifo(os.path.join(d, "weights.bin"))
    script = f"import sys; sys.path.insert(0, {os.path.join(ROOT, 'python')!r}); import chroma; chroma.load({d!r})"
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "weights.bin" in r.stderr, r.stderr[-2000:]


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    exe = str(tmp_path_factory.mktemp("host") / "chroma_run")
    subprocess.run(["c++", "-std=c++20", "-O1", "-I", os.path.join(ROOT, "include"),
                    os.path.join(ROOT, "tools", "chroma_run.cpp"), "-o", exe, "-ldl", "-lcrypto"], check=True)
    return exe


def test_c_host_verifies_the_library_and_the_manifest(artifact, tmp_path, host):
    src, x = artifact
    ok = subprocess.run([host, src], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    # a flipped byte in the library: refused before it is loaded
    d = _copy(src, tmp_path / "lib")
    lib = os.path.join(d, json.load(open(os.path.join(d, "manifest.json")))["library"]["file"])
    b = bytearray(open(lib, "rb").read())
    b[len(b) // 2] ^= 0x5A
    open(lib, "wb").write(bytes(b))
    r = subprocess.run([host, d], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "does not match manifest field library.sha256" in r.stderr, r.stderr
    # an edited input spec
    d = _copy(src, tmp_path / "spec")
    _edit(d, lambda m: m["entries"][0]["inputs"][0].__setitem__("dtype", "int32"))
    r = subprocess.run([host, d], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "describes other inputs, outputs or state" in r.stderr, r.stderr
    # library.file outside the artifact
    d = _copy(src, tmp_path / "out")
    _edit(d, lambda m: m["library"].__setitem__("file", "../lib/" + os.path.basename(lib)))
    r = subprocess.run([host, d], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "must name a file in the artifact directory" in r.stderr, r.stderr
    # weights.bin a FIFO: a clear error, not a process blocked forever
    d = _copy(src, tmp_path / "fifo")
    os.remove(os.path.join(d, "weights.bin"))
    os.mkfifo(os.path.join(d, "weights.bin"))
    r = subprocess.run([host, d], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "weights.bin is not a regular file" in r.stderr, r.stderr


def test_weights_digest_is_the_documented_tree_digest(artifact):
    from chroma.runtime.cpu import _tree_digest

    d = artifact[0]
    m = json.load(open(os.path.join(d, "manifest.json")))
    assert m["weights"]["digest_algorithm"] == "sha256-tree-16MiB"
    assert m["weights"]["digest"] == _tree_digest(os.path.join(d, "weights.bin"))


def test_artifact_keeps_no_graph_unless_asked(tmp_path):
    x = randn(3, 4)
    prog = chroma.compile(MLP().eval().fc1, (randn(2, 7),), out=str(tmp_path / "a"))
    assert not [f for f in os.listdir(prog.directory) if f.endswith(".cgraph")]
    prog = chroma.compile(lambda t: t + 1, (x,), out=str(tmp_path / "b"), keep_graph=True)
    assert os.path.isfile(os.path.join(prog.directory, "graph.cgraph"))
