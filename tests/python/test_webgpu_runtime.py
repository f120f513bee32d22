"""The Python WebGPU runtime (chroma.runtime.webgpu) on Mesa's lavapipe, with packages written by the
test-only writer in webgpu_fixture.py (handwritten WGSL)."""

import os
import sys

# The Vulkan loader reads this when wgpu creates its instance (at the first adapter request).
_LAVAPIPE = "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"
if os.path.exists(_LAVAPIPE):
    os.environ["VK_ICD_FILENAMES"] = _LAVAPIPE

import numpy as np  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

import webgpu_fixture as fx  # noqa: E402

from chroma.errors import ArtifactError  # noqa: E402
from chroma.runtime import webgpu  # noqa: E402
from chroma.runtime.webgpu import PackageError, RunError, WebGPUProgram, read_package  # noqa: E402

wgpu = pytest.importorskip("wgpu")


def _vulkan_adapter():
    webgpu._load_triton_first()  # before the Vulkan driver: other tests in this process export with torch
    try:
        a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except RuntimeError:
        return None
    return a if a is not None and a.info.get("backend_type") == "Vulkan" else None


ADAPTER = _vulkan_adapter()
if ADAPTER is None:
    pytest.skip("no Vulkan adapter for wgpu (lavapipe: apt-get install mesa-vulkan-drivers)", allow_module_level=True)

X = np.arange(-3, 3, dtype=np.float32).reshape(2, 3) / 4
W = np.linspace(-1, 2, 6).astype(np.float32)
W2 = W.reshape(2, 3)
TABLE = np.arange(5, dtype=np.float32) * 1.5 - 2
IDX = np.array([1, 0, 4, 2], np.int64)
A = np.array([5, -7, 300, 0, -(2 ** 31), 2 ** 31 - 1], np.int64)


def affine(x):
    return (x * W2 + np.float32(1)) * W2 + np.float32(1)


@pytest.fixture(scope="module")
def prog():
    p = WebGPUProgram(fx.affine_package(X, W))
    yield p
    p.close()


@pytest.fixture(scope="module")
def ints():
    p = WebGPUProgram(fx.ints_package(IDX, A, TABLE))
    yield p
    p.close()


def test_run_matches_numpy(prog):
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    y = prog(x)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (2, 3)
    np.testing.assert_allclose(y, affine(x), rtol=1e-6, atol=1e-6)
    assert not np.allclose(y, affine(X))  # not the golden output left over


def test_two_runs_identical(prog):
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    y1 = prog(x)
    other = prog(x + 1)
    y2 = prog(x)
    assert y1 is not y2
    np.testing.assert_array_equal(y1, y2)
    assert not np.array_equal(other, y1)


def test_named_inputs(prog):
    np.testing.assert_array_equal(prog(x=X), prog(X))


def test_self_check_ok(prog):
    r = prog.self_check()
    assert r["ok"] is True, r
    assert r["tolerance"] == {"atol": 1e-5, "rtol": 1e-4}
    assert 0 <= r["max_error"] <= 1e-5
    assert r["outputs"][0]["name"] == "y" and r["outputs"][0]["mismatches"] == 0


def test_self_check_fails_on_altered_golden():
    bad = affine(X).copy()
    bad[1, 2] += 0.5
    p = WebGPUProgram(fx.affine_package(X, W, golden_y=bad))
    try:
        r = p.self_check()
    finally:
        p.close()
    assert r["ok"] is False
    assert r["max_error"] == pytest.approx(0.5, abs=1e-5)
    assert r["outputs"][0]["mismatches"] == 1


def test_self_check_nan_and_infinities():
    # x * w overflows to +inf (w > 0) in element 5 and x is NaN in element 0.
    x = X.copy()
    x[1, 2], x[0, 0] = 3e38, np.nan
    with np.errstate(over="ignore", invalid="ignore"):
        y = affine(x)
    assert np.isposinf(y[1, 2]) and np.isnan(y[0, 0])
    p = WebGPUProgram(fx.affine_package(x, W))
    try:
        assert p.self_check()["ok"] is True
    finally:
        p.close()
    wrong = y.copy()
    wrong[1, 2] = -np.inf  # an infinity of the other sign
    p = WebGPUProgram(fx.affine_package(x, W, golden_y=wrong))
    try:
        r = p.self_check()
    finally:
        p.close()
    assert r["ok"] is False and r["max_error"] == np.inf and r["outputs"][0]["mismatches"] == 1


