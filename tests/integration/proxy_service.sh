#!/usr/bin/env bash
# End-to-end test of examples/proxy-service (lease protocol) over HTTP: a slow
# upstream call outlives its lease thanks to renewal, retries during it get
# 409, retries after it replay, the upstream is called once per key, and a
# different body under the key is 422.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build-test}
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
fresh_database idem_proxy
port=$((PGPORT + 4))
start_service "$port" "$build/proxy-service" --lease-ms 600
url="http://127.0.0.1:$port"

call() {  # call OUT KEY BODY [QUERY]: status on stdout
  curl -s -o "$1.b" -D "$1.h" -w '%{http_code}' -X POST "$url/v1/call/charge${4:-}" -H "Authorization: Bearer p1" \
    -H "Idempotency-Key: $2" -H "Content-Type: application/json" --data "$3"
}

call "$work/a" pay-1 '{"amount":500}' '?delay_ms=2000' >"$work/a.s" &
first=$!
sleep 1.2  # two leases of 600 ms later
s=$(call "$work/b" pay-1 '{"amount":500}')
check "a retry during the slow call is 409" test "$s" = 409
check "with Retry-After" test -n "$(header "$work/b" Retry-After)"
check "outcome in_progress" test "$(header "$work/b" X-Lease-Outcome)" = in_progress
wait "$first"
check "the slow call is 201" test "$(cat "$work/a.s")" = 201
check "its outcome is fresh (never lost the lease)" test "$(header "$work/a" X-Lease-Outcome)" = fresh
check "the lease was renewed at least 4 times" test "$(header "$work/a" X-Lease-Renewals)" -ge 4
s=$(call "$work/c" pay-1 '{ "amount" : 500 }')
check "a retry afterwards is 201" test "$s" = 201
check "and a replay" test "$(header "$work/c" Idempotent-Replay)" = true
check "of the same bytes" cmp -s "$work/a.b" "$work/c.b"
s=$(call "$work/d" pay-1 '{"amount":900}')
check "another body under the key is 422" test "$s" = 422
s=$(call "$work/e" pay-2 '{"amount":100}')
check "a second key calls upstream again" test "$s" = 201
calls=$(curl -s "http://127.0.0.1:$((port + 1))/calls")
check "the upstream saw one call per key: $calls" test "$calls" = '{"calls":2}'

report
