// One task of bench/webgpu.py in Node on Dawn (the `webgpu` npm package):
//   VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json node bench/webgpu/dawn.mjs TASK.json RESULT.json
// Runs Chroma's package through chroma-web (web/dist) with the same harness as the page.
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { create, globals } from 'webgpu';
import { guarded, instrument, runChroma } from './harness.mjs';

const [taskPath, outPath] = process.argv.slice(2);
const task = JSON.parse(fs.readFileSync(taskPath, 'utf8'));
instrument(globals);
globalThis.gpu = create([]);  // keep a reference: Dawn crashes if it is garbage-collected

const file = (p) => fs.readFileSync(p);
const result = await guarded(task, async () => {
  const chroma = await import(pathToFileURL(path.join(task.chromaWeb, 'index.js')).href);
  const inputBytes = new Uint8Array(file(task.paths.input)).buffer;
  const refOutput = new Float32Array(new Uint8Array(file(task.paths.ref)).buffer);
  const t0 = performance.now();
  const packageBytes = new Uint8Array(file(task.paths.package));
  const fetchMs = performance.now() - t0;
  const r = await runChroma(task, { chroma, gpu: globalThis.gpu, packageBytes, inputBytes, refOutput });
  r.fetchMs = fetchMs;
  r.nodeVersion = process.version;
  return r;
});
fs.writeFileSync(outPath, JSON.stringify(result));
process.exit(0);