def test_ints_bools_and_uint8(ints):
    idx = np.array([4, 3, 0, 1], np.int64)
    a = np.array([-1, 2, 256 + 17, -(2 ** 31), 2 ** 31 - 1, 0], np.int64)
    out = ints(idx, a)
    assert isinstance(out, tuple) and len(out) == 4
    g, same, pos, low = out
    assert (g.dtype, same.dtype, pos.dtype, low.dtype) == (np.float32, np.int64, np.bool_, np.uint8)
    np.testing.assert_array_equal(g, TABLE[idx])
    np.testing.assert_array_equal(same, a)
    np.testing.assert_array_equal(pos, a > 0)
    np.testing.assert_array_equal(low, (a & 255).astype(np.uint8))
    assert ints.self_check()["ok"] is True


def test_int64_input_out_of_range(ints):
    a = A.copy()
    a[3] = 2 ** 31
    with pytest.raises(ValueError, match=r"input 1 \('a'\): int64 value 2147483648 at \(3,\) does not fit in int32"):
        ints(IDX, a)
    a[3] = -(2 ** 31) - 1
    with pytest.raises(ValueError, match=r"'a'.*-2147483649"):
        ints(IDX, a)


def test_status_block_run_error(ints):
    with pytest.raises(RunError, match=r"dispatch 1 \(Gather <- embedding, node embedding, at model.py:9\): index 7 "):
        ints(np.array([0, 7, 2, 4], np.int64), A)
    with pytest.raises(RunError, match=r"index -2 is out of range"):
        ints(np.array([0, 1, -2, 4], np.int64), A)
    # The status block is cleared for the next call.
    g = ints(IDX, A)[0]
    np.testing.assert_array_equal(g, TABLE[IDX])


def test_state_persists_and_resets():
    init = np.array([1, 2, 3], np.float32)
    p = WebGPUProgram(fx.state_package(init, np.full(3, 0.5, np.float32)))
    try:
        x = np.ones(3, np.float32)
        np.testing.assert_array_equal(p(x), init + 1)
        np.testing.assert_array_equal(p(x), init + 2)
        p.reset_state()
        np.testing.assert_array_equal(p(x), init + 1)
        assert p.self_check()["ok"] is True  # runs from the initial state...
        np.testing.assert_array_equal(p(x), init + 1)  # ...and leaves it there
    finally:
        p.close()


# ---- checks at load -------------------------------------------------------------------------

def _good():
    return bytearray(fx.affine_package(X, W))


def test_read_package_helpers(tmp_path):
    path = tmp_path / "m.chroma-web"
    path.write_bytes(_good())
    pkg = read_package(path)
    assert pkg.manifest["format"] == "chroma.webgpu" and isinstance(pkg.payload, memoryview)
    assert len(pkg.digest) == 64
    np.testing.assert_array_equal(pkg.weight("w"), W)
    [gx] = pkg.golden_inputs()
    [gy] = pkg.golden_outputs()
    np.testing.assert_array_equal(gx, X)
    np.testing.assert_array_equal(gy, affine(X))
    with pytest.raises(KeyError, match="no weight tensor 'v'"):
        pkg.weight("v")
    p = WebGPUProgram(str(path))  # from a path, too
    try:
        np.testing.assert_allclose(p(X), gy, rtol=1e-6)
    finally:
        p.close()


@pytest.mark.parametrize("where", ["payload", "manifest", "content_hash"])
def test_corrupt_byte(where):
    data = _good()
    digest = bytes(data[48:80]).hex().encode()
    at = {"payload": len(data) - 1, "manifest": data.index(b'"dispatches"') + 3,
          "content_hash": data.index(digest) + 10}[where]
    data[at] ^= 0x01
    pattern = ("corrupt: the manifest's content_hash is not the header's digest" if where == "content_hash" else
               "corrupt: the SHA-256 of its content is [0-9a-f]{64}, the header says")
    with pytest.raises(PackageError, match=pattern):
        read_package(bytes(data))


