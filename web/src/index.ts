// chroma-web: the runtime of Chroma's WebGPU packages (.chroma-web, format version 2, specified
// in docs/webgpu_package.md; FORMAT_VERSION in format.ts).
// One ES module for the browser and Node; nothing runs at import time.
//
//   const model = await loadPackage(url or bytes, { gpu });   // navigator.gpu, or Dawn's create([])
//   const { outputs, ms } = await model.run({ x: new Float32Array(6) });
//   const check = await model.selfCheck();                     // golden inputs vs golden outputs

export { PackageError, RunError } from './errors.js';
export type { DispatchSite } from './errors.js';
export { ALIGNMENT, DTYPES, FORMAT_VERSION, HEADER_SIZE, MAGIC, STATUS_BYTES, numel } from './format.js';
export type {
  BindingType, DType, DTypeInfo, Dispatch, DispatchBinding, GoldenTensor, IOTensor, Kernel,
  KernelBinding, KernelVariant, Manifest, ParsedPackage, Requirements, Shard, StateTensor, Storage, TensorData,
  Tolerance, WeightTensor,
} from './format.js';
export { parsePackage } from './parse.js';
export { checkAdapter, kernelCode, loadPackage, Model } from './model.js';
export type { LoadOptions, ModelInfo, RunResult, SelfCheckResult } from './model.js';
export { arrayTypeOf, compareOutput, decodeOutput, encodeInput, goldenInputs, goldenOutputs, goldenUniform, halfToFloat, readGolden, sampleOutput } from './tensors.js';
export type { OutputCheck } from './tensors.js';
export { describePackage } from './describe.js';
