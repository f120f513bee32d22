// loadPackage and Model: checks 4-5 of "Checks a runtime makes at load", the GPU resources,
// and the replay of the schedule (docs/webgpu_package.md).

import { PackageError, RunError } from './errors.js';
import type { DispatchSite } from './errors.js';
import { STATUS_BYTES } from './format.js';
import type { IOTensor, Kernel, ParsedPackage, Requirements, TensorData, Tolerance } from './format.js';
import { parsePackage } from './parse.js';
import { compareOutput, decodeOutput, encodeInput, goldenInputs, goldenOutputs, sampleOutput } from './tensors.js';
import type { OutputCheck } from './tensors.js';

// WebGPU's flag values, spelled out so that the module works without the GPUBufferUsage
// globals (Dawn's `globals` need not be installed on globalThis).
const MAP_READ = 0x1;
const COPY_SRC = 0x4;
const COPY_DST = 0x8;
const UNIFORM = 0x40;
const STORAGE = 0x80;
const SHADER_COMPUTE = 0x4;

const now = (): number => globalThis.performance?.now() ?? Date.now();

export interface LoadOptions {
  /** The WebGPU entry point: `navigator.gpu` in a browser (the default), `create([])` from the 'webgpu' package in Node. */
  gpu?: GPU;
  /** An adapter to use instead of requesting one (an adapter creates only one device). */
  adapter?: GPUAdapter;
  powerPreference?: GPUPowerPreference;
  /**
   * Use the kernels' variants (subgroup operations) where the adapter offers their features
   * (default true); false runs every kernel's portable code.
   */
  variants?: boolean;
}

export interface RunResult {
  outputs: Record<string, TensorData>;
  /** Milliseconds from the first input upload to the outputs decoded. */
  ms: number;
}

export interface SelfCheckResult {
  ok: boolean;
  /** Largest |y - golden| over every output. */
  maxError: number;
  tolerance: Tolerance;
  outputs: OutputCheck[];
  ms: number;
}

export interface ModelInfo {
  adapter: { vendor: string; architecture: string; device: string; description: string };
  contentHash: string;
  compilerVersion: string;
  /** From the start of loadPackage to a model ready to run (fetch, checks, uploads, pipelines). */
  loadMs: number;
  /** Fetching (for a URL) and checking the file (0 for a package parsed before). */
  parseMs: number;
  /** Pipeline creation (all kernels, in parallel): the warm-up a first run does not pay. */
  warmupMs: number;
  kernels: number;
  dispatches: number;
  pipelines: number;
  bufferBytes: { arena: number; state: number; weights: number; params: number; staging: number; total: number };
  features: string[];
  limits: Record<string, number>;
}

/** Throws a PackageError naming the first feature or limit of `req` the adapter lacks. */
export function checkAdapter(req: Requirements, adapter: GPUAdapter): void {
  for (const f of req.features) {
    if (!adapter.features.has(f)) throw new PackageError(`the package needs the feature "${f}"; this adapter does not offer it`);
  }
  const offered = adapter.limits as unknown as Record<string, number | undefined>;
  for (const [name, want] of Object.entries(req.limits)) {
    const have = offered[name];
    if (typeof have !== 'number') throw new PackageError(`the package needs the limit ${name}, which this adapter does not know`);
    // Alignment limits ("min...") are better when smaller; the others when larger.
    if (name.startsWith('min') ? want < have : want > have) {
      const op = name.startsWith('min') ? '<=' : '>=';
      const verb = name.startsWith('min') ? 'requires' : 'offers';
      throw new PackageError(`the package needs ${name} ${op} ${want}; this adapter ${verb} ${have}`);
    }
  }
}

/**
 * Loads a package: fetches it (for a URL), checks it, checks the adapter, creates the device,
 * the buffers, every pipeline (in parallel) and every bind group.
 */
