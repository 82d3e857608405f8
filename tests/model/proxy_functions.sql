-- The model checker's function-call form (checker.py --proxy-shards N).
--
-- Every operation of the workload is ONE function call on the proxy, routed
-- by PL/Proxy to the shard that owns the principal (RUN ON hashtext(principal),
-- so shard hashtext(principal) & (N - 1)); inspect and cleanup run on all
-- shards. Each call is one transaction on its shard: PL/Proxy runs the remote
-- statement in autocommit, so the call commits when it answers.
--
-- Two parts, split by the marker lines: SHARD runs in every shard's database
-- (after CREATE EXTENSION idempotency and the model_effects table), PROXY in
-- the proxy's database (after CREATE EXTENSION plproxy and the server
-- model_shards). Same schema, names and signatures on both sides.

-- @@ SHARD
CREATE SCHEMA model;
CREATE TABLE model.whoami (shard integer NOT NULL);

-- The transactional request: begin -> effect -> complete, in one transaction.
-- variant: complete, secret (one-time secret), rollback (raises MR001 after
-- the effect, DETAIL '<fence> <expires> <now> <clock>'), stmt_error (22012
-- after the effect, same DETAIL), no_complete (returns without complete: the
-- commit must fail with 55000), slow (sleeps pause seconds between the effect
-- and complete: for statement_timeout cancels and disconnects).
CREATE FUNCTION model.txn(a_principal text, a_key text, a_action text, a_fp bytea, a_ttl interval,
                          a_wait interval, a_variant text, a_status integer, a_body bytea, a_headers jsonb,
                          a_client integer, a_op text, a_pause float8,
                          OUT outcome text, OUT status integer, OUT headers jsonb, OUT body bytea,
                          OUT resource_id text, OUT expires_at timestamptz, OUT fence bigint,
                          OUT now_at timestamptz, OUT clock_at timestamptz, OUT usable text)
    LANGUAGE plpgsql AS $$
DECLARE
    o idempotency.key_outcome;
    detail text;
BEGIN
    SELECT b.* INTO o FROM idempotency.begin(a_principal, a_key, a_action, a_fp, ttl => a_ttl, wait => a_wait) AS b;
    outcome := o.outcome; status := o.response_status; headers := o.response_headers; body := o.response_body;
    resource_id := o.resource_id; expires_at := o.expires_at; fence := o.fence;
    now_at := now(); clock_at := clock_timestamp();
    IF o.outcome <> 'started' THEN
        IF o.outcome = 'in_progress' THEN
            BEGIN  -- I5: the transaction must still be usable
                PERFORM 1;
            EXCEPTION WHEN OTHERS THEN
                usable := SQLSTATE;
            END;
        END IF;
        RETURN;
    END IF;
    INSERT INTO model_effects (principal, key, fence, client, op_id, kind)
        VALUES (a_principal, a_key, o.fence, a_client, a_op, 'txn');
    detail := concat_ws(' ', o.fence, extract(epoch FROM o.expires_at), extract(epoch FROM now_at),
                        extract(epoch FROM clock_at));
    IF a_variant = 'rollback' THEN
        RAISE EXCEPTION 'model: rollback after started' USING ERRCODE = 'MR001', DETAIL = detail;
    ELSIF a_variant = 'stmt_error' THEN
        BEGIN
            PERFORM 1 / (a_pause * 0)::integer;
        EXCEPTION WHEN division_by_zero THEN
            RAISE EXCEPTION 'model: division by zero after started' USING ERRCODE = '22012', DETAIL = detail;
        END;
    ELSIF a_variant = 'no_complete' THEN
        RETURN;
    ELSIF a_variant = 'slow' THEN
        PERFORM pg_sleep(a_pause);
    END IF;
    PERFORM idempotency.complete(a_principal, a_key, status => a_status, body => a_body, headers => a_headers,
                                 resource_id => a_op, one_time_secret => a_variant = 'secret');
END
$$;

CREATE FUNCTION model.acquire(a_principal text, a_key text, a_action text, a_fp bytea, a_lease interval,
                              a_ttl interval, a_wait interval,
                              OUT outcome text, OUT status integer, OUT headers jsonb, OUT body bytea,
                              OUT resource_id text, OUT expires_at timestamptz, OUT fence bigint,
                              OUT lease_until float8, OUT now_at timestamptz, OUT clock_at timestamptz,
                              OUT usable text)
    LANGUAGE plpgsql AS $$
