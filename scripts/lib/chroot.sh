# Making and entering the Debian chroots of scripts/test-matrix.sh (sourced, not
# run): which suite ships a PostgreSQL version, the archive to bootstrap from,
# debootstrap, mounts that are undone on every exit path, the work tree copied
# in, one lock per chroot. The runner (scripts/test-matrix.sh) decides what runs
# inside them.
#
# Expects from the runner: root (the repository), cache (the chroots' folder),
# and a trap that calls unmount_all on exit.
# shellcheck shell=bash

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

# unmount_stale DIR: unmounts whatever is still mounted under DIR (a run that
# was killed before its cleanup), deepest first. Called under the chroot's lock.
unmount_stale() {
  local dir=$1 m
  awk -v d="$dir/" 'index($2 "/", d) == 1 { print $2 }' /proc/self/mounts | sort -r |
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
}

# port_of VERSION: the first port of that version's runs.
port_of() { echo "${IDEM_MATRIX_PORT:-$((28000 + 100 * ($1 - 15)))}"; }

# mount_chroot DIR: /proc, /dev (bind), /dev/pts, a fresh /dev/shm.
mount_chroot() {
  local dir=$1
  unmount_stale "$dir"
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
  # The pristine copy that the package test installs the .deb files into
  # (SUITE.base): the same bootstrap, copied before anything is installed, so a
  # cold machine bootstraps each suite once.
  if [[ $dir != *.base && ! -d $dir.base ]]; then
    rm -rf "$dir.base.tmp"
    cp -a "$dir.tmp" "$dir.base.tmp" && mv "$dir.base.tmp" "$dir.base"
  fi
  mv "$dir.tmp" "$dir"
}

# copy_tree DIR: the work tree (tracked and new files, nothing ignored) to DIR/src,
# or the tar IDEM_MATRIX_TREE names (scripts/test.sh makes one when a run starts, so
# that the chroots get the tree as it was then, not as the host's suites change it).
copy_tree() {
  rm -rf "$1/src"
  mkdir -p "$1/src"
  if [[ -n ${IDEM_MATRIX_TREE:-} ]]; then
    tar -C "$1/src" -xf "$IDEM_MATRIX_TREE"
    return
  fi
  git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done |
    tar -C "$root" --null -T - -cf - | tar -C "$1/src" -xf -
}

# prepare SUITE DIR: makes the chroot when missing, mounts, copies the work
# tree (tracked and new files, nothing ignored) to DIR/src.
prepare() {
  local suite=$1 dir=$2
  if [[ ${IDEM_MATRIX_REBUILD:-0} == 1 && -d $dir ]]; then
    unmount_stale "$dir"
    rm -rf --one-file-system "$dir"  # never into a mount (the host's /dev)
  fi
  [[ -d $dir ]] || make_chroot "$suite" "$dir" || return 1
  mount_chroot "$dir" || return 1
  copy_tree "$dir"
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
