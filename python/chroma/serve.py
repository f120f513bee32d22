"""Serving a compiled artifact on Ray Serve (`chroma serve`, docs/serving.md).

    from ray import serve
    from chroma.serve import deployment
    app = deployment("build/m", num_replicas=2, max_batch_size=32, batch_wait_timeout_s=0.005).bind()
    serve.run(app)

Each replica loads the artifact once (CPU threads per replica: `threads`; a CUDA artifact
asks Ray for one GPU per replica) and answers:

- `POST /` (or `/predict`): the inputs as JSON (`{"inputs": [...]}`, a list in the model's
  input order or an object by input name; nested lists of numbers) or as a safetensors file
  (`Content-Type: application/x-safetensors`: tensors named by input name; the format's spec:
  an 8-byte little-endian header length, a JSON header of dtype, shape and byte offsets, the
  raw little-endian data). The answer comes in the request's encoding
  (`{"outputs": [...]}`, or safetensors with tensors `output0`, `output1`, ...).
- `GET /health`: 200 while the program is loaded; `GET /metadata`: inputs, outputs, the batch
  range, the limits.

Every request is validated before it reaches the program (input count and names, dtype,
shape, rows, bytes, the encoding's own fields) and a bad one is answered 400 (413 when too
large, 415 for another content type) with a message naming the problem; the replica stays
up. A program compiled for a batch range (chroma.compile(batch=...)) takes any number of
rows: concurrent requests are merged by Ray Serve's request batching (`max_batch_size` rows
at most per call, `batch_wait_timeout_s` of waiting) and run as one batch. Requests,
rows per call and latency are counted through Ray's metrics (`chroma_requests`,
`chroma_batch_rows`, `chroma_latency_s`).

Ray's usage reporting is turned off (RAY_USAGE_STATS_ENABLED=0) before Ray is imported.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

SAFETENSORS = "application/x-safetensors"
_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
              "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_MAX_HEADER = 1 << 20


class RequestError(ValueError):
    """A request the deployment refuses: `status` is the HTTP status (400, 413, 415)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _st_dtypes() -> Dict[str, Any]:
    d = dict(_ST_DTYPES)
    try:
        import ml_dtypes

        d["BF16"] = ml_dtypes.bfloat16
    except ImportError:  # pragma: no cover - ml_dtypes is a dependency
        pass
    return d


