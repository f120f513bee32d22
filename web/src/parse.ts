// parsePackage: checks 1-3 of "Checks a runtime makes at load" (docs/webgpu_package.md).
// Nothing here touches the GPU; every rule broken is a PackageError naming the field.

import { PackageError } from './errors.js';
import {
  ALIGNMENT, DEFAULT_LIMITS, DTYPES, FORMAT_VERSION, HEADER_SIZE, MAGIC, MAX_JSON_DEPTH, STATUS_BYTES, numel, storageBytes,
  workLimit,
} from './format.js';
import type {
  DType, Dispatch, DispatchBinding, GoldenTensor, IOTensor, Kernel, KernelBinding, Manifest,
  ParsedPackage, Requirements, Shard, StateTensor, WeightTensor,
} from './format.js';

interface Header {
  version: number;
  manifestOffset: number;
  manifestSize: number;
  payloadOffset: number;
  payloadSize: number;
  digest: Uint8Array;
}

/** Reads, checks and returns a package. The bytes are kept (not copied): do not modify them. */
export async function parsePackage(input: ArrayBuffer | Uint8Array): Promise<ParsedPackage> {
  // A plain Uint8Array view, also of a Node Buffer (whose slice() does not copy).
  const bytes = ArrayBuffer.isView(input) ? new Uint8Array(input.buffer, input.byteOffset, input.byteLength) : new Uint8Array(input);
  const header = readHeader(bytes);
  const contentHash = toHex(header.digest);
  await checkDigest(bytes, header, contentHash);
  const manifest = readManifest(bytes, header, contentHash);
  const payload = bytes.subarray(header.payloadOffset, header.payloadOffset + header.payloadSize);
  return { manifest, bytes, payload, contentHash, version: header.version };
}

// ---- 1. The header ------------------------------------------------------------------------

function readHeader(bytes: Uint8Array): Header {
  const magic = new TextEncoder().encode(MAGIC);
  const head = bytes.subarray(0, magic.length);
  if (!head.every((b, i) => b === magic[i])) {
    throw new PackageError(
      `not a Chroma WebGPU package: the file starts with ${quoteBytes(head)}, expected "${MAGIC}"`);
  }
  if (bytes.length < HEADER_SIZE) {
    throw new PackageError(
      `truncated package: the file has ${bytes.length} bytes, less than the ${HEADER_SIZE}-byte header`);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, HEADER_SIZE);
  const version = view.getUint32(8, true);
  if (version !== FORMAT_VERSION) {
    throw new PackageError(
      `format version ${version} is not supported (this runtime reads version ${FORMAT_VERSION})`);
  }
  const headerSize = view.getUint32(12, true);
  if (headerSize !== HEADER_SIZE) {
    throw new PackageError(`header size is ${headerSize}, expected ${HEADER_SIZE} in format version ${FORMAT_VERSION}`);
  }
  const u64 = (at: number, field: string): number => {
    const v = view.getBigUint64(at, true);
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) {
      throw new PackageError(`header field ${field} is ${v}, larger than any file this runtime reads`);
    }
    return Number(v);
  };
  const manifestOffset = u64(16, 'manifest offset');
  const manifestSize = u64(24, 'manifest size');
  const payloadOffset = u64(32, 'payload offset');
  const payloadSize = u64(40, 'payload size');
  if (manifestOffset !== HEADER_SIZE) {
    throw new PackageError(
      `header field manifest offset is ${manifestOffset}, expected ${HEADER_SIZE} (right after the header)`);
  }
  if (manifestSize === 0) throw new PackageError('header field manifest size is 0: the package has no manifest');
  if (payloadOffset % ALIGNMENT !== 0) {
    throw new PackageError(`header field payload offset ${payloadOffset} is not a multiple of ${ALIGNMENT}`);
  }
  if (payloadOffset < manifestOffset + manifestSize) {
    throw new PackageError(
      `header field payload offset ${payloadOffset} lies inside the manifest ` +
      `(manifest offset ${manifestOffset} + size ${manifestSize})`);
  }
  const total = payloadOffset + payloadSize;
  if (bytes.length < total) {
    throw new PackageError(`truncated package: the header says ${total} bytes, the file has ${bytes.length}`);
  }
  if (bytes.length > total) {
    throw new PackageError(
      `the header says ${total} bytes, the file has ${bytes.length}: unexpected bytes after the payload`);
  }
  for (let i = 80; i < HEADER_SIZE; i++) {
    if (bytes[i] !== 0) throw new PackageError(`header byte ${i} is ${bytes[i]}: bytes 80-95 must be zero`);
  }
  const digest = bytes.slice(48, 80);
  return { version, manifestOffset, manifestSize, payloadOffset, payloadSize, digest };
}