DECLARE
    o idempotency.key_outcome;
BEGIN
    SELECT b.* INTO o FROM idempotency.acquire(a_principal, a_key, a_action, a_fp, lease => a_lease, ttl => a_ttl,
                                               wait => a_wait) AS b;
    outcome := o.outcome; status := o.response_status; headers := o.response_headers; body := o.response_body;
    resource_id := o.resource_id; expires_at := o.expires_at; fence := o.fence;
    lease_until := extract(epoch FROM o.lease_until);
    now_at := now(); clock_at := clock_timestamp();
    IF o.outcome = 'in_progress' THEN
        BEGIN
            PERFORM 1;
        EXCEPTION WHEN OTHERS THEN
            usable := SQLSTATE;
        END;
    END IF;
END
$$;

-- The external effect of a lease holder, in a transaction of its own.
CREATE FUNCTION model.lease_effect(a_principal text, a_key text, a_fence bigint, a_client integer, a_op text)
    RETURNS integer LANGUAGE sql AS $$
    INSERT INTO model_effects (principal, key, fence, client, op_id, kind)
        VALUES (a_principal, a_key, a_fence, a_client, a_op, 'lease') RETURNING 1
$$;

CREATE FUNCTION model.renew(a_principal text, a_key text, a_fence bigint, a_lease interval,
                            OUT now_at timestamptz, OUT renewed boolean, OUT clock_at timestamptz)
    LANGUAGE plpgsql AS $$
BEGIN
    now_at := now();
    renewed := idempotency.renew(a_principal, a_key, a_fence, a_lease);
    clock_at := clock_timestamp();
END
$$;

CREATE FUNCTION model.complete_fenced(a_principal text, a_key text, a_fence bigint, a_status integer,
                                      a_body bytea, a_headers jsonb, a_resource_id text, a_secret boolean)
    RETURNS boolean LANGUAGE sql AS $$
    SELECT idempotency.complete(a_principal, a_key, status => a_status, body => a_body, headers => a_headers,
                                resource_id => a_resource_id, one_time_secret => a_secret, fence => a_fence)
$$;

CREATE FUNCTION model.release(a_principal text, a_key text, a_fence bigint) RETURNS boolean
    LANGUAGE sql AS $$ SELECT idempotency.release(a_principal, a_key, a_fence) $$;

CREATE FUNCTION model.save_final(a_principal text, a_key text, a_action text, a_fp bytea, a_status integer,
                                 a_body bytea, a_headers jsonb, a_ttl interval,
                                 OUT now_at timestamptz, OUT saved boolean, OUT clock_at timestamptz)
    LANGUAGE plpgsql AS $$
BEGIN
    now_at := now();
    saved := idempotency.save_final(a_principal, a_key, a_action, a_fp, a_status, a_body, a_headers, a_ttl);
    clock_at := clock_timestamp();
END
$$;

CREATE FUNCTION model.claim(a_principal text, a_key text, a_ttl interval,
                            OUT now_at timestamptz, OUT claimed boolean, OUT clock_at timestamptz)
    LANGUAGE plpgsql AS $$
BEGIN
    now_at := now();
    claimed := idempotency.claim(a_principal, a_key, a_ttl);
    clock_at := clock_timestamp();
END
$$;

CREATE FUNCTION model.forget(a_principal text, a_key text) RETURNS boolean
    LANGUAGE sql AS $$ SELECT idempotency.forget(a_principal, a_key) $$;

-- cleanup as one function call per shard: one batch as large as the table.
CREATE FUNCTION model.cleanup() RETURNS SETOF integer
    LANGUAGE sql AS $$ SELECT b.deleted FROM idempotency.cleanup_batch(1000000, NULL) AS b $$;

-- The key's row on this shard (NULLs when absent), with the shard's number.
CREATE FUNCTION model.inspect(a_principal text, a_key text)
    RETURNS TABLE (shard integer, action text, fence bigint, state text, status integer, headers jsonb,
                   body bytea, now_at timestamptz, clock_at timestamptz)
    LANGUAGE sql AS $$
    SELECT (SELECT w.shard FROM model.whoami AS w), k.action, k.fence, k.state::text, k.response_status,
           k.response_headers, k.response_body, now(), clock_timestamp()
      FROM (SELECT 1) AS one LEFT JOIN idempotency.keys AS k ON k.principal = a_principal AND k.key = a_key
