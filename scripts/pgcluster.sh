#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests, demos and benchmarks: the server
# that PG_CONFIG or pg_config on PATH names, unless PGBIN or IDEM_PG_VERSION
# names another version's binaries.
#
#   scripts/pgcluster.sh start DIR [PORT]   initdb into DIR (owned by postgres), start it
#                                           with pg_cron and idempotency preloaded (the
#                                           extension must be installed), listening on 127.0.0.1
#                                           and on a socket in DIR; writes DIR/env
#   scripts/pgcluster.sh stop DIR           stop it (immediate) and remove DIR
#
# Extra postgresql.conf lines can be passed in PGCLUSTER_CONF (one per line);
# PGCLUSTER_PRELOAD replaces shared_preload_libraries (default 'pg_cron,idempotency':
# the counters of idempotency.stats need the library preloaded).
# Source DIR/env to get PGHOST, PGPORT, PGUSER for psql, pg_regress and libpq.
set -euo pipefail

PGBIN=${PGBIN:-${IDEM_PG_VERSION:+/usr/lib/postgresql/$IDEM_PG_VERSION/bin}}
PGBIN=${PGBIN:-$("${PG_CONFIG:-pg_config}" --bindir)}  # the server that pg_config names
cmd=${1:?usage: pgcluster.sh start|stop DIR [PORT]}
dir=${2:?usage: pgcluster.sh start|stop DIR [PORT]}

as_postgres() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "$cmd" in
start)
  port=${3:-54329}
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if [[ $(id -u) -eq 0 ]]; then
    chown postgres:postgres "$dir"
    chmod o+x "$(dirname "$dir")"  # postgres must reach DIR (mktemp -d makes 0700 folders)
  fi
  as_postgres "$PGBIN/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log"; exit 1; }
  cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
shared_preload_libraries = '${PGCLUSTER_PRELOAD-pg_cron,idempotency}'
cron.database_name = 'idem_cron'
cron.host = '$dir'
max_connections = 200
fsync = off
full_page_writes = off
log_min_messages = warning
${PGCLUSTER_CONF:-}
CONF
  as_postgres "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null \
    || { cat "$dir/server.log"; exit 1; }
  cat >"$dir/env" <<ENV
export PGHOST='$dir'
export PGPORT=$port
export PGUSER=postgres
export PGDATABASE=postgres
ENV
  as_postgres "$PGBIN/psql" -h "$dir" -p "$port" -U postgres -d postgres -qAtc "CREATE DATABASE idem_cron" >/dev/null
  echo "pgcluster: running in $dir on port $port"
  ;;
stop)
  if [[ -f "$dir/data/postmaster.pid" ]]; then
    as_postgres "$PGBIN/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir"
  ;;
*)
  echo "usage: pgcluster.sh start|stop DIR [PORT]" >&2
  exit 2
  ;;
esac
