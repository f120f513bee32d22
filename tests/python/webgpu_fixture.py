"""TEST-ONLY writer of `.chroma-web` packages (docs/webgpu_package.md, format version 2) with
handwritten WGSL kernels, for the Python WebGPU runtime's tests. Not the compiler's writer.

    w = PackageWriter()
    x = w.input("x", np.float32, (2, 3))                  # arena word offsets
    y = w.output("y", np.float32, (2, 3))
    wt = w.weight("w", np.arange(6, dtype=np.float32))    # word offset in shard 0
    k = w.kernel("affine", AFFINE, uniform_bytes=16, storage=[1], read_only=[2])
    w.dispatch(k, grid=(1, 1, 1), params=[6, x, wt, y], bindings={1: "arena", 2: ("weights", 0)})
    w.golden([x_value], [expected])
    data = w.build()                                      # bytes of a valid package

`build(edit=f)` lets f change the manifest (a dict) before it is serialized and hashed, so a
test can write a package that is well-formed and correctly hashed but breaks one rule.
"""

import hashlib
import json
import struct

import numpy as np

ALIGN = 256

# y[i] = x[i] * w[i] + 1 over n words: the input and output in the arena, w in a weight shard;
# the word offsets come in the uniform values.
AFFINE = """
struct Params { n: u32, x: u32, w: u32, y: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> arena: array<u32>;
@group(0) @binding(2) var<storage, read> w0: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i >= p.n) { return; }
  let x = bitcast<f32>(arena[p.x + i]);
  let w = bitcast<f32>(w0[p.w + i]);
  arena[p.y + i] = bitcast<u32>(x * w + 1.0);
}
"""

# out[i] = table[idx[i]] (idx: int64 stored as i32 words). An index outside [0, rows) is
# clamped and reported in the status block: word 0 = 1, word 1 = dispatch index + 1, word 2 =
# the index, as the generated gathers do.
GATHER = """
struct Params { n: u32, idx: u32, table: u32, out: u32, rows: u32, dispatch1: u32, status: u32, pad: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> arena: array<u32>;
@group(0) @binding(2) var<storage, read> w0: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i >= p.n) { return; }
  let v = bitcast<i32>(arena[p.idx + i]);
  var r = v;
  if (v < 0 || v >= i32(p.rows)) {
    arena[p.status] = 1u;
    arena[p.status + 1u] = p.dispatch1;
    arena[p.status + 2u] = bitcast<u32>(v);
    r = clamp(v, 0, i32(p.rows) - 1);
  }
  arena[p.out + i] = w0[p.table + u32(r)];
}
"""

# From one int64 input a: an int64 passthrough, a bool (a > 0) and a uint8 (a & 255); the
# bool and uint8 outputs are packed four to a word (the invocation of every fourth element
# writes the word).
INT_BOOL = """
struct Params { n: u32, a: u32, out_i: u32, out_b: u32, out_u: u32, pad0: u32, pad1: u32, pad2: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> arena: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i >= p.n) { return; }
  arena[p.out_i + i] = arena[p.a + i];
  if (i % 4u != 0u) { return; }
  var b = 0u;
  var u = 0u;
  for (var j = 0u; j < 4u && i + j < p.n; j++) {
    let v = bitcast<i32>(arena[p.a + i + j]);
    b |= select(0u, 1u, v > 0) << (8u * j);
    u |= (bitcast<u32>(v) & 255u) << (8u * j);
  }
  arena[p.out_b + i / 4u] = b;
  arena[p.out_u + i / 4u] = u;
}
"""

# acc[i] += x[i] in the persistent state; y[i] = acc[i].
ACCUMULATE = """
struct Params { n: u32, x: u32, acc: u32, y: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> arena: array<u32>;
@group(0) @binding(2) var<storage, read_write> state: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i >= p.n) { return; }
  let a = bitcast<f32>(state[p.acc + i]) + bitcast<f32>(arena[p.x + i]);
  state[p.acc + i] = bitcast<u32>(a);
  arena[p.y + i] = bitcast<u32>(a);
}
"""

_STORAGE = {"float32": "f32", "int32": "i32", "int64": "i32", "int16": "i16", "int8": "i8", "bool": "u8", "uint8": "u8"}
_STORAGE_DTYPE = {"f32": "<f4", "i32": "<i4", "i16": "<i2", "i8": "i1", "u8": "u1"}


def _up(n, a=ALIGN):
    return (n + a - 1) // a * a


def words(a):
    """An array as the device stores it: int64 narrowed to int32, 8- and 16-bit types packed,
    padded to whole 32-bit words."""
    a = np.asarray(a)
    b = a.astype(_STORAGE_DTYPE[_STORAGE[a.dtype.name]]).tobytes()
    return b + bytes(-len(b) % 4)


def _native(a):
    a = np.asarray(a)
    return a.astype(a.dtype.newbyteorder("<")).tobytes()


