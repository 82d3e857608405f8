#!/usr/bin/env bash
# idempotency.principal_binding = 'current_user' holds on every path by which a
# value reaches a session, with the library loaded each of the four ways:
# not preloaded (loaded by the first call), session_preload_libraries,
# local_preload_libraries (from $libdir/plugins) and shared_preload_libraries.
# A superuser binds the role `app` by ALTER ROLE, ALTER DATABASE, ALTER ROLE
# IN DATABASE or the configuration file (ALTER SYSTEM); `app` then tries every
# way around it: startup options (PGOPTIONS), options= in the connection
# string, SET, SET LOCAL, set_config(.., false/true), RESET, DISCARD ALL,
# superuser-owned SECURITY DEFINER functions with and without a SET clause,
# SET ROLE. Each case records the SQLSTATE of each call (00000: it ran) and
# must match what docs/sql-reference.md promises: a call for another principal
# never runs; when a value for the binding was dropped at load, no call runs.
# Two clusters of its own (PGBIN from the environment, as scripts/pgcluster.sh):
# ports PGPORT + 50 and + 51 of the cluster of scripts/test.sh
# (IDEM_BINDING_PORT overrides the first).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PGBIN=${PGBIN:-/usr/lib/postgresql/${IDEM_PG_VERSION:-15}/bin}
base=${IDEM_BINDING_PORT:-$((${PGPORT:-54329} + 50))}
dir=$(mktemp -d /tmp/idem-binding.XXXXXX)
plugin=
cleanup() {
  scripts/pgcluster.sh stop "$dir/plain" >/dev/null 2>&1 || true
  scripts/pgcluster.sh stop "$dir/shared" >/dev/null 2>&1 || true
  [[ -n $plugin ]] && rm -f "$plugin"
  rm -rf "$dir"
}
trap cleanup EXIT

# local_preload_libraries loads only from $libdir/plugins: link the installed
# library there for the run (removed at the end) unless it is there already.
libdir=$("$PGBIN/pg_config" --pkglibdir)
if [[ ! -e $libdir/plugins/idempotency.so ]]; then
  mkdir -p "$libdir/plugins"
  ln -s ../idempotency.so "$libdir/plugins/idempotency.so"
  plugin=$libdir/plugins/idempotency.so
fi

# The configuration file's value goes into an included file (ALTER SYSTEM
# cannot name a setting that is not defined yet before PostgreSQL 17).
export PGCLUSTER_CONF="include_if_exists = 'binding.conf'"
PGCLUSTER_PRELOAD=pg_cron scripts/pgcluster.sh start "$dir/plain" "$base" >/dev/null
scripts/pgcluster.sh start "$dir/shared" "$((base + 1))" >/dev/null
unset PGCLUSTER_CONF

# Superuser statements in cluster $1 ("plain" or "shared"), database $2.
su() { psql -X -q -At -v ON_ERROR_STOP=1 -h "$dir/$1" -p "$(port "$1")" -U postgres -d "$2" -c "$3"; }
port() { if [[ $1 == plain ]]; then echo "$base"; else echo "$((base + 1))"; fi; }

setup_database() {  # cluster database
  su "$1" postgres "CREATE DATABASE $2"
  su "$1" "$2" "CREATE EXTENSION idempotency;
    GRANT USAGE ON SCHEMA idempotency TO app, app_alt;
    GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA idempotency TO app, app_alt;
    CREATE SCHEMA binding_test;
    GRANT USAGE ON SCHEMA binding_test TO app;
    CREATE FUNCTION binding_test.definer_claim(principal text, key text) RETURNS boolean
      LANGUAGE sql SECURITY DEFINER AS \$\$ SELECT idempotency.claim(principal, key) \$\$;
    CREATE FUNCTION binding_test.definer_set_claim(principal text, key text) RETURNS boolean
      LANGUAGE sql SECURITY DEFINER SET idempotency.principal_binding = 'current_user'
      AS \$\$ SELECT idempotency.claim(principal, key) \$\$;"
}
for c in plain shared; do
  su "$c" postgres "CREATE ROLE app LOGIN; CREATE ROLE app_alt; GRANT app_alt TO app"
done
setup_database plain d_none
setup_database plain d_session
setup_database plain d_local
setup_database shared d_shared
su plain postgres "ALTER DATABASE d_session SET session_preload_libraries = 'idempotency';
  ALTER DATABASE d_local SET local_preload_libraries = 'idempotency'"

