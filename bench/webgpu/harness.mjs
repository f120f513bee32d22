// The measuring side of bench/webgpu.py, shared by the Chromium page (page.mjs) and Node on
// Dawn (dawn.mjs). Plain ES module: no DOM and no Node APIs, so both can import it.
//
// instrument(G) wraps WebGPU's prototypes (G: globalThis in a browser, the `globals` of the
// `webgpu` npm package in Node) to count what every system does through the API: dispatches,
// compute passes, submits, pipelines, shader modules, bind groups, and the bytes of live GPU
// buffers (createBuffer minus destroy; the peak is kept). The counts are the same for every
// system because they come from the API, not from a system's own bookkeeping.
//
// Each run*() function returns one result object (see bench/webgpu.py for the fields):
// load time, first call, then timed calls GPU-only (the work submitted, then
// queue.onSubmittedWorkDone(); outputs left on the GPU) and with readback (the outputs in a
// typed array), the per-call counts of one call, peak buffer bytes and the largest error
// against the eager PyTorch output.

const now = () => globalThis.performance.now();

export const stats = {
  dispatches: 0, indirectDispatches: 0, passes: 0, submits: 0, pipelines: 0, shaderModules: 0,
  bindGroups: 0, buffers: 0, liveBytes: 0, peakBytes: 0, writeBytes: 0, mapReads: 0,
  devices: [],
  /** When set (by runChroma), the objects the runtime creates, in creation order. */
  capture: null,
};

let installed = false;

/** Wraps G's WebGPU prototypes once; returns `stats`. */
export function instrument(G) {
  if (installed) return stats;
  installed = true;
  const sizes = new WeakMap();
  const wrap = (cls, name, make) => {
    const proto = G[cls]?.prototype;
    if (!proto || typeof proto[name] !== 'function') return;
    const orig = proto[name];
    proto[name] = make(orig);
  };
  wrap('GPUAdapter', 'requestDevice', (orig) => async function (...a) {
    const d = await orig.apply(this, a);
    stats.devices.push(d);
    return d;
  });
  wrap('GPUDevice', 'createBuffer', (orig) => function (desc) {
    const b = orig.call(this, desc);
    const size = Number(desc?.size ?? 0);
    sizes.set(b, size);
    stats.buffers++;
    stats.liveBytes += size;
    if (stats.liveBytes > stats.peakBytes) stats.peakBytes = stats.liveBytes;
    if (stats.capture && desc?.label === 'chroma arena') stats.capture.arena = b;
    return b;
  });
  wrap('GPUBuffer', 'destroy', (orig) => function (...a) {
    const size = sizes.get(this);
    if (size !== undefined) {
      sizes.delete(this);
      stats.liveBytes -= size;
    }
    return orig.apply(this, a);
  });
  wrap('GPUBuffer', 'mapAsync', (orig) => function (...a) {
    stats.mapReads++;
    return orig.apply(this, a);
  });
  wrap('GPUDevice', 'createShaderModule', (orig) => function (...a) {
    stats.shaderModules++;
    return orig.apply(this, a);
  });
  wrap('GPUDevice', 'createComputePipeline', (orig) => function (...a) {
    stats.pipelines++;
    const p = orig.apply(this, a);
    if (stats.capture) stats.capture.pipelines.push(p);
    return p;
  });
  wrap('GPUDevice', 'createComputePipelineAsync', (orig) => function (...a) {
    stats.pipelines++;
    const p = orig.apply(this, a);
    if (stats.capture) stats.capture.pipelines.push(p);
    return p;
  });
  wrap('GPUDevice', 'createBindGroup', (orig) => function (...a) {
    stats.bindGroups++;
    const g = orig.apply(this, a);
    if (stats.capture) stats.capture.bindGroups.push(g);
    return g;
  });
  wrap('GPUCommandEncoder', 'beginComputePass', (orig) => function (...a) {
    stats.passes++;
    return orig.apply(this, a);
  });
  wrap('GPUComputePassEncoder', 'dispatchWorkgroups', (orig) => function (...a) {
    stats.dispatches++;
    return orig.apply(this, a);
  });
  wrap('GPUComputePassEncoder', 'dispatchWorkgroupsIndirect', (orig) => function (...a) {
    stats.indirectDispatches++;
    return orig.apply(this, a);
  });
  wrap('GPUQueue', 'submit', (orig) => function (...a) {
    stats.submits++;
    return orig.apply(this, a);
  });
  wrap('GPUQueue', 'writeBuffer', (orig) => function (buffer, offset, data, dataOffset, size) {
    stats.writeBytes += size ?? (data?.byteLength ?? 0);
    return orig.apply(this, [buffer, offset, data, ...(dataOffset === undefined ? [] : [dataOffset]), ...(size === undefined ? [] : [size])]);
  });
  return stats;
}

