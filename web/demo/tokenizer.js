// BERT uncased WordPiece tokenization in plain JavaScript, as Hugging Face's fast tokenizer does it
// for all-MiniLM-L6-v2 (tokenizer.json: BertNormalizer {clean_text, handle_chinese_chars,
// lowercase, strip_accents: null = follows lowercase}, BertPreTokenizer, WordPiece {"##",
// [UNK], max_input_chars_per_word 100}, [CLS] ... [SEP], truncation and padding to 128).
// No DOM code: the same module runs in the browser and in Node (web/test/browser/tokenize.mjs).

/** Parses vocab.txt (one token a line; the id is the line number). */
export function parseVocab(text) {
  const vocab = new Map();
  const lines = text.split('\n');
  if (lines.length > 0 && lines[lines.length - 1] === '') lines.pop();
  lines.forEach((line, i) => {
    const tok = line.endsWith('\r') ? line.slice(0, -1) : line;
    if (!vocab.has(tok)) vocab.set(tok, i);
  });
  return vocab;
}

const CONTROL = /\p{C}/u;            // Rust's char::is_other: Cc, Cf, Cs, Co, Cn
const WHITESPACE = /\p{White_Space}/u;  // Rust's char::is_whitespace
const PUNCTUATION = /\p{P}/u;
const NONSPACING_MARK = /\p{Mn}/u;

function isWhitespace(c) {
  return c === '\t' || c === '\n' || c === '\r' || WHITESPACE.test(c);
}

function isControl(c) {
  if (c === '\t' || c === '\n' || c === '\r') return false;
  return CONTROL.test(c);
}

function isPunctuation(c) {
  const cp = c.codePointAt(0);
  // ASCII punctuation includes symbols such as $ + < = > ^ ` | ~ (Unicode's S categories).
  if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126)) return true;
  return PUNCTUATION.test(c);
}

function isChineseChar(cp) {
  return (cp >= 0x4e00 && cp <= 0x9fff) || (cp >= 0x3400 && cp <= 0x4dbf) || (cp >= 0x20000 && cp <= 0x2a6df) ||
    (cp >= 0x2a700 && cp <= 0x2b73f) || (cp >= 0x2b740 && cp <= 0x2b81f) || (cp >= 0x2b820 && cp <= 0x2ceaf) ||
    (cp >= 0xf900 && cp <= 0xfaff) || (cp >= 0x2f800 && cp <= 0x2fa1f);
}

/** BertNormalizer: drop NUL, U+FFFD and control characters, map whitespace to ' ', put spaces
 * around CJK ideographs, strip accents (NFD, then drop nonspacing marks), lowercase. */
export function normalize(text) {
  let out = '';
  for (const c of text) {
    const cp = c.codePointAt(0);
    if (cp === 0 || cp === 0xfffd || isControl(c)) continue;
    if (isWhitespace(c)) out += ' ';
    else if (isChineseChar(cp)) out += ` ${c} `;
    else out += c;
  }
  let stripped = '';
  for (const c of out.normalize('NFD')) if (!NONSPACING_MARK.test(c)) stripped += c;
  // Lowercase one code point at a time (as Rust's char::to_lowercase), so that JS's
  // context-dependent rules (final sigma) do not apply.
  let lower = '';
  for (const c of stripped) lower += c.toLowerCase();
  return lower;
}

/** BertPreTokenizer: split on whitespace (dropped) and on punctuation (each mark a word). */
export function preTokenize(text) {
  const words = [];
  let cur = '';
  for (const c of text) {
    if (isWhitespace(c)) {
      if (cur) words.push(cur);
      cur = '';
    } else if (isPunctuation(c)) {
      if (cur) words.push(cur);
      words.push(c);
      cur = '';
    } else {
      cur += c;
    }
  }
  if (cur) words.push(cur);
  return words;
}

/** WordPiece: greedy longest-match-first; a word with a piece not in the vocabulary is [UNK]. */
export function wordPiece(word, vocab, { unk = '[UNK]', prefix = '##', maxChars = 100 } = {}) {
  const chars = Array.from(word);
  if (chars.length > maxChars) return [unk];
  const pieces = [];
  let start = 0;
  while (start < chars.length) {
    let end = chars.length;
    let found = null;
    while (start < end) {
      const sub = (start > 0 ? prefix : '') + chars.slice(start, end).join('');
      if (vocab.has(sub)) {
        found = sub;
        break;
      }
      end--;
    }
    if (found === null) return [unk];
    pieces.push(found);
    start = end;
  }
  return pieces;
}

/** The WordPiece tokens of a text (no special tokens, no truncation). */
export function tokenizeToTokens(text, vocab) {
  return preTokenize(normalize(text)).flatMap((w) => wordPiece(w, vocab));
}

/**
 * Encodes one text as BERT's inputs: [CLS] tokens [SEP], truncated to maxLength, padded with
 * [PAD] (id 0). Returns { tokens, ids: BigInt64Array, attentionMask: BigInt64Array, length }
 * (length: the number of real tokens, [CLS] and [SEP] included).
 */
export function encode(text, vocab, maxLength = 128) {
  const id = (t) => {
    const v = vocab.get(t);
    if (v === undefined) throw new Error(`the vocabulary has no ${t} token`);
    return v;
  };
  const body = tokenizeToTokens(text, vocab).slice(0, maxLength - 2);
  const tokens = ['[CLS]', ...body, '[SEP]'];
  const pad = id('[PAD]');
  const ids = new BigInt64Array(maxLength).fill(BigInt(pad));
  const attentionMask = new BigInt64Array(maxLength);
  tokens.forEach((t, i) => {
    ids[i] = BigInt(id(t));
    attentionMask[i] = 1n;
  });
  return { tokens, ids, attentionMask, length: tokens.length };
}
