// Checks 1-3 of "Checks a runtime makes at load": header, digest, manifest. No GPU needed.

import { test } from 'node:test';
import assert from 'node:assert/strict';

import { PackageError, describePackage, goldenOutputs, goldenUniform, parsePackage, sampleOutput } from '../dist/index.js';
import { readManifest, rehash } from './fixture.mjs';
import { AFFINE_X, affinePackage, affineRef, gatherPackage } from './models.mjs';

/** Asserts that parsing rejects with a PackageError whose message matches `pattern`. */
async function rejects(bytes, pattern) {
  await assert.rejects(parsePackage(bytes), (e) => {
    assert.ok(e instanceof PackageError, `expected a PackageError, got ${e}`);
    assert.match(e.message, pattern);
    return true;
  });
}

/** Byte offset of an ASCII string in a file. */
const byteIndex = (bytes, s) => new TextDecoder('latin1').decode(bytes).indexOf(s);

const exact = (s) => new RegExp(`^${s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}$`);

test('a valid package parses, and the bytes are left as they were', async () => {
  const bytes = affinePackage();
  const before = bytes.slice();
  const pkg = await parsePackage(bytes);
  assert.deepEqual(bytes, before);
  const m = pkg.manifest;
  assert.equal(pkg.version, 2);
  assert.equal(m.content_hash, pkg.contentHash);
  assert.equal(pkg.contentHash, readManifest(bytes).content_hash);
  assert.match(pkg.contentHash, /^[0-9a-f]{64}$/);
  assert.deepEqual(m.inputs.map((t) => [t.name, t.dtype, t.shape, t.storage]), [['x', 'float32', [2, 3], 'f32']]);
  assert.deepEqual(m.outputs.map((t) => [t.name, t.dtype, t.storage]), [['y', 'float32', 'f32'], ['pos', 'bool', 'u8']]);
  assert.equal(m.kernels.length, 2);
  assert.equal(m.dispatches.length, 3);
  assert.equal(m.dispatches[1].label, 'Affine <- mul_1, add_1');
  assert.match(describePackage(pkg), /kernels: 2 .*dispatches: 3/);
});

test('an ArrayBuffer and a view at an offset in a larger buffer parse too', async () => {
  const bytes = gatherPackage();
  const pkg = await parsePackage(bytes.slice().buffer);
  assert.equal(pkg.manifest.inputs[0].dtype, 'int64');
  const big = new Uint8Array(bytes.length + 512);
  big.set(bytes, 256);
  const view = big.subarray(256, 256 + bytes.length);
  assert.equal((await parsePackage(view)).contentHash, pkg.contentHash);
});

test('a Node Buffer (as fs.readFile gives) parses, and is left as it was', async () => {
  const bytes = affinePackage();
  for (const buf of [Buffer.from(bytes), Buffer.concat([Buffer.alloc(8), Buffer.from(bytes)]).subarray(8)]) {
    const before = Buffer.from(buf);
    const pkg = await parsePackage(buf);
    assert.ok(buf.equals(before));
    assert.equal(pkg.contentHash, readManifest(bytes).content_hash);
    assert.deepEqual(goldenOutputs(pkg).y, affineRef(AFFINE_X).y);
  }
});

test('a changed byte in the payload or the manifest is a digest mismatch', async () => {
  const bytes = affinePackage();
  const last = bytes.slice();
  last[last.length - 1] ^= 1;
  await rejects(last, exact('content digest mismatch: the package is corrupt'));
  const inManifest = bytes.slice();
  const at = byteIndex(bytes, 'k0_affine');
  inManifest[at] = 'K'.charCodeAt(0);
  await rejects(inManifest, exact('content digest mismatch: the package is corrupt'));
  const header = bytes.slice();
  header[60] ^= 0xff; // the digest itself
  await rejects(header, /^content digest mismatch: the package is corrupt/);
});

test('a truncated file is named as such', async () => {
  const bytes = affinePackage();
  await rejects(bytes.subarray(0, 1000), exact(`truncated package: the header says ${bytes.length} bytes, the file has 1000`));
  await rejects(bytes.subarray(0, 50), exact('truncated package: the file has 50 bytes, less than the 96-byte header'));
  await rejects(new Uint8Array(0), /^truncated package: the file has 0 bytes/);
  const longer = new Uint8Array(bytes.length + 4);
  longer.set(bytes);
  await rejects(longer, /unexpected bytes after the payload/);
});