export async function loadPackage(source: ArrayBuffer | Uint8Array | string | URL | ParsedPackage, options: LoadOptions = {}): Promise<Model> {
  const t0 = now();
  let pkg: ParsedPackage;
  if (typeof source === 'string' || source instanceof URL) {
    pkg = await parsePackage(await fetchBytes(source));
  } else if (ArrayBuffer.isView(source) || Object.prototype.toString.call(source) === '[object ArrayBuffer]') {
    pkg = await parsePackage(source as ArrayBuffer | Uint8Array);
  } else if (typeof source === 'object' && source !== null && 'manifest' in source && 'payload' in source) {
    pkg = source;
  } else {
    throw new TypeError('loadPackage takes the bytes of a package (ArrayBuffer, Uint8Array), its URL, or a parsed package');
  }
  const parseMs = now() - t0;
  const gpu = options.gpu ?? (globalThis.navigator as Navigator | undefined)?.gpu;
  if (!gpu) throw new Error("WebGPU is not available: pass options.gpu (in Node, create([]) from the 'webgpu' package)");
  const adapter = options.adapter ?? await gpu.requestAdapter(options.powerPreference ? { powerPreference: options.powerPreference } : {});
  if (!adapter) throw new Error('WebGPU is available but no adapter was found (requestAdapter returned null)');
  const req = pkg.manifest.requirements;
  checkAdapter(req, adapter);
  // optional features: those of the kernels' variants the adapter offers
  const features = new Set<string>(req.features);
  if (options.variants !== false) {
    for (const k of pkg.manifest.kernels) {
      for (const v of k.variants) {
        if (v.features.every((f) => adapter.features.has(f))) v.features.forEach((f) => features.add(f));
      }
    }
  }
  let device: GPUDevice;
  try {
    device = await adapter.requestDevice({
      label: `chroma ${pkg.contentHash.slice(0, 12)}`,
      requiredFeatures: [...features] as GPUFeatureName[],
      requiredLimits: req.limits,
    });
  } catch (e) {
    throw new PackageError(`the adapter refused a device with the package's requirements: ${(e as Error).message}`);
  }
  try {
    return await Model.create(pkg, adapter, device, t0, parseMs);
  } catch (e) {
    device.destroy();
    throw e;
  }
}

async function fetchBytes(url: string | URL): Promise<Uint8Array> {
  let u: URL;
  try {
    u = new URL(url, (globalThis as { location?: { href: string } }).location?.href);
  } catch {
    throw new Error(`loadPackage: ${JSON.stringify(String(url))} is not a URL (in Node, read the file and pass its bytes)`);
  }
  if (u.protocol === 'file:' && typeof (globalThis as { window?: unknown }).window === 'undefined') {
    throw new Error(`loadPackage cannot fetch ${u.href}: read the file (fs.readFile) and pass its bytes`);
  }
  const res = await globalThis.fetch(u);
  if (!res.ok) throw new Error(`fetching ${u.href} failed: HTTP ${res.status} ${res.statusText}`);
  return new Uint8Array(await res.arrayBuffer());
}

/** A loaded package, ready to run. Calls are serialized: one runs at a time. */
export class Model {
  readonly package: ParsedPackage;
  readonly device: GPUDevice;
  readonly info: ModelInfo;
  readonly inputs: readonly IOTensor[];
  readonly outputs: readonly IOTensor[];

  #arena: GPUBuffer;
  #state: GPUBuffer | null;
  #staging: GPUBuffer;
  #buffers: GPUBuffer[];
  #pipelines: GPUComputePipeline[];
  #bindGroups: GPUBindGroup[];
  /** Byte offset of each output in the staging buffer (after the status block). */
  #stagingOffsets: number[];
  #chain: Promise<unknown> = Promise.resolve();
  #lost: GPUDeviceLostInfo | null = null;
  #destroyed = false;
  #uncaptured: string[] = [];

