#!/usr/bin/env bash
# The demo: installs what is missing, builds and installs the extension, starts
# a throwaway PostgreSQL 15 cluster and shows pg_idempotency at work. Stops
# everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
make -s -j"$(nproc)" && make -s install

cluster=$(mktemp -d /tmp/idem-demo.XXXXXX)
trap 'scripts/pgcluster.sh stop "$cluster/pg"; rm -rf "$cluster"' EXIT
scripts/pgcluster.sh start "$cluster/pg" "${IDEM_DEMO_PORT:-$((20000 + RANDOM % 20000))}"
# shellcheck disable=SC1091
source "$cluster/pg/env"

psql -X -q -v ON_ERROR_STOP=1 <<'SQL'
\pset footer off
CREATE EXTENSION idempotency;
\echo
\echo '== Canonical JSON (RFC 8785): member order, whitespace, escapes and number spelling do not matter'
SELECT idempotency.jcs('{ "currency": "eur", "amount": 1.0e3, "note": "caf\u00e9" }') AS canonical;
\echo '== Two spellings of one request body get one fingerprint'
SELECT encode(idempotency.fingerprint('POST', '/orders', convert_to('{"amount":1000,"currency":"eur"}', 'UTF8')), 'hex') AS first,
       encode(idempotency.fingerprint('post', '/orders', convert_to(E'{\n  "currency" : "\\u0065ur",\n  "amount" : 1e3\n}', 'UTF8')), 'hex') AS retry;
\echo '== A different body gets a different one'
SELECT encode(idempotency.fingerprint('POST', '/orders', convert_to('{"amount":1001,"currency":"eur"}', 'UTF8')), 'hex') AS other;
\echo '== Volatile members can be excluded with JSON Pointers'
SELECT idempotency.fingerprint('POST', '/orders', convert_to('{"amount":5,"sent_at":"2026-11-30T10:00:00Z"}', 'UTF8'), ARRAY['/sent_at'])
     = idempotency.fingerprint('POST', '/orders', convert_to('{"sent_at":"2026-11-30T10:00:07Z","amount":5}', 'UTF8'), ARRAY['/sent_at'])
       AS same_without_timestamp;
\echo '== Make a write idempotent: the order and its key row commit in one transaction'
CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL);
BEGIN;
SELECT outcome FROM idempotency.begin('user-42', 'key-1', 'create_order',
       idempotency.fingerprint('POST', '/orders', convert_to('{"item":"book"}', 'UTF8')));
INSERT INTO orders (item) VALUES ('book');
SELECT idempotency.complete('user-42', 'key-1', 201, convert_to('{"id":1,"item":"book"}', 'UTF8'),
       '{"Location":"/orders/1"}');
COMMIT;
\echo '== The retry (body spelled differently) replays the stored response byte for byte'
SELECT outcome, response_status, response_headers, convert_from(response_body, 'UTF8') AS body
  FROM idempotency.begin('user-42', 'key-1', 'create_order',
       idempotency.fingerprint('POST', '/orders', convert_to('{ "item" : "book" }', 'UTF8')));
\echo '== Another request under the same key is a mismatch (HTTP 422)'
SELECT outcome FROM idempotency.begin('user-42', 'key-1', 'create_order',
       idempotency.fingerprint('POST', '/orders', convert_to('{"item":"pen"}', 'UTF8')));
\echo '== One order for all of it'
SELECT count(*) AS orders FROM orders;
\echo '== Bad input is an error with an SQLSTATE, never a crash'
\set VERBOSITY default
\set ON_ERROR_STOP 0
SELECT idempotency.jcs('{"amount":1,"amount":2}');
SELECT idempotency.jcs('[1e400]');
SQL