def encode_safetensors(tensors: Dict[str, np.ndarray]) -> bytes:
    """The safetensors encoding of named arrays (little-endian, C order)."""
    names = {np.dtype(v): k for k, v in _st_dtypes().items()}
    header: Dict[str, Any] = {}
    blobs, off = [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        if a.dtype not in names:
            raise ValueError(f"tensor '{name}': dtype {a.dtype} has no safetensors name")
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def decode_safetensors(body: bytes) -> Dict[str, np.ndarray]:
    """Named arrays from a safetensors file, every field checked (RequestError naming it)."""
    if len(body) < 8:
        raise RequestError("safetensors: shorter than its 8-byte header length")
    (n,) = struct.unpack("<Q", body[:8])
    if n > _MAX_HEADER or 8 + n > len(body):
        raise RequestError(f"safetensors: header length {n} exceeds the body ({len(body)} bytes) or {_MAX_HEADER}")
    try:
        header = json.loads(body[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(f"safetensors: the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise RequestError("safetensors: the header is not an object")
    data = memoryview(body)[8 + n:]
    dtypes = _st_dtypes()
    out: Dict[str, np.ndarray] = {}
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"safetensors: tensor '{name}'"
        if not isinstance(info, dict):
            raise RequestError(f"{where}: not an object")
        dt = dtypes.get(info.get("dtype"))
        if dt is None:
            raise RequestError(f"{where}: field 'dtype' {info.get('dtype')!r} is not one of {sorted(dtypes)}")
        shape, offs = info.get("shape"), info.get("data_offsets")
        if not (isinstance(shape, list) and all(isinstance(s, int) and 0 <= s < 1 << 40 for s in shape)):
            raise RequestError(f"{where}: field 'shape' must be a list of sizes")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)
                and 0 <= offs[0] <= offs[1] <= len(data)):
            raise RequestError(f"{where}: field 'data_offsets' must be [begin, end] within the {len(data)} data bytes")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if count * np.dtype(dt).itemsize != offs[1] - offs[0]:
            raise RequestError(f"{where}: shape {shape} of {info['dtype']} needs {count * np.dtype(dt).itemsize} bytes, "
                               f"data_offsets hold {offs[1] - offs[0]}")
        spans.append((offs[0], offs[1], name))
        out[name] = np.frombuffer(data[offs[0]:offs[1]], dtype=np.dtype(dt).newbyteorder("<")).astype(dt).reshape(shape)
    spans.sort()
    for (b0, e0, n0), (b1, _, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise RequestError(f"safetensors: tensors '{n0}' and '{n1}' overlap")
    return out


def _program_dtype(spec: Any) -> np.dtype:
    if str(spec.dtype) == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(spec.dtype)


class Model:
    """The validation and the call, without Ray (what each replica holds; testable alone).

    `program`: a loaded Program or BatchedProgram. `max_rows`: the most rows one request may
    have (default: the batch range's top, or the program's fixed batch). `max_bytes`: the most
    input bytes one request may carry."""

    def __init__(self, program: Any, *, max_rows: Optional[int] = None, max_bytes: int = 64 << 20):
        self.program = program
        self.batched = hasattr(program, "sizes")
        self.inputs = list(program.inputs)
        self.outputs = list(program.outputs)
        self.dtypes = [_program_dtype(s) for s in self.inputs]
        if self.batched:
            self.max_rows = int(max_rows or program.range[1])
        else:
            self.max_rows = int(self.inputs[0].shape[0]) if self.inputs and self.inputs[0].shape else 1
        self.max_bytes = int(max_bytes)

    def metadata(self) -> Dict[str, Any]:
        spec = lambda s, dt: {"name": s.name, "dtype": str(s.dtype),  # noqa: E731
                              "shape": (["batch"] + list(s.shape[1:])) if self.batched else list(s.shape)}
        return {"inputs": [spec(s, d) for s, d in zip(self.inputs, self.dtypes)],
                "outputs": [spec(s, None) for s in self.outputs],
                "batch": list(self.program.range) if self.batched else None,
                "max_rows": self.max_rows, "max_bytes": self.max_bytes}

    def validate(self, arrays: Sequence[Any], *, exact_dtype: bool) -> List[np.ndarray]:
        """The request's inputs as arrays the program takes; RequestError naming the problem."""
        if len(arrays) != len(self.inputs):
            raise RequestError(f"expected {len(self.inputs)} inputs ({', '.join(s.name for s in self.inputs)}), "
                               f"got {len(arrays)}")
        out, rows = [], None
        total = 0
        for i, (a, spec, dt) in enumerate(zip(arrays, self.inputs, self.dtypes)):
            where = f"input {i} ('{spec.name}')"
            if isinstance(a, np.ndarray):
                if exact_dtype and a.dtype != dt:
                    raise RequestError(f"{where}: dtype {a.dtype}, the model takes {dt}")
                if a.dtype.kind in "OUSV":
                    raise RequestError(f"{where}: dtype {a.dtype} is not a number type")
                a = a.astype(dt, copy=False)
            else:
                try:
                    raw = np.asarray(a)
                except (ValueError, TypeError) as e:
                    raise RequestError(f"{where}: not a rectangular array of numbers ({e})") from None
                if raw.dtype.kind not in "biuf":
                    raise RequestError(f"{where}: not an array of numbers (got {raw.dtype} values)")
                if dt.kind in "iub" and raw.dtype.kind == "f" and not np.all(np.mod(raw, 1) == 0):
                    raise RequestError(f"{where}: the model takes {dt}, the values are not integers")
                a = raw.astype(dt)
            want = list(spec.shape)
            if a.ndim != len(want):
                raise RequestError(f"{where}: {a.ndim} dimensions, the model takes {len(want)} "
                                   f"({self.metadata()['inputs'][i]['shape']})")
            inner_ok = list(a.shape[1:]) == want[1:] if self.batched else list(a.shape) == want
            if not inner_ok:
                raise RequestError(f"{where}: shape {list(a.shape)}, the model takes "
                                   f"{self.metadata()['inputs'][i]['shape']}")
            if rows is None:
                rows = a.shape[0] if a.ndim else 1
            elif self.batched and a.shape[0] != rows:
                raise RequestError(f"{where}: {a.shape[0]} rows, input 0 has {rows}")
            total += a.nbytes
            out.append(np.ascontiguousarray(a))
        if self.batched and (rows or 0) < 1:
            raise RequestError("a request of 0 rows")
        if self.batched and rows > self.max_rows:
            raise RequestError(f"{rows} rows in one request, at most {self.max_rows}", 413)
        if total > self.max_bytes:
            raise RequestError(f"{total} input bytes in one request, at most {self.max_bytes}", 413)
        return out

    def run(self, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        res = self.program(*arrays)
        return list(res) if isinstance(res, tuple) else [res]

    def parse(self, body: bytes, content_type: str) -> Tuple[List[np.ndarray], bool]:
        """(validated inputs, binary?) from an HTTP body."""
        if len(body) > self.max_bytes * 4 + (1 << 20):
            raise RequestError(f"a body of {len(body)} bytes, at most {self.max_bytes * 4 + (1 << 20)}", 413)
        ct = (content_type or "").split(";")[0].strip().lower()
        if ct in (SAFETENSORS, "application/octet-stream"):
            named = decode_safetensors(body)
            names = [s.name for s in self.inputs]
            unknown = sorted(set(named) - set(names))
            if unknown:
                raise RequestError(f"safetensors: unknown tensor(s) {unknown}; the model's inputs: {names}")
            missing = [n for n in names if n not in named]
            if missing:
                raise RequestError(f"safetensors: missing input(s) {missing}")
            return self.validate([named[n] for n in names], exact_dtype=True), True
        if ct in ("application/json", ""):
            try:
                doc = json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
                raise RequestError(f"the body is not JSON ({e})") from None
            if not isinstance(doc, dict) or "inputs" not in doc:
                raise RequestError('the JSON body must be an object with "inputs"')
            ins = doc["inputs"]
            if isinstance(ins, dict):
                names = [s.name for s in self.inputs]
                unknown = sorted(set(ins) - set(names))
                if unknown:
                    raise RequestError(f'"inputs": unknown name(s) {unknown}; the model\'s inputs: {names}')
                ins = [ins[n] if n in ins else None for n in names]
                missing = [n for n, v in zip(names, ins) if v is None]
                if missing:
                    raise RequestError(f'"inputs": missing {missing}')
            if not isinstance(ins, list):
                raise RequestError('"inputs" must be a list (in input order) or an object by input name')
            return self.validate(ins, exact_dtype=False), False
        raise RequestError(f"content type {ct!r}: send application/json or {SAFETENSORS}", 415)

    def answer(self, outputs: Sequence[np.ndarray], binary: bool) -> Tuple[bytes, str]:
        if binary:
            return encode_safetensors({f"output{i}": o for i, o in enumerate(outputs)}), SAFETENSORS
        return json.dumps({"outputs": [o.astype(np.float64 if o.dtype.kind == "f" else o.dtype).tolist()
                                       for o in outputs]}).encode(), "application/json"


_SERVER_CLASS: Any = None


def server_class() -> Any:
    """The Ray Serve deployment class (deployment() binds its arguments); made on first use,
    so that importing chroma.serve does not import Ray."""
    global _SERVER_CLASS
    if _SERVER_CLASS is not None:
        return _SERVER_CLASS
    from ray import serve
    from ray.serve import metrics

    def rows_of(items: List[List[np.ndarray]]) -> int:  # the batch's size in rows, not requests
        return sum(int(it[0].shape[0]) for it in items)

    class ChromaServer:
        def __init__(self, directory: Optional[str], threads: int = 1, max_batch_size: int = 32,
                     batch_wait_timeout_s: float = 0.005, max_rows: Optional[int] = None, max_bytes: int = 64 << 20,
                     program_factory: Any = None):
            import chroma

            self.directory = directory
            prog = program_factory() if program_factory is not None else chroma.load(directory, threads=threads)
            self.model = Model(prog, max_rows=max_rows, max_bytes=max_bytes)
            # A request larger than max_batch_size rows still runs (alone).
            self._batched_call.set_max_batch_size(int(max_batch_size))
            self._batched_call.set_batch_wait_timeout_s(float(batch_wait_timeout_s))
            self.requests = metrics.Counter("chroma_requests", description="Requests by HTTP status",
                                            tag_keys=("status",))
            self.batch_rows = metrics.Histogram("chroma_batch_rows", description="Rows per program call",
                                                boundaries=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
            self.latency = metrics.Histogram("chroma_latency_s", description="Seconds per request",
                                             boundaries=[0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5])

        def node_id(self) -> str:
            """The Ray node this replica runs on."""
            import ray

            return ray.get_runtime_context().get_node_id()

        def check_health(self) -> None:
            if self.model is None:
                raise RuntimeError("the program is not loaded")

        async def _run(self, arrays: List[np.ndarray]) -> List[np.ndarray]:
            self.batch_rows.observe(float(arrays[0].shape[0]) if arrays and arrays[0].ndim else 1.0)
            return await asyncio.get_running_loop().run_in_executor(None, self.model.run, arrays)

        @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005, batch_size_fn=rows_of)
        async def _batched_call(self, items: List[List[np.ndarray]]) -> List[List[np.ndarray]]:
            rows = [it[0].shape[0] for it in items]
            merged = [np.concatenate(parts) if len(items) > 1 else parts[0] for parts in zip(*items)]
            outs = await self._run(merged)
            res, r0 = [], 0
            for r in rows:
                res.append([o[r0:r0 + r] for o in outs])
                r0 += r
            return res

        async def predict(self, *arrays: Any) -> Tuple[np.ndarray, ...]:
            """The Python handle's call: NumPy arrays in, a tuple of arrays out (RequestError
            for a bad request)."""
            ins = self.model.validate(list(arrays), exact_dtype=False)
            return tuple(await self._call(ins))

        async def _call(self, ins: List[np.ndarray]) -> List[np.ndarray]:
            if self.model.batched:
                return await self._batched_call(ins)
            return await self._run(ins)

        async def __call__(self, request: Any) -> Any:
            from starlette.responses import JSONResponse, Response

            t0 = time.perf_counter()
            path = request.url.path
            root = request.scope.get("root_path", "")  # the application's route prefix
            if root and path.startswith(root):
                path = path[len(root):]
            path = path.rstrip("/") or "/"
            status = 200
            try:
                if path == "/health" and request.method == "GET":
                    return JSONResponse({"status": "ok"})
                if path == "/metadata" and request.method == "GET":
                    return JSONResponse(self.model.metadata())
                if path not in ("/", "/predict"):
                    status = 404
                    return JSONResponse({"error": f"no route {path} (POST / or /predict, GET /health, /metadata)"}, 404)
                if request.method != "POST":
                    status = 405
                    return JSONResponse({"error": f"{request.method} {path}: POST the inputs"}, 405)
                ins, binary = self.model.parse(await request.body(), request.headers.get("content-type", ""))
                outs = await self._call(ins)
                body, ct = self.model.answer(outs, binary)
                return Response(body, media_type=ct)
            except RequestError as e:
                status = e.status
                return JSONResponse({"error": str(e)}, status)
            finally:
                self.requests.inc(tags={"status": str(status)})
                self.latency.observe(time.perf_counter() - t0)

    _SERVER_CLASS = ChromaServer
    return ChromaServer


def deployment(directory: Optional[str], *, num_replicas: int = 1, threads: int = 1, max_batch_size: int = 32,
               batch_wait_timeout_s: float = 0.005, max_rows: Optional[int] = None, max_bytes: int = 64 << 20,
               ray_actor_options: Optional[Dict[str, Any]] = None, name: str = "chroma",
               program_factory: Any = None) -> Any:
    """A Ray Serve deployment of the artifact in `directory`; `.bind()` makes the application.

    threads: CPU threads of each replica's program (and the CPUs Ray reserves for it). A CUDA
    artifact reserves one GPU per replica. program_factory: instead of an artifact, a
    picklable function each replica calls for its program (anything with `inputs`,
    `outputs` and a call; with `sizes` and `range` it takes any number of rows): the
    benchmark serves eager PyTorch and ONNX Runtime through the same code this way. Other
    arguments: module docstring."""
    from ray import serve

    target = "cpu"
    if program_factory is None:
        directory = os.path.abspath(directory)
        with open(os.path.join(directory, "manifest.json"), encoding="utf-8") as f:
            target = json.load(f).get("target", "cpu")
    opts = {"num_cpus": threads}
    from .runtime.registry import target as target_runtime

    if target_runtime(target).ray_gpu:
        opts["num_gpus"] = 1
    opts.update(ray_actor_options or {})
    cfg = dict(directory=directory, threads=threads, max_batch_size=max_batch_size,
               batch_wait_timeout_s=batch_wait_timeout_s, max_rows=max_rows, max_bytes=max_bytes,
               program_factory=program_factory)

    class Replica(server_class()):
        def __init__(self):
            super().__init__(**cfg)

    Replica.__name__ = Replica.__qualname__ = "ChromaReplica"
    return serve.deployment(Replica, name=name, num_replicas=num_replicas, ray_actor_options=opts,
                            health_check_period_s=2.0, health_check_timeout_s=30.0)


_RETRYABLE = ("ActorDiedError", "ActorUnavailableError", "RayActorError", "DeploymentUnavailableError",
              "BackPressureError")


def call(handle: Any, *arrays: Any, retries: int = 5, backoff_s: float = 0.2) -> Tuple[np.ndarray, ...]:
    """handle.predict(*arrays) through a DeploymentHandle, retried when its replica died or is
    restarting (the answer is a pure function of the inputs: a retry cannot double an effect)."""
    for attempt in range(retries + 1):
        try:
            return handle.predict.remote(*arrays).result()
        except Exception as e:  # noqa: BLE001 - Ray's error types vary by version; retried by name
            if type(e).__name__ not in _RETRYABLE or attempt == retries:
                raise
            time.sleep(backoff_s * (attempt + 1))
    raise AssertionError("unreachable")
