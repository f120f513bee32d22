// TEST-ONLY writer of .chroma-web packages (format version 2, docs/webgpu_package.md), from a
// small description with handwritten WGSL. The real writer is the compiler; this one exists so
// that the runtime can be tested before (and independently of) it.
//
// buildPackage(desc) -> Uint8Array, where desc is:
//   inputs, outputs: [{ name, dtype, shape }]           arena offsets are assigned here
//   temps:           [{ name, words }]                  extra arena tensors (temporaries)
//   shards:          [[{ name, dtype, shape, data }]]   weights, one list per shard
//   state:           [{ name, data: Int32Array|Float32Array|Uint32Array }]  (init values)
//   kernels:         [{ name, code, entry, workgroup_size, bindings, features }]
//   dispatches:      [{ kernel, grid, params: (L) => number[] (u32 words), bindings, label, node, source }]
//                    where L = { arena: {name: word offset}, weights: {name: word offset in its
//                    shard}, state: {name: word offset}, status: word offset, dispatch: index }
//   golden:          { inputs: {name: typed array}, outputs: {name: typed array}, tolerance }
//   requirements:    { features, limits }
//   edit(manifest):  optional; changes the manifest before it is written (and hashed)
// The result has a valid digest, whatever `edit` did.

import { createHash } from 'node:crypto';

const HEADER = 96;
const A = 256;
const align = (n, a = A) => Math.ceil(n / a) * a;
const numel = (shape) => shape.reduce((x, d) => x * d, 1);
const STORAGE = { float32: 'f32', int32: 'i32', int64: 'i32', int16: 'i16', int8: 'i8', bool: 'u8', uint8: 'u8' };
const STORAGE_BYTES = { f32: 4, i32: 4, i16: 2, i8: 1, u8: 1 };

