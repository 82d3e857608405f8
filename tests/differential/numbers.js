#!/usr/bin/env node
// Differential test data for the number formatter: V8's String(x) (ECMAScript
// Number::toString, which RFC 8785 section 3.2.2.3 adopts) on many doubles.
//
//   node numbers.js N | jcs_tool check-numbers
//
// Prints N lines "HEX,EXPECTED": HEX is the 64-bit IEEE-754 pattern of a finite
// double as 16 lower-case hex digits, EXPECTED is String(x). About 80% of the
// patterns are uniform random bits (every exponent equally likely, so subnormals,
// huge and tiny values all appear); the rest are "interesting" values: integers
// near powers of two (2^53 in particular), powers of ten and powers of two with
// their bit-pattern neighbours, the 1e21 and 1e-7 layout boundaries, short
// decimals k/10^j, random short decimal literals, and the extreme constants.
// NaN and Infinity patterns are never printed.
//
// The output is a pure function of N: the PRNG is xoshiro128** with a fixed seed
// (SEED below), seeded through splitmix32; Math.random is not used. All lines are
// built before the first byte is written, so a generator that throws prints
// nothing and check-numbers fails on zero records instead of passing on a prefix.
'use strict';

const SEED = 0x4a43534e; // "JCSN"
const INTERESTING_SHARE = 0.2;

const count = Number(process.argv[2] ?? 1000000);
if (!Number.isInteger(count) || count < 1) {
  process.stderr.write('usage: node numbers.js COUNT\n');
  process.exit(2);
}

// ---------------------------------------------------------------------------
// PRNG: see rng.js.

const { makeRng } = require('./rng');

const rng = makeRng(SEED);

// ---------------------------------------------------------------------------
// Bit views of one double.

const f64 = new Float64Array(1);
const u32v = new Uint32Array(f64.buffer); // little-endian: [low, high]
const u64v = new BigUint64Array(f64.buffer);
const littleEndian = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
if (!littleEndian) throw new Error('numbers.js assumes a little-endian host');

const HEX = [];
for (let i = 0; i < 256; ++i) HEX.push(i.toString(16).padStart(2, '0'));
function hex32(v) {
  return HEX[v >>> 24] + HEX[(v >>> 16) & 255] + HEX[(v >>> 8) & 255] + HEX[v & 255];
}

// Current content of f64 as a line, or null for NaN/Infinity.
function lineOfView() {
  const hi = u32v[1];
  if (((hi >>> 20) & 0x7ff) === 0x7ff) return null;
  return hex32(hi) + hex32(u32v[0]) + ',' + String(f64[0]);
}

// Moves the bit pattern of `value` by `delta` units (nextafter when |delta| = 1,
// in the direction away from zero for positive delta). Wraps modulo 2^64; the
// caller drops NaN/Infinity results.
function neighbour(value, delta) {
  f64[0] = value;
  u64v[0] = BigInt.asUintN(64, u64v[0] + BigInt(delta));
  return f64[0];
}

// ---------------------------------------------------------------------------
// Interesting values. Each generator returns a double (maybe non-finite).

const CONSTANTS = [
  0, Number.MIN_VALUE, Number.MAX_VALUE, 2 ** -1022, 2 ** -1022 - Number.MIN_VALUE, Number.EPSILON,
  Number.MAX_SAFE_INTEGER, 2 ** 53, 1, 0.1, 0.2, 0.3, 0.1 + 0.2, 1 / 3, 2 / 3, Math.PI, Math.E,
  1e21, 1e-7, 1e-6, 1e20, 9.999999999999999e20, 999999999999999900000, 123456789012345680000,
  0.000001, 0.0000001, 5e-324, 1e-323, 2.2250738585072014e-308, 1.7976931348623157e308,
  4.35, 0.5, 1.5, 2.5, 1e23, 8.41e21, 5e-7, 9.5e-7, 333333333.3333333, 295147905179352830000,
];

const interesting = [
  // Integers near powers of two, 2^53 most of all.
  () => {
    const p = rng.chance(0.5) ? 53 : rng.range(30, 80);
    const k = rng.range(-2048, 2048);
    const unit = p > 52 ? 2 ** (p - 52) : 1;
    return 2 ** p + k * unit;
  },
  // Integer literals with 1..30 digits (rounded by the parser beyond 2^53).
  () => Number(rng.digits(rng.range(1, 30))),
  // Powers of ten and their neighbours.
  () => neighbour(Number('1e' + rng.range(-324, 308)), rng.range(-3, 3)),
  // Powers of two and their neighbours.
  () => neighbour(2 ** rng.range(-1074, 1023), rng.range(-2, 2)),
  // Around the 1e21 switch to exponent notation.
  () => {
    const base = rng.pick([1e21, 1e20, 1e22, 999999999999999900000, 9.999999999999999e20, 5e21, 1.5e21]);
    return neighbour(base, rng.range(-16, 16));
  },
  () => Number(rng.digits(rng.range(1, 17)) + 'e' + rng.range(3, 7)) * (rng.chance(0.5) ? 1 : 1000),
  // Around the 1e-7 switch to exponent notation.
  () => {
    const base = rng.pick([1e-7, 1e-6, 1e-8, 9.999999999999999e-7, 9.99e-8, 1.5e-7, 5e-7, 0.000001]);
    return neighbour(base, rng.range(-16, 16));
  },
  () => Number(rng.digits(rng.range(1, 17)) + 'e-' + rng.range(6, 24)),
  // Short decimals k/10^j, both as literals (correctly rounded) and as divisions.
  () => Number(rng.digits(rng.range(1, 6)) + 'e-' + rng.range(0, 25)),
  () => rng.range(1, 999999) / 10 ** rng.range(0, 22),
  // Random decimal literals with 1..17 significant digits over the whole range.
  () => Number(rng.digits(1) + '.' + rng.digits(rng.range(1, 16), false) + 'e' + rng.range(-330, 310)),
  // Constants and their neighbours.
  () => neighbour(rng.pick(CONSTANTS), rng.range(-2, 2)),
  // Arithmetic results with long expansions.
  () => rng.range(1, 1000) / rng.range(1, 1000) * 10 ** rng.range(-30, 30),
];

// ---------------------------------------------------------------------------
// Generation: lines joined into ~1 MB chunks.

const chunks = [];
let lines = [];
let produced = 0;
while (produced < count) {
  let line;
  if (rng.float() < INTERESTING_SHARE) {
    let value = rng.pick(interesting)();
    if (rng.chance(0.5)) value = -value;
    f64[0] = value;
    line = lineOfView();
  } else {
    u32v[1] = rng.u32();
    u32v[0] = rng.u32();
    line = lineOfView();
  }
  if (line === null) continue;
  lines.push(line);
  ++produced;
  if (lines.length === 32768) {
    lines.push('');
    chunks.push(lines.join('\n'));
    lines = [];
  }
}
if (lines.length) {
  lines.push('');
  chunks.push(lines.join('\n'));
}

// ---------------------------------------------------------------------------
// Output with backpressure.

process.stdout.on('error', (err) => {
  process.stderr.write(`numbers.js: ${err.message}\n`);
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