$$;

-- @@ PROXY
CREATE SCHEMA model;

CREATE FUNCTION model.txn(a_principal text, a_key text, a_action text, a_fp bytea, a_ttl interval,
                          a_wait interval, a_variant text, a_status integer, a_body bytea, a_headers jsonb,
                          a_client integer, a_op text, a_pause float8,
                          OUT outcome text, OUT status integer, OUT headers jsonb, OUT body bytea,
                          OUT resource_id text, OUT expires_at timestamptz, OUT fence bigint,
                          OUT now_at timestamptz, OUT clock_at timestamptz, OUT usable text)
    LANGUAGE plproxy AS $$ CLUSTER 'model_shards'; RUN ON hashtext(a_principal); $$;

CREATE FUNCTION model.acquire(a_principal text, a_key text, a_action text, a_fp bytea, a_lease interval,
                              a_ttl interval, a_wait interval,
                              OUT outcome text, OUT status integer, OUT headers jsonb, OUT body bytea,
                              OUT resource_id text, OUT expires_at timestamptz, OUT fence bigint,
                              OUT lease_until float8, OUT now_at timestamptz, OUT clock_at timestamptz,
                              OUT usable text)
    LANGUAGE plproxy AS $$ CLUSTER 'model_shards'; RUN ON hashtext(a_principal); $$;

CREATE FUNCTION model.lease_effect(a_principal text, a_key text, a_fence bigint, a_client integer, a_op text)
    RETURNS integer
    LANGUAGE plproxy AS $$ CLUSTER 'model_shards'; RUN ON hashtext(a_principal); $$;

CREATE FUNCTION model.renew(a_principal text, a_key text, a_fence bigint, a_lease interval,
                            OUT now_at timestamptz, OUT renewed boolean, OUT clock_at timestamptz)
    LANGUAGE plproxy AS $$ CLUSTER 'model_shards'; RUN ON hashtext(a_principal); $$;

CREATE FUNCTION model.complete_fenced(a_principal text, a_key text, a_fence bigint, a_status integer,
                                      a_body bytea, a_headers jsonb, a_resource_id text, a_secret boolean)
    RETURNS boolean
    LANGUAGE plproxy AS $$ CLUSTER 'model_shards'; RUN ON hashtext(a_principal); $$;

CREATE FUNCTION model.release(a_principal text, a_key text, a_fence bigint) RETURNS boolean
    LANGUAGE plproxy AS $$ CLUSTER 'model_shards'; RUN ON hashtext(a_principal); $$;

CREATE FUNCTION model.save_final(a_principal text, a_key text, a_action text, a_fp bytea, a_status integer,
                                 a_body bytea, a_headers jsonb, a_ttl interval,
                                 OUT now_at timestamptz, OUT saved boolean, OUT clock_at timestamptz)
    LANGUAGE plproxy AS $$ CLUSTER 'model_shards'; RUN ON hashtext(a_principal); $$;

CREATE FUNCTION model.claim(a_principal text, a_key text, a_ttl interval,
                            OUT now_at timestamptz, OUT claimed boolean, OUT clock_at timestamptz)
    LANGUAGE plproxy AS $$ CLUSTER 'model_shards'; RUN ON hashtext(a_principal); $$;

CREATE FUNCTION model.forget(a_principal text, a_key text) RETURNS boolean
    LANGUAGE plproxy AS $$ CLUSTER 'model_shards'; RUN ON hashtext(a_principal); $$;

CREATE FUNCTION model.cleanup() RETURNS SETOF integer
    LANGUAGE plproxy AS $$ CLUSTER 'model_shards'; RUN ON ALL; $$;

CREATE FUNCTION model.inspect(a_principal text, a_key text)
    RETURNS TABLE (shard integer, action text, fence bigint, state text, status integer, headers jsonb,
                   body bytea, now_at timestamptz, clock_at timestamptz)
    LANGUAGE plproxy AS $$ CLUSTER 'model_shards'; RUN ON ALL; $$;
