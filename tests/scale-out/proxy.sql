-- tests/scale-out/proxy.sql: the proxy database of the PL/Proxy scale-out test
-- (loaded by tests/scale-out/plproxy_cluster.sh, which then creates the SQL/MED
-- cluster 'orders' with one option p<i> per partition). Each function has the
-- signature of the shard function of the same name (tests/scale-out/shard.sql);
-- PL/Proxy runs it on partition hashtext(principal) & (partitions - 1).

CREATE EXTENSION plproxy;  -- also creates the foreign data wrapper plproxy
CREATE SCHEMA shop;

CREATE FUNCTION shop.create_order(principal text, key text, path text, body bytea,
                                  delay_ms integer DEFAULT 0, fail boolean DEFAULT false,
                                  wait_ms integer DEFAULT NULL,
                                  OUT status integer, OUT headers jsonb, OUT response_body bytea, OUT replayed boolean,
                                  OUT expires_epoch bigint)
LANGUAGE plproxy AS $$
  CLUSTER 'orders';
  RUN ON hashtext(principal);
$$;

CREATE FUNCTION shop.create_api_key(principal text, key text, body bytea,
                                    OUT status integer, OUT headers jsonb, OUT response_body bytea, OUT replayed boolean,
                                    OUT expires_epoch bigint)
LANGUAGE plproxy AS $$
  CLUSTER 'orders';
  RUN ON hashtext(principal);
$$;

-- One row per partition: GET /orders/count sums them.
CREATE FUNCTION shop.order_count() RETURNS SETOF bigint
LANGUAGE plproxy AS $$
  CLUSTER 'orders';
  RUN ON ALL;
$$;

-- The partition that owns a principal under the cluster's current partition
-- count, by PL/Proxy's rule (for tests and the resharding procedure).
CREATE FUNCTION shop.partitions() RETURNS integer
LANGUAGE sql STABLE AS $$
  SELECT count(*)::integer FROM pg_catalog.pg_foreign_server s, unnest(s.srvoptions) o
   WHERE s.srvname = 'orders' AND o ~ '^p[0-9]+='
$$;
CREATE FUNCTION shop.owner(principal text, partitions integer DEFAULT NULL) RETURNS integer
LANGUAGE sql STABLE AS $$
  SELECT pg_catalog.hashtext(principal) & (coalesce(partitions, shop.partitions()) - 1)
$$;
