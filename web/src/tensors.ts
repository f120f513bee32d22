// Tensors between the caller and the GPU: typed arrays to the arena's storage and back, golden
// tensors from the payload, and the self-check's comparison.

import { PackageError, RunError } from './errors.js';
import { DTYPES, numel } from './format.js';
import type { DType, GoldenTensor, IOTensor, ParsedPackage, TensorData, Tolerance } from './format.js';

const ARRAYS = {
  Float32Array, Int32Array, BigInt64Array, Int16Array, Int8Array, Uint8Array, Uint16Array,
} as const;

const INT32_MIN = -2147483648n;
const INT32_MAX = 2147483647n;

/** The typed array type that holds a tensor of this dtype, e.g. 'Float32Array'. */
export function arrayTypeOf(dtype: DType): string {
  return DTYPES[dtype].arrayName;
}

/**
 * Encodes a caller's tensor as the arena stores it (docs/webgpu_package.md "Storage"): its
 * `spec.bytes` bytes, float32 and int32 as they are, int64 range-checked and narrowed to int32,
 * 8- and 16-bit types packed (bool as 0 or 1), padded to whole words.
 * `what` names the tensor in errors, e.g. 'input "x"'.
 */
export function encodeInput(spec: IOTensor, data: unknown, what: string): Uint8Array {
  const want = DTYPES[spec.dtype].arrayName;
  if (!(data instanceof ARRAYS[want])) {
    const got = data === null || data === undefined ? String(data) : (data as object).constructor?.name ?? typeof data;
    throw new RunError(`${what} must be a ${want} (${spec.dtype}), got ${got}`);
  }
  const n = numel(spec.shape);
  if (data.length !== n) {
    throw new RunError(`${what} has ${data.length} elements, expected ${n} (shape [${spec.shape}])`);
  }
  const out = new Uint8Array(spec.bytes);
  if (data instanceof BigInt64Array) {
    const words = new Int32Array(out.buffer, 0, n);
    for (let i = 0; i < n; i++) {
      const v = data[i]!;
      if (v < INT32_MIN || v > INT32_MAX) {
        throw new RunError(
          `${what} (int64) element ${i} is ${v}, outside the int32 range this package stores int64 in`);
      }
      words[i] = Number(v);
    }
  } else if (spec.dtype === 'bool') {
    for (let i = 0; i < n; i++) out[i] = data[i] ? 1 : 0;
  } else {
    const view = data as Exclude<TensorData, BigInt64Array>;
    out.set(new Uint8Array(view.buffer, view.byteOffset, view.byteLength));
  }
  return out;
}

/** Decodes a tensor's arena bytes (a copy of them) into the caller's typed array. */
export function decodeOutput(spec: IOTensor, bytes: ArrayBuffer): TensorData {
  const n = numel(spec.shape);
  switch (spec.dtype) {
    case 'float32':
      return new Float32Array(bytes, 0, n);
    case 'int32':
      return new Int32Array(bytes, 0, n);
    case 'int64': {
      const src = new Int32Array(bytes, 0, n);
      const out = new BigInt64Array(n);
      for (let i = 0; i < n; i++) out[i] = BigInt(src[i]!);
      return out;
    }
    case 'int16':
      return new Int16Array(bytes, 0, n);
    case 'int8':
      return new Int8Array(bytes, 0, n);
    case 'bool':
    case 'uint8':
      return new Uint8Array(bytes, 0, n);
    case 'float16':
    case 'bfloat16':
      return new Uint16Array(bytes, 0, n);
  }
}

/**
 * The value of a float16 or bfloat16 element from its 16 bits (exact). Half tensors travel as
 * Uint16Array of their bits (JavaScript has no 16-bit float array everywhere yet).
 */
export function halfToFloat(dtype: 'float16' | 'bfloat16', bits: number): number {
  if (dtype === 'bfloat16') return new Float32Array(new Uint32Array([bits << 16]).buffer)[0]!;
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >> 10) & 0x1f;
  const man = bits & 0x3ff;
  if (exp === 0x1f) return man ? NaN : sign * Infinity;
  if (exp === 0) return sign * man * 2 ** -24;
  return sign * (1 + man / 1024) * 2 ** (exp - 15);
}

/**
 * The values of a generated golden input (docs/webgpu_package.md, "Golden data"): element i is
 * low + (high - low) * u_i in float32 arithmetic, u_i = (lowbias32(seed + i * 0x9E3779B9) >>> 8) * 2^-24.
 */
