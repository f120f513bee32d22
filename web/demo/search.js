// Semantic search (search.html): all-MiniLM-L6-v2 compiled for WebGPU by web/demo/build_search.py.
// Loads models/vocab.txt, models/corpus.json (sentences and their PyTorch embeddings) and
// models/minilm.chroma-web; tokenizes the query in JS (tokenizer.js), embeds it on the GPU, and
// ranks the sentences by cosine similarity. Each search publishes its result as JSON in
// <pre id="result"> and window.chromaResult ({error} on failure).
//
// Query string: q=<query> (runs it as soon as the model is loaded), models=<base URL of the
// three files> (default models/), check=1 (also run the package's self-check after loading).

import { loadPackage } from '../dist/index.js';
import {
  adapterText, catchUncaught, clearResult, fillList, fillTable, fmtBytes, fmtMs, hideError, publishResult,
  setStatus, showError,
} from './common.js';
import { encode, parseVocab } from './tokenizer.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const base = new URL(params.get('models') ?? 'models/', location.href);

let model = null;
let vocab = null;
let corpus = null;
let maxLength = 128;
let busy = false;
const loadInfo = {};

catchUncaught('search');

async function fetchOk(url, what) {
  const res = await fetch(url);
  if (!res.ok) {
    throw new Error(`fetching ${what} (${url}) failed: HTTP ${res.status} ${res.statusText}` +
      (res.status === 404 ? ' — build the demo files first: .venv/bin/python web/demo/build_search.py' : ''));
  }
  return res;
}

async function load() {
  const t0 = performance.now();
  setStatus('loading the vocabulary and the corpus …');
  const [vocabText, corpusJson] = await Promise.all([
    fetchOk(new URL('vocab.txt', base), 'the vocabulary').then((r) => r.text()),
    fetchOk(new URL('corpus.json', base), 'the corpus').then((r) => r.json()),
  ]);
  vocab = parseVocab(vocabText);
  corpus = corpusJson;
  for (const s of corpus.sentences) {
    const e = Float32Array.from(s.embedding);
    s.vector = e;
    s.norm = Math.hypot(...e);
  }
  const pkgUrl = new URL(params.get('package') ?? corpus.package ?? 'minilm.chroma-web', base);
  setStatus(`loading the model (${pkgUrl.pathname.split('/').pop()}) …`);
  model = await loadPackage(pkgUrl.href);
  const info = model.info;

  const [ids, mask] = model.inputs;
  const out = model.outputs[0];
  if (model.inputs.length !== 2 || ids.dtype !== 'int64' || mask.dtype !== 'int64' || ids.shape.length !== 2 || ids.shape[0] !== 1) {
    throw new Error(`the package's inputs are ${JSON.stringify(model.inputs.map((t) => [t.name, t.dtype, t.shape]))}; ` +
      'this page needs (input_ids [1, L] int64, attention_mask [1, L] int64)');
  }
  maxLength = ids.shape[1];
  if (!out || out.dtype !== 'float32' || out.shape.at(-1) !== corpus.dim) {
    throw new Error(`the package's output is ${JSON.stringify(out && [out.dtype, out.shape])}; the corpus embeddings have ${corpus.dim} dimensions`);
  }
  Object.assign(loadInfo, {
    adapter: info.adapter, package: pkgUrl.href, contentHash: info.contentHash, loadMs: info.loadMs,
    parseMs: info.parseMs, warmupMs: info.warmupMs, kernels: info.kernels, dispatches: info.dispatches,
    wallMs: performance.now() - t0, vocabSize: vocab.size, sentences: corpus.sentences.length, maxLength,
  });
  if (params.get('check') === '1') {
    setStatus('self-check …');
    const c = await model.selfCheck();
    loadInfo.selfCheck = { ok: c.ok, maxError: c.maxError, tolerance: c.tolerance, ms: c.ms };
  }
  fillList($('info'), [
    ['adapter', adapterText(info.adapter)],
    ['model', `${corpus.model}: ${info.kernels} kernels, ${info.dispatches} dispatches, ${fmtBytes(info.bufferBytes.total)} on the GPU`],
    ['vocabulary', `${vocab.size} WordPiece tokens; queries padded to ${maxLength}`],
    ['corpus', `${corpus.sentences.length} sentences (embeddings from PyTorch)`],
    ['load', `${fmtMs(info.loadMs)} (fetch and checks ${fmtMs(info.parseMs)}, warm-up ${fmtMs(info.warmupMs)})`],
    ...(loadInfo.selfCheck ? [['self-check', `${loadInfo.selfCheck.ok ? 'passed' : 'FAILED'}, max error ${loadInfo.selfCheck.maxError}`]] : []),
  ]);
}

function cosine(a, b, normB) {
  let dot = 0;
  let na = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
  }
  return dot / (Math.sqrt(na) * normB || 1);
}

async function search(query) {
  if (busy || !model) return;
  busy = true;
  $('go').disabled = true;
  clearResult();
  hideError();
  const result = { page: 'search', query, load: loadInfo };
  try {
    const enc = encode(query, vocab, maxLength);
    result.tokens = enc.tokens;
    result.length = enc.length;
    result.ids = enc.ids;
    result.attentionMask = enc.attentionMask;
    $('tokens').replaceChildren(...enc.tokens.map((t) => {
      const s = document.createElement('span');
      s.textContent = t;
      return s;
    }));
    setStatus('embedding the query on the GPU …');
    const t0 = performance.now();
    const { outputs, ms } = await model.run([enc.ids, enc.attentionMask]);
    const emb = outputs[model.outputs[0].name];
    const scored = corpus.sentences.map((s, index) => ({ index, score: cosine(emb, s.vector, s.norm), text: s.text }));
    scored.sort((a, b) => b.score - a.score || a.index - b.index);
    result.ms = ms;
    result.searchMs = performance.now() - t0;
    result.embeddingFirst = Array.from(emb.subarray(0, 8));
    result.embedding = emb;
    result.ranking = scored.map((s, i) => ({ rank: i + 1, ...s }));
    const top = Math.max(scored[0].score, 1e-6);
    fillTable($('ranking'), scored.map((s, i) => {
      const bar = document.createElement('span');
      bar.className = 'bar';
      bar.style.width = `${Math.max(0, (s.score / top) * 120).toFixed(0)}px`;
      return [i + 1, s.score.toFixed(4), bar, s.text];
    }));
    setStatus(`done: ${enc.length} tokens, GPU run ${fmtMs(ms)}`);
  } catch (e) {
    result.error = showError(e, 'search');
  } finally {
    publishResult(result);
    busy = false;
    $('go').disabled = false;
  }
}

$('search').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const q = $('query').value.trim();
  if (!q) return;
  const p = new URLSearchParams(location.search);
  p.set('q', q);
  history.replaceState(null, '', `?${p}`);
  void search(q);
});

try {
  await load();
  $('query').disabled = false;
  $('go').disabled = false;
  setStatus('ready: type a query');
  const q = params.get('q');
  if (q) {
    $('query').value = q;
    await search(q);
  }
} catch (e) {
  publishResult({ page: 'search', query: params.get('q'), load: loadInfo, error: showError(e, 'load'), stage: 'load' });
}
