#!/usr/bin/env bash
# Prints the GRANT blocks of the docs (between <!-- grants:begin --> and
# <!-- grants:end --> in docs/sql-reference.md and docs/operations.md), the
# fences dropped and the documented role names app, ops, monitoring and
# support renamed idem_doc_*, for tests/pgtap/02_roles.sql to run as written.
# Run from the top of the repository.
set -euo pipefail
awk '/<!-- grants:begin/ { on = 1; next } /<!-- grants:end/ { on = 0 } on && !/^```/' \
  docs/sql-reference.md docs/operations.md |
  sed -E 's/ TO (app|ops|monitoring|support)([;,]| *$)/ TO idem_doc_\1\2/g'
