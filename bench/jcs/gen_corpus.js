#!/usr/bin/env node
// Generates the deterministic API-like corpora for the canonical JSON benchmark.
//
//   node bench/jcs/gen_corpus.js [OUTDIR]        (default: bench/corpus)
//
// Writes three files, each about 4 MiB of JSON documents, one document per line
// (JSON text without insignificant whitespace has no raw newline: newlines inside
// strings are always escaped):
//
//   api-1k.jsonl    ~4096 documents of about 1 KiB: one order, payment or user each
//   api-64k.jsonl   ~64 documents of about 64 KiB: list pages of mixed resources
//   api-4m.jsonl    1 document of about 4 MiB: one huge list page
//
// The documents look like the bodies of a payments/e-commerce API: objects with
// nested arrays, member order shuffled, strings with escapes (\n, \", \t, \/,
// \u00e9, \uD83D\uDE00) and raw non-ASCII (é, 日本, emoji), and many numbers
// (integers, cents, decimals such as 12.34, 17-digit doubles, exponents and a
// few non-canonical literals such as 1.50 or 2.5E-3). No duplicate member names.
//
// A fixed-seed PRNG (mulberry32) drives everything, so the same command writes
// the same bytes on every machine; the SHA-256 of each file is printed.
'use strict';

const fs = require('fs');
const path = require('path');
const crypto = require('crypto');

const outDir = process.argv[2] || path.join(__dirname, '..', 'corpus');

// --- PRNG -------------------------------------------------------------------
function mulberry32(seed) {
  let a = seed >>> 0;
  return function next() {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
let rnd = mulberry32(1);
const int = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1)); // inclusive
const pick = (arr) => arr[Math.floor(rnd() * arr.length)];
const chance = (p) => rnd() < p;
const hex = (n) => {
  let s = '';
  for (let i = 0; i < n; i++) s += '0123456789abcdef'[int(0, 15)];
  return s;
};

// --- JSON text builders (each returns JSON text) ------------------------------
// Object with shuffled member order: pairs is [[name, jsonText], ...].
function obj(pairs) {
  for (let i = pairs.length - 1; i > 0; i--) {
    const j = int(0, i);
    [pairs[i], pairs[j]] = [pairs[j], pairs[i]];
  }
  return '{' + pairs.map(([k, v]) => str(k) + ':' + v).join(',') + '}';
}
const arr = (items) => '[' + items.join(',') + ']';
const bool = (b) => (b ? 'true' : 'false');

const u4 = (code) => {
  const h = code.toString(16).padStart(4, '0');
  return '\\u' + (chance(0.5) ? h : h.toUpperCase());
};
// A JSON string literal. Mandatory escapes are always written (named or \u00XX);
// non-ASCII is escaped as \uXXXX (surrogate pairs above the BMP) a quarter of the
// time and written raw otherwise; '/' is sometimes written as '\/'.
function str(s) {
  let out = '"';
  for (const ch of s) {
    const cp = ch.codePointAt(0);
    if (ch === '"') out += '\\"';
    else if (ch === '\\') out += '\\\\';
    else if (cp < 0x20) {
      const named = { 8: '\\b', 9: '\\t', 10: '\\n', 12: '\\f', 13: '\\r' }[cp];
      out += named && chance(0.9) ? named : u4(cp);
    } else if (cp >= 0x80) {
      if (chance(0.25)) {
        if (cp > 0xffff) {
          const v = cp - 0x10000;
          out += u4(0xd800 + (v >> 10)) + u4(0xdc00 + (v & 0x3ff));
        } else out += u4(cp);
      } else out += ch;
    } else if (ch === '/' && chance(0.2)) out += '\\/';
    else out += ch;
  }
  return out + '"';
}

