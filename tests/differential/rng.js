// The deterministic PRNG shared by the differential generators: xoshiro128**
// (32-bit outputs) with its state seeded by splitmix32. Math.random is never
// used, so each generator's output is a pure function of its seed and count.
'use strict';

function makeRng(seed) {
  let x = seed >>> 0;
  const splitmix32 = () => {
    x = (x + 0x9e3779b9) >>> 0;
    let z = x;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
    return (z ^ (z >>> 16)) >>> 0;
  };
  let a = splitmix32(), b = splitmix32(), c = splitmix32(), d = splitmix32();
  const u32 = () => {
    const t = b << 9;
    let r = Math.imul(b, 5);
    r = Math.imul((r << 7) | (r >>> 25), 9);
    c ^= a;
    d ^= b;
    b ^= c;
    a ^= d;
    c ^= t;
    d = (d << 11) | (d >>> 21);
    return r >>> 0;
  };
  const float = () => u32() / 4294967296; // [0, 1)
  const int = (n) => Math.floor(float() * n); // [0, n), n <= 2^32
  const range = (lo, hi) => lo + int(hi - lo + 1); // [lo, hi]
  const pick = (list) => list[int(list.length)];
  const chance = (p) => float() < p;
  const digits = (n, leadingNonZero = true) => {
    let s = leadingNonZero ? String(1 + int(9)) : String(int(10));
    for (let i = 1; i < n; ++i) s += String(int(10));
    return s;
  };
  // Picks a generator by weight: entries [weight, fn].
  const weighted = (table) => {
    let total = 0;
    for (const [w] of table) total += w;
    let r = float() * total;
    for (const [w, fn] of table) {
      if ((r -= w) < 0) return fn;
    }
    return table[table.length - 1][1];
  };
  return { u32, float, int, range, pick, chance, digits, weighted };
}

module.exports = { makeRng };
