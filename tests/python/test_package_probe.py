"""Hostile GPU packages: one test per class of defect an attacker's probe found (crashes,
hangs, unclean exceptions, missing checks), each run through the one Python validator
(chroma.runtime.package, shared by the WebGPU, CUDA, Metal and emulator runtimes) and, on the
same files, through the JS runtime's parser (web/src/parse.ts): both must refuse each with a
PackageError naming the field, before anything is allocated or dispatched.

The packages are written by the test-only writer in webgpu_fixture.py (`edit` changes the
manifest before it is hashed, so the digest is right and the deeper checks are reached)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import webgpu_fixture as fx  # noqa: E402

from chroma.errors import ArtifactError, PackageError  # noqa: E402
from chroma.runtime.package import MAX_JSON_DEPTH, WORK_FLOOR, read_package  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
WEB = os.path.join(ROOT, "web")
X = np.arange(-3, 3, dtype=np.float32).reshape(2, 3) / 4
W = np.linspace(-1, 2, 6).astype(np.float32)


def _pkg(edit=None) -> bytes:
    return fx.affine_package(X, W, edit=edit)


def _raw(edit_text) -> bytes:
    """A package whose manifest text `edit_text` rewrites (for JSON the writer cannot produce),
    hashed again."""
    data = _pkg()
    ms = int.from_bytes(data[24:32], "little")
    text = json.loads(data[96:96 + ms])
    text["content_hash"] = "0" * 64
    body = edit_text(json.dumps(text))
    po = int.from_bytes(data[32:40], "little")
    payload = data[po:]
    return fx.assemble(body.encode(), bytes(payload))


def _set(path, value):
    """An edit that sets the manifest field at `path` (keys and list indices) to `value`."""
    def edit(m):
        cur = m
        for k in path[:-1]:
            cur = cur[k]
        cur[path[-1]] = value
    return edit


# name -> (package bytes, the pattern the Python error must match)
CASES = {
    # crashes: a 0-byte uniform binding aborted the process inside wgpu-native
    "uniform_zero_bytes": (lambda: _pkg(_set(["kernels", 0, "bindings", 0, "bytes"], 0)),
                           r"uniform binding of 0 bytes"),
    # hangs: a grid of 65535 x 65535 within the package's own (raised) limits
    "grid_work_bound": (lambda: _pkg(lambda m: (m["dispatches"][0].update(grid=[65535, 65535, 1]))),
                        r"launches \d+ invocations, more than the \d+ a dispatch of this package may"),
    # the emulator never checked grids (2^31 hung it): beyond the package's own limit
    "grid_beyond_limit": (lambda: _pkg(_set(["dispatches", 0, "grid"], [2 ** 31, 1, 1])),
                          r"grid dimension is 2147483648, more than maxComputeWorkgroupsPerDimension 65535"),
    "grid_raised_limit": (lambda: _pkg(lambda m: (m["requirements"]["limits"].update(
        maxComputeWorkgroupsPerDimension=2 ** 31), m["dispatches"][0].update(grid=[2 ** 31 - 1, 1, 1]))),
        r"more than the \d+ a dispatch of this package may"),
    "workgroup_too_large": (lambda: _pkg(_set(["kernels", 0, "workgroup_size"], [1024, 1024, 1])),
                            r"workgroup's invocations is 1048576, more than maxComputeInvocationsPerWorkgroup"),
    # unclean exceptions: RecursionError, ValueError, OverflowError, MemoryError
    "json_deep": (lambda: _raw(lambda t: t[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}"),
                  rf"nests objects and arrays 500\d deep, more than the {MAX_JSON_DEPTH}"),
    "json_huge_integer": (lambda: _raw(lambda t: t.replace('"status_offset": 0', '"status_offset": ' + "9" * 5000)),
                          r"not UTF-8 JSON"),
    "json_nan": (lambda: _raw(lambda t: t[:-1] + ', "x": NaN}'), r"not UTF-8 JSON"),
    "json_infinity": (lambda: _raw(lambda t: t.replace('"atol": 1e-05', '"atol": Infinity')), r"not UTF-8 JSON"),
    "shape_2_63": (lambda: _pkg(_set(["inputs", 0, "shape"], [2 ** 63, 1])),
                   r"'inputs\[0\]': field 'shape' is .*expected at most 64 non-negative integers"),
    "shape_product": (lambda: _pkg(_set(["inputs", 0, "shape"], [2 ** 40, 2 ** 40])),
                      r"has 1208925819614629174706176 elements"),
    "binding_2_63": (lambda: _pkg(_set(["kernels", 0, "bindings", 1, "binding"], 2 ** 63)),
                     r"field 'binding' is 9223372036854775808, expected a non-negative integer below 2\^53"),
    "binding_beyond_limit": (lambda: _pkg(_set(["kernels", 0, "bindings", 1, "binding"], 5000)),
                             r"binding \+ 1 is 5001, more than maxBindingsPerBindGroup 1000"),
    "arena_2_40": (lambda: _pkg(_set(["arena", "bytes"], 2 ** 40)),
                   r"'arena.bytes' is 1099511627776, more than maxStorageBufferBindingSize"),
    "state_2_40": (lambda: _pkg(_set(["state"], {"bytes": 2 ** 40, "tensors": []})),
                   r"'state.bytes' is 1099511627776, more than maxStorageBufferBindingSize"),
    "too_many_storage_bindings": (lambda: _pkg(lambda m: m["kernels"][0]["bindings"].extend(
        {"binding": 10 + i, "type": "storage"} for i in range(8))),
        r"the number of storage bindings is 10, more than maxStorageBuffersPerShaderStage 8"),
    # documented checks that were missing in Python
    "entries_disagree": (lambda: _pkg(lambda m: m.update(entries=[{
        "name": "main", "inputs": m["inputs"], "outputs": m["outputs"], "dispatches": m["dispatches"][:1]}])),
        r"'entries\[0\]' \('main'\) differs from the top-level"),
    "two_entries_webgpu": (lambda: _pkg(lambda m: m.update(entries=[
        {"name": n, "inputs": m["inputs"], "outputs": m["outputs"], "dispatches": m["dispatches"]}
        for n in ("prefill", "step")])), r"lists 2 entry points \(prefill, step\); a WebGPU package has one"),
    "variant_no_features": (lambda: _pkg(_set(["kernels", 0, "variants"], [{"features": [], "code": fx.AFFINE}])),
                            r"variants\[0\]: expected .*a variant is chosen by the features it needs"),
    "variant_junk_code": (lambda: _pkg(_set(["kernels", 0, "variants"], [{"features": ["subgroups"], "code": 7}])),
                          r"variants\[0\]: field 'code' is 7, expected a string"),
    "golden_int64_beyond_int32": (lambda: fx.ints_package([1, 0, 4, 2], [5, -7, 300, 0, 2 ** 40, 1],
                                                          np.arange(5, dtype=np.float32)),
                                  r"'golden.inputs\[1\]' \('a'\): int64 value 1099511627776 does not fit in int32"),
    "cuda_dialect_in_webgpu": (None, None),  # JS only: below
}


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][0] is not None])
def test_python_validator_refuses(case):
    make, pattern = CASES[case]
    with pytest.raises(PackageError, match=pattern):
        read_package(make())


def test_the_good_package_passes():
    p = read_package(_pkg())
    assert p.dialect == "wgsl" and len(p.entries) == 1 and p.work_limit == WORK_FLOOR


def _node_parse(files):
    """Each file through the JS parser: {file: 'ok' or the PackageError message}."""
    script = (
        "import { readFileSync } from 'node:fs';\n"
        f"import {{ parsePackage, PackageError }} from {json.dumps(os.path.abspath(os.path.join(WEB, 'dist', 'index.js')))};\n"
        "const out = {};\n"
        "for (const f of process.argv.slice(1)) {\n"
        "  try { await parsePackage(readFileSync(f)); out[f] = 'ok'; }\n"
        "  catch (e) { out[f] = (e instanceof PackageError ? 'PackageError: ' : 'OTHER ' + e.name + ': ') + e.message; }\n"
        "}\n"
        "console.log(JSON.stringify(out));\n")
    r = subprocess.run(["node", "--input-type=module", "-e", script, *files], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.skipif(shutil.which("node") is None or not os.path.exists(os.path.join(WEB, "dist", "index.js")),
                    reason="the JS runtime is not built (scripts/test.sh builds it with `npm test` before pytest)")
def test_js_parser_refuses_the_same_files(tmp_path):
    files = {}
    for case, (make, _) in CASES.items():
        if make is None:
            continue
        files[case] = str(tmp_path / f"{case}.chroma-web")
        with open(files[case], "wb") as f:
            f.write(make())
    # A CUDA package is not a WebGPU one: `describe`/`check` named it a WebGPU package before.
    files["cuda_dialect_in_webgpu"] = str(tmp_path / "cuda.chroma-cuda")
    with open(files["cuda_dialect_in_webgpu"], "wb") as f:
        f.write(_pkg(lambda m: m.update(dialect="cuda")))
    files["good"] = str(tmp_path / "good.chroma-web")
    with open(files["good"], "wb") as f:
        f.write(_pkg())
    got = _node_parse(list(files.values()))
    assert got[files["good"]] == "ok"
    for case, path in files.items():
        if case != "good":
            assert got[path].startswith("PackageError: "), (case, got[path])
    assert "a cuda package" in got[files["cuda_dialect_in_webgpu"]]
    assert "WGSL" in got[files["cuda_dialect_in_webgpu"]]


# ---- weights="auto": the variants manifest is checked like any other ---------------------------

def _variants(**change):
    v = {"name": "q4", "directory": "variants/q4", "weights": "q4", "rel_l2": 0.01,
         "need": {"weights": 100, "library": 10, "arena": 10, "state": 0, "margin": 5, "total": 125}}
    v.update(change)
    return {"format": "chroma.variants", "version": 1, "variants": [v]}


@pytest.mark.parametrize("change,pattern", [
    ({"need": {"total": 125}}, r"field 'need' is .*expected non-negative byte counts"),
    ({"rel_l2": -1.0}, r"field 'rel_l2' is -1.0, expected a finite non-negative number"),
    ({"rel_l2": float("nan")}, r"field 'rel_l2' is nan"),
    ({"need": {"weights": -100, "library": 10, "arena": 10, "state": 0, "margin": 5, "total": -75}},
     r"field 'need' is"),
    ({"need": {"weights": 100, "library": 10, "arena": 10, "state": 0, "margin": 5, "total": 1}},
     r"'need.total' is 1, not the sum of its parts \(125\)"),
])
def test_variants_manifest_refused(change, pattern):
    from chroma.runtime.variants import load_variant

    loaded = []
    with pytest.raises(ArtifactError, match=pattern):
        load_variant("/nonexistent", _variants(**change), "auto", None, lambda *a, **k: loaded.append(a))
    assert not loaded


def test_variants_memory_limit_must_be_bytes():
    from chroma.runtime.variants import load_variant

    with pytest.raises(TypeError, match=r"memory_limit='big': expected a number of bytes"):
        load_variant("/nonexistent", _variants(), "auto", "big", lambda *a, **k: None)
    chosen = []
    load_variant("/nonexistent", _variants(), "auto", 1e9, lambda d, **k: chosen.append(d) or type("P", (), {})())
    assert chosen == [os.path.join("/nonexistent", "variants/q4")]


# ---- artifact directories: what a manifest names outside the package ---------------------------

def test_package_file_confined(tmp_path):
    from chroma.runtime.artifact import package_file

    (tmp_path / "m").mkdir()
    (tmp_path / "m.chroma-cuda").write_bytes(b"x")
    mpath = str(tmp_path / "m" / "manifest.json")
    assert package_file(str(tmp_path / "m"), {"package": {"file": "../m.chroma-cuda"}}, mpath) == \
        os.path.join(str(tmp_path), "m.chroma-cuda")
    for bad in ("/etc/hostname", "../../etc/hostname", "../../m.chroma-cuda", "sub/m.chroma-cuda", "m.so", ""):
        with pytest.raises(ArtifactError, match=r"package.file"):
            package_file(str(tmp_path / "m"), {"package": {"file": bad}}, mpath)


def test_library_digest_checked_before_loading(tmp_path):
    """A native library (the emulator's, a CUDA or Metal host) is loaded only when its SHA-256
    is the manifest's: a replaced one never runs its constructor."""
    from chroma.runtime.artifact import verified_library
    from chroma.runtime.package import sha256_file

    lib = tmp_path / "kernels.so"
    lib.write_bytes(b"\x7fELF not really")
    good = {"library": "kernels.so", "sha256": sha256_file(str(lib))}
    assert verified_library(str(tmp_path), good, "emulator", "manifest.json", "emulator's library") == str(lib)
    lib.write_bytes(b"\x7fELF replaced")
    with pytest.raises(ArtifactError, match=r"does not match manifest field emulator.sha256 .* it was not loaded"):
        verified_library(str(tmp_path), good, "emulator", "manifest.json", "emulator's library")
    with pytest.raises(ArtifactError, match=r"field 'emulator.sha256' is None: the emulator's library's digest is "
                                            r"missing"):
        verified_library(str(tmp_path), {"library": "kernels.so"}, "emulator", "manifest.json", "emulator's library")
    with pytest.raises(ArtifactError, match=r"must name a file in the artifact directory"):
        verified_library(str(tmp_path), {"library": "../kernels.so", "sha256": "0" * 64}, "emulator", "m", "library")


@pytest.mark.skipif(not __import__("importlib").util.find_spec("triton"), reason="Triton is not installed (torch "
                    "brings it on x86_64); the crash this guards against needs it")
@pytest.mark.skipif(not os.path.exists("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"),
                    reason="no lavapipe Vulkan driver (mesa-vulkan-drivers)")
def test_adapter_enumerated_first_then_triton(tmp_path):
    """chroma.runtime.webgpu's docstring: import it, enumerate an adapter, run a package; then loading
    Triton (as torch.export does) must not crash the process."""
    path = tmp_path / "m.chroma-web"
    path.write_bytes(_pkg())
    code = ("import chroma.runtime.webgpu as cw, wgpu, numpy as np\n"
            "a = wgpu.gpu.enumerate_adapters_sync()[0]\n"
            f"p = cw.WebGPUProgram({str(path)!r}, adapter=a)\n"
            "assert p.self_check()['ok']\n"
            "import triton._C.libtriton\n"
            "print('ok')\n")
    env = dict(os.environ, VK_ICD_FILENAMES="/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stderr[-2000:])