// --- numbers ------------------------------------------------------------------
const cents = () => String(int(0, 2000000));
const money = () => { // decimal amount such as 12.34 (trailing zero avoided half the time)
  const c = int(1, 500000);
  const s = (c / 100).toFixed(2);
  return chance(0.85) ? String(Number(s)) : s; // "12.30" is a non-canonical literal
};
const small = () => pick(['0.2', '0.075', '0.19', '0.055', '0.1', '0.21', '0', '0.07']);
const timestamp = () => String(int(1600000000, 1800000000));
const ms_timestamp = () => String(int(1600000000000, 1800000000000));
const double17 = () => String(rnd() * pick([1, 100, 1000, 1e6])); // 15..17 significant digits
function exotic() { // exponents, tiny/huge, non-canonical literals
  switch (int(0, 11)) {
    case 0: return (rnd() * 9 + 1).toFixed(int(1, 8)) + 'e-' + int(7, 30);
    case 1: return (rnd() * 9 + 1).toFixed(int(1, 8)) + 'e+' + int(21, 300);
    case 2: return (rnd() * 9 + 1).toFixed(int(1, 5)) + 'E' + int(-5, 20);
    case 3: return '6.02214076e23';
    case 4: return '1.602176634e-19';
    case 5: return '2.5E-3';
    case 6: return String(int(1, 999)) + 'e' + int(0, 3);
    case 7: return '-0';
    case 8: return '1.50';
    case 9: return '9007199254740993'; // 2^53 + 1: rounds to an even double
    case 10: return String(-(rnd() * 1e-3));
    default: return '0.000001';
  }
}
function anyNumber() {
  const r = rnd();
  if (r < 0.35) return String(int(0, 100));
  if (r < 0.55) return money();
  if (r < 0.7) return cents();
  if (r < 0.8) return timestamp();
  if (r < 0.9) return double17();
  return exotic();
}

// --- text pools ----------------------------------------------------------------
const firstNames = ['José', 'François', 'Zoë', 'Björk', 'Søren', 'Ελένη', 'Иван', 'محمد', 'Nguyễn', '太郎',
  'Anna', 'John', 'Priya', 'Chloé', 'Łukasz', 'Ærøskøbing', 'Mei', 'Olúwadámilọ́lá', 'Sam', 'Renée'];
const lastNames = ['Müller', 'Dupont', "O'Brien", 'Guðmundsdóttir', 'Kierkegaard', 'Παπαδοπούλου', 'Петров',
  'علي', 'Văn A', '山田', 'Smith', 'Núñez', 'Çelik', 'Straße', 'Kowalski', 'García', '李', 'Ng', 'Dvořák', 'Øvrebø'];
const cities = ['Paris', 'München', 'Zürich', '東京', 'São Paulo', 'Kraków', 'Reykjavík', 'Москва', 'İstanbul',
  'New York', 'Montréal', 'Düsseldorf', '서울', 'Mexico City', 'Malmö'];
const products = ['Café crème 250 g', '日本茶 (Sencha) 100 g', 'T-shirt "Classic" – navy', 'Pizza 🍕 voucher',
  'Crème brûlée kit', 'Headphones 🎧 wireless', 'Cable USB-C/USB-A 1 m', 'Notebook A5 — dotted',
  'Backslash \\ organizer', 'Gift card 🎁 €50', 'Rooibos tea ☕', 'Smörgåsbord platter', 'Socks 🧦 ×3',
  'Ramen 🍜 家庭用', 'Chair "Ergo" ✓'];
const notes = ['Leave at the door.\nRing twice.', 'Call before delivery: "urgent"', 'Fragile!\tHandle with care',
  'Gate code 1234\r\nFloor 3', 'Merci beaucoup 🙏', '配達は午前中にお願いします', 'Path: C:\\Orders\\2024\\é',
  'No notes', 'See https://example.invalid/help/orders?id=42', 'Großes Paket – bitte 😀 vorsichtig',
  'Tab\tseparated\tvalues', 'Line\u0001with a control byte'];
const words = ['alpha', 'beta', 'gamma', 'delta', 'prime', 'vip', 'éte', 'ünïcode', '日本', '🚀launch', 'b2b',
  'retail', 'wholesale', 'promo', 'holiday🎄', 'rush', 'eco', 'naïve'];
const currencies = ['EUR', 'USD', 'GBP', 'JPY', 'CHF', 'SEK', 'PLN', 'BRL'];
const countries = ['FR', 'DE', 'CH', 'JP', 'BR', 'PL', 'IS', 'US', 'CA', 'KR', 'SE', 'TR'];

