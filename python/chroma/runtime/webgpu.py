"""The Python runtime of WebGPU packages (`.chroma-web`, docs/webgpu_package.md), on wgpu-py.

    prog = chroma.runtime.WebGPUProgram("build/m.chroma-web")
    y = prog(x)                      # NumPy in, NumPy out
    prog.self_check()                # {'ok': True, 'max_error': ..., 'tolerance': {...}, ...}

`read_package` needs only NumPy; `WebGPUProgram` imports `wgpu` when one is created.

Choosing the adapter: wgpu-native runs on Vulkan here, and the Vulkan loader takes its driver
(ICD) from the environment variable VK_ICD_FILENAMES, read when wgpu creates its instance (at
the process's first adapter request), so set it before that:
    Mesa's lavapipe  VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json  (has shader-f16)
    SwiftShader      VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json    (Chromium's)
or pass an adapter of your own: ``WebGPUProgram(path, adapter=wgpu.gpu.enumerate_adapters_sync()[i])``,
importing this module before asking wgpu for adapters: importing it loads Triton's native
library first where torch brought Triton (`_load_triton_first`), which crashes a process that
loads it after a Vulkan driver.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from ..errors import PackageError, RunError
from .artifact import read_artifact_package
from .gpu import GpuProgram
from .package import FORMAT_VERSION, STATUS_BYTES, Package, Tensor, read_package

__all__ = ["Package", "PackageError", "RunError", "Tensor", "WebGPUProgram", "read_package", "FORMAT_VERSION",
           "load_artifact"]

_I32 = np.iinfo(np.int32)
_CLOSED = "the program was closed"


def _load_triton_first() -> None:
    """Loads Triton's native library before a Vulkan driver, when Triton is installed (torch
    brings it): loaded after lavapipe or SwiftShader, it crashes the process (a segmentation
    fault in its module initialisation, seen with torch 2.14's Triton), and torch.export
    imports it, so a process that compiles another model after running a package would die."""
    import importlib.util

    if importlib.util.find_spec("triton") is not None:
        try:
            import triton._C.libtriton  # noqa: F401
        except ImportError:
            pass


# At import, so that an adapter the caller enumerates after importing this module (as the
# docstring says) finds Triton loaded already.
_load_triton_first()


def _limit_key(name: str, adapter_limits) -> Optional[str]:
    """wgpu-py's key for the WebGPU limit `name` ('maxStorageBufferBindingSize' ->
    'max-storage-buffer-binding-size', 'maxTextureDimension1D' -> 'max-texture-dimension-1d')."""
    flat = name.replace("-", "").lower()
    return next((k for k in adapter_limits if k.replace("-", "").lower() == flat), None)


class WebGPUProgram(GpuProgram):
    """A package loaded on a WebGPU device. Call it with NumPy arrays (positionally, or by
    input name); it returns one array, or a tuple when the model returns several.

    Loading checks the package, then the adapter's features and limits before the device is
    created (with exactly the package's), creates every buffer, uploads the weights, uniform
    values and initial state once, and creates every pipeline and bind group. Pipelines are
    created one by one with create_compute_pipeline: wgpu-py 0.32's wgpu-native backend
    implements create_compute_pipeline_async by calling it, so there is no parallelism to gain.
    Calls are serialized. A GPU error during a call (a lost device, a failed submission) makes
    that call and every later one raise RunError with its reason.
    """

    _dialects, _kind = ("wgsl",), "WebGPU"

    def __init__(self, package: Union[Package, str, os.PathLike, bytes], adapter: Any = None):
        import wgpu  # only here: read_package and `import chroma` work without it

        _load_triton_first()

        t0 = time.perf_counter()
        self._wgpu = wgpu
        p = self._open(package)  # a WebGPU package has one entry point (the validator's rule)
        if adapter is None:
            why = "none offered"
            try:
                adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
            except RuntimeError as e:
                why = str(e)
            if adapter is None:
                raise RunError(f"no WebGPU adapter ({why}); choose a Vulkan driver with VK_ICD_FILENAMES "
                               f"(see chroma.runtime.webgpu's docstring)")
        self.adapter = adapter
        info = dict(adapter.info)
        name = f"{info.get('device') or info.get('description')} ({info.get('backend_type')} " \
               f"{info.get('adapter_type')})"
        for f in p.features:
            if f not in adapter.features:
                raise RunError(f"{p.where}: the adapter {name} lacks the feature '{f}' the package requires")
        limits = {}
        for lim, want in p.limits.items():
            key = _limit_key(lim, adapter.limits)
            if key is None:
                raise RunError(f"{p.where}: requirements.limits names '{lim}', a limit the adapter {name} does not "
                               f"report")
            have = adapter.limits[key]
            if (have > want) if lim.startswith("min") else (have < want):  # min* limits: smaller is better
                raise RunError(f"{p.where}: the package requires the limit {lim} = {want}, but the adapter {name} "
                               f"offers {have}")
            limits[key] = want
        try:
            self.device = dev = adapter.request_device_sync(required_features=list(p.features), required_limits=limits)
        except Exception as e:  # noqa: BLE001 - wgpu raises RuntimeError or a GPUError
            raise RunError(f"{p.where}: the adapter {name} refused the device: {e}") from None
        try:
            dev.lost_async.then(lambda i: setattr(self, "_lost", f"the device was lost ({i.reason}): {i.message}"))
        except Exception:  # noqa: BLE001 - wgpu-py 0.32 does not implement `lost` on wgpu-native
            pass
        try:
            at, pipeline_seconds = self._create(wgpu, p, dev, name)
        except BaseException as e:
            dev.destroy()  # a package the device rejects leaves nothing behind
            if isinstance(e, wgpu.GPUError):
                raise RunError(f"{p.where}: the device ({name}) rejected the package: {e}") from None
            raise
        sizes = {"arena": p.arena_bytes, "state": p.state_bytes, "weights": sum(nb for _, nb in p.shards),
                 "params": p.params_bytes, "staging": at}
        self._info = {"adapter": info, "adapter_name": name, "kernels": len(p.kernels),
                      "dispatches": len(p.dispatches), "pipelines": len(self._pipelines), "pipeline_creation": "sync",
                      "limits": limits, "buffer_bytes": dict(sizes, total=sum(sizes.values())),
                      "load_seconds": time.perf_counter() - t0, "pipeline_seconds": pipeline_seconds}

    def _create(self, wgpu: Any, p: Package, dev: Any, name: str) -> Tuple[int, float]:
        """Buffers (filled), pipelines and bind groups; returns the staging size and the seconds
        the pipelines took."""
        maxgrid = dev.limits["max-compute-workgroups-per-dimension"]
        for i, d in enumerate(p.dispatches):
            if max(d["grid"]) > maxgrid:
                raise RunError(f"{p.where}: dispatch {i} ('{d['label']}') has grid {list(d['grid'])}, more than the "
                               f"device's maxComputeWorkgroupsPerDimension {maxgrid}")

        # Buffers the package does not raise the limits for must fit the defaults.
        for what, nbytes, storage in [("arena.bytes", p.arena_bytes, True), ("state.bytes", p.state_bytes, True),
                                      ("params.bytes", p.params_bytes, False)] + \
                [(f"weights.shards[{i}].bytes", nb, True) for i, (_, nb) in enumerate(p.shards)]:
            for lim in ("maxBufferSize", "maxStorageBufferBindingSize")[:1 + storage]:
                most = dev.limits[_limit_key(lim, dev.limits)]
                if nbytes > most:
                    raise PackageError(f"{p.where}: manifest field '{what}' is {nbytes}, more than the device's {lim} "
                                       f"{most} (requirements.limits does not ask for more)")

        U, q = wgpu.BufferUsage, dev.queue
        self._arena = dev.create_buffer(label="arena", size=p.arena_bytes, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
        self._state = None
        if p.state_bytes:
            self._state = dev.create_buffer(label="state", size=p.state_bytes,
                                            usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
            self._write_state()
        self._shards = []
        for i, (off, nb) in enumerate(p.shards):
            self._shards.append(dev.create_buffer(label=f"weights{i}", size=nb, usage=U.STORAGE | U.COPY_DST))
            q.write_buffer(self._shards[-1], 0, p.section(off, nb))
        self._params = None
        if p.params_bytes:
            self._params = dev.create_buffer(label="params", size=p.params_bytes, usage=U.UNIFORM | U.COPY_DST)
            q.write_buffer(self._params, 0, p.section(p.params_offset, p.params_bytes))
        # One staging buffer: the status block at 0, then each output at a multiple of 8.
        self._out_at, at = [], STATUS_BYTES
        for t in p.outputs:
            self._out_at.append(at)
            at += (t.nbytes + 7) // 8 * 8
        self._staging = dev.create_buffer(label="staging", size=at, usage=U.MAP_READ | U.COPY_DST)

        t1 = time.perf_counter()
        self._pipelines = []
        for k, kernel in enumerate(p.kernels):
            entries = [{"binding": n, "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": kind, "min_binding_size": nbytes}}
                       for n, (kind, nbytes) in sorted(kernel["bindings"].items())]
            try:
                layout = dev.create_bind_group_layout(label=kernel["name"], entries=entries)
                module = dev.create_shader_module(label=kernel["name"], code=kernel["code"])
                pipe = dev.create_compute_pipeline(
                    label=kernel["name"], layout=dev.create_pipeline_layout(bind_group_layouts=[layout]),
                    compute={"module": module, "entry_point": kernel["entry"]})
            except wgpu.GPUError as e:
                raise PackageError(f"{p.where}: kernel {k} ('{kernel['name']}') does not compile on {name}: "
                                   f"{e}") from None
            self._pipelines.append((layout, pipe))
        pipeline_seconds = time.perf_counter() - t1

        self._schedule = []
        for i, d in enumerate(p.dispatches):
            layout, pipe = self._pipelines[d["kernel"]]
            entries = []
            if d["params"]:
                n, off, nbytes = d["params"]
                entries.append({"binding": n, "resource": {"buffer": self._params, "offset": off, "size": nbytes}})
            for n, buf in d["bindings"].items():
                gpu = self._shards[buf[1]] if isinstance(buf, tuple) else self._arena if buf == "arena" else self._state
                entries.append({"binding": n, "resource": {"buffer": gpu, "offset": 0, "size": gpu.size}})
            try:
                group = dev.create_bind_group(label=d["label"], layout=layout, entries=entries)
            except wgpu.GPUError as e:
                raise PackageError(f"{p.where}: dispatch {i} ('{d['label']}'): bind group rejected: {e}") from None
            self._schedule.append((pipe, group, d["grid"]))
        return at, pipeline_seconds

    def _write_state(self) -> None:
        for _, off, nb, init in self.package.state:
            if nb:  # an empty state tensor has nothing to write (wgpu refuses 0 bytes)
                self.device.queue.write_buffer(self._state, off, self.package.section(init, nb))

    def reset_state(self) -> None:
        """Restores every state tensor (KV caches) to its initial value."""
        with self._lock:
            if self._state is not None and self._lost is None:
                self._write_state()

    def _call_entry(self, index: int, arrays: tuple, named: dict):
        words = self._words(arrays, named)
        wgpu, p = self._wgpu, self.package
        with self._lock:
            if self._lost:
                raise RunError(f"{p.where}: {self._lost}")
            try:
                q = self.device.queue
                for t, w in zip(self.inputs, words):
                    if t.nbytes:
                        q.write_buffer(self._arena, t.offset, w)
                enc = self.device.create_command_encoder()
                enc.clear_buffer(self._arena, p.status_offset, STATUS_BYTES)  # word 0 = 0: no bad index yet
                cp = enc.begin_compute_pass()
                last = None
                for pipe, group, grid in self._schedule:
                    if pipe is not last:
                        cp.set_pipeline(pipe)
                        last = pipe
                    cp.set_bind_group(0, group)
                    cp.dispatch_workgroups(*grid)
                cp.end()
                enc.copy_buffer_to_buffer(self._arena, p.status_offset, self._staging, 0, STATUS_BYTES)
                for t, at in zip(self.outputs, self._out_at):
                    if t.nbytes:
                        enc.copy_buffer_to_buffer(self._arena, t.offset, self._staging, at, t.nbytes)
                q.submit([enc.finish()])
                self._staging.map_sync(wgpu.MapMode.READ)
                try:
                    data = self._staging.read_mapped(copy=True)
                finally:
                    self._staging.unmap()
            except (wgpu.GPUError, RuntimeError) as e:
                # The arena and state are in an unknown state now: every later call fails too.
                self._lost = self._lost or f"a call failed on the GPU: {e}"
                raise RunError(f"{p.where}: {self._lost}") from None
            self._calls += 1
        self._status(np.frombuffer(data, "<u4", 5), p.dispatches)
        outs = [t.decode(data[at:at + t.nbytes]) for t, at in zip(self.outputs, self._out_at)]
        return outs[0] if self._single else tuple(outs)

    def profile(self, *arrays: Any, iters: int = 5, **named: Any) -> List[Dict[str, Any]]:
        """Each dispatch's time: the call's inputs are uploaded once, then every dispatch is
        submitted alone and waited for, `iters` times (the median is kept). Includes each
        submit's overhead, so the sum exceeds a call's time; it ranks kernels, slowest first:
        [{'dispatch', 'kernel', 'label', 'node', 'source', 'ms'}]."""
        import time

        words = self._words(arrays, named)
        q, p = self.device.queue, self.package
        with self._lock:
            for t, w in zip(self.inputs, words):
                if t.nbytes:
                    q.write_buffer(self._arena, t.offset, w)
            samples = [[] for _ in self._schedule]
            for _ in range(iters):
                for i, (pipe, group, grid) in enumerate(self._schedule):
                    enc = self.device.create_command_encoder()
                    cp = enc.begin_compute_pass()
                    cp.set_pipeline(pipe)
                    cp.set_bind_group(0, group)
                    cp.dispatch_workgroups(*grid)
                    cp.end()
                    enc.copy_buffer_to_buffer(self._arena, p.status_offset, self._staging, 0, 4)
                    t0 = time.perf_counter()
                    q.submit([enc.finish()])
                    self._staging.map_sync(self._wgpu.MapMode.READ)  # waits for the dispatch
                    self._staging.unmap()
                    samples[i].append((time.perf_counter() - t0) * 1e3)
        rows = []
        for i, ms in enumerate(samples):
            d = p.dispatches[i]
            rows.append({"dispatch": i, "kernel": p.manifest["kernels"][d["kernel"]]["name"], "label": d["label"],
                         "node": d["node"], "source": d["source"], "ms": float(np.median(ms))})
        return sorted(rows, key=lambda r: -r["ms"])

    def close(self) -> None:
        """Releases the GPU buffers and the device; later calls raise RunError."""
        with self._lock:
            if self._lost == _CLOSED:
                return
            self._lost = _CLOSED
            for b in [self._arena, self._state, self._params, self._staging, *self._shards]:
                if b is not None:
                    b.destroy()
            self.device.destroy()
            self._schedule, self._pipelines = [], []


def load_artifact(directory: str, manifest: dict, mpath: str, options: Any) -> WebGPUProgram:
    """A WebGPU artifact directory (the registry's loader): its manifest names the package
    beside the directory."""
    prog = WebGPUProgram(read_artifact_package(directory, manifest, mpath))
    prog.manifest = manifest  # the artifact's description: the lowered kernels, the plan
    return prog