  private constructor(pkg: ParsedPackage, device: GPUDevice, r: Resources, info: ModelInfo) {
    this.package = pkg;
    this.device = device;
    this.info = info;
    this.inputs = pkg.manifest.inputs;
    this.outputs = pkg.manifest.outputs;
    this.#arena = r.arena;
    this.#state = r.state;
    this.#staging = r.staging;
    this.#buffers = r.buffers;
    this.#pipelines = r.pipelines;
    this.#bindGroups = r.bindGroups;
    this.#stagingOffsets = r.stagingOffsets;
    void device.lost.then((lost) => { this.#lost = lost; });
    device.addEventListener('uncapturederror', (ev) => {
      this.#uncaptured.push((ev as GPUUncapturedErrorEvent).error.message);
    });
  }

  /** @internal Creates the resources of a package on a new device (loadPackage's second half). */
  static async create(pkg: ParsedPackage, adapter: GPUAdapter, device: GPUDevice, t0: number, parseMs: number): Promise<Model> {
    const r = await createResources(pkg, device);
    const m = pkg.manifest;
    const a = adapter.info ?? ({} as Partial<GPUAdapterInfo>);
    const limits: Record<string, number> = {};
    for (const k of Object.keys(m.requirements.limits)) limits[k] = (device.limits as unknown as Record<string, number>)[k]!;
    const info: ModelInfo = {
      adapter: { vendor: a.vendor ?? '', architecture: a.architecture ?? '', device: a.device ?? '', description: a.description ?? '' },
      contentHash: pkg.contentHash,
      compilerVersion: m.compiler_version,
      loadMs: now() - t0,
      parseMs,
      warmupMs: r.warmupMs,
      kernels: m.kernels.length,
      dispatches: m.dispatches.length,
      pipelines: r.pipelines.length,
      bufferBytes: r.bytes,
      features: [...device.features],
      limits,
    };
    return new Model(pkg, device, r, info);
  }

  /**
   * Runs the package once. `inputs` maps each input's name to its typed array (or lists them
   * in the manifest's order): Float32Array for float32, Int32Array for int32, BigInt64Array
   * for int64 (values must fit in int32), Uint8Array for bool and uint8.
   */
  run(inputs: Record<string, TensorData> | TensorData[]): Promise<RunResult> {
    const call = this.#chain.then(() => this.#run(inputs));
    this.#chain = call.catch(() => undefined);
    return call;
  }

  /**
   * Runs the golden inputs and compares the outputs with the golden outputs. The golden outputs
   * were computed from the initial state, so the state is reset first (see resetState).
   */
  async selfCheck(): Promise<SelfCheckResult> {
    const call = this.#chain.then(() => {
      this.resetState();
      return this.#run(goldenInputs(this.package));
    });
    this.#chain = call.catch(() => undefined);
    const { outputs, ms } = await call;
    const golden = goldenOutputs(this.package);
    const tolerance = this.package.manifest.golden.tolerance;
    const strides = new Map(this.package.manifest.golden.outputs.map((g) => [g.name, g.stride]));
    const checks = this.outputs.map((o) =>
      compareOutput(o.name, o.dtype, sampleOutput(outputs[o.name]!, strides.get(o.name) ?? 1), golden[o.name]!, tolerance));
    return {
      ok: checks.every((c) => c.ok),
      maxError: checks.reduce((x, c) => Math.max(x, c.maxError), 0),
      tolerance: { ...tolerance },
      outputs: checks,
      ms,
    };
  }

