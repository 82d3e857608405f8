#!/usr/bin/env node
// Differential test data for the canonicalizer: random JSON documents written as
// text, each with its RFC 8785 canonical form computed by an independent JS
// implementation on top of V8's JSON.parse.
//
//   node documents.js N | jcs_tool check-documents
//
// Prints N records "<in_len> <out_len>\n<in><out>\n" (lengths in bytes of the
// UTF-8 encoding, decimal). The reference canonical form is
//   null/true/false as such, numbers as String(n) (ECMAScript Number::toString,
//   -0 prints "0"), strings as JSON.stringify(s), arrays in order, objects with
//   Object.keys(o).sort() (default sort = UTF-16 code unit order), no whitespace;
// which is what RFC 8785 section 3.2 prescribes. It is checked against the RFC's
// own examples before anything is printed.
//
// The documents are built token by token (never JSON.stringify of a value) so
// that the parser sees: random whitespace between tokens; strings and member
// names mixing ASCII, Latin and CJK, U+E000..U+FFFF and supplementary characters
// (raw UTF-8 or \u escapes in either case, surrogate pairs as escapes), names in
// one object sharing prefixes so that UTF-16 order differs from code point order;
// control characters as short or \u00XX escapes, \" \\ \/, U+2028/U+2029, DEL,
// \u0000; numbers in many literal forms (-0, 0.0, 1E+21, 1e007, 123e-2, integers
// beyond 2^53, 20-30 digit integers, long fractions, subnormals, values that
// underflow to 0, values rounding to the largest double); nesting up to ~200
// levels; empty containers; literals; sizes from a few bytes to ~20 KB.
//
// Never generated (tested elsewhere as invalid input, or ambiguous for the
// reference): duplicate member names after unescaping (JSON.parse keeps the
// last one, the canonicalizer rejects them), lone surrogates, numbers beyond the
// largest double, raw control characters inside strings.
//
// The output is a pure function of N: xoshiro128** with the fixed SEED below,
// seeded through splitmix32; Math.random is not used. Every record is built and
// verified before the first byte is written, so a generator failure prints
// nothing and check-documents fails on zero records.
'use strict';

const SEED = 0x4a435344; // "JCSD"
const MAX_DOC_CHARS = 20000;

const count = Number(process.argv[2] ?? 10000);
if (!Number.isInteger(count) || count < 1) {
  process.stderr.write('usage: node documents.js COUNT\n');
  process.exit(2);
}

// ---------------------------------------------------------------------------
// PRNG: see rng.js.

const { makeRng } = require('./rng');

const rng = makeRng(SEED);

// ---------------------------------------------------------------------------
// Reference canonicalizer (RFC 8785 on top of JSON.parse).

function canonical(v) {
  if (v === null) return 'null';
  switch (typeof v) {
    case 'boolean':
      return v ? 'true' : 'false';
    case 'number':
      if (!Number.isFinite(v)) throw new Error(`generator bug: non-finite number ${v}`);
      return String(v);
    case 'string':
      return JSON.stringify(v);
    case 'object': {
      if (Array.isArray(v)) return '[' + v.map(canonical).join(',') + ']';
      const keys = Object.keys(v).sort();
      return '{' + keys.map((k) => JSON.stringify(k) + ':' + canonical(v[k])).join(',') + '}';
    }
    default:
      throw new Error(`unexpected ${typeof v}`);
  }
}

function countMembers(v) {
  if (v === null || typeof v !== 'object') return 0;
  let n = 0;
  if (Array.isArray(v)) {
    for (const e of v) n += countMembers(e);
  } else {
    for (const k of Object.keys(v)) n += 1 + countMembers(v[k]);
  }
  return n;
}

