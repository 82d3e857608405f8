-- pg_idempotency 0.6.0 -> 0.7.0: what the monitoring grant reaches holds no
-- principal, key, body, header or resource id; the library refuses a schema
-- newer than it knows (no SQL change: the check is in the library).
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.7.0'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- The status view without keys (monitoring)

-- Until 0.6.0 idempotency.status showed the oldest key of each group
-- (oldest_principal, oldest_key), and the documented monitoring role, which
-- may read it, saw principals (often e-mail addresses or account ids) and
-- keys. The view now holds counts and times only; the oldest key of each group
-- moved to idempotency.oldest_keys, for the operator and support roles.
-- Grants on the old view are carried over to the new one (a plain table, as
-- in 0.6.0's script: Citus runs this script inside a two-phase commit).
CREATE TABLE idempotency.upgrade_070_grants AS
SELECT a.grantee, a.privilege_type, a.is_grantable
  FROM pg_catalog.pg_class AS c, pg_catalog.aclexplode(c.relacl) AS a
 WHERE c.oid OPERATOR(pg_catalog.=) 'idempotency.status'::pg_catalog.regclass
   AND a.grantee OPERATOR(pg_catalog.<>) c.relowner;

DROP VIEW idempotency.status;
CREATE VIEW idempotency.status AS
SELECT k.action, k.state,
       k.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
           OR COALESCE(k.lease_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp(), false) AS live,
       pg_catalog.count(*) AS keys,
       pg_catalog.min(k.created_at) AS oldest_created_at, pg_catalog.max(k.created_at) AS newest_created_at,
       pg_catalog.min(k.expires_at) AS next_expires_at,
       pg_catalog.count(*) FILTER (WHERE k.state OPERATOR(pg_catalog.=) 'in_progress'
                                     AND k.lease_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp())
           AS leases_live,
       pg_catalog.min(k.lease_until) FILTER (WHERE k.state OPERATOR(pg_catalog.=) 'in_progress')
           AS earliest_lease_until
  FROM idempotency.keys AS k
 GROUP BY 1, 2, 3;
COMMENT ON VIEW idempotency.status IS
    'Keys by action, state and live/expired: counts and times only, never a principal or a key (the oldest key of each group is in idempotency.oldest_keys)';
REVOKE ALL ON idempotency.status FROM PUBLIC;

DO $grants$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT * FROM idempotency.upgrade_070_grants LOOP
        EXECUTE pg_catalog.format('GRANT %s ON idempotency.status TO %s%s', g.privilege_type,
            CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                 ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END,
            CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$grants$;
DROP TABLE idempotency.upgrade_070_grants;

-- The oldest key of each (action, state, live) group, with its principal:
-- where to look first when a group grows. Granted to nobody; the operator and
-- support roles get SELECT (docs/sql-reference.md, Privileges), never the
-- monitoring role.
CREATE VIEW idempotency.oldest_keys AS
SELECT DISTINCT ON (k.action, k.state, k.live)
       k.action, k.state, k.live, k.principal, k.key, k.created_at, k.expires_at, k.lease_until
  FROM (SELECT r.*,
               r.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
                   OR COALESCE(r.lease_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp(), false)
                   AS live
          FROM idempotency.keys AS r) AS k
 ORDER BY k.action, k.state, k.live, k.created_at, k.principal, k.key;  -- ties: the first by name
COMMENT ON VIEW idempotency.oldest_keys IS
    'The oldest key of each (action, state, live) group of idempotency.status, with its principal: for the operator and support roles, not for monitoring';
REVOKE ALL ON idempotency.oldest_keys FROM PUBLIC;

-- The pg_cron hint names the package of the server's own major version
-- (postgresql-17-cron on 17, not postgresql-15-cron everywhere).
CREATE OR REPLACE FUNCTION idempotency.schedule_cleanup(schedule text DEFAULT '* * * * *') RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in this database'
            USING ERRCODE = '55000',
                  HINT = pg_catalog.format(
                      'Install postgresql-%s-cron (Debian; pg_cron for PostgreSQL %s elsewhere), add pg_cron '
                      'to shared_preload_libraries, set cron.database_name to this database, restart the '
                      'server and run CREATE EXTENSION pg_cron. Or call CALL idempotency.cleanup() from '
                      'any other scheduler.',
                      pg_catalog.current_setting('server_version_num')::pg_catalog.int4 OPERATOR(pg_catalog./) 10000,
                      pg_catalog.current_setting('server_version_num')::pg_catalog.int4 OPERATOR(pg_catalog./) 10000);
    END IF;
    -- A named job: scheduling again updates it instead of adding a second one.
    RETURN cron.schedule('idempotency:cleanup', schedule, 'CALL idempotency.cleanup(max_runtime => ''50 seconds'')');
END
$$;
