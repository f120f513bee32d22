// The Chromium side of bench/webgpu.py: browser.mjs opens page.html and calls benchRun(task).
// The WebGPU prototypes are wrapped (harness.mjs) before any system's module is imported.
import { guarded, instrument, runChroma, runKuma, runOrt } from './harness.mjs';

instrument(globalThis);

async function bytesOf(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`fetching ${url}: HTTP ${r.status}`);
  return new Uint8Array(await r.arrayBuffer());
}

globalThis.benchRun = (task) => guarded(task, async () => {
  if (!navigator.gpu && task.system !== 'ort-wasm') throw new Error('navigator.gpu is missing (WebGPU not enabled)');
  const inputBytes = (await bytesOf(task.files.input)).buffer;
  const refOutput = new Float32Array((await bytesOf(task.files.ref)).buffer);
  const t0 = performance.now();
  let result;
  if (task.system === 'chroma') {
    const chroma = await import('/chroma-web/index.js');
    const packageBytes = await bytesOf(task.files.package);
    const fetchMs = performance.now() - t0;
    result = await runChroma(task, { chroma, gpu: navigator.gpu, packageBytes, inputBytes, refOutput });
    result.fetchMs = fetchMs;
  } else if (task.system === 'ort-webgpu' || task.system === 'ort-wasm') {
    const ort = await import(task.system === 'ort-webgpu' ? '/ort/ort.webgpu.min.mjs' : '/ort/ort.wasm.min.mjs');
    const modelBytes = await bytesOf(task.files.onnx);
    const fetchMs = performance.now() - t0;
    result = await runOrt(task, { ort, modelBytes, inputBytes, refOutput, wasmPaths: '/ort/' });
    result.fetchMs = fetchMs;
  } else if (task.system === 'kuma') {
    const kuma = await import('/kuma/index.js');
    const packageBytes = await bytesOf(task.files.kuma);
    const fetchMs = performance.now() - t0;
    result = await runKuma(task, { kuma, packageBytes, inputBytes, refOutput });
    result.fetchMs = fetchMs;
  } else {
    throw new Error(`unknown system ${task.system}`);
  }
  if (navigator.gpu) {
    try {
      const a = await navigator.gpu.requestAdapter();
      result.adapterInfo = a ? { vendor: a.info.vendor, architecture: a.info.architecture, device: a.info.device, description: a.info.description } : null;
    } catch { /* ignore */ }
  }
  result.userAgent = navigator.userAgent;
  result.hardwareConcurrency = navigator.hardwareConcurrency;
  return result;
});

globalThis.benchReady = true;
