#!/usr/bin/env node
// A tiny offline static server for the demo pages: serves web/ at / and, optionally, a directory
// of packages at /packages/ (e.g. the repository's build/). Localhost only (a secure context,
// which the runtime's SHA-256 check needs), no dependencies.
//
//   node demo/serve.mjs [--port 8000] [--packages ../build]      (from web/)
//   then open http://localhost:8000/demo/?package=/packages/m.chroma-web
//        or   http://localhost:8000/demo/search.html

import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { createServer } from 'node:http';
import { dirname, extname, join, normalize, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const WEB = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const TYPES = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8', '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8', '.json': 'application/json', '.map': 'application/json', '.txt': 'text/plain; charset=utf-8',
  '.md': 'text/plain; charset=utf-8', '.png': 'image/png', '.svg': 'image/svg+xml', '.wasm': 'application/wasm',
  '.ts': 'text/plain; charset=utf-8', '.chroma-web': 'application/octet-stream',
};

let port = 8000;
let host = '127.0.0.1';
let packages = null;
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--port') port = Number(argv[++i]);
  else if (argv[i] === '--host') host = argv[++i];
  else if (argv[i] === '--packages') packages = resolve(argv[++i]);
  else {
    process.stderr.write('usage: node demo/serve.mjs [--port 8000] [--host 127.0.0.1] [--packages <dir>]\n');
    process.exit(2);
  }
}

/** The file a URL path names under `root`, or null when it escapes the root. */
function under(root, urlPath) {
  const p = normalize(join(root, urlPath));
  return p === root || p.startsWith(root + sep) ? p : null;
}

const server = createServer(async (req, res) => {
  let path;
  try {
    path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
  } catch {
    res.writeHead(400).end('bad URL');
    return;
  }
  let file = packages && path.startsWith('/packages/') ? under(packages, path.slice('/packages'.length)) : under(WEB, path);
  try {
    if (!file) throw new Error('outside');
    let st = await stat(file);
    if (st.isDirectory()) {
      if (!path.endsWith('/')) {
        res.writeHead(301, { Location: `${path}/` }).end();
        return;
      }
      file = join(file, 'index.html');
      st = await stat(file);
    }
    const type = TYPES[file.endsWith('.chroma-web') ? '.chroma-web' : extname(file)] ?? 'application/octet-stream';
    res.writeHead(200, { 'Content-Type': type, 'Content-Length': st.size, 'Cache-Control': 'no-cache' });
    if (req.method === 'HEAD') res.end();
    else createReadStream(file).pipe(res);
  } catch {
    res.writeHead(404, { 'Content-Type': 'text/plain' }).end(`not found: ${path}\n`);
  }
});
server.listen(port, host, () => {
  const where = `http://${host === '127.0.0.1' ? 'localhost' : host}:${server.address().port}`;
  process.stdout.write(`serving ${WEB} at ${where}/${packages ? ` and ${packages} at ${where}/packages/` : ''}\n`);
  process.stdout.write(`  ${where}/demo/            (package runner; ?package=<url>)\n  ${where}/demo/search.html (semantic search; needs demo/models/ from build_search.py)\n`);
});
