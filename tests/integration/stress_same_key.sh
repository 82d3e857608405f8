#!/usr/bin/env bash
# 32 concurrent connections send the same key 200 times each while an effect
# table counts inserts. Expect exactly one effect and one 'started'; every
# other answer is 'replay' or 'in_progress'; no error anywhere.
set -euo pipefail
cd "$(dirname "$0")/../.."
db=idem_stress
clients=${STRESS_CLIENTS:-32}
rounds=${STRESS_ROUNDS:-200}
work=$(mktemp -d)
trap 'rm -rf "$work"; psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT

psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
psql -X -q -v ON_ERROR_STOP=1 -d "$db" <<'SQL'
CREATE EXTENSION idempotency;
CREATE TABLE effects (id bigserial PRIMARY KEY, client int);
CREATE TABLE answers (client int, outcome text);
SQL

# One psql script per client: begin; on 'started' write the effect (holding
# the key a little, so that the others pile up behind it) and complete.
for ((c = 0; c < clients; c++)); do
  {
    echo '\set ON_ERROR_STOP 1'
    for ((r = 0; r < rounds; r++)); do
      cat <<SQL
BEGIN;
SELECT outcome, outcome = 'started' AS started
  FROM idempotency.begin('stress', 'same-key', 'stress', idempotency.fingerprint('POST', '/stress'), wait => '30 s') \gset
INSERT INTO answers VALUES ($c, :'outcome');
\if :started
INSERT INTO effects (client) VALUES ($c);
SELECT pg_sleep(0.2);
SELECT idempotency.complete('stress', 'same-key', 201, convert_to('one effect', 'UTF8'));
\endif
COMMIT;
SQL
    done
  } >"$work/client$c.sql"
done

pids=()
for ((c = 0; c < clients; c++)); do
  psql -X -q -d "$db" -f "$work/client$c.sql" >"$work/client$c.out" 2>&1 &
  pids+=($!)
done
failed=0
for ((c = 0; c < clients; c++)); do
  if ! wait "${pids[$c]}"; then
    echo "client $c failed:"
    tail -5 "$work/client$c.out"
    failed=1
  fi
done
((failed == 0)) || exit 1

result=$(psql -X -At -d "$db" -c "
  SELECT (SELECT count(*) FROM effects) || ' ' ||
         (SELECT count(*) FROM answers) || ' ' ||
         (SELECT count(*) FROM answers WHERE outcome = 'started') || ' ' ||
         (SELECT count(*) FROM answers WHERE outcome NOT IN ('started', 'replay', 'in_progress'))")
read -r effects answers started others <<<"$result"
echo "effects=$effects answers=$answers started=$started other_outcomes=$others"
psql -X -At -d "$db" -c "SELECT outcome, count(*) FROM answers GROUP BY 1 ORDER BY 1"
[[ $effects == 1 && $answers == $((clients * rounds)) && $started == 1 && $others == 0 ]]
