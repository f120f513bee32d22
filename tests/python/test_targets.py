"""Targets as objects (src/targets/): the registry, the null target (GPU planning with nothing
written, which CPU-only CI uses to check that models lower, plan and generate for a GPU
capability record), and what a new target takes: one folder and one registry line."""

import json
import os
import re

import pytest
import torch

import chroma
from chroma import _compiler
from chroma.paths import include_dir

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _null(fn, inputs, tmp_path, name="m"):
    graph = str(tmp_path / f"{name}.cgraph")
    chroma.export(fn, inputs, graph)
    out = tmp_path / name
    text = _compiler.compile_graph(graph, str(out), target="null", include_dir=include_dir())
    return json.loads(text), out


def test_registry_names_every_target():
    assert _compiler.target_names() == ["cpu", "webgpu", "cuda", "metal", "null"]


def test_unknown_target_names_the_ones_there_are(tmp_path):
    graph = str(tmp_path / "m.cgraph")
    chroma.export(torch.nn.Linear(4, 3).eval(), (torch.randn(2, 4),), graph)
    with pytest.raises(chroma.CompileError, match=r"target 'tpu' is not supported \(available: cpu, webgpu, cuda, "
                                                  r"metal, null\)"):
        _compiler.compile_graph(graph, str(tmp_path / "out"), target="tpu", include_dir=include_dir())


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(32, 96)
        self.out = torch.nn.Linear(32, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, -1)
        a = torch.softmax(q @ k.transpose(-1, -2) / 32 ** 0.5, -1) @ v
        return x + self.out(a)


MODELS = {
    "mlp": (lambda: torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)),
            lambda: (torch.randn(4, 16),)),
    "conv": (lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                         torch.nn.AdaptiveAvgPool2d(1)),
             lambda: (torch.randn(1, 3, 16, 16),)),
    "attention": (_Attention, lambda: (torch.randn(2, 10, 32),)),
    "gather_scan": (lambda: (lambda idx, t: torch.cumsum(t[idx], 0)), lambda: (torch.tensor([3, 0, 2]), torch.randn(5, 7))),
}


@pytest.mark.parametrize("case", sorted(MODELS))
def test_null_target_plans_for_a_gpu_and_writes_nothing(tmp_path, case):
    make, inputs = MODELS[case]
    model = make()
    if isinstance(model, torch.nn.Module):
        model = model.eval()
    m, out = _null(model, inputs(), tmp_path, case)
    assert m["target"] == "null" and m["format"] == "chroma.artifact"
    s = m["stats"]
    assert s["dispatches"] >= 1 and s["pipelines"] >= 1 and s["package_bytes"] > 0, s
    assert m["arena"]["bytes"] == s["arena_bytes"] and "alignment=256" in m["arena"]["plan"], m["arena"]
    assert not out.exists() and not any(p.name.startswith(case + ".chroma") for p in tmp_path.iterdir())


def test_null_target_agrees_with_webgpu_on_the_plan(tmp_path):
    """The null target plans as the GPU targets do: the same kernels, dispatches and arena as
    a WebGPU compile of the same graph (both use WebGPU's default capability record)."""
    model = MODELS["attention"][0]().eval()
    x = MODELS["attention"][1]()
    m, _ = _null(model, x, tmp_path, "a")
    graph = str(tmp_path / "a.cgraph")
    w = json.loads(_compiler.compile_graph(graph, str(tmp_path / "w"), target="webgpu", include_dir=include_dir()))
    for key in ("kernels", "dispatches", "pipelines", "arena_bytes", "temporaries_bytes", "weight_bytes", "package_bytes"):
        assert m["stats"][key] == w["stats"][key], key


def test_a_target_is_one_folder_and_one_registry_line():
    """Each target's folder defines make_<name>_target, and the registry calls each once: the
    whole of what adding a target takes outside its folder."""
    targets = os.path.join(ROOT, "src", "targets")
    registry = open(os.path.join(targets, "registry.cpp"), encoding="utf-8").read()
    folders = sorted(d for d in os.listdir(targets) if os.path.isdir(os.path.join(targets, d)) and d != "gpu")
    assert folders == sorted(_compiler.target_names())
    for name in folders:
        text = "".join(open(os.path.join(targets, name, f), encoding="utf-8").read()
                       for f in os.listdir(os.path.join(targets, name)) if f.endswith(".cpp"))
        assert f"make_{name}_target()" in text, name
        assert registry.count(f"t.push_back(make_{name}_target());") == 1, name


