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
#   IDEM_MATRIX_PORT    first of the ports a version's cluster, pgbouncer and
#                       services use (base + 0..25; default 28000 + 100 x (VERSION - 15),
#                       so that versions never share a port and runs of one
#                       version, serialized by its lock, reuse theirs; the
#                       package test uses base + 50, --major-upgrade 28600-28602)
#   IDEM_MATRIX_NAMES   suites to run by name in each chroot (scripts/test.sh NAME...;
#                       default: the whole matrix tier), e.g. with IDEM_MATRIX_PACKAGES=0:
#                       IDEM_MATRIX_NAMES=lock_timeout_race IDEM_MATRIX_PACKAGES=0 scripts/test-matrix.sh 17
#   IDEM_MATRIX_SUITE=0     skip the suite (only the package test)
#   IDEM_MATRIX_PACKAGES=0  skip the package test: scripts/package.sh in the
#                       suite's chroot, then tests/packages/install_test.sh in a
#                       clean chroot of the suite (a copy of a pristine minbase
#                       one, SUITE.base) where apt installs the .deb files
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

# The chroots: making, mounting, entering, locking.
# shellcheck source=scripts/lib/chroot.sh
source "$root/scripts/lib/chroot.sh"
trap 'unmount_all' EXIT
trap 'unmount_all; exit 130' INT TERM

# --exec VERSION COMMAND...: runs COMMAND in /src of that version's chroot
# (for looking into a failure by hand); mounts and unmounts around it.
if [[ ${versions[0]} == --exec ]]; then
  version=${versions[1]:?usage: test-matrix.sh --exec VERSION COMMAND...}
  suite=$(suite_of "$version") || { echo "test-matrix: no Debian suite ships PostgreSQL $version" >&2; exit 2; }
  lock "$suite"
  status=0
  prepare "$suite" "$cache/$suite" &&
    in_chroot "$cache/$suite" env IDEM_PG_VERSION="$version" IDEM_TEST_SCOPE=matrix \
      IDEM_TEST_PORT="$(port_of "$version")" bash -c 'cd /src && eval "$1"' bash "${versions[*]:2}" || status=$?
  unmount_all
  unlock
  exit "$status"
fi

# package_test VERSION SUITE DIR: builds the packages in DIR (the suite's
# chroot, mounted by the caller) and installs them into a clean chroot.
package_test() {
  local version=$1 suite=$2 dir=$3 base=$cache/$2.base clean=$cache/$2.pkgtest status=0
  rm -rf "$dir/debs"
  in_chroot "$dir" bash -c 'cd /src && bash scripts/package.sh /debs' || return 1
  unmount_all
  [[ -d $base ]] || make_chroot "$suite" "$base" || return 1
  unmount_stale "$clean"
  rm -rf --one-file-system "$clean"
  cp -a "$base" "$clean"
  mkdir -p "$clean/debs"
  cp "$dir"/debs/*.deb "$clean/debs/"
  copy_tree "$clean"
  mount_chroot "$clean" &&
    in_chroot "$clean" env IDEM_TEST_PORT="$(($(port_of "$version") + 50))" \
      bash /src/tests/packages/install_test.sh "$version" /debs /src/tests/install_consumer || status=$?
  unmount_all
  unmount_stale "$clean"
  rm -rf --one-file-system "$clean"
  return "$status"
}

# --major-upgrade: keys made on PostgreSQL 15 (bookworm chroot) moved to 17
# (trixie) and then to 18 (forky) with the newer version's pg_dump and
# pg_restore, checked at each hop (tests/upgrade/major_step.sh). The three
# chroots are in use at once (three locks); their clusters listen on three
# ports of IDEM_MATRIX_PORT's range and see each other over 127.0.0.1.
if [[ ${versions[0]} == --major-upgrade ]]; then
  base_port=${IDEM_MATRIX_PORT:-28600}
  exec 7>"$cache/bookworm.lock" 8>"$cache/trixie.lock" 9>"$cache/forky.lock"
  flock 7 && flock 8 && flock 9
  status=0
  hop() {  # hop VERSION STEP ARGS...: runs major_step.sh in VERSION's chroot
    local version=$1 suite
    shift
    suite=$(suite_of "$version")
    in_chroot "$cache/$suite" env IDEM_PG_VERSION="$version" PGBIN="/usr/lib/postgresql/$version/bin" \
      bash /src/tests/upgrade/major_step.sh "$@"
  }
  {
    for v in 15 17 18; do
      suite=$(suite_of "$v")
      prepare "$suite" "$cache/$suite" &&
        in_chroot "$cache/$suite" env IDEM_PG_VERSION="$v" IDEM_TEST_SCOPE=matrix bash -c \
          'cd /src && scripts/install-deps.sh >/dev/null && make -s -j2 PG_CONFIG=/usr/lib/postgresql/$IDEM_PG_VERSION/bin/pg_config &&
           make -s install PG_CONFIG=/usr/lib/postgresql/$IDEM_PG_VERSION/bin/pg_config' >/dev/null || exit 1
      mkdir -p "$cache/$suite/xfer"
    done
    hop 15 fill "$base_port" &&
      cp "$cache/bookworm/xfer/before.txt" "$cache/trixie/xfer/" &&
      hop 17 move "$((base_port + 1))" "$base_port" &&
      cp "$cache/trixie/xfer/before.txt" "$cache/forky/xfer/" &&
      hop 18 move "$((base_port + 2))" "$((base_port + 1))"
  } || status=$?
  for v in 15 17 18; do hop "$v" stop >/dev/null 2>&1 || true; done
  unmount_all
  exec 7>&- 8>&- 9>&-
  echo
  if ((status == 0)); then echo "major upgrade 15 -> 17 -> 18: ok"; echo "1 passed, 0 failed"; else
    echo "major upgrade 15 -> 17 -> 18: FAILED"; echo "0 passed, 1 failed"; fi
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
  lock "$suite"  # then the log: another run may be writing it until it lets go
  : >"$log"
  local packages="" pstatus=0
  echo "test-matrix: PostgreSQL $version in $suite, log in $log"
  if prepare "$suite" "$dir" >>"$log" 2>&1; then
    if [[ ${IDEM_MATRIX_SUITE:-1} != 0 ]]; then
      in_chroot "$dir" env IDEM_PG_VERSION="$version" IDEM_TEST_SCOPE=matrix \
        IDEM_TEST_PORT="$(port_of "$version")" IDEM_MATRIX_NAMES="${IDEM_MATRIX_NAMES:-}" \
        bash -c 'cd /src && bash scripts/test.sh $IDEM_MATRIX_NAMES' \
        >>"$log" 2>&1 || status=$?
      summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
    else
      summary="suite skipped"
    fi
    if [[ ${IDEM_MATRIX_PACKAGES:-1} != 0 ]]; then
      echo "=== Debian packages: build, install into a clean $suite chroot" >>"$log"
      package_test "$version" "$suite" "$dir" >>"$log" 2>&1 || pstatus=$?
      if ((pstatus == 0)); then packages="; packages ok"; else packages="; packages FAILED"; status=1; fi
    fi
  else
    status=1
  fi
  unmount_all
  unlock
  grep -E '^--- .*: (ok|FAILED)|^ok - package: ' "$log" | sed "s/^/  [$version] /"
  if ((status == 0)); then
    passed=$((passed + 1))
    results+=("PostgreSQL $version ($suite): ok, ${summary:-no summary}$packages ($((SECONDS - start)) s)")
  else
    failed=$((failed + 1))
    results+=("PostgreSQL $version ($suite): FAILED, ${summary:-see $log}$packages ($((SECONDS - start)) s)")
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