// ---- 2. The digest ------------------------------------------------------------------------

/**
 * The header's SHA-256 covers the bytes from the manifest offset to the end of the file, with
 * the 64 hex digits of the manifest's `content_hash` value replaced by 64 ASCII '0' (a digest
 * cannot cover its own value; the writer hashes with the placeholder and then fills it in).
 */
async function checkDigest(bytes: Uint8Array, h: Header, hex: string): Promise<void> {
  const subtle = globalThis.crypto?.subtle;
  if (!subtle) {
    throw new Error('checking a package needs crypto.subtle (SHA-256): in a browser, serve the page over https or localhost');
  }
  const manifest = bytes.subarray(h.manifestOffset, h.manifestOffset + h.manifestSize);
  const at = indexOf(manifest, new TextEncoder().encode(`"${hex}"`));
  if (at < 0) {
    throw new PackageError(
      "content digest mismatch: the package is corrupt (the manifest's content_hash is not the header's digest)");
  }
  // Put the placeholder in place just for the call: digest() copies its input before it
  // returns (WebCrypto: "get a copy of the bytes held by the buffer source"), so the caller's
  // bytes are restored before anything else can see them. This avoids copying the file.
  const saved = new Uint8Array(manifest.subarray(at + 1, at + 65)); // a copy
  let pending: Promise<ArrayBuffer>;
  manifest.fill(0x30, at + 1, at + 65);
  try {
    pending = subtle.digest('SHA-256', bytes.subarray(h.manifestOffset, h.payloadOffset + h.payloadSize) as Uint8Array<ArrayBuffer>);
  } finally {
    manifest.set(saved, at + 1);
  }
  const got = new Uint8Array(await pending);
  if (!got.every((b, i) => b === h.digest[i])) {
    throw new PackageError('content digest mismatch: the package is corrupt');
  }
}

// ---- 3. The manifest ----------------------------------------------------------------------