test('the magic, the format version and the header size are checked', async () => {
  const bytes = affinePackage();
  const magic = bytes.slice();
  magic.set(new TextEncoder().encode('PK\x03\x04'), 0);
  await rejects(magic, /^not a Chroma WebGPU package: the file starts with "PK\\x03\\x04MAWB", expected "CHROMAWB"$/);
  const version = bytes.slice();
  new DataView(version.buffer).setUint32(8, 1, true);
  await rejects(version, exact('format version 1 is not supported (this runtime reads version 2)'));
  const header = bytes.slice();
  new DataView(header.buffer).setUint32(12, 128, true);
  await rejects(header, /^header size is 128, expected 96/);
  const reserved = bytes.slice();
  reserved[90] = 7;
  await rejects(reserved, /^header byte 90 is 7: bytes 80-95 must be zero$/);
});

test('dispatch kernel and shard indices are checked', async () => {
  await rejects(affinePackage({ edit: (m) => { m.dispatches[2].kernel = 9; } }),
    exact('dispatch 2: kernel 9 does not exist (2 kernels)'));
  await rejects(affinePackage({ edit: (m) => { m.dispatches[0].bindings[1].shard = 3; } }),
    exact('dispatch 0: binding 2: weights shard 3 does not exist (1 shards)'));
  await rejects(affinePackage({ edit: (m) => { m.weights.tensors[0].shard = 1; } }),
    /^weights\.tensors\[0\]: shard 1 does not exist \(1 shards\)$/);
});

test('every binding must be declared by its kernel, and bound', async () => {
  await rejects(affinePackage({ edit: (m) => { m.dispatches[2].bindings.push({ binding: 2, buffer: 'arena' }); } }),
    exact('dispatch 2: binding 2 is not a storage binding of kernel 1 (k1_greater)'));
  await rejects(affinePackage({ edit: (m) => { m.dispatches[0].bindings.pop(); } }),
    exact('dispatch 0: binding 2 of kernel 0 (k0_affine) is not bound'));
  await rejects(affinePackage({ edit: (m) => { m.dispatches[0].bindings[0] = { binding: 1, buffer: 'weights', shard: 0 }; } }),
    exact('dispatch 0: binding 1 binds weights shard 0 to a read-write binding (weights are read-only)'));
  await rejects(affinePackage({ edit: (m) => { m.dispatches[0].bindings[0].buffer = 'state'; } }),
    exact('dispatch 0: binding 1 binds the state buffer, but state.bytes is 0'));
});

test('params offsets must be aligned and inside the params section', async () => {
  await rejects(affinePackage({ edit: (m) => { m.dispatches[1].params = 100; } }),
    exact('dispatch 1: params offset 100 is not a multiple of 256'));
  await rejects(affinePackage({ edit: (m) => { m.dispatches[1].params = 768; } }),
    exact('dispatch 1: params offset 768 + 16 bytes lies outside the params section (768 bytes)'));
});

test('sections must lie inside the payload, tensors inside the arena', async () => {
  await rejects(affinePackage({ edit: (m) => { m.golden.outputs[0].offset = 1 << 20; } }),
    /^golden\.outputs\[0\]: payload offset 1048576 \+ 24 bytes lies outside the payload \(\d+ bytes\)$/);
  await rejects(affinePackage({ edit: (m) => { m.weights.shards[0].offset += 4; } }),
    /^weights\.shards\[0\]: payload offset \d+ is not a multiple of 256$/);
  await rejects(affinePackage({ edit: (m) => { m.outputs[0].offset = m.arena.bytes; } }),
    /^outputs\[0\] \(y\): arena offset 1280 \+ 24 bytes lies outside the arena \(1280 bytes\)$/);
  await rejects(affinePackage({ edit: (m) => { m.inputs[0].offset = 0; } }),
    /^inputs\[0\] \(x\): arena offset 0 overlaps the status block at 0$/);
});

