#!/usr/bin/env node
// Turns the JSON lines of jcs_bench, node_bench.js and fingerprint_bench.sh into
// the Markdown table of bench/RESULTS.md.
//
//   node bench/jcs/report.js RESULTS.jsonl...
//
// Goals (from the issue): our canonicalizer at least 10x the fastest npm
// canonicalizer and at least 3x node's bare JSON.parse on every corpus;
// fingerprint of a 1 KiB body at most 3x sha256() of the same bytes.
'use strict';

const fs = require('fs');

const rows = [];
for (const file of process.argv.slice(2)) {
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (line.startsWith('{')) rows.push(JSON.parse(line));
  }
}

const order = ['api-1k', 'api-64k', 'api-4m'];
const corpora = [...new Set(rows.filter((r) => r.corpus).map((r) => r.corpus))]
  .sort((a, b) => (order.indexOf(a) + 1 || 99) - (order.indexOf(b) + 1 || 99));
const get = (corpus, impl) => rows.find((r) => r.corpus === corpus && r.impl === impl);
const f1 = (x) => (x === undefined ? 'n/a' : x.toFixed(1));

const out = [];
out.push('| corpus | docs × mean size | ours MB/s | JSON.parse MB/s | json-canon MB/s | canonicalize MB/s | ours / fastest npm (goal ≥ 10) | ours / JSON.parse (goal ≥ 3) | goal met |');
out.push('|---|---|---:|---:|---:|---:|---:|---:|---|');
let allMet = true;
const mismatches = [];
for (const c of corpora) {
  const ours = get(c, 'ours');
  const parse = get(c, 'JSON.parse');
  const jc = get(c, 'json-canon');
  const cz = get(c, 'canonicalize');
  const fastest = Math.max(jc ? jc.median_mbps : 0, cz ? cz.median_mbps : 0);
  const rNpm = ours && fastest ? ours.median_mbps / fastest : undefined;
  const rParse = ours && parse ? ours.median_mbps / parse.median_mbps : undefined;
  const metNpm = rNpm !== undefined && rNpm >= 10;
  const metParse = rParse !== undefined && rParse >= 3;
  const met = metNpm && metParse;
  allMet = allMet && met;
  const misses = [!metNpm && 'npm', !metParse && 'JSON.parse'].filter(Boolean);
  for (const x of [jc, cz]) if (x && x.mismatches) mismatches.push(`${c}: ${x.impl} differs from ours on ${x.mismatches} documents`);
  const ref = ours || parse;
  const size = ref ? `${ref.docs} × ${(ref.bytes / ref.docs / 1024).toFixed(ref.bytes / ref.docs >= 10240 ? 0 : 1)} KiB` : '';
  out.push(`| ${c} | ${size} | ${f1(ours && ours.median_mbps)} | ${f1(parse && parse.median_mbps)} | ${f1(jc && jc.median_mbps)} | ${f1(cz && cz.median_mbps)} | ${rNpm === undefined ? 'n/a' : rNpm.toFixed(1) + '×'} | ${rParse === undefined ? 'n/a' : rParse.toFixed(2) + '×'} | ${met ? 'yes' : 'no (' + misses.join(', ') + ')'} |`);
}
out.push('');
out.push('MB = 10^6 bytes of input JSON; medians over the runs of each contender.');
const sample = rows.find((r) => r.node);
const versions = rows.filter((r) => r.version).map((r) => `${r.impl} ${r.version}`);
if (sample) out.push(`node ${sample.node}; ${[...new Set(versions)].join(', ')}.`);
out.push(mismatches.length ? 'WARNING: ' + mismatches.join('; ') : 'Outputs of json-canon and canonicalize are byte-identical to ours on every document.');
out.push(`Throughput goals: ${allMet ? 'met on every corpus' : 'NOT met on every corpus'}.`);

const sql = rows.find((r) => r.impl === 'sql');
if (sql) {
  out.push('');
  out.push('| SQL, per row (' + sql.rows + ' bodies of ' + sql.body_bytes + ' B) | µs |');
  out.push('|---|---:|');
  out.push(`| SELECT sum(length(b)) (scan only) | ${sql.scan_us.toFixed(2)} |`);
  out.push(`| sha256(b) | ${sql.sha256_us.toFixed(2)} |`);
  out.push(`| idempotency.fingerprint('POST','/orders',b) | ${sql.fingerprint_us.toFixed(2)} |`);
  out.push(`| same C function without SET search_path (diagnostic) | ${sql.fp_noset_us.toFixed(2)} |`);
  out.push('');
  out.push(`fingerprint / sha256 = ${sql.ratio.toFixed(2)} (goal ≤ 3: ${sql.ratio <= 3 ? 'met' : 'NOT met'}).`);
}
console.log(out.join('\n'));
