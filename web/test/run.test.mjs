// Running packages on Dawn (SwiftShader): outputs, self-checks, input checks, the status block,
// state. Run with VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { RunError, compareOutput, loadPackage } from '../dist/index.js';
import { gpu } from './gpu.mjs';
import {
  AFFINE_X, COUNTER_INIT, GATHER_IDX, affinePackage, affineRef, counterPackage, gatherPackage, gatherRef,
} from './models.mjs';

let affine;
let gather;
const loaded = [];

async function load(bytes) {
  const m = await loadPackage(bytes, { gpu });
  loaded.push(m);
  return m;
}

before(async () => {
  affine = await load(affinePackage());
  gather = await load(gatherPackage());
});
after(() => { for (const m of loaded) m.destroy(); });

/** Float32 outputs equal to a JS reference within a few ulps (the GPU may fuse a * b + c). */
function assertClose(got, want) {
  assert.equal(got.length, want.length);
  for (let i = 0; i < want.length; i++) {
    assert.ok(Math.abs(got[i] - want[i]) <= 1e-6 * Math.max(1, Math.abs(want[i])), `element ${i}: ${got[i]} vs ${want[i]}`);
  }
}

async function rejectsRun(promise, pattern) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof RunError, `expected a RunError, got ${e}`);
    assert.match(e.message, pattern);
    return true;
  });
}

test('a run gives the outputs computed in JS, in their typed arrays', async () => {
  const x = new Float32Array([0.5, -2, 7, 1.25, -3, 100]);
  const { outputs, ms } = await affine.run({ x });
  const ref = affineRef(x);
  assert.ok(outputs.y instanceof Float32Array);
  assert.ok(outputs.pos instanceof Uint8Array);
  assertClose(outputs.y, ref.y);
  assert.deepEqual(outputs.pos, ref.pos);
  assert.ok(ms >= 0);
  const byOrder = await affine.run([x]);
  assert.deepEqual(byOrder.outputs.y, outputs.y);
});

test('two consecutive runs give identical results', async () => {
  const a = await affine.run({ x: AFFINE_X });
  const b = await affine.run({ x: AFFINE_X });
  assert.deepEqual(new Uint8Array(a.outputs.y.buffer), new Uint8Array(b.outputs.y.buffer));
  assert.deepEqual(a.outputs.pos, b.outputs.pos);
  const c = await gather.run({ idx: GATHER_IDX });
  const d = await gather.run({ idx: GATHER_IDX });
  assert.deepEqual(c.outputs, d.outputs);
});

test('concurrent calls are serialized and each gets its own outputs', async () => {
  const xs = [1, 2, 3].map((k) => AFFINE_X.map((v) => v * k));
  const results = await Promise.all(xs.map((x) => affine.run({ x })));
  results.forEach((r, k) => assertClose(r.outputs.y, affineRef(xs[k]).y));
});

test('the self-check passes on the golden data', async () => {
  const check = await affine.selfCheck();
  assert.equal(check.ok, true);
  assert.ok(check.maxError <= 1e-6);
  assert.deepEqual(check.tolerance, { atol: 1e-5, rtol: 1e-4 });
  assert.deepEqual(check.outputs.map((o) => [o.name, o.ok, o.mismatches]), [['y', true, 0], ['pos', true, 0]]);
  const g = await gather.selfCheck();
  assert.equal(g.ok, true);
  assert.equal(g.maxError, 0);
});

test('the self-check fails when a golden output is altered', async () => {
  const ref = affineRef(AFFINE_X);
  const y = ref.y.slice();
  y[4] += 0.01; // beyond atol + rtol * |y|
  const m = await load(affinePackage({ golden: { y, pos: ref.pos } }));
  const check = await m.selfCheck();
  assert.equal(check.ok, false);
  assert.ok(Math.abs(check.maxError - 0.01) < 1e-4, `maxError ${check.maxError}`);
  const [yCheck, posCheck] = check.outputs;
  assert.equal(yCheck.ok, false);
  assert.equal(yCheck.mismatches, 1);
  assert.equal(yCheck.first.index, 4);
  assert.equal(posCheck.ok, true);

  const pos = ref.pos.slice();
  pos[0] ^= 1;
  const m2 = await load(affinePackage({ golden: { y: ref.y, pos } }));
  const check2 = await m2.selfCheck();
  assert.equal(check2.ok, false);
  assert.deepEqual(check2.outputs.map((o) => o.ok), [true, false]);
});

test('NaN matches NaN, infinities match by sign, integers must be equal', () => {
  const tol = { atol: 1e-5, rtol: 1e-4 };
  const golden = new Float32Array([NaN, Infinity, -Infinity, 1, 100]);
  const got = new Float32Array([NaN, Infinity, -Infinity, 1 + 2e-5, 100.01]);
  const ok = compareOutput('y', 'float32', got, golden, tol);
  assert.equal(ok.ok, true);
  assert.ok(Math.abs(ok.maxError - 0.01) < 1e-4);
  for (const [i, v] of [[0, 1], [1, -Infinity], [2, NaN], [3, 1.001]]) {
    const bad = got.slice();
    bad[i] = v;
    const r = compareOutput('y', 'float32', bad, golden, tol);
    assert.equal(r.ok, false, `element ${i} = ${v}`);
    assert.equal(r.first.index, i);
  }
  const ints = compareOutput('n', 'int64', new BigInt64Array([1n, 5n]), new BigInt64Array([1n, 3n]), tol);
  assert.deepEqual([ints.ok, ints.maxError, ints.mismatches], [false, 2, 1]);
  assert.equal(compareOutput('b', 'bool', new Uint8Array([1, 0]), new Uint8Array([1, 0]), tol).ok, true);
});