const COUNTERS = ['dispatches', 'indirectDispatches', 'passes', 'submits', 'pipelines', 'shaderModules', 'bindGroups', 'buffers', 'writeBytes', 'mapReads'];

function snapshot() {
  const s = {};
  for (const k of COUNTERS) s[k] = stats[k];
  return s;
}

function delta(a, b) {
  const d = {};
  for (const k of COUNTERS) d[k] = b[k] - a[k];
  return d;
}

/** Runs `fn` once and returns what it did through the API. */
async function counted(fn) {
  const a = snapshot();
  const t0 = now();
  const r = await fn();
  const ms = now() - t0;
  return { ms, counts: delta(a, snapshot()), result: r };
}

export function median(xs) {
  if (!xs.length) return null;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/**
 * Number of timed calls per mode: task.calls, fewer when a call is slow (about task.budgetMs
 * per mode), but at least 3 (2 above 5 s per call, 1 above 20 s).
 */
function callsFor(task, estimateMs) {
  const calls = task.calls ?? 20;
  const budget = task.budgetMs ?? 10000;
  const min = estimateMs > 20000 ? 1 : estimateMs > 5000 ? 2 : 3;
  return Math.max(min, Math.min(calls, Math.floor(budget / Math.max(estimateMs, 0.01))));
}

/**
 * Timed calls of each mode, in rounds (each mode's calls of a round back to back, the modes
 * taking turns) so that drift of the machine hits every mode. The first timed call of each
 * mode is also counted (what it did through the API): counts[mode].
 */
async function timeModes(task, modes, estimateMs) {
  const n = callsFor(task, estimateMs);
  const samples = {};
  const counts = {};
  for (const name of Object.keys(modes)) samples[name] = [];
  const rounds = Math.min(n, task.rounds ?? 2);
  for (let r = 0; r < rounds; r++) {
    const per = Math.floor(n / rounds) + (r < n % rounds ? 1 : 0);
    for (const [name, fn] of Object.entries(modes)) {
      for (let i = 0; i < per; i++) {
        if (!counts[name]) {
          const c = await counted(fn);
          counts[name] = c.counts;
          samples[name].push(c.ms);
          continue;
        }
        const t0 = now();
        await fn();
        samples[name].push(now() - t0);
      }
    }
  }
  return { samples, counts };
}

/**
 * Untimed warm-up calls after the first call: task.warmup of them, fewer once they have taken a
 * quarter of the budget, none when the first call alone took more than the budget.
 */
async function warmUp(task, fn, firstMs) {
  const out = [];
  const budget = task.budgetMs ?? 10000;
  if (firstMs > budget) return out;
  let spent = 0;
  for (let i = 0; i < (task.warmup ?? 3) && (i === 0 || spent < budget / 4); i++) {
    const t0 = now();
    await fn();
    const ms = now() - t0;
    out.push(ms);
    spent += ms;
  }
  return out;
}

/** Largest |got - ref| (NaN where they differ in NaN-ness), and the largest |ref|. */
export function compare(got, ref) {
  if (!got || !ref) return { maxAbsError: null, refMaxAbs: null, note: 'no output' };
  if (got.length !== ref.length) return { maxAbsError: null, refMaxAbs: null, note: `output has ${got.length} elements, expected ${ref.length}` };
  let err = 0;
  let big = 0;
  let nan = 0;
  for (let i = 0; i < ref.length; i++) {
    const r = Number(ref[i]);
    const g = Number(got[i]);
    if (Number.isNaN(g) !== Number.isNaN(r)) { nan++; continue; }
    const e = Math.abs(g - r);
    if (e > err) err = e;
    const a = Math.abs(r);
    if (a > big) big = a;
  }
  const out = { maxAbsError: err, refMaxAbs: big };
  if (nan) out.note = `${nan} elements NaN on one side only`;
  return out;
}

export function typedInput(task, bytes, kind) {
  // kind: 'native' (the dtype itself), 'f32' (Kuma takes Float32Array only)
  const dt = task.input.dtype;
  if (kind === 'f32' && dt !== 'float32') {
    const src = dt === 'int64' ? new BigInt64Array(bytes) : new Int32Array(bytes);
    return Float32Array.from(src, (v) => Number(v));
  }
  if (dt === 'float32') return new Float32Array(bytes);
  if (dt === 'int64') return new BigInt64Array(bytes);
  if (dt === 'int32') return new Int32Array(bytes);
  throw new Error(`input dtype ${dt} is not handled by the harness`);
}

function memory() {
  return { liveBytes: stats.liveBytes, peakBytes: stats.peakBytes, totals: snapshot() };
}

function baseResult(task) {
  return { system: task.system, model: task.model, ok: false };
}

/**
 * The fixed cost of waiting for the GPU on this implementation, whatever the work: an empty
 * submit then onSubmittedWorkDone, and a 256-byte copy mapped back (median of 7 each).
 */
export async function syncFloor(device) {
  const done = [];
  const map = [];
  for (let i = 0; i < 7; i++) {
    const t0 = now();
    device.queue.submit([]);
    await device.queue.onSubmittedWorkDone();
    done.push(now() - t0);
  }
  const src = device.createBuffer({ size: 256, usage: 0x4 | 0x8 | 0x80 });  // COPY_SRC | COPY_DST | STORAGE
  const dst = device.createBuffer({ size: 256, usage: 0x1 | 0x8 });  // MAP_READ | COPY_DST
  for (let i = 0; i < 7; i++) {
    const t0 = now();
    const enc = device.createCommandEncoder();
    enc.copyBufferToBuffer(src, 0, dst, 0, 256);
    device.queue.submit([enc.finish()]);
    await dst.mapAsync(0x1);
    dst.unmap();
    map.push(now() - t0);
  }
  // One workgroup of a one-line kernel: the fixed cost of a submit that does run a dispatch.
  const module = device.createShaderModule({ code: '@group(0) @binding(0) var<storage, read_write> b: array<u32>;\n@compute @workgroup_size(1) fn main() { b[0] = b[0] + 1u; }' });
  const pipeline = device.createComputePipeline({ layout: 'auto', compute: { module, entryPoint: 'main' } });
  const group = device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries: [{ binding: 0, resource: { buffer: src } }] });
  const tiny = [];
  for (let i = 0; i < 7; i++) {
    const t0 = now();
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, group);
    pass.dispatchWorkgroups(1);
    pass.end();
    device.queue.submit([enc.finish()]);
    await device.queue.onSubmittedWorkDone();
    tiny.push(now() - t0);
  }
  src.destroy();
  dst.destroy();
  return { submitDoneMs: median(done), mapReadMs: median(map), trivialDispatchMs: median(tiny),
    submitDoneSamples: done, mapReadSamples: map, trivialDispatchSamples: tiny };
}

