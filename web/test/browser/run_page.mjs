#!/usr/bin/env node
// Opens a demo page in headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core;
// WebGPU on Chromium's bundled SwiftShader), waits for <pre id="result"> to be filled, prints its
// JSON on stdout (one line) and saves a screenshot.
//
//   node test/browser/run_page.mjs <url> [screenshot.png] [--timeout <seconds>] [--chromium <path>]
//
// Exit status: 0 when the page published a result without "error", 1 when it published
// {error, ...}, 2 when the page gave no result in time or the browser failed (the JSON on stdout
// is then {"error": ..., "driver": true}). The page's console and errors go to stderr.

import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const ARGS = [
  '--headless=new', '--no-sandbox', '--enable-unsafe-webgpu', '--disable-gpu', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync', '--disable-quic',
];

function usage(msg) {
  if (msg) process.stderr.write(`run_page: ${msg}\n`);
  process.stderr.write('usage: node test/browser/run_page.mjs <url> [screenshot.png] [--timeout <seconds>] [--chromium <path>]\n');
  process.exit(2);
}

const positional = [];
let timeoutS = 300;
let executablePath = process.env.CHROMIUM ?? '/usr/bin/chromium';
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  if (a === '--timeout') timeoutS = Number(argv[++i]);
  else if (a === '--chromium') executablePath = argv[++i];
  else if (a === '-h' || a === '--help') usage();
  else if (a.startsWith('--')) usage(`unknown option ${a}`);
  else positional.push(a);
}
if (positional.length < 1 || positional.length > 2 || !(timeoutS > 0)) usage();
const [url, screenshot] = positional;

const log = (s) => process.stderr.write(`${s}\n`);
const t0 = Date.now();
const profile = await mkdtemp(join(tmpdir(), 'chroma-chromium-'));
let context;
let code = 2;
let out = null;
try {
  context = await chromium.launchPersistentContext(profile, {
    executablePath, headless: true, args: ARGS, viewport: { width: 1200, height: 900 },
  });
  const page = context.pages()[0] ?? await context.newPage();
  page.on('console', (m) => log(`[console.${m.type()}] ${m.text()}`));
  page.on('pageerror', (e) => log(`[pageerror] ${e.message}`));
  page.on('requestfailed', (r) => log(`[requestfailed] ${r.url()} ${r.failure()?.errorText ?? ''}`));
  page.on('response', (r) => { if (r.status() >= 400) log(`[http ${r.status()}] ${r.url()}`); });
  await page.goto(url, { waitUntil: 'load', timeout: 60_000 });
  try {
    await page.waitForFunction(() => (document.getElementById('result')?.textContent ?? '').trim().length > 0,
      null, { timeout: timeoutS * 1000, polling: 250 });
    const text = await page.locator('#result').textContent();
    out = JSON.parse(text);
    code = out.error ? 1 : 0;
  } catch (e) {
    const status = await page.locator('#status').textContent().catch(() => null);
    out = { error: `no result from the page within ${timeoutS} s (status: ${JSON.stringify(status)}): ${e.message.split('\n')[0]}`, driver: true };
  }
  if (screenshot) {
    await page.screenshot({ path: screenshot, fullPage: true });
    log(`screenshot: ${screenshot}`);
  }
} catch (e) {
  out = { error: `the browser failed: ${e.message}`, driver: true };
  code = 2;
} finally {
  await context?.close().catch(() => {});
  await rm(profile, { recursive: true, force: true }).catch(() => {});
}
log(`run_page: ${((Date.now() - t0) / 1000).toFixed(1)} s, exit ${code}`);
process.stdout.write(`${JSON.stringify(out)}\n`);
process.exit(code);
