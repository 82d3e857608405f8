#!/usr/bin/env bash
# The Java (pgjdbc) forms of docs/languages.md against a fresh database of the
# throwaway cluster (tests/languages/JdbcForms.java).
set -euo pipefail
cd "$(dirname "$0")/../.."
jar=${JDBC_JAR:-/usr/share/java/postgresql.jar}
if ! command -v java >/dev/null || [[ ! -f $jar ]]; then
  echo "not ok - needs java and pgjdbc ($jar, Debian libpostgresql-jdbc-java; scripts/install-deps.sh)"
  echo "0 passed, 1 failed"
  exit 1
fi
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
fresh_database idem_languages_jdbc
java -cp "$jar" tests/languages/JdbcForms.java "jdbc:postgresql://127.0.0.1:$PGPORT/$service_db" "${PGUSER:-postgres}"
