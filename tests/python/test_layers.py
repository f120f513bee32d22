"""The Python package's layers: imports run one way, API -> frontend / cache / quantization ->
runtime -> base, and nothing imports in a cycle (function-local imports count: a cycle held
together by a late import is still a cycle). The graph is read from the sources (every
`import`, module level or not), so the test needs no import of Chroma itself."""

import ast
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "python")

# Layer of each module or subpackage, lowest first; a module may import its own layer's
# modules (without a cycle) and any layer below.
LAYERS = [
    ("base", {"chroma.errors", "chroma.version", "chroma.paths", "chroma.arrays", "chroma.golden", "chroma.cpuinfo",
              "chroma._compiler"}),
    ("runtime", {"chroma.runtime"}),
    ("frontend/cache/quantization", {"chroma.frontend", "chroma.cache", "chroma.quantization"}),
    ("api", {"chroma", "chroma.compiler", "chroma.batching", "chroma.jitting", "chroma.decoder", "chroma.cli", "chroma.demo",
             "chroma.pipelines", "chroma.__main__", "chroma.models", "chroma.webgpu", "chroma.cuda", "chroma.simt"}),
]


def _modules():
    out = {}
    base = os.path.join(ROOT, "chroma")
    for dirpath, _, files in os.walk(base):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            mod = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
            if mod.endswith(".__init__"):
                mod = mod[: -len(".__init__")]
            out[mod] = path
    return out


def _imports(mod, path, known):
    """The Chroma modules `mod` imports (anywhere in its text)."""
    pkg = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = pkg.split(".")
                target = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names]
            # `from . import x` imports the module x when there is one; `from m import name`, m.
            hits = [n for n in names if n in known]
            found.update(hits or [target])
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m == "chroma" or m.startswith("chroma.")} - {mod}


def _layer(mod):
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and (best is None or len(p) > len(best[1])):
                best = (i, p)
    return best[0] if best else None


GRAPH = None


def graph():
    global GRAPH
    if GRAPH is None:
        mods = _modules()
        known = set(mods) | {"chroma._compiler"}  # the native extension: no .py source
        GRAPH = {m: _imports(m, p, known) for m, p in mods.items()}
    return GRAPH


def test_every_module_has_a_layer():
    missing = [m for m in graph() if _layer(m) is None]
    assert not missing, f"modules with no layer in LAYERS: {missing}"


def test_imports_run_down_the_layers():
    wrong = []
    for mod, deps in graph().items():
        for d in deps:
            if d == "chroma" and mod.startswith("chroma.models"):
                continue  # the example models use the public API, like a user's code
            if _layer(d) is not None and _layer(d) > _layer(mod):
                wrong.append(f"{mod} ({LAYERS[_layer(mod)][0]}) imports {d} ({LAYERS[_layer(d)][0]})")
    assert not wrong, "imports up the layers:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles():
    g = {m: {d for d in deps if d in graph()} for m, deps in graph().items()}
    # A package's __init__ importing its own submodules is how a package exposes them; a
    # submodule importing its package's __init__ back would close a cycle, which is reported.
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(g[m]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("cycle", [["chroma.runtime.cpu", "chroma.compiler"]])
def test_the_check_finds_a_cycle(cycle, monkeypatch):
    """The cycle check is not vacuous: an upward import it must report."""
    g = graph()
    monkeypatch.setitem(g, cycle[0], g[cycle[0]] | {cycle[1]})
    with pytest.raises(AssertionError, match="imports up the layers"):
        test_imports_run_down_the_layers()
    with pytest.raises(AssertionError, match="import cycles"):
        test_no_import_cycles()


def test_old_module_names_still_work():
    """chroma.webgpu, chroma.cuda and chroma.simt (the runtime modules' names before the
    runtime layer) give the same classes as chroma.runtime."""
    import chroma.cuda
    import chroma.runtime
    import chroma.simt
    import chroma.webgpu

    assert chroma.webgpu.WebGPUProgram is chroma.runtime.WebGPUProgram
    assert chroma.webgpu.read_package is chroma.runtime.read_package
    assert chroma.cuda.CudaProgram is chroma.runtime.CudaProgram
    assert chroma.cuda.MetalProgram is chroma.runtime.MetalProgram
    assert chroma.simt.EmulatedProgram is chroma.runtime.EmulatedProgram
    assert not issubclass(chroma.runtime.MetalProgram, chroma.runtime.CudaProgram)
    assert not issubclass(chroma.runtime.CudaProgram, chroma.runtime.WebGPUProgram)


# ---- the C++ compiler's layers (scripts/check_layers.py, run by the build) ------------------

def _cmake_layers():
    import re

    text = open(os.path.join(ROOT, "..", "CMakeLists.txt"), encoding="utf-8").read()
    block = re.search(r"set\(CHROMA_LAYERS\n(.*?)\n\)", text, re.S).group(1)
    return re.findall(r'"([^"]*)"', block)


def _check_layers(src):
    import subprocess

    script = os.path.join(ROOT, "..", "scripts", "check_layers.py")
    return subprocess.run([sys.executable, script, src, *_cmake_layers()], capture_output=True, text=True, timeout=60)


def test_compiler_layers_hold():
    r = _check_layers(os.path.join(ROOT, "..", "src"))
    assert r.returncode == 0, r.stderr


def test_compiler_layer_inversion_is_refused(tmp_path):
    """An IR file including a pass's header, a lowering file including the CPU runtime's:
    both named, with the line."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "..", "src"), src)
    (src / "ir" / "bad.cpp").write_text('#include "ir/graph.h"\n#include "passes/dce.h"\n')
    (src / "lower" / "bad.cpp").write_text('#include "chroma/cpu/et.h"\n')
    r = _check_layers(str(src))
    assert r.returncode == 1
    assert "src/ir/bad.cpp:2: layer 'ir' includes passes/dce.h of layer 'passes'" in r.stderr, r.stderr
    assert "src/lower/bad.cpp:1: includes the runtime header chroma/cpu/et.h" in r.stderr, r.stderr
