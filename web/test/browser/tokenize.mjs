#!/usr/bin/env node
// Runs the demo's JS WordPiece tokenizer (web/demo/tokenizer.js) in Node, for comparing it with
// Hugging Face's: reads a JSON array of strings on stdin, prints a JSON array of
// { tokens, ids, attentionMask } (ids and mask padded to --max-length, default 128).
//
//   echo '["Hello, world!"]' | node test/browser/tokenize.mjs ../path/to/vocab.txt [--max-length 128]

import { readFile } from 'node:fs/promises';
import { encode, parseVocab } from '../../demo/tokenizer.js';

const args = process.argv.slice(2);
let maxLength = 128;
const i = args.indexOf('--max-length');
if (i >= 0) {
  maxLength = Number(args[i + 1]);
  args.splice(i, 2);
}
if (args.length !== 1) {
  process.stderr.write('usage: node test/browser/tokenize.mjs <vocab.txt> [--max-length 128] < strings.json\n');
  process.exit(2);
}
const vocab = parseVocab(await readFile(args[0], 'utf8'));
let input = '';
for await (const chunk of process.stdin) input += chunk;
const out = JSON.parse(input).map((text) => {
  const e = encode(text, vocab, maxLength);
  return { tokens: e.tokens, ids: Array.from(e.ids, Number), attentionMask: Array.from(e.attentionMask, Number) };
});
process.stdout.write(`${JSON.stringify(out)}\n`);
