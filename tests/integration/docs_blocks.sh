#!/usr/bin/env bash
# Every fenced code block of README.md and docs/*.md run, compiled or
# syntax-checked against the run's cluster (PGHOST/PGPORT/PGUSER), by
# tests/docs/check.py: SQL through psql with shown outputs compared, C++ compiled
# and CMake configured against the client installed into a temporary prefix
# (from BUILD_DIR, default build-test, as client_install.sh does), Python and
# Node run, shell `bash -n`. tests/docs/README.md has the conventions.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build-test}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
IDEM_DOCS_PREFIX=$prefix /usr/bin/python3 tests/docs/check.py