// RFC 8785 section 3.2.2 (values and strings) and 3.2.3 (sorting) examples.
function selfTest() {
  const cases = [
    [
      '{\n  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],\n' +
        '  "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",\n' +
        '  "literals": [null, true, false]\n}',
      '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],' +
        '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}',
    ],
    [
      '{\n  "\\u20ac": "Euro Sign",\n  "\\r": "Carriage Return",\n' +
        '  "\\ufb33": "Hebrew Letter Dalet With Dagesh",\n  "1": "One",\n' +
        '  "\\ud83d\\ude00": "Emoji: Grinning Face",\n  "\\u0080": "Control",\n' +
        '  "\\u00f6": "Latin Small Letter O With Diaeresis"\n}',
      '{"\\r":"Carriage Return","1":"One","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis",' +
        '"\u20ac":"Euro Sign","\u{1F600}":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"}',
    ],
    // Values from RFC 8785 Appendix B and the ECMAScript layout boundaries.
    [
      '[-0, 0.0, 1e21, 1e20, 1e-7, 1e-6, 9007199254740993, 5e-324, 1e-400, 4.35, 0.1, 1.7976931348623157e308]',
      '[0,0,1e+21,100000000000000000000,1e-7,0.000001,9007199254740992,5e-324,0,4.35,0.1,1.7976931348623157e+308]',
    ],
    // U+E000..U+FFFF sorts after supplementary characters in UTF-16 order.
    ['{"\\uFFFF":1,"\\uD800\\uDC00":2,"\\uE000":3,"":4}', '{"":4,"\u{10000}":2,"\ue000":3,"\uffff":1}'],
    ['"\\u2028\\u2029\\u007f\\u0000\\u001F\\/"', '"\u2028\u2029\u007f\\u0000\\u001f/"'],
  ];
  for (const [input, expected] of cases) {
    const got = canonical(JSON.parse(input));
    if (got !== expected) {
      throw new Error(`reference self-test failed\n  input:    ${input}\n  expected: ${expected}\n  got:      ${got}`);
    }
  }
}

// ---------------------------------------------------------------------------
// Text pieces. Every piece is [encoded JSON text, decoded JS string].

function hex4(n) {
  const s = n.toString(16).padStart(4, '0');
  switch (rng.int(4)) {
    case 0:
    case 1:
      return s;
    case 2:
      return s.toUpperCase();
    default: {
      let m = '';
      for (const ch of s) m += rng.chance(0.5) ? ch.toUpperCase() : ch;
      return m;
    }
  }
}

// A code point (never a surrogate) as raw text or as \u escape(s).
function codePoint(cp, escapeProbability) {
  const dec = String.fromCodePoint(cp);
  if (!rng.chance(escapeProbability)) return [dec, dec];
  if (cp < 0x10000) return ['\\u' + hex4(cp), dec];
  const v = cp - 0x10000;
  return ['\\u' + hex4(0xd800 + (v >> 10)) + '\\u' + hex4(0xdc00 + (v & 0x3ff)), dec];
}

const SHORT_ESCAPES = [
  ['\\"', '"'], ['\\\\', '\\'], ['\\/', '/'], ['\\b', '\b'], ['\\f', '\f'],
  ['\\n', '\n'], ['\\r', '\r'], ['\\t', '\t'],
];
const ASCII_SAFE = [];
for (let c = 0x20; c < 0x7f; ++c) if (c !== 0x22 && c !== 0x5c) ASCII_SAFE.push(String.fromCharCode(c));

function bmpNonSurrogate(lo, hi) {
  for (;;) {
    const cp = rng.range(lo, hi);
    if (cp < 0xd800 || cp > 0xdfff) return cp;
  }
}

function supplementary() {
  return rng.weighted([
    [3, () => rng.range(0x1f300, 0x1faff)], // emoji
    [2, () => rng.range(0x20000, 0x2a6df)], // CJK extension B
    [3, () => rng.range(0x10000, 0x10ffff)],
    [1, () => rng.pick([0x10000, 0x10ffff, 0x1f600, 0x1d11e, 0xe0001])],
  ])();
}