function readManifest(bytes: Uint8Array, h: Header, hex: string): Manifest {
  const end = h.manifestOffset + h.manifestSize;
  for (let i = end; i < h.payloadOffset; i++) {
    if (bytes[i] !== 0) throw new PackageError(`byte ${i} between the manifest and the payload is not zero`);
  }
  let m: Record<string, unknown>;
  try {
    const text = new TextDecoder('utf-8', { fatal: true }).decode(bytes.subarray(h.manifestOffset, end));
    const depth = jsonDepth(text);
    if (depth > MAX_JSON_DEPTH) {
      throw new PackageError(`the manifest nests objects and arrays ${depth} deep, more than the ${MAX_JSON_DEPTH} a package may`);
    }
    m = JSON.parse(text) as Record<string, unknown>;
  } catch (e) {
    if (e instanceof PackageError) throw e;
    throw new PackageError(`the manifest is not valid UTF-8 JSON: ${(e as Error).message}`);
  }
  const c = new Checker(h.payloadSize);
  const root = c.obj(m, 'manifest');
  if (root.format !== 'chroma.webgpu') {
    throw new PackageError(`manifest field format is ${JSON.stringify(root.format)}, expected "chroma.webgpu"`);
  }
  if (root.version !== FORMAT_VERSION) {
    throw new PackageError(
      `manifest version ${JSON.stringify(root.version)} is not supported (this runtime reads version ${FORMAT_VERSION})`);
  }
  const compilerVersion = c.str(root.compiler_version, 'compiler_version');
  if (root.dialect !== undefined && root.dialect !== 'wgsl') {
    throw new PackageError(`manifest field dialect is ${JSON.stringify(root.dialect)}: a ${String(root.dialect).slice(0, 16)} ` +
      'package (.chroma-cuda, .chroma-metal), not a WebGPU one; this runtime runs WGSL packages');
  }
  if (root.entries !== undefined && root.entries !== null) {
    const n = Array.isArray(root.entries) ? root.entries.length : -1;
    if (n !== 1) throw new PackageError(`manifest field entries: a WebGPU package has one entry point, this one lists ${n < 0 ? 'no list' : n}`);
  }
  if (root.content_hash !== hex) {
    throw new PackageError(`manifest field content_hash ${JSON.stringify(root.content_hash)} is not the header's digest ${hex}`);
  }
  const requirements = c.requirements(root.requirements);
  c.limits = { ...DEFAULT_LIMITS, ...requirements.limits };

  const arenaObj = c.obj(root.arena, 'arena');
  const arena = {
    bytes: c.words(arenaObj.bytes, 'arena.bytes'),
    status_offset: c.aligned(arenaObj.status_offset, 'arena.status_offset'),
  };
  if (arena.status_offset + STATUS_BYTES > arena.bytes) {
    throw new PackageError(`arena.status_offset ${arena.status_offset}: the ${STATUS_BYTES}-byte status block ` +
      `lies outside the arena (${arena.bytes} bytes)`);
  }
  c.bindable(arena.bytes, 'arena.bytes');
  const inputs = c.ioList(root.inputs, 'inputs', arena);
  const outputs = c.ioList(root.outputs, 'outputs', arena);

  const stateObj = c.obj(root.state, 'state');
  const stateBytes = c.int(stateObj.bytes, 'state.bytes');
  if (stateBytes % 4 !== 0) throw new PackageError(`state.bytes ${stateBytes} is not a multiple of 4`);
  if (stateBytes > 0) c.bindable(stateBytes, 'state.bytes');
  const stateTensors = c.arr(stateObj.tensors ?? [], 'state.tensors').map((t, i): StateTensor => {
    const p = `state.tensors[${i}]`;
    const o = c.obj(t, p);
    const st = { name: c.str(o.name, `${p}.name`), ...c.ints(o, p, ['offset', 'bytes', 'init'] as const) };
    if (st.offset % 4 !== 0 || st.bytes % 4 !== 0) {
      throw new PackageError(`${p}: offset ${st.offset} and bytes ${st.bytes} must be multiples of 4`);
    }
    if (st.offset + st.bytes > stateBytes) {
      throw new PackageError(`${p}: offset ${st.offset} + ${st.bytes} bytes lies outside the state buffer (${stateBytes} bytes)`);
    }
    c.section(st.init, st.bytes, `${p}.init`);
    return st;
  });

  const paramsObj = c.obj(root.params, 'params');
  const params = { offset: c.int(paramsObj.offset, 'params.offset'), bytes: c.words(paramsObj.bytes, 'params.bytes', true) };
  c.section(params.offset, params.bytes, 'params');
  c.limit('maxBufferSize', params.bytes, 'params.bytes');

  const weightsObj = c.obj(root.weights, 'weights');
  const shards = c.arr(weightsObj.shards, 'weights.shards').map((s, i): Shard => {
    const p = `weights.shards[${i}]`;
    const o = c.obj(s, p);
    const shard = { offset: c.int(o.offset, `${p}.offset`), bytes: c.words(o.bytes, `${p}.bytes`) };
    c.section(shard.offset, shard.bytes, p);
    c.bindable(shard.bytes, `${p}.bytes`);
    return shard;
  });
  const weightTensors = c.arr(weightsObj.tensors ?? [], 'weights.tensors').map((t, i): WeightTensor => {
    const p = `weights.tensors[${i}]`;
    const o = c.obj(t, p);
    const w = {
      name: c.str(o.name, `${p}.name`), dtype: c.str(o.dtype, `${p}.dtype`), shape: c.shape(o.shape, `${p}.shape`),
      ...c.ints(o, p, ['shard', 'offset', 'bytes'] as const),
    };
    const shard = shards[w.shard];
    if (!shard) throw new PackageError(`${p}: shard ${w.shard} does not exist (${shards.length} shards)`);
    if (w.offset + w.bytes > shard.bytes) {
      throw new PackageError(`${p}: offset ${w.offset} + ${w.bytes} bytes lies outside shard ${w.shard} (${shard.bytes} bytes)`);
    }
    return w;
  });

  const kernels = c.arr(root.kernels, 'kernels').map((k, i) => c.kernel(k, `kernels[${i}]`, requirements));
  c.work = workLimit(arena.bytes, stateBytes);
  const dispatches = c.arr(root.dispatches, 'dispatches').map((d, i) =>
    c.dispatch(d, i, kernels, shards.length, stateBytes, params.bytes));

  const goldenObj = c.obj(root.golden, 'golden');
  const golden = {
    inputs: c.goldenList(goldenObj.inputs, 'golden.inputs', inputs),
    outputs: c.goldenList(goldenObj.outputs, 'golden.outputs', outputs),
    tolerance: c.tolerance(goldenObj.tolerance),
  };
  // Golden int64 inputs go to the device as int32 (their storage): a value beyond it is a
  // package no device can run as stored.
  const payloadBytes = bytes.subarray(h.payloadOffset, h.payloadOffset + h.payloadSize);
  golden.inputs.forEach((g, i) => {
    if (g.dtype !== 'int64' || g.generate) return;
    const dv = new DataView(payloadBytes.buffer, payloadBytes.byteOffset + g.offset, g.bytes);
    for (let j = 0; j + 8 <= g.bytes; j += 8) {
      const v = dv.getBigInt64(j, true);
      if (v < BigInt(-2147483648) || v > BigInt(2147483647)) {
        throw new PackageError(`golden.inputs[${i}] (${g.name}): int64 value ${v} does not fit in int32, which the package stores int64 tensors as`);
      }
    }
  });
  // A WebGPU package has one entry point; an `entries` list, when present, must describe the
  // top-level schedule (the first entry's) and nothing else.
  if (root.entries !== undefined && root.entries !== null) {
    const e = c.obj((root.entries as unknown[])[0], 'entries[0]');
    const same = (a: unknown, b: unknown): boolean => JSON.stringify(a) === JSON.stringify(b);
    if (!same(e.inputs, root.inputs) || !same(e.outputs, root.outputs) || !same(e.dispatches, root.dispatches) ||
        (e.output_structure ?? 'single') !== (root.output_structure ?? 'single')) {
      throw new PackageError('manifest field entries[0] differs from the top-level inputs, outputs, output_structure and ' +
        'dispatches, which must be the first entry\'s');
    }
  }
  const stats = root.stats === undefined ? undefined : c.obj(root.stats, 'stats') as Record<string, number>;

  const manifest: Manifest = {
    format: 'chroma.webgpu', version: 1, compiler_version: compilerVersion, content_hash: hex,
    requirements, inputs, outputs, arena,
    state: { bytes: stateBytes, tensors: stateTensors }, params,
    weights: { shards, tensors: weightTensors }, kernels, dispatches, golden,
  };
  if (root.output_structure !== undefined) manifest.output_structure = root.output_structure;
  if (stats !== undefined) manifest.stats = stats;
  return manifest;
}

