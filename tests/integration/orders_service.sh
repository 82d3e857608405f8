#!/usr/bin/env bash
# End-to-end test of examples/orders-service over HTTP with curl: every
# outcome a client can see, and one order per key at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build-test}
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
fresh_database idem_shop
port=$((PGPORT + 2))
start_service "$port" "$build/orders-service"
wait_for_tables orders api_keys
url="http://127.0.0.1:$port"

# request OUT KEY BODY [QUERY] [AUTH]: writes headers to OUT.h and the body to OUT.b; prints the status
request() {
  local out=$1 key=$2 body=$3 query=${4:-} auth=${5:-Bearer user-1}
  local args=(-s -o "$out.b" -D "$out.h" -w '%{http_code}' -X POST "$url/orders$query"
              -H "Content-Type: application/json" --data "$body")
  [[ $auth != none ]] && args+=(-H "Authorization: $auth")
  [[ -n $key ]] && args+=(-H "Idempotency-Key: $key")
  curl "${args[@]}"
}

s=$(request "$work/r1" key-1 '{"item":"book","quantity":2}')
check "first POST is 201" test "$s" = 201
check "first POST is not a replay" test -z "$(header "$work/r1" Idempotent-Replay)"
check "first POST has a Location" test -n "$(header "$work/r1" Location)"

s=$(request "$work/r2" key-1 '{ "quantity" : 2, "item" : "book" }')
check "retry is 201" test "$s" = 201
check "retry says Idempotent-Replay: true" test "$(header "$work/r2" Idempotent-Replay)" = true
check "retry body is byte-identical" cmp -s "$work/r1.b" "$work/r2.b"
check "retry keeps the Location" test "$(header "$work/r1" Location)" = "$(header "$work/r2" Location)"

s=$(request "$work/r3" key-1 '{"item":"pen","quantity":2}')
check "same key, other body is 422" test "$s" = 422
check "422 is problem+json" test "$(header "$work/r3" Content-Type)" = application/problem+json
check "422 names the problem type" grep -q '"type":"/problems/idempotency-key-reuse"' "$work/r3.b"

s=$(request "$work/r4" "" '{"item":"book"}')
check "POST without a key is 400" test "$s" = 400
check "400 names the missing key" grep -q 'idempotency-key-missing' "$work/r4.b"

s=$(request "$work/r5" "$(printf 'k%.0s' {1..300})" '{"item":"book"}')
check "an over-long key is 400" test "$s" = 400

s=$(request "$work/r6" key-bad '{"item":""}')
check "an invalid order is 400" test "$s" = 400
s=$(request "$work/r7" key-bad '{"item":""}')
check "and its retry replays the 400" test "$s" = 400
check "with Idempotent-Replay: true" test "$(header "$work/r7" Idempotent-Replay)" = true

s=$(request "$work/r8" key-2 '{"item":"book"}' "" none)
check "no Authorization is 401" test "$s" = 401

# Two concurrent requests with one key: the second waits and replays.
request "$work/c1" key-3 '{"item":"lamp"}' '?delay_ms=800' >"$work/c1.s" &
first=$!
sleep 0.2
s2=$(request "$work/c2" key-3 '{"item":"lamp"}' '?delay_ms=800')
wait "$first"
check "concurrent first is 201" test "$(cat "$work/c1.s")" = 201
check "concurrent second is 201" test "$s2" = 201
check "concurrent second is a replay" test "$(header "$work/c2" Idempotent-Replay)" = true
check "concurrent bodies are identical" cmp -s "$work/c1.b" "$work/c2.b"

# A key held longer than the wait: in_progress -> 409 with Retry-After.
psql -X -q -d idem_shop -c "ALTER DATABASE idem_shop SET idempotency.wait_timeout = '100ms'"
request "$work/d1" key-4 '{"item":"slow"}' '?delay_ms=1500' >"$work/d1.s" &
first=$!
sleep 0.3
# A second instance: its connections open after the ALTER DATABASE, so they wait only 100 ms.
start_service $((port + 1)) "$build/orders-service"
s=$(curl -s -o "$work/d2.b" -D "$work/d2.h" -w '%{http_code}' -X POST "http://127.0.0.1:$((port + 1))/orders" \
      -H "Authorization: Bearer user-1" -H "Idempotency-Key: key-4" --data '{"item":"slow"}')
wait "$first"
check "a key held past the wait is 409" test "$s" = 409
check "409 has Retry-After" test -n "$(header "$work/d2" Retry-After)"
check "409 names request-in-progress" grep -q 'request-in-progress' "$work/d2.b"
psql -X -q -d idem_shop -c "ALTER DATABASE idem_shop RESET idempotency.wait_timeout"

count=$(curl -s "$url/orders/count")
check "one order per successful key (key-1, key-3, key-4): $count" test "$count" = '{"orders":3}'

report