const pieceTable = [
  [30, () => { // run of printable ASCII
    let s = '';
    for (let i = rng.range(1, 12); i > 0; --i) s += rng.pick(ASCII_SAFE);
    return [s, s];
  }],
  [6, () => rng.pick(SHORT_ESCAPES)],
  [4, () => { // control character as \u00XX (including the ones with short forms)
    const cp = rng.chance(0.15) ? rng.pick([0, 8, 9, 10, 12, 13, 0x1f]) : rng.range(0, 0x1f);
    return ['\\u' + hex4(cp), String.fromCharCode(cp)];
  }],
  [3, () => { // ASCII as \u escape: quote, backslash, solidus, letters, DEL
    const cp = rng.chance(0.3) ? rng.pick([0x22, 0x5c, 0x2f, 0x7f, 0x20, 0x41]) : rng.range(0x20, 0x7f);
    return ['\\u' + hex4(cp), String.fromCharCode(cp)];
  }],
  [2, () => ['\x7f', '\x7f']], // raw DEL
  [2, () => codePoint(rng.pick([0x2028, 0x2029]), 0.5)],
  [6, () => codePoint(rng.range(0x80, 0x24f), 0.3)], // Latin-1 supplement, Latin extended
  [6, () => codePoint(rng.range(0x4e00, 0x9fff), 0.3)], // CJK
  [3, () => codePoint(bmpNonSurrogate(0x800, 0xffff), 0.3)], // any BMP (3-byte UTF-8)
  [5, () => codePoint(rng.range(0xe000, 0xffff), 0.4)], // private use, compatibility, specials
  [6, () => codePoint(supplementary(), 0.4)], // 4-byte UTF-8, surrogate pairs in UTF-16
];

function randomPiece() {
  return rng.weighted(pieceTable)();
}

function stringBody(maxPieces) {
  let enc = '', dec = '';
  for (let n = rng.int(maxPieces + 1); n > 0; --n) {
    const [e, d] = randomPiece();
    enc += e;
    dec += d;
  }
  return [enc, dec];
}

// Characters that make UTF-16 order differ from code point order when they
// follow a common prefix: U+E000..U+FFFF versus supplementary characters.
function criticalPiece() {
  return rng.weighted([
    [4, () => codePoint(rng.range(0xe000, 0xffff), 0.4)],
    [1, () => codePoint(rng.pick([0xe000, 0xfb33, 0xff5e, 0xfffd, 0xffff]), 0.4)],
    [5, () => codePoint(supplementary(), 0.4)],
    [2, () => codePoint(rng.range(0x20, 0x7e) === 0x22 ? 0x21 : rng.range(0x61, 0x7a), 0.1)],
    [1, () => codePoint(rng.pick([0x7f, 0x80, 0xd7ff, 0x7ff, 0x800]), 0.4)],
    [1, () => ['', '']], // the bare prefix
  ])();
}

// ---------------------------------------------------------------------------
// Numbers: [literal text]; the value is whatever JSON.parse makes of it.

const FIXED_NUMBERS = [
  '0', '-0', '0.0', '-0.0', '1.0', '-1.0', '0e0', '0E+00', '-0e-5', '0.000e10', '1.50', '4.50',
  '1e21', '1E+21', '1e+21', '-1e21', '1e20', '1E20', '100000000000000000000', '1000000000000000000000',
  '999999999999999999999', '999999999999999900000', '1e-7', '1E-7', '1e-6', '0.000001', '0.0000001',
  '0.00000099999999999999999', '123e-2', '1e007', '1E-007', '1e+0', '1E-0', '-1e-0', '2e-3',
  '5e-324', '-5e-324', '1e-320', '2.4703282292062327e-324', '2.4703282292062328e-324',
  '4.9406564584124654e-324', '1e-400', '-1e-400', '1e-99999', '2.2250738585072014e-308',
  '2.225073858507201e-308', '2.2250738585072011e-308', '2.2250738585072012e-308',
  '1.7976931348623157e308', '1.7976931348623158e308', '-1.7976931348623157E+308',
  '9007199254740991', '9007199254740992', '9007199254740993', '-9007199254740993',
  '9007199254740993.0000000000000000001', '9007199254740995', '18014398509481985',
  '18446744073709551615', '18446744073709551616', '123456789012345678901234567890',
  '333333333.33333329', '1E30', '0.000000000000000000000000001', '4.35', '0.1', '0.2', '0.3',
  '0.30000000000000004', '1e23', '8.41e21', '5e-7', '295147905179352825856', '100', '1e2',
  '3.14159265358979323846264338327950288', '0.1000000000000000055511151231257827',
  '123456789012345', '1234567890123456', '12345678901234567', '0.123456789012345',
  '0.0000012345678901234', '1.23456789012345e-7',
];

// Decimal digits and exponent of a finite non-zero double: value = 0.D * 10^n.
function decompose(x) {
  const [mant, exp] = Math.abs(x).toExponential().split('e');
  return { digits: mant.replace('.', ''), n: Number(exp) + 1 };
}

