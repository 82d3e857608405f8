-- tests/scale-out/shard.sql: the schema of one shard of the PL/Proxy scale-out
-- test (tests/scale-out/plproxy_cluster.sh loads it into database shop of
-- every shard). The orders example of examples/python-orders/app.py, written
-- as SQL functions so that PL/Proxy can run each request on the shard that
-- owns its principal:
--
--   shop.create_order(principal, key, path, body, delay_ms, fail, wait_ms)
--       POST /orders (and /flaky/orders, /reject/orders): idempotency.begin,
--       the order, idempotency.complete, in the function's one transaction;
--       answers (status, headers, response_body, replayed, expires_epoch)
--       exactly as app.py behind the WSGI middleware does: 201 with Location,
--       the stored response with Idempotent-Replay on a retry, 422 problem on
--       a mismatch, 409 problem with Retry-After when the key is held, 410
--       problem for a key that expired under an on_expiry 'refuse' policy
--       (0.8.0 tombstones), a final 400/422 stored. expires_epoch is the key
--       row's expires_at (seconds since the epoch; NULL when no row backs the
--       answer): the service sends it as Idempotency-Expires.
--       fail => true makes a run that would answer 201 answer 500 instead,
--       rolled back: nothing stored, no order (the /flaky/orders route).
--       wait_ms is begin's wait (NULL: idempotency.wait_timeout; 0: reject
--       mode, 409 at once for a key a running request holds).
--   shop.create_api_key(principal, key, body)
--       POST /api-keys: the secret is answered once (one_time_secret).
--   shop.order_count()  the orders of this shard (GET /orders/count sums them).
--
-- Every call first checks that this shard owns the principal under the
-- current partition count (shop.shard: me, nparts; PL/Proxy's rule
-- hashtext(principal) & (nparts - 1)) and raises SQLSTATE SH503 otherwise:
-- a request routed to the wrong shard, or to a shard whose principals are
-- being moved away (tests/scale-out/reshard.py), never takes effect there.
--
-- psql variables: me (this shard's index), nparts (partition count), id_base
-- (first order / API key id: shards draw ids from disjoint ranges, so rows
-- keep their ids when they move).

CREATE EXTENSION IF NOT EXISTS idempotency;
CREATE SCHEMA shop;

CREATE TABLE orders (id bigserial PRIMARY KEY, principal text NOT NULL, item text NOT NULL,
                     quantity int NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON orders (principal);
CREATE TABLE api_keys (id bigserial PRIMARY KEY, principal text NOT NULL, name text NOT NULL,
                       created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON api_keys (principal);
SELECT setval('orders_id_seq', :id_base, false), setval('api_keys_id_seq', :id_base, false);

-- Which partition this shard is, out of how many. One row.
CREATE TABLE shop.shard (me integer NOT NULL, nparts integer NOT NULL CHECK (nparts > 0 AND nparts & (nparts - 1) = 0));
INSERT INTO shop.shard VALUES (:me, :nparts);

-- The owner check. Writers take the shared side of an advisory lock; the
-- resharding procedure takes the exclusive side while it moves rows and
-- raises nparts, so a writer waits for the move and then sees the new count.
CREATE FUNCTION shop.check_owner(principal text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  s shop.shard;
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock_shared(7235001);
  SELECT * INTO STRICT s FROM shop.shard;
  IF (pg_catalog.hashtext(principal) & (s.nparts - 1)) <> s.me THEN
    RAISE EXCEPTION 'shard % of % does not own this principal', s.me, s.nparts
      USING ERRCODE = 'SH503', HINT = 'The proxy routed the request elsewhere, or the principal is moving: retry.';
  END IF;
END
$$;

-- An RFC 9457 problem exactly as app.py and the Python client write it
-- (sorted members, no whitespace: the RFC 8785 form of the object).
CREATE FUNCTION shop.problem(p_status integer, p_type text, p_title text, p_detail text,
                             OUT status integer, OUT headers jsonb, OUT response_body bytea, OUT replayed boolean)
LANGUAGE sql IMMUTABLE AS $$
  SELECT $1, '[["Content-Type","application/problem+json"]]'::jsonb,
         pg_catalog.convert_to(idempotency.jcs(jsonb_build_object('detail', $4, 'status', $1, 'title', $3, 'type', $2)), 'UTF8'),
         false
$$;

-- What the Python client answers for an outcome other than started.
CREATE FUNCTION shop.answer(b idempotency.key_outcome,
                            OUT status integer, OUT headers jsonb, OUT response_body bytea, OUT replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
  pairs jsonb;
BEGIN
  CASE b.outcome
  WHEN 'replay' THEN
    pairs := CASE jsonb_typeof(b.response_headers)
               WHEN 'array' THEN b.response_headers
               WHEN 'object' THEN (SELECT coalesce(jsonb_agg(jsonb_build_array(e.key, e.value)), '[]')
                                     FROM jsonb_each(b.response_headers) e)
               ELSE '[]'::jsonb END;
    status := b.response_status;
    headers := pairs || '[["Idempotent-Replay","true"]]'::jsonb;
    response_body := coalesce(b.response_body, '');
    replayed := true;
  WHEN 'mismatch' THEN
    SELECT * INTO status, headers, response_body, replayed FROM shop.problem(422,
      '/problems/idempotency-key-reuse', 'Idempotency-Key was used for another request',
      'This Idempotency-Key was used for a different request; use a new key for a new request.');
  WHEN 'secret_replay' THEN
    SELECT * INTO status, headers, response_body, replayed FROM shop.problem(409,
      '/problems/one-time-secret', 'The response to this request was sent once and not kept',
      'The first response to this request carried a secret and was not kept; create a new one with a new key.');
    headers := headers || '[["Idempotent-Replay","true"]]'::jsonb;
    replayed := true;
  WHEN 'expired' THEN
    -- A tombstone (0.8.0): the key expired under on_expiry 'refuse'; never run again.
    SELECT * INTO status, headers, response_body, replayed FROM shop.problem(410,
      '/problems/idempotency-key-expired', 'Idempotency-Key has expired',
      'This Idempotency-Key expired and its response is no longer kept; the request was not run again.'
      ' Use a new key for a new request.');
  WHEN 'in_progress' THEN
    SELECT * INTO status, headers, response_body, replayed FROM shop.problem(409,
      '/problems/request-in-progress', 'A request with this Idempotency-Key is in progress',
      'A request with this Idempotency-Key is still being processed; retry later.');
    headers := headers || jsonb_build_array(jsonb_build_array('Retry-After',
      greatest(1, coalesce(ceil(extract(epoch FROM b.lease_until - pg_catalog.clock_timestamp()))::integer, 1))::text));
  ELSE
    RAISE EXCEPTION 'idempotency.begin returned an unknown outcome: %', b.outcome;
  END CASE;
END
$$;

-- Parses a request body as JSON the way app.py's json.loads is used: NULL when it is not JSON.
CREATE FUNCTION shop.json_or_null(body bytea) RETURNS json
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  RETURN pg_catalog.convert_from(body, 'UTF8')::json;
EXCEPTION WHEN others THEN
  RETURN NULL;
END
$$;

-- One attempt of POST <path> (the handler of app.py inside the middleware).
CREATE FUNCTION shop.order_attempt(p_principal text, p_key text, p_path text, p_body bytea, p_delay_ms integer,
                                   p_wait_ms integer,
                                   OUT status integer, OUT headers jsonb, OUT response_body bytea, OUT replayed boolean,
                                   OUT expires_epoch bigint)
LANGUAGE plpgsql AS $$
DECLARE
  b idempotency.key_outcome;
  doc json;
  qty text;
  item text;
  quantity integer;
  order_id bigint;
  created text;
BEGIN
  PERFORM shop.check_owner(p_principal);
  SELECT * INTO b FROM idempotency.begin(p_principal, p_key, 'POST ' || p_path,
                                         idempotency.fingerprint('POST', p_path, p_body),
                                         wait => p_wait_ms * interval '1 millisecond');
  -- For started the expiry complete stores; for the others the row's (NULL: none).
  expires_epoch := floor(extract(epoch FROM b.expires_at))::bigint;
  IF b.outcome <> 'started' THEN
    SELECT * INTO status, headers, response_body, replayed FROM shop.answer(b);
    RETURN;
  END IF;
  doc := CASE WHEN p_body IS NULL THEN NULL ELSE shop.json_or_null(p_body) END;
  IF doc IS NULL OR json_typeof(doc) <> 'object' OR json_typeof(doc -> 'item') IS DISTINCT FROM 'string'
     OR doc ->> 'item' = '' THEN
    -- A final 4xx: nothing was written, store it with the key.
    SELECT * INTO status, headers, response_body, replayed FROM shop.problem(400, 'about:blank', 'Invalid order',
      'The body must be a JSON object with a non-empty "item" string.');
    PERFORM idempotency.complete(p_principal, p_key, status, response_body, headers);
    RETURN;
  END IF;
  item := doc ->> 'item';
  qty := (doc -> 'quantity')::text;  -- the number as spelled: 2.0 is no int for json.loads either
  IF qty IS NULL THEN
    quantity := 1;
  ELSIF qty ~ '^-?(0|[1-9][0-9]{0,5})$' AND qty::integer BETWEEN 1 AND 1000 THEN
    quantity := qty::integer;
  ELSE
    SELECT * INTO status, headers, response_body, replayed FROM shop.problem(422, 'about:blank', 'Invalid quantity',
      'quantity must be 1 to 1000.');
    PERFORM idempotency.complete(p_principal, p_key, status, response_body, headers);
    RETURN;
  END IF;
  IF p_delay_ms > 0 THEN
    PERFORM pg_catalog.pg_sleep(p_delay_ms::float8 / 1000);
  END IF;
  INSERT INTO public.orders (principal, item, quantity) VALUES (p_principal, item, quantity)
    RETURNING id, created_at::text INTO order_id, created;
  status := 201;
  headers := jsonb_build_array('["Content-Type","application/json"]'::jsonb,
                               jsonb_build_array('Location', '/orders/' || order_id));
  response_body := pg_catalog.convert_to(idempotency.jcs(jsonb_build_object(
    'id', order_id, 'item', item, 'quantity', quantity, 'created_at', created)), 'UTF8');
  replayed := false;
  PERFORM idempotency.complete(p_principal, p_key, status, response_body, headers, order_id::text);
END
$$;

-- POST /orders and /flaky/orders. fail => true: an attempt that ran and would
-- answer 201 answers 500 and is rolled back (key and order), as app.py's
-- first run of /flaky/orders for a key.
CREATE FUNCTION shop.create_order(principal text, key text, path text, body bytea,
                                  delay_ms integer DEFAULT 0, fail boolean DEFAULT false,
                                  wait_ms integer DEFAULT NULL,
                                  OUT status integer, OUT headers jsonb, OUT response_body bytea, OUT replayed boolean,
                                  OUT expires_epoch bigint)
LANGUAGE plpgsql AS $$
BEGIN
  IF NOT fail THEN
    SELECT * INTO status, headers, response_body, replayed, expires_epoch
      FROM shop.order_attempt(principal, key, path, body, delay_ms, wait_ms);
    RETURN;
  END IF;
  BEGIN
    SELECT * INTO status, headers, response_body, replayed, expires_epoch
      FROM shop.order_attempt(principal, key, path, body, delay_ms, wait_ms);
    IF status BETWEEN 200 AND 299 AND NOT replayed THEN
      RAISE EXCEPTION 'flaky' USING ERRCODE = 'SH500';  -- rolls the attempt back
    END IF;
  EXCEPTION WHEN SQLSTATE 'SH500' THEN
    SELECT * INTO status, headers, response_body, replayed FROM shop.problem(500, 'about:blank', 'Internal error',
      'The request failed; it is safe to retry with the same key.');
    expires_epoch := NULL;  -- nothing stored
  END;
END
$$;

-- POST /api-keys: the response carries a secret, sent once and not stored.
CREATE FUNCTION shop.create_api_key(principal text, key text, body bytea,
                                    OUT status integer, OUT headers jsonb, OUT response_body bytea, OUT replayed boolean,
                                    OUT expires_epoch bigint)
LANGUAGE plpgsql AS $$
DECLARE
  b idempotency.key_outcome;
  doc json;
  key_id bigint;
  secret text;
BEGIN
  PERFORM shop.check_owner(create_api_key.principal);
  SELECT * INTO b FROM idempotency.begin(create_api_key.principal, create_api_key.key, 'POST /api-keys',
                                         idempotency.fingerprint('POST', '/api-keys', create_api_key.body));
  expires_epoch := floor(extract(epoch FROM b.expires_at))::bigint;
  IF b.outcome <> 'started' THEN
    SELECT * INTO status, headers, response_body, replayed FROM shop.answer(b);
    RETURN;
  END IF;
  doc := CASE WHEN create_api_key.body IS NULL THEN NULL ELSE shop.json_or_null(create_api_key.body) END;
  IF doc IS NULL OR json_typeof(doc) <> 'object' OR json_typeof(doc -> 'name') IS DISTINCT FROM 'string'
     OR doc ->> 'name' = '' THEN
    SELECT * INTO status, headers, response_body, replayed FROM shop.problem(400, 'about:blank',
      'Invalid API key request', 'The body must be a JSON object with a non-empty "name" string.');
    PERFORM idempotency.complete(create_api_key.principal, create_api_key.key, status, response_body, headers);
    RETURN;
  END IF;
  INSERT INTO public.api_keys (principal, name) VALUES (create_api_key.principal, doc ->> 'name')
    RETURNING id, 'sk_' || replace(pg_catalog.gen_random_uuid()::text, '-', '') INTO key_id, secret;
  status := 201;
  headers := jsonb_build_array('["Content-Type","application/json"]'::jsonb,
                               jsonb_build_array('Location', '/api-keys/' || key_id));
  response_body := pg_catalog.convert_to(idempotency.jcs(jsonb_build_object(
    'id', key_id, 'name', doc ->> 'name', 'secret', secret)), 'UTF8');
  replayed := false;
  PERFORM idempotency.complete(create_api_key.principal, create_api_key.key, status, response_body, headers,
                               key_id::text, one_time_secret => true);
END
$$;

CREATE FUNCTION shop.order_count() RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$ SELECT count(*) FROM public.orders $$;