test('inputs are checked by name, type and length', async () => {
  await rejectsRun(affine.run({ z: AFFINE_X }), /^unknown input "z" \(the package's inputs are x\)$/);
  await rejectsRun(affine.run({}), /^missing input "x" \(the package's inputs are x\)$/);
  await rejectsRun(affine.run({ x: new Float32Array(5) }), /^input "x" has 5 elements, expected 6 \(shape \[2,3\]\)$/);
  await rejectsRun(affine.run({ x: new Float64Array(6) }), /^input "x" must be a Float32Array \(float32\), got Float64Array$/);
  await rejectsRun(affine.run([]), /^run\(\) got 0 inputs, the package takes 1 \(x\)$/);
  await rejectsRun(gather.run({ idx: new Int32Array(4) }), /^input "idx" must be a BigInt64Array \(int64\), got Int32Array$/);
});

test('an int64 input outside the int32 range is rejected, naming the input', async () => {
  await rejectsRun(gather.run({ idx: new BigInt64Array([0n, 2n ** 32n, 1n, 1n]) }),
    /^input "idx" \(int64\) element 1 is 4294967296, outside the int32 range/);
  await rejectsRun(gather.run({ idx: new BigInt64Array([0n, 1n, -(2n ** 31n) - 1n, 1n]) }),
    /^input "idx" \(int64\) element 2 is -2147483649/);
});

test('int64 outputs come back as BigInt64Array', async () => {
  const idx = new BigInt64Array([4n, 4n, 0n, 2n]);
  const { outputs } = await gather.run({ idx });
  const ref = gatherRef(idx);
  assert.ok(outputs.next instanceof BigInt64Array);
  assert.deepEqual(outputs.next, ref.next);
  assert.deepEqual(outputs.rows, ref.rows);
});

test('a bad index raises a RunError naming the dispatch, and the next call is clean', async () => {
  await assert.rejects(gather.run({ idx: new BigInt64Array([1n, 7n, 2n, 0n]) }), (e) => {
    assert.ok(e instanceof RunError);
    assert.equal(e.message, 'index 7 is out of range for dimension 0 of size 5 in dispatch 1 ("Gather <- embedding", node embedding, at model.py:9)');
    assert.deepEqual(e.dispatch, { index: 1, label: 'Gather <- embedding', node: 'embedding', source: 'model.py:9' });
    assert.equal(e.badIndex, 7);
    return true;
  });
  await rejectsRun(gather.run({ idx: new BigInt64Array([1n, 1n, -1n, 0n]) }), /^index -1 is out of range for dimension 0 of size 5 in dispatch 1 /);
  const { outputs } = await gather.run({ idx: GATHER_IDX });
  assert.deepEqual(outputs.rows, gatherRef(GATHER_IDX).rows);
});

test('state keeps its values between calls and resets to its init', async () => {
  const m = await load(counterPackage());
  const u = new Uint8Array([3, 128, 255]);
  const first = await m.run({ inc: new Int32Array([2]), u });
  assert.deepEqual(first.outputs.total, new Int32Array([COUNTER_INIT + 2]));
  assert.deepEqual(first.outputs.u2, new Uint8Array([6, 0, 254]));
  const second = await m.run({ inc: new Int32Array([3]), u });
  assert.deepEqual(second.outputs.total, new Int32Array([COUNTER_INIT + 5]));
  // The self-check starts from the initial state (its golden outputs were computed from it).
  assert.equal((await m.selfCheck()).ok, true);
  assert.equal((await m.selfCheck()).ok, true);
  m.resetState();
  const third = await m.run({ inc: new Int32Array([1]), u });
  assert.deepEqual(third.outputs.total, new Int32Array([COUNTER_INIT + 1]));
});

test('info and metadata describe the loaded model', () => {
  const info = affine.info;
  assert.equal(info.kernels, 2);
  assert.equal(info.dispatches, 3);
  assert.equal(info.pipelines, 2);
  assert.equal(info.contentHash, affine.package.contentHash);
  assert.equal(typeof info.adapter.vendor, 'string');
  assert.ok(info.loadMs >= info.warmupMs && info.warmupMs >= 0);
  assert.equal(info.bufferBytes.arena, affine.package.manifest.arena.bytes);
  assert.equal(info.bufferBytes.weights, 512);
  assert.equal(info.bufferBytes.total, Object.entries(info.bufferBytes).filter(([k]) => k !== 'total').reduce((x, [, v]) => x + v, 0));
  assert.deepEqual(affine.inputs.map((t) => t.name), ['x']);
  assert.deepEqual(affine.outputs.map((t) => t.name), ['y', 'pos']);
});
