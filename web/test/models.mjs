// Small handwritten packages for the tests, with reference implementations in JS.
// Each WGSL kernel follows the compiler's conventions: binding 0 the params uniform (u32
// fields: word offsets and sizes), every storage binding array<u32>, all in group 0; bool and
// uint8 tensors packed four to a word.

import { buildPackage } from './fixture.mjs';

const f = Math.fround;

// ---- affine: h = x * w1 + 1; y = h * w2 + 1; pos = y > 2 ---------------------------------

const AFFINE = /* wgsl */ `
struct Params { x: u32, w: u32, y: u32, n: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> arena: array<u32>;
@group(0) @binding(2) var<storage, read> shard: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i >= p.n) { return; }
  let x = bitcast<f32>(arena[p.x + i]);
  let w = bitcast<f32>(shard[p.w + i]);
  arena[p.y + i] = bitcast<u32>(x * w + 1.0);
}`;

const GREATER = /* wgsl */ `
struct Params { y: u32, out: u32, n: u32, threshold: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> arena: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let w = gid.x;  // one invocation per word of the packed bool output (4 elements)
  if (w * 4u >= p.n) { return; }
  var word = 0u;
  for (var j = 0u; j < 4u; j++) {
    let i = w * 4u + j;
    if (i < p.n && bitcast<f32>(arena[p.y + i]) > bitcast<f32>(p.threshold)) { word |= 1u << (8u * j); }
  }
  arena[p.out + w] = word;
}`;

export const W1 = new Float32Array([0.5, -1, 2, 0.25, 3, -0.5]);
export const W2 = new Float32Array([1, 2, -1, 4, 0.5, 1.5]);
const f32bits = (x) => new Uint32Array(new Float32Array([x]).buffer)[0];

/** The affine model in JS (float32 rounding at each step). */
export function affineRef(x) {
  const y = new Float32Array(x.length);
  const pos = new Uint8Array(x.length);
  for (let i = 0; i < x.length; i++) {
    const h = f(f(x[i] * W1[i]) + 1);
    y[i] = f(f(h * W2[i]) + 1);
    pos[i] = y[i] > 2 ? 1 : 0;
  }
  return { y, pos };
}

export const AFFINE_X = new Float32Array([1, 2, 3, -4, 0.5, 6]);

/** Options: golden (override of the golden outputs), edit, requirements, kernels (override). */
export function affinePackage(opt = {}) {
  const n = 6;
  const ref = affineRef(AFFINE_X);
  const affineBindings = [{ binding: 1, buffer: 'arena' }, { binding: 2, buffer: 'weights', shard: 0 }];
  return buildPackage({
    inputs: [{ name: 'x', dtype: 'float32', shape: [2, 3] }],
    outputs: [{ name: 'y', dtype: 'float32', shape: [2, 3] }, { name: 'pos', dtype: 'bool', shape: [2, 3] }],
    temps: [{ name: 'h', words: n }],
    shards: [[{ name: 'fc1.weight', dtype: 'float32', shape: [2, 3], data: W1 }, { name: 'fc2.weight', dtype: 'float32', shape: [2, 3], data: W2 }]],
    kernels: opt.kernels ?? [
      { name: 'k0_affine', code: AFFINE, bindings: [{ binding: 0, type: 'uniform', bytes: 16 }, { binding: 1, type: 'storage' }, { binding: 2, type: 'read-only-storage' }] },
      { name: 'k1_greater', code: GREATER, bindings: [{ binding: 0, type: 'uniform', bytes: 16 }, { binding: 1, type: 'storage' }] },
    ],
    dispatches: [
      { kernel: 0, grid: [1, 1, 1], params: (L) => [L.arena.x, L.weights['fc1.weight'], L.arena.h, n], bindings: affineBindings, label: 'Affine <- mul, add', node: 'add', source: 'model.py:5' },
      { kernel: 0, grid: [1, 1, 1], params: (L) => [L.arena.h, L.weights['fc2.weight'], L.arena.y, n], bindings: affineBindings, label: 'Affine <- mul_1, add_1', node: 'add_1', source: 'model.py:6' },
      { kernel: 1, grid: [1, 1, 1], params: (L) => [L.arena.y, L.arena.pos, n, f32bits(2)], bindings: [{ binding: 1, buffer: 'arena' }], label: 'Greater <- gt', node: 'gt', source: 'model.py:7' },
    ],
    golden: { inputs: { x: AFFINE_X }, outputs: opt.golden ?? ref, tolerance: { atol: 1e-5, rtol: 1e-4 } },
    requirements: opt.requirements,
    edit: opt.edit,
  });
}

// ---- gather: next = idx + 1 (int64); rows = table[idx] (status on a bad index) ------------

const ADD_ONE = /* wgsl */ `
struct Params { x: u32, y: u32, n: u32, pad: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> arena: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i >= p.n) { return; }
  arena[p.y + i] = bitcast<u32>(bitcast<i32>(arena[p.x + i]) + 1);
}`;