const name = () => pick(firstNames) + ' ' + pick(lastNames);
const email = () => pick(['jose', 'zoe', 'anna', 'sam', 'mei', 'renee', 'lukasz']) + '.' + hex(4) + '@example.com';
const id = (prefix) => str(prefix + '_' + hex(16));
const iso = () => {
  const d = new Date(int(1600000000, 1800000000) * 1000);
  return str(d.toISOString());
};

// --- resources -------------------------------------------------------------------
function address() {
  return obj([
    ['line1', str(int(1, 300) + ' ' + pick(['rue de la Paix', 'Hauptstraße', 'Main St', '中央通り', 'Rua Augusta']))],
    ['line2', chance(0.3) ? str('Apt ' + int(1, 99)) : 'null'],
    ['city', str(pick(cities))],
    ['postal_code', str(String(int(10000, 99999)))],
    ['country', str(pick(countries))],
    ['geo', obj([['lat', String(Number((rnd() * 180 - 90).toFixed(6)))], ['lng', String(Number((rnd() * 360 - 180).toFixed(7)))]])],
  ]);
}
function lineItem() {
  const pairs = [
    ['id', id('li')],
    ['sku', str('SKU-' + hex(6).toUpperCase())],
    ['name', str(pick(products))],
    ['quantity', String(int(1, 12))],
    ['unit_price', money()],
    ['unit_amount', cents()],
    ['tax_rate', small()],
    ['discount', chance(0.7) ? '0' : money()],
    ['weight_kg', chance(0.8) ? String(Number((rnd() * 20).toFixed(3))) : exotic()],
  ];
  if (chance(0.4)) pairs.push(['attributes', obj([['color', str(pick(['navy', 'rouge', '青', 'grün']))], ['size', str(pick(['S', 'M', 'L', 'XL']))]])]);
  if (chance(0.3)) pairs.push(['note', str(pick(notes))]);
  return obj(pairs);
}
function event() {
  return obj([
    ['type', str(pick(['payment.created', 'payment.authorized', 'payment.captured', 'charge.refunded', 'risk.review']))],
    ['at', ms_timestamp()],
    ['score', double17()],
    ['amount', cents()],
    ['data', obj([['message', str(pick(notes))], ['code', String(int(100, 599))], ['ratio', anyNumber()]])],
  ]);
}
function metadata() {
  const pairs = [];
  const n = int(0, 4);
  for (let i = 0; i < n; i++) pairs.push(['k' + i + '_' + pick(words), chance(0.5) ? str(pick(words) + ' ' + pick(notes)) : anyNumber()]);
  return obj(pairs);
}

