// Loading on Dawn: requirements against the adapter (before the device exists), pipelines,
// URLs, a lost or destroyed device, uncaptured errors.

import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';

import { PackageError, RunError, kernelCode, loadPackage, parsePackage } from '../dist/index.js';
import { gpu, nullGpu } from './gpu.mjs';
import { AFFINE_X, affinePackage, affineRef } from './models.mjs';

const loaded = [];
after(() => { for (const m of loaded) m.destroy(); });

async function load(source, options = {}) {
  const m = await loadPackage(source, { gpu, ...options });
  loaded.push(m);
  return m;
}

/** A real adapter that records whether (and how) a device was requested from it. */
async function spyAdapter() {
  const real = await gpu.requestAdapter();
  const spy = {
    real,
    requested: null,
    features: real.features,
    limits: real.limits,
    info: real.info,
    requestDevice(desc) {
      spy.requested = desc;
      return real.requestDevice(desc);
    },
  };
  return spy;
}

async function rejectsLoad(promise, pattern) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof PackageError, `expected a PackageError, got ${e}`);
    assert.match(e.message, pattern);
    return true;
  });
}

test('a limit larger than the adapter offers is rejected before the device is created', async () => {
  const adapter = await spyAdapter();
  const bytes = affinePackage({ requirements: { limits: { maxStorageBufferBindingSize: 2 ** 40 } } });
  const offered = adapter.limits.maxStorageBufferBindingSize;
  await rejectsLoad(loadPackage(bytes, { gpu, adapter }),
    new RegExp(`^the package needs maxStorageBufferBindingSize >= ${2 ** 40}; this adapter offers ${offered}$`));
  assert.equal(adapter.requested, null);
});

test('alignment limits, unknown limits and missing features are named', async () => {
  const adapter = await spyAdapter();
  const align = adapter.limits.minStorageBufferOffsetAlignment;
  await rejectsLoad(loadPackage(affinePackage({ requirements: { limits: { minStorageBufferOffsetAlignment: align / 2 } } }), { gpu, adapter }),
    new RegExp(`^the package needs minStorageBufferOffsetAlignment <= ${align / 2}; this adapter requires ${align}$`));
  await rejectsLoad(loadPackage(affinePackage({ requirements: { limits: { maxWarpDrive: 1 } } }), { gpu, adapter }),
    /^the package needs the limit maxWarpDrive, which this adapter does not know$/);
  const missing = ['shader-f16', 'float16-imaginary'].find((f) => !adapter.features.has(f));
  await rejectsLoad(loadPackage(affinePackage({ requirements: { features: [missing] } }), { gpu, adapter }),
    new RegExp(`^the package needs the feature "${missing}"; this adapter does not offer it$`));
  assert.equal(adapter.requested, null);
});

test('the device is requested with exactly the required features and limits', async () => {
  const adapter = await spyAdapter();
  const limits = { maxStorageBufferBindingSize: 2 ** 28, maxBufferSize: 2 ** 28 };
  const m = await load(affinePackage({ requirements: { limits } }), { adapter });
  assert.deepEqual(adapter.requested.requiredLimits, limits);
  assert.deepEqual(adapter.requested.requiredFeatures, []);
  assert.equal(m.device.limits.maxStorageBufferBindingSize, 2 ** 28);
  assert.deepEqual(m.info.limits, limits);
  assert.equal((await m.selfCheck()).ok, true);
});

test('a kernel variant is used where the adapter has its features, the portable code otherwise', async () => {
  const good = (await parsePackage(affinePackage())).manifest.kernels;
  const kernels = good.map((k) => ({ name: k.name, code: k.code, bindings: k.bindings }));
  // a variant needing a feature no adapter has: never chosen (its text would not even compile)
  kernels[1] = { ...kernels[1], variants: [{ features: ['float16-imaginary'], code: 'not WGSL' }] };
  const probe = await gpu.requestAdapter();
  const hasSubgroups = probe.features.has('subgroups');
  if (hasSubgroups) kernels[0] = { ...kernels[0], variants: [{ features: ['subgroups'], code: `enable subgroups;\n${kernels[0].code}` }] };
  const bytes = affinePackage({ kernels });

  const adapter = await spyAdapter();
  const m = await load(bytes, { adapter });
  assert.deepEqual(adapter.requested.requiredFeatures, hasSubgroups ? ['subgroups'] : []);
  const parsed = m.package.manifest.kernels;
  assert.equal(kernelCode(m.device, parsed[1]), parsed[1].code);
  if (hasSubgroups) assert.match(kernelCode(m.device, parsed[0]), /^enable subgroups;/);
  assert.equal((await m.selfCheck()).ok, true);

  const plain = await spyAdapter();
  const p = await load(bytes, { adapter: plain, variants: false });
  assert.deepEqual(plain.requested.requiredFeatures, []);
  assert.equal(kernelCode(p.device, parsed[0]), parsed[0].code);
  assert.equal((await p.selfCheck()).ok, true);

  const bad = good.map((k) => ({ name: k.name, code: k.code, bindings: k.bindings }));
  bad[0] = { ...bad[0], variants: [{ features: [], code: bad[0].code }] };
  await assert.rejects(parsePackage(affinePackage({ kernels: bad })), /kernels\[0\]\.variants\[0\] \(k0_affine\) lists no features/);
});

