// The shared WebGPU entry point of the Node tests: Dawn (the 'webgpu' package).
// On the project's machines that is SwiftShader, from Debian's chromium (Dawn rejects Mesa's
// lavapipe). Dawn segfaults if its GPU object is garbage-collected, so it is kept on
// globalThis for the life of the process.

import { existsSync } from 'node:fs';
import { create, globals } from 'webgpu';

// SwiftShader's Vulkan ICD from Debian's chromium, unless the caller chose another driver.
// The Vulkan loader reads the variable when Dawn creates its instance, i.e. in create().
const SWIFTSHADER_ICD = '/usr/lib/chromium/vk_swiftshader_icd.json';
if (!process.env.VK_ICD_FILENAMES && existsSync(SWIFTSHADER_ICD)) process.env.VK_ICD_FILENAMES = SWIFTSHADER_ICD;

Object.assign(globalThis, globals);

/** Dawn's GPU object (one per process). */
export const gpu = (globalThis.__chromaDawnGpu ??= create([]));

/** Dawn's validation-only backend: compiles and validates, runs nothing. */
export function nullGpu() {
  return (globalThis.__chromaDawnNullGpu ??= create(['backend=null']));
}
