-- Cleanup's order through keys_expiry_bucket_idx (0.8.0): the index holds
-- expires_at cut to 10 ms (date_bin from 2000-01-01), and a batch still takes the oldest expiry first,
-- exactly, inside a bucket and across buckets, and resumes at `after` inside
-- a bucket; both batch statements (no policy, and the tombstone batch while an
-- action refuses) use the index.
\set VERBOSITY sqlstate
DELETE FROM idempotency.keys;
CREATE FUNCTION pg_temp.put_rows() RETURNS void LANGUAGE sql AS $$
    -- Heap order is not expiry order: a, b, c share bucket 0 in reverse order.
    INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
    SELECT 'o', k, 'refund', decode(repeat('00', 32), 'hex'), 'completed', 200, '1999-01-01 00:00+00', e
      FROM (VALUES ('a', timestamptz '2000-01-01 00:00:00.009+00'), ('b', '2000-01-01 00:00:00.005+00'),
                   ('c', '2000-01-01 00:00:00.001+00'), ('d', '2000-01-01 00:00:00.0105+00'),
                   ('e', '1999-12-31 23:59:59.995+00'), ('f', '2000-01-01 00:00:00+00')) AS v(k, e)
$$;
-- The keys each batch of `batch` rows deleted, batch after batch, each batch
-- resuming at the last expiry of the one before.
CREATE FUNCTION pg_temp.deletion_order(batch integer) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    after timestamptz;
    b record;
    gone text[] := '{}';
    before text[];
BEGIN
    LOOP
        SELECT array_agg(key) INTO before FROM idempotency.keys WHERE principal = 'o';
        SELECT * INTO b FROM idempotency.cleanup_batch(batch, after);
        EXIT WHEN b.deleted = 0;
        gone := gone || (SELECT string_agg(k, '+' ORDER BY k) FROM unnest(before) AS k
                          WHERE NOT EXISTS (SELECT FROM idempotency.keys AS r WHERE r.principal = 'o' AND r.key = k));
        after := b.last_expiry;
    END LOOP;
    RETURN array_to_string(gone, ' ');
END
$$;
SELECT date_bin('10 ms', expires_at, '2000-01-01+00') AT TIME ZONE 'UTC' AS bucket, string_agg(key, ',' ORDER BY expires_at) AS keys
  FROM (SELECT k AS key, e AS expires_at FROM (VALUES ('a', timestamptz '2000-01-01 00:00:00.009+00'),
        ('b', '2000-01-01 00:00:00.005+00'), ('c', '2000-01-01 00:00:00.001+00'), ('d', '2000-01-01 00:00:00.0105+00'),
        ('e', '1999-12-31 23:59:59.995+00'), ('f', '2000-01-01 00:00:00+00')) AS v(k, e)) AS t
 GROUP BY 1 ORDER BY 1;
-- One row a batch: e (the bucket before 2000), then f, c, b, a (the first bucket of
-- 2000, by expires_at), then d.
SELECT pg_temp.put_rows();
SELECT pg_temp.deletion_order(1) AS one_a_batch;
-- Two a batch: the pairs in the same order.
SELECT pg_temp.put_rows();
SELECT pg_temp.deletion_order(2) AS two_a_batch;
-- Resuming inside a bucket: at .005, c (.001) and the rows before stay.
SELECT pg_temp.put_rows();
SELECT deleted, last_expiry = '2000-01-01 00:00:00.0105+00' AS last_is_d
  FROM idempotency.cleanup_batch(10, '2000-01-01 00:00:00.005+00');
SELECT string_agg(key, ',' ORDER BY key) AS left FROM idempotency.keys WHERE principal = 'o';
DELETE FROM idempotency.keys;

-- The same through the tombstone batch (some action refuses; these rows'
-- action does not, so they are deleted as before).
SELECT idempotency.set_expiry_policy('charge_card', 'refuse');
SELECT pg_temp.put_rows();
SELECT pg_temp.deletion_order(1) AS one_a_batch_with_a_policy;
SELECT pg_temp.put_rows();
SELECT pg_temp.deletion_order(4) AS four_a_batch_with_a_policy;
DELETE FROM idempotency.keys;

-- Both statements find their batch through keys_expiry_bucket_idx: with
-- sequential scans priced out, a batch that could not use the index would
-- read the primary key whole and sort (idx_scan of the bucket index would
-- stay where it was).
INSERT INTO idempotency.keys (principal, key, action, request_sha256, state, response_status, created_at, expires_at)
SELECT 'o', 'many-' || i, 'refund', decode(repeat('00', 32), 'hex'), 'completed', 200, '1999-01-01 00:00+00',
       timestamptz '2000-01-01 00:00+00' + i * interval '1 ms'
  FROM generate_series(1, 3000) AS i;
ANALYZE idempotency.keys;
SET enable_seqscan = off;
CREATE FUNCTION pg_temp.bucket_index_scans() RETURNS bigint LANGUAGE sql AS $$
    SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelid = 'idempotency.keys_expiry_bucket_idx'::regclass
$$;
SELECT pg_temp.bucket_index_scans() AS scans_before \gset
SELECT deleted FROM idempotency.cleanup_batch(100);
SELECT pg_stat_force_next_flush();
SELECT pg_temp.bucket_index_scans() > :scans_before AS tombstone_batch_used_the_index;
SELECT idempotency.set_expiry_policy('charge_card', 'run');
SELECT pg_temp.bucket_index_scans() AS scans_before \gset
SELECT deleted FROM idempotency.cleanup_batch(100);
SELECT pg_stat_force_next_flush();
SELECT pg_temp.bucket_index_scans() > :scans_before AS batch_used_the_index;
RESET enable_seqscan;
DELETE FROM idempotency.keys;
