// The `.chroma-web` format (docs/webgpu_package.md; its version: FORMAT_VERSION): constants and the manifest's
// types. The manifest types describe a manifest that `parsePackage` has already checked.

// The format's constants, one table for the three languages (scripts/gen_package_format.py).
export {
  ALIGNMENT, DEFAULT_LIMITS, FORMAT_VERSION, HEADER_SIZE, MAGIC, MAX_JSON_DEPTH, STATUS_BYTES, WORK_FLOOR, WORK_PER_WORD,
} from './package_format.js';
import { WORK_FLOOR, WORK_PER_WORD } from './package_format.js';

/** The tensor types of format version 2. */
export type DType = 'float32' | 'int32' | 'int64' | 'int16' | 'int8' | 'bool' | 'uint8' | 'float16' | 'bfloat16';
/**
 * How a tensor is stored on the GPU: 32-bit types one word per element (int64 narrowed to i32),
 * 8- and 16-bit types packed little-endian; every tensor padded to whole 32-bit words.
 */
export type Storage = 'f32' | 'i32' | 'i16' | 'i8' | 'u8' | 'f16' | 'bf16';

export interface DTypeInfo {
  /** The storage the format requires for this dtype in the arena. */
  storage: Storage;
  /** Bytes per element on the device. */
  storageBytes: number;
  /** Bytes per element in golden data (the dtype's own size). */
  goldenBytes: number;
  /** The typed array a caller passes and gets back. */
  arrayName: 'Float32Array' | 'Int32Array' | 'BigInt64Array' | 'Int16Array' | 'Int8Array' | 'Uint8Array' | 'Uint16Array';
  /** float16 and bfloat16: the caller's Uint16Array holds the bits (halfToFloat decodes them). */
  half?: boolean;
  float: boolean;
}

export const DTYPES: Readonly<Record<DType, DTypeInfo>> = {
  float32: { storage: 'f32', storageBytes: 4, goldenBytes: 4, arrayName: 'Float32Array', float: true },
  int32: { storage: 'i32', storageBytes: 4, goldenBytes: 4, arrayName: 'Int32Array', float: false },
  int64: { storage: 'i32', storageBytes: 4, goldenBytes: 8, arrayName: 'BigInt64Array', float: false },
  int16: { storage: 'i16', storageBytes: 2, goldenBytes: 2, arrayName: 'Int16Array', float: false },
  int8: { storage: 'i8', storageBytes: 1, goldenBytes: 1, arrayName: 'Int8Array', float: false },
  bool: { storage: 'u8', storageBytes: 1, goldenBytes: 1, arrayName: 'Uint8Array', float: false },
  uint8: { storage: 'u8', storageBytes: 1, goldenBytes: 1, arrayName: 'Uint8Array', float: false },
  float16: { storage: 'f16', storageBytes: 2, goldenBytes: 2, arrayName: 'Uint16Array', float: true, half: true },
  bfloat16: { storage: 'bf16', storageBytes: 2, goldenBytes: 2, arrayName: 'Uint16Array', float: true, half: true },
};

/** The bytes a tensor takes on the device: its elements in their storage, whole words. */
export function storageBytes(dtype: DType, shape: readonly number[]): number {
  return Math.ceil(numel(shape) * DTYPES[dtype].storageBytes / 4) * 4;
}

/** The typed arrays the runtime takes as inputs and returns as outputs. */
export type TensorData = Float32Array | Int32Array | BigInt64Array | Int16Array | Int8Array | Uint8Array | Uint16Array;

/**
 * The work bound (python/chroma/runtime/package.py applies the same rule): one dispatch
 * launches at most WORK_FLOOR invocations, or WORK_PER_WORD per 32-bit word of the arena and
 * the state if that is more. A generated kernel launches about one invocation per element it
 * writes; a grid far beyond that is a hostile or corrupt package that would hang the device.
 */
export function workLimit(arenaBytes: number, stateBytes: number): number {
  return Math.max(WORK_FLOOR, WORK_PER_WORD * Math.floor((arenaBytes + stateBytes) / 4));
}

export interface Requirements {
  features: string[];
  limits: Record<string, number>;
}

/** An input or output of a call: where it lives in the arena. */
export interface IOTensor {
  name: string;
  dtype: DType;
  shape: number[];
  storage: Storage;
  /** Byte offset in the arena. */
  offset: number;
  /** Bytes in the arena: 4 per element. */
  bytes: number;
}

export interface StateTensor {
  name: string;
  /** Byte offset in the state buffer. */
  offset: number;
  bytes: number;
  /** Offset of its initial bytes in the payload. */
  init: number;
}

export interface Shard {
  /** Offset in the payload. */
  offset: number;
  bytes: number;
}

export interface WeightTensor {
  name: string;
  dtype: string;
  shape: number[];
  shard: number;
  /** Byte offset inside the shard. */
  offset: number;
  bytes: number;
}

export type BindingType = 'uniform' | 'storage' | 'read-only-storage';

export interface KernelBinding {
  binding: number;
  type: BindingType;
  /** Size of the uniform block (uniform bindings only). */
  bytes?: number;
}

/** The same kernel written with optional device features (e.g. subgroup operations). */
export interface KernelVariant {
  features: string[];
  code: string;
}

export interface Kernel {
  name: string;
  code: string;
  entry: string;
  workgroup_size: [number, number, number];
  bindings: KernelBinding[];
  features: string[];
  /** Used instead of `code` when the device has all of a variant's features (the first such). */
  variants: KernelVariant[];
}

export interface DispatchBinding {
  binding: number;
  buffer: 'arena' | 'state' | 'weights';
  /** Shard index (weights only). */
  shard?: number;
}

export interface Dispatch {
  kernel: number;
  grid: [number, number, number];
  /** Byte offset of the dispatch's uniform values in the params buffer. */
  params: number;
  bindings: DispatchBinding[];
  label: string;
  node: string;
  source: string;
}

/** A golden tensor: in the payload, in its own dtype (int64 as 8 bytes, bool as 1). */
export interface GoldenTensor {
  name: string;
  dtype: DType;
  shape: number[];
  /** Offset in the payload (0 with no bytes for a generated input). */
  offset: number;
  bytes: number;
  /** A float32 input generated at load (goldenUniform) instead of stored. */
  generate?: { kind: 'uniform'; seed: number; low: number; high: number };
  /** An output stored every stride-th element (of the flattened tensor); 1: all of them. */
  stride: number;
}

export interface Tolerance {
  atol: number;
  rtol: number;
}

export interface Manifest {
  format: 'chroma.webgpu';
  version: 1;
  compiler_version: string;
  content_hash: string;
  requirements: Requirements;
  inputs: IOTensor[];
  outputs: IOTensor[];
  output_structure?: unknown;
  arena: { bytes: number; status_offset: number };
  state: { bytes: number; tensors: StateTensor[] };
  params: { offset: number; bytes: number };
  weights: { shards: Shard[]; tensors: WeightTensor[] };
  kernels: Kernel[];
  dispatches: Dispatch[];
  golden: { inputs: GoldenTensor[]; outputs: GoldenTensor[]; tolerance: Tolerance };
  stats?: Record<string, number>;
}

/** A package whose header, digest and manifest passed every check of `parsePackage`. */
export interface ParsedPackage {
  manifest: Manifest;
  /** The whole file. */
  bytes: Uint8Array;
  /** The payload section of `bytes` (manifest offsets are relative to its start). */
  payload: Uint8Array;
  /** Lowercase hex SHA-256 from the header (= `manifest.content_hash`). */
  contentHash: string;
  /** Format version from the header. */
  version: number;
}

export function numel(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}
