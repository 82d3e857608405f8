#!/usr/bin/env bash
# The model checker as CI runs it, every fault on, against one throwaway
# cluster started here with scripts/pgcluster.sh (PGBIN from the environment,
# default: `${PG_CONFIG:-pg_config} --bindir`; the extension must be installed there):
#   - a few fixed seeds plus one random seed (printed), MODEL_SECONDS each
#     (default 30);
#   - the random seed again in the distributed mode (sessions with
#     idempotency.distributed = on), MODEL_DISTRIBUTED_SECONDS (default 20; 0
#     leaves it out), on the same cluster;
#   - the random seed again with the expiry policy refuse (--refuse 0.5:
#     half the requests' actions keep tombstones; invariant EXP),
#     MODEL_REFUSE_SECONDS (default 20; 0 leaves it out), on the same cluster;
#   - the role dimension (--roles: principal roles bound by
#     idempotency.principal_binding, hostile calls, every path of a value to a
#     session), seed MODEL_ROLES_SEED (default the random seed) for
#     MODEL_ROLES_SECONDS (default 20; 0 leaves it out) twice: on the same
#     cluster (library preloaded) and on a second one started here without
#     idempotency in shared_preload_libraries (port MODEL_PORT + 1);
#   - the trusted edition (make trusted, installed with psql -f on a cluster
#     without the library, port MODEL_PORT + 3), the random seed, plain and
#     with --refuse 0.5, MODEL_TRUSTED_SECONDS each (default 20; 0 leaves it out);
#   - the function-call form through PL/Proxy (4 shards and a proxy, started by
#     the checker on ports MODEL_PROXY_PORT..+4, default MODEL_PORT + 2), seed
#     MODEL_PROXY_SEED (default 53) for MODEL_PROXY_SECONDS (default 30, about
#     40 s with the start; 0 leaves it out; without PL/Proxy for that
#     PostgreSQL - Debian's postgresql-15-plproxy - it fails rather than skip).
# Exits non-zero when any run finds a violation (its output has the seed, the
# history and a reduced run, and the command that replays it is printed).
#
#   tests/model/ci.sh                 MODEL_SEEDS="1 2 3" MODEL_SECONDS=40 MODEL_PORT=...
#                                     MODEL_DISTRIBUTED_SECONDS=20 MODEL_REFUSE_SECONDS=20
#                                     MODEL_ROLES_SECONDS=20 MODEL_ROLES_SEED=...
#                                     MODEL_PROXY_SEED=53 MODEL_PROXY_SECONDS=30 MODEL_PROXY_PORT=26600
set -uo pipefail
cd "$(dirname "$0")/../.."

seconds=${MODEL_SECONDS:-30}
seeds=${MODEL_SEEDS:-"11 23 37"}
random_seed=$((RANDOM * 32768 + RANDOM + 1))
# Beside the cluster of scripts/test.sh when it runs there (PGPORT + 40), below
# the kernel's ephemeral ports (32768-60999) otherwise.
port=${MODEL_PORT:-$((${PGPORT:-$((20000 + RANDOM % 6000))} + 40))}
python=${PYTHON:-/usr/bin/python3}
distributed_seconds=${MODEL_DISTRIBUTED_SECONDS:-20}
refuse_seconds=${MODEL_REFUSE_SECONDS:-20}
roles_seconds=${MODEL_ROLES_SECONDS:-20}
roles_seed=${MODEL_ROLES_SEED:-$random_seed}
proxy_seconds=${MODEL_PROXY_SECONDS:-30}
proxy_seed=${MODEL_PROXY_SEED:-53}
# Beside this script's clusters, not a fixed port: a fixed one met a cluster left
# running there by something else on the machine (both runs of 2026-12-02 failed so).
proxy_port=${MODEL_PROXY_PORT:-$((port + 2))}

work=$(mktemp -d /tmp/idem-model-ci.XXXXXX)
trap 'scripts/pgcluster.sh stop "$work/pg"; scripts/pgcluster.sh stop "$work/nopreload"; rm -rf "$work"' EXIT
scripts/pgcluster.sh start "$work/pg" "$port" >/dev/null || exit 1

runs=0
failed=0
# one_run TITLE [VAR=VALUE...] -- CHECKER-ARGS...: one run of the checker; its
# first and last lines when it passes, all of it and the replay when it fails.
one_run() {
  local title=$1 rc
  shift
  local env=()
  while [[ $1 != -- ]]; do env+=("$1"); shift; done
  shift
  echo
  echo "--- $title"
  runs=$((runs + 1))
  env "${env[@]}" "$python" tests/model/checker.py "$@" --quiet >"$work/run.log" 2>&1
  rc=$?
  if ((rc == 0)); then
    head -1 "$work/run.log"
    tail -1 "$work/run.log"
  else
    cat "$work/run.log"
    echo "$title FAILED (rc $rc); replay: $(printf '%q ' "${env[@]}" "$python" tests/model/checker.py "$@")"
    failed=$((failed + 1))
  fi
}