async function settle() {
  for (const d of stats.devices) {
    try { await d.queue.onSubmittedWorkDone(); } catch { /* a destroyed device */ }
  }
}

// ---------------------------------------------------------------------------------------
// Chroma: the package through chroma-web's loadPackage / run.
// ---------------------------------------------------------------------------------------

/**
 * GPU-only: the runtime's own pipelines and bind groups (captured as it created them) replayed
 * as its run() encodes them (input upload, status-block clear, one pass, one submit), without
 * the staging copy, mapAsync and decode; then onSubmittedWorkDone.
 */
function chromaGpuOnly(model, cap, encodeInput, inputs) {
  const m = model.package.manifest;
  const device = model.device;
  const words = model.inputs.map((spec, i) => encodeInput(spec, inputs[i], spec.name));
  let current = -1;
  return async () => {
    model.inputs.forEach((spec, i) => { if (spec.bytes > 0) device.queue.writeBuffer(cap.arena, spec.offset, words[i]); });
    const enc = device.createCommandEncoder({ label: 'bench gpu-only' });
    enc.clearBuffer(cap.arena, m.arena.status_offset, 256);
    const pass = enc.beginComputePass();
    current = -1;
    m.dispatches.forEach((d, i) => {
      if (d.kernel !== current) pass.setPipeline(cap.pipelines[d.kernel]);
      current = d.kernel;
      pass.setBindGroup(0, cap.bindGroups[i]);
      pass.dispatchWorkgroups(d.grid[0], d.grid[1], d.grid[2]);
    });
    pass.end();
    device.queue.submit([enc.finish()]);
    await device.queue.onSubmittedWorkDone();
  };
}

/**
 * Each dispatch of the schedule alone (its own pass and submit, then onSubmittedWorkDone),
 * after the inputs are uploaded: where a call's time goes. Includes one submit's fixed cost per
 * dispatch (see syncFloor's trivialDispatchMs).
 */