test('a kernel that does not compile is named, with the compiler message', async () => {
  const good = (await parsePackage(affinePackage())).manifest.kernels;
  const kernels = good.map((k) => ({ name: k.name, code: k.code, bindings: k.bindings }));
  kernels[1] = { ...kernels[1], code: kernels[1].code.replace('word |= 1u <<', 'word |= 1u <') };
  await rejectsLoad(load(affinePackage({ kernels })), /^kernel 1 \(k1_greater\) does not compile: \d+:\d+: /);

  const entry = good.map((k) => ({ name: k.name, code: k.code, bindings: k.bindings }));
  entry[0] = { ...entry[0], entry: 'nope' };
  await rejectsLoad(load(affinePackage({ kernels: entry })), /^kernel 0 \(k0_affine\) does not compile: .*nope/s);
});

test('a binding list that does not match the WGSL fails the pipeline, naming the kernel', async () => {
  const good = (await parsePackage(affinePackage())).manifest.kernels;
  const kernels = good.map((k) => ({ name: k.name, code: k.code, bindings: k.bindings }));
  // The WGSL declares binding 2 read-only; the manifest says read-write.
  kernels[0] = { ...kernels[0], code: kernels[0].code.replace('var<storage, read> shard', 'var<storage, read_write> shard') };
  await rejectsLoad(load(affinePackage({ kernels })), /^kernel 0 \(k0_affine\) does not compile: /);
});

test('a package loads from a URL, and from a parsed package', async () => {
  const bytes = affinePackage();
  const server = createServer((req, res) => {
    if (req.url === '/affine.chroma-web') {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      res.end(Buffer.from(bytes));
    } else {
      res.writeHead(404);
      res.end();
    }
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const base = `http://127.0.0.1:${server.address().port}`;
    const m = await load(`${base}/affine.chroma-web`);
    assert.equal((await m.selfCheck()).ok, true);
    const m2 = await load(new URL('/affine.chroma-web', base));
    assert.equal(m2.info.contentHash, m.info.contentHash);
    await assert.rejects(load(`${base}/missing.chroma-web`), /HTTP 404/);
  } finally {
    server.close();
  }
  const parsed = await parsePackage(bytes);
  const m3 = await load(parsed);
  assert.equal(m3.package, parsed);
  assertClose((await m3.run({ x: AFFINE_X })).outputs.y, affineRef(AFFINE_X).y);
});

function assertClose(got, want) {
  for (let i = 0; i < want.length; i++) assert.ok(Math.abs(got[i] - want[i]) <= 1e-6 * Math.max(1, Math.abs(want[i])));
}

test('after the device is lost, every call fails with the reason', async () => {
  const m = await load(affinePackage());
  await m.run({ x: AFFINE_X });
  m.device.destroy();
  await m.device.lost;
  for (let i = 0; i < 2; i++) {
    await assert.rejects(m.run({ x: AFFINE_X }), (e) => e instanceof RunError && /^the GPU device was lost \(reason: destroyed\)/.test(e.message));
  }
  await assert.rejects(m.selfCheck(), /device was lost/);
});

test('a destroyed model refuses to run', async () => {
  const m = await load(affinePackage());
  m.destroy();
  await assert.rejects(m.run({ x: AFFINE_X }), (e) => e instanceof RunError && e.message === 'the model was destroyed');
});

test('an uncaptured GPU error is reported by the next call', async () => {
  const m = await load(affinePackage());
  m.device.createBuffer({ size: 4, usage: 0x1 | 0x80 }); // MAP_READ | STORAGE: invalid
  await m.device.queue.onSubmittedWorkDone();
  await new Promise((resolve) => setTimeout(resolve, 20));
  await assert.rejects(m.run({ x: AFFINE_X }), (e) => e instanceof RunError && /^a GPU error occurred since the last call: .*MapRead/s.test(e.message));
  assertClose((await m.run({ x: AFFINE_X })).outputs.y, affineRef(AFFINE_X).y);
});

test("Dawn's null backend validates a package without running it", async () => {
  const m = await loadPackage(affinePackage(), { gpu: nullGpu() });
  assert.equal(m.info.pipelines, 2);
  assert.equal(m.info.adapter.device, 'null-backend');
  m.destroy();
});