echo "model checker: fixed seeds $seeds, random seed $random_seed, $seconds s each"
for seed in $seeds $random_seed; do
  one_run "seed $seed" -- --cluster-dir "$work/pg" --seed "$seed" --seconds "$seconds" --reduce-seconds 90
done
if [[ $distributed_seconds != 0 ]]; then
  one_run "distributed mode (idempotency.distributed = on), seed $random_seed" \
    PGOPTIONS="-c idempotency.distributed=on" -- \
    --cluster-dir "$work/pg" --seed "$random_seed" --seconds "$distributed_seconds" --reduce-seconds 90
fi
if [[ $refuse_seconds != 0 ]]; then
  one_run "expiry policy refuse (tombstones), seed $random_seed" -- \
    --cluster-dir "$work/pg" --refuse 0.5 --seed "$random_seed" --seconds "$refuse_seconds" --reduce-seconds 90
fi
if [[ $roles_seconds != 0 ]]; then
  one_run "role dimension, library preloaded, seed $roles_seed" -- \
    --cluster-dir "$work/pg" --roles --seed "$roles_seed" --seconds "$roles_seconds" --reduce-seconds 60
  if PGCLUSTER_PRELOAD=pg_cron scripts/pgcluster.sh start "$work/nopreload" "$((port + 1))" >/dev/null; then
    one_run "role dimension, library not preloaded, seed $roles_seed" -- \
      --cluster-dir "$work/nopreload" --roles --seed "$roles_seed" --seconds "$roles_seconds" --reduce-seconds 60
  else
    echo "--- role dimension, library not preloaded: FAILED, cannot start a cluster on port $((port + 1))"
    runs=$((runs + 1))
    failed=$((failed + 1))
  fi
  scripts/pgcluster.sh stop "$work/nopreload"
fi
# The trusted edition (make trusted: SQL and PL/pgSQL, installed with psql -f)
# on a cluster without the library, with the same invariants; the role
# dimension does not apply (it cannot bind principals, docs/sql-reference.md).
trusted_seconds=${MODEL_TRUSTED_SECONDS:-20}
if [[ $trusted_seconds != 0 ]]; then
  make -s trusted >/dev/null
  trusted_script=build/trusted/idempotency--$(cat VERSION).sql
  if PGCLUSTER_PRELOAD=pg_cron scripts/pgcluster.sh start "$work/nopreload" "$((port + 3))" >/dev/null; then
    one_run "trusted edition, seed $random_seed" -- \
      --cluster-dir "$work/nopreload" --install-script "$trusted_script" --seed "$random_seed" \
      --seconds "$trusted_seconds" --reduce-seconds 60
    one_run "trusted edition, expiry policy refuse (tombstones), seed $random_seed" -- \
      --cluster-dir "$work/nopreload" --install-script "$trusted_script" --refuse 0.5 \
      --seed "$random_seed" --seconds "$trusted_seconds" --reduce-seconds 60
  else
    echo "--- trusted edition: FAILED, cannot start a cluster on port $((port + 3))"
    runs=$((runs + 1))
    failed=$((failed + 1))
  fi
  scripts/pgcluster.sh stop "$work/nopreload"
fi
pgbin=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}
major=$("$pgbin/postgres" -V | sed -E 's/.* ([0-9]+).*/\1/')
sharedir=$("$pgbin/pg_config" --sharedir 2>/dev/null || echo "/usr/share/postgresql/$major")
if [[ $proxy_seconds != 0 && ! -f $sharedir/extension/plproxy.control ]]; then
  echo
  # Not a pass: a run that was asked for and could not start fails.
  echo "--- function calls through PL/Proxy: FAILED, cannot start (no plproxy.control in"
  echo "    $sharedir/extension; install Debian's postgresql-$major-plproxy, or MODEL_PROXY_SECONDS=0)"
  runs=$((runs + 1))
  failed=$((failed + 1))
elif [[ $proxy_seconds != 0 ]]; then
  one_run "function calls through PL/Proxy (4 shards), seed $proxy_seed" -- \
    --proxy-shards 4 --proxy-port "$proxy_port" --seed "$proxy_seed" --seconds "$proxy_seconds" --reduce-seconds 60
fi
echo
if ((failed)); then
  echo "model checker: $failed of $runs runs failed"
  exit 1
fi
echo "model checker: every run passed"