/** Bytes of a typed array as the golden data stores them (its own dtype). */
function rawBytes(a) {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

export function buildPackage(desc) {
  const L = { arena: {}, weights: {}, state: {}, status: 0 };

  // Arena: the status block, then inputs, outputs and temporaries at 256-byte offsets.
  let arenaBytes = 256;
  const io = (t) => {
    const bytes = Math.ceil(numel(t.shape) * STORAGE_BYTES[STORAGE[t.dtype]] / 4) * 4;  // packed, whole words
    const entry = { name: t.name, dtype: t.dtype, shape: t.shape, storage: STORAGE[t.dtype], offset: arenaBytes, bytes };
    L.arena[t.name] = arenaBytes / 4;
    arenaBytes += align(Math.max(bytes, 4));
    return entry;
  };
  const inputs = desc.inputs.map(io);
  const outputs = desc.outputs.map(io);
  for (const t of desc.temps ?? []) {
    L.arena[t.name] = arenaBytes / 4;
    arenaBytes += align(t.words * 4);
  }

  // Payload sections, each at a multiple of 256 from the payload's start.
  const chunks = [];
  let payloadBytes = 0;
  const put = (bytes) => {
    const offset = payloadBytes;
    chunks.push({ offset, bytes });
    payloadBytes = align(offset + Math.max(bytes.byteLength, 1));
    return offset;
  };

  const shards = [];
  const weightTensors = [];
  (desc.shards ?? []).forEach((tensors, s) => {
    let size = 0;
    const parts = [];
    for (const t of tensors) {
      L.weights[t.name] = size / 4;
      weightTensors.push({ name: t.name, dtype: t.dtype, shape: t.shape, shard: s, offset: size, bytes: t.data.byteLength });
      parts.push([size, rawBytes(t.data)]);
      size = align(size + t.data.byteLength);
    }
    const shard = new Uint8Array(size);
    for (const [at, b] of parts) shard.set(b, at);
    shards.push({ offset: put(shard), bytes: size });
  });

  let stateBytes = 0;
  const stateTensors = (desc.state ?? []).map((t) => {
    const offset = stateBytes;
    L.state[t.name] = offset / 4;
    stateBytes += align(t.data.byteLength);
    return { name: t.name, offset, bytes: t.data.byteLength, init: put(rawBytes(t.data)) };
  });

  // Params: each dispatch's uniform words at its own 256-byte slot.
  const dispatchParams = desc.dispatches.map((d, i) => (d.params ? d.params({ ...L, dispatch: i }) : null));
  const paramsBytes = dispatchParams.filter(Boolean).length * A;
  const paramsData = new Uint32Array(paramsBytes / 4);
  let slot = 0;
  const dispatches = desc.dispatches.map((d, i) => {
    let params = 0;
    if (dispatchParams[i]) {
      params = slot * A;
      paramsData.set(dispatchParams[i], params / 4);
      slot++;
    }
    return { kernel: d.kernel, grid: d.grid, params, bindings: d.bindings, label: d.label ?? `d${i}`, node: d.node ?? `n${i}`, source: d.source ?? `model.py:${10 + i}` };
  });
  const paramsOffset = put(rawBytes(paramsData));

  const golden = (list, values) => list.map((t) => {
    const data = values[t.name];
    return { name: t.name, dtype: t.dtype, shape: t.shape, offset: put(rawBytes(data)), bytes: data.byteLength };
  });
  const g = desc.golden;

  const manifest = {
    format: 'chroma.webgpu', version: 2, compiler_version: 'test-fixture',
    content_hash: '0'.repeat(64),
    requirements: { features: desc.requirements?.features ?? [], limits: desc.requirements?.limits ?? {} },
    inputs, outputs, output_structure: 'tuple',
    arena: { bytes: arenaBytes, status_offset: 0 },
    state: { bytes: stateBytes, tensors: stateTensors },
    params: { offset: paramsOffset, bytes: paramsBytes },
    weights: { shards, tensors: weightTensors },
    kernels: desc.kernels.map((k) => ({ entry: 'main', workgroup_size: [64, 1, 1], features: [], ...k })),
    dispatches,
    golden: { inputs: golden(inputs, g.inputs), outputs: golden(outputs, g.outputs), tolerance: g.tolerance ?? { atol: 1e-5, rtol: 1e-4 } },
    stats: { kernels: desc.kernels.length, dispatches: dispatches.length, pipelines: desc.kernels.length, arena_bytes: arenaBytes },
  };
  desc.edit?.(manifest);
  const payload = new Uint8Array(payloadBytes);
  for (const c of chunks) payload.set(c.bytes, c.offset);
  return writeFile(manifest, payload);
}

/** Header + manifest + payload, hashed with the content_hash placeholder, then filled in. */
export function writeFile(manifest, payload) {
  const json = new TextEncoder().encode(JSON.stringify(manifest));
  const payloadOffset = align(HEADER + json.length);
  const file = new Uint8Array(payloadOffset + payload.length);
  file.set(new TextEncoder().encode('CHROMAWB'), 0);
  const v = new DataView(file.buffer);
  v.setUint32(8, 2, true);
  v.setUint32(12, HEADER, true);
  v.setBigUint64(16, BigInt(HEADER), true);
  v.setBigUint64(24, BigInt(json.length), true);
  v.setBigUint64(32, BigInt(payloadOffset), true);
  v.setBigUint64(40, BigInt(payload.length), true);
  file.set(json, HEADER);
  file.set(payload, payloadOffset);
  rehash(file);
  return file;
}

/**
 * Recomputes the digest of a file in place: hashes with the manifest's content_hash value set to
 * 64 '0's, then writes the digest into the header and into content_hash.
 */
export function rehash(file) {
  const v = new DataView(file.buffer, file.byteOffset);
  const mOff = Number(v.getBigUint64(16, true));
  const mSize = Number(v.getBigUint64(24, true));
  const text = new TextDecoder().decode(file.subarray(mOff, mOff + mSize));
  const key = '"content_hash":"';
  const at = text.indexOf(key);
  if (at < 0) throw new Error('fixture: no content_hash in the manifest');
  const start = mOff + new TextEncoder().encode(text.slice(0, at + key.length)).length;
  file.fill(0x30, start, start + 64);
  const digest = createHash('sha256').update(file.subarray(mOff)).digest();
  file.set(digest, 48);
  file.set(new TextEncoder().encode(digest.toString('hex')), start);
  return file;
}

/** The manifest of a file, as JSON (no checks). */
export function readManifest(file) {
  const v = new DataView(file.buffer, file.byteOffset);
  const mOff = Number(v.getBigUint64(16, true));
  const mSize = Number(v.getBigUint64(24, true));
  return JSON.parse(new TextDecoder().decode(file.subarray(mOff, mOff + mSize)));
}