# How the superuser binds app: $1 = set or reset.
configure() {  # source cluster database set|reset
  local value="= 'current_user'" sys
  [[ $4 == reset ]] && value=""
  case $1 in
  role) su "$2" "$3" "ALTER ROLE app ${4^^} idempotency.principal_binding $value" ;;
  database) su "$2" "$3" "ALTER DATABASE $3 ${4^^} idempotency.principal_binding $value" ;;
  role_in_database)
    su "$2" "$3" "ALTER ROLE app IN DATABASE $3 ${4^^} idempotency.principal_binding $value" ;;
  file)
    if [[ $4 == set ]]; then
      echo "idempotency.principal_binding = 'current_user'" >"$dir/$2/data/binding.conf"
    else
      : >"$dir/$2/data/binding.conf"
    fi
    chmod 644 "$dir/$2/data/binding.conf"
    su "$2" "$3" "SELECT pg_reload_conf()" >/dev/null
    local want=current_user got
    [[ $4 == reset ]] && want=off
    for _ in $(seq 50); do
      got=$(su "$2" "$3" "SELECT coalesce(nullif(current_setting('idempotency.principal_binding',
        true), ''), 'off')")
      [[ $got == "$want" ]] && return 0
      sleep 0.1
    done
    echo "FAIL: the configuration file's value did not arrive"; exit 1 ;;
  esac
}

# SQL that calls claim for $1 and prints "$2=SQLSTATE" (00000: it ran).
call() { printf "SELECT idempotency.claim('%s', :'k') \\\\g /dev/null\n\\\\echo %s=:SQLSTATE\n" "$1" "$2"; }
definer() {
  printf "SELECT binding_test.%s('%s', :'k') \\\\g /dev/null\n\\\\echo %s=:SQLSTATE\n" "$1" "$2" "$3"
}
step() { printf "%s \\\\g /dev/null\n\\\\echo %s=:SQLSTATE\n" "$1" "$2"; }
both() { call victim victim; call app own; }

# The attacks: name, SQL (run as app), and how app connects.
declare -A sql
sql[plain]=$(both)
sql[pgoptions]=$(both; step "DISCARD ALL" discard; both; step "RESET ALL" reset; both)
sql[conninfo]=$(both)
sql[set]=$(step "SET idempotency.principal_binding = off" set; both)
# Inside a transaction the own principal goes first: after an error the
# transaction is aborted (25P02).
sql[set_local]=$(step BEGIN begin; step "SET LOCAL idempotency.principal_binding = off" set
  call app own; call victim victim; step COMMIT commit; both)
sql[set_config]=$(step "SELECT set_config('idempotency.principal_binding', 'off', false)" set; both)
sql[set_config_local]=$(step BEGIN begin
  step "SELECT set_config('idempotency.principal_binding', 'off', true)" set
  call app own; call victim victim; step COMMIT commit; both)
sql[rolled_back_set]=$(step BEGIN begin; step "SET idempotency.principal_binding = off" set
  step ROLLBACK rollback; both)
sql[reset]=$(step "SET idempotency.principal_binding = off" set
  step "RESET idempotency.principal_binding" reset; both)
sql[discard]=$(step "DISCARD ALL" discard; both)
sql[definer]=$(definer definer_claim victim victim; definer definer_claim app own)
sql[definer_set]=$(definer definer_set_claim victim victim; definer definer_set_claim app own; both)
sql[set_role]=$(step "SET ROLE app_alt" role; call victim victim; call app_alt alt; call app own)
sql[set_role_set]=$(step "SET ROLE app_alt" role
  step "SET idempotency.principal_binding = off" set; call victim victim; call app_alt alt)
sql[dropped_definer_set]=$(both; definer definer_set_claim victim victim
  definer definer_set_claim app own; both)
sql[dropped_set_role]=$(step "SET ROLE app_alt" role; call victim victim; call app_alt alt)

