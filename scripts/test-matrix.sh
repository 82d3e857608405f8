#!/usr/bin/env bash
# The whole suite on other PostgreSQL versions, each inside a Debian chroot.
#
#   scripts/test-matrix.sh [VERSION...]     default: 17 18
#
# VERSION is a PostgreSQL major version; each maps to the Debian suite that
# ships it: 15 -> bookworm, 17 -> trixie, 18 -> forky (PostgreSQL 16 is in no
# Debian suite). For each version the script makes (once per machine) or reuses
# a `debootstrap --variant=minbase` chroot under the cache folder, copies the
# work tree in, and runs scripts/test.sh there with IDEM_PG_VERSION=VERSION and
# IDEM_TEST_SCOPE=matrix: install the suite's packages (scripts/install-deps.sh),
# build and install the extension and the client with that suite's compiler and
# libpqxx, start a throwaway cluster of that version (pg_cron preloaded), run
# pg_regress (including the upgrade from 0.1.0), the isolation specs, pgTAP, the
# client tests directly and through the suite's pgbouncer, the pg_cron run and
# the model checker when present. Ends with one line per version, then
# "N passed, N failed".
#
# Environment:
#   IDEM_MATRIX_CACHE   cache folder for the chroots (default /var/cache/idempotency-matrix);
#                       must be outside the repository
#   IDEM_MATRIX_MIRROR  Debian archive to bootstrap from (default: read from the
#                       host's apt sources at run time)
#   IDEM_MATRIX_REBUILD=1  throw the chroots away and make them again
#   IDEM_MATRIX_LOG     folder for each version's full log (default: the cache folder)
#   IDEM_MATRIX_PORT    first of the 6 ports a version's cluster, pgbouncer and
#                       services use (default: random in 28000-28989)
#
# Needs root (debootstrap, chroot, mount). Everything mounted is unmounted on
# every exit path; a lock per chroot keeps two runs from sharing one.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

