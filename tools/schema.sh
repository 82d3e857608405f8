#!/usr/bin/env bash
# Prints the extension's schema as the server holds it: every member of the
# extension idempotency in database DB (types, sequences, tables with their
# columns, constraints, indexes and triggers, views, functions and procedures
# with their whole definitions), each with its comment and privileges, in a
# fixed order. extension/schema.sql is its output for a fresh
# `CREATE EXTENSION idempotency` on the host's server (the installing role is
# written "owner" in the privileges)
# (PostgreSQL 15: another major prints some definitions differently);
# tests/integration/schema_file.sh checks that the file is what a fresh
# install and an install updated from 0.1.0 make.
#
#   tools/schema.sh DB > extension/schema.sql     (psql's PGHOST, PGPORT, PGUSER)
set -euo pipefail
db=${1:?usage: tools/schema.sh DB}
version=$(psql -X -qAt -d "$db" -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
[[ -n $version ]] || { echo "tools/schema.sh: no extension idempotency in $db" >&2; exit 1; }
cat <<EOF
-- pg_idempotency $version: the schema that CREATE EXTENSION idempotency makes,
-- read back from the server's catalogs by tools/schema.sh (do not edit: CI
-- compares it with a fresh install and with one updated from 0.1.0). The
-- install script itself is extension/idempotency--0.1.0.sql and the update
-- scripts after it; this file is for reading.
EOF
psql -X -qAt -d "$db" -v ON_ERROR_STOP=1 <<'SQL'
-- The installing role's name as "owner", so that the file does not depend on
-- who installed the extension.
CREATE FUNCTION pg_temp.owner_free(acl text) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT regexp_replace(acl, '(^|[{,"=/])' || (SELECT quote_ident(r.rolname) FROM pg_extension AS e
                                                   JOIN pg_roles AS r ON r.oid = e.extowner
                                                  WHERE e.extname = 'idempotency') || '(?=[=/,}"])',
                          '\1owner', 'g')
