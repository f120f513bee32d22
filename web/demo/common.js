// Helpers shared by the demo pages (index.html, search.html): the result JSON, errors, small
// formatting and DOM utilities. The runtime (../dist/index.js) has no DOM code; this does.

/** A JSON-safe copy: BigInt -> number, typed arrays -> arrays, non-finite numbers -> strings. */
export function jsonSafe(v) {
  if (typeof v === 'bigint') return Number(v);
  if (typeof v === 'number') return Number.isFinite(v) ? v : String(v);
  if (ArrayBuffer.isView(v)) return Array.from(v, jsonSafe);
  if (Array.isArray(v)) return v.map(jsonSafe);
  if (v && typeof v === 'object') {
    const out = {};
    for (const [k, x] of Object.entries(v)) if (x !== undefined) out[k] = jsonSafe(x);
    return out;
  }
  return v;
}

/** Publishes the page's final result: window.chromaResult and the text of <pre id="result">. */
export function publishResult(result) {
  const safe = jsonSafe(result);
  window.chromaResult = safe;
  const pre = document.getElementById('result');
  if (pre) pre.textContent = JSON.stringify(safe, null, 2);
  document.body.dataset.state = safe.error ? 'error' : 'done';
  return safe;
}

/** Clears the published result (a new load or query starts). */
export function clearResult() {
  window.chromaResult = undefined;
  const pre = document.getElementById('result');
  if (pre) pre.textContent = '';
  document.body.dataset.state = 'busy';
}

/** A readable message for an error, with a hint for the usual browser-setup problems. */
export function describeError(e) {
  let msg = e instanceof Error ? `${e.name && e.name !== 'Error' ? `${e.name}: ` : ''}${e.message}` : String(e);
  if (!('gpu' in navigator)) {
    msg += ' — WebGPU is not available in this browser (navigator.gpu is undefined). Use a recent Chrome/Edge, ' +
      'or Chromium with --enable-unsafe-webgpu (Linux), and serve the page from localhost or https.';
  } else if (!window.isSecureContext) {
    msg += ' — this page is not a secure context: serve it from localhost or over https (crypto.subtle is needed).';
  }
  return msg;
}

/** Shows an error on the page (the element #error) and returns the message. */
export function showError(e, stage) {
  const msg = describeError(e);
  const box = document.getElementById('error');
  if (box) {
    box.hidden = false;
    box.textContent = `${stage ? `Error (${stage}): ` : 'Error: '}${msg}`;
  }
  setStatus(`failed${stage ? ` (${stage})` : ''}`);
  console.error(e);
  return msg;
}

export function hideError() {
  const box = document.getElementById('error');
  if (box) {
    box.hidden = true;
    box.textContent = '';
  }
}

export function setStatus(text) {
  const el = document.getElementById('status');
  if (el) el.textContent = text;
}

export function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  if (n === 0) return NaN;
  return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

export function fmtMs(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms)) return String(ms);
  return ms >= 100 ? `${ms.toFixed(0)} ms` : ms >= 10 ? `${ms.toFixed(1)} ms` : `${ms.toFixed(2)} ms`;
}

export function fmtBytes(n) {
  if (n >= 2 ** 20) return `${(n / 2 ** 20).toFixed(1)} MiB`;
  if (n >= 2 ** 10) return `${(n / 2 ** 10).toFixed(1)} KiB`;
  return `${n} B`;
}

export function fmtValue(v) {
  if (typeof v === 'bigint') return v.toString();
  if (typeof v !== 'number') return String(v);
  if (Number.isInteger(v)) return String(v);
  return Number.isFinite(v) ? String(Number(v.toPrecision(6))) : String(v);
}

/** Replaces the rows of a <table>'s body; `rows` are arrays of cell texts (or Nodes). */
export function fillTable(table, rows) {
  const body = table.tBodies[0] ?? table.createTBody();
  body.replaceChildren(...rows.map((cells) => {
    const tr = document.createElement('tr');
    for (const c of cells) {
      const td = document.createElement('td');
      if (c instanceof Node) td.append(c);
      else td.textContent = String(c);
      tr.append(td);
    }
    return tr;
  }));
}

/** Key/value rows into a <dl>. */
export function fillList(dl, pairs) {
  dl.replaceChildren(...pairs.flatMap(([k, v]) => {
    const dt = document.createElement('dt');
    dt.textContent = k;
    const dd = document.createElement('dd');
    dd.textContent = String(v);
    return [dt, dd];
  }));
}

export function adapterText(a) {
  if (!a) return '(unknown)';
  const parts = [a.vendor, a.architecture, a.device, a.description].filter((x) => x);
  return parts.length ? parts.join(' · ') : '(the browser reports no adapter details)';
}

/** Reports uncaught errors and rejections on the page (and in the result, if none yet). */
export function catchUncaught(page) {
  const report = (e) => {
    const msg = showError(e, 'uncaught');
    if (!window.chromaResult) publishResult({ page, error: msg, stage: 'uncaught' });
  };
  window.addEventListener('error', (ev) => report(ev.error ?? ev.message));
  window.addEventListener('unhandledrejection', (ev) => report(ev.reason));
}