# Expected SQLSTATEs per attack, or per attack and mode: "none" (loaded by the
# first call), "shared", and "loaded" for every mode but none (session and
# local preload load it at connection, after the startup options; shared
# preload refuses such a startup option at connection).
declare -A expect
d2='victim=42501 own=42501'
ok='victim=42501 own=00000'
expect[plain]="$ok"
expect[pgoptions.none]="$d2 discard=00000 $d2 reset=00000 $d2"
expect[pgoptions.loaded]="${expect[pgoptions.none]}"
expect[pgoptions.shared]=refused
expect[conninfo.none]="$d2"
expect[conninfo.loaded]="$d2"
expect[conninfo.shared]=refused
expect[set.none]="set=00000 $d2"
expect[set.loaded]="set=42501 $ok"
expect[set_local.none]="begin=00000 set=00000 own=42501 victim=25P02 commit=00000 $d2"
expect[set_local.loaded]="begin=00000 set=42501 own=25P02 victim=25P02 commit=00000 $ok"
expect[set_config.none]="${expect[set.none]}"
expect[set_config.loaded]="${expect[set.loaded]}"
expect[set_config_local.none]="${expect[set_local.none]}"
expect[set_config_local.loaded]="${expect[set_local.loaded]}"
expect[rolled_back_set.none]="begin=00000 set=00000 rollback=00000 $ok"
expect[rolled_back_set.loaded]="begin=00000 set=42501 rollback=00000 $ok"
expect[reset.none]="set=00000 reset=00000 $ok"
expect[reset.loaded]="set=42501 reset=42501 $ok"
expect[discard]="discard=00000 $ok"
expect[definer]="$ok"
expect[definer_set]="$ok $ok"
expect[set_role]="role=00000 victim=42501 alt=00000 own=42501"
expect[set_role_set.none]="role=00000 set=00000 victim=42501 alt=42501"
expect[set_role_set.loaded]="role=00000 set=42501 victim=42501 alt=00000"
expect[dropped_definer_set.none]="$d2 $d2 $d2"
expect[dropped_definer_set.loaded]="$d2 $d2 $d2"
expect[dropped_definer_set.shared]=refused
expect[dropped_set_role.none]="role=00000 victim=42501 alt=42501"
expect[dropped_set_role.loaded]="${expect[dropped_set_role.none]}"
expect[dropped_set_role.shared]=refused

failures=0
cases=0
n=0
run_case() {  # mode cluster database source attack
  local mode=$1 cluster=$2 db=$3 source=$4 attack=$5 want got
  want=${expect[$attack.$mode]:-}
  [[ -z $want && $mode != none ]] && want=${expect[$attack.loaded]:-}
  [[ -z $want ]] && want=${expect[$attack]:-}
  [[ -n $want ]] || { echo "FAIL: no expectation for $attack ($mode)"; exit 1; }
  n=$((n + 1))
  local options=() conninfo="host=127.0.0.1 port=$(port "$cluster") user=app dbname=$db"
  case $attack in
  pgoptions | dropped_*) options=(env "PGOPTIONS=-c idempotency.principal_binding=off") ;;
  conninfo) conninfo+=" options='-c idempotency.principal_binding=off'" ;;
  esac
  got=$(printf '%s\n' "${sql[$attack]}" | "${options[@]}" psql -X -q -At -v "k=binding-$n" \
    -v VERBOSITY=terse "$conninfo" 2>"$dir/stderr" | tr '\n' ' ' | sed 's/ $//') || true
  if [[ -z $got ]] && grep -q "FATAL" "$dir/stderr"; then got=refused; fi
  cases=$((cases + 1))
  if [[ $got != "$want" ]]; then
    failures=$((failures + 1))
    echo "FAIL: $mode / $source / $attack: got '$got', want '$want'"
    sed 's/^/    /' "$dir/stderr" | head -5
  fi
}

# Every attack with ALTER ROLE; the ones where the level of the configured
# value matters (startup options, SET, SET LOCAL, DISCARD ALL) with each source.
all_attacks="plain pgoptions conninfo set set_local set_config set_config_local rolled_back_set
  reset discard definer definer_set set_role set_role_set dropped_definer_set dropped_set_role"
source_attacks="plain pgoptions conninfo set set_local discard"
for mode in none session local shared; do
  cluster=plain db=d_$mode
  [[ $mode == shared ]] && cluster=shared
  for source in role database role_in_database file; do
    configure "$source" "$cluster" "$db" set
    attacks=$source_attacks
    [[ $source == role ]] && attacks=$all_attacks
    for attack in $attacks; do run_case "$mode" "$cluster" "$db" "$source" "$attack"; done
    configure "$source" "$cluster" "$db" reset
  done
done

# A superuser's SET lifts the refusal after a drop (in its own session: the
# value dropped was set under SET ROLE app, before the library loaded).
superuser_lifts=$(psql -X -q -At -v k=binding-su -v VERBOSITY=terse \
  -h "$dir/plain" -p "$base" -U postgres -d d_none 2>"$dir/stderr" <<SQL | tr '\n' ' '
SET ROLE app;
SET idempotency.principal_binding = off;
RESET ROLE;
$(call postgres own)
SET idempotency.principal_binding = 'current_user';
$(call victim victim)
$(call postgres own)
RESET idempotency.principal_binding;
$(call postgres own)
SQL
)
cases=$((cases + 1))
want="own=42501 victim=42501 own=00000 own=00000 "
[[ $superuser_lifts == "$want" ]] || {
  failures=$((failures + 1))
  echo "FAIL: superuser SET after a drop: got '$superuser_lifts', want '$want'"
}

echo "binding paths: $cases cases, $failures failed"
[[ $failures -eq 0 ]]