def test_content_hash_matches_header():
    pkg = read_package(_good())
    assert pkg.manifest["content_hash"] == pkg.digest == bytes(_good()[48:80]).hex()


def test_truncated():
    data = _good()
    n = len(data)
    with pytest.raises(PackageError, match=f"truncated: the file has {n - 100} bytes, the header says {n} "):
        read_package(bytes(data[:-100]))
    with pytest.raises(PackageError, match="truncated: the file has 50 bytes, less than the 96-byte header"):
        read_package(bytes(data[:50]))
    with pytest.raises(PackageError, match=f"has {n + 4} bytes, 4 more than"):
        read_package(bytes(data + b"\0\0\0\0"))


def test_wrong_magic():
    data = _good()
    data[:8] = b"CHROMAXX"
    with pytest.raises(PackageError, match="not a Chroma WebGPU, CUDA or Metal package"):
        read_package(bytes(data))
    assert issubclass(PackageError, ArtifactError)


def test_version_mismatch():
    data = _good()
    data[8:12] = (1).to_bytes(4, "little")
    with pytest.raises(PackageError, match="format version 1 is not supported .this runtime reads version 2"):
        read_package(bytes(data))
    bad = fx.affine_package(X, W, edit=lambda m: m.update(version=3))
    with pytest.raises(PackageError, match="manifest field 'version' is 3, this runtime reads version 2"):
        read_package(bad)


def _edit_rejected(edit, pattern):
    with pytest.raises(PackageError, match=pattern):
        read_package(fx.affine_package(X, W, edit=edit))


def test_bad_kernel_index():
    _edit_rejected(lambda m: m["dispatches"][1].update(kernel=3),
                   r"field 'dispatches\[1\]': kernel index 3 is out of range \(the package has 1 kernels\)")


def test_bad_shard_index():
    _edit_rejected(lambda m: m["dispatches"][0]["bindings"][1].update(shard=1),
                   r"'dispatches\[0\]'.bindings\[1\]: shard index 1 is out of range")


def test_section_outside_payload():
    _edit_rejected(lambda m: m["weights"]["shards"][0].update(offset=1 << 20),
                   r"'weights.shards\[0\]': offset 1048576 \+ 24 bytes .* inside the payload")
    _edit_rejected(lambda m: m["golden"]["outputs"][0].update(offset=m["golden"]["outputs"][0]["offset"] + 4),
                   r"'golden.outputs\[0\]': offset \d+ \+ 24 bytes must be a multiple of 256")


def test_bad_params_and_bindings():
    _edit_rejected(lambda m: m["dispatches"][1].update(params=4096),
                   r"'dispatches\[1\]': params offset 4096 \+ 16 bytes .* inside the params section \(512 bytes\)")
    _edit_rejected(lambda m: m["dispatches"][0]["bindings"].append({"binding": 5, "buffer": "arena"}),
                   r"'dispatches\[0\]'.bindings\[2\]: binding 5 is not a storage binding kernel 0 "
                   r"\('affine'\) declares")
    _edit_rejected(lambda m: m["dispatches"][0]["bindings"].pop(1),
                   r"'dispatches\[0\]': kernel 0 \('affine'\) bindings \[2\] are not bound")
    _edit_rejected(lambda m: m["inputs"][0].update(shape=[3, 3]),
                   r"'inputs\[0\]' \('x'\): 24 bytes, but float32\[3, 3\] needs 36")


class _CountingAdapter:
    """An adapter that counts the devices requested from it."""

    def __init__(self, adapter):
        self._adapter, self.devices = adapter, 0

    def __getattr__(self, name):
        return getattr(self._adapter, name)

    def request_device_sync(self, **kw):
        self.devices += 1
        return self._adapter.request_device_sync(**kw)