/** Field checks; every failure names the field by its path in the manifest. */
class Checker {
  /** Effective limits: the package's requirements over WebGPU's defaults. */
  limits: Record<string, number> = { ...DEFAULT_LIMITS };

  /** The most invocations one dispatch may launch (workLimit). */
  work = 0;

  constructor(private readonly payloadSize: number) {}

  fail(path: string, want: string, got: unknown): never {
    const shown = JSON.stringify(got);
    throw new PackageError(`manifest field ${path}: expected ${want}, got ${shown === undefined ? 'nothing' : shown.slice(0, 80)}`);
  }
  obj(v: unknown, path: string): Record<string, unknown> {
    if (typeof v !== 'object' || v === null || Array.isArray(v)) this.fail(path, 'an object', v);
    return v as Record<string, unknown>;
  }
  arr(v: unknown, path: string): unknown[] {
    if (!Array.isArray(v)) this.fail(path, 'an array', v);
    return v;
  }
  str(v: unknown, path: string): string {
    if (typeof v !== 'string') this.fail(path, 'a string', v);
    return v;
  }
  optStr(v: unknown, path: string): string {
    return v === undefined ? '' : this.str(v, path);
  }
  int(v: unknown, path: string): number {
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) this.fail(path, 'a non-negative integer', v);
    return v;
  }
  /** Several non-negative integer fields of an object. */
  ints<K extends string>(o: Record<string, unknown>, path: string, keys: readonly K[]): Record<K, number> {
    const out = {} as Record<K, number>;
    for (const k of keys) out[k] = this.int(o[k], `${path}.${k}`);
    return out;
  }
  /** A size in bytes of a buffer or binding: a multiple of 4 (and non-zero unless allowed). */
  words(v: unknown, path: string, zeroOk = false): number {
    const n = this.int(v, path);
    if (n % 4 !== 0 || (n === 0 && !zeroOk)) this.fail(path, `a ${zeroOk ? '' : 'positive '}multiple of 4`, v);
    return n;
  }
  aligned(v: unknown, path: string): number {
    const n = this.int(v, path);
    if (n % ALIGNMENT !== 0) this.fail(path, `a multiple of ${ALIGNMENT}`, v);
    return n;
  }
  shape(v: unknown, path: string): number[] {
    return this.arr(v, path).map((d, i) => this.int(d, `${path}[${i}]`));
  }
  dtype(v: unknown, path: string): DType {
    if (typeof v !== 'string' || !(v in DTYPES)) this.fail(path, `one of ${Object.keys(DTYPES).join(', ')}`, v);
    return v as DType;
  }
  /** A payload section: aligned, and inside the payload. */
  section(offset: number, bytes: number, path: string): void {
    if (offset % ALIGNMENT !== 0) throw new PackageError(`${path}: payload offset ${offset} is not a multiple of ${ALIGNMENT}`);
    if (offset + bytes > this.payloadSize) {
      throw new PackageError(`${path}: payload offset ${offset} + ${bytes} bytes lies outside the payload (${this.payloadSize} bytes)`);
    }
  }
  limit(name: string, value: number, path: string): void {
    const max = this.limits[name]!;
    if (value > max) {
      throw new PackageError(`${path} is ${value}, more than ${name} ${max} (the package's requirements.limits do not raise it)`);
    }
  }
  /** A buffer bound whole as storage. */
  bindable(bytes: number, path: string): void {
    this.limit('maxStorageBufferBindingSize', bytes, path);
    this.limit('maxBufferSize', bytes, path);
  }

  requirements(v: unknown): Requirements {
    const o = this.obj(v, 'requirements');
    const features = this.arr(o.features ?? [], 'requirements.features').map((f, i) => this.str(f, `requirements.features[${i}]`));
    const lim = this.obj(o.limits ?? {}, 'requirements.limits');
    const limits: Record<string, number> = {};
    for (const [k, x] of Object.entries(lim)) limits[k] = this.int(x, `requirements.limits.${k}`);
    return { features, limits };
  }

  ioList(v: unknown, path: string, arena: { bytes: number; status_offset: number }): IOTensor[] {
    const seen = new Set<string>();
    return this.arr(v, path).map((t, i): IOTensor => {
      const p = `${path}[${i}]`;
      const o = this.obj(t, p);
      const name = this.str(o.name, `${p}.name`);
      if (name === '' || seen.has(name)) this.fail(`${p}.name`, 'a unique non-empty name', name);
      seen.add(name);
      const dtype = this.dtype(o.dtype, `${p}.dtype`);
      const shape = this.shape(o.shape, `${p}.shape`);
      const storage = DTYPES[dtype].storage;
      if (o.storage !== storage) this.fail(`${p}.storage`, `"${storage}" for ${dtype}`, o.storage);
      const offset = this.aligned(o.offset, `${p}.offset`);
      const bytes = this.int(o.bytes, `${p}.bytes`);
      const want = storageBytes(dtype, shape);
      if (bytes !== want) this.fail(`${p}.bytes`, `${want} (${dtype}[${shape}] stored as ${storage}, whole words)`, bytes);
      if (offset + bytes > arena.bytes) {
        throw new PackageError(`${p} (${name}): arena offset ${offset} + ${bytes} bytes lies outside the arena (${arena.bytes} bytes)`);
      }
      if (bytes > 0 && offset < arena.status_offset + STATUS_BYTES && arena.status_offset < offset + bytes) {
        throw new PackageError(`${p} (${name}): arena offset ${offset} overlaps the status block at ${arena.status_offset}`);
      }
      return { name, dtype, shape, storage, offset, bytes };
    });
  }

  kernel(v: unknown, p: string, req: Requirements): Kernel {
    const o = this.obj(v, p);
    const name = this.str(o.name, `${p}.name`);
    const wg = this.arr(o.workgroup_size, `${p}.workgroup_size`).map((d, i) => this.int(d, `${p}.workgroup_size[${i}]`));
    if (wg.length !== 3 || wg.some((d) => d === 0)) this.fail(`${p}.workgroup_size`, 'three positive integers', o.workgroup_size);
    this.limit('maxComputeInvocationsPerWorkgroup', wg[0]! * wg[1]! * wg[2]!, `${p}.workgroup_size (its invocations)`);
    const seen = new Set<number>();
    let uniforms = 0;
    let storages = 0;
    const bindings = this.arr(o.bindings, `${p}.bindings`).map((b, i): KernelBinding => {
      const bp = `${p}.bindings[${i}]`;
      const bo = this.obj(b, bp);
      const binding = this.int(bo.binding, `${bp}.binding`);
      if (seen.has(binding)) throw new PackageError(`${p} (${name}): binding ${binding} is declared twice`);
      if (binding >= this.limits.maxBindingsPerBindGroup!) this.limit('maxBindingsPerBindGroup', binding + 1, `${bp}.binding + 1`);
      seen.add(binding);
      if (bo.type === 'uniform') {
        uniforms++;
        const bytes = this.words(bo.bytes, `${bp}.bytes`);
        this.limit('maxUniformBufferBindingSize', bytes, `${bp}.bytes`);
        return { binding, type: 'uniform', bytes };
      }
      if (bo.type !== 'storage' && bo.type !== 'read-only-storage') this.fail(`${bp}.type`, '"uniform", "storage" or "read-only-storage"', bo.type);
      storages++;
      return { binding, type: bo.type };
    });
    if (uniforms > 1) throw new PackageError(`${p} (${name}): ${uniforms} uniform bindings; a kernel has at most one (the dispatch's params)`);
    this.limit('maxStorageBuffersPerShaderStage', storages, `${p} (${name}): the number of storage bindings`);
    const features = this.arr(o.features ?? [], `${p}.features`).map((f, i) => this.str(f, `${p}.features[${i}]`));
    for (const f of features) {
      if (!req.features.includes(f)) throw new PackageError(`${p} (${name}) uses the feature "${f}", which requirements.features does not list`);
    }
    const variants = this.arr(o.variants ?? [], `${p}.variants`).map((x, j) => {
      const vp = `${p}.variants[${j}]`;
      const vo = this.obj(x, vp);
      const vf = this.arr(vo.features, `${vp}.features`).map((f, k) => this.str(f, `${vp}.features[${k}]`));
      if (vf.length === 0) throw new PackageError(`${vp} (${name}) lists no features (a variant is chosen by the features it needs)`);
      return { features: vf, code: this.str(vo.code, `${vp}.code`) };
    });
    return {
      name, code: this.str(o.code, `${p}.code`), entry: this.str(o.entry, `${p}.entry`),
      workgroup_size: wg as [number, number, number], bindings, features, variants,
    };
  }

  dispatch(v: unknown, i: number, kernels: Kernel[], shards: number, stateBytes: number, paramsBytes: number): Dispatch {
    const p = `dispatches[${i}]`;
    const o = this.obj(v, p);
    const kernelIndex = this.int(o.kernel, `${p}.kernel`);
    const kernel = kernels[kernelIndex];
    if (!kernel) throw new PackageError(`dispatch ${i}: kernel ${kernelIndex} does not exist (${kernels.length} kernels)`);
    const grid = this.arr(o.grid, `${p}.grid`).map((d, j) => this.int(d, `${p}.grid[${j}]`));
    if (grid.length !== 3) this.fail(`${p}.grid`, 'three integers', o.grid);
    for (const g of grid) this.limit('maxComputeWorkgroupsPerDimension', g, `dispatch ${i}: grid dimension`);
    const invocations = grid[0]! * grid[1]! * grid[2]! * kernel.workgroup_size[0] * kernel.workgroup_size[1] * kernel.workgroup_size[2];
    if (invocations > this.work) {
      throw new PackageError(`dispatch ${i}: grid [${grid}] launches ${invocations} invocations, more than the ${this.work} ` +
        'a dispatch of this package may (the work bound: 64 per word of the arena and state, at least 2^24)');
    }
    const uniform = kernel.bindings.find((b) => b.type === 'uniform');
    let params = 0;
    if (uniform) {
      params = this.int(o.params, `${p}.params`);
      if (params % ALIGNMENT !== 0) throw new PackageError(`dispatch ${i}: params offset ${params} is not a multiple of ${ALIGNMENT}`);
      if (params + uniform.bytes! > paramsBytes) {
        throw new PackageError(`dispatch ${i}: params offset ${params} + ${uniform.bytes} bytes lies outside the params section (${paramsBytes} bytes)`);
      }
    } else if (o.params !== undefined) {
      params = this.int(o.params, `${p}.params`);
    }
    const bound = new Set<number>();
    const bindings = this.arr(o.bindings, `${p}.bindings`).map((b, j): DispatchBinding => {
      const bp = `${p}.bindings[${j}]`;
      const bo = this.obj(b, bp);
      const binding = this.int(bo.binding, `${bp}.binding`);
      const decl = kernel.bindings.find((kb) => kb.binding === binding);
      if (!decl || decl.type === 'uniform') {
        throw new PackageError(`dispatch ${i}: binding ${binding} is not a storage binding of kernel ${kernelIndex} (${kernel.name})`);
      }
      if (bound.has(binding)) throw new PackageError(`dispatch ${i}: binding ${binding} is bound twice`);
      bound.add(binding);
      if (bo.buffer === 'arena') return { binding, buffer: 'arena' };
      if (bo.buffer === 'state') {
        if (stateBytes === 0) throw new PackageError(`dispatch ${i}: binding ${binding} binds the state buffer, but state.bytes is 0`);
        return { binding, buffer: 'state' };
      }
      if (bo.buffer !== 'weights') this.fail(`${bp}.buffer`, '"arena", "state" or "weights"', bo.buffer);
      const shard = this.int(bo.shard, `${bp}.shard`);
      if (shard >= shards) throw new PackageError(`dispatch ${i}: binding ${binding}: weights shard ${shard} does not exist (${shards} shards)`);
      if (decl.type !== 'read-only-storage') {
        throw new PackageError(`dispatch ${i}: binding ${binding} binds weights shard ${shard} to a read-write binding (weights are read-only)`);
      }
      return { binding, buffer: 'weights', shard };
    });
    for (const kb of kernel.bindings) {
      if (kb.type !== 'uniform' && !bound.has(kb.binding)) {
        throw new PackageError(`dispatch ${i}: binding ${kb.binding} of kernel ${kernelIndex} (${kernel.name}) is not bound`);
      }
    }
    return {
      kernel: kernelIndex, grid: grid as [number, number, number], params, bindings,
      label: this.optStr(o.label, `${p}.label`), node: this.optStr(o.node, `${p}.node`), source: this.optStr(o.source, `${p}.source`),
    };
  }

  /** Golden tensors: one per input (or output), in the same order, names, dtypes and shapes. */
  goldenList(v: unknown, path: string, io: IOTensor[]): GoldenTensor[] {
    const list = this.arr(v, path);
    if (list.length !== io.length) {
      throw new PackageError(`${path} has ${list.length} tensors, the package has ${io.length}`);
    }
    return list.map((t, i): GoldenTensor => {
      const p = `${path}[${i}]`;
      const o = this.obj(t, p);
      const head = { name: this.str(o.name, `${p}.name`), dtype: this.dtype(o.dtype, `${p}.dtype`), shape: this.shape(o.shape, `${p}.shape`) };
      const want = io[i]!;
      if (head.name !== want.name || head.dtype !== want.dtype || head.shape.join() !== want.shape.join()) {
        throw new PackageError(`${p} is ${head.name} ${head.dtype} [${head.shape}], expected ${want.name} ${want.dtype} [${want.shape}]`);
      }
      if (o.generate !== undefined) {
        if (!path.endsWith('inputs')) throw new PackageError(`${p}.generate: only a golden input is generated`);
        if (head.dtype !== 'float32') throw new PackageError(`${p}.generate: only a float32 input is generated (this one is ${head.dtype})`);
        const s = this.obj(o.generate, `${p}.generate`);
        if (s.kind !== 'uniform') this.fail(`${p}.generate.kind`, '"uniform"', s.kind);
        const seed = this.int(s.seed, `${p}.generate.seed`);
        if (seed > 0xffffffff) this.fail(`${p}.generate.seed`, 'a 32-bit unsigned integer', seed);
        const num = (x: unknown, q: string): number => {
          if (typeof x !== 'number' || !Number.isFinite(x)) this.fail(q, 'a finite number', x);
          return x as number;
        };
        const generate = { kind: 'uniform' as const, seed, low: num(s.low, `${p}.generate.low`), high: num(s.high, `${p}.generate.high`) };
        return { ...head, offset: 0, bytes: 0, generate, stride: 1 };
      }
      const g = { ...head, ...this.ints(o, p, ['offset', 'bytes'] as const), stride: o.stride === undefined ? 1 : this.int(o.stride, `${p}.stride`) };
      if (g.stride < 1) this.fail(`${p}.stride`, 'a positive integer', g.stride);
      if (g.stride > 1 && !path.endsWith('outputs')) throw new PackageError(`${p}.stride: only a golden output is sampled`);
      const size = Math.ceil(numel(g.shape) / g.stride) * DTYPES[g.dtype].goldenBytes;
      if (g.bytes !== size) this.fail(`${p}.bytes`, `${size} for ${g.dtype} [${g.shape}]${g.stride > 1 ? ` every ${g.stride}th element` : ''}`, g.bytes);
      this.section(g.offset, g.bytes, p);
      return g;
    });
  }

  tolerance(v: unknown): { atol: number; rtol: number } {
    const o = this.obj(v, 'golden.tolerance');
    const num = (x: unknown, path: string): number => {
      if (typeof x !== 'number' || !Number.isFinite(x) || x < 0) this.fail(path, 'a non-negative number', x);
      return x;
    };
    return { atol: num(o.atol, 'golden.tolerance.atol'), rtol: num(o.rtol, 'golden.tolerance.rtol') };
  }
}

