#!/usr/bin/env node
// Throughput of node's JSON.parse and of the npm canonicalizers on the corpora.
//
//   node bench/jcs/node_bench.js [--seconds S] [--min-runs N] CORPUS.jsonl...
//
// Three contenders, each run over every document of a corpus once per run:
//   JSON.parse    JSON.parse(text) alone: the floor of any JS canonicalizer
//   json-canon    jsonCanon(JSON.parse(text))
//   canonicalize  canonicalize(JSON.parse(text))
// Both packages take a parsed value, so their time includes JSON.parse, as a
// caller holding a request body would pay it. Documents are read and decoded to
// JS strings before timing (in node's favour: a server gets bytes), and the
// outputs are not encoded back to UTF-8 (again in node's favour: hashing needs
// bytes). Runs of the three are interleaved; each gets about S seconds (default
// 1.5) and at least N runs (default 5), after an untimed warm-up run. Throughput
// counts input UTF-8 bytes, MB = 10^6 bytes.
//
// If CORPUS's directory holds <corpus>.canon (written by jcs_bench --emit), every
// npm output is compared byte for byte with ours first; mismatches are reported
// on stderr and counted in the "mismatches" field.
//
// Prints one JSON object per corpus and contender on stdout.
'use strict';

const fs = require('fs');
const path = require('path');

// The version of an installed package (its package.json may not be exported).
function packageVersion(name) {
  let dir = path.dirname(require.resolve(name));
  for (;;) {
    const file = path.join(dir, 'package.json');
    if (fs.existsSync(file)) {
      const pkg = JSON.parse(fs.readFileSync(file, 'utf8'));
      if (pkg.name === name) return pkg.version;
    }
    const up = path.dirname(dir);
    if (up === dir) return 'unknown';
    dir = up;
  }
}

async function main() {
  let seconds = 1.5;
  let minRuns = 5;
  const files = [];
  const args = process.argv.slice(2);
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--seconds') seconds = Number(args[++i]);
    else if (args[i] === '--min-runs') minRuns = Number(args[++i]);
    else files.push(args[i]);
  }
  if (files.length === 0) {
    console.error('usage: node_bench.js [--seconds S] [--min-runs N] CORPUS.jsonl...');
    process.exit(2);
  }

  const jsonCanon = require('json-canon');
  const canonicalize = (await import('canonicalize')).default;
  const contenders = [
    { impl: 'JSON.parse', fn: (t) => JSON.parse(t) },
    { impl: 'json-canon', fn: (t) => jsonCanon(JSON.parse(t)) },
    { impl: 'canonicalize', fn: (t) => canonicalize(JSON.parse(t)) },
  ];
  const versions = { 'json-canon': packageVersion('json-canon'), canonicalize: packageVersion('canonicalize') };

  for (const file of files) {
    const corpus = path.basename(file).replace(/\..*$/, '');
    const raw = fs.readFileSync(file);
    const docs = raw.toString('utf8').split('\n').filter((l) => l.length > 0);
    const bytes = raw.length - docs.length; // without the newlines

    // Correctness: compare with our canonical bytes when they are available.
    const canonFile = path.join(path.dirname(file), corpus + '.canon');
    const mismatches = { 'json-canon': 0, canonicalize: 0 };
    if (fs.existsSync(canonFile)) {
      const ours = fs.readFileSync(canonFile).toString('utf8').split('\n').filter((l) => l.length > 0);
      if (ours.length !== docs.length) {
        console.error(`WARNING: ${canonFile} has ${ours.length} documents, ${file} has ${docs.length}`);
      }
      for (const c of contenders.slice(1)) {
        for (let d = 0; d < docs.length; d++) {
          const theirs = c.fn(docs[d]);
          if (!Buffer.from(theirs, 'utf8').equals(Buffer.from(ours[d] ?? '', 'utf8'))) {
            if (mismatches[c.impl]++ < 3) {
              console.error(`WARNING: ${corpus} document ${d + 1}: ${c.impl} output differs from ours`);
            }
          }
        }
      }
    } else {
      console.error(`note: ${canonFile} not found; outputs not compared with ours`);
    }

    // Timing.
    const runs = contenders.map(() => []);
    let sink = 0;
    const pass = (fn) => {
      const t0 = process.hrtime.bigint();
      for (let d = 0; d < docs.length; d++) {
        const r = fn(docs[d]);
        sink += typeof r === 'string' ? r.length : 1;
      }
      return Number(process.hrtime.bigint() - t0) / 1e9;
    };
    contenders.forEach((c) => pass(c.fn)); // warm-up
    const spent = contenders.map(() => 0);
    while (runs.some((r) => r.length < minRuns) || spent.some((s) => s < seconds)) {
      contenders.forEach((c, i) => {
        if (runs[i].length >= minRuns && spent[i] >= seconds) return;
        const s = pass(c.fn);
        spent[i] += s;
        runs[i].push(bytes / s / 1e6);
      });
    }
    contenders.forEach((c, i) => {
      const v = runs[i].sort((a, b) => a - b);
      const n = v.length;
      const median = n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
      const out = {
        impl: c.impl,
        corpus,
        docs: docs.length,
        bytes,
        runs: n,
        median_mbps: Number(median.toFixed(1)),
        min_mbps: Number(v[0].toFixed(1)),
        max_mbps: Number(v[n - 1].toFixed(1)),
        node: process.version,
      };
      if (c.impl in versions) {
        out.version = versions[c.impl];
        out.mismatches = mismatches[c.impl];
      }
      console.log(JSON.stringify(out));
    });
    if (sink === -1) console.log(''); // keep sink alive
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