def test_required_limit_larger_than_adapter():
    have = ADAPTER.limits["max-storage-buffer-binding-size"]
    data = fx.affine_package(X, W, edit=lambda m: m["requirements"]["limits"].update(
        maxStorageBufferBindingSize=have + 1, maxStorageBuffersPerShaderStage=4))
    counting = _CountingAdapter(ADAPTER)
    with pytest.raises(RunError, match=f"requires the limit maxStorageBufferBindingSize = {have + 1}, but the "
                                       f"adapter .* offers {have}"):
        WebGPUProgram(data, adapter=counting)
    assert counting.devices == 0  # rejected before the device was requested
    # The same package asking for what the adapter has gets a device with exactly those limits.
    data = fx.affine_package(X, W, edit=lambda m: m["requirements"]["limits"].update(
        maxStorageBufferBindingSize=have, maxStorageBuffersPerShaderStage=4))
    p = WebGPUProgram(data, adapter=counting)
    try:
        assert counting.devices == 1
        assert p.device.limits["max-storage-buffers-per-shader-stage"] == 4
        assert p.device.limits["max-storage-buffer-binding-size"] == have
        np.testing.assert_allclose(p(X), affine(X), rtol=1e-6)
    finally:
        p.close()


def test_missing_feature():
    data = fx.affine_package(X, W, edit=lambda m: m["requirements"]["features"].append("no-such-feature"))
    counting = _CountingAdapter(ADAPTER)
    with pytest.raises(RunError, match="lacks the feature 'no-such-feature'"):
        WebGPUProgram(data, adapter=counting)
    assert counting.devices == 0


def test_bad_wgsl_names_the_kernel():
    data = fx.affine_package(X, W, edit=lambda m: m["kernels"][0].update(code=fx.AFFINE.replace("x * w", "x * q")))
    with pytest.raises(PackageError, match=r"(?s)kernel 0 \(.affine.\) does not compile on .*identifier: `q`"):
        WebGPUProgram(data)


# ---- calls ------------------------------------------------------------------------------------

def test_wrong_inputs(prog):
    with pytest.raises(ValueError, match=r"input 0 \('x'\): expected float32\[2, 3\], got float32\[3, 2\]"):
        prog(X.T.copy())
    with pytest.raises(ValueError, match=r"input 0 \('x'\): expected float32\[2, 3\], got float64\[2, 3\]"):
        prog(X.astype(np.float64))
    with pytest.raises(TypeError, match=r"unknown input 'y' \(the inputs are: x\)"):
        prog(y=X)
    with pytest.raises(TypeError, match=r"missing inputs \['x'\]"):
        prog()
    with pytest.raises(TypeError, match="expected 1 inputs .x., got 2"):
        prog(X, X)
    with pytest.raises(TypeError, match="input 'x' given twice"):
        prog(X, x=X)


def test_info_and_stats(prog):
    prog(X)
    info = prog.info
    assert info["adapter"]["backend_type"] == "Vulkan" and "llvmpipe" in info["adapter_name"]
    assert (info["kernels"], info["dispatches"], info["pipelines"]) == (1, 2, 1)
    assert info["buffer_bytes"]["weights"] == 24 and info["buffer_bytes"]["params"] == 512
    assert info["buffer_bytes"]["total"] == sum(v for k, v in info["buffer_bytes"].items() if k != "total")
    assert 0 < info["pipeline_seconds"] < info["load_seconds"]
    assert info["calls"] >= 1 and prog.info["calls"] == info["calls"]
    prog(X)
    assert prog.info["calls"] == info["calls"] + 1
    assert prog.stats["dispatches"] == 2


def test_close_and_lost_device():
    p = WebGPUProgram(fx.affine_package(X, W))
    p.close()
    with pytest.raises(RunError, match="the program was closed"):
        p(X)
    p.close()  # twice is fine
    p = WebGPUProgram(fx.affine_package(X, W))
    p.device.destroy()  # as a lost device
    with pytest.raises(RunError, match="a call failed on the GPU"):
        p(X)
    with pytest.raises(RunError, match="a call failed on the GPU"):  # and every later call
        p(X)


def test_grid_larger_than_limit():
    most = ADAPTER.limits["max-compute-workgroups-per-dimension"]
    # Beyond the package's own limit (WebGPU's default): refused when the package is read.
    data = fx.affine_package(X, W, edit=lambda m: m["dispatches"][1].update(grid=[1, 65536, 1]))
    with pytest.raises(PackageError, match=r"'dispatches\[1\]': grid dimension is 65536, more than "
                                           r"maxComputeWorkgroupsPerDimension 65535"):
        read_package(data)
    # Within a limit the package raises beyond the adapter's: refused before a device is made.
    data = fx.affine_package(X, W, edit=lambda m: (m["requirements"]["limits"].update(
        maxComputeWorkgroupsPerDimension=most + 1), m["dispatches"][1].update(grid=[1, most + 1, 1])))
    counting = _CountingAdapter(ADAPTER)
    with pytest.raises(RunError, match=rf"requires the limit maxComputeWorkgroupsPerDimension = {most + 1}, but the "
                                       rf"adapter .* offers {most}"):
        WebGPUProgram(data, adapter=counting)
    assert counting.devices == 0