// ---- Helpers ------------------------------------------------------------------------------

function toHex(b: Uint8Array): string {
  return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

function indexOf(hay: Uint8Array, needle: Uint8Array): number {
  const first = needle[0]!;
  for (let i = hay.indexOf(first); i >= 0 && i + needle.length <= hay.length; i = hay.indexOf(first, i + 1)) {
    let j = 1;
    while (j < needle.length && hay[i + j] === needle[j]) j++;
    if (j === needle.length) return i;
  }
  return -1;
}

function quoteBytes(b: Uint8Array): string {
  const ascii = Array.from(b, (x) => (x >= 0x20 && x < 0x7f ? String.fromCharCode(x) : `\\x${x.toString(16).padStart(2, '0')}`)).join('');
  return b.length === 0 ? 'nothing (the file is empty)' : `"${ascii}"`;
}

/** How deep a JSON text's objects and arrays nest (brackets inside strings skipped). */
function jsonDepth(text: string): number {
  let depth = 0;
  let most = 0;
  let inString = false;
  let escaped = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (escaped) escaped = false;
      else if (c === 0x5c) escaped = true;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) {
      inString = true;
    } else if (c === 0x5b || c === 0x7b) {
      depth++;
      if (depth > most) most = depth;
    } else if (c === 0x5d || c === 0x7d) {
      depth--;
    }
  }
  return most;
}