async function chromaProfile(model, cap, encodeInput, inputs) {
  const m = model.package.manifest;
  const device = model.device;
  model.inputs.forEach((spec, i) => {
    if (spec.bytes > 0) device.queue.writeBuffer(cap.arena, spec.offset, encodeInput(spec, inputs[i], spec.name));
  });
  await device.queue.onSubmittedWorkDone();
  const out = [];
  for (let i = 0; i < m.dispatches.length; i++) {
    const d = m.dispatches[i];
    const t0 = now();
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(cap.pipelines[d.kernel]);
    pass.setBindGroup(0, cap.bindGroups[i]);
    pass.dispatchWorkgroups(d.grid[0], d.grid[1], d.grid[2]);
    pass.end();
    device.queue.submit([enc.finish()]);
    await device.queue.onSubmittedWorkDone();
    out.push(now() - t0);
  }
  return out;
}

/**
 * Each kernel's pipeline created again, one at a time (a comment appended to the WGSL so that no
 * cache answers): which kernels the warm-up spends its time on.
 */
async function chromaPipelineTimes(model) {
  const device = model.device;
  const out = [];
  for (const k of model.package.manifest.kernels) {
    const t0 = now();
    const module = device.createShaderModule({ code: `${k.code}\n// bench: compiled again\n` });
    await device.createComputePipelineAsync({ layout: 'auto', compute: { module, entryPoint: k.entry } });
    out.push(now() - t0);
  }
  return out;
}

/**
 * env: { chroma (the chroma-web module), gpu, packageBytes, inputBytes, refOutput }.
 */
export async function runChroma(task, env) {
  const res = baseResult(task);
  const { loadPackage, encodeInput } = env.chroma;
  stats.capture = { pipelines: [], bindGroups: [], arena: null };
  const loaded = await counted(() => loadPackage(env.packageBytes, { gpu: env.gpu }));
  const model = loaded.result;
  const cap = stats.capture;
  stats.capture = null;
  cap.pipelines = await Promise.all(cap.pipelines);
  const m = model.package.manifest;
  if (cap.pipelines.length !== m.kernels.length || cap.bindGroups.length !== m.dispatches.length || !cap.arena) {
    throw new Error(`could not capture the runtime's objects (${cap.pipelines.length} pipelines for ${m.kernels.length} kernels, ${cap.bindGroups.length} bind groups for ${m.dispatches.length} dispatches)`);
  }
  res.adapter = model.info.adapter;
  res.load = {
    wallMs: loaded.ms, loadMs: model.info.loadMs, parseMs: model.info.parseMs, warmupMs: model.info.warmupMs,
    counts: loaded.counts,
  };
  res.memoryAfterLoad = memory();
  const input = typedInput(task, env.inputBytes, 'native');
  const inputs = [input];
  const name = model.outputs[0].name;

  const first = await counted(() => model.run(inputs));
  res.firstCallMs = first.ms;
  res.perCall = first.counts;
  res.check = compare(first.result.outputs[name], env.refOutput);
  if (first.ms < 1000) {  // the package's self-check on its golden data: a slow model skips it
    const check = await model.selfCheck();
    res.selfCheck = { ok: check.ok, maxError: check.maxError, tolerance: check.tolerance };
  }

  res.runtimeMs = [];  // the runtime's own `ms` of each readback call, for comparison with the wall clock
  const readback = async () => { res.runtimeMs.push((await model.run(inputs)).ms); };
  const gpuOnly = chromaGpuOnly(model, cap, encodeInput, inputs);
  // Warm-up calls, then an estimate of one call for the call count.
  const warm = await warmUp(task, readback, first.ms);
  const timed = await timeModes(task, { gpuOnly, readback }, median(warm) ?? first.ms);
  res.samples = timed.samples;
  res.perCallGpuOnly = timed.counts.gpuOnly;
  res.warmupSamples = warm;
  await settle();
  res.memory = memory();
  res.info = {
    kernels: model.info.kernels, dispatches: model.info.dispatches, pipelines: model.info.pipelines,
    bufferBytes: model.info.bufferBytes, features: model.info.features,
  };
  res.floor = await syncFloor(model.device);
  if (task.profile !== false) {
    res.dispatchMs = await chromaProfile(model, cap, encodeInput, inputs);
    try {
      res.pipelineMs = await chromaPipelineTimes(model);
    } catch (e) {
      res.pipelineMsError = String(e?.message ?? e);
    }
  }
  model.destroy();
  res.ok = true;
  return res;
}

// ---------------------------------------------------------------------------------------
// ONNX Runtime Web: the WebGPU EP (outputs kept on the GPU; readback = getData) and the
// WASM EP.
// ---------------------------------------------------------------------------------------

