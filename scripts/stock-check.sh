#!/usr/bin/env bash
# The stock-machine check: the whole test command (.ci/run) on a NEW minimal
# Debian bookworm, as a new user's machine would run it. Catches what the
# developers' machines hide: a package no install step names, a cache an
# earlier run left, `localhost` resolving to ::1 first.
#
#   scripts/stock-check.sh [DIR]            debootstrap --variant=minbase bookworm into DIR
#                                           (default /var/tmp/idem-stock; removed first), a
#                                           fresh clone of this repository's HEAD in
#                                           DIR/root/pg_idempotency, then .ci/run in it as root
#   scripts/stock-check.sh --prepare [DIR]  the same without the run (the chroot and clone only)
#
# Root, network to the host's Debian archive (read from the host's apt sources). The
# chroot gets of the host its apt sources, its resolv.conf, the local CA certificates in
# /usr/local/share/ca-certificates, and the toolchains that a new machine of the project's
# kind (`polyglot`: env/machines/polyglot.md in the tool library) ships outside Debian's
# packages, copied without their caches: Go (/usr/local/go), Rust by rustup (/root/.rustup,
# /root/.cargo/bin), pyenv's Pythons (/root/.pyenv) and Node.js with npm (/usr/bin/node,
# /usr/lib/node_modules); and the machine's PATH. So the run inside installs every Debian
# package itself, fills every registry cache itself (npm, cargo, the Go module cache and
# pip start empty) and bootstraps the PostgreSQL 17 and 18 chroots (IDEM_MATRIX, default
# "17 18") into a cache folder of its own. IDEM_TEST_PORT (default 24000) is the test
# command's port: the chroot shares the host's network.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prepare_only=0
if [[ ${1:-} == --prepare ]]; then
  prepare_only=1
  shift
fi
dir=${1:-/var/tmp/idem-stock}
[[ $(id -u) -eq 0 ]] || { echo "stock-check: run as root (debootstrap, chroot)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "stock-check: apt-get install -y debootstrap" >&2; exit 2; }
# shellcheck source=lib/chroot.sh
source "$root/scripts/lib/chroot.sh"
mirror=$(host_mirror)
[[ -n $mirror ]] || { echo "stock-check: no Debian archive in the host's apt sources" >&2; exit 2; }

mounted=()
undo() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -R "${mounted[i]}" 2>/dev/null || true; done
}
trap undo EXIT

if mountpoint -q "$dir/proc" 2>/dev/null || mountpoint -q "$dir/dev" 2>/dev/null; then
  echo "stock-check: $dir is in use (mounted)" >&2
  exit 2
fi
rm -rf "$dir"
echo "stock-check: debootstrap --variant=minbase bookworm $dir $mirror"
debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$dir.debootstrap.log" 2>&1 ||
  { echo "stock-check: debootstrap failed, see $dir.debootstrap.log" >&2; exit 1; }
mkdir -p "$dir/usr/local/share/ca-certificates"
cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/" 2>/dev/null || true
if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
  cp /etc/apt/sources.list.d/debian.sources "$dir/etc/apt/sources.list.d/"
  rm -f "$dir/etc/apt/sources.list"
fi
cp /etc/resolv.conf "$dir/etc/"
# The new machine's own toolchains (not Debian's): copies, so that nothing the run
# downloads lands in the host's caches. A toolchain the host lacks is left out.
copy_toolchain() {  # copy_toolchain PATH...: each path to the same place in the chroot
  local p
  for p in "$@"; do
    [[ -e $p ]] || continue
    mkdir -p "$dir$(dirname "$p")"
    cp -a "$p" "$dir$p"
  done
}
copy_toolchain /usr/local/go /root/.cargo/bin /root/.cargo/env /root/.rustup/settings.toml \
  /root/.pyenv /usr/bin/node /usr/lib/node_modules /usr/bin/npm /usr/bin/npx
for t in /root/.rustup/toolchains/stable-*; do [[ -e $t ]] && copy_toolchain "$t"; done
for t in /root/.rustup/toolchains/*; do  # the toolchain stable points to, if a link
  [[ -L /root/.rustup/toolchains/stable-x86_64-unknown-linux-gnu ]] && copy_toolchain "$t"
done
git clone -q "$root" "$dir/root/pg_idempotency"
echo "stock-check: $(git -C "$dir/root/pg_idempotency" log --oneline -1)"
((prepare_only)) && { echo "stock-check: prepared $dir"; exit 0; }

mount -t proc proc "$dir/proc" && mounted+=("$dir/proc")
mount --rbind /dev "$dir/dev" && mount --make-rslave "$dir/dev" && mounted+=("$dir/dev")
start=$(date +%s)
status=0
machine_path=/usr/local/go/bin:/root/go/bin:/root/.cargo/bin:/root/.pyenv/shims:/root/.pyenv/bin
chroot "$dir" /usr/bin/env -i HOME=/root PATH="$machine_path:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  CI=true IDEM_MATRIX="${IDEM_MATRIX-17 18}" IDEM_TEST_PORT="${IDEM_TEST_PORT:-24000}" \
  SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt \
  bash -c 'cd /root/pg_idempotency && bash .ci/run' || status=$?
echo "stock-check: .ci/run exited $status after $(($(date +%s) - start)) s"
exit "$status"