  /**
   * Puts every state tensor back to its initial value (e.g. an empty KV cache), for the calls
   * submitted after this one.
   */
  resetState(): void {
    this.#usable();
    if (!this.#state) return;
    this.device.queue.writeBuffer(this.#state, 0, initialState(this.package));
  }

  /** Frees the GPU buffers and the device; later calls fail. */
  destroy(): void {
    if (this.#destroyed) return;
    this.#destroyed = true;
    for (const b of this.#buffers) b.destroy();
    this.device.destroy();
  }

  #usable(): void {
    if (this.#destroyed) throw new RunError('the model was destroyed');
    if (this.#lost) throw new RunError(`the GPU device was lost (reason: ${this.#lost.reason}): ${this.#lost.message}`);
    if (this.#uncaptured.length > 0) {
      const errors = this.#uncaptured.splice(0);
      throw new RunError(`a GPU error occurred since the last call: ${errors.join('; ')}`);
    }
  }

  async #run(given: Record<string, TensorData> | TensorData[]): Promise<RunResult> {
    this.#usable();
    const words = this.#encodeInputs(given);
    const device = this.device;
    const t0 = now();
    device.pushErrorScope('out-of-memory');
    device.pushErrorScope('validation');
    let validation: Promise<GPUError | null>;
    let memory: Promise<GPUError | null>;
    try {
      this.inputs.forEach((spec, i) => {
        if (spec.bytes > 0) device.queue.writeBuffer(this.#arena, spec.offset, words[i]!);
      });
      device.queue.submit([this.#encode()]);
    } finally {
      validation = device.popErrorScope();
      memory = device.popErrorScope();
    }
    let status: Uint32Array;
    let raw: ArrayBuffer[];
    try {
      await this.#staging.mapAsync(MAP_READ);
      // One copy per output out of the mapping, so that each output owns its ArrayBuffer.
      const mapped = this.#staging.getMappedRange();
      status = new Uint32Array(mapped.slice(0, STATUS_BYTES));
      raw = this.outputs.map((o, i) => mapped.slice(this.#stagingOffsets[i]!, this.#stagingOffsets[i]! + o.bytes));
      this.#staging.unmap();
    } catch (e) {
      this.#usable();
      const errors = (await Promise.all([validation, memory])).filter((x) => x !== null);
      throw new RunError(`reading the outputs failed: ${errors.map((x) => x!.message).join('; ') || (e as Error).message}`);
    }
    for (const err of await Promise.all([validation, memory])) {
      if (err) throw new RunError(`the GPU reported an error during the call: ${err.message}`);
    }
    this.#checkStatus(status);
    const outputs: Record<string, TensorData> = {};
    this.outputs.forEach((o, i) => { outputs[o.name] = decodeOutput(o, raw[i]!); });
    return { outputs, ms: now() - t0 };
  }

  /** One command buffer: clear the status block, every dispatch in one pass, the readback copies. */
  #encode(): GPUCommandBuffer {
    const m = this.package.manifest;
    const enc = this.device.createCommandEncoder({ label: 'chroma run' });
    // A good call leaves word 0 at 0: clear the status block before the dispatches.
    enc.clearBuffer(this.#arena, m.arena.status_offset, STATUS_BYTES);
    const pass = enc.beginComputePass({ label: 'chroma schedule' });
    let current = -1;
    m.dispatches.forEach((d, i) => {
      if (d.kernel !== current) pass.setPipeline(this.#pipelines[d.kernel]!);
      current = d.kernel;
      pass.setBindGroup(0, this.#bindGroups[i]!);
      pass.dispatchWorkgroups(d.grid[0], d.grid[1], d.grid[2]);
    });
    pass.end();
    enc.copyBufferToBuffer(this.#arena, m.arena.status_offset, this.#staging, 0, STATUS_BYTES);
    this.outputs.forEach((o, i) => {
      if (o.bytes > 0) enc.copyBufferToBuffer(this.#arena, o.offset, this.#staging, this.#stagingOffsets[i]!, o.bytes);
    });
    return enc.finish();
  }

  /** Checks the inputs' names, types and lengths; returns each input's arena words. */
  #encodeInputs(given: Record<string, TensorData> | TensorData[]): Uint8Array[] {
    const names = this.inputs.map((i) => i.name);
    if (Array.isArray(given)) {
      if (given.length !== this.inputs.length) {
        throw new RunError(`run() got ${given.length} inputs, the package takes ${this.inputs.length} (${names.join(', ')})`);
      }
      return this.inputs.map((spec, i) => encodeInput(spec, given[i], `input ${i} ("${spec.name}")`));
    }
    if (typeof given !== 'object' || given === null) throw new RunError('run() takes an object of inputs by name or an array of inputs');
    for (const k of Object.keys(given)) {
      if (!names.includes(k)) throw new RunError(`unknown input "${k}" (the package's inputs are ${names.join(', ') || 'none'})`);
    }
    return this.inputs.map((spec) => {
      if (!(spec.name in given)) throw new RunError(`missing input "${spec.name}" (the package's inputs are ${names.join(', ')})`);
      return encodeInput(spec, given[spec.name], `input "${spec.name}"`);
    });
  }

  /** Status block: word 0 nonzero = an index was out of range; word 1 = dispatch + 1; word 2 = index;
   * word 3 = the size of the dimension it indexes; word 4 = that dimension. */
  #checkStatus(status: Uint32Array): void {
    if (status[0] === 0) return;
    const index = status[1]! - 1;
    const badIndex = status[2]! | 0;
    const d = this.package.manifest.dispatches[index];
    if (!d) {
      throw new RunError(`a kernel reported an index out of range (${badIndex}), in an unknown dispatch (status word 1 is ${status[1]})`, { badIndex });
    }
    const site: DispatchSite = { index, label: d.label, node: d.node, source: d.source };
    const where = [d.label && `"${d.label}"`, d.node && `node ${d.node}`, d.source && `at ${d.source}`].filter(Boolean).join(', ');
    throw new RunError(`index ${badIndex} is out of range for dimension ${status[4]} of size ${status[3]} in dispatch ${index}${where ? ` (${where})` : ''}`, { dispatch: site, badIndex });
  }
}

interface Resources {
  arena: GPUBuffer;
  state: GPUBuffer | null;
  staging: GPUBuffer;
  buffers: GPUBuffer[];
  pipelines: GPUComputePipeline[];
  bindGroups: GPUBindGroup[];
  stagingOffsets: number[];
  warmupMs: number;
  bytes: ModelInfo['bufferBytes'];
}

/** The state buffer's initial contents: zeros, with each state tensor's init bytes in place. */
function initialState(pkg: ParsedPackage): Uint8Array {
  const s = pkg.manifest.state;
  const out = new Uint8Array(s.bytes);
  for (const t of s.tensors) out.set(pkg.payload.subarray(t.init, t.init + t.bytes), t.offset);
  return out;
}

/** A buffer filled from `data` at creation (no staging copy). */
function filledBuffer(device: GPUDevice, label: string, usage: number, data: Uint8Array): GPUBuffer {
  const buf = device.createBuffer({ label, size: data.byteLength, usage, mappedAtCreation: true });
  new Uint8Array(buf.getMappedRange()).set(data);
  buf.unmap();
  return buf;
}

async function createResources(pkg: ParsedPackage, device: GPUDevice): Promise<Resources> {
  const m = pkg.manifest;
  const payload = pkg.payload;
  device.pushErrorScope('out-of-memory');
  device.pushErrorScope('validation');
  const arena = device.createBuffer({ label: 'chroma arena', size: m.arena.bytes, usage: STORAGE | COPY_SRC | COPY_DST });
  const state = m.state.bytes > 0 ? filledBuffer(device, 'chroma state', STORAGE | COPY_SRC | COPY_DST, initialState(pkg)) : null;
  const shards = m.weights.shards.map((s, i) =>
    filledBuffer(device, `chroma weights shard ${i}`, STORAGE, payload.subarray(s.offset, s.offset + s.bytes)));
  const params = m.params.bytes > 0
    ? filledBuffer(device, 'chroma params', UNIFORM | COPY_DST, payload.subarray(m.params.offset, m.params.offset + m.params.bytes))
    : null;
  const stagingOffsets: number[] = [];
  let stagingBytes = STATUS_BYTES;
  for (const o of m.outputs) {
    stagingOffsets.push(stagingBytes);
    stagingBytes += o.bytes;
  }
  const staging = device.createBuffer({ label: 'chroma staging', size: stagingBytes, usage: MAP_READ | COPY_DST });
  const buffers = [arena, ...(state ? [state] : []), ...shards, ...(params ? [params] : []), staging];
  const weightBytes = m.weights.shards.reduce((x, s) => x + s.bytes, 0);
  await popScopes(device, 'creating the buffers');

  const t0 = now();
  const layouts = m.kernels.map((k, i) => createLayout(device, k, i));
  const pipelines = await Promise.all(m.kernels.map((k, i) => createPipeline(device, k, i, layouts[i]!)));
  const warmupMs = now() - t0;

  device.pushErrorScope('validation');
  const bindGroups = m.dispatches.map((d, i) => {
    const kernel = m.kernels[d.kernel]!;
    const entries: GPUBindGroupEntry[] = kernel.bindings.filter((b) => b.type === 'uniform')
      .map((b) => ({ binding: b.binding, resource: { buffer: params!, offset: d.params, size: b.bytes! } }));
    for (const b of d.bindings) {
      const buffer = b.buffer === 'arena' ? arena : b.buffer === 'state' ? state! : shards[b.shard!]!;
      entries.push({ binding: b.binding, resource: { buffer } });
    }
    return device.createBindGroup({ label: `dispatch ${i}: ${d.label}`, layout: layouts[d.kernel]!.group, entries });
  });
  await popScopes(device, 'creating the bind groups', 1);

  return {
    arena, state, staging, buffers, pipelines, bindGroups, stagingOffsets, warmupMs,
    bytes: {
      arena: m.arena.bytes, state: m.state.bytes, weights: weightBytes, params: m.params.bytes, staging: stagingBytes,
      total: m.arena.bytes + m.state.bytes + weightBytes + m.params.bytes + stagingBytes,
    },
  };
}

async function popScopes(device: GPUDevice, what: string, n = 2): Promise<void> {
  const errors: GPUError[] = [];
  for (let i = 0; i < n; i++) {
    const e = await device.popErrorScope();
    if (e) errors.push(e);
  }
  if (errors.length > 0) throw new PackageError(`${what} failed: ${errors.map((e) => e.message).join('; ')}`);
}

interface KernelLayout {
  module: GPUShaderModule;
  group: GPUBindGroupLayout;
  pipeline: GPUPipelineLayout;
  /** Validation errors of the shader module, if any (read when its pipeline fails). */
  moduleError: Promise<GPUError | null>;
}

/** The kernel's text for this device: its first variant whose features the device has, else its code. */
export function kernelCode(device: GPUDevice, k: Kernel): string {
  for (const v of k.variants) {
    if (v.features.every((f) => device.features.has(f))) return v.code;
  }
  return k.code;
}

/** The shader module and the explicit bind group layout of a kernel, from its binding list. */
function createLayout(device: GPUDevice, k: Kernel, i: number): KernelLayout {
  device.pushErrorScope('validation');
  const module = device.createShaderModule({ label: `kernel ${i} (${k.name})`, code: kernelCode(device, k) });
  const moduleError = device.popErrorScope();
  const group = device.createBindGroupLayout({
    label: `kernel ${i} (${k.name})`,
    entries: k.bindings.map((b): GPUBindGroupLayoutEntry => ({
      binding: b.binding,
      visibility: SHADER_COMPUTE,
      buffer: b.type === 'uniform' ? { type: 'uniform', minBindingSize: b.bytes! } : { type: b.type },
    })),
  });
  const pipeline = device.createPipelineLayout({ label: `kernel ${i} (${k.name})`, bindGroupLayouts: [group] });
  return { module, group, pipeline, moduleError };
}

/** A compute pipeline; a failure names the kernel and gives the compiler's messages. */
async function createPipeline(device: GPUDevice, k: Kernel, i: number, layout: KernelLayout): Promise<GPUComputePipeline> {
  try {
    return await device.createComputePipelineAsync({
      label: `kernel ${i} (${k.name})`,
      layout: layout.pipeline,
      compute: { module: layout.module, entryPoint: k.entry },
    });
  } catch (e) {
    let detail = (e as Error).message;
    try {
      const info = await layout.module.getCompilationInfo();
      const errs = info.messages.filter((x) => x.type === 'error').map((x) => `${x.lineNum}:${x.linePos}: ${x.message}`);
      if (errs.length > 0) detail = errs.join('; ');
      else detail = (await layout.moduleError)?.message ?? detail;
    } catch { /* keep the pipeline's own message */ }
    throw new PackageError(`kernel ${i} (${k.name}) does not compile: ${detail.trim()}`);
  }
}
