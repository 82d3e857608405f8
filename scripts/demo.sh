#!/usr/bin/env bash
# The demo: installs what is missing, builds and installs the extension and the
# example service, starts a throwaway PostgreSQL 15 cluster, shows the SQL
# functions, then starts examples/orders-service on a loopback port and plays a
# scripted HTTP session with curl. Stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
make -s -j"$(nproc)" && make -s install
cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DIDEM_BUILD_BENCH=OFF >/dev/null
cmake --build build-demo -j"$(nproc)" --target orders-service proxy-service >/dev/null

cluster=$(mktemp -d /tmp/idem-demo.XXXXXX)
service_pid=""
proxy_pid=""
trap '[[ -n $service_pid ]] && kill "$service_pid" 2>/dev/null; [[ -n $proxy_pid ]] && kill "$proxy_pid" 2>/dev/null
      scripts/pgcluster.sh stop "$cluster/pg"; rm -rf "$cluster"' EXIT
scripts/pgcluster.sh start "$cluster/pg" "${IDEM_DEMO_PORT:-$((20000 + RANDOM % 6000))}"  # below the ephemeral ports
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

# --- The HTTP session -------------------------------------------------------
psql -X -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE shop" -d postgres
psql -X -q -v ON_ERROR_STOP=1 -c "CREATE EXTENSION idempotency" -d shop
http_port=$((PGPORT + 1))
build-demo/orders-service --port "$http_port" --dsn "host=$PGHOST port=$PGPORT dbname=shop user=postgres" \
  2>"$cluster/service.log" &
service_pid=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$http_port/health" >/dev/null && break; sleep 0.1; done
url="http://127.0.0.1:$http_port"

# Prints the status line, the headers that matter and the body of a response.
show() {
  awk 'NR == 1 { sub(/\r$/, ""); print "  " $0; next }
       /^\r?$/ { body = 1; next }
       body { print "  " $0; next }
       tolower($0) ~ /^(idempotent-replay|location|retry-after|content-type):/ { sub(/\r$/, ""); print "  " $0 }'
}
post() {  # post KEY BODY [QUERY]
  curl -s -i -X POST "$url/orders${3:-}" -H "Authorization: Bearer user-42" -H "Idempotency-Key: $1" \
    -H "Content-Type: application/json" --data "$2"
  echo
}

echo
echo "== HTTP: examples/orders-service on $url"
echo
echo "-- 1. POST /orders with Idempotency-Key: order-1"
post order-1 '{"item":"book","quantity":1}' | show
echo
echo "-- 2. The client retries (same key, same order, other spelling): the stored response, byte for byte"
post order-1 '{ "quantity": 1, "item": "book" }' | show
echo
echo "-- 3. The same key with another order: 422"
post order-1 '{"item":"pen","quantity":3}' | show
echo
echo "-- 4. Two concurrent POSTs with Idempotency-Key: order-2 (the handler takes 1.5 s)"
post order-2 '{"item":"lamp","quantity":1}' '?delay_ms=1500' >"$cluster/first.txt" &
first_pid=$!
sleep 0.3
post order-2 '{"item":"lamp","quantity":1}' '?delay_ms=1500' >"$cluster/second.txt"
wait "$first_pid"
echo "   first:"
show <"$cluster/first.txt"
echo "   second (waited for the first, then replayed):"
show <"$cluster/second.txt"
echo
echo "-- 5. Orders in the database: one per key"
curl -s "$url/orders/count"
echo

# --- The lease protocol: an API proxy in front of a slow upstream -----------
proxy_port=$((PGPORT + 3))
build-demo/proxy-service --port "$proxy_port" --lease-ms 1000 \
  --dsn "host=$PGHOST port=$PGPORT dbname=shop user=postgres" 2>"$cluster/proxy.log" &
proxy_pid=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$proxy_port/health" >/dev/null && break; sleep 0.1; done
proxy_url="http://127.0.0.1:$proxy_port"
charge() {  # charge KEY [QUERY]
  curl -s -i -X POST "$proxy_url/v1/call/charge${2:-}" -H "Authorization: Bearer shop-7" -H "Idempotency-Key: $1" \
    -H "Content-Type: application/json" --data '{"amount":500}'
  echo
}
show_proxy() {
  awk 'NR == 1 { sub(/\r$/, ""); print "  " $0; next }
       /^\r?$/ { body = 1; next }
       body { print "  " $0; next }
       tolower($0) ~ /^(idempotent-replay|retry-after|x-lease-outcome|x-lease-renewals):/ { sub(/\r$/, ""); print "  " $0 }'
}
echo
echo "== Lease protocol: examples/proxy-service forwards POST /v1/call/charge to a payment provider once per key"
echo
echo "-- 6. The upstream takes 2.5 s; the lease is 1 s and is renewed every 333 ms while the call runs"
charge pay-1 '?delay_ms=2500' >"$cluster/pay1.txt" &
pay_pid=$!
sleep 1.5
echo "   a retry at 1.5 s, after the first lease would have run out, still finds the key held:"
charge pay-1 '?delay_ms=2500' | show_proxy
wait "$pay_pid"
echo "   the first call:"
show_proxy <"$cluster/pay1.txt"
echo
echo "-- 7. A retry afterwards gets the same charge back"
charge pay-1 '?delay_ms=2500' | show_proxy
echo
echo "-- 8. Real calls the payment provider saw"
curl -s "http://127.0.0.1:$((proxy_port + 1))/calls"
echo