// Writes 0.D * 10^n (sign separately) in a random but exact literal form.
function layout(negative, digits, n) {
  const sign = negative ? '-' : '';
  const padded = digits + '0'.repeat(rng.chance(0.2) ? rng.range(1, 5) : 0);
  const expText = (e) => {
    const letter = rng.chance(0.5) ? 'e' : 'E';
    const s = e < 0 ? '-' : rng.pick(['', '', '+']);
    const zeros = rng.chance(0.15) ? '0'.repeat(rng.range(1, 3)) : '';
    return letter + s + zeros + String(Math.abs(e));
  };
  const style = rng.int(5);
  if (style === 0 && n >= -40 && n <= 40) {
    // Plain notation.
    if (n <= 0) return sign + '0.' + '0'.repeat(-n) + padded;
    if (n >= padded.length) return sign + padded + '0'.repeat(n - padded.length);
    return sign + padded.slice(0, n) + '.' + padded.slice(n);
  }
  if (style === 1) {
    // Integer mantissa: DDD e(n - len).
    return sign + digits + expText(n - digits.length);
  }
  if (style === 2) {
    // Fraction with leading zeros: 0.000DDD e(n + z).
    const z = rng.range(0, 6);
    return sign + '0.' + '0'.repeat(z) + padded + expText(n + z);
  }
  // d.ddd e(n - 1)
  const frac = padded.slice(1);
  return sign + padded[0] + (frac ? '.' + frac : rng.chance(0.3) ? '.0' : '') + expText(n - 1);
}

// Literals of 16 or 17 significant digits in the range where serializers
// commonly print them (the canonicalizer keeps such digits when it can prove
// them canonical): the shortest form of a double (often canonical as it is),
// the same digits moved by a few units in the last place (reading as the same
// double but not the closest, or as another double), random digit strings
// (mostly not the shortest form), sums of short decimals (0.1 + 0.2), and
// integers around 2^53 and 10^16, each in a random layout.
function longLiteral() {
  const kind = rng.int(6);
  let x;
  if (kind <= 2) {
    // 53 random bits scaled into roughly 1e-12 .. 1e10.
    x = (rng.u32() * 2 ** 21 + (rng.u32() >>> 11)) / 2 ** rng.range(20, 95);
    if (kind === 2) x = Number(rng.digits(rng.range(1, 4)) + '.' + rng.digits(rng.range(1, 3), false)) +
                        Number('0.' + rng.digits(rng.range(1, 3), false)) * (rng.chance(0.5) ? 1 : 1e-3);
  } else if (kind === 3) {
    const k = rng.range(16, 17);
    return (rng.chance(0.3) ? '-' : '') + layoutText(rng.digits(k), rng.range(-20, 20));
  } else if (kind === 4) {
    x = rng.pick([2 ** 53, 2 ** 54, 1e16, 1e17, 2 ** 52]) + rng.range(-40, 40);
  } else {
    x = Number(rng.digits(rng.range(1, 3)) + '.' + rng.digits(15, false)) * 10 ** rng.range(-27, 4);
  }
  if (x === 0 || !Number.isFinite(x)) return '0';
  const d = decompose(x);
  let digits = d.digits;
  if (rng.chance(0.4)) {
    // Move the last digit by a few units (keeping 16 or 17 digits).
    const padded = digits.length < 16 ? digits + '0'.repeat(16 - digits.length) : digits;
    const big = BigInt(padded) + BigInt(rng.range(-3, 3));
    if (big > 0n) digits = big.toString();
  }
  return layout(rng.chance(0.3), digits, d.n);
}

// 0.D × 10^n in plain or exponent notation (no padding), for longLiteral.
function layoutText(digits, n) {
  if (n > 0 && n <= 21) {
    return n >= digits.length ? digits + '0'.repeat(n - digits.length) : digits.slice(0, n) + '.' + digits.slice(n);
  }
  if (n <= 0 && n > -8) return '0.' + '0'.repeat(-n) + digits;
  return digits[0] + '.' + digits.slice(1) + 'e' + (n - 1);
}