def test_buffer_larger_than_default_binding_limit():
    most = 128 << 20  # WebGPU's default, which the device gets when the package asks for no more
    data = fx.affine_package(X, W, edit=lambda m: m["arena"].update(bytes=most + 256))
    with pytest.raises(PackageError, match=rf"'arena.bytes' is {most + 256}, more than "
                                           rf"maxStorageBufferBindingSize {most} "):
        WebGPUProgram(data)


def test_weight_table_of_a_later_dtype():
    # Kernels bind whole shards: a weight tensor of a dtype this runtime cannot decode loads,
    # and only weight() of that tensor fails.
    data = fx.affine_package(X, W, edit=lambda m: m["weights"]["tensors"][0].update(dtype="complex64", bytes=24))
    pkg = read_package(data)
    with pytest.raises(PackageError, match=r"'weights.tensors\[0\]': dtype 'complex64' is not supported"):
        pkg.weight("w")
    p = WebGPUProgram(pkg)
    try:
        np.testing.assert_allclose(p(X), affine(X), rtol=1e-6)
    finally:
        p.close()


def test_generated_and_sampled_golden_data():
    """A generated golden input (a seed, no bytes) and a sampled golden output (every k-th
    element): read, checked, and malformed ones named."""
    from chroma.golden import golden_uniform

    spec = {"kind": "uniform", "seed": 7, "low": -1.5, "high": 2.25}

    def generated(m):
        g = m["golden"]["inputs"][0]
        m["golden"]["inputs"][0] = {"name": g["name"], "dtype": g["dtype"], "shape": g["shape"], "generate": dict(spec)}

    pkg = read_package(fx.affine_package(X, W, edit=generated))
    [gx] = pkg.golden_inputs()
    assert gx.dtype == np.float32 and gx.shape == X.shape
    assert np.array_equal(gx.reshape(-1).view(np.uint32), golden_uniform(X.size, 7, -1.5, 2.25).view(np.uint32))

    def bad(**change):
        def edit(m):
            generated(m)
            m["golden"]["inputs"][0]["generate"].update(change)
        return edit
    _edit_rejected(bad(kind="normal"), r"'golden.inputs\[0\]': field 'generate' is .*'normal'.*expected")
    _edit_rejected(bad(seed=-1), r"'golden.inputs\[0\]': field 'generate' is .* a 32-bit unsigned integer")
    _edit_rejected(bad(low=float("nan")), r"the manifest is not UTF-8 JSON .*NaN is not JSON")  # NaN is no JSON
    _edit_rejected(bad(low=1e39), r"'golden.inputs\[0\]': field 'generate' is ")  # beyond float32
    _edit_rejected(lambda m: m["golden"]["outputs"][0].update(stride=0),
                   r"'golden.outputs\[0\]': field 'stride' is 0, expected a positive integer")
    _edit_rejected(lambda m: m["golden"]["outputs"][0].update(stride=2),
                   r"'golden.outputs\[0\]' \('\w*'\): 24 bytes, but float32\[2, 3\] needs 12")


def test_an_empty_state_tensor_loads_and_resets():
    """A zero-byte state tensor (an empty cache) has nothing to upload: loading and
    reset_state skip it (wgpu refuses a 0-byte write; the package fuzzer found it)."""
    init = np.array([1, 2, 3], np.float32)
    data = fx.state_package(init, np.full(3, 0.5, np.float32), edit=lambda m: m["state"]["tensors"].append(
        {"name": "empty", "offset": 0, "bytes": 0, "init": 0}))
    p = WebGPUProgram(data)
    try:
        np.testing.assert_array_equal(p(np.ones(3, np.float32)), init + 1)
        p.reset_state()
        np.testing.assert_array_equal(p(np.ones(3, np.float32)), init + 1)
    finally:
        p.close()