class PackageWriter:
    def __init__(self):
        self._arena = ALIGN  # the status block is the first 256 bytes
        self.inputs, self.outputs, self.kernels, self.dispatches = [], [], [], []
        self._weights, self._weight_tensors = [bytearray()], []
        self._state, self._state_tensors = bytearray(), []
        self._params = bytearray()
        self._golden = None
        self.output_structure = "single"
        self.requirements = {"features": [], "limits": {}}

    def _alloc(self, nbytes):
        off = self._arena
        self._arena += _up(max(nbytes, 4))
        return off

    def _tensor(self, name, dtype, shape):
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64))
        nbytes = -(-n * np.dtype(_STORAGE_DTYPE[_STORAGE[dtype.name]]).itemsize // 4) * 4
        off = self._alloc(nbytes)
        return {"name": name, "dtype": dtype.name, "shape": list(shape), "storage": _STORAGE[dtype.name],
                "offset": off, "bytes": nbytes}

    def input(self, name, dtype, shape):
        self.inputs.append(self._tensor(name, dtype, shape))
        return self.inputs[-1]["offset"] // 4

    def output(self, name, dtype, shape):
        self.outputs.append(self._tensor(name, dtype, shape))
        return self.outputs[-1]["offset"] // 4

    def temp(self, nbytes):
        return self._alloc(nbytes) // 4

    def weight(self, name, array, shard=0):
        array = np.asarray(array)
        while len(self._weights) <= shard:
            self._weights.append(bytearray())
        buf = self._weights[shard]
        off = len(buf)
        buf += words(array)
        self._weight_tensors.append({"name": name, "dtype": array.dtype.name, "shape": list(array.shape),
                                     "shard": shard, "offset": off, "bytes": len(buf) - off})
        return off // 4

    def state(self, name, array):
        off = len(self._state)
        self._state += words(array)
        self._state_tensors.append({"name": name, "offset": off, "bytes": len(self._state) - off,
                                    "init_bytes": words(array)})
        return off // 4

    def kernel(self, name, code, *, uniform_bytes=None, storage=(), read_only=(), workgroup_size=(64, 1, 1)):
        bindings = []
        if uniform_bytes is not None:
            bindings.append({"binding": 0, "type": "uniform", "bytes": uniform_bytes})
        bindings += [{"binding": b, "type": "storage"} for b in storage]
        bindings += [{"binding": b, "type": "read-only-storage"} for b in read_only]
        self.kernels.append({"name": name, "code": code, "entry": "main", "workgroup_size": list(workgroup_size),
                             "bindings": bindings, "features": []})
        return len(self.kernels) - 1

    def dispatch(self, kernel, grid, *, params=None, bindings, label="", node="", source=""):
        d = {"kernel": kernel, "grid": list(grid), "params": None,
             "bindings": [{"binding": b, "buffer": v} if isinstance(v, str)
                          else {"binding": b, "buffer": v[0], "shard": v[1]} for b, v in bindings.items()],
             "label": label, "node": node, "source": source}
        if params is not None:
            d["params"] = len(self._params)
            self._params += np.asarray(params, "<u4").tobytes()
            self._params += bytes(_up(len(self._params)) - len(self._params))
        self.dispatches.append(d)
        return len(self.dispatches) - 1

    def golden(self, inputs, outputs, atol=1e-5, rtol=1e-4):
        self._golden = ([np.asarray(a) for a in inputs], [np.asarray(a) for a in outputs], atol, rtol)

    def build(self, edit=None) -> bytes:
        payload = bytearray()

        def section(data):
            off = len(payload)
            payload.extend(data)
            payload.extend(bytes(_up(len(payload)) - len(payload)))
            return off

        params = {"offset": section(self._params), "bytes": len(self._params)}
        shards = [{"offset": section(s), "bytes": len(s)} for s in self._weights if s]
        state_tensors = [{"name": t["name"], "offset": t["offset"], "bytes": t["bytes"],
                          "init": section(t["init_bytes"])} for t in self._state_tensors]
        golden = None
        if self._golden:
            ins, outs, atol, rtol = self._golden

            def desc(a, spec):
                return {"name": spec["name"], "dtype": a.dtype.name, "shape": list(a.shape),
                        "offset": section(_native(a)), "bytes": a.nbytes}
            golden = {"inputs": [desc(a, s) for a, s in zip(ins, self.inputs)],
                      "outputs": [desc(a, s) for a, s in zip(outs, self.outputs)],
                      "tolerance": {"atol": atol, "rtol": rtol}}
        m = {
            "format": "chroma.webgpu", "version": 2, "compiler_version": "test-fixture",
            "content_hash": "0" * 64,  # filled in by assemble()
            "requirements": self.requirements,
            "inputs": self.inputs, "outputs": self.outputs, "output_structure": self.output_structure,
            "arena": {"bytes": self._arena, "status_offset": 0},
            "state": {"bytes": len(self._state), "tensors": state_tensors},
            "params": params,
            "weights": {"shards": shards, "tensors": self._weight_tensors},
            "kernels": self.kernels, "dispatches": self.dispatches,
            "stats": {"kernels": len(self.dispatches), "dispatches": len(self.dispatches),
                      "pipelines": len(self.kernels), "arena_bytes": self._arena,
                      "weight_bytes": sum(s["bytes"] for s in shards)},
        }
        if golden:
            m["golden"] = golden
        for d in m["dispatches"]:
            if d["params"] is None:
                del d["params"]
        if edit:
            edit(m)
        return assemble(json.dumps(m).encode(), bytes(payload))


def assemble(manifest: bytes, payload: bytes, version=2) -> bytes:
    """Header + manifest + zero padding + payload. The SHA-256 the header carries is taken with
    the manifest's content_hash value all '0' (64 of them), which is then replaced by it."""
    po = _up(96 + len(manifest))
    body = manifest + bytes(po - 96 - len(manifest)) + payload
    digest = hashlib.sha256(body).digest()
    zeros = b'"content_hash": "' + b"0" * 64 + b'"'
    if zeros in body:
        body = body.replace(zeros, b'"content_hash": "' + digest.hex().encode() + b'"', 1)
    header = struct.pack("<8sIIQQQQ32s16s", b"CHROMAWB", version, 96, 96, len(manifest), po, len(payload),
                         digest, bytes(16))
    return header + body


def affine_package(x, w, *, golden_y=None, edit=None):
    """y = (x * w + 1) * w + 1: one kernel dispatched twice (different uniform values), an
    input, a temporary and an output in the arena, the weight in shard 0."""
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)
    pw = PackageWriter()
    n = x.size
    xo = pw.input("x", np.float32, x.shape)
    t = pw.temp(4 * n)
    yo = pw.output("y", np.float32, x.shape)
    wo = pw.weight("w", w.reshape(-1))
    k = pw.kernel("affine", AFFINE, uniform_bytes=16, storage=[1], read_only=[2])
    grid = ((n + 63) // 64, 1, 1)
    pw.dispatch(k, grid, params=[n, xo, wo, t], bindings={1: "arena", 2: ("weights", 0)},
                label="Assign <- mul, add", node="add", source="model.py:3")
    pw.dispatch(k, grid, params=[n, t, wo, yo], bindings={1: "arena", 2: ("weights", 0)},
                label="Assign <- mul_1, add_1", node="add_1", source="model.py:4")
    w2 = w.reshape(x.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        y = (x * w2 + np.float32(1)) * w2 + np.float32(1)
    pw.golden([x], [y if golden_y is None else golden_y])
    return pw.build(edit)


def ints_package(idx, a, table, *, edit=None):
    """Two int64 inputs: idx gathers rows of a float32 table (with the status-block check,
    in dispatch 1); a is passed through (int64), tested a > 0 (bool) and masked a & 255
    (uint8) by dispatch 0. The golden data are these for the given idx and a."""
    idx, a, table = np.asarray(idx, np.int64), np.asarray(a, np.int64), np.asarray(table, np.float32)
    pw = PackageWriter()
    io = pw.input("idx", np.int64, idx.shape)
    ao = pw.input("a", np.int64, a.shape)
    go = pw.output("gathered", np.float32, idx.shape)
    oi = pw.output("same", np.int64, a.shape)
    ob = pw.output("positive", np.bool_, a.shape)
    ou = pw.output("low_byte", np.uint8, a.shape)
    pw.output_structure = "tuple"
    to = pw.weight("table", table)
    kg = pw.kernel("gather", GATHER, uniform_bytes=32, storage=[1], read_only=[2])
    ki = pw.kernel("int_bool", INT_BOOL, uniform_bytes=32, storage=[1])
    pw.dispatch(ki, ((a.size + 63) // 64, 1, 1), params=[a.size, ao, oi, ob, ou, 0, 0, 0], bindings={1: "arena"},
                label="Assign <- gt, bitwise_and", node="gt", source="model.py:7")
    pw.dispatch(kg, ((idx.size + 63) // 64, 1, 1), params=[idx.size, io, to, go, table.size, 2, 0, 0],
                bindings={1: "arena", 2: ("weights", 0)},
                label="Gather <- embedding", node="embedding", source="model.py:9")
    pw.golden([idx, a], [table[idx], a, a > 0, (a & 255).astype(np.uint8)])
    return pw.build(edit)


def state_package(init, x_golden, *, edit=None):
    """acc += x; y = acc, with acc a state tensor (persistent between calls)."""
    init = np.asarray(init, np.float32)
    pw = PackageWriter()
    n = init.size
    xo = pw.input("x", np.float32, init.shape)
    yo = pw.output("y", np.float32, init.shape)
    ao = pw.state("acc", init)
    k = pw.kernel("accumulate", ACCUMULATE, uniform_bytes=16, storage=[1, 2])
    pw.dispatch(k, ((n + 63) // 64, 1, 1), params=[n, xo, ao, yo], bindings={1: "arena", 2: "state"},
                label="Accumulate", node="add_", source="model.py:5")
    pw.golden([x_golden], [init + x_golden])
    return pw.build(edit)
