#!/usr/bin/env bash
# extension/schema.sql, the readable schema, is what the extension makes: the
# catalogs of a fresh CREATE EXTENSION idempotency, and of an install made at
# 0.1.0 and updated with ALTER EXTENSION ... UPDATE, read back by
# tools/schema.sh, equal the file byte for byte. Regenerate it with
# `tools/schema.sh DB > extension/schema.sql` on a fresh database (as the role
# postgres) and read the diff. Host only: another major prints some
# definitions differently.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
fresh_database idem_schema_file
check "a fresh install's schema is extension/schema.sql" \
  bash -c "tools/schema.sh $service_db >'$work/fresh.sql' && diff -u extension/schema.sql '$work/fresh.sql' >&2"
psql -X -q -v ON_ERROR_STOP=1 -d "$service_db" -c "DROP EXTENSION idempotency" \
  -c "CREATE EXTENSION idempotency VERSION '0.1.0'" -c "ALTER EXTENSION idempotency UPDATE"
check "an install updated from 0.1.0 has the same schema" \
  bash -c "tools/schema.sh $service_db >'$work/updated.sql' && diff -u extension/schema.sql '$work/updated.sql' >&2"
# Installed by another role: the privileges name the installer "owner".
psql -X -q -v ON_ERROR_STOP=1 -d "$service_db" -c "DROP EXTENSION idempotency" \
  -c "DROP ROLE IF EXISTS idem_schema_installer" -c "CREATE ROLE idem_schema_installer SUPERUSER" \
  -c "SET ROLE idem_schema_installer" -c "CREATE EXTENSION idempotency"
check "an install by another role has the same schema" \
  bash -c "tools/schema.sh $service_db >'$work/other.sql' && diff -u extension/schema.sql '$work/other.sql' >&2"
check "the file shows every member of the extension (one definition each)" \
  test "$(grep -cE '^CREATE (TYPE|SEQUENCE|TABLE|VIEW|OR REPLACE (FUNCTION|PROCEDURE)) ' extension/schema.sql)" -eq \
  "$(psql -X -qAt -d "$service_db" -c "SELECT count(*) FROM pg_depend WHERE refclassid = 'pg_extension'::regclass
       AND deptype = 'e' AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
       AND NOT (classid = 'pg_type'::regclass AND objid IN (SELECT typarray FROM pg_type UNION
                SELECT reltype FROM pg_class WHERE relkind <> 'c'))")"
psql -X -q -d "$service_db" -c "DROP EXTENSION idempotency" -c "DROP ROLE idem_schema_installer" >/dev/null
report