export function goldenUniform(n: number, seed: number, low: number, high: number): Float32Array {
  const out = new Float32Array(n);
  const lo = Math.fround(low);
  const span = Math.fround(Math.fround(high) - lo);
  for (let i = 0; i < n; i++) {
    let x = (seed + Math.imul(i, 0x9e3779b9)) >>> 0;
    x ^= x >>> 16;
    x = Math.imul(x, 0x7feb352d) >>> 0;
    x ^= x >>> 15;
    x = Math.imul(x, 0x846ca68b) >>> 0;
    x ^= x >>> 16;
    const u = (x >>> 8) * 2 ** -24;
    out[i] = Math.fround(lo + Math.fround(span * u));
  }
  return out;
}

/** Every stride-th element of a flattened output (what a sampled golden output holds). */
export function sampleOutput(data: TensorData, stride: number): TensorData {
  if (stride === 1) return data;
  const n = Math.ceil(data.length / stride);
  const out = new (data.constructor as new (n: number) => TensorData)(n);
  for (let i = 0; i < n; i++) (out as unknown as (number | bigint)[])[i] = data[i * stride]!;
  return out;
}

/** A golden tensor of the package, copied out of the payload into its own typed array. */
export function readGolden(pkg: ParsedPackage, t: GoldenTensor): TensorData {
  if (t.generate) return goldenUniform(numel(t.shape), t.generate.seed, t.generate.low, t.generate.high);
  const bytes = new Uint8Array(pkg.payload.subarray(t.offset, t.offset + t.bytes)); // a copy, aligned
  const n = Math.ceil(numel(t.shape) / t.stride);
  switch (t.dtype) {
    case 'float32': return new Float32Array(bytes.buffer, 0, n);
    case 'int32': return new Int32Array(bytes.buffer, 0, n);
    case 'int64': return new BigInt64Array(bytes.buffer, 0, n);
    case 'int16': return new Int16Array(bytes.buffer, 0, n);
    case 'int8': return new Int8Array(bytes.buffer, 0, n);
    case 'bool':
    case 'uint8': return bytes;
    case 'float16':
    case 'bfloat16': return new Uint16Array(bytes.buffer, 0, n);
  }
}

/** The golden inputs by name, ready to pass to `Model.run`. */
export function goldenInputs(pkg: ParsedPackage): Record<string, TensorData> {
  const out: Record<string, TensorData> = {};
  for (const t of pkg.manifest.golden.inputs) out[t.name] = readGolden(pkg, t);
  return out;
}

/** The golden outputs by name. */
export function goldenOutputs(pkg: ParsedPackage): Record<string, TensorData> {
  const out: Record<string, TensorData> = {};
  for (const t of pkg.manifest.golden.outputs) out[t.name] = readGolden(pkg, t);
  return out;
}

/** How one output compares with its golden values. */
export interface OutputCheck {
  name: string;
  dtype: DType;
  ok: boolean;
  /** Largest |y - golden| (Infinity where a NaN or an infinity does not match). */
  maxError: number;
  /** Number of elements outside the tolerance (or unequal, for integers and bools). */
  mismatches: number;
  /** The first element that failed, if any. */
  first: { index: number; got: number | bigint; expected: number | bigint } | null;
}

/**
 * Compares an output with its golden values. Floats pass when |y - g| <= atol + rtol * |g|,
 * with NaN matching NaN and infinities matching by sign; integers and bools must be equal.
 */
export function compareOutput(name: string, dtype: DType, got: TensorData, expected: TensorData, tol: Tolerance): OutputCheck {
  if (got.length !== expected.length) {
    throw new PackageError(`output "${name}" has ${got.length} elements, its golden value ${expected.length}`);
  }
  let maxError = 0;
  let mismatches = 0;
  let first: OutputCheck['first'] = null;
  const float = DTYPES[dtype].float;
  const half = dtype === 'float16' || dtype === 'bfloat16' ? dtype : null;
  for (let i = 0; i < got.length; i++) {
    const y = half ? halfToFloat(half, got[i] as number) : got[i]!;
    const g = half ? halfToFloat(half, expected[i] as number) : expected[i]!;
    let err: number;
    let ok: boolean;
    if (float) {
      const yf = y as number;
      const gf = g as number;
      if (Number.isNaN(yf) || Number.isNaN(gf) || !Number.isFinite(yf) || !Number.isFinite(gf)) {
        ok = yf === gf || (Number.isNaN(yf) && Number.isNaN(gf));
        err = ok ? 0 : Infinity;
      } else {
        err = Math.abs(yf - gf);
        ok = err <= tol.atol + tol.rtol * Math.abs(gf);
      }
    } else {
      ok = y === g;
      err = typeof y === 'bigint' ? Math.abs(Number(y - (g as bigint))) : Math.abs((y as number) - (g as number));
    }
    if (err > maxError) maxError = err;
    if (!ok) {
      mismatches++;
      if (first === null) first = { index: i, got: y, expected: g };
    }
  }
  return { name, dtype, ok: mismatches === 0, maxError, mismatches, first };
}
