// describePackage: a human-readable summary of a parsed package (for a CLI or a log).

import type { IOTensor, ParsedPackage } from './format.js';

function mib(bytes: number): string {
  return bytes >= 1 << 20 ? `${(bytes / (1 << 20)).toFixed(1)} MiB` : bytes >= 1024 ? `${(bytes / 1024).toFixed(1)} KiB` : `${bytes} B`;
}

function io(t: IOTensor): string {
  return `  ${t.name}: ${t.dtype} [${t.shape.join(', ')}] at arena offset ${t.offset}`;
}

/** A multi-line text describing what a package holds and needs. */
export function describePackage(pkg: ParsedPackage): string {
  const m = pkg.manifest;
  const weightBytes = m.weights.shards.reduce((x, s) => x + s.bytes, 0);
  const uniqueCode = m.kernels.reduce((x, k) => x + k.code.length, 0);
  const lines = [
    `Chroma WebGPU package, format version ${pkg.version}, ${mib(pkg.bytes.byteLength)}`,
    `content hash: ${pkg.contentHash}`,
    `compiler: ${m.compiler_version}`,
    `inputs:`, ...m.inputs.map(io),
    `outputs:`, ...m.outputs.map(io),
    `arena: ${mib(m.arena.bytes)} (status block at ${m.arena.status_offset})`,
    `state: ${m.state.bytes > 0 ? `${mib(m.state.bytes)} in ${m.state.tensors.length} tensors` : 'none'}`,
    `weights: ${mib(weightBytes)} in ${m.weights.shards.length} shards, ${m.weights.tensors.length} tensors`,
    `params: ${m.params.bytes} bytes`,
    `kernels: ${m.kernels.length} (${mib(uniqueCode)} of WGSL), dispatches: ${m.dispatches.length}`,
    `requires: features [${m.requirements.features.join(', ')}], limits ${JSON.stringify(m.requirements.limits)}`,
    `golden: ${m.golden.inputs.length} inputs, ${m.golden.outputs.length} outputs, atol ${m.golden.tolerance.atol}, rtol ${m.golden.tolerance.rtol}`,
  ];
  if (m.stats) lines.push(`stats: ${Object.entries(m.stats).map(([k, v]) => `${k} ${v}`).join(', ')}`);
  return lines.join('\n');
}
