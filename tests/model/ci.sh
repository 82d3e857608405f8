#!/usr/bin/env bash
# The model checker as CI runs it: a few fixed seeds plus one random seed
# (printed), MODEL_SECONDS each (default 40; about 3 minutes in all), against
# one throwaway cluster started here with scripts/pgcluster.sh (PGBIN from the
# environment, default /usr/lib/postgresql/15/bin; the extension must be
# installed in that PostgreSQL). Every fault is on. Exits non-zero when any run
# finds a violation (its output has the seed, the history and a reduced run).
#
#   tests/model/ci.sh                 MODEL_SEEDS="1 2 3" MODEL_SECONDS=40 MODEL_PORT=...
set -uo pipefail
cd "$(dirname "$0")/../.."

seconds=${MODEL_SECONDS:-40}
seeds=${MODEL_SEEDS:-"11 23 37"}
random_seed=$((RANDOM * 32768 + RANDOM + 1))
port=${MODEL_PORT:-$((20000 + RANDOM % 20000))}
python=${PYTHON:-/usr/bin/python3}

work=$(mktemp -d /tmp/idem-model-ci.XXXXXX)
trap 'scripts/pgcluster.sh stop "$work/pg"; rm -rf "$work"' EXIT
scripts/pgcluster.sh start "$work/pg" "$port" >/dev/null || exit 1

echo "model checker: fixed seeds $seeds, random seed $random_seed, $seconds s each"
failed=0
for seed in $seeds $random_seed; do
  echo
  echo "--- seed $seed"
  "$python" tests/model/checker.py --cluster-dir "$work/pg" --seed "$seed" --seconds "$seconds" \
    --quiet --reduce-seconds 90 >"$work/run.log" 2>&1
  rc=$?
  if ((rc == 0)); then
    head -1 "$work/run.log"
    tail -1 "$work/run.log"
  else
    cat "$work/run.log"
    echo "seed $seed FAILED (rc $rc); replay: $python tests/model/checker.py --seed $seed --seconds $seconds"
    failed=$((failed + 1))
  fi
done
echo
if ((failed)); then
  echo "model checker: $failed of $(($(wc -w <<<"$seeds") + 1)) runs failed"
  exit 1
fi
echo "model checker: every run passed"