const GATHER = /* wgsl */ `
struct Params { idx: u32, table: u32, out: u32, n: u32, rows: u32, cols: u32, status: u32, dispatch: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> arena: array<u32>;
@group(0) @binding(2) var<storage, read> shard: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i >= p.n) { return; }
  var r = bitcast<i32>(arena[p.idx + i]);
  if (r < 0 || r >= i32(p.rows)) {
    // Out of range: report it in the status block and clamp the address.
    arena[p.status] = 1u;
    arena[p.status + 1u] = p.dispatch + 1u;
    arena[p.status + 2u] = bitcast<u32>(r);
    arena[p.status + 3u] = p.rows;  // the size of the dimension it indexes
    arena[p.status + 4u] = 0u;      // that dimension
    r = clamp(r, 0, i32(p.rows) - 1);
  }
  for (var c = 0u; c < p.cols; c++) {
    arena[p.out + i * p.cols + c] = shard[p.table + u32(r) * p.cols + c];
  }
}`;

export const TABLE = new Float32Array([0, 1, 10, 11, 20, 21, 30, 31, 40, 41]); // [5, 2]
export const GATHER_IDX = new BigInt64Array([3n, 0n, 4n, 1n]);

export function gatherRef(idx) {
  const rows = new Float32Array(idx.length * 2);
  const next = new BigInt64Array(idx.length);
  idx.forEach((r, i) => {
    rows[2 * i] = TABLE[2 * Number(r)];
    rows[2 * i + 1] = TABLE[2 * Number(r) + 1];
    next[i] = r + 1n;
  });
  return { rows, next };
}

export function gatherPackage(opt = {}) {
  const n = 4;
  return buildPackage({
    inputs: [{ name: 'idx', dtype: 'int64', shape: [4] }],
    outputs: [{ name: 'rows', dtype: 'float32', shape: [4, 2] }, { name: 'next', dtype: 'int64', shape: [4] }],
    shards: [[{ name: 'emb.weight', dtype: 'float32', shape: [5, 2], data: TABLE }]],
    kernels: [
      { name: 'k0_add_one', code: ADD_ONE, bindings: [{ binding: 0, type: 'uniform', bytes: 16 }, { binding: 1, type: 'storage' }] },
      { name: 'k1_gather', code: GATHER, bindings: [{ binding: 0, type: 'uniform', bytes: 32 }, { binding: 1, type: 'storage' }, { binding: 2, type: 'read-only-storage' }] },
    ],
    dispatches: [
      { kernel: 0, grid: [1, 1, 1], params: (L) => [L.arena.idx, L.arena.next, n, 0], bindings: [{ binding: 1, buffer: 'arena' }], label: 'Add <- add', node: 'add', source: 'model.py:8' },
      { kernel: 1, grid: [1, 1, 1], params: (L) => [L.arena.idx, L.weights['emb.weight'], L.arena.rows, n, 5, 2, L.status, L.dispatch], bindings: [{ binding: 1, buffer: 'arena' }, { binding: 2, buffer: 'weights', shard: 0 }], label: 'Gather <- embedding', node: 'embedding', source: 'model.py:9' },
    ],
    golden: { inputs: { idx: GATHER_IDX }, outputs: gatherRef(GATHER_IDX) },
    edit: opt.edit,
  });
}

// ---- counter: state count += inc; total = count; u2 = u * 2 (uint8) -----------------------

const COUNTER = /* wgsl */ `
struct Params { inc: u32, total: u32, count: u32, u: u32, u2: u32, n: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> arena: array<u32>;
@group(0) @binding(2) var<storage, read_write> state: array<u32>;
@compute @workgroup_size(1)
fn main() {
  let c = bitcast<i32>(state[p.count]) + bitcast<i32>(arena[p.inc]);
  state[p.count] = bitcast<u32>(c);
  arena[p.total] = bitcast<u32>(c);
  var word = 0u;  // u and u2 are packed (uint8): 3 elements in one word
  for (var i = 0u; i < p.n; i++) { word |= (((arena[p.u] >> (8u * i)) * 2u) & 255u) << (8u * i); }
  arena[p.u2] = word;
}`;

export const COUNTER_INIT = 10;

export function counterPackage() {
  return buildPackage({
    inputs: [{ name: 'inc', dtype: 'int32', shape: [1] }, { name: 'u', dtype: 'uint8', shape: [3] }],
    outputs: [{ name: 'total', dtype: 'int32', shape: [1] }, { name: 'u2', dtype: 'uint8', shape: [3] }],
    state: [{ name: 'count', data: new Int32Array([COUNTER_INIT]) }],
    kernels: [{ name: 'k0_counter', code: COUNTER, workgroup_size: [1, 1, 1], bindings: [{ binding: 0, type: 'uniform', bytes: 24 }, { binding: 1, type: 'storage' }, { binding: 2, type: 'storage' }] }],
    dispatches: [{ kernel: 0, grid: [1, 1, 1], params: (L) => [L.arena.inc, L.arena.total, L.state.count, L.arena.u, L.arena.u2, 3], bindings: [{ binding: 1, buffer: 'arena' }, { binding: 2, buffer: 'state' }], label: 'Counter', node: 'add_', source: 'model.py:3' }],
    golden: { inputs: { inc: new Int32Array([5]), u: new Uint8Array([1, 100, 200]) }, outputs: { total: new Int32Array([15]), u2: new Uint8Array([2, 200, 144]) } },
  });
}
