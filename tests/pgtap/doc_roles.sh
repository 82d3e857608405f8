#!/usr/bin/env bash
# The documented roles for a pgTAP script, as SQL on standard output:
#
#   tests/pgtap/doc_roles.sh PREFIX        drops any of PREFIX{app,ops,monitoring,support} an
#                                          earlier run left, creates the four NOLOGIN, then runs
#                                          the GRANT blocks of the docs as written for them
#   tests/pgtap/doc_roles.sh PREFIX drop   drops the four and what they own
#
# The GRANT blocks are the lines between <!-- grants:begin --> and <!-- grants:end --> in
# docs/sql-reference.md and docs/operations.md, the fences dropped and the role names app, ops,
# monitoring and support prefixed. Run from the top of the repository; a script uses it as
#   \set roles `tests/pgtap/doc_roles.sh idem_doc_`
#   :roles
set -euo pipefail
prefix=${1:?usage: doc_roles.sh PREFIX [drop]}
[[ $prefix =~ ^[a-z_][a-z0-9_]*$ ]] || { echo "doc_roles.sh: PREFIX must be a lower-case name" >&2; exit 2; }
names=("${prefix}app" "${prefix}ops" "${prefix}monitoring" "${prefix}support")
list=$(IFS=,; echo "${names[*]}")
if [[ ${2:-} == drop ]]; then
  echo "DROP OWNED BY ${list//,/, }; DROP ROLE ${list//,/, };"
  exit 0
fi
echo "DO \$\$ DECLARE r name; BEGIN"
echo "  FOR r IN SELECT rolname FROM pg_roles WHERE rolname IN ('${list//,/\', \'}') LOOP"
echo "    EXECUTE format('DROP OWNED BY %I', r); EXECUTE format('DROP ROLE %I', r);"
echo "  END LOOP; END \$\$;"
for n in "${names[@]}"; do echo "CREATE ROLE $n NOLOGIN;"; done
awk '/<!-- grants:begin/ { on = 1; next } /<!-- grants:end/ { on = 0 } on && !/^```/' \
  docs/sql-reference.md docs/operations.md |
  sed -E "s/ TO (app|ops|monitoring|support)([;,]| *\$)/ TO ${prefix}\\1\\2/g"