export async function runOrt(task, env) {
  const res = baseResult(task);
  const ort = env.ort;
  const webgpu = task.ep === 'webgpu';
  ort.env.wasm.numThreads = task.wasmThreads ?? 1;
  if (env.wasmPaths) ort.env.wasm.wasmPaths = env.wasmPaths;
  ort.env.logLevel = 'warning';
  const options = { executionProviders: [webgpu ? 'webgpu' : 'wasm'], graphOptimizationLevel: 'all' };
  if (webgpu) options.preferredOutputLocation = 'gpu-buffer';
  const loaded = await counted(() => ort.InferenceSession.create(env.modelBytes, options));
  const session = loaded.result;
  res.load = { wallMs: loaded.ms, counts: loaded.counts };
  res.memoryAfterLoad = memory();
  res.ort = { version: ort.env.versions, inputNames: session.inputNames, outputNames: session.outputNames,
    wasmThreads: ort.env.wasm.numThreads, crossOriginIsolated: globalThis.crossOriginIsolated ?? null };
  const data = typedInput(task, env.inputBytes, 'native');
  const dims = task.input.shape;
  const tensorType = task.input.dtype;
  const feeds = () => ({ [session.inputNames[0]]: new ort.Tensor(tensorType, data, dims) });
  const outName = session.outputNames[0];
  const device = webgpu ? await ort.env.webgpu.device : null;

  const disposeAll = (outs) => { for (const t of Object.values(outs)) t.dispose?.(); };
  const readback = async () => {
    const outs = await session.run(feeds());
    const y = webgpu ? await outs[outName].getData() : outs[outName].data;
    if (webgpu) disposeAll(outs);
    return y;
  };
  const gpuOnly = async () => {
    const outs = await session.run(feeds());
    await device.queue.onSubmittedWorkDone();
    disposeAll(outs);
  };

  const first = await counted(readback);
  res.firstCallMs = first.ms;
  res.perCall = first.counts;
  res.check = compare(first.result, env.refOutput);
  const warm = await warmUp(task, readback, first.ms);
  const modes = webgpu ? { gpuOnly, readback } : { readback };
  const timed = await timeModes(task, modes, median(warm) ?? first.ms);
  res.samples = timed.samples;
  res.perCallGpuOnly = timed.counts.gpuOnly ?? null;
  res.perCallReadback = timed.counts.readback;
  res.warmupSamples = warm;
  await settle();
  res.memory = memory();
  if (webgpu) res.floor = await syncFloor(device);
  await session.release();
  res.ok = true;
  return res;
}

// ---------------------------------------------------------------------------------------
// Kuma: KumaModel.load / run (readback) / runToGpu + onSubmittedWorkDone (GPU-only).
// ---------------------------------------------------------------------------------------

export async function runKuma(task, env) {
  const res = baseResult(task);
  const { KumaModel } = env.kuma;
  const loaded = await counted(() => KumaModel.load(env.packageBytes.buffer.slice(
    env.packageBytes.byteOffset, env.packageBytes.byteOffset + env.packageBytes.byteLength)));
  const model = loaded.result;
  res.load = { wallMs: loaded.ms, counts: loaded.counts };
  res.memoryAfterLoad = memory();
  const spec = model.inputs[0];
  const data = typedInput(task, env.inputBytes, 'f32');
  const inputs = { [spec.name]: data };
  const device = model.gpuDevice;
  const outName = model.outputs[0].name;
  res.kuma = { inputs: model.inputs, outputs: model.outputs };

  const readback = async () => (await model.run(inputs))[outName];
  const gpuOnly = async () => {
    await model.runToGpu(inputs);
    await device.queue.onSubmittedWorkDone();
  };
  // The first call creates Kuma's pipelines (it compiles them lazily, one per kernel and
  // shape key): its cost over a steady call is Kuma's warm-up.
  const first = await counted(readback);
  res.firstCallMs = first.ms;
  res.firstCallCounts = first.counts;
  res.check = compare(first.result, env.refOutput);
  const again = await counted(readback);
  res.perCall = again.counts;
  const warm = await warmUp(task, readback, first.ms);
  const timed = await timeModes(task, { gpuOnly, readback }, median(warm) ?? first.ms);
  res.samples = timed.samples;
  res.perCallGpuOnly = timed.counts.gpuOnly;
  res.warmupSamples = warm;
  await settle();
  res.memory = memory();
  res.floor = await syncFloor(device);
  try { device.destroy(); } catch { /* ignore */ }
  res.ok = true;
  return res;
}

/** Wraps a run so that a failure becomes a result with the error. */
export async function guarded(task, fn) {
  try {
    return await fn();
  } catch (e) {
    return { system: task.system, model: task.model, ok: false, error: String(e?.stack ?? e).slice(0, 4000), memory: memory() };
  }
}
