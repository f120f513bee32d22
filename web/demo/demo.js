// The package runner (index.html): load a .chroma-web package (file picker, URL field, or
// ?package=<url>), show the adapter, the load and warm-up times, run the golden inputs N times
// (?runs=N, default 10), show the time per run, the outputs and the self-check, and publish the
// result as JSON in <pre id="result"> and window.chromaResult (an {error} object on failure).
//
// Query string: package=<url> (loads and runs at once), runs=<N>, full=1 (the result JSON holds
// every output value, not only the first ones).

import { goldenInputs, loadPackage } from '../dist/index.js';
import {
  adapterText, catchUncaught, clearResult, fillList, fillTable, fmtBytes, fmtMs, fmtValue, hideError,
  median, publishResult, setStatus, showError,
} from './common.js';

const FIRST = 8;
const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
let current = null; // the loaded Model
let busy = false;

catchUncaught('index');

function runsWanted() {
  const n = Number.parseInt($('runs').value, 10);
  return Number.isFinite(n) && n >= 1 ? Math.min(n, 1000) : 10;
}

/** Loads `source` (URL string or File), runs it, publishes the result. */
async function go(source) {
  if (busy) return;
  busy = true;
  $('load').disabled = true;
  clearResult();
  hideError();
  for (const id of ['info', 'timing']) $(id).replaceChildren();
  for (const id of ['outputs', 'checks']) fillTable($(id), []);
  $('check').textContent = '–';
  const label = typeof source === 'string' ? source : source.name;
  const n = runsWanted();
  const full = params.get('full') === '1';
  const result = { page: 'index', package: label, runs: { n } };
  let stage = 'load';
  try {
    if (current) {
      current.destroy();
      current = null;
    }
    setStatus(`loading ${label} …`);
    const t0 = performance.now();
    const bytes = typeof source === 'string' ? source : new Uint8Array(await source.arrayBuffer());
    const model = await loadPackage(bytes);
    current = model;
    const info = model.info;
    result.wallLoadMs = performance.now() - t0;
    result.adapter = info.adapter;
    result.info = {
      contentHash: info.contentHash, compilerVersion: info.compilerVersion, loadMs: info.loadMs,
      parseMs: info.parseMs, warmupMs: info.warmupMs, kernels: info.kernels, dispatches: info.dispatches,
      pipelines: info.pipelines, bufferBytes: info.bufferBytes,
    };
    result.inputs = model.inputs.map((t) => ({ name: t.name, dtype: t.dtype, shape: t.shape }));
    fillList($('info'), [
      ['adapter', adapterText(info.adapter)],
      ['package', `${label} (${info.contentHash.slice(0, 16)}…, compiler ${info.compilerVersion})`],
      ['inputs', result.inputs.map((t) => `${t.name}: ${t.dtype} [${t.shape}]`).join(', ') || 'none'],
      ['kernels / dispatches', `${info.kernels} kernels (${info.pipelines} pipelines), ${info.dispatches} dispatches`],
      ['GPU memory', `${fmtBytes(info.bufferBytes.total)} (weights ${fmtBytes(info.bufferBytes.weights)}, arena ${fmtBytes(info.bufferBytes.arena)})`],
      ['load', `${fmtMs(info.loadMs)} (fetch and checks ${fmtMs(info.parseMs)})`],
      ['warm-up (pipeline creation)', fmtMs(info.warmupMs)],
    ]);

    stage = 'run';
    const inputs = goldenInputs(model.package);
    setStatus('first run …');
    const first = await model.run(inputs);
    const times = [];
    let last = first;
    for (let i = 0; i < n; i++) {
      setStatus(`run ${i + 1} of ${n} …`);
      last = await model.run(inputs);
      times.push(last.ms);
    }
    Object.assign(result.runs, { firstMs: first.ms, medianMs: median(times), minMs: Math.min(...times), ms: times });
    fillList($('timing'), [
      ['load', fmtMs(info.loadMs)],
      ['warm-up (pipelines)', fmtMs(info.warmupMs)],
      ['first run', fmtMs(first.ms)],
      [`per run (${n} runs)`, `median ${fmtMs(result.runs.medianMs)}, min ${fmtMs(result.runs.minMs)}`],
    ]);
    result.outputs = model.outputs.map((o) => {
      const y = last.outputs[o.name];
      const entry = { name: o.name, dtype: o.dtype, shape: o.shape, first: Array.from(y.subarray(0, FIRST)) };
      if (full) entry.values = y;
      return entry;
    });
    fillTable($('outputs'), result.outputs.map((o) => [
      o.name, o.dtype, `[${o.shape.join(', ')}]`, `${o.first.map(fmtValue).join(', ')}${numel(o.shape) > FIRST ? ', …' : ''}`,
    ]));

    stage = 'selfCheck';
    setStatus('self-check …');
    const check = await model.selfCheck();
    result.selfCheck = {
      ok: check.ok, maxError: check.maxError, tolerance: check.tolerance, ms: check.ms,
      outputs: check.outputs.map((c) => ({ name: c.name, ok: c.ok, maxError: c.maxError, mismatches: c.mismatches, first: c.first })),
    };
    const verdict = document.createElement('span');
    verdict.className = check.ok ? 'ok' : 'bad';
    verdict.textContent = check.ok ? 'passed' : 'FAILED';
    $('check').replaceChildren(verdict,
      ` — max error ${fmtValue(check.maxError)}, tolerance |y − golden| ≤ ${fmtValue(check.tolerance.atol)} + ${fmtValue(check.tolerance.rtol)}·|golden|`);
    fillTable($('checks'), check.outputs.map((c) => [
      c.name, c.ok ? 'yes' : 'NO', fmtValue(c.maxError), c.mismatches,
      c.first ? `[${c.first.index}]: ${fmtValue(c.first.got)} vs ${fmtValue(c.first.expected)}` : '–',
    ]));
    setStatus(check.ok ? 'done' : 'done: the self-check failed');
  } catch (e) {
    result.error = showError(e, stage);
    result.stage = stage;
  } finally {
    publishResult(result);
    busy = false;
    $('load').disabled = false;
  }
}

function numel(shape) {
  return shape.reduce((a, b) => a * b, 1);
}

$('choose').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const file = $('file').files?.[0];
  const url = $('url').value.trim();
  if (file) {
    void go(file);
  } else if (url) {
    const q = new URLSearchParams(location.search);
    q.set('package', url);
    history.replaceState(null, '', `?${q}`);
    void go(url);
  } else {
    showError(new Error('choose a package file or enter its URL'), 'input');
  }
});
$('file').addEventListener('change', () => {
  if ($('file').files?.length) $('url').value = '';
});

if (params.has('runs')) $('runs').value = params.get('runs');
const initial = params.get('package');
if (initial) {
  $('url').value = initial;
  void go(initial);
}
