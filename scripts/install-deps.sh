#!/usr/bin/env bash
# Installs every Debian bookworm package the build, the tests, the demo and the
# benchmarks need. Runs apt-get only when something is missing. Needs root (or sudo).
set -euo pipefail

packages=(
  build-essential cmake pkg-config clang-14 libclang-rt-14-dev
  postgresql-15 postgresql-server-dev-15 postgresql-15-cron postgresql-15-pgtap
  libtap-parser-sourcehandler-pgtap-perl
  libssl-dev libfast-float-dev libgtest-dev googletest
  libpqxx-dev nlohmann-json3-dev libcpp-httplib-dev pgbouncer
  curl wrk bc
  python3-psycopg python3-pytest python3-setuptools python3-pip python3-venv
)
# node (differential tests, benchmark peers) ships with the machine; Debian's
# nodejs/npm only where it is missing (they conflict with a preinstalled node).
command -v node >/dev/null || packages+=(nodejs)
command -v npm >/dev/null || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
