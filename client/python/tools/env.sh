#!/usr/bin/env bash
# A virtual environment with pg-idempotency installed the way a user installs it:
# the wheel built by `python -m build` from this folder, then `pip install` of that
# wheel with its extras [binary,pool,django,asgi] and requirements-test.txt, every
# version pinned by constraints.txt. Prints the environment's folder (its bin/python
# runs the tests and the example services).
#
#   client/python/tools/env.sh [PYTHON]    PYTHON: the interpreter (default python3)
#
# The environment is kept in build/python-env/<hash> of the sources, the pins and
# the interpreter, so the suites of one run (the client tests, the conformance of
# the Python examples) build it once; a change to any of them builds a new one.
# Works from an empty pip cache (it downloads from the package index pip is set up
# for). IDEM_PY_ENV_FRESH=1 rebuilds even when a kept one exists. IDEM_PY_PSYCOPG=c
# takes psycopg[c] (built here against the system's libpq: needs libpq-dev, a C
# compiler and the Python headers) instead of psycopg[binary].
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
root=$(cd "$here/../.." && pwd)
python=${1:-python3}
flavour=${IDEM_PY_PSYCOPG:-binary}
if [[ $flavour != binary && $flavour != c ]]; then
  echo "env.sh: IDEM_PY_PSYCOPG must be binary or c, not $flavour" >&2
  exit 1
fi

if ! version=$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null); then
  echo "env.sh: cannot run the interpreter $python" >&2
  exit 1
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "env.sh: $python is Python $version; pg-idempotency needs 3.10 or later" >&2
  exit 1
fi
where=$(command -v "$python")
where=$(readlink -f "$where")
hash=$({
  echo "$where $version $flavour"
  cd "$here" && git ls-files -co --exclude-standard -- pyproject.toml README.md LICENSE src tools \
    constraints.txt requirements-test.txt | LC_ALL=C sort | xargs cat
} | sha256sum | cut -c1-16)
env=$root/build/python-env/$hash
mkdir -p "$root/build/python-env"

# One builder at a time per environment (suites may start side by side).
exec 9>"$env.lock"
flock 9
if [[ -x $env/bin/python && -e $env/.complete && ${IDEM_PY_ENV_FRESH:-0} != 1 ]]; then
  echo "$env"
  exit 0
fi
rm -rf "$env" "$env.build"
log=$env.log
pins=$here/constraints.txt
export PIP_DISABLE_PIP_VERSION_CHECK=1
# A pip from outside Debian (pyenv's, python.org's) trusts only the CA list it ships,
# not the system's store, where a machine behind a TLS-inspecting proxy keeps the
# proxy's CA (Debian's pip reads the store). Unless the machine says otherwise
# (PIP_CERT, or a cert in a pip configuration file, PIP_CONFIG_FILE's included),
# point every pip here at the system's store.
if [[ -z ${PIP_CERT:-} && -r /etc/ssl/certs/ca-certificates.crt ]] &&
  ! grep -qs '^[[:space:]]*cert[[:space:]]*=' ${PIP_CONFIG_FILE:+"$PIP_CONFIG_FILE"} /etc/pip.conf \
    /etc/xdg/pip/pip.conf "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf"; then
  export PIP_CERT=/etc/ssl/certs/ca-certificates.crt
fi
# Each step in the log; the first that fails ends it (errexit does not reach into an
# `||` list, hence the explicit chain).
fail() {
  cat "$log" >&2
  echo "env.sh: could not build the environment for $python ($version)" >&2
  rm -rf "$env" "$env.build"
  exit 1
}
# The builder: `build` in a venv of its own; it installs setuptools into an isolated
# environment (pinned too: PIP_CONSTRAINT reaches that environment's pip, where -c does
# not) and builds the wheel. From a copy of the package's files: setuptools writes
# build/ and *.egg-info beside its input.
"$python" -m venv "$env.build/venv" >"$log" 2>&1 || fail
"$env.build/venv/bin/python" -m pip install -q -c "$pins" build >>"$log" 2>&1 || fail
mkdir -p "$env.build/source"
(cd "$here" && git ls-files -co --exclude-standard -- pyproject.toml README.md LICENSE src |
   xargs cp --parents -t "$env.build/source") >>"$log" 2>&1 || fail
PIP_CONSTRAINT=$pins "$env.build/venv/bin/python" -m build -q --wheel --outdir "$env.build/dist" \
  "$env.build/source" >>"$log" 2>&1 || fail
wheel=$(ls "$env.build/dist"/pg_idempotency-*.whl) || fail
# The wheel as a user installs it. -c, not PIP_CONSTRAINT: a dependency built from
# source (psycopg-c, say) keeps the build requirements it names.
"$python" -m venv "$env" >>"$log" 2>&1 || fail
"$env/bin/python" -m pip install -q -c "$pins" "$wheel[$flavour,pool,django,asgi]" \
  -r "$here/requirements-test.txt" >>"$log" 2>&1 || fail
rm -rf "$env.build" "$log"
echo "$where $flavour" >"$env/.complete"
# The environments this one replaces (same interpreter, older sources or pins) go.
for other in "$root"/build/python-env/*/.complete; do
  [[ $other != "$env/.complete" && $(cat "$other") == "$where $flavour" ]] || continue
  rm -rf "${other%/.complete}" "${other%/.complete}.lock"
done
echo "$env"