const numberTable = [
  [10, () => String(rng.range(-1000, 1000))],
  [3, () => String(rng.range(-2147483648, 2147483647))],
  [8, () => rng.pick(FIXED_NUMBERS)],
  [5, () => (rng.chance(0.3) ? '-' : '') + rng.digits(rng.range(16, 30))], // big integers
  [4, () => String(2 ** 53 + rng.range(-64, 64))],
  [8, () => { // random short decimal in a random layout
    const digits = rng.digits(rng.range(1, 17));
    const x = Number('0.' + digits + 'e' + rng.range(-25, 25));
    if (x === 0 || !Number.isFinite(x)) return '0';
    const d = decompose(x);
    return layout(rng.chance(0.3), d.digits, d.n);
  }],
  [8, () => { // random double (random bits) in a random layout
    const f = new Float64Array(1);
    const u = new Uint32Array(f.buffer);
    u[0] = rng.u32();
    u[1] = rng.u32() & 0x7fefffff; // exponent below 0x7ff: finite
    const x = f[0];
    if (x === 0) return '0';
    const d = decompose(x);
    return layout(rng.chance(0.5), d.digits, d.n);
  }],
  [5, () => { // long fractions, leading zeros in the fraction
    const intPart = rng.chance(0.5) ? '0' : rng.digits(rng.range(1, 6));
    const zeros = '0'.repeat(rng.chance(0.5) ? rng.range(1, 12) : 0);
    return (rng.chance(0.2) ? '-' : '') + intPart + '.' + zeros + rng.digits(rng.range(1, 60), false);
  }],
  [4, () => rng.digits(rng.range(1, 6)) + (rng.chance(0.5) ? 'e-' : 'E-') + rng.range(0, 25)], // k/10^j
  [3, () => { // subnormals and the underflow boundary
    const e = rng.range(-330, -300);
    return rng.digits(1) + '.' + rng.digits(rng.range(0, 20), false) + 'e' + e;
  }],
  [2, () => { // many digits (forces the slow path of a correct parser)
    const len = rng.range(40, 800);
    const e = rng.range(-len - 300, 300 - len);
    return rng.digits(len) + 'e' + e;
  }],
  [8, longLiteral],
  [2, () => { // near the largest double
    return '1.797693134862315' + rng.digits(rng.range(1, 20), false) + 'e308';
  }],
];

function numberText() {
  for (;;) {
    const text = rng.weighted(numberTable)();
    if (Number.isFinite(Number(text))) return text; // never an overflowing literal
  }
}

// ---------------------------------------------------------------------------
// Documents.

const WS = [' ', '\t', '\n', '\r'];
function ws() {
  if (rng.chance(0.65)) return '';
  let s = '';
  for (let n = rng.chance(0.9) ? rng.range(1, 3) : rng.range(4, 12); n > 0; --n) s += rng.pick(WS);
  return s;
}

let budget = 0; // characters left for the current document
let members = 0; // members generated in the current document

function stringToken(maxPieces) {
  const [enc] = stringBody(maxPieces);
  budget -= enc.length + 2;
  return '"' + enc + '"';
}

function scalar() {
  const t = rng.weighted([
    [35, () => stringToken(rng.chance(0.9) ? 6 : 40)],
    [40, numberText],
    [8, () => 'true'],
    [8, () => 'false'],
    [9, () => 'null'],
  ])();
  budget -= t.length;
  return t;
}

// Member names for one object; returns [encoded, decoded] not seen in `used`.
function makeNameSource() {
  const style = rng.int(6);
  const prefixes = [];
  for (let i = rng.range(1, 3); i > 0; --i) prefixes.push(stringBody(rng.chance(0.3) ? 0 : 3));
  return () => {
    switch (style) {
      case 0:
      case 1: { // shared prefix + critical character + optional tail
        const [pe, pd] = rng.pick(prefixes);
        const [ce, cd] = criticalPiece();
        const [te, td] = rng.chance(0.3) ? stringBody(2) : ['', ''];
        return [pe + ce + te, pd + cd + td];
      }
      case 2: { // short ASCII names, some numeric or special
        const special = ['', '1', '10', '2', '-1', '__proto__', 'constructor', 'a', 'A', 'aa', 'b', 'toString'];
        let s = '';
        if (rng.chance(0.3)) {
          s = rng.pick(special);
          return [s, s];
        }
        for (let i = rng.range(1, 6); i > 0; --i) s += String.fromCharCode(rng.range(0x61, 0x66));
        return [s, s];
      }
      default: // arbitrary strings
        return stringBody(rng.chance(0.8) ? 4 : 12);
    }
  };
}