// Each resource has a fixed part and one growable array (items/events/scores) so
// that a document can be grown to a target size.
function order(target) {
  const fixed = [
    ['id', id('ord')],
    ['object', str('order')],
    ['created', timestamp()],
    ['updated_at', iso()],
    ['currency', str(pick(currencies))],
    ['status', str(pick(['pending', 'paid', 'shipped', 'cancelled', 'refunded']))],
    ['livemode', bool(chance(0.5))],
    ['customer', obj([['id', id('cus')], ['name', str(name())], ['email', str(email())], ['address', address()]])],
    ['totals', obj([['subtotal', money()], ['tax', money()], ['shipping', money()], ['total', money()], ['total_cents', cents()]])],
    ['metadata', metadata()],
    ['tags', arr(Array.from({ length: int(0, 4) }, () => str(pick(words))))],
    ['notes', str(pick(notes))],
  ];
  return grow(fixed, 'items', lineItem, target);
}
function payment(target) {
  const fixed = [
    ['id', id('pay')],
    ['object', str('payment')],
    ['amount', cents()],
    ['amount_decimal', str(money())],
    ['fee', money()],
    ['exchange_rate', double17()],
    ['risk_score', chance(0.5) ? exotic() : double17()],
    ['currency', str(pick(currencies))],
    ['captured', bool(chance(0.8))],
    ['refunded', bool(chance(0.1))],
    ['failure_code', chance(0.8) ? 'null' : str('card_declined')],
    ['card', obj([['brand', str(pick(['visa', 'mastercard', 'amex', 'jcb']))], ['last4', str(String(int(1000, 9999)))],
      ['exp_month', String(int(1, 12))], ['exp_year', String(int(2025, 2035))], ['country', str(pick(countries))]])],
    ['billing_details', obj([['name', str(name())], ['email', str(email())], ['address', address()]])],
    ['description', str(pick(products) + ' — ' + pick(notes))],
    ['metadata', metadata()],
  ];
  return grow(fixed, 'events', event, target);
}
function user(target) {
  const fixed = [
    ['id', id('usr')],
    ['object', str('user')],
    ['username', str(pick(words) + '_' + hex(3))],
    ['display_name', str(name() + (chance(0.3) ? ' ' + pick(['😀', '🚀', '✅', '🎉', '日本']) : ''))],
    ['email', str(email())],
    ['locale', str(pick(['fr-FR', 'de-CH', 'ja-JP', 'pt-BR', 'en-US']))],
    ['bio', str(pick(notes) + '\n' + pick(notes))],
    ['created', timestamp()],
    ['verified', bool(chance(0.6))],
    ['followers', String(int(0, 5000000))],
    ['balance', money()],
    ['preferences', obj([['newsletter', bool(chance(0.5))], ['theme', str(pick(['dark', 'light', 'système']))],
      ['timezone', str(pick(['Europe/Paris', 'Asia/Tokyo', 'America/Sao_Paulo']))], ['volume', small()]])],
    ['address', address()],
    ['metadata', metadata()],
  ];
  return grow(fixed, 'activity', () => arr(Array.from({ length: int(2, 6) }, anyNumber)), target);
}

// Adds elements to the array member `key` until the document reaches about `target` bytes.
function grow(fixed, key, make, target) {
  const base = obj(fixed.slice()).length + str(key).length + 3;
  const items = [make()];
  let size = base + items[0].length;
  for (;;) {
    const next = make();
    if (size + next.length + 1 > target + next.length / 2) break;
    items.push(next);
    size += next.length + 1;
  }
  fixed.push([key, arr(items)]);
  return obj(fixed);
}

const resource = (target) => pick([order, payment, user])(target);

// A list page {"object":"list","data":[...],...} of about `target` bytes.
function listPage(target) {
  const data = [];
  let size = 200;
  while (size < target) {
    const r = resource(int(400, 3000));
    data.push(r);
    size += r.length + 1;
  }
  return obj([
    ['object', str('list')],
    ['url', str('/v1/' + pick(['orders', 'payments', 'users', 'search']))],
    ['has_more', bool(chance(0.5))],
    ['next_cursor', id('cur')],
    ['total_count', String(int(1000, 100000000))],
    ['request', obj([['id', id('req')], ['idempotency_key', str(hex(32))], ['elapsed_ms', double17()]])],
    ['data', arr(data)],
  ]);
}

// --- corpora ------------------------------------------------------------------------
const TOTAL = 4 * 1024 * 1024;
const corpora = [
  { name: 'api-1k', seed: 0x1001, doc: () => resource(1024) },
  { name: 'api-64k', seed: 0x6400, doc: () => listPage(64 * 1024) },
  { name: 'api-4m', seed: 0x4000, doc: () => listPage(4 * 1024 * 1024), count: 1 },
];

fs.mkdirSync(outDir, { recursive: true });
for (const c of corpora) {
  rnd = mulberry32(c.seed);
  const docs = [];
  let bytes = 0;
  while (c.count ? docs.length < c.count : bytes < TOTAL) {
    const text = c.doc();
    if (text.includes('\n') || text.includes('\r')) throw new Error('raw newline in a document');
    JSON.parse(text); // must be valid JSON
    docs.push(text);
    bytes += Buffer.byteLength(text);
  }
  const body = Buffer.from(docs.join('\n') + '\n', 'utf8');
  const file = path.join(outDir, c.name + '.jsonl');
  fs.writeFileSync(file, body);
  const sha = crypto.createHash('sha256').update(body).digest('hex');
  console.log(`${file}: ${docs.length} documents, ${bytes} bytes, mean ${Math.round(bytes / docs.length)} B, sha256 ${sha.slice(0, 16)}`);
}
