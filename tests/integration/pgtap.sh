#!/usr/bin/env bash
# Runs the pgTAP scripts in tests/pgtap with pg_prove, in a fresh database of
# the running cluster (PGHOST/PGPORT/PGUSER from the environment).
set -euo pipefail
cd "$(dirname "$0")/../.."
db=idem_pgtap
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
trap 'psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT
psql -X -q -v ON_ERROR_STOP=1 -d "$db" -c "CREATE EXTENSION pgtap" -c "CREATE EXTENSION idempotency"
pg_prove -d "$db" --verbose tests/pgtap/*.sql