function nextName(source, used) {
  for (let attempt = 0; attempt < 20; ++attempt) {
    const [enc, dec] = source();
    if (used.has(dec)) continue;
    used.add(dec);
    budget -= enc.length + 3;
    return '"' + enc + '"';
  }
  return null;
}

// A value at `depth` (the root is depth 0).
function value(depth) {
  const containerChance = budget <= 0 ? 0 : depth < 3 ? 0.55 : depth < 8 ? 0.3 : 0.05;
  if (!rng.chance(containerChance)) return scalar();
  return rng.chance(0.6) ? object(depth) : array(depth);
}

function continueChance() {
  return budget > 0 ? 0.9 : 0;
}

function object(depth) {
  budget -= 2;
  if (rng.chance(0.08)) return '{' + ws() + '}';
  const source = makeNameSource();
  const used = new Set();
  let out = '{' + ws();
  let first = true;
  do {
    const name = nextName(source, used);
    if (name === null) break;
    ++members;
    out += (first ? '' : ',' + ws()) + name + ws() + ':' + ws() + value(depth + 1) + ws();
    first = false;
  } while (rng.chance(continueChance()));
  return out + '}';
}

function array(depth) {
  budget -= 2;
  if (rng.chance(0.08)) return '[' + ws() + ']';
  let out = '[' + ws();
  let first = true;
  do {
    out += (first ? '' : ',' + ws()) + value(depth + 1) + ws();
    first = false;
  } while (rng.chance(continueChance()));
  return out + ']';
}

// A chain of `levels` nested containers, with siblings now and then.
function deep(levels) {
  const open = [];
  let text = '';
  for (let i = 0; i < levels; ++i) {
    const isObject = rng.chance(0.5);
    let head = isObject ? '{' + ws() : '[' + ws();
    let used = null;
    if (isObject) {
      used = new Set();
      ++members;
      head += nextName(makeNameSource(), used) + ws() + ':' + ws();
    } else if (rng.chance(0.2)) {
      head += scalar() + ws() + ',' + ws();
    }
    text += head;
    open.push(isObject);
  }
  text += rng.chance(0.5) ? scalar() : rng.chance(0.5) ? '[]' : '{}';
  while (open.length) {
    text += ws() + (open.pop() ? '}' : ']');
  }
  return text;
}

function documentText() {
  members = 0;
  budget = Math.floor(Math.exp(rng.float() * Math.log(MAX_DOC_CHARS)));
  let body;
  const kind = rng.float();
  if (kind < 0.05) {
    budget = 0;
    body = deep(rng.range(20, 200));
  } else if (kind < 0.72) {
    body = object(0);
  } else if (kind < 0.9) {
    body = array(0);
  } else {
    body = scalar();
  }
  return ws() + body + ws();
}

// ---------------------------------------------------------------------------
// Main: build, verify, then write.

selfTest();

const chunks = [];
let pending = [];
let pendingChars = 0;
for (let i = 0; i < count; ++i) {
  const input = documentText();
  let parsed;
  try {
    parsed = JSON.parse(input);
  } catch (err) {
    throw new Error(`generator bug: document ${i} is not JSON (${err.message}): ${input.slice(0, 300)}`);
  }
  if (countMembers(parsed) !== members) {
    throw new Error(`generator bug: document ${i} has duplicate member names: ${input.slice(0, 300)}`);
  }
  const output = canonical(parsed);
  const inLen = Buffer.byteLength(input, 'utf8');
  const outLen = Buffer.byteLength(output, 'utf8');
  const record = `${inLen} ${outLen}\n${input}${output}\n`;
  pending.push(record);
  pendingChars += record.length;
  if (pendingChars >= 1 << 20) {
    chunks.push(pending.join(''));
    pending = [];
    pendingChars = 0;
  }
}
if (pending.length) chunks.push(pending.join(''));

process.stdout.on('error', (err) => {
  process.stderr.write(`documents.js: ${err.message}\n`);
  process.exit(1);
});

let next = 0;
function writeMore() {
  while (next < chunks.length) {
    if (!process.stdout.write(chunks[next++])) {
      process.stdout.once('drain', writeMore);
      return;
    }
  }
}
writeMore();