$$;
WITH members AS (
    SELECT e.classid, e.objid
      FROM pg_depend AS e
     WHERE e.refclassid = 'pg_extension'::regclass AND e.deptype = 'e'
       AND e.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
),
-- Privileges as the catalog holds them (NULL: the default, which for a
-- function is EXECUTE for PUBLIC and for a relation its owner's only).
privileges(objname, line) AS (
    SELECT p.oid::regprocedure::text,
           '-- privileges: ' || coalesce(pg_temp.owner_free(p.proacl::text), 'the default (EXECUTE for PUBLIC)')
      FROM pg_proc AS p JOIN members AS m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
    UNION ALL
    SELECT c.oid::regclass::text,
           '-- privileges: ' || coalesce(pg_temp.owner_free(c.relacl::text), 'the default (the owner''s only)')
      FROM pg_class AS c JOIN members AS m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
),
objects(sort_kind, sort_name, text) AS (
    -- Composite types.
    SELECT 1, t.typname::text,
           format(E'CREATE TYPE %s AS (\n%s\n);', t.oid::regtype,
                  (SELECT string_agg(format('    %I %s', a.attname, format_type(a.atttypid, a.atttypmod)),
                                     E',\n' ORDER BY a.attnum)
                     FROM pg_attribute AS a WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped))
           || coalesce(format(E'\nCOMMENT ON TYPE %s IS %L;', t.oid::regtype, obj_description(t.oid, 'pg_type')), '')
      FROM pg_type AS t JOIN members AS m ON m.classid = 'pg_type'::regclass AND m.objid = t.oid
     WHERE t.typtype = 'c'
    UNION ALL
    -- Sequences.
    SELECT 2, c.relname::text,
           format('CREATE SEQUENCE %s AS %s START %s INCREMENT %s MINVALUE %s MAXVALUE %s CACHE %s%s;',
                  c.oid::regclass, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin,
                  s.seqmax, s.seqcache, CASE WHEN s.seqcycle THEN ' CYCLE' ELSE '' END)
           || coalesce(format(E'\nCOMMENT ON SEQUENCE %s IS %L;', c.oid::regclass, obj_description(c.oid, 'pg_class')), '')
           || E'\n' || g.line
      FROM pg_class AS c JOIN members AS m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
      JOIN pg_sequence AS s ON s.seqrelid = c.oid
      LEFT JOIN privileges AS g ON g.objname = c.oid::regclass::text
     WHERE c.relkind = 'S'
    UNION ALL
    -- Tables: columns, constraints, indexes, triggers, comments, privileges.
    SELECT 3, c.relname::text,
           format(E'CREATE TABLE %s (\n%s\n);', c.oid::regclass,
                  (SELECT string_agg(line, E',\n' ORDER BY n) FROM (
                       SELECT a.attnum AS n,
                              format('    %I %s%s%s', a.attname, format_type(a.atttypid, a.atttypmod),
                                     CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END,
                                     coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')) AS line
                         FROM pg_attribute AS a
                         LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                        WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                       UNION ALL
                       SELECT 10000 + row_number() OVER (ORDER BY k.conname),
                              format('    CONSTRAINT %I %s', k.conname, pg_get_constraintdef(k.oid))
                         FROM pg_constraint AS k WHERE k.conrelid = c.oid) AS l))
           || coalesce((SELECT string_agg(E'\n' || pg_get_indexdef(i.indexrelid) || ';', '' ORDER BY x.relname)
                          FROM pg_index AS i JOIN pg_class AS x ON x.oid = i.indexrelid
                         WHERE i.indrelid = c.oid
                           AND NOT EXISTS (SELECT FROM pg_constraint AS k WHERE k.conindid = i.indexrelid
                                             AND k.conrelid = c.oid)), '')
           || coalesce((SELECT string_agg(E'\n' || pg_get_triggerdef(r.oid) || ';', '' ORDER BY r.tgname)
                          FROM pg_trigger AS r WHERE r.tgrelid = c.oid AND NOT r.tgisinternal), '')
           || coalesce(format(E'\nCOMMENT ON TABLE %s IS %L;', c.oid::regclass, obj_description(c.oid, 'pg_class')), '')
           || coalesce((SELECT string_agg(format(E'\nCOMMENT ON COLUMN %s.%I IS %L;', c.oid::regclass, a.attname,
                                                 col_description(c.oid, a.attnum)), '' ORDER BY a.attnum)
                          FROM pg_attribute AS a WHERE a.attrelid = c.oid AND a.attnum > 0
                           AND col_description(c.oid, a.attnum) IS NOT NULL), '')
           || E'\n' || g.line
      FROM pg_class AS c JOIN members AS m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
      LEFT JOIN privileges AS g ON g.objname = c.oid::regclass::text
     WHERE c.relkind IN ('r', 'p')
    UNION ALL
    -- Views.
    SELECT 4, c.relname::text,
           format(E'CREATE VIEW %s AS\n%s', c.oid::regclass, pg_get_viewdef(c.oid, 100))
           || coalesce(format(E'\nCOMMENT ON VIEW %s IS %L;', c.oid::regclass, obj_description(c.oid, 'pg_class')), '')
           || E'\n' || g.line
      FROM pg_class AS c JOIN members AS m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
      LEFT JOIN privileges AS g ON g.objname = c.oid::regclass::text
     WHERE c.relkind = 'v'
    UNION ALL
    -- Functions and procedures, whole.
    SELECT 5, p.oid::regprocedure::text,
           rtrim(pg_get_functiondef(p.oid), E'\n') || ';'
           || coalesce(format(E'\nCOMMENT ON %s %s IS %L;', CASE p.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END,
                              p.oid::regprocedure, obj_description(p.oid, 'pg_proc')), '')
           || E'\n' || g.line
      FROM pg_proc AS p JOIN members AS m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
      LEFT JOIN privileges AS g ON g.objname = p.oid::regprocedure::text
)
SELECT E'\n' || text FROM objects ORDER BY sort_kind, sort_name COLLATE "C";
SQL
