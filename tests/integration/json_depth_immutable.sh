#!/usr/bin/env bash
# jcs and fingerprint are IMMUTABLE although idempotency.max_json_depth decides
# whether they raise 54000 (docs/sql-reference.md, "max_json_depth and
# IMMUTABLE"). What the docs promise, checked here: the setting never changes a
# result, only whether there is one; an expression index built under a higher
# limit keeps answering; a REINDEX or a write under a lower limit fails with
# 54000 and changes nothing.
set -euo pipefail
db=idem_json_depth
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
trap 'psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT
q() { psql -X -qAt -v ON_ERROR_STOP=1 -d "$db" "$@"; }
q -c "CREATE EXTENSION idempotency"
failures=0
check() {  # check DESCRIPTION EXPECTED ACTUAL
  if [[ $2 == "$3" ]]; then echo "ok - $1"; else echo "not ok - $1: expected [$2], got [$3]"; failures=$((failures + 1)); fi
}
# sqlstate SQL...: the SQLSTATE the statements end with ("00000" when none).
sqlstate() {
  local state
  state=$(q -c "\\set VERBOSITY sqlstate" "$@" 2>&1 >/dev/null | sed -nE 's/^.*ERROR: +([0-9A-Z]{5}).*$/\1/p') || true
  echo "${state:-00000}"
}
# nested N: a document nested N deep, [[[...1...]]].
nested() { printf '%*s' "$1" '' | tr ' ' '['; printf 1; printf '%*s' "$1" '' | tr ' ' ']'; }
deep=$(nested 40)

check "jcs and fingerprint stay IMMUTABLE (the documented choice)" i \
  "$(q -c "SELECT string_agg(DISTINCT provolatile::text, ' ') FROM pg_proc
            WHERE pronamespace = 'idempotency'::regnamespace AND proname IN ('jcs', 'fingerprint')")"
at_default=$(q -c "SELECT md5(idempotency.jcs('$deep'))")
for limit in 40 100 1000 1000000; do
  check "max_json_depth = $limit: the same canonical form" "$at_default" \
    "$(q -c "SET idempotency.max_json_depth = $limit" -c "SELECT md5(idempotency.jcs('$deep'))")"
done
for limit in 1 39; do
  check "max_json_depth = $limit: 54000, no other result" 54000 \
    "$(sqlstate -c "SET idempotency.max_json_depth = $limit" -c "SELECT idempotency.jcs('$deep')")"
done

q -c "CREATE TABLE docs (id int PRIMARY KEY, body bytea NOT NULL)" \
  -c "INSERT INTO docs VALUES (1, convert_to('$deep', 'UTF8')), (2, convert_to('{\"a\":1}', 'UTF8'))" \
  -c "CREATE INDEX docs_fp ON docs (idempotency.fingerprint('POST', '/x', body))"
lookup="SELECT id FROM docs WHERE idempotency.fingerprint('POST', '/x', body)
          = idempotency.fingerprint('POST', '/x', convert_to('{ \"a\": 1 }', 'UTF8'))"
check "index built at the default limit answers under a lower one" 2 \
  "$(q -c "SET idempotency.max_json_depth = 5" -c "SET enable_seqscan = off" -c "$lookup")"
check "REINDEX under a lower limit: 54000" 54000 \
  "$(sqlstate -c "SET idempotency.max_json_depth = 5" -c "REINDEX INDEX docs_fp")"
check "a write under a lower limit: 54000" 54000 \
  "$(sqlstate -c "SET idempotency.max_json_depth = 5" -c "INSERT INTO docs VALUES (3, convert_to('$deep', 'UTF8'))")"
check "nothing changed: the index still answers, two rows" "2 2" \
  "$(q -c "SET enable_seqscan = off" -c "$lookup") $(q -c "SELECT count(*) FROM docs")"
echo "$failures failed"
((failures == 0))
