#!/usr/bin/env bash
# Builds the Debian packages with dpkg-buildpackage from a clean copy of the
# tree: postgresql-NN-idempotency for every PostgreSQL version that
# debian/pgversions allows and the machine's postgresql-server-dev-NN provides
# (pg_buildext), and libidempotency-client-dev. Works on the host (bookworm: 15)
# and in each chroot of scripts/test-matrix.sh (trixie: 17, forky: 18).
#
#   scripts/package.sh [OUT]    the .deb files go to OUT (default build-deb/, not committed)
#
# Installs the build dependencies it lacks (debhelper, postgresql-server-dev-all, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=$(realpath -m "${1:-build-deb}")
version=$(cat VERSION)

# build-essential: dpkg-checkbuilddeps requires it (build-essential:native) although
# debian/control cannot name it; a fresh minbase chroot lacks it.
need=(build-essential debhelper dpkg-dev postgresql-server-dev-all cmake pkgconf libssl-dev libfast-float-dev libpqxx-dev
      libpq-dev nlohmann-json3-dev libgtest-dev)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
grep -q "^pg-idempotency ($version)" debian/changelog ||
  { echo "package: debian/changelog does not start with version $version (VERSION)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$work/pg-idempotency-$version
mkdir -p "$src"
# The sources without build output: the tracked files when this is a git work
# tree, else everything but the build folders (a copy such as the chroots').
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$root" ls-files -z --cached --others --exclude-standard | tar -C "$root" --null -T - -cf - | tar -C "$src" -xf -
else
  tar -C "$root" --exclude='./build*' --exclude='*.o' --exclude='*.so' --exclude=./results --exclude=./output_iso \
    --exclude=./idempotency.control --exclude='./regression.*' -cf - . | tar -C "$src" -xf -
fi
cd "$src"
pg_buildext updatecontrol  # debian/control for this machine's PostgreSQL versions
echo "package: building for PostgreSQL $(pg_buildext supported-versions | tr '\n' ' ')"
dpkg-buildpackage -us -uc -b -j"$(nproc)" >"$work/build.log" 2>&1 || { tail -60 "$work/build.log"; exit 1; }
mkdir -p "$out"
mv "$work"/*.deb "$out"/
ls -1 "$out"/*.deb