cache=${IDEM_MATRIX_CACHE:-/var/cache/idempotency-matrix}
versions=("$@")
((${#versions[@]})) || versions=(17 18)

if [[ $(id -u) -ne 0 ]]; then
  echo "test-matrix: needs root (debootstrap, chroot, mount)" >&2
  echo "0 passed, 1 failed"
  exit 1
fi
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
case "$cache/" in
"$root"/*)
  echo "test-matrix: the cache folder $cache is inside the repository" >&2
  echo "0 passed, 1 failed"
  exit 1
  ;;
esac
logs=${IDEM_MATRIX_LOG:-$cache}
mkdir -p "$logs"

# suite_of VERSION: the Debian suite that ships that PostgreSQL major version.
suite_of() {
  case "$1" in
  15) echo bookworm ;;
  17) echo trixie ;;
  18) echo forky ;;
  *) return 1 ;;
  esac
}

# host_mirror: the Debian archive the host's own apt sources use (the entry
# that carries the host's codename), from deb822 .sources files or one-line
# .list files. Prints nothing when none is found.
host_mirror() {
  local codename files=() f
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [[ -f /etc/apt/sources.list ]] && files+=(/etc/apt/sources.list)
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] && files+=("$f")
  done
  ((${#files[@]})) || return 0
  awk -v want="$codename" '
    function flush() {
      if (types ~ /(^|[ \t])deb([ \t]|$)/ && enabled !~ /^[ \t]*no/ && !found) {
        n = split(suites, s, /[ \t]+/)
        for (i = 1; i <= n; i++) if (s[i] == want) { split(uris, u, /[ \t]+/); for (j in u) if (u[j] ~ /^https?:/) { print u[j]; found = 1; exit } }
      }
      types = uris = suites = enabled = ""
    }
    FILENAME ~ /\.sources$/ {
      if ($0 ~ /^[ \t]*$/) { flush(); next }
      if ($0 ~ /^#/) next
      if (tolower($1) == "types:") { types = substr($0, index($0, ":") + 1) }
      else if (tolower($1) == "uris:") { uris = substr($0, index($0, ":") + 1) }
      else if (tolower($1) == "suites:") { suites = substr($0, index($0, ":") + 1) }
      else if (tolower($1) == "enabled:") { enabled = substr($0, index($0, ":") + 1) }
      next
    }
    FNR == 1 { flush() }
    $1 == "deb" {
      line = $0; sub(/\[[^]]*\]/, "", line); split(line, w, /[ \t]+/)
      if (w[3] == want && w[2] ~ /^https?:/) { print w[2]; found = 1; exit }
    }
    END { if (!found) flush() }
  ' "${files[@]}"
}

# Mounts made for the chroot in use, unmounted (in reverse) on every exit path.
mounts=()
unmount_all() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount "${mounts[$i]}" 2>/dev/null || umount -l "${mounts[$i]}" 2>/dev/null || true
  done
  mounts=()
}
trap 'unmount_all' EXIT
trap 'unmount_all; exit 130' INT TERM

# mount_chroot DIR: /proc, /dev (bind), /dev/pts, a fresh /dev/shm.
mount_chroot() {
  local dir=$1
  mount -t proc proc "$dir/proc" && mounts+=("$dir/proc") || return 1
  mount --bind /dev "$dir/dev" && mounts+=("$dir/dev") || return 1
  mount -t devpts -o newinstance,ptmxmode=0666 devpts "$dir/dev/pts" 2>/dev/null && mounts+=("$dir/dev/pts")
  mount -t tmpfs -o size=512m,mode=1777 shm "$dir/dev/shm" && mounts+=("$dir/dev/shm") || return 1
}

# in_chroot DIR COMMAND...: runs COMMAND inside the chroot with a clean environment.
in_chroot() {
  local dir=$1
  shift
  chroot "$dir" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "$@"
}

# make_chroot SUITE DIR: debootstrap (minbase) into DIR.tmp, configure apt, move to DIR.
make_chroot() {
  local suite=$1 dir=$2 mirror script=$1
  mirror=${IDEM_MATRIX_MIRROR:-$(host_mirror)}
  if [[ -z $mirror ]]; then
    echo "test-matrix: no Debian archive found in the host's apt sources (set IDEM_MATRIX_MIRROR)" >&2
    return 1
  fi
  # Older debootstrap releases know no script for the newest suites: sid's works for them.
  [[ -e /usr/share/debootstrap/scripts/$suite ]] || script=/usr/share/debootstrap/scripts/sid
  rm -rf "$dir.tmp"
  echo "test-matrix: debootstrap $suite (minbase) into $dir"
  debootstrap --variant=minbase --include=ca-certificates "$suite" "$dir.tmp" "$mirror" "$script" \
    >"$dir.debootstrap.log" 2>&1 || { tail -30 "$dir.debootstrap.log"; return 1; }
  echo "deb $mirror $suite main" >"$dir.tmp/etc/apt/sources.list"
  # A suite under development may carry a Release file past its Valid-Until.
  cat >"$dir.tmp/etc/apt/apt.conf.d/90idempotency-matrix" <<'APT'
Acquire::Check-Valid-Until "false";
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Dpkg::Options { "--force-confdef"; "--force-confold"; };
APT
  # The tests make their own clusters: no default cluster at package install.
  mkdir -p "$dir.tmp/etc/postgresql-common"
  echo "create_main_cluster = false" >"$dir.tmp/etc/postgresql-common/createcluster.conf"
  printf '#!/bin/sh\nexit 101\n' >"$dir.tmp/usr/sbin/policy-rc.d"  # no service starts in the chroot
  chmod 755 "$dir.tmp/usr/sbin/policy-rc.d"
  mv "$dir.tmp" "$dir"
}

# prepare SUITE DIR: makes the chroot when missing, mounts, copies the work
# tree (tracked and new files, nothing ignored) to DIR/src.
prepare() {
  local suite=$1 dir=$2
  if [[ ${IDEM_MATRIX_REBUILD:-0} == 1 ]]; then rm -rf "$dir"; fi
  [[ -d $dir ]] || make_chroot "$suite" "$dir" || return 1
  mount_chroot "$dir" || return 1
  rm -rf "$dir/src"
  mkdir -p "$dir/src"
  git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done |
    tar -C "$root" --null -T - -cf - | tar -C "$dir/src" -xf -
}

# lock SUITE / unlock: one run per chroot at a time.
lock() {
  exec 9>"$cache/$1.lock"
  flock 9
}
unlock() {
  flock -u 9
  exec 9>&-
}

# --exec VERSION COMMAND...: runs COMMAND in /src of that version's chroot
# (for looking into a failure by hand); mounts and unmounts around it.
if [[ ${versions[0]} == --exec ]]; then
  version=${versions[1]:?usage: test-matrix.sh --exec VERSION COMMAND...}
  suite=$(suite_of "$version") || { echo "test-matrix: no Debian suite ships PostgreSQL $version" >&2; exit 2; }
  lock "$suite"
  status=0
  prepare "$suite" "$cache/$suite" &&
    in_chroot "$cache/$suite" env IDEM_PG_VERSION="$version" IDEM_TEST_SCOPE=matrix \
      IDEM_TEST_PORT="${IDEM_MATRIX_PORT:-$((28000 + RANDOM % 990))}" bash -c 'cd /src && eval "$1"' bash "${versions[*]:2}" || status=$?
  unmount_all
  unlock
  exit "$status"
fi

# run_version VERSION: runs the suite in that version's chroot; adds its line to results.
results=()
passed=0
failed=0
run_version() {
  local version=$1 suite dir start=$SECONDS log status=0 summary
  if ! suite=$(suite_of "$version"); then
    results+=("PostgreSQL $version: FAILED (no Debian suite ships it)")
    failed=$((failed + 1))
    return
  fi
  dir=$cache/$suite
  log=$logs/$suite.log
  : >"$log"
  lock "$suite"
  prepare "$suite" "$dir" >>"$log" 2>&1 && {
    echo "test-matrix: PostgreSQL $version in $suite, log in $log"
    in_chroot "$dir" env IDEM_PG_VERSION="$version" IDEM_TEST_SCOPE=matrix \
      IDEM_TEST_PORT="${IDEM_MATRIX_PORT:-$((28000 + RANDOM % 990))}" bash -c 'cd /src && bash scripts/test.sh' \
      >>"$log" 2>&1
  } || status=$?
  unmount_all
  unlock
  grep -E '^--- .*: (ok|FAILED)' "$log" | sed "s/^/  [$version] /"
  summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
  if ((status == 0)); then
    passed=$((passed + 1))
    results+=("PostgreSQL $version ($suite): ok, ${summary:-no summary} ($((SECONDS - start)) s)")
  else
    failed=$((failed + 1))
    results+=("PostgreSQL $version ($suite): FAILED, ${summary:-see $log} ($((SECONDS - start)) s)")
    tail -40 "$log" | sed "s/^/  [$version] /"
  fi
}

for v in "${versions[@]}"; do
  run_version "$v"
done

echo
printf '%s\n' "${results[@]}"
echo "$passed passed, $failed failed"
((failed == 0))
