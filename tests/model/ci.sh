#!/usr/bin/env bash
# The model checker as CI runs it: a few fixed seeds plus one random seed
# (printed), MODEL_SECONDS each (default 40; about 3 minutes), against
# one throwaway cluster started here with scripts/pgcluster.sh (PGBIN from the
# environment, default /usr/lib/postgresql/15/bin; the extension must be
# installed in that PostgreSQL). Then one run of the function-call form through
# PL/Proxy (4 shards and a proxy, started by the checker on ports
# MODEL_PROXY_PORT..+4, default 26600), seed MODEL_PROXY_SEED (default 53) for
# MODEL_PROXY_SECONDS (default 30, about 40 s with the start; 0 leaves it out;
# without PL/Proxy for that PostgreSQL - Debian's postgresql-15-plproxy - it
# fails rather than skip). Every fault is on. Exits non-zero when any run finds a violation (its
# output has the seed, the history and a reduced run).
#
#   tests/model/ci.sh                 MODEL_SEEDS="1 2 3" MODEL_SECONDS=40 MODEL_PORT=...
#                                     MODEL_PROXY_SEED=53 MODEL_PROXY_SECONDS=30 MODEL_PROXY_PORT=26600
set -uo pipefail
cd "$(dirname "$0")/../.."

seconds=${MODEL_SECONDS:-40}
seeds=${MODEL_SEEDS:-"11 23 37"}
random_seed=$((RANDOM * 32768 + RANDOM + 1))
# Beside the cluster of scripts/test.sh when it runs there (PGPORT + 40), below
# the kernel's ephemeral ports (32768-60999) otherwise.
port=${MODEL_PORT:-$((${PGPORT:-$((20000 + RANDOM % 6000))} + 40))}
python=${PYTHON:-/usr/bin/python3}
proxy_seconds=${MODEL_PROXY_SECONDS:-30}
proxy_seed=${MODEL_PROXY_SEED:-53}
proxy_port=${MODEL_PROXY_PORT:-26600}

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
runs=$(($(wc -w <<<"$seeds") + 1))
pgbin=${PGBIN:-/usr/lib/postgresql/15/bin}
major=$("$pgbin/postgres" -V | sed -E 's/.* ([0-9]+).*/\1/')
sharedir=$("$pgbin/pg_config" --sharedir 2>/dev/null || echo "/usr/share/postgresql/$major")
if [[ $proxy_seconds != 0 && ! -f $sharedir/extension/plproxy.control ]]; then
  echo
  # Not a pass: a run that was asked for and could not start fails.
  echo "--- function calls through PL/Proxy: FAILED, cannot start (no plproxy.control in"
  echo "    $sharedir/extension; install Debian's postgresql-$major-plproxy, or MODEL_PROXY_SECONDS=0)"
  failed=$((failed + 1))
elif [[ $proxy_seconds != 0 ]]; then
  echo
  echo "--- function calls through PL/Proxy (4 shards), seed $proxy_seed"
  proxy_args=(--proxy-shards 4 --proxy-port "$proxy_port" --seed "$proxy_seed" --seconds "$proxy_seconds")
  "$python" tests/model/checker.py "${proxy_args[@]}" --quiet --reduce-seconds 60 >"$work/run.log" 2>&1
  rc=$?
  runs=$((runs + 1))
  if ((rc == 0)); then
    head -1 "$work/run.log"
    tail -1 "$work/run.log"
  else
    cat "$work/run.log"
    echo "proxy form FAILED (rc $rc); replay: $python tests/model/checker.py ${proxy_args[*]}"
    failed=$((failed + 1))
  fi
fi
echo
if ((failed)); then
  echo "model checker: $failed of $runs runs failed"
  exit 1
fi
echo "model checker: every run passed"
