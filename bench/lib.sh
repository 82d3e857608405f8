# Shell helpers shared by the bench scripts (sourced, not run).

# median: the median of the numbers on standard input, one per line.
median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# cpu_ticks DIR...: clock ticks (getconf CLK_TCK a second) used so far by the
# clusters of scripts/pgcluster.sh in those folders: utime + stime of each
# postmaster and its live children, plus the postmaster's cutime + cstime (the
# backends that exited, reaped by it).
cpu_ticks() {
  local dir pid child total=0
  for dir in "$@"; do
    pid=$(head -1 "$dir/data/postmaster.pid")
    # fields after the command name: utime is 14, stime 15, cutime 16, cstime 17 of /proc/PID/stat
    total=$((total + $(sed 's/.*) //' "/proc/$pid/stat" | awk '{ print $12 + $13 + $14 + $15 }')))
    for child in $(pgrep -P "$pid"); do
      total=$((total + $(sed 's/.*) //' "/proc/$child/stat" 2>/dev/null | awk '{ print $12 + $13 }' || echo 0)))
    done
  done
  echo "$total"
}

# pgbench_value OUTPUT WHAT: a figure from pgbench's report: transactions
# ("number of transactions actually processed"), tps, or failed.
pgbench_value() {
  case $2 in
  transactions) sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$1" ;;
  tps) sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$1" | head -1 ;;
  failed) sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' <<<"$1" ;;
  esac
}

# ratio A B: A / B with two decimals.
ratio() { echo "scale=2; $1 / $2" | bc; }

# private_root ROOT SOURCE_DIR [PGVER]: a private copy of the PostgreSQL
# installation under ROOT (PostgreSQL finds its share and lib folders relative
# to its binaries, so a copy of /usr/lib/postgresql/V and /usr/share/postgresql/V
# is a second, independent installation) with the extension of SOURCE_DIR
# built and installed into it. Its binaries: ROOT/usr/lib/postgresql/V/bin.
private_root() {
  local r=$1 src=$2 v=${3:-15}
  rm -rf "$r"
  mkdir -p "$r/usr/lib/postgresql" "$r/usr/share/postgresql" "$r/usr/include"
  cp -a "/usr/lib/postgresql/$v" "$r/usr/lib/postgresql/"
  cp -a "/usr/share/postgresql/$v" "$r/usr/share/postgresql/"
  ln -s /usr/include/postgresql "$r/usr/include/postgresql"
  local pgc=$r/usr/lib/postgresql/$v/bin/pg_config
  (cd "$src" && make -s clean >/dev/null 2>&1; make -s -j"$(nproc)" PG_CONFIG="$pgc" >/dev/null &&
    make -s install PG_CONFIG="$pgc" >/dev/null)
}