test('tensor fields are checked against their dtype', async () => {
  await rejects(affinePackage({ edit: (m) => { m.inputs[0].storage = 'i32'; } }),
    exact('manifest field inputs[0].storage: expected "f32" for float32, got "i32"'));
  await rejects(affinePackage({ edit: (m) => { m.inputs[0].bytes = 20; } }),
    exact('manifest field inputs[0].bytes: expected 24 (float32[2,3] stored as f32, whole words), got 20'));
  await rejects(affinePackage({ edit: (m) => { m.outputs[1].bytes = 24; } }),
    exact('manifest field outputs[1].bytes: expected 8 (bool[2,3] stored as u8, whole words), got 24'));
  await rejects(affinePackage({ edit: (m) => { m.outputs[1].storage = 'u32'; } }),
    exact('manifest field outputs[1].storage: expected "u8" for bool, got "u32"'));
  await rejects(affinePackage({ edit: (m) => { m.outputs[1].dtype = 'float64'; } }),
    /^manifest field outputs\[1\]\.dtype: expected one of float32, int32, int64, int16, int8, bool, uint8, float16, bfloat16, got "float64"$/);
  await rejects(gatherPackage({ edit: (m) => { m.golden.inputs[0].bytes = 16; } }),
    exact('manifest field golden.inputs[0].bytes: expected 32 for int64 [4], got 16'));
});

test('generated golden inputs and sampled golden outputs', async () => {
  // the same bits as chroma.golden.golden_uniform (tests/python/test_webgpu_runtime.py)
  const v = goldenUniform(5, 7, -1.5, 2.25);
  assert.deepEqual([...new Uint32Array(v.buffer)], [0x3f2d0b9c, 0xbf108fbf, 0xbedf6c6c, 0xbfa2f033, 0x3f48ef00]);
  assert.deepEqual([...sampleOutput(new Int32Array([0, 1, 2, 3, 4, 5, 6]), 3)], [0, 3, 6]);
  const spec = { kind: 'uniform', seed: 7, low: -1.5, high: 2.25 };
  const gen = (edit) => affinePackage({ edit: (m) => { m.golden.inputs[0] = { name: 'x', dtype: 'float32', shape: [2, 3], generate: { ...spec, ...edit } }; } });
  const pkg = await parsePackage(gen({}));
  assert.deepEqual(pkg.manifest.golden.inputs[0].generate, spec);
  await rejects(gen({ kind: 'normal' }), exact('manifest field golden.inputs[0].generate.kind: expected "uniform", got "normal"'));
  await rejects(gen({ low: 'x' }), exact('manifest field golden.inputs[0].generate.low: expected a finite number, got "x"'));
  await rejects(gen({ seed: 2 ** 33 }), /golden\.inputs\[0\]\.generate\.seed: expected a 32-bit unsigned integer/);
  await rejects(gatherPackage({ edit: (m) => { m.golden.inputs[0] = { ...m.golden.inputs[0], generate: spec }; } }),
    exact('golden.inputs[0].generate: only a float32 input is generated (this one is int64)'));
  await rejects(affinePackage({ edit: (m) => { m.golden.outputs[0].stride = 2; } }),
    exact('manifest field golden.outputs[0].bytes: expected 12 for float32 [2,3] every 2th element, got 24'));
  await rejects(affinePackage({ edit: (m) => { m.golden.inputs[0].stride = 2; m.golden.inputs[0].bytes = 12; } }),
    exact('golden.inputs[0].stride: only a golden output is sampled'));
});

test('buffers larger than the default binding limit need a raised limit', async () => {
  await rejects(affinePackage({ edit: (m) => { m.arena.bytes = 2 ** 28; } }),
    exact("arena.bytes is 268435456, more than maxStorageBufferBindingSize 134217728 (the package's requirements.limits do not raise it)"));
  const pkg = await parsePackage(affinePackage({
    edit: (m) => { m.arena.bytes = 2 ** 28; m.requirements.limits = { maxStorageBufferBindingSize: 2 ** 28, maxBufferSize: 2 ** 28 }; },
  }));
  assert.equal(pkg.manifest.arena.bytes, 2 ** 28);
});

test('the manifest format and version are checked', async () => {
  await rejects(affinePackage({ edit: (m) => { m.format = 'other'; } }),
    exact('manifest field format is "other", expected "chroma.webgpu"'));
  await rejects(affinePackage({ edit: (m) => { m.version = 3; } }),
    exact('manifest version 3 is not supported (this runtime reads version 2)'));
  await rejects(affinePackage({ edit: (m) => { delete m.golden; } }),
    exact('manifest field golden: expected an object, got nothing'));
});

test('a manifest that is not JSON is named, after the digest is checked', async () => {
  const bytes = affinePackage();
  const at = byteIndex(bytes, '"format"');
  bytes[at] = '{'.charCodeAt(0);
  await rejects(bytes, exact('content digest mismatch: the package is corrupt'));
  await rejects(rehash(bytes), /^the manifest is not valid UTF-8 JSON: /);
});
