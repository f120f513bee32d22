// One task of bench/webgpu.py in headless Chromium (SwiftShader):
//   node bench/webgpu/browser.mjs TASK.json RESULT.json
// Serves TASK.mounts (URL prefix -> directory) on 127.0.0.1 (a secure context: chroma-web
// checks SHA-256 with crypto.subtle), with COOP/COEP so that the page is cross-origin isolated,
// launches Chromium with a fresh profile (no shader cache from an earlier run), opens
// /harness/page.html and calls benchRun(task). The result (or the error) goes to RESULT.json.
import http from 'node:http';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

const [taskPath, outPath] = process.argv.slice(2);
const task = JSON.parse(fs.readFileSync(taskPath, 'utf8'));

const TYPES = { '.js': 'text/javascript', '.mjs': 'text/javascript', '.html': 'text/html', '.json': 'application/json', '.wasm': 'application/wasm' };

function serve(mounts) {
  const prefixes = Object.keys(mounts).sort((a, b) => b.length - a.length);
  const server = http.createServer((req, res) => {
    const url = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    const prefix = prefixes.find((p) => url.startsWith(p));
    const headers = { 'Cross-Origin-Opener-Policy': 'same-origin', 'Cross-Origin-Embedder-Policy': 'require-corp', 'Cache-Control': 'no-store' };
    if (!prefix) { res.writeHead(404, headers); res.end(); return; }
    const root = path.resolve(mounts[prefix]);
    const file = path.resolve(root, url.slice(prefix.length));
    if (!file.startsWith(root) || !fs.existsSync(file) || !fs.statSync(file).isFile()) { res.writeHead(404, headers); res.end(); return; }
    headers['Content-Type'] = TYPES[path.extname(file)] ?? 'application/octet-stream';
    headers['Content-Length'] = fs.statSync(file).size;
    res.writeHead(200, headers);
    fs.createReadStream(file).pipe(res);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

const ARGS = ['--headless=new', '--no-sandbox', '--enable-unsafe-webgpu', '--disable-gpu', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync', '--disable-quic',
  '--disable-gpu-shader-disk-cache', '--disable-renderer-backgrounding', '--disable-background-timer-throttling'];

const console_ = [];
let result;
const server = await serve(task.mounts);
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'chroma-bench-chromium-'));
let context;
try {
  const t0 = performance.now();
  context = await chromium.launchPersistentContext(profile, {
    executablePath: task.chromium ?? '/usr/bin/chromium', headless: true, args: [...ARGS, ...(task.chromiumArgs ?? [])],
  });
  const launchMs = performance.now() - t0;
  const page = context.pages()[0] ?? await context.newPage();
  page.on('console', (m) => { if (console_.length < 200) console_.push(`${m.type()}: ${m.text()}`.slice(0, 1000)); });
  page.on('pageerror', (e) => { if (console_.length < 200) console_.push(`pageerror: ${e.message}`.slice(0, 1000)); });
  page.setDefaultTimeout(0);
  await page.goto(`http://127.0.0.1:${server.address().port}/harness/page.html`);
  await page.waitForFunction(() => globalThis.benchReady === true, null, { timeout: 60000 });
  result = await page.evaluate((t) => globalThis.benchRun(t), task);
  result.launchMs = launchMs;
  result.browserVersion = context.browser()?.version() ?? null;
} catch (e) {
  result = { system: task.system, model: task.model, ok: false, error: String(e?.stack ?? e).slice(0, 4000) };
} finally {
  result.console = console_;
  fs.writeFileSync(outPath, JSON.stringify(result));
  try { await context?.close(); } catch { /* ignore */ }
  server.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
process.exit(0);
