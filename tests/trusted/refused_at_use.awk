# For the trusted edition's runs of sql/*.sql (tests/integration/trusted_edition.sh):
# without the library a SET of an idempotency.* setting is a placeholder that
# PostgreSQL accepts, and the trusted edition refuses a bad value at use (22023)
# instead of at SET. After each such SET this includes refused_at_use.psql,
# which prints "ERROR:  22023" when every call now refuses and RESETs the
# setting (the C++ edition never took the value), so that the rest of the
# file runs as it does there. Each SET gains three lines of output (the two
# below and the include's first), in tests/trusted/expected.
{ print }
/^SET idempotency\.[a-z_]+ *(=|TO)/ {
  name = $2
  sub(/ .*/, "", name)
  print "\\set idem_setting " name
  print "\\i tests/trusted/refused_at_use.psql"
}
