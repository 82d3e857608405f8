# For the trusted edition's runs of sql/*.sql that make databases of their own
# (fences.sql, jcs_encoding.sql): CREATE EXTENSION idempotency becomes the
# install script of make trusted, run by the session's user (create_extension.psql).
s|^CREATE EXTENSION idempotency;$|\\i tests/trusted/create_extension.psql|
