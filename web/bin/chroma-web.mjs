#!/usr/bin/env node
// chroma-web: inspect and check .chroma-web packages from the command line (Node + Dawn).
//
//   node bin/chroma-web.mjs describe FILE    checks the file (format, digest, manifest) and describes it
//   node bin/chroma-web.mjs check [--no-variants] FILE...
//                                            loads each file on Dawn and runs its self-check;
//                                            prints one JSON line per file, exits 1 if any fails
//                                            (--no-variants: every kernel's portable code, not
//                                            its subgroup variant)
//
// Build first (npm run build). `check` needs the 'webgpu' package (a dev dependency) and a
// Vulkan driver Dawn accepts; on the project's machines, SwiftShader from Debian's chromium.

import { existsSync, readFileSync } from 'node:fs';
import { describePackage, loadPackage, parsePackage } from '../dist/index.js';

const SWIFTSHADER_ICD = '/usr/lib/chromium/vk_swiftshader_icd.json';

async function dawn() {
  if (!process.env.VK_ICD_FILENAMES && existsSync(SWIFTSHADER_ICD)) process.env.VK_ICD_FILENAMES = SWIFTSHADER_ICD;
  const { create, globals } = await import('webgpu');
  Object.assign(globalThis, globals);
  // Kept on globalThis: Dawn segfaults if this object is garbage-collected.
  return (globalThis.__chromaDawnGpu ??= create([]));
}

async function main(argv) {
  const [command, ...rest] = argv;
  const variants = !rest.includes('--no-variants');
  const files = rest.filter((a) => a !== '--no-variants');
  if (!['describe', 'check'].includes(command) || files.length === 0) {
    console.error('usage: chroma-web describe FILE | chroma-web check [--no-variants] FILE...');
    return 2;
  }
  if (command === 'describe') {
    for (const f of files) console.log(describePackage(await parsePackage(readFileSync(f))));
    return 0;
  }
  const gpu = await dawn();
  let failed = 0;
  for (const f of files) {
    try {
      const model = await loadPackage(readFileSync(f), { gpu, variants });
      const check = await model.selfCheck();
      const { loadMs, warmupMs, adapter } = model.info;
      console.log(JSON.stringify({
        file: f, ok: check.ok, maxError: check.maxError, tolerance: check.tolerance, runMs: check.ms, loadMs, warmupMs,
        adapter: adapter.description || adapter.architecture, features: model.info.features,
        failed: check.outputs.filter((o) => !o.ok).map((o) => ({ ...o, first: o.first && { ...o.first, got: String(o.first.got), expected: String(o.first.expected) } })),
      }));
      if (!check.ok) failed++;
      model.destroy();
    } catch (e) {
      console.log(JSON.stringify({ file: f, ok: false, error: `${e.name}: ${e.message}` }));
      failed++;
    }
  }
  return failed > 0 ? 1 : 0;
}

main(process.argv.slice(2)).then((code) => process.exit(code), (e) => {
  console.error(`${e.name}: ${e.message}`);
  process.exit(1);
});