def test_no_target_name_compared_outside_the_targets():
    """Target names are compared only in the registries and the targets' own folders (C++:
    src/targets/; Python: chroma/runtime/)."""
    pattern = re.compile(r'(==|!=)\s*"(cpu|webgpu|cuda|metal|null)"|"(cpu|webgpu|cuda|metal|null)"\s*(==|!=)'
                         r'|\bin \([^)]*"(webgpu|cuda|metal)"')
    hits = []
    for base, allowed in ((os.path.join(ROOT, "src"), os.path.join(ROOT, "src", "targets")),
                          (os.path.join(ROOT, "include"), None),
                          (os.path.join(ROOT, "python", "chroma"), os.path.join(ROOT, "python", "chroma", "runtime"))):
        for dirpath, _, files in os.walk(base):
            if allowed and os.path.abspath(dirpath).startswith(os.path.abspath(allowed)):
                continue
            for f in files:
                if not f.endswith((".cpp", ".h", ".py")):
                    continue
                path = os.path.join(dirpath, f)
                for i, line in enumerate(open(path, encoding="utf-8"), 1):
                    if pattern.search(line) and "device.type" not in line:  # (a torch device is no target)
                        hits.append(f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}")
    assert not hits, "target names compared outside the targets:\n" + "\n".join(hits)


@pytest.mark.parametrize("target", ["webgpu", "cuda", "metal", "null"])
def test_supports_lists_every_refusal_with_its_node(target, tmp_path):
    # Target::supports answers for the whole program at once: a float64 output, and (once the
    # storage is settled) each kernel the GPU generator cannot make; the CPU refuses neither.
    def f(x, m):
        return (x * 2).double()

    def g(x, m):
        return x + 1, torch.linalg.inv(m), torch.linalg.det(m)

    m = torch.randn(3, 3) + 3 * torch.eye(3)
    for fn, count, reason in ((f, 1, "float64"), (g, 3, "LAPACK")):
        path = str(tmp_path / f"{fn.__name__}.cgraph")
        chroma.export(fn, (torch.randn(4), m), path)
        with pytest.raises(chroma.UnsupportedError) as e:
            _compiler.gpu_kernel_sources(path, target)
        assert isinstance(e.value, chroma.CompileError)
        assert f"target '{target}': {len(e.value.refusals)} part(s)" in str(e.value), str(e.value)
        assert len(e.value.refusals) >= count and all(reason in r[3] and r[1] for r in e.value.refusals), e.value.refusals
        assert "test_targets.py" in e.value.refusals[0][2], e.value.refusals


@pytest.mark.parametrize("target", ["webgpu", "cuda", "metal", "null"])
def test_float64_on_gpu_targets_narrowed_or_refused_with_node_and_line(target, tmp_path):
    # GpuTarget::prepare (passes/narrow_float64): a float64 constant that only feeds float32
    # (through views) is stored as float32, so it compiles; FluxPosEmbed's float64 RoPE computed
    # from run-time positions is refused, every refusal with its node and diffusers' line.
    class Table(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("f", torch.linspace(0, 3, 1024, dtype=torch.float64))

        def forward(self, x):
            return x + self.f.cos().expand(8192, 1024).float()[: x.shape[0]]

    path = str(tmp_path / "table.cgraph")
    chroma.export(Table(), (torch.randn(4, 1024),), path)
    assert _compiler.gpu_kernel_sources(path, target)
    pytest.importorskip("diffusers")
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    path = str(tmp_path / "rope.cgraph")
    chroma.export(FluxPosEmbed(theta=10000, axes_dim=[4, 6, 6]), (torch.zeros(16, 3),), path)
    with pytest.raises(chroma.UnsupportedError) as e:
        _compiler.gpu_kernel_sources(path, target)
    assert all(r[1] and "transformer_flux.py" in r[2] and "float64" in r[3] for r in e.value.refusals), e.value.refusals


def test_the_guarding_tier_fails_when_a_target_starts_refusing(tmp_path, monkeypatch, capsys):
    import gpu_coverage

    record = {"webgpu": {"t::ran": ["kind:assign"], "t::refused": ["refused:no f64"]}}
    monkeypatch.setattr(gpu_coverage, "RECORD", str(tmp_path / "record.json"))
    (tmp_path / "record.json").write_text(json.dumps(record))
    seen = tmp_path / "seen"
    seen.mkdir()

    def check(observed):
        (seen / "1.json").write_text(json.dumps(observed))
        return gpu_coverage.main(["gpu_coverage.py", "check", str(seen), "webgpu"])

    assert check({"t::ran": ["kind:assign"], "t::refused": ["refused:no f64"], "t::new": ["refused:x"]}) == 0
    assert check({"t::ran": ["refused:no LAPACK"], "t::refused": ["refused:no f64"]}) == 1
    assert "t::ran: now refused (no LAPACK); recorded: ran" in capsys.readouterr().err
    assert check({"t::ran": ["kind:assign"], "t::refused": ["refused:other"]}) == 1
