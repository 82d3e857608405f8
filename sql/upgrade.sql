-- Install the oldest release and update to the current one.
\set VERBOSITY sqlstate
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency VERSION '0.1.0';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT idempotency.jcs('{"b":1,"a":2}');
SELECT to_regclass('idempotency.keys') IS NULL AS no_key_store_yet;
ALTER EXTENSION idempotency UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT idempotency.jcs('{"b":1,"a":2}');
-- The upgraded extension has the same objects as a fresh install.
SELECT pg_describe_object(classid, objid, objsubid) AS member
  FROM pg_depend WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
   AND NOT (classid = 'pg_type'::regclass  -- 17+ also list implicit array types and row types
            AND objid IN (SELECT typarray FROM pg_type UNION SELECT reltype FROM pg_class WHERE relkind <> 'c'))
 ORDER BY 1;
BEGIN;
SELECT outcome FROM idempotency.begin('p', 'k', 'a', idempotency.fingerprint('POST', '/x'));
SELECT idempotency.complete('p', 'k', 201);
COMMIT;
SELECT outcome FROM idempotency.begin('p', 'k', 'a', idempotency.fingerprint('POST', '/x'));
-- And a fresh install of the current release lists the same members.
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
SELECT pg_describe_object(classid, objid, objsubid) AS member
  FROM pg_depend WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
   AND NOT (classid = 'pg_type'::regclass  -- 17+ also list implicit array types and row types
            AND objid IN (SELECT typarray FROM pg_type UNION SELECT reltype FROM pg_class WHERE relkind <> 'c'))
 ORDER BY 1;
-- The same session looks the key table up again after it was dropped and recreated.
BEGIN;
SELECT outcome FROM idempotency.begin('p', 'k', 'a', idempotency.fingerprint('POST', '/x'), wait => '0');
ROLLBACK;
